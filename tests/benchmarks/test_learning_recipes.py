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


def _args(tiny: bool, greedy_too: bool = False) -> argparse.Namespace:
    return argparse.Namespace(tiny=tiny, model="smollm2-135m", steps=7, eval_every=7,
                              override=["seed=3"], greedy_too=greedy_too)


@pytest.mark.slow  # the full CI runs it (quick subset < 3 min)
@pytest.mark.parametrize("name", sorted(learning.RECIPES))
def test_every_recipe_makes_a_valid_config(name, tmp_path):
    cfg = learning.recipe_config(_args(tiny=False), name, tmp_path)
    assert cfg.max_steps == 7 and cfg.seed == 3 and cfg.output_dir == str(tmp_path)
    assert learning.recipe_config(_args(tiny=True), name, tmp_path).model.path == "tiny"


def test_the_tictactoe_recipe_has_critics_and_trains_each_o_seat_twice_against_random(tmp_path):
    cfg = learning.recipe_config(_args(tiny=False), "tictactoe_mixed", tmp_path)
    assert cfg.advantage.estimator == "ippo" and cfg.critic.mode == "per_agent"
    assert cfg.advantage.lam == 0.9 and cfg.trainer.action_entropy_coef == 0.05
    assert cfg.rollout.num_groups * cfg.rollout.group_size == 256
    assert cfg.env.renderer == "tic_tac_toe_lines" and cfg.trainer.micro_batch_size == 128
    seatings = [tuple(seating) for seating in cfg.env.seat_to_agent]
    for agent in ("agent_0", "agent_1"):
        assert seatings.count(("random", agent)) == 2
        assert seatings.count((agent, "random")) == 1
    # the recipe before session 56: whole-game GRPO, the plain board, each seating once
    old = learning.recipe_config(_args(tiny=False), "tictactoe_grpo", tmp_path)
    assert old.advantage.estimator == "grpo" and old.critic.mode == "none"
    assert old.env.renderer == "" and old.rollout.num_groups == 24
    assert old.team.optim.lr == 1e-4 and old.trainer.action_entropy_coef == 0.01
    assert len(old.env.seat_to_agent) == 6 and old.trainer.ppo_mini_batch_size == 64


def test_greedy_too_is_the_runs_own_greedy_evaluation(tmp_path):
    """--greedy_too turns on eval.greedy_too (the greedy policy against random at every
    evaluation, in the run's metrics) instead of a second evaluation of its own after training;
    a recipe keeps what its YAML says without it."""
    assert not learning.recipe_config(_args(tiny=True), "kuhn_nash", tmp_path).eval.greedy_too
    greedy = learning.recipe_config(_args(tiny=True, greedy_too=True), "kuhn_nash", tmp_path)
    assert greedy.eval.greedy_too and greedy.eval.temperature == 1.0
    assert learning.recipe_config(_args(tiny=True), "tictactoe_mixed", tmp_path).eval.greedy_too


@pytest.mark.slow  # ~20 s: a tiny run of two steps (quick subset < 3 min)
def test_profile_step_profiles_that_step_and_the_run_goes_on(tmp_path, monkeypatch):
    """--profile_step 2: step 2 runs under torch.profiler, its report (the step's phase times,
    host operators) lands in the run's profile.json, and the run still trains both steps;
    --sync_step 1 beside it: step 1's sync_sites.json (no CUDA here: nothing counted)."""
    import json

    monkeypatch.setenv("OUT", str(tmp_path))
    args = argparse.Namespace(
        tiny=True, model="smollm2-135m", steps=2, eval_every=100, run_dir=str(tmp_path),
        tag="_profiled", vs_mcts=0, greedy_too=False, tactics=False, profile_step=2, sync_step=1,
        cprofile_rollout=0,
        compile_cache=None,
        profile_top=5, override=["rollout.num_groups=4", "eval.eval_steps=0"])
    learning.run_recipe(args, "kuhn_nash")
    run = tmp_path / "run_kuhn_nash_profiled"
    report = json.loads((run / "profile.json").read_text())
    assert report["step"] == 2 and report["wall_s"] > 0
    assert report["time"]["time/step"] > 0 and report["time"]["time/train"] > 0
    assert len(report["top"]) == 5 and report["top"][0]["self_cpu_ms"] > 0
    syncs = json.loads((run / "sync_sites.json").read_text())
    assert syncs["step"] == 1 and syncs["time"]["time/step"] > 0
    assert syncs["cuda"] is False and syncs["sites"] == []  # the CPU suite
    steps = [json.loads(line).get("step") for line in (run / "metrics.jsonl").open()]
    assert 1 in steps and 2 in steps


