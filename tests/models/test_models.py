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
