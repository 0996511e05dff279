"""rollout.overlap on a local Ray cluster: the next step's rollout plays on the engine actor
while the rank trains (roll/pipeline/overlap.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.utils.checkpoint import latest_checkpoint

from .helpers import checkpoint_adapters, kuhn_config

pytestmark = pytest.mark.slow
RAY = ("cluster.backend=ray", "actor_infer.num_engines=1", "actor_infer.cpus_per_engine=0.5",
       "actor_train.cpus_per_rank=0.5", "save_steps=2", "keep_last=5")


def _run(out: Path, *extra: str, ray: bool = True) -> list[dict]:
    """A Kuhn run on the Ray cluster (``ray``) or in this process (the same numbers; no
    actors to start)."""
    AgenticPipeline(kuhn_config(out, *(RAY if ray else ()), *extra)).run()
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_overlap_plays_each_steps_episodes_with_the_adapters_one_update_older(
        ray_cluster, tmp_path, one_thread):
    """Four steps, a checkpoint after step 2: step 1 rolls out itself and starts step 2's
    rollout before it trains; step 2 saves, so step 3 rolls out itself and starts step 4's.
    With a rate so small that nothing a sample sees moves, every step plays the games it plays
    without overlap; with a real rate, the overlapped steps' rows come from the adapters one
    update older (their recomputed log-probs moved), the others' from the trainer's own; and
    a run resumed from the checkpoint is the uninterrupted run."""
    slow_rate = ("max_steps=4", "team.optim.lr=1e-12")
    plain = _run(tmp_path / "plain", *slow_rate, ray=False)
    overlapped = _run(tmp_path / "overlapped", *slow_rate, "rollout.overlap=true")
    assert [m["step"] for m in overlapped] == [1, 2, 3, 4]
    for before, after in zip(plain, overlapped, strict=True):
        for key in ("rollout/llm_turns", "rollout/generated_tokens", "agent_0/episode_return",
                    "agent_1/episode_return", "agent_0/win_rate", "agent_1/turns"):
            assert after[key] == before[key], (after["step"], key)
        assert "rollout/ahead_logprob_gap" not in before
    stale = ["rollout/ahead_logprob_gap" in m for m in overlapped]
    assert stale == [False, True, False, True]

    whole = tmp_path / "learning"
    learning = _run(whole, "max_steps=4", "rollout.overlap=true")
    for step in (0, 2):  # rolled out with the trainer's adapters: the engine served them
        assert learning[step]["rollout/engine_logprob_gap"] < 1e-4, step
    for step in (1, 3):  # played while the step before trained: one update behind
        assert "rollout/engine_logprob_gap" not in learning[step]
        assert learning[step]["rollout/ahead_logprob_gap"] > 1e-3, step
        assert learning[step]["rollout/played_s"] > 0
        # the adapter sync ran in the background too (before the rollout): none in the step
        assert learning[step]["rollout/sync_s"] > 0 and "time/sync" not in learning[step]
    assert "rollout/sync_s" not in learning[0] and learning[0]["time/sync"] > 0

    # No rollout is in flight when a checkpoint is written, so stopping after step 2 and
    # resuming gives the uninterrupted run bit for bit
    resumed = tmp_path / "resumed"
    later = _run(resumed, "max_steps=4", "rollout.overlap=true",
                 f"resume={whole / 'checkpoints' / 'step_00000002'}")
    assert [m["step"] for m in later] == [3, 4]
    gaps = ("rollout/engine_logprob_gap", "rollout/ahead_logprob_gap")
    for ours, theirs in zip(learning[2:], later, strict=True):
        # which rows were stale (the engine's own log-probs differ in the 7th digit after a
        # restart; the trainer recomputes them) and what each step learned, exactly
        assert [key in ours for key in gaps] == [key in theirs for key in gaps], ours["step"]
        learned = {key for key in ours if key.startswith(("agent_", "team/"))}
        assert learned == {key for key in theirs if key.startswith(("agent_", "team/"))}
        assert all(ours[key] == theirs[key] for key in learned), ours["step"]
    ours = checkpoint_adapters(latest_checkpoint(whole))
    theirs = checkpoint_adapters(latest_checkpoint(resumed))
    assert latest_checkpoint(resumed).name == "step_00000004"
    assert ours and ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_an_engine_killed_under_an_overlapped_rollout_stops_with_one_line(
        ray_cluster, tmp_path, one_thread, capsys):
    """The engine actor dies as step 3's rollout starts in the background (during step 2):
    step 3 raises its error where it takes the rollout, one line naming the engine and the
    last good checkpoint, which stays intact; every role is released; resume=latest trains on."""
    from roll.errors import RoleFailed

    out = tmp_path / "run"
    _run(out, "max_steps=1", "save_steps=2", ray=False)  # a checkpoint of step 1 to resume
    before = checkpoint_adapters(latest_checkpoint(out))
    pipeline = AgenticPipeline(kuhn_config(out, *RAY, "max_steps=4", "save_steps=3",
                                           "rollout.overlap=true", "resume=latest"))
    start, started = pipeline.next_rollout.start, []

    def kill_then_start(step, play):
        started.append(step)
        ray_cluster.kill(pipeline.engine.ranks[0])
        start(step, play)

    pipeline.next_rollout.start = kill_then_start
    with pytest.raises(RoleFailed) as caught:
        pipeline.run()
    assert started == [3]
    # steps 2-4 to go: 2 starts the next rollout, 3 saves, 4 ends the run
    printed = capsys.readouterr().out
    assert "rollout.overlap: 1 of the 3 steps to go start the next rollout" in printed
    message = str(caught.value)
    assert "\n" not in message
    assert "actor_infer engine 0 of 1 failed during" in message and "ActorDiedError" in message
    assert "last good checkpoint:" in message and "step_00000001" in message
    assert latest_checkpoint(out).name == "step_00000001"
    after = checkpoint_adapters(latest_checkpoint(out))
    assert all(torch.equal(before[key], after[key]) for key in before)
    assert pipeline.trainer.ranks == [] and pipeline.engine.ranks == []
    # resume=latest trains on (in this process: the test above resumes an overlapped run on
    # the cluster)
    _run(out, "max_steps=2", "resume=latest", ray=False)
    assert latest_checkpoint(out).name == "step_00000002"
