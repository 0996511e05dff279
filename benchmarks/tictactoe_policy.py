"""What a TicTacToe policy has learnt, exactly: its score against the random player in each
seat, and whether it reads the board (takes a winning move, blocks a threat).

    python benchmarks/tictactoe_policy.py --config_path examples/tictactoe --config_name mixed \
        --checkpoint RUN/checkpoints/step_00000150 [key=value overrides]

Each agent's policy is made a table over all 4,520 boards where someone is to move, as the
exploitability code does (`roll/pipeline/exploitability.py`, `move_probabilities`: the probability
constrained decoding gives each legal move, at `eval.temperature`, from the prompt the rollout
shows). Then, exactly over the game tree, for each seat against the uniformly random player:
- `win`, `loss`: the probabilities of winning and losing;
- `wins_taken`: where the agent can win at once, the probability it does (mean over those
  decisions, weighted by how often the game reaches them);
- `blocks_made`: where it cannot win at once but the opponent threatens to (two in a line, the
  third cell empty), the probability it takes a threatened cell (same weighting);
- `greedy_win`, `greedy_loss`: the same two for the policy's argmax move on every board (what
  sampling noise costs: a policy that holds the right move beneath it gains here);
- `greedy_gap`: where the greedy policy's return (win 1, loss -1) falls short of the best
  player's against random (O 0.925: 0.932 wins, 0.007 losses; X 0.995), board by board
  (`gap_by_board`: by its move number, by missed wins / missed blocks / other boards, and the
  boards that cost most), so a run that stalls says which decisions hold it back.
A player that ignores the marks (a fixed order of cells, `tictactoe_vs_random.fixed_order`)
takes wins and blocks only where its order happens to; the best such player wins about 61% as O
and loses about 35%, far from the goal (>= 85% wins, <= 5% losses). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tictactoe_vs_random import LINES, won  # noqa: E402  (one copy of the rules)


def winner(board: str) -> str | None:
    """'X' or 'O' if that mark has three in a line (board: 9 cells of 'X', 'O', '.')."""
    return next((mark for mark in "XO" if won(board, mark)), None)


def to_move(board: str) -> str:
    return "X" if board.count("X") == board.count("O") else "O"


def completing(board: str, mark: str) -> set[int]:
    """Empty cells that would give ``mark`` three in a line."""
    return {i for line in LINES if sum(board[j] == mark for j in line) == 2
            for i in line if board[i] == "."}


def decision_boards() -> list[str]:
    """Every board reachable in play where the game is not over (4,520)."""
    seen, stack = set(), ["." * 9]
    while stack:
        board = stack.pop()
        if board in seen or winner(board) or "." not in board:
            continue
        seen.add(board)
        mover = to_move(board)
        stack += [board[:i] + mover + board[i + 1:] for i, c in enumerate(board) if c == "."]
    return sorted(seen)


def score(policy: dict[str, np.ndarray], seat: int) -> dict[str, float]:
    """Exact figures (module docstring) of ``policy`` (board -> probabilities of cells 0-8)
    playing seat ``seat`` (0: X, 1: O) against the uniformly random player."""
    me = "XO"[seat]
    other = "OX"[seat]

    @cache
    def totals(board: str) -> np.ndarray:
        """(win, loss, win reach, wins taken, block reach, blocks made) of the play from
        ``board`` on, per unit of probability of reaching it: every figure is linear in it."""
        ended = winner(board)
        if ended or "." not in board:
            return np.array([ended == me, ended == other, 0, 0, 0, 0], dtype=float)
        free = [i for i, c in enumerate(board) if c == "."]
        if to_move(board) != me:
            return sum(totals(board[:i] + other + board[i + 1:]) for i in free) / len(free)
        probs = policy[board]
        here = np.zeros(6)
        wins, threats = completing(board, me), completing(board, other)
        if wins:
            here[2:4] = 1.0, sum(probs[i] for i in wins)
        elif threats:
            here[4:6] = 1.0, sum(probs[i] for i in threats)
        return here + sum(probs[i] * totals(board[:i] + me + board[i + 1:])
                          for i in free if probs[i] > 0)

    win, loss, win_reach, wins_taken, block_reach, blocks_made = totals("." * 9)
    return {"win": float(win), "loss": float(loss),
            "wins_taken": float(wins_taken / max(win_reach, 1e-12)),
            "blocks_made": float(blocks_made / max(block_reach, 1e-12))}


def best_values(seat: int):
    """V*(board): the expected return (win 1, draw 0, loss -1) of the best player in seat
    ``seat`` (0: X, 1: O) from ``board`` on, against the uniformly random player."""
    me, other = "XO"[seat], "OX"[seat]

    @cache
    def value(board: str) -> float:
        ended = winner(board)
        if ended or "." not in board:
            return float(ended == me) - float(ended == other)
        free = [i for i, c in enumerate(board) if c == "."]
        mover = to_move(board)
        children = [value(board[:i] + mover + board[i + 1:]) for i in free]
        return max(children) if mover == me else sum(children) / len(children)

    return value


def gap_by_board(policy: dict[str, np.ndarray], seat: int, top: int = 5) -> dict:
    """Where ``policy`` (seat ``seat``) loses expected return against the best player, board by
    board: the performance-difference identity V*(root) - V^pi(root) = sum over the policy's
    decision boards b of reach_pi(b) * (V*(b) - sum_m pi(m|b) V*(b + m)), reach_pi(b) the
    probability that play (the policy against random) reaches b. Returns the total (``total``,
    in return units: win 1, loss -1), the best player's return (``best``), the total split by the
    policy's move number (``by_move``: its 1st, 2nd, ... move) and by kind of board
    (``missed_wins``: it could win at once; ``missed_blocks``: it could not, the opponent
    threatens; ``other``), and the ``top`` boards that cost most: [board, reach, gap, the
    policy's likeliest move, the best moves]."""
    me = "XO"[seat]
    value = best_values(seat)
    reach: dict[str, float] = {}
    frontier = {"." * 9: 1.0}
    while frontier:  # boards in order of the number of marks: each reach is complete when read
        step: dict[str, float] = {}
        for board, p in frontier.items():
            if winner(board) or "." not in board:
                continue
            free = [i for i, c in enumerate(board) if c == "."]
            mover = to_move(board)
            if mover == me:
                reach[board] = p
                moves = [(i, p * policy[board][i]) for i in free if policy[board][i] > 0]
            else:
                moves = [(i, p / len(free)) for i in free]
            for i, q in moves:
                child = board[:i] + mover + board[i + 1:]
                step[child] = step.get(child, 0.0) + q
        frontier = step
    rows = []
    by_move = [0.0] * 5  # the policy's 1st ... 5th move (X moves 5 times at most, O 4)
    kinds = {"missed_wins": 0.0, "missed_blocks": 0.0, "other": 0.0}
    for board, p in reach.items():
        free = [i for i, c in enumerate(board) if c == "."]
        after = {i: value(board[:i] + me + board[i + 1:]) for i in free}
        gap = p * (value(board) - sum(policy[board][i] * after[i] for i in free))
        by_move[board.count(me)] += gap
        kind = ("missed_wins" if completing(board, me) else
                "missed_blocks" if completing(board, "OX"[seat]) else "other")
        kinds[kind] += gap
        best = [i for i in free if after[i] >= value(board) - 1e-12]
        rows.append([board, float(p), float(gap), int(np.argmax(policy[board])), best])
    rows.sort(key=lambda row: -row[2])
    return {"total": round(sum(row[2] for row in rows), 4),
            "best": round(value("." * 9), 4),
            "by_move": [round(float(g), 4) for g in by_move[: 5 - seat]],
            **{kind: round(float(g), 4) for kind, g in kinds.items()},
            "top": [[b, round(p, 4), round(g, 4), m, best] for b, p, g, m, best in rows[:top]]}


def uniform_policy() -> dict[str, np.ndarray]:
    """Every legal move equally likely (the chance level of each figure)."""
    policy = {}
    for board in decision_boards():
        free = np.array([c == "." for c in board], dtype=float)
        policy[board] = free / free.sum()
    return policy


def board_state(game, board: str):
    """An OpenSpiel TicTacToe state showing ``board`` (X's and O's cells placed alternately,
    X first: one of the move orders that reach it)."""
    state = game.new_initial_state()
    xs = [i for i, c in enumerate(board) if c == "X"]
    os_ = [i for i, c in enumerate(board) if c == "O"]
    for k in range(len(xs) + len(os_)):
        state.apply_action((xs if k % 2 == 0 else os_)[k // 2])
    return state


def agent_policies(pipeline, boards: list[str] | None = None,
                   agents: list[str] | None = None) -> dict[str, dict[str, np.ndarray]]:
    """Each agent's (``agents``; None: every agent's) table (board -> (9,) probabilities of
    the cells) over ``boards`` (None: every decision board), scored where the pipeline's
    trainer scores, with its renderer."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.pipeline.exploitability import move_probabilities

    cfg = pipeline.cfg
    env = OpenSpielEnv("tic_tac_toe", dict(cfg.env.params))
    boards = decision_boards() if boards is None else boards
    states = [board_state(env.game, board) for board in boards]
    tables = {}
    for agent in pipeline.agent_names if agents is None else agents:
        probabilities = move_probabilities(
            env, states, pipeline.trainer, pipeline.tokenizer, lambda seat, a=agent: a,
            pipeline.render, cfg.eval.temperature,
            enable_thinking=cfg.model.enable_thinking)
        table = {}
        for board, (action_ids, probs) in zip(boards, probabilities, strict=True):
            row = np.zeros(9)
            row[action_ids] = probs
            table[board] = row
        tables[agent] = table
    return tables


def greedy(policy: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The argmax move of ``policy`` on every board, with probability 1 (ties: the lowest
    cell)."""
    return {board: np.eye(9)[int(np.argmax(probs))] for board, probs in policy.items()}


def figures(policy: dict[str, np.ndarray], seat: int) -> dict[str, float]:
    """``score`` of ``policy`` in ``seat`` plus its greedy policy's win and loss, rounded, and
    where the greedy policy's return falls short of the best player's (``gap_by_board``)."""
    argmax_policy = greedy(policy)
    sampled, argmax = score(policy, seat), score(argmax_policy, seat)
    both = {**sampled, "greedy_win": argmax["win"], "greedy_loss": argmax["loss"]}
    return {**{key: round(value, 4) for key, value in both.items()},
            "greedy_gap": gap_by_board(argmax_policy, seat)}


def report(pipeline) -> dict[str, dict[str, dict[str, float]]]:
    """{agent: {"X": figures, "O": figures}} for the pipeline's current adapters (timestamped
    lines around it: each agent's 4,520 boards take a while)."""
    from roll.utils.stages import stage

    with stage("tictactoe_policy: every agent's moves on the 4,520 decision boards, scored"):
        return {agent: {mark: figures(table, seat) for seat, mark in enumerate("XO")}
                for agent, table in agent_policies(pipeline).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config_path", default="examples/tictactoe")
    parser.add_argument("--config_name", default="mixed")
    parser.add_argument("--checkpoint", default=None, help="a run's checkpoint folder "
                        "(none: the untrained adapters)")
    parser.add_argument("overrides", nargs="*", help="key=value, as the launcher takes them")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    cfg = load_config(str(Path(args.config_path).resolve()), args.config_name, args.overrides)
    if cfg.env.game != "tic_tac_toe":
        raise SystemExit(f"env.game={cfg.env.game!r}: this benchmark reads TicTacToe policies")
    pipeline = AgenticPipeline(cfg)
    if args.checkpoint:
        pipeline.load(Path(args.checkpoint))
    chance = {mark: figures(uniform_policy(), seat) for seat, mark in enumerate("XO")}
    print(json.dumps({"checkpoint": args.checkpoint, "uniform": chance,
                      "agents": report(pipeline)}, indent=1))


if __name__ == "__main__":
    main()
