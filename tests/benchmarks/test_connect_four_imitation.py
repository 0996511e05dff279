"""benchmarks/connect_four_imitation.py: the targets are the rule's moves as the rollout would
answer them, and a tiny run fits them (its loss falls) and prints its curve."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyspiel
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import connect_four_imitation  # noqa: E402


def _history(*columns: int) -> list[int]:
    state = pyspiel.load_game("connect_four").new_initial_state()
    for column in columns:
        state.apply_action(column)
    return list(state.history())


@pytest.mark.slow  # the tiny model's pipeline (~3 s)
def test_the_targets_are_the_rules_moves_as_answers(tmp_path):
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    cfg = load_config(str(ROOT / "examples/connect_four"), "mixed", [
        "model.path=tiny", "tracking.backends=[jsonl]", f"output_dir={tmp_path}",
        "env.renderer=connect_four_lines"])
    pipeline = AgenticPipeline(cfg)
    # x to move wins in 0 or 4 (the rule: the one nearer the centre, 4); o to move must block 3;
    # an empty board: the centre
    found = {0: {"win": [(_history(1, 6, 2, 6, 3, 6), {0, 4})], "block": [],
                 "quiet": [(_history(), set())]},
             1: {"win": [], "block": [(_history(0, 6, 1, 6, 2), {3})], "quiet": []}}
    rows = connect_four_imitation.target_rows(pipeline, found)
    answers = [pipeline.tokenizer.decode(ids[length:]) for ids, length, _ in rows]
    assert [next(m for m in ("x4", "x3", "o3") if m in a) for a in answers] == ["x4", "x3", "o3"]
    for ids, length, points in rows:
        assert points and all(offset < len(ids) - length for offset, _, _ in points)
    assert "x4: x 4, o 1" in pipeline.tokenizer.decode(rows[0][0][:rows[0][1]])


@pytest.mark.slow  # ~15 s: four probes of 2 x 3 x 4 positions and three epochs of the tiny model
def test_a_tiny_run_fits_its_targets_and_prints_its_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [
        "connect_four_imitation.py", "--tiny", "--epochs", "3", "--eval_every", "1",
        "--positions", "4", "--batch", "8", "--lr", "5e-3", "--tag", "_t", "team.lora.rank=4"])
    connect_four_imitation.main()
    summary = json.loads((tmp_path / "connect_four_imitation_t.json").read_text())
    assert summary["positions"] == 24 and summary["renderer"] == "connect_four_lines"
    assert [point["epoch"] for point in summary["curve"]] == [0, 1, 2, 3]
    assert [point["updates"] for point in summary["curve"]] == [0, 3, 6, 9]
    first, *_, last = summary["curve"][1:]
    assert last["nll"] < first["nll"]  # the targets are being fitted
    for point in summary["curve"]:
        for where in ("trained", "held_out"):
            for mark in "xo":
                figures = point[where][mark]
                assert figures["win_positions"] == figures["block_positions"] == 4
                assert 0 <= figures["wins_taken"] <= 1
    assert summary["rule_on_held_out"]["x"]["wins_taken"] == 1.0
