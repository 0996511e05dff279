"""Reference win rates for a Connect Four learning curve: what simple players get against random.

    python benchmarks/connect_four_baselines.py                 # 2,000 games a player and seat
    python benchmarks/connect_four_baselines.py --games 500 --players rule mcts:100

An agent's "wins against random" says little alone: in Connect Four a player that drops every
piece into one column already wins most games against a uniformly random one (random replies
seldom block a vertical line in time). Each player here plays ``--games`` games in each seat
against roll's own ``RandomOpponent`` (``roll/agentic/env/opponents.py``, what
``eval.opponent=random`` and a ``random`` seat play), on OpenSpiel's ``connect_four``:

- ``random``: a uniformly random legal column (random against random);
- ``column``: always the centre column (3), else the legal column nearest to it;
- ``rule``: win at once if a column does it; else block a column where the opponent would win
  next; else the legal column nearest the centre (what a prompt that shows the board allows);
- ``mcts:N``: roll's ``MCTSOpponent`` (OpenSpiel's MCTSBot, N simulations, random rollouts):
  what ``mcts:N`` seats play.

Prints one JSON object (and writes ``$OUT/connect_four_baselines.json`` when OUT is set): per
player and seat the win, draw and loss rates, the win rate's 95% interval (normal
approximation) and the mean number of moves of a game.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # roll, from a checkout
import report  # noqa: E402  (benchmarks/report.py, beside this file)

from roll.agentic.env.renderers import longest_line_through  # noqa: E402  (one copy of the rule)

CENTRE_FIRST = (3, 2, 4, 1, 5, 0, 6)
"""Columns in the order the ``column`` and ``rule`` players prefer them."""


def centre_most(legal: list[int]) -> int:
    """The legal column nearest the centre (ties to the left)."""
    return next(c for c in CENTRE_FIRST if c in legal)


def rule_move(board: list[list[str]], seat: int, legal: list[int]) -> int:
    """Win now, else block the opponent's immediate win, else the centre-most column."""
    for mark in ("xo"[seat], "xo"[1 - seat]):  # our win first, then the opponent's to block
        for column in CENTRE_FIRST:
            if column in legal and _wins_there(board, mark, column):
                return column
    return centre_most(legal)


def _wins_there(board: list[list[str]], mark: str, column: int) -> bool:
    """Whether a piece of ``mark`` dropped into ``column`` now makes four in a row."""
    row = next((r for r in range(len(board)) if board[r][column] == "."), None)
    # the landing cell counts as ``mark`` there: the board is only read
    return row is not None and longest_line_through(board, row, column, mark) >= 4


def _board(state) -> list[list[str]]:
    """The board as rows from the bottom: OpenSpiel's string lists the top row first."""
    return [list(line) for line in reversed(str(state).strip().splitlines())]


def play(player: str, seat: int, games: int, seed: int, against: str = "random") -> dict:
    """``games`` games of ``player`` in ``seat`` against ``against`` (roll's RandomOpponent or
    MCTSOpponent)."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.agentic.env.opponents import MCTSOpponent, RandomOpponent

    env = OpenSpielEnv("connect_four")
    opponent = (RandomOpponent(seed) if against == "random"
                else MCTSOpponent(int(against.split(":")[1]), seed=seed + 3))
    own = RandomOpponent(seed + 1) if player == "random" else None
    mcts = (MCTSOpponent(int(player.split(":")[1]), seed=seed + 2)
            if player.startswith("mcts:") else None)
    wins = draws = moves = 0
    for game in range(games):
        env.reset(seed + game)
        while not env.done:
            current = env.current_seat()
            if current != seat:
                env.step(opponent.choose(env, current))
            elif own is not None:
                env.step(own.choose(env, current))
            elif mcts is not None:
                env.step(mcts.choose(env, current))
            else:
                legal = env.legal_action_ids(current)
                column = (centre_most(legal) if player == "column"
                          else rule_move(_board(env.state), current, legal))
                env.step(env.action_string(column))
            moves += 1
        returns = env.returns()
        wins += returns[seat] > 0
        draws += returns[seat] == 0
    rate = wins / games
    half = 1.96 * math.sqrt(max(rate * (1 - rate), 1e-12) / games)
    return {"player": player, "opponent": against, "seat": seat, "games": games,
            "win_rate": round(rate, 4),
            "win_rate_low": round(max(rate - half, 0.0), 4),
            "win_rate_high": round(min(rate + half, 1.0), 4),
            "draw_rate": round(draws / games, 4),
            "loss_rate": round((games - wins - draws) / games, 4),
            "mean_moves": round(moves / games, 2)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=2000, help="games per player and seat")
    parser.add_argument("--players", nargs="+", default=["random", "column", "rule", "mcts:100"])
    parser.add_argument("--opponent", default="random", help="random or mcts:N")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for player in args.players:
        if player not in ("random", "column", "rule") and not player.startswith("mcts:"):
            parser.error(f"--players: unknown player {player!r} (random, column, rule, mcts:N)")
    if args.opponent != "random" and not args.opponent.startswith("mcts:"):
        parser.error(f"--opponent: unknown opponent {args.opponent!r} (random, mcts:N)")
    rows = []
    for player in args.players:
        for seat in (0, 1):
            start = time.perf_counter()
            row = play(player, seat, args.games, args.seed, args.opponent)
            row["seconds"] = round(time.perf_counter() - start, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    summary = {"game": "connect_four", "opponent": args.opponent, "results": rows}
    report.emit(summary, "connect_four_baselines.json")
    return summary


if __name__ == "__main__":
    main()
