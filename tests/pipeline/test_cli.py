"""Bad configs through the CLI: one clear line naming the key, exit code 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.pipeline.cli import load_config, run_cli

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ["--config_path", str(ROOT / "examples" / "tictactoe"),
          "--config_name", "multi_agent_tictactoe"]

BAD = [
    (["env.game=tic_tac_tow"], "env.game"),
    (["env.seat_to_agent=[agent_0,agent_9]"], "agent_9"),
    (["model.path=/no/such/model"], "model.path"),
    (["team.optim.lr=-0.001"], "optim.lr"),
    (["max_steps=[1,"], "bad override syntax"),
    (["max_stepz=3"], "max_stepz"),
    (["max_steps=abc"], "max_steps"),
    (["advantage.estimator=ppo9"], "estimator"),
    (["tracking.backends=[mlflow]"], "tracking.backends"),
    (["env.params.colours=3", "env.game=hanabi"], "env.params.colours"),
    (["env.game=hanabi", "env.params.players=9", "env.seat_to_agent=[agent_0,agent_1]"],
     "players"),
    (["rollout.sampling.top_p=0"], "rollout.sampling.top_p"),
    (["team.lora.target_modules=[q_proj,qkv_proj]"], "lora.target_modules"),
    (["--num_agents", "0"], "num_agents"),
    (["--lora_rank", "-8"], "lora.rank"),
    (["eval.opponent=mcts:x"], "eval.opponent"),
    (["rollout.engine=trt"], "rollout.engine"),
    (["keep_last=0"], "keep_last"),
]


@pytest.mark.parametrize("args, names", BAD)
def test_bad_config_is_one_line_naming_the_key(args, names, tmp_path, capsys):
    out = tmp_path / "run"
    flags = [a for a in args if a.startswith("--") or a.lstrip("-").isdigit()]
    overrides = [a for a in args if a not in flags]
    code = run_cli(
        lambda cfg: pytest.fail("the pipeline must not start"),
        CONFIG + flags + overrides + [f"output_dir={out}"],
        "test",
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("config error")
    assert names in err
    assert not out.exists()


def test_good_config_validates_and_flags_become_overrides(capsys):
    code = run_cli(lambda cfg: None, CONFIG + ["--validate_only", "--num_agents", "2",
                                               "--lora_rank", "32", "--lora_alpha", "64",
                                               "max_steps=7"], "test")
    text = capsys.readouterr().out
    assert code == 0
    assert "rank: 32" in text and "alpha: 64.0" in text and "max_steps: 7" in text


def test_exit_code_from_a_real_process(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "start_multi_agent_pipeline.py"), *CONFIG,
         "env.seat_to_agent=[agent_0,ghost]", f"output_dir={out}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "env.seat_to_agent" in proc.stderr and "ghost" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("yaml_path", sorted((ROOT / "examples").glob("*/*.yaml")),
                         ids=lambda p: p.parent.name)
def test_every_example_config_validates_and_names_its_launch_command(yaml_path):
    first = yaml_path.read_text().splitlines()[0]
    assert first.startswith("# Launch: bash examples/")
    script = ROOT / first.split("bash ", 1)[1].strip()
    assert script.is_file() and os.access(script, os.X_OK)
    assert f"--config_name {yaml_path.stem}" in script.read_text()
    cfg = load_config(str(yaml_path.parent), yaml_path.stem, [])
    assert cfg.max_steps >= 1
