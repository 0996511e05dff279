"""benchmarks/learning_plots.py's comparison of runs: the greedy O seat's worst agent per
scored step (the TicTacToe goal needs every agent), numbers worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from learning_plots import greedy_o_by_run  # noqa: E402


def _record(step: int, o_figures: list[tuple[float, float]]) -> dict:
    return {"step": step, "agents": {
        f"agent_{i}": {"X": {"greedy_win": 0.99, "greedy_loss": 0.0},
                       "O": {"greedy_win": win, "greedy_loss": loss}}
        for i, (win, loss) in enumerate(o_figures)}}


def test_worst_agent_and_mean_per_step():
    runs = {"short": [_record(40, [(0.80, 0.06), (0.70, 0.02)]),
                      _record(80, [(0.86, 0.03), (0.84, 0.01)])],
            "long": [_record(150, [(0.887, 0.009), (0.893, 0.007)])]}
    summary = greedy_o_by_run(runs)
    assert summary["short"][40] == {"win_min": 0.70, "win_mean": 0.75, "loss_max": 0.06}
    assert summary["short"][80]["win_min"] == 0.84  # the X seat's 0.99 never counts
    assert abs(summary["short"][80]["win_mean"] - 0.85) < 1e-12
    assert summary["long"][150] == {"win_min": 0.887, "win_mean": 0.89, "loss_max": 0.009}


def test_the_command_line_draws_the_runs(tmp_path):
    files = []
    for name, records in {"a": [_record(50, [(0.8, 0.1)]), _record(100, [(0.9, 0.0)])],
                          "b": [_record(40, [(0.7, 0.2)])]}.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
        files.append(f"run {name}={path}")
    out = tmp_path / "plots" / "greedy_o.png"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/learning_plots.py"),
                           "--greedy_o", *files, "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["plot"] == "greedy_o.png" and out.stat().st_size > 1000
    assert printed["runs"]["run a"]["100"] == {"win_min": 0.9, "win_mean": 0.9, "loss_max": 0.0}
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks/learning_plots.py"),
                          "--greedy_o", "no_file", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--greedy_o 'no_file': expected LABEL=FILE" in bad.stderr


def test_a_hanabi_runs_curve_keeps_the_greedy_and_training_scores_beside_the_references(
        tmp_path, monkeypatch):
    """learning.py --from_metrics on a cooperative run: each evaluation's team score with its
    interval, the greedy policy's and the training games' scores of that step, and the small
    Hanabi's reference teams (random play, the rule team) on the plot."""
    import learning

    rows = [{"step": 0, "time/eval": 1.0, "eval/team/score": 0.0, "eval/team/score_low": 0.0,
             "eval/team/score_high": 0.0, "eval_greedy/team/score": 0.0},
            {"step": 1, "team/score": 0.25},  # a training step: not a point of the curve
            {"step": 2, "time/eval": 1.0, "team/score": 0.375, "eval/team/score": 0.5,
             "eval/team/score_low": 0.25, "eval/team/score_high": 0.75,
             "eval_greedy/team/score": 1.5}]
    path = tmp_path / "run_hanabi_x_metrics.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (result,) = learning.summarize([str(path)], "smollm2-135m")
    assert [p["step"] for p in result["curve"]] == [0, 2]
    assert result["curve"][1] == {"step": 2, "team/score": 0.5, "team/score_low": 0.25,
                                  "team/score_high": 0.75, "team/greedy/score": 1.5,
                                  "team/train_score": 0.375}
    references = result["baselines"]
    assert references["random"] < 0.5 and 3.0 < references["rules"] < 6.0
    assert (tmp_path / "out" / result["plot"]).stat().st_size > 1000
