"""Frozen snapshots as opponents, and the rollout-only evaluation of a trained run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config
from roll.pipeline.rollout_pipeline import run_evaluation

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "rollout.constrained_decoding=true", "rollout.num_groups=2", "rollout.group_size=2",
    "rollout.sampling.max_new_tokens=12", "team.optim.lr=5e-2", "eval.eval_steps=0",
    "tracking.backends=[jsonl]", "save_steps=1", "keep_last=5",
]


def _config(out: Path, *extra: str):
    return load_config(str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker",
                       BASE + [f"output_dir={out}", *extra])


def test_snapshot_opponent_trains_against_a_frozen_copy_then_evaluation_reads_checkpoints(
    tmp_path, capsys
):
    out = tmp_path / "run"
    # agent_0 trains in seat 0 against its own frozen past self in seat 1.
    train = _config(out, "env.seat_to_agent=[agent_0,snapshot:agent_0@latest]", "max_steps=3",
                    "team.num_agents=1")
    pipeline = AgenticPipeline(train)
    pipeline.run()
    # The pool grew at each checkpoint; the seat plays the newest snapshot and the engine keeps
    # only that one (the step-0 slot was unloaded when the seat moved on).
    assert sorted(pipeline.pool.snapshots["agent_0"]) == [0, 1, 2, 3]
    assert set(pipeline.engine.slots) == {"agent_0", "agent_0@step2"}
    # The step-0 snapshot is the untrained adapter; the live agent moved away from it.
    frozen = pipeline.pool.snapshots["agent_0"][0]
    live = pipeline.model.export_adapter("agent_0")
    assert any(not torch.equal(frozen[k], live[k]) for k in live)

    # Evaluation only: the latest checkpoint against its step-1 snapshot read from disk.
    evaluate = _config(out, "resume=latest", "eval.num_episodes=20", "team.num_agents=1",
                       "env.seat_to_agent=[agent_0,snapshot:agent_0@latest]",
                       "eval.seat_to_agent=[agent_0,snapshot:agent_0@1]")
    metrics = run_evaluation(evaluate)
    printed = capsys.readouterr().out
    assert "agent_0" in printed and "win rate [95% CI]" in printed
    assert metrics["eval/agent_0/episodes"] == 20.0
    low, rate, high = (metrics[f"eval/agent_0/win_rate{s}"] for s in ("_low", "", "_high"))
    assert 0.0 <= low <= rate <= high <= 1.0
    results = json.loads((out / "eval_results.json").read_text())
    assert results["checkpoint"].endswith("step_00000003")
    assert results["metrics"]["eval/agent_0/win_rate"] == rate
    on_disk = load_file(str(out / "checkpoints" / "step_00000001" / "agents" / "agent_0" /
                            "adapter_model.safetensors"))
    evaluation = AgenticPipeline(evaluate)
    evaluation.pool.choose(evaluation.eval_seatings[0][1])
    loaded = evaluation.pool.snapshots["agent_0"][1]
    assert loaded.keys() == on_disk.keys()
    assert all(torch.equal(loaded[k], on_disk[k]) for k in on_disk)


def test_an_evaluation_may_take_a_temperature_of_its_own(tmp_path):
    """The greedy policy evaluated beside the sampled one (benchmarks/learning.py
    --greedy_too): at temperature 0 one prompt always gets one answer (the argmax move),
    whatever the seed, while eval.temperature=1 samples; training cannot take one."""
    import pytest

    pipeline = AgenticPipeline(_config(tmp_path / "run", "eval.temperature=1.0",
                                       "eval.num_episodes=12", "team.num_agents=1",
                                       "env.seat_to_agent=[agent_0,random]"))
    sampled = pipeline.scheduler(pipeline.eval_seatings, evaluation=True)
    greedy = pipeline.scheduler(pipeline.eval_seatings, evaluation=True, temperature=0.0)
    assert sampled.sampling.temperature == 1.0 and greedy.sampling.temperature == 0.0
    answers = {"greedy": {}, "sampled": {}}  # prompt -> the answers it got
    with pipeline.engine_awake():
        pipeline.sync_adapters()
        for seed in (5, 6):
            for name, scheduler in (("greedy", greedy), ("sampled", sampled)):
                for turn in scheduler.rollout(seed=seed).turns:
                    answers[name].setdefault(tuple(turn.prompt_ids), set()).add(
                        tuple(turn.response_ids))
    assert all(len(seen) == 1 for seen in answers["greedy"].values())
    assert any(len(seen) > 1 for seen in answers["sampled"].values())
    with pytest.raises(ValueError, match="evaluation only"):
        pipeline.scheduler(pipeline.train_seatings, evaluation=False, temperature=0.0)


def test_greedy_too_evaluates_the_greedy_policy_on_the_same_games(tmp_path, capsys):
    """eval.greedy_too: beside the sampled evaluation (eval.temperature=1), the greedy policy's
    under eval_greedy/, on the same games: equal to a whole evaluation at eval.temperature=0
    with the same seed (the random opponent's moves and the deals come from the seed)."""
    common = ["eval.num_episodes=16", "team.num_agents=1", "env.seat_to_agent=[agent_0,random]",
              "seed=7"]
    both = run_evaluation(_config(tmp_path / "both", "eval.temperature=1.0",
                                  "eval.greedy_too=true", *common))
    printed = capsys.readouterr().out
    greedy = run_evaluation(_config(tmp_path / "greedy", "eval.temperature=0.0", *common))
    for metric in ("win_rate", "win_rate_low", "non_loss_rate", "mean_return", "episodes"):
        assert both[f"eval_greedy/agent_0/{metric}"] == greedy[f"eval/agent_0/{metric}"], metric
    assert both["eval/agent_0/episodes"] == 16.0
    # the sampled games differ from the greedy ones somewhere (16 Kuhn deals, an untrained
    # adapter sampling at temperature 1 from answers the greedy policy never changes)
    assert any(both[f"eval/agent_0/{m}"] != both[f"eval_greedy/agent_0/{m}"]
               for m in ("win_rate", "mean_return"))
    assert "  greedy" in printed and "agent_0" in printed


@pytest.mark.slow  # a pipeline run (~4 s): the quick subset stays under 3 minutes
def test_an_engine_that_sleeps_between_phases_reports_its_wake_and_sleep_apart(tmp_path):
    """rollout.vllm.sleep_between_phases: waking and putting the engine back to sleep are
    their own phases (time/wake, time/sleep), not part of time/rollout; the embedded engine's
    wake_up/sleep (no-ops) are given a known cost here so the split can be seen."""
    import time

    pipeline = AgenticPipeline(_config(tmp_path / "run", "max_steps=1", "save_steps=0",
                                       "rollout.num_groups=1", "rollout.sampling.max_new_tokens=8",
                                       "rollout.vllm.sleep_between_phases=true"))
    pipeline.engine.wake_up = lambda: time.sleep(2.0)
    pipeline.engine.sleep = lambda: time.sleep(1.0)
    pipeline.run()
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert 2.0 <= row["time/wake"] < 3.0 and 1.0 <= row["time/sleep"] < 2.0
    assert row["time/rollout"] < 2.0  # a rollout that counted the wake would be >= 3 s
    assert row["time/sync"] >= 0.0
    plain = AgenticPipeline(_config(tmp_path / "plain", "max_steps=1", "save_steps=0",
                                    "rollout.num_groups=1", "rollout.sampling.max_new_tokens=8"))
    plain.run()
    row = json.loads((tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "time/wake" not in row and "time/sleep" not in row