_SAVE = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
import run_hooks
from pathlib import Path

class Steps:  # the two members of a pipeline the wrapper uses; a step compiles with inductor
    step = 0
    function = staticmethod(torch.compile(lambda x: (x.sin() * 2 + 1).sum()))
    def train_step(self):
        return {"value": float(self.function(torch.arange(8.0) + self.step))}

out = Path(sys.argv[2])
print(json.dumps({"missing": run_hooks.load_compile_cache(out / "missing.bin")}))
steps = Steps()
run_hooks.save_compile_cache_after_step_1(steps, out)
values = []
for step in (1, 2):
    steps.step = step
    values.append(steps.train_step()["value"])
    if step == 1:
        (out / "compile_cache.bin").rename(out / "kept.bin")
print(json.dumps({"values": values, "again": (out / "compile_cache.bin").exists()}))
"""

_LOAD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import run_hooks
from pathlib import Path
print(json.dumps({"loaded": run_hooks.load_compile_cache(Path(sys.argv[2]) / "kept.bin")}))
"""


@pytest.mark.slow  # ~15 s: two fresh processes, one compiling with inductor (quick < 3 min)
def test_compile_cache_is_saved_after_step_1_and_loads_in_a_fresh_process(tmp_path):
    """--compile_cache: step 1's torch.compile artifacts are written once, after step 1 (the
    wrapped step still runs), and a new process loads them. Fresh processes: the suite turns
    torch's compile caches off (tests/conftest.py), and torch reads that switch at import."""
    import json
    import os
    import subprocess

    # (TORCHINDUCTOR_VEC_ISA_OK=0: scalar C++ kernels, no compiled probe of the CPU's vector
    # instructions in each fresh process; what is cached and loaded is the same)
    env = dict(os.environ, TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1",
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TORCHINDUCTOR_VEC_ISA_OK="0")
    folder = str(Path(learning.__file__).parent)

    def run(script: str) -> list[dict]:
        done = subprocess.run([sys.executable, "-c", script, folder, str(tmp_path)], env=env,
                              capture_output=True, text=True, timeout=300, check=True)
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    missing, saved = run(_SAVE)
    assert missing == {"missing": {}}
    assert saved["values"][0] != saved["values"][1] and not saved["again"]
    assert (tmp_path / "kept.bin").stat().st_size > 0
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor_fresh")  # nothing on disk
    (loaded,) = run(_LOAD)
    assert loaded["loaded"].get("inductor", 0) >= 1, loaded


def _figures_of_step(step: int) -> dict[str, float]:
    return {"win": 0.1 * step, "loss": 0.5 - 0.1 * step, "greedy_win": 0.2 * step,
            "greedy_loss": 0.1, "wins_taken": 0.5, "blocks_made": 0.3 + 0.1 * step}


