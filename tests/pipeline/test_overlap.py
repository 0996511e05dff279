"""rollout.overlap's parts that need no Ray: the background slot (overlap.py), which steps may
start the next rollout, and the settings it refuses. The runs themselves (engine actors) are in
tests/distributed/test_overlap.py."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from roll.pipeline.cli import CLIError, load_config
from roll.pipeline.overlap import NextRollout

ROOT = Path(__file__).resolve().parents[2]
KUHN = (str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker")


def test_the_next_rollout_runs_in_another_thread_and_is_taken_once_for_its_step():
    slot: NextRollout[str] = NextRollout()
    assert slot.take(3) is None  # nothing started: the step rolls out itself
    release = threading.Event()
    where: list[str] = []

    def play() -> str:
        where.append(threading.current_thread().name)
        release.wait(5)
        return "episodes of step 3"

    slot.start(3, play)
    assert slot.step == 3
    with pytest.raises(RuntimeError, match="step 3's rollout is still pending; step 4's"):
        slot.start(4, play)
    with pytest.raises(RuntimeError, match="step 3's rollout is pending, not step 2's"):
        slot.take(2)
    release.set()
    result, seconds = slot.take(3)
    assert result == "episodes of step 3" and seconds >= 0
    assert where == ["rollout-step-3"] and where[0] != threading.current_thread().name
    assert slot.step is None and slot.take(4) is None


def test_an_error_in_the_background_rollout_is_raised_where_it_is_taken():
    slot: NextRollout[str] = NextRollout()

    def play() -> str:
        raise ValueError("engine actor 0 died")

    slot.start(2, play)
    with pytest.raises(ValueError, match="engine actor 0 died"):
        slot.take(2)
    assert slot.step is None  # the slot is free again


def test_which_steps_start_the_next_rollout(tmp_path):
    """Not the last step, not a step that saves (every save_steps-th and the last), not one
    that evaluates; by hand for 9 steps, save_steps 4, eval_steps 3 (step_plan.py)."""
    from roll.pipeline.step_plan import StepPlan

    common = [f"output_dir={tmp_path}", "max_steps=9", "save_steps=4", "eval.eval_steps=3",
              "rollout.overlap=true", "rollout.lookahead=1", "cluster.backend=ray",
              "actor_infer.num_engines=1"]
    plan = StepPlan(load_config(*KUHN, common))
    starts = {step: plan.overlapped_next(step) for step in range(1, 10)}
    assert [step for step, later in starts.items() if later is not None] == [1, 2, 5, 7]
    assert [plan.starts_next(step) for step in range(1, 10)] == [
        later is not None for later in starts.values()]
    # and the next step's own lookahead (rollout.lookahead=1), as that step would compute it
    # itself: none past a checkpoint (step 4's after step 4 ends, so step 5 is not looked at)
    assert starts[1] == (0, [3])
    assert starts[2] == (0, [4])
    assert starts[5] == (0, [7])
    assert plan.ahead_steps(3) == [4]
    assert plan.ahead_steps(4) == []
    # env.swap_roles_every=2: steps 1-2 seated one way, 3-4 swapped (scheduler 1); the next
    # step's rollout starts with its own scheduler, and looks ahead only within its block
    swapped = StepPlan(load_config(*KUHN, common + ["env.swap_roles_every=2"]))
    assert [swapped.scheduler_of(step) for step in range(1, 7)] == [0, 0, 1, 1, 0, 0]
    assert swapped.overlapped_next(2) == (1, [4])
    assert swapped.overlapped_next(1) == (0, [])


@pytest.mark.parametrize("extra, key, reason", [
    ([], "rollout.overlap=True", "engine actors: set cluster.backend=ray and "
                                 "actor_infer.num_engines >= 1"),
    (["cluster.backend=ray"], "rollout.overlap=True", "actor_infer.num_engines >= 1"),
    (["cluster.backend=ray", "actor_infer.num_engines=1", "rollout.engine=vllm",
      "rollout.vllm.sleep_between_phases=true"],
     "rollout.vllm.sleep_between_phases=True", "cannot sleep"),
])
def test_overlap_without_engine_actors_awake_is_refused_naming_the_key(tmp_path, extra, key,
                                                                       reason):
    with pytest.raises(CLIError, match=f"{key}: .*{reason}"):
        load_config(*KUHN, [f"output_dir={tmp_path}", "rollout.overlap=true", *extra])
