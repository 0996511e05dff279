"""The best a TicTacToe player can do against the uniformly random player, per seat.

    python benchmarks/tictactoe_vs_random.py

Exact, over the whole game tree (no sampling): for each seat and each weight w on losses, the
policy that maximises P(win) - w * P(loss) against an opponent picking uniformly among its legal
moves, and its win and loss probabilities. The ceiling for the TicTacToe goal (>= 85% wins and
<= 5% losses against random in both seats; benchmarks/README.md). Prints JSON.
"""

from __future__ import annotations

import json
from functools import cache

LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def _won(board: str, mark: str) -> bool:
    return any(all(board[i] == mark for i in line) for line in LINES)


@cache
def best(board: str, to_move: str, me: str, loss_weight: float) -> tuple[float, float]:
    """(P(win), P(loss)) of ``me`` playing best against random from ``board``."""
    other = "O" if me == "X" else "X"
    if _won(board, me):
        return 1.0, 0.0
    if _won(board, other):
        return 0.0, 1.0
    moves = [i for i, cell in enumerate(board) if cell == "."]
    if not moves:
        return 0.0, 0.0
    following = "O" if to_move == "X" else "X"
    outcomes = [best(board[:i] + to_move + board[i + 1:], following, me, loss_weight)
                for i in moves]
    if to_move == me:
        return max(outcomes, key=lambda o: o[0] - loss_weight * o[1])
    return (sum(o[0] for o in outcomes) / len(outcomes),
            sum(o[1] for o in outcomes) / len(outcomes))


def main() -> None:
    rows = []
    for seat, me in ((0, "X"), (1, "O")):
        for weight in (0.0, 1.0, 10.0):
            win, loss = best("." * 9, "X", me, weight)
            rows.append({"seat": seat, "mark": me, "loss_weight": weight,
                         "win": round(win, 4), "loss": round(loss, 4)})
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
