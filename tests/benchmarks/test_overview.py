"""benchmarks/overview.py: the README's figure of what the recipes learn, numbers by hand."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import overview  # noqa: E402


def _write(path: Path, rows: list[dict]) -> Path:
    text = "\n".join(json.dumps(row) for row in rows) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def _eval(step: int, first: float, second: float) -> dict:
    return {"step": step, "time/eval": 1.0, "eval/agent_0/exploitability": first,
            "eval/agent_1/exploitability": second}


def test_worse_exploitability_takes_the_worse_agent_the_last_record_and_common_steps(tmp_path):
    a = _write(tmp_path / "a.jsonl.gz", [
        _eval(0, 0.6, 0.5), {"step": 1, "agent_0/loss": 1.0}, _eval(5, 0.4, 0.4),
        _eval(10, 0.1, 0.2),
        _eval(10, 0.15, 0.25),  # a resumed run replays step 10: its last record counts
    ])
    b = _write(tmp_path / "b.jsonl", [_eval(0, 0.6, 0.6), _eval(10, 0.3, 0.1)])
    points = overview.worse_exploitability([a, b])
    assert [p["step"] for p in points] == [0, 10]  # step 5 is in one run only
    assert points[0]["values"] == [0.6, 0.6] and points[0]["low"] == points[0]["high"] == 0.6
    assert points[1]["values"] == [0.25, 0.3]
    # mean 0.275; sample sd 0.05 / sqrt(2) = 0.035355; t(1 df) 12.706: half 12.706 * 0.035355 /
    # sqrt(2) = 0.31765
    assert points[1]["mean"] == pytest.approx(0.275)
    assert points[1]["low"] == pytest.approx(0.275 - 0.31765, abs=1e-4)
    assert points[1]["high"] == pytest.approx(0.275 + 0.31765, abs=1e-4)


def test_greedy_wins_pool_every_agent_of_every_seed_in_one_seat(tmp_path):
    def line(step, x0, o0, x1, o1):
        return {"step": step, "agents": {
            "agent_0": {"X": {"greedy_win": x0, "win": 0.0}, "O": {"greedy_win": o0}},
            "agent_1": {"X": {"greedy_win": x1}, "O": {"greedy_win": o1}}}}

    s0 = _write(tmp_path / "s0.jsonl",
                [line(50, 0.9, 0.7, 0.8, 0.6), line(100, 1.0, 0.9, 0.9, 0.8)])
    s1 = _write(tmp_path / "s1.jsonl",
                [line(50, 0.7, 0.5, 0.6, 0.4), line(100, 0.9, 0.8, 0.8, 0.7)])
    x = overview.greedy_wins([s0, s1], "X")
    o = overview.greedy_wins([s0, s1], "O")
    assert [p["step"] for p in x] == [50, 100]
    assert sorted(x[0]["values"]) == [0.6, 0.7, 0.8, 0.9] and x[0]["mean"] == pytest.approx(0.75)
    assert o[1]["mean"] == pytest.approx((0.9 + 0.8 + 0.8 + 0.7) / 4)
    # four values 0.6..0.9: sd 0.12910, t(3 df) 3.182: half 3.182 * 0.12910 / 2 = 0.20540
    assert x[0]["high"] - x[0]["mean"] == pytest.approx(0.2054, abs=1e-4)


def test_team_score_is_each_steps_score_and_its_running_mean(tmp_path):
    rows = [{"step": step, "team/score": score} for step, score in ((1, 0.0), (2, 1.0), (3, 2.0),
                                                                       (4, 3.0))]
    rows.insert(2, {"step": 2, "eval/team/score": 9.0})  # an evaluation row is not a step's games
    points = overview.team_score(_write(tmp_path / "h.jsonl", rows), window=2)
    assert [p["values"] for p in points] == [[0.0], [1.0], [2.0], [3.0]]
    assert [p["mean"] for p in points] == [0.0, 0.5, 1.5, 2.5]


def test_the_figure_is_drawn_from_the_committed_results(tmp_path):
    """Every file the README's figure names is in benchmarks/results, and it draws."""
    figure = overview.panels(overview.RESULTS)
    assert len(figure) == 6
    kuhn = figure[0]["points"]
    assert kuhn[0]["step"] == 0 and kuhn[-1]["step"] == 300 and len(kuhn[-1]["values"]) == 3
    assert max(kuhn[-1]["values"]) < 0.08  # benchmarks/README.md: 0.078, 0.069, 0.058
    overview.draw(figure, tmp_path / "overview.png")
    assert (tmp_path / "overview.png").stat().st_size > 10_000
