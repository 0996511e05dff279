"""benchmarks/tictactoe_policy.py: exact scores of a TicTacToe policy table and its tactics
(wins taken, blocks made), checked against hand-counted cases and an independent evaluator."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tictactoe_policy  # noqa: E402
import tictactoe_vs_random  # noqa: E402


def _deterministic(choose) -> dict[str, np.ndarray]:
    """A table playing ``choose(board) -> cell`` with probability 1 on every board."""
    table = {}
    for board in tictactoe_policy.decision_boards():
        row = np.zeros(9)
        row[choose(board)] = 1.0
        table[board] = row
    return table


def _tactician(board: str) -> int:
    """Win if possible, else block, else the first free cell."""
    me = tictactoe_policy.to_move(board)
    other = "O" if me == "X" else "X"
    for cells in (tictactoe_policy.completing(board, me),
                  tictactoe_policy.completing(board, other)):
        if cells:
            return min(cells)
    return board.index(".")


def test_the_boards_are_the_4520_decision_positions():
    boards = tictactoe_policy.decision_boards()
    assert len(boards) == 4520  # the classic count of non-terminal positions
    assert "." * 9 in boards and "XX.OO...." in boards
    assert "XXXOO...." not in boards  # X has won: nobody moves


def test_completing_cells_by_hand():
    #  X X .
    #  O O .
    #  . . .
    assert tictactoe_policy.completing("XX.OO....", "X") == {2}
    assert tictactoe_policy.completing("XX.OO....", "O") == {5}
    #  X . X / . . . / X . .: three lines need one cell each (1, 3 and 4 on the diagonal)
    assert tictactoe_policy.completing("X.X...X..", "X") == {1, 3, 4}


def test_a_board_becomes_the_openspiel_state_that_shows_it():
    import pyspiel

    game = pyspiel.load_game("tic_tac_toe")
    state = tictactoe_policy.board_state(game, "XOX.O.X..")
    assert str(state) == "xox\n.o.\nx.."
    assert state.current_player() == 1 and sorted(state.legal_actions()) == [3, 5, 7, 8]


def test_uniform_play_is_the_known_random_game_and_chance_tactics():
    uniform = tictactoe_policy.uniform_policy()
    x = tictactoe_policy.score(uniform, 0)
    o = tictactoe_policy.score(uniform, 1)
    assert (x["win"], x["loss"]) == pytest.approx((0.5849, 0.2880), abs=1e-4)
    assert (o["win"], o["loss"]) == pytest.approx((0.2880, 0.5849), abs=1e-4)
    for figures in (x, o):  # one or two good cells among ~3-6 free ones
        assert 0.25 < figures["wins_taken"] < 0.55
        assert 0.25 < figures["blocks_made"] < 0.55


def test_a_fixed_order_scores_what_the_game_tree_search_says():
    order = (8, 2, 5, 4, 0, 6, 3, 1, 7)
    table = _deterministic(lambda board: next(i for i in order if board[i] == "."))
    for seat, mark in enumerate("XO"):
        figures = tictactoe_policy.score(table, seat)
        expected = tictactoe_vs_random.fixed_order(order, mark)
        assert (figures["win"], figures["loss"]) == pytest.approx(expected, abs=1e-9)
        assert figures["blocks_made"] < 0.8  # blind to the marks: it misses some blocks


def test_a_tactician_takes_every_win_and_makes_every_block():
    table = _deterministic(_tactician)
    for seat in (0, 1):
        figures = tictactoe_policy.score(table, seat)
        assert figures["wins_taken"] == pytest.approx(1.0)
        assert figures["blocks_made"] == pytest.approx(1.0)


def test_greedy_play_is_the_argmax_move_scored_exactly():
    """A policy that leans 0.5 toward a fixed order's cell and spreads the rest over the other
    free cells: its greedy policy is that fixed order, whose exact score the tree search gives;
    a tie goes to the lowest cell (the first-free-cell order)."""
    order = (4, 0, 8, 2, 6, 1, 3, 5, 7)
    table = {}
    for board in tictactoe_policy.decision_boards():
        free = [i for i, c in enumerate(board) if c == "."]
        pick = next(i for i in order if board[i] == ".")
        row = np.zeros(9)
        row[free] = 0.5 / len(free)
        row[pick] += 0.5
        table[board] = row
    for seat, mark in enumerate("XO"):
        figures = tictactoe_policy.figures(table, seat)
        expected = tictactoe_vs_random.fixed_order(order, mark)
        assert (figures["greedy_win"], figures["greedy_loss"]) == pytest.approx(expected, abs=1e-4)
        assert figures["win"] < figures["greedy_win"]  # the spread mass costs wins
    tie = {board: np.array([c == "." for c in board], dtype=float)
           for board in tictactoe_policy.decision_boards()}
    first_free = tictactoe_vs_random.fixed_order(tuple(range(9)), "X")
    argmax = tictactoe_policy.figures(tie, 0)
    assert (argmax["greedy_win"], argmax["greedy_loss"]) == pytest.approx(first_free, abs=1e-4)


def test_a_first_free_cell_x_wins_at_least_the_hand_counted_share():
    """X takes the first free cell of 0, 1, 2, ...: it wins on its third move when O's first
    pick (of 8 cells) misses cells 1 and 2 and its second (of 7) misses cell 2:
    6/8 * 6/7 = 36/56; later wins add to that. Every win on offer there is cell 2, its next
    cell, so it takes each one."""
    table = _deterministic(lambda board: board.index("."))
    figures = tictactoe_policy.score(table, 0)
    assert figures["win"] >= 36 / 56
    assert figures["win"] == pytest.approx(tictactoe_vs_random.fixed_order(tuple(range(9)), "X")[0])


def _best_return(board: str, me: str) -> float:
    """The best expected return (win 1, loss -1) of ``me`` from ``board`` against random play,
    by plain recursion (independent of ``best_values``)."""
    lines = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8),
             (2, 4, 6)]
    for a, b, c in lines:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return 1.0 if board[a] == me else -1.0
    free = [i for i, c in enumerate(board) if c == "."]
    if not free:
        return 0.0
    mover = "X" if board.count("X") == board.count("O") else "O"
    returns = [_best_return(board[:i] + mover + board[i + 1:], me) for i in free]
    return max(returns) if mover == me else sum(returns) / len(returns)


@pytest.mark.slow  # a game-tree search (~5 s): the quick subset stays under 3 minutes
def test_the_best_player_and_where_a_policy_falls_short_of_it():
    """V*(root) by an independent recursion; an optimal table loses nothing; one that plays an
    edge (cell 1) where X opened in a corner (reached with probability exactly 1/9, X's random
    first move) loses 1/9 * (V*(that board) - V*(after the edge)), all of it on its first move
    and on that board; for any table the per-board gaps sum to V*(root) - its exact return."""
    best_o = tictactoe_policy.best_values(1)
    assert best_o("." * 9) == pytest.approx(_best_return("." * 9, "O"), abs=1e-12)
    assert tictactoe_policy.best_values(0)("." * 9) == pytest.approx(
        _best_return("." * 9, "X"), abs=1e-12)

    def best_cell(board: str) -> int:
        me = tictactoe_policy.to_move(board)
        value = tictactoe_policy.best_values("XO".index(me))
        free = [i for i, c in enumerate(board) if c == "."]
        return max(free, key=lambda i: value(board[:i] + me + board[i + 1:]))

    optimal = _deterministic(best_cell)
    for seat in (0, 1):
        assert tictactoe_policy.gap_by_board(optimal, seat)["total"] == pytest.approx(0, abs=1e-9)
    slip = dict(optimal)
    slip["X........"] = np.eye(9)[1]
    gap = tictactoe_policy.gap_by_board(slip, 1)
    expected = (_best_return("X........", "O") - _best_return("XO.......", "O")) / 9
    assert expected > 0.01
    assert gap["total"] == pytest.approx(expected, abs=1e-4)
    assert gap["by_move"] == pytest.approx([expected, 0, 0, 0], abs=1e-4)
    assert gap["other"] == pytest.approx(expected, abs=1e-4)  # no win or threat on the board
    board, reach, cost, played, best = gap["top"][0]
    assert (board, reach, played, best) == ("X........", pytest.approx(1 / 9, abs=1e-4), 1, [4])
    for table in (tictactoe_policy.uniform_policy(), _deterministic(_tactician)):
        for seat in (0, 1):
            gap = tictactoe_policy.gap_by_board(table, seat)
            figures = tictactoe_policy.score(table, seat)
            assert gap["best"] - gap["total"] == pytest.approx(
                figures["win"] - figures["loss"], abs=2e-4)
            assert sum(gap["by_move"]) == pytest.approx(gap["total"], abs=1e-3)
            assert gap["missed_wins"] + gap["missed_blocks"] + gap["other"] == pytest.approx(
                gap["total"], abs=1e-3)


@pytest.mark.parametrize("renderer", ["", "tic_tac_toe_lines"])
def test_an_llm_table_puts_its_mass_on_the_free_cells_of_each_board(tmp_path, renderer):
    """The LLM's table (the tiny model, untrained adapters): each board's probabilities sit on
    exactly its free cells and sum to 1; a board with one free cell plays it. Boards reach the
    model as OpenSpiel states built from their marks, prompts from the run's renderer."""
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "examples/tictactoe"), "mixed", [
        "model.path=tiny", "model.device=cpu", "tracking.backends=[jsonl]", "save_steps=0",
        f"output_dir={tmp_path}", "eval.eval_steps=0", "team.lora.rank=4",
        f"env.renderer={renderer}"])
    pipeline = AgenticPipeline(cfg)
    boards = [".........", "X...O....", "XOX.O.X..", "XOXXOOOX."]
    tables = tictactoe_policy.agent_policies(pipeline, boards)
    assert sorted(tables) == ["agent_0", "agent_1"]
    for table in tables.values():
        for board in boards:
            probs = table[board]
            free = np.array([c == "." for c in board])
            assert probs.sum() == pytest.approx(1.0, abs=1e-6)
            assert (probs[~free] == 0).all() and (probs[free] > 0).all()
        assert table["XOXXOOOX."][8] == pytest.approx(1.0)
