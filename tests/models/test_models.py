"""roll.models: the tiny offline model builder and the loaders real users go through."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig

from roll.models import (
    TinyModelSpec,
    apply_chat_template,
    build_tiny_model,
    linear_module_names,
    load_model,
    load_tokenizer,
)


def test_tiny_model_is_qwen3_with_vllm_compatible_head_dim(tiny_model_path):
    config = AutoConfig.from_pretrained(tiny_model_path)
    assert config.model_type == "qwen3"
    assert config.head_dim >= 32
    model = load_model(tiny_model_path)
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training


def test_tiny_model_cache_is_reused_and_rebuilt_on_spec_change(tmp_path):
    path = tmp_path / "m"
    build_tiny_model(path)
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    build_tiny_model(path)
    assert weights.stat().st_mtime_ns == stamp  # reused, not rewritten
    build_tiny_model(path, TinyModelSpec(seed=1))
    assert weights.stat().st_mtime_ns != stamp
    assert json.loads((path / "roll_tiny_spec.json").read_text())["seed"] == 1


def test_padded_embedding_rows_widen_the_head_not_the_tokenizer(tiny_model_path, tmp_path):
    """embedding_rows pads the (tied) embedding and LM head as real models do; a folder built
    before the field existed (its marker lacks the key) is still taken as complete."""
    from roll.models import load_tokenizer

    tokens = len(load_tokenizer(tiny_model_path))
    padded = build_tiny_model(tmp_path / "p", TinyModelSpec(embedding_rows=tokens + 100))
    assert AutoConfig.from_pretrained(padded).vocab_size == tokens + 100
    assert len(load_tokenizer(padded)) == tokens
    assert load_model(padded).get_output_embeddings().weight.shape[0] == tokens + 100
    marker = json.loads((tiny_model_path / "roll_tiny_spec.json").read_text())
    assert "embedding_rows" not in marker  # the default leaves the marker as it was
    stamp = (tiny_model_path / "model.safetensors").stat().st_mtime_ns
    build_tiny_model(tiny_model_path)
    assert (tiny_model_path / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_build_started_while_another_is_writing_waits_and_reuses_its_folder(
        tiny_model_path, tmp_path):
    """Side-by-side runs on one machine: while one process holds the build lock and writes the
    folder, a second build waits, then finds the folder complete and keeps it (the old code
    built again and deleted the folder under the first run, which was reading its tokenizer)."""
    import shutil
    import threading

    from roll.models.cache import build_lock

    path = tmp_path / "m"
    done = threading.Event()
    with build_lock(path):
        waiter = threading.Thread(target=lambda: (build_tiny_model(path), done.set()))
        waiter.start()
        assert not done.wait(1.0) and not path.exists()  # it waits for the lock
        shutil.copytree(tiny_model_path, path)  # the first process's complete folder
        (path / "first_writer").write_text("kept")
    waiter.join(60)
    assert done.is_set() and (path / "first_writer").read_text() == "kept"


def test_incomplete_folder_is_not_taken_as_a_model(tmp_path):
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text("{}")  # what a crash mid-write could leave
    build_tiny_model(path)
    assert (path / "roll_tiny_spec.json").is_file()
    load_model(path)


def test_tokenizer_round_trips_text_and_applies_chat_template(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    assert tokenizer.pad_token_id is not None
    assert tokenizer.padding_side == "right"
    text = "Legal moves: x(1,1) <answer>x(1,1)</answer> ünïcödé 🎲"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    ids = apply_chat_template(tokenizer, [{"role": "user", "content": "hello"}])
    decoded = tokenizer.decode(ids)
    assert decoded == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    # Answer tags are single tokens, as in Qwen3's vocabulary, and survive skipping specials.
    assert len(tokenizer.encode("<answer>")) == 1
    answer = tokenizer.encode("<think>hm</think><answer>x(1,1)</answer><|im_end|>")
    assert tokenizer.decode(answer, skip_special_tokens=True) == (
        "<think>hm</think><answer>x(1,1)</answer>"
    )


# A chat template that reads enable_thinking the way Qwen3's does: False closes the thinking
# block in the prompt; undefined leaves the model free to think.
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)


def test_enable_thinking_reaches_templates_that_take_it(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    chat = [{"role": "user", "content": "hello"}]
    plain = tokenizer.decode(apply_chat_template(tokenizer, chat))
    # A template that does not read it renders the same either way.
    assert tokenizer.decode(apply_chat_template(tokenizer, chat, enable_thinking=False)) == plain
    tokenizer.chat_template = THINKING_TEMPLATE
    off = tokenizer.decode(apply_chat_template(tokenizer, chat, enable_thinking=False))
    assert off == plain + "<think>\n\n</think>\n\n"
    assert tokenizer.decode(apply_chat_template(tokenizer, chat, enable_thinking=True)) == plain
    assert tokenizer.decode(apply_chat_template(tokenizer, chat)) == plain  # template default


def test_model_generates_from_loaded_folder(tiny_model_path):
    tokenizer = load_tokenizer(tiny_model_path)
    model = load_model(tiny_model_path)
    ids = torch.tensor([apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}])])
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_tokenizer_without_chat_template_is_refused(tiny_model_path, tmp_path):
    tokenizer = load_tokenizer(tiny_model_path)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="chat template"):
        load_tokenizer(tmp_path)


def test_linear_module_names_reads_config_only(tiny_model_path):
    assert linear_module_names(tiny_model_path) == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    }


def test_wide_embeddings_widen_the_reachable_logit_gap(tmp_path):
    """TinyModelSpec(embedding_std=0.1) (the ``tiny-wide`` alias): only the embeddings change,
    and with them the bound on how far apart two tokens' logits can be pushed through the
    final norm, |<h, e_a - e_b>| <= |h| |e_a - e_b| with |h| <= sqrt(d) (RMSNorm, weight 1),
    5x the default model's. The default (None) keeps the initializer's embeddings exactly."""
    from roll.models.aliases import resolve_model_path

    default, wide = load_model(build_tiny_model(tmp_path / "a")), load_model(
        build_tiny_model(tmp_path / "b", TinyModelSpec(embedding_std=0.1)))
    assert str(resolve_model_path("tiny-wide")).endswith("tiny-qwen3-wide")
    e0, e1 = default.get_input_embeddings().weight, wide.get_input_embeddings().weight
    assert float(e0.std()) == pytest.approx(0.02, rel=0.05)
    assert float(e1.std()) == pytest.approx(0.1, rel=0.05)
    for name, p in default.named_parameters():  # everything but the embeddings is the same
        if "embed" not in name:
            assert torch.equal(p, dict(wide.named_parameters())[name]), name
    d = e0.shape[1]

    def bound(e):  # the largest reachable gap between two distinct tokens' logits
        diffs = torch.cdist(e[:200], e[:200])
        return float(diffs.max()) * d ** 0.5

    assert bound(e1) > 4 * bound(e0)
    assert bound(e0) < 3.0  # at most ~e^3 between two moves: no move can be made near-certain


def test_tf32_is_set_for_cuda_devices_only(tiny_model_path):
    from roll.models.loading import use_tf32

    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        load_model(tiny_model_path, device="cpu", tf32=True)  # a CPU load leaves them alone
        assert not torch.backends.cuda.matmul.allow_tf32
        use_tf32("cuda:1", True)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        use_tf32("cuda", False)
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
