"""benchmarks/connect_four_signal.py: a position whose columns' returns are forced, the summary
figures of made-up returns computed by hand, and the opponents' rules."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.helpers import connect_four_after as after

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import connect_four_signal as cs  # noqa: E402


def test_forced_returns_against_the_winner():
    # x: three in column 0; o: three in column 6; x to move. Column 0 wins at once (+1); any of
    # 1-5 leaves o's column 6 open and the winner takes it (-1); column 6 blocks, and the game
    # goes on.
    state = after(0, 6, 0, 6, 0, 6)
    returns = cs.column_returns(state, "winner", 20, np.random.default_rng(0))
    assert sorted(returns) == list(range(7))
    assert returns[0] == [1.0] * 20
    for column in range(1, 6):
        assert returns[column] == [-1.0] * 20
    # against a random opponent the same columns lose only when it happens to find column 6
    loose = cs.column_returns(state, "random", 40, np.random.default_rng(0))
    assert loose[0] == [1.0] * 40
    assert all(np.mean(loose[c]) > -1.0 for c in range(1, 6))


def test_summary_figures_by_hand():
    # q = 1, -1, 0 (columns 0, 1, 2): V = 0; the right column 0: Q(right) = 1;
    # the six returns 1 1 -1 -1 1 -1 have mean 0 and sd 1; games to see (2 * 1 / 1)^2 = 4
    values = cs.position_values({0: [1, 1], 1: [-1, -1], 2: [1, -1]}, {0})
    assert values == pytest.approx({"q_right": 1.0, "v": 0.0, "sd": 1.0})
    # two right columns: the better one counts
    assert cs.position_values({0: [1, 1], 1: [-1, -1], 2: [1, -1]}, {1, 2})["q_right"] == 0.0
    assert cs.games_to_see(0.5, 0.75) == 9.0  # (2 * 0.75 / 0.5)^2
    assert cs.games_to_see(0.0, 0.75) is None


def test_opponents():
    rng = np.random.default_rng(0)
    # o to move can win in column 6 (three there): the winner always does
    state = after(0, 6, 1, 6, 3, 6, 5)
    assert {cs.opponent_move(state, 1, "winner", rng) for _ in range(20)} == {6}
    assert len({cs.opponent_move(state, 1, "random", rng) for _ in range(60)}) > 1
    with pytest.raises(ValueError, match="opponent"):
        cs.opponent_move(state, 1, "rule", rng)


def test_main_writes_its_json(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = cs.main(["--positions", "3", "--playouts", "4"])
    assert (tmp_path / "connect_four_signal.json").exists()
    for opponent in cs.OPPONENTS:
        for kind in ("win", "block"):
            for seat in "xo":
                figures = result["opponents"][opponent][kind][seat]
                assert figures["positions"] == 3
                assert -1.0 <= figures["v"] <= 1.0 and figures["sd"] >= 0.0
                if kind == "win":  # a win now is worth +1: nothing does better
                    assert figures["q_right"] == 1.0 and figures["advantage"] >= 0.0
