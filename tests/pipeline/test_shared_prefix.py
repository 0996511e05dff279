"""``trainer.share_prefix`` and ``rollout.hf.share_prefix`` in a run: on the CPU (their
default) a Kuhn run's trainer forwards and engine prefills run the prompts' common leading
tokens apart (roll/multi_agent/prefix.py, roll/inference/hf/prefill.py); with the options off
they do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import roll.multi_agent.model as model_module
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config

ROOT = Path(__file__).resolve().parents[2]
BASE = ["rollout.num_groups=4", "eval.eval_steps=0", "tracking.backends=[jsonl]", "max_steps=1"]


@pytest.mark.slow  # two one-step runs
@pytest.mark.parametrize("share", [None, False])
def test_a_cpu_run_shares_the_prompts_prefix_in_its_trainer_forwards(tmp_path, monkeypatch,
                                                                     share):
    shared = []  # (gradients on, prefix length, row length) of each shared forward
    real = model_module.prefix_logits

    def recorded(forward, num_layers, input_ids, attention_mask, agent_id, length, *rest):
        shared.append((torch.is_grad_enabled(), length, input_ids.shape[1]))
        return real(forward, num_layers, input_ids, attention_mask, agent_id, length, *rest)

    monkeypatch.setattr(model_module, "prefix_logits", recorded)
    extra = [] if share is None else [f"trainer.share_prefix={str(share).lower()}",
                                      f"rollout.hf.share_prefix={str(share).lower()}"]
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu",
                      BASE + [f"output_dir={tmp_path}", *extra])
    AgenticPipeline(cfg).run()
    saved = [json.loads(line).get("rollout/shared_tokens")
             for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    saved = [value for value in saved if value is not None]
    if share is False:
        assert shared == [] and saved == [0.0]
        return
    assert len(saved) == 1 and saved[0] >= 40  # the engine's prefills shared the rules too
    # the old-log-prob pass (no gradients) and the training forwards both shared
    assert {grad for grad, _, _ in shared} == {False, True}
    # the rules open every Kuhn prompt: dozens of tokens, a good part of each row
    assert all(length >= 40 and length < row for _, length, row in shared), shared
