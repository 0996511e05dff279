"""kill -9 mid-run, then resume: nothing checkpointed is lost and the run continues exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config
from roll.utils.checkpoint import latest_checkpoint, load_trainer_state

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
ARGS = [
    "--config_path", str(ROOT / "examples" / "tictactoe"),
    "--config_name", "multi_agent_tictactoe",
]
OVERRIDES = [
    "env.seat_to_agent=[[agent_0,random],[random,agent_1]]",
    "rollout.constrained_decoding=true", "rollout.num_groups=2", "rollout.group_size=2",
    "rollout.sampling.max_new_tokens=12", "team.optim.lr=1e-2", "eval.eval_steps=0",
    "tracking.backends=[jsonl]", f"max_steps={STEPS}", "save_steps=2", "keep_last=10",
]
SCRIPT = str(ROOT / "examples" / "start_multi_agent_pipeline.py")
pytestmark = pytest.mark.slow


def _launch(out: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, ROLL_CACHE=str(out.parent / "cache"))
    return subprocess.Popen(
        [sys.executable, SCRIPT, *ARGS, *OVERRIDES, f"output_dir={out}", *extra],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def _adapters(ckpt: Path) -> dict[str, torch.Tensor]:
    return {
        f"{agent.name}/{key}": value
        for agent in sorted((ckpt / "agents").iterdir())
        for key, value in load_file(agent / "adapter_model.safetensors").items()
    }


def test_kill_9_then_resume_equals_an_uninterrupted_run(tmp_path):
    straight = tmp_path / "straight"
    proc = _launch(straight)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()

    crashed = tmp_path / "crashed"
    proc = _launch(crashed)
    target = crashed / "checkpoints" / "step_00000002"
    deadline = time.time() + 300
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    survivor = latest_checkpoint(crashed)
    assert survivor is not None
    killed_at = int(survivor.name.split("_")[1])
    assert killed_at < STEPS, "the run finished before the kill; the test proved nothing"

    # What was saved is intact: a fresh pipeline loads exactly the saved adapters and
    # optimizer states.
    cfg = load_config(ARGS[1], ARGS[3], OVERRIDES + [f"output_dir={crashed}"])
    fresh = AgenticPipeline(cfg)
    fresh.load(survivor)
    saved = _adapters(survivor)
    for name in fresh.agent_names:
        for key, value in fresh.model.export_adapter(name).items():
            assert torch.equal(value, saved[f"{name}/{key}"])
    state = load_trainer_state(survivor)
    for name in fresh.agent_names:
        ours = fresh.trainer.optimizers[name].state_dict()["state"]
        theirs = state["trainer"]["optimizers"][name]["state"]
        assert ours.keys() == theirs.keys() and ours
        for index in ours:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(ours[index][key], theirs[index][key])
    assert fresh.step == killed_at

    proc = _launch(crashed, "resume=latest")
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    # Every step the straight run checkpointed after the kill equals the resumed run's.
    for step in range(killed_at + 2, STEPS + 1, 2):
        name = f"step_{step:08d}"
        ours, theirs = _adapters(crashed / "checkpoints" / name), _adapters(
            straight / "checkpoints" / name)
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert torch.equal(ours[key], theirs[key]), (step, key)


def test_crash_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, monkeypatch):
    cfg = load_config(ARGS[1], ARGS[3], OVERRIDES + [f"output_dir={tmp_path / 'run'}",
                                                      "max_steps=4"])
    pipeline = AgenticPipeline(cfg)
    calls = {"n": 0}
    original = pipeline.model.save_agent

    def flaky_save(name, folder):
        calls["n"] += 1
        if calls["n"] == 3:  # first agent of the second checkpoint
            original(name, folder)
            raise OSError("disk full")
        return original(name, folder)

    monkeypatch.setattr(pipeline.model, "save_agent", flaky_save)
    with pytest.raises(OSError, match="disk full"):
        pipeline.run()
    survivor = latest_checkpoint(tmp_path / "run")
    assert survivor is not None and survivor.name == "step_00000002"
    again = AgenticPipeline(cfg)
    again.load(survivor)
    assert again.step == 2
    leftovers = [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()]
    assert leftovers == ["step_00000002"]


def _run_kuhn(overrides: list[str], out: Path, steps: int, *extra: str) -> AgenticPipeline:
    """The Kuhn CPU quickstart with ``overrides``, saving every 2 steps, run to ``steps``."""
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu",
                      overrides + ["rollout.num_groups=4", "eval.eval_steps=0",
                                   "tracking.backends=[jsonl]", "save_steps=2", "keep_last=5",
                                   f"output_dir={out}", f"max_steps={steps}", *extra])
    pipeline = AgenticPipeline(cfg)
    pipeline.run()
    return pipeline


def test_rae_baselines_survive_a_checkpoint_bit_exactly(tmp_path):
    """advantage.estimator=rae: the running baselines are part of the run's state. A run
    resumed from step 2 holds exactly the baselines it saved and continues exactly as the run
    that never stopped (baselines and adapters at step 3, bit for bit)."""
    def run(out: Path, steps: int, *extra: str) -> AgenticPipeline:
        return _run_kuhn(["advantage.estimator=rae", "advantage.rae_decay=0.5"], out, steps,
                         *extra)

    straight = run(tmp_path / "straight", 3)
    first = run(tmp_path / "stopped", 2)
    saved = load_trainer_state(latest_checkpoint(tmp_path / "stopped"))["baselines"]
    assert saved == first.baselines.values and len(saved) == 2  # agent_0 seat 0, agent_1 seat 1
    assert any(value != 0 for value in saved.values())
    resumed = run(tmp_path / "stopped", 3, "resume=latest")
    assert resumed.baselines.values == straight.baselines.values
    for name in straight.agent_names:
        ours, theirs = resumed.model.export_adapter(name), straight.model.export_adapter(name)
        assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_the_kl_steered_rate_survives_a_checkpoint_bit_exactly(tmp_path):
    """team.optim.target_kl: the rate's multiplier is part of the run's state. A run resumed
    from step 2 holds the multiplier it saved and continues exactly as the run that never
    stopped (multiplier, rate and adapters at step 3, bit for bit)."""
    def run(out: Path, steps: int, *extra: str) -> AgenticPipeline:
        return _run_kuhn(["team.optim.target_kl=1e-6", "trainer.ppo_mini_batch_size=4"], out,
                         steps, *extra)

    def scales(pipeline: AgenticPipeline) -> dict[str, float]:
        return {name: pipeline.trainer.schedulers[name].lr_lambdas[0].kl_scale
                for name in pipeline.agent_names}

    straight = run(tmp_path / "straight", 3)
    first = run(tmp_path / "stopped", 2)
    saved = load_trainer_state(latest_checkpoint(tmp_path / "stopped"))["trainer"]["schedulers"]
    assert {name: state["lr_lambdas"][0]["kl_scale"] for name, state in saved.items()} == \
        scales(first)
    assert all(scale != 1.0 for scale in scales(first).values())  # it moved (2 steps, 1e-6)
    resumed = run(tmp_path / "stopped", 3, "resume=latest")
    assert scales(resumed) == scales(straight)
    for name in straight.agent_names:
        assert (resumed.trainer.schedulers[name].get_last_lr()
                == straight.trainer.schedulers[name].get_last_lr())
        ours, theirs = resumed.model.export_adapter(name), straight.model.export_adapter(name)
        assert all(torch.equal(ours[key], theirs[key]) for key in ours)


def test_resume_on_another_base_is_one_config_error_naming_resume(tmp_path, capsys):
    """Adapters saved on the tiny model, resumed on a deeper one (3 blocks, not 2): the
    tensors cannot load. It was a traceback from inside the model; it is the one line the CLI
    prints."""
    from roll.errors import ConfigError
    from roll.models.tiny import TinyModelSpec, build_tiny_model

    deeper = build_tiny_model(tmp_path / "deeper", TinyModelSpec(num_hidden_layers=3))

    def cfg(*extra: str):
        return load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu", [
            "rollout.num_groups=2", "eval.eval_steps=0", "tracking.backends=[jsonl]",
            f"output_dir={tmp_path / 'run'}", *extra])

    AgenticPipeline(cfg("max_steps=1")).run()
    # A requeued job whose run had ended: it says so (it used to exit in silence).
    assert AgenticPipeline(cfg("max_steps=1", "resume=latest")).run() == {}
    assert "at step 1; max_steps=1: nothing left to train" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"^config error: resume='latest': .*step_00000001: "
                                          r"agent_0's adapter does not fit this model "
                                          r"\(.*deeper\): "):
        AgenticPipeline(cfg("max_steps=2", "resume=latest", f"model.path={deeper}")).run()
    assert latest_checkpoint(tmp_path / "run").name == "step_00000001"  # left as it was
