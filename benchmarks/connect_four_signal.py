"""How much a right move is worth in Connect Four to a near-uniform learner, by opponent.

    python benchmarks/connect_four_signal.py --positions 40 --playouts 60

RL on Connect Four gets the final result only (+1 / 0 / -1 for the mover). What the policy
gradient can learn about a move is its advantage: the mover's expected return after it, less
the expected return of the policy's own choice. This measures that for the positions
``connect_four_policy.py`` probes (``win``: a column wins now; ``block``: the opponent would win
next in some column), for a learner that still plays uniformly (the recipes start there:
legal-move entropy 1.85-1.93 of 1.95 nats) and an opponent that is:

- ``random``: uniform over legal columns (the ``random`` seats, and the other agent early on);
- ``winner``: takes a winning column when it has one, else uniform (what any opponent that
  reads the board does first; MCTS with a handful of simulations and ``solve`` does it).

For each position and legal column, ``--playouts`` games continue from it (the mover uniform,
the opponent as above); per position, the right move's mean return ``Q(right)`` (the best of
the right columns), uniform play's ``V`` (the mean over legal columns of ``Q``) and the
returns' standard deviation under uniform play (``sd``). Per opponent, kind and seat:

- ``advantage``: the mean of ``Q(right) - V``: what a perfect critic credits the right move;
- ``sd``: the mean per-position ``sd``: the noise one game's return carries;
- ``games_to_see``: ``(2 sd / advantage)^2``: how many times the right move must be played from
  such a position before its mean return stands two standard errors above ``V``, with no
  critic (a return-only estimator's floor; a critic can only lower the noise it explains).

Prints one JSON object (and writes ``$OUT/connect_four_signal.json`` when OUT is set).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # roll, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (benchmarks/report.py, beside this file)
from connect_four_baselines import _board, _wins_there  # noqa: E402  (one copy of the rules)
from connect_four_policy import positions  # noqa: E402

from roll.utils.stages import stage  # noqa: E402

OPPONENTS = ("random", "winner")


def opponent_move(state, seat: int, opponent: str, rng: np.random.Generator) -> int:
    """``opponent``'s column for ``seat`` (the module docstring's players)."""
    legal = state.legal_actions(seat)
    if opponent == "winner":
        board = _board(state)
        wins = [c for c in legal if _wins_there(board, "xo"[seat], c)]
        if wins:
            return int(rng.choice(wins))
    elif opponent != "random":
        raise ValueError(f"opponent: expected one of {OPPONENTS}, got {opponent!r}")
    return int(rng.choice(legal))


def playout(state, mover: int, opponent: str, rng: np.random.Generator) -> float:
    """The mover's return after the game goes on from ``state`` (the mover uniform)."""
    state = state.clone()
    while not state.is_terminal():
        seat = state.current_player()
        column = (int(rng.choice(state.legal_actions(seat))) if seat == mover
                  else opponent_move(state, seat, opponent, rng))
        state.apply_action(column)
    return float(state.returns()[mover])


def column_returns(state, opponent: str, playouts: int,
                   rng: np.random.Generator) -> dict[int, list[float]]:
    """The mover's returns of ``playouts`` games after each legal column of ``state``."""
    mover = state.current_player()
    returns = {}
    for column in state.legal_actions(mover):
        child = state.clone()
        child.apply_action(column)
        returns[column] = [playout(child, mover, opponent, rng) for _ in range(playouts)]
    return returns


def position_values(returns: dict[int, list[float]], right: set[int]) -> dict[str, float]:
    """``Q(right)``, ``V`` and ``sd`` (the module docstring) of one position's
    ``column_returns``."""
    q = {c: float(np.mean(r)) for c, r in returns.items()}
    pooled = np.concatenate([np.asarray(r, dtype=float) for r in returns.values()])
    return {"q_right": max(q[c] for c in right), "v": float(np.mean(list(q.values()))),
            "sd": float(pooled.std())}


def games_to_see(advantage: float, sd: float) -> float | None:
    """``(2 sd / advantage)^2``; None where the right move is worth nothing more."""
    return round((2 * sd / advantage) ** 2, 1) if advantage > 0 else None


def signal(found: dict[int, dict[str, list]], opponent: str, playouts: int,
           seed: int) -> dict[str, dict[str, dict[str, float]]]:
    """``{kind: {"x"|"o": figures}}`` over ``found``'s win and block positions."""
    import pyspiel

    game = pyspiel.load_game("connect_four")
    rng = np.random.default_rng(seed)
    out = {}
    for kind in ("win", "block"):
        out[kind] = {}
        for seat in (0, 1):
            rows = []
            for history, right in found[seat][kind]:
                state = game.new_initial_state()
                for action in history:
                    state.apply_action(action)
                returns = column_returns(state, opponent, playouts, rng)
                rows.append(position_values(returns, right))
            advantage = float(np.mean([r["q_right"] - r["v"] for r in rows]))
            sd = float(np.mean([r["sd"] for r in rows]))
            out[kind]["xo"[seat]] = {
                "positions": len(rows),
                "q_right": round(float(np.mean([r["q_right"] for r in rows])), 4),
                "v": round(float(np.mean([r["v"] for r in rows])), 4),
                "advantage": round(advantage, 4), "sd": round(sd, 4),
                "games_to_see": games_to_see(advantage, sd)}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=40,
                        help="positions of each kind and seat (connect_four_policy.positions)")
    parser.add_argument("--playouts", type=int, default=60, help="games per position and column")
    parser.add_argument("--opponents", nargs="+", default=list(OPPONENTS), choices=OPPONENTS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    found = positions(args.positions, args.seed)
    result = {"positions": args.positions, "playouts": args.playouts, "seed": args.seed,
              "opponents": {}}
    for opponent in args.opponents:
        with stage(f"{opponent}: {args.playouts} playouts a column"):
            result["opponents"][opponent] = signal(found, opponent, args.playouts, args.seed + 1)
    result["seconds"] = round(time.perf_counter() - start, 1)
    report.emit(result, "connect_four_signal.json")
    return result


if __name__ == "__main__":
    main()
