"""The best a TicTacToe player can do against the uniformly random player, per seat.

    python benchmarks/tictactoe_vs_random.py [--orders 20000]

Exact, over the whole game tree (no sampling): for each seat and each weight w on losses, the
policy that maximises P(win) - w * P(loss) against an opponent picking uniformly among its legal
moves, and its win and loss probabilities. The ceiling for the TicTacToe goal (>= 85% wins and
<= 5% losses against random in both seats; benchmarks/README.md).

Also the ceiling of a player that does not read the board: one that always takes the first free
cell of a fixed order of the nine cells (what a policy learns if its move preferences ignore
the marks). Each order is scored exactly; the best of ``--orders`` orders drawn at random (seed
0; 0: all 362,880) is reported per seat. Prints JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
from collections.abc import Callable
from functools import cache

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def won(board: str, mark: str) -> bool:
    """``mark`` has three in a line (board: 9 cells of 'X', 'O', '.', row by row)."""
    return any(all(board[i] == mark for i in line) for line in LINES)


def _versus_random(me: str, my_move: Callable) -> Callable[[str, str], tuple[float, float]]:
    """(board, to_move) -> (P(win), P(loss)) of ``me`` against the uniformly random player,
    cached; at its own turn ``me`` gets ``my_move(board, moves, after)``, where ``after(cell)``
    is the outcome once ``me`` takes that cell."""
    other = "O" if me == "X" else "X"

    @cache
    def value(board: str, to_move: str) -> tuple[float, float]:
        if won(board, me):
            return 1.0, 0.0
        if won(board, other):
            return 0.0, 1.0
        moves = [i for i, cell in enumerate(board) if cell == "."]
        if not moves:
            return 0.0, 0.0
        following = "O" if to_move == "X" else "X"

        def after(cell: int) -> tuple[float, float]:
            return value(board[:cell] + to_move + board[cell + 1:], following)

        if to_move == me:
            return my_move(board, moves, after)
        outcomes = [after(i) for i in moves]
        return (sum(o[0] for o in outcomes) / len(outcomes),
                sum(o[1] for o in outcomes) / len(outcomes))

    return value


@cache
def _best_response(me: str, loss_weight: float) -> Callable[[str, str], tuple[float, float]]:
    return _versus_random(me, lambda board, moves, after: max(
        (after(i) for i in moves), key=lambda o: o[0] - loss_weight * o[1]))


def best(board: str, to_move: str, me: str, loss_weight: float) -> tuple[float, float]:
    """(P(win), P(loss)) of ``me`` playing best against random from ``board``."""
    return _best_response(me, loss_weight)(board, to_move)


def fixed_order(order: tuple[int, ...], me: str) -> tuple[float, float]:
    """(P(win), P(loss)) of ``me`` always taking the first free cell of ``order`` (cells 0-8,
    row by row) against the random player."""
    value = _versus_random(me, lambda board, moves, after: after(
        next(i for i in order if board[i] == ".")))
    return value("." * 9, "X")


def best_fixed_order(me: str, num_orders: int, seed: int = 0) -> dict:
    """The fixed cell order with the most wins (ties: fewer losses) among ``num_orders`` drawn
    without replacement (0: all of them)."""
    orders = list(itertools.permutations(range(9)))
    if num_orders:
        orders = random.Random(seed).sample(orders, num_orders)
    scored = [(fixed_order(order, me), order) for order in orders]
    (win, loss), order = max(scored, key=lambda s: (s[0][0], -s[0][1]))
    return {"mark": me, "orders_scored": len(orders), "order": list(order),
            "win": round(win, 4), "loss": round(loss, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--orders", type=int, default=20000,
                        help="fixed cell orders scored per seat (0: all 362,880)")
    args = parser.parse_args()
    rows = []
    for seat, me in ((0, "X"), (1, "O")):
        for weight in (0.0, 1.0, 10.0):
            win, loss = best("." * 9, "X", me, weight)
            rows.append({"seat": seat, "mark": me, "loss_weight": weight,
                         "win": round(win, 4), "loss": round(loss, 4)})
    blind = [best_fixed_order(me, args.orders) for me in ("X", "O")]
    print(json.dumps({"best_response": rows, "best_fixed_order": blind}, indent=1))


if __name__ == "__main__":
    main()
