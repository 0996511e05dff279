"""benchmarks/connect_four_baselines.py: the board as the rule reads it, the rule's moves on
boards set up by hand, and the players' games against random."""

import sys
from pathlib import Path

import pytest

from tests.benchmarks.helpers import connect_four_after as after

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import connect_four_baselines as cb  # noqa: E402


def test_the_board_reads_bottom_row_first():
    board = cb._board(after(3, 3, 0))  # x in 3, o on top of it, x in 0
    assert len(board) == 6 and all(len(row) == 7 for row in board)
    assert "".join(board[0]) == "x..x..."
    assert "".join(board[1]) == "...o..."
    assert all(set(row) == {"."} for row in board[2:])


def test_the_rule_wins_before_it_blocks():
    # x: 1 2 3 on the bottom row (0 or 4 wins); o: column 6 three high (6 would block it).
    # x to move takes the win, and of the two the one nearer the centre.
    state = after(1, 6, 2, 6, 3, 6)
    assert state.current_player() == 0
    board = cb._board(state)
    assert cb._wins_there(board, "o", 6)
    assert cb.rule_move(board, 0, state.legal_actions(0)) == 4


def test_the_rule_blocks_a_row_and_a_column():
    # x: 0 1 2 on the bottom row, o played 6 6; o to move must block at 3
    state = after(0, 6, 1, 6, 2)
    assert state.current_player() == 1
    assert cb.rule_move(cb._board(state), 1, state.legal_actions(1)) == 3
    # x stacks column 5 three high, o elsewhere (0, 1, 6 ...): o must block column 5
    state = after(5, 0, 5, 1, 5)
    assert cb.rule_move(cb._board(state), 1, state.legal_actions(1)) == 5


def test_the_rule_blocks_a_diagonal():
    # x's diagonal (0,0) (1,1) (2,2) needs (3,3), over three pieces in column 3 (the moves
    # below; the asserts check the board they make).
    state = after(0, 1, 1, 2, 2, 3, 2, 3, 6, 3)
    board = cb._board(state)
    assert board[0][0] == "x" and board[1][1] == "x" and board[2][2] == "x"
    assert board[2][3] == "o" and board[3][3] == "."
    assert state.current_player() == 0  # x to move: 3 completes the diagonal
    assert cb.rule_move(board, 0, state.legal_actions(0)) == 3
    # had it been o's move, o would have to block there
    assert cb._wins_there(board, "x", 3) and not cb._wins_there(board, "x", 4)
    assert board[3][3] == "."  # the probe leaves the board as it was


def test_without_a_threat_the_rule_and_the_column_player_take_the_centre():
    assert cb.rule_move(cb._board(after()), 0, list(range(7))) == 3
    assert cb.centre_most([0, 1, 2, 4, 5, 6]) == 2 and cb.centre_most([5, 6]) == 5
    assert cb.centre_most([0, 6]) == 0


def test_games_against_random_add_up_and_the_rule_beats_random_far_more_than_random_does():
    rows = {player: cb.play(player, 1, 60, seed=0) for player in ("random", "column", "rule")}
    for row in rows.values():
        assert row["games"] == 60 and row["seat"] == 1 and row["opponent"] == "random"
        total = row["win_rate"] + row["draw_rate"] + row["loss_rate"]
        assert total == pytest.approx(1.0, abs=2e-4)
        assert row["win_rate_low"] <= row["win_rate"] <= row["win_rate_high"]
        assert 7 <= row["mean_moves"] <= 42
    assert rows["rule"]["win_rate"] >= 0.85 and rows["random"]["win_rate"] <= 0.7
    assert rows["rule"]["mean_moves"] < rows["random"]["mean_moves"]


def test_a_player_or_opponent_it_does_not_know_is_refused(capsys):
    with pytest.raises(SystemExit):
        cb.main(["--players", "minimax"])
    assert "--players: unknown player 'minimax'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cb.main(["--opponent", "cfr"])
    assert "--opponent: unknown opponent 'cfr'" in capsys.readouterr().err
