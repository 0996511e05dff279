"""benchmarks/learning.py: every recipe's overrides load into a valid config (a typo in a key or
a seating list fails here, not on the GPU machine), and the TicTacToe critic candidate is what
its comment says."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import learning  # noqa: E402


def _args(tiny: bool) -> argparse.Namespace:
    return argparse.Namespace(tiny=tiny, model="smollm2-135m", steps=7, eval_every=7,
                              override=["seed=3"])


@pytest.mark.slow  # the full CI runs it (quick subset < 3 min)
@pytest.mark.parametrize("name", sorted(learning.RECIPES))
def test_every_recipe_makes_a_valid_config(name, tmp_path):
    cfg = learning.recipe_config(_args(tiny=False), name, tmp_path)
    assert cfg.max_steps == 7 and cfg.seed == 3 and cfg.output_dir == str(tmp_path)
    assert learning.recipe_config(_args(tiny=True), name, tmp_path).model.path == "tiny"


def test_the_tictactoe_critic_candidate_trains_each_o_seat_twice_against_random(tmp_path):
    cfg = learning.recipe_config(_args(tiny=False), "tictactoe_critics", tmp_path)
    assert cfg.advantage.estimator == "ippo" and cfg.critic.mode == "per_agent"
    assert cfg.rollout.num_groups * cfg.rollout.group_size == 256
    seatings = [tuple(seating) for seating in cfg.env.seat_to_agent]
    for agent in ("agent_0", "agent_1"):
        assert seatings.count(("random", agent)) == 2
        assert seatings.count((agent, "random")) == 1


@pytest.mark.slow  # ~20 s: a tiny run of two steps (quick subset < 3 min)
def test_profile_step_profiles_that_step_and_the_run_goes_on(tmp_path, monkeypatch):
    """--profile_step 2: step 2 runs under torch.profiler, its report (the step's phase times,
    host operators) lands in the run's profile.json, and the run still trains both steps."""
    import json

    monkeypatch.setenv("OUT", str(tmp_path))
    args = argparse.Namespace(
        tiny=True, model="smollm2-135m", steps=2, eval_every=100, run_dir=str(tmp_path),
        tag="_profiled", vs_mcts=0, greedy_too=False, tactics=False, profile_step=2,
        compile_cache=None,
        profile_top=5, override=["rollout.num_groups=4", "eval.eval_steps=0"])
    learning.run_recipe(args, "kuhn_nash")
    run = tmp_path / "run_kuhn_nash_profiled"
    report = json.loads((run / "profile.json").read_text())
    assert report["step"] == 2 and report["wall_s"] > 0
    assert report["time"]["time/step"] > 0 and report["time"]["time/train"] > 0
    assert len(report["top"]) == 5 and report["top"][0]["self_cpu_ms"] > 0
    steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").open()]
    assert 1 in steps and 2 in steps


class _Steps:
    """The two members of a pipeline the compile-cache wrapper uses: ``step`` and
    ``train_step`` (here a step compiles a small function with inductor)."""

    def __init__(self):
        import torch

        self.step = 0
        self.function = torch.compile(lambda x: (x.sin() * 2 + 1).sum(), backend="inductor")

    def train_step(self):
        import torch

        return {"value": float(self.function(torch.arange(8.0) + self.step))}


@pytest.mark.slow  # ~10 s of inductor compiling (quick subset < 3 min)
def test_compile_cache_is_saved_after_step_1_and_loads_into_a_fresh_process_state(
        tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    # the suite turns torch's compile caches off (tests/conftest.py); a run has them on
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")  # read at each compile
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    torch._dynamo.reset()
    assert learning._load_compile_cache(tmp_path / "missing.bin") == {}
    steps = _Steps()
    learning._save_compile_cache_after_step_1(steps, tmp_path)
    steps.step = 1
    first = steps.train_step()
    saved = tmp_path / "compile_cache.bin"
    assert saved.stat().st_size > 0
    saved.rename(tmp_path / "kept.bin")
    steps.step = 2
    assert steps.train_step() != first  # the wrapped step still runs, and saves only once
    assert not saved.exists()
    torch._dynamo.reset()
    kinds = learning._load_compile_cache(tmp_path / "kept.bin")
    assert kinds.get("inductor", 0) >= 1, kinds