@pytest.mark.slow  # a tiny TicTacToe run of three steps (~10 s)
def test_tactics_are_scored_at_every_evaluation_and_kept_in_the_run(tmp_path, monkeypatch):
    """--tactics: each evaluation (steps 0, 2 and the last, 3, here) appends the agents' table
    to the run's tactics.jsonl, so a run cut short keeps them; before / after are its first and
    last records, and their curves are drawn. The table itself (44 s a scoring of the tiny model
    on this CPU) is tested in test_tictactoe_policy.py; here a scorer whose figures name the
    step it saw stands in for it."""
    import json

    import tictactoe_policy

    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(tictactoe_policy, "report", lambda pipeline: {
        agent: {mark: _figures_of_step(pipeline.step) for mark in "XO"}
        for agent in pipeline.agent_names})
    args = argparse.Namespace(
        tiny=True, model="smollm2-135m", steps=3, eval_every=2, run_dir=str(tmp_path),
        tag="_tactics", vs_mcts=0, greedy_too=False, tactics=True, profile_step=0, sync_step=0,
        cprofile_rollout=0,
        compile_cache=None, profile_top=5,
        override=["rollout.num_groups=8", "eval.num_episodes=4"])  # 8 seatings
    result = learning.run_recipe(args, "tictactoe_mixed")
    lines = (tmp_path / "run_tictactoe_mixed_tactics" / "tactics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [record["step"] for record in records] == [0, 2, 3]
    assert records[1]["agents"]["agent_1"]["O"] == _figures_of_step(2)
    tactics = result["tactics"]
    assert tactics["before"]["agent_0"]["X"] == _figures_of_step(0)
    assert tactics["after"]["agent_1"]["O"] == _figures_of_step(3)
    assert tactics["at_evaluations"] == records
    plot = tmp_path / result["tactics_plot"]
    assert plot.name == "learning_tictactoe_mixed_tactics_tactics.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_tactics_file_is_drawn_beside_itself(tmp_path, monkeypatch, capsys):
    import json

    file = tmp_path / "run_x_tactics.jsonl"
    file.write_text("".join(json.dumps({"step": step, "agents": {
        agent: {mark: _figures_of_step(step) for mark in "XO"} for agent in ("a", "b")}}) + "\n"
        for step in (0, 20, 40)))
    monkeypatch.setattr(sys, "argv", ["learning.py", "--from_tactics", str(file)])
    learning.main()
    png = (tmp_path / "run_x_tactics.png").read_bytes()
    assert png[:4] == b"\x89PNG"
    assert capsys.readouterr().out.strip() == "run_x_tactics.png"
    assert int.from_bytes(png[16:20], "big") == 1400  # three panels (14 in at 100 dpi)

    # records with the greedy policy's gap to the best player get a fourth panel
    gap = {"total": 0.2, "best": 0.925, "by_move": [0.1, 0.05, 0.05, 0.0], "missed_wins": 0.0,
           "missed_blocks": 0.1, "other": 0.1, "top": []}
    file.write_text("".join(json.dumps({"step": step, "agents": {
        agent: {mark: {**_figures_of_step(step), "greedy_gap": gap} for mark in "XO"}
        for agent in ("a", "b")}}) + "\n" for step in (0, 20, 40)))
    learning.main()
    png = (tmp_path / "run_x_tactics.png").read_bytes()
    assert int.from_bytes(png[16:20], "big") == 1800  # four panels (18 in)


def test_the_connect_four_recipe_is_the_tictactoe_recipe_on_connect_four(tmp_path):
    """connect_four_mixed trains as examples/connect_four/mixed.yaml says: TicTacToe's mixed
    recipe (critics, both seats against each other and random, each agent's second seat against
    random twice) on Connect Four with the lines prompt, 128 games a step; it is
    evaluated against MCTS too, and --tactics scores it with Connect Four's own probe."""
    cfg = learning.recipe_config(_args(tiny=False), "connect_four_mixed", tmp_path)
    ttt = learning.recipe_config(_args(tiny=False), "tictactoe_mixed", tmp_path)
    assert cfg.env.game == "connect_four" and cfg.env.renderer == "connect_four_lines"
    assert cfg.trainer.ppo_mini_batch_size == 200
    assert cfg.rollout.num_groups * cfg.rollout.group_size == 128 and cfg.rollout.max_turns == 42
    assert cfg.env.seat_to_agent == ttt.env.seat_to_agent
    assert (cfg.advantage, cfg.critic.mode, cfg.trainer.action_entropy_coef) == (
        ttt.advantage, ttt.critic.mode, ttt.trainer.action_entropy_coef)
    assert cfg.trainer.policy_over == "moves" and cfg.trainer.micro_batch_size == 128
    assert cfg.eval.greedy_too and cfg.eval.opponent == "random"
    assert learning.VERSUS["connect_four_mixed"] == "mcts"
    assert learning.TACTICS["connect_four_mixed"] == "connect_four_policy"
    assert learning.TACTICS["tictactoe_mixed"] == "tictactoe_policy"


def test_a_connect_four_tactics_file_is_drawn_as_takes_and_blocks(tmp_path, monkeypatch, capsys):
    """connect_four_policy's records (wins taken, blocks made; no win / loss against random)
    draw as their own two panels, not TicTacToe's."""
    import json

    figures = {"wins_taken": 0.3, "greedy_wins_taken": 0.5, "blocks_made": 0.2,
               "greedy_blocks_made": 0.1, "quiet_entropy": 1.5, "win_positions": 200,
               "block_positions": 200, "quiet_positions": 200}
    file = tmp_path / "run_c4_tactics.jsonl"
    file.write_text("".join(json.dumps({"step": step, "agents": {
        agent: {mark: figures for mark in "xo"} for agent in ("a", "b")}}) + "\n"
        for step in (0, 25)))
    monkeypatch.setattr(sys, "argv", ["learning.py", "--from_tactics", str(file)])
    learning.main()
    png = (tmp_path / "run_c4_tactics.png").read_bytes()
    assert png[:4] == b"\x89PNG" and capsys.readouterr().out.strip() == "run_c4_tactics.png"
    assert int.from_bytes(png[16:20], "big") == 1100  # two panels (11 in at 100 dpi)
