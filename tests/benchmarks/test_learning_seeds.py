"""benchmarks/learning.py --seeds_of: the seeds' mean curve and its 95% interval, by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from learning import across_seeds, summarize  # noqa: E402


def _metrics(path: Path, points: dict[int, tuple[float, float]]) -> str:
    """A metrics.jsonl: each evaluation row followed by a training row."""
    rows = []
    for step, (first, second) in points.items():
        rows.append({"step": step, "time/eval": 1.0, "eval/agent_0/exploitability": first,
                     "eval/agent_1/exploitability": second})
        rows.append({"step": step + 1, "agent_0/loss": 0.3})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_worse_agent_mean_and_t_interval_across_seeds(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    files = [_metrics(tmp_path / "a.jsonl", {0: (0.6, 0.6), 10: (0.1, 0.05), 20: (0.3, 0.3)}),
             _metrics(tmp_path / "b.jsonl", {0: (0.6, 0.6), 10: (0.15, 0.2)}),
             _metrics(tmp_path / "c.jsonl", {0: (0.6, 0.6), 10: (0.3, 0.25)})]
    result = across_seeds(files, "kuhn_nash")
    assert result["seeds"] == 3
    assert [p["step"] for p in result["curve"]] == [0, 10]  # only steps every run has
    start, end = result["curve"]
    assert start["mean"] == pytest.approx(0.6) and start["low"] == start["high"] == 0.6
    # worse agents 0.1, 0.2, 0.3: mean 0.2, sd 0.1, t(2) = 4.303 -> 0.2 +- 4.303 * 0.1 / sqrt 3
    assert end["worse_agent"] == [0.1, 0.2, 0.3]
    assert end["mean"] == pytest.approx(0.2)
    assert end["low"] == pytest.approx(0.2 - 0.248434, abs=1e-4)
    assert end["high"] == pytest.approx(0.2 + 0.248434, abs=1e-4)
    if result["plot"] != "matplotlib not installed":
        assert (tmp_path / "out" / "learning_kuhn_nash_seeds.png").stat().st_size > 1000


def test_one_run_from_its_metrics_keeps_every_agent_and_plots(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    file = _metrics(tmp_path / "metrics_x.jsonl", {0: (0.6, 0.5), 10: (0.2, 0.1)})
    (result,) = summarize([file], "tiny")
    assert result["recipe"] == "x" and result["steps"] == 10
    assert [(p["agent_0/exploitability"], p["agent_1/exploitability"])
            for p in result["curve"]] == [(0.6, 0.5), (0.2, 0.1)]
    if result["plot"] != "matplotlib not installed":
        assert (tmp_path / "out" / "learning_x.png").stat().st_size > 1000


def test_gzipped_metrics_read_as_the_plain_file(tmp_path, monkeypatch):
    """results/ keeps metrics gzipped: the curve of the .gz equals the plain file's, and no
    plain per-step metrics file is left there (each device call carries the working tree)."""
    import gzip

    from learning import curve_of

    plain = Path(_metrics(tmp_path / "m.jsonl", {0: (0.6, 0.5), 10: (0.2, 0.1)}))
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    curve = curve_of(packed)
    assert curve == curve_of(plain) and [p["step"] for p in curve] == [0, 10]
    assert curve[1]["agent_1/exploitability"] == 0.1
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    named = tmp_path / "run_y_metrics.jsonl.gz"
    packed.rename(named)
    (result,) = summarize([str(named)], "tiny")
    assert result["recipe"] == "run_y" and result["curve"] == curve
    # a file as results/ keeps it (learning_X_metrics.jsonl.gz): its curve is learning_X, once
    kept = tmp_path / "learning_hanabi_z_metrics.jsonl.gz"
    named.rename(kept)
    (result,) = summarize([str(kept)], "tiny")
    assert result["recipe"] == "hanabi_z"
    assert (tmp_path / "out" / "learning_hanabi_z.png").is_file()
    assert not list((tmp_path / "out").glob("learning_learning_*"))
    results = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
    assert not list(results.glob("*_metrics.jsonl"))


def test_a_game_curve_draws_each_agents_interval_and_greedy_line(tmp_path, monkeypatch):
    """Against random: the win and non-loss rates with their 95% intervals shaded and, from
    eval.greedy_too, the greedy policy's rate dotted; an agent with no greedy figures gets
    none."""
    import learning_plots

    rows = []
    for step, (win, low, high, greedy) in {0: (0.4, 0.3, 0.5, 0.45),
                                           10: (0.8, 0.7, 0.9, 0.95)}.items():
        row = {"step": step, "time/eval": 1.0}
        for agent in ("agent_0", "agent_1"):
            row.update({f"eval/{agent}/win_rate": win, f"eval/{agent}/win_rate_low": low,
                        f"eval/{agent}/win_rate_high": high,
                        f"eval/{agent}/non_loss_rate": win + 0.05,
                        f"eval/{agent}/non_loss_rate_low": low + 0.05,
                        f"eval/{agent}/non_loss_rate_high": high + 0.05})
        row["eval_greedy/agent_0/win_rate"] = greedy
        rows.append(row)
    file = tmp_path / "metrics_ttt.jsonl"
    file.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    drawn = {}

    def keep(plt, figure, path, result):
        drawn["axes"] = figure.axes
        result["plot"] = path.name

    monkeypatch.setattr(learning_plots, "_save", keep)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    (result,) = summarize([str(file)], "tiny")
    assert result["curve"][1]["agent_0/non_loss_rate_high"] == pytest.approx(0.95)
    non_loss, win = drawn["axes"]
    lines = {line.get_label(): line for line in win.get_lines()}
    assert list(lines["agent_0 greedy"].get_ydata()) == [0.45, 0.95]
    assert "agent_1 greedy" not in lines
    assert list(lines["agent_1"].get_ydata()) == [0.4, 0.8]
    for axis, shift in ((win, 0.0), (non_loss, 0.05)):
        bands = {band.get_label(): band for band in axis.collections}
        assert set(bands) == {"agent_0 95%", "agent_1 95%"}
        ys = bands["agent_1 95%"].get_paths()[0].vertices[:, 1]
        assert min(ys) == pytest.approx(0.3 + shift) and max(ys) == pytest.approx(0.9 + shift)
