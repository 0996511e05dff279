"""rollout.lookahead: the next step's episodes fill the lanes a step's rollout tail leaves idle
(roll/agentic/rollout/play.py). The scheduler-level equality (same adapters, same
trajectories) is in tests/agentic/test_rollout.py; here, the pipeline's side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import CLIError, load_config
from roll.pipeline.step_plan import StepPlan

ROOT = Path(__file__).resolve().parents[2]
BASE = [
    "rollout.constrained_decoding=true", "rollout.num_groups=3", "rollout.group_size=2",
    "rollout.sampling.max_new_tokens=16", "eval.eval_steps=0", "tracking.backends=[jsonl]",
    "env.seat_to_agent=[[agent_0,agent_1],[agent_1,agent_0]]",
]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _run(out: Path, *extra: str) -> list[dict]:
    cfg = load_config(str(ROOT / "examples" / "tictactoe"), "multi_agent_tictactoe",
                      BASE + [f"output_dir={out}", *extra])
    AgenticPipeline(cfg).run()
    return _metrics(out)


@pytest.mark.slow  # whole runs; the quick subset keeps the scheduler-level tests
def test_lookahead_trains_the_same_episodes_and_skips_steps_that_save(tmp_path):
    """Four steps, a checkpoint after step 2 (and the last): steps 1 and 3 start the next
    step's episodes, steps 2 and 4 admit none. With a rate so small that the adapters move
    by nothing a sample can see, every step plays the same games as without lookahead, and
    every token is decoded once."""
    common = ("max_steps=4", "save_steps=2", "team.optim.lr=1e-12")
    plain = _run(tmp_path / "plain", *common)
    ahead = _run(tmp_path / "ahead", *common, "rollout.lookahead=1")
    assert [m["step"] for m in ahead] == [1, 2, 3, 4]
    for before, after in zip(plain, ahead, strict=True):
        for key in ("rollout/llm_turns", "rollout/generated_tokens", "agent_0/episode_return",
                    "agent_1/episode_return", "agent_0/win_rate", "agent_1/turns"):
            assert after[key] == before[key], (after["step"], key)
        assert "rollout/ahead_turns" not in before
    started = [m["rollout/next_episodes_started"] for m in ahead]
    assert started[0] > 0 and started[2] > 0 and started[1] == started[3] == 0
    assert ahead[0]["rollout/ahead_turns"] == ahead[2]["rollout/ahead_turns"] == 0
    assert ahead[1]["rollout/ahead_turns"] > 0 and ahead[3]["rollout/ahead_turns"] > 0
    # turns played ahead were decoded in the step before: each token once over the run
    assert (sum(m["rollout/decoded_tokens"] for m in ahead)
            == sum(m["rollout/generated_tokens"] for m in ahead))
    assert ahead[0]["rollout/decoded_tokens"] > ahead[0]["rollout/generated_tokens"]
    # the engine's gap on fresh rows stays the served-weights check; the rows played ahead
    # report theirs apart (here ~0: the update moved nothing)
    assert ahead[1]["rollout/engine_logprob_gap"] < 1e-3
    assert ahead[1]["rollout/ahead_logprob_gap"] < 1e-3


@pytest.mark.parametrize("extra, reason", [
    (["env.seat_to_agent=[agent_0,snapshot:agent_0@latest]", "team.num_agents=1"],
     "snapshot"),
    (["env_workers.num_workers=2", "cluster.backend=ray"], "env workers"),
])
def test_lookahead_refuses_what_it_cannot_start_early(tmp_path, extra, reason):
    with pytest.raises(CLIError, match=f"rollout.lookahead=1: .*{reason}"):
        load_config(str(ROOT / "examples" / "tictactoe"), "multi_agent_tictactoe",
                    BASE + [f"output_dir={tmp_path}", "rollout.lookahead=1", *extra])


def test_a_negative_lookahead_is_refused_naming_the_key(tmp_path):
    with pytest.raises(CLIError, match=r"rollout.lookahead=-1: must be an integer >= 0"):
        load_config(str(ROOT / "examples" / "tictactoe"), "multi_agent_tictactoe",
                    BASE + [f"output_dir={tmp_path}", "rollout.lookahead=-1"])


def test_lookahead_refuses_team_tasks(tmp_path):
    with pytest.raises(CLIError, match=r"rollout.lookahead=1: is for games"):
        load_config(str(ROOT / "examples" / "math_team"), "multi_agent_math_team",
                    [f"output_dir={tmp_path}", "rollout.lookahead=1"])


@pytest.mark.slow  # whole runs; the quick subset keeps the scheduler-level tests
def test_a_run_resumed_from_a_checkpoint_is_the_run_with_lookahead_uninterrupted(tmp_path):
    """No episodes are parked at a checkpoint (a step that saves admits none), so stopping
    after step 2 and resuming gives the uninterrupted run's adapters bit for bit."""
    from safetensors.torch import load_file

    common = ("save_steps=2", "team.optim.lr=5e-2", "rollout.lookahead=1")
    whole = _run(tmp_path / "whole", "max_steps=4", *common)
    _run(tmp_path / "stopped", "max_steps=2", *common)
    resumed = _run(tmp_path / "stopped", "max_steps=4", "resume=latest", *common)
    assert resumed[-1]["step"] == 4 and resumed[-1]["rollout/ahead_turns"] > 0
    assert whole[3]["rollout/ahead_turns"] == resumed[-1]["rollout/ahead_turns"]

    def adapters(out: Path) -> dict:
        final = out / "checkpoints" / "step_00000004" / "agents"
        return {f"{path.relative_to(final)}/{key}": value
                for path in sorted(final.rglob("*.safetensors"))
                for key, value in load_file(path).items()}

    ours, theirs = adapters(tmp_path / "whole"), adapters(tmp_path / "stopped")
    assert ours and ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)


