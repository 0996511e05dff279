"""The plot command on a small metrics.jsonl, run as ``python -m roll.utils.plot``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from roll.utils.plot import fold_intervals, group_series, main, read_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _write_metrics(run_dir: Path) -> None:
    lines = []
    for step in range(6):
        lines.append(json.dumps({
            "step": step,
            "wall_time": 1000.0 + step,
            "alice/policy_loss": 1.0 / (step + 1),
            "alice/episode_return": step * 0.1,
            "bob/policy_loss": float("nan") if step == 4 else 0.5,
            "eval/alice/win_rate": 0.5,
            "eval/alice/win_rate_low": 0.25,
            "eval/alice/win_rate_high": 0.75,
            "eval/alice/lone_low": 0.1,  # a bound without its curve stays a curve
            "eval_greedy/alice/win_rate": 0.75,
            "eval/team/score": 1.0,
            "team/episode_return": step * 0.05,
            "time/rollout": 2.0,
            "rollout/episodes": 8,
        }))
    lines.append(json.dumps({"step": 5, "alice/policy_loss": 9.0}))  # step redone
    run_dir.mkdir()
    # The last line is cut, as when a run is killed mid-write.
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 6, "alic')


@pytest.mark.slow  # a plotting subprocess (~3 s): the quick subset stays under 3 minutes
def test_plot_command_writes_valid_pngs(tmp_path):
    run_dir = tmp_path / "run"
    out = tmp_path / "plots"
    _write_metrics(run_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "MPLBACKEND": "Agg"}
    result = subprocess.run(
        [sys.executable, "-m", "roll.utils.plot", str(run_dir), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    names = ["curves_alice.png", "curves_bob.png", "curves_team.png"]
    assert sorted(Path(line).name for line in result.stdout.split()) == names
    for name in names:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 10_000, (name, len(data))
    assert "skipped 1 unreadable line" in result.stderr


def test_read_metrics_keeps_last_value_of_a_step(tmp_path):
    _write_metrics(tmp_path / "run")
    series = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert series["alice/policy_loss"][5] == 9.0
    assert series["rollout/episodes"][0] == 8.0
    assert "wall_time" not in series and "step" not in series


def test_each_agent_figure_holds_its_training_and_evaluation_curves(tmp_path):
    _write_metrics(tmp_path / "run")
    figures = group_series(read_metrics(tmp_path / "run" / "metrics.jsonl"))
    assert sorted(figures) == ["alice", "bob", "team"]
    assert sorted(figures["alice"]) == ["episode_return", "eval/lone_low", "eval/win_rate",
                                        "eval/win_rate_high", "eval/win_rate_low",
                                        "eval_greedy/win_rate", "policy_loss"]
    curves, bands = fold_intervals(figures["alice"])
    assert sorted(curves) == ["episode_return", "eval/lone_low", "eval/win_rate",
                              "eval_greedy/win_rate", "policy_loss"]
    assert list(bands) == ["eval/win_rate"]
    low, high = bands["eval/win_rate"]
    assert low[2] == 0.25 and high[2] == 0.75
    assert figures["alice"]["eval_greedy/win_rate"][3] == 0.75
    assert "eval/team/score" in figures["team"] and "time/rollout" in figures["team"]


def test_missing_metrics_file_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path)])
    assert exit_info.value.code == 2
    assert "metrics.jsonl: not found" in capsys.readouterr().err
