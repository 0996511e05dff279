"""benchmarks/connect_four_policy.py: positions classified by hand, the figures of made-up
policies computed by hand, the references, and a real tiny agent scored on a few positions."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.helpers import connect_four_after as after

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import connect_four_policy as cp  # noqa: E402


def test_positions_are_classified_for_the_seat_to_move():
    # x: 1 2 3 on the bottom row, o: 6 6 6. x to move wins in 0 or 4.
    assert cp.classify(after(1, 6, 2, 6, 3, 6)) == ("win", {0, 4})
    # the same with o to move after x's wasted move in 5 (x still threatens 0 and 4, o can win
    # in 6): o wins first
    assert cp.classify(after(1, 6, 2, 6, 3, 6, 5)) == ("win", {6})
    # x: 0 1 2, o: 6 6; o to move cannot win, must block 3
    assert cp.classify(after(0, 6, 1, 6, 2)) == ("block", {3})
    assert cp.classify(after(3, 3)) == ("quiet", set())


def test_sampled_positions_are_distinct_and_of_their_kind_and_seat():
    found = cp.positions(12, seed=1)
    boards = set()
    for seat in (0, 1):
        for kind in cp.KINDS:
            assert len(found[seat][kind]) == 12
            for history, right in found[seat][kind]:
                state = after(*history)
                assert state.current_player() == seat and not state.is_terminal()
                assert cp.classify(state) == (kind, right)
                boards.add(str(state))
    assert len(boards) == 72
    assert cp.positions(12, seed=1) == found  # seeded


def test_figures_by_hand():
    found = {"win": [([], {3}), ([], {0, 6})], "block": [([], {2})],
             "quiet": [([], set()), ([], set())]}
    win_a = np.array([0, 0, 0, 0.6, 0.4, 0, 0])       # 0.6 on the win, argmax it
    win_b = np.array([0.1, 0, 0, 0.5, 0, 0, 0.4])     # 0.1 + 0.4 = 0.5, argmax 3: missed
    block = np.array([0, 0, 0.3, 0.7, 0, 0, 0])       # 0.3, argmax 3: missed
    uniform = np.full(7, 1 / 7)
    sure = np.eye(7)[3]
    figures = cp.figures([win_a, win_b, block, uniform, sure], found)
    assert figures["wins_taken"] == pytest.approx((0.6 + 0.5) / 2)
    assert figures["greedy_wins_taken"] == 0.5
    assert figures["blocks_made"] == pytest.approx(0.3) and figures["greedy_blocks_made"] == 0
    assert figures["quiet_entropy"] == pytest.approx(round(math.log(7) / 2, 4))
    assert (figures["win_positions"], figures["block_positions"],
            figures["quiet_positions"]) == (2, 1, 2)


def test_the_rule_takes_and_blocks_everything_and_uniform_play_its_share():
    found = cp.positions(20, seed=2)
    ref = cp.reference(found)
    for mark, seat in (("x", 0), ("o", 1)):
        rule, uniform = ref["rule"][mark], ref["uniform"][mark]
        assert rule["wins_taken"] == rule["blocks_made"] == 1.0
        assert rule["greedy_wins_taken"] == rule["greedy_blocks_made"] == 1.0
        assert rule["quiet_entropy"] == 0.0
        shares = [len(right) / len(after(*history).legal_actions())
                  for history, right in found[seat]["win"]]
        assert uniform["wins_taken"] == pytest.approx(np.mean(shares), abs=1e-4)
        assert "greedy_wins_taken" not in uniform  # uniform play has no argmax
        assert 1.8 < uniform["quiet_entropy"] <= math.log(7) + 1e-9


@pytest.mark.slow  # the tiny model scores 2 x 3 x 3 positions per agent (~10 s)
def test_a_tiny_agents_columns_are_scored_from_its_prompt(tmp_path):
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "examples/connect_four"), "mixed", [
        "model.path=tiny", f"output_dir={tmp_path}", "tracking.backends=[jsonl]",
        "rollout.num_groups=8"])
    pipeline = AgenticPipeline(cfg)
    report = cp.report(pipeline, per_kind=3)
    assert set(report) == {"agent_0", "agent_1"}
    for seats in report.values():
        for figures in seats.values():
            assert figures["win_positions"] == figures["block_positions"] == 3
            for key in ("wins_taken", "blocks_made"):
                assert 0 < figures[key] < 1  # an untrained tiny policy is far from sure
            assert 1.0 < figures["quiet_entropy"] <= math.log(7)
    # both untrained adapters start equal (PEFT's B = 0): the same figures
    assert report["agent_0"] == report["agent_1"]