@pytest.mark.slow  # whole runs; the quick subset keeps the scheduler-level tests
def test_two_steps_ahead_still_trains_the_same_episodes(tmp_path):
    """rollout.lookahead=2: a step's idle lanes may take the next two steps' episodes (the
    nearer first); with adapters that do not move, every step plays the games it plays
    without lookahead."""
    common = ("max_steps=4", "save_steps=4", "team.optim.lr=1e-12")
    plain = _run(tmp_path / "plain", *common)
    ahead = _run(tmp_path / "ahead", *common, "rollout.lookahead=2")
    for before, after in zip(plain, ahead, strict=True):
        for key in ("rollout/llm_turns", "rollout/generated_tokens", "agent_0/episode_return",
                    "agent_1/win_rate"):
            assert after[key] == before[key], (after["step"], key)
    assert all(m["rollout/ahead_turns"] > 0 for m in ahead[1:])
    assert (sum(m["rollout/decoded_tokens"] for m in ahead)
            == sum(m["rollout/generated_tokens"] for m in ahead))


def test_which_steps_a_step_may_start_early(tmp_path):
    """Up to rollout.lookahead next steps, none past a checkpoint (written at the end of
    every save_steps-th step and the last), none played by another scheduler (swapped
    roles), by hand."""
    def plan(*extra: str) -> StepPlan:
        return StepPlan(load_config(str(ROOT / "examples" / "tictactoe"), "multi_agent_tictactoe",
                                    BASE + [f"output_dir={tmp_path}", "rollout.lookahead=3",
                                            "max_steps=9", "save_steps=4", *extra]))

    one = plan()  # one scheduler
    expected = {1: [2, 3, 4], 2: [3, 4], 3: [4], 4: [], 5: [6, 7, 8], 7: [8], 8: [], 9: []}
    for step, steps in expected.items():
        assert one.ahead_steps(step) == steps, step
    swapped = plan("env.swap_roles_every=2")  # steps 1-2 one way, 3-4 swapped
    assert swapped.ahead_steps(1) == [2]
    assert swapped.ahead_steps(2) == []
