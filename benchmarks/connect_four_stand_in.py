"""The Connect Four recipe's learning problem with the prompt's lines read perfectly: how many
games does RL need to take wins and make blocks?

    python benchmarks/connect_four_stand_in.py                                  # the default
    python benchmarks/connect_four_stand_in.py --opponent winner --steps 200 --seeds 3

The lines prompt (``env.renderer=connect_four_lines``) puts after each legal column the longest
line an x and an o would make through the cell it fills. Imitation shows an adapter can read
them (``connect_four_imitation.py``); RL on the tiny model did not move in 60 steps of 128
games. This asks what RL needs when reading is free: each agent's policy is a softmax over the
legal columns of ``w . f(column)``, where ``f`` is one-hot in the mover's own line there (1-4),
one-hot in the opponent's (1-4) and one-hot in the column (the centre preference): 15 weights,
all the prompt's lines say. The rule (win, else block, else centre) is one such policy.

What it replays of ``examples/connect_four/mixed.yaml``: two agents, each in both seats against
the other and against an opponent seat (the recipe's eight seatings, in turn, ``--games`` games
a step), the mover's return (+1 / 0 / -1), times ``--gamma`` per own move left to the end (the
recipe's ``advantage.gamma``: 1), less a baseline read before it is updated, to each of the
seat's moves: a running mean per (agent, seat) (``advantage.estimator=rae``) or, as the
recipe's critic, a linear value of the position (``--estimator critic``: ``Baseline``); the
policy gradient over moves plus ``--entropy`` times the gradient of the legal-move entropy
(``trainer.action_entropy_coef``), one Adam step a step at ``--lr`` (or a plain gradient step:
``--optimizer sgd``). The opponent seat:
``random`` (the recipe's) or ``winner`` (takes a winning column when it has one, else random;
what MCTS with a few simulations and ``solve`` does first). Every ``--eval_every`` steps each
agent is probed on ``connect_four_policy``'s positions (seed 1, ``--positions`` of each kind and
seat): wins taken and blocks made, sampled and greedy, the measure the LLM runs report.

Prints one JSON line per evaluation and a summary (``$OUT/connect_four_stand_in.json`` and a
plot, ``connect_four_stand_in.png``, when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # roll, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402  (benchmarks/report.py, beside this file)
from connect_four_baselines import _board  # noqa: E402  (one copy of the rules)
from connect_four_policy import KINDS, figures, positions, states_of  # noqa: E402
from connect_four_signal import opponent_move  # noqa: E402

from roll.agentic.env.renderers import longest_line_through  # noqa: E402

FEATURES = 15
SEATINGS = (("agent_0", "agent_1"), ("agent_1", "agent_0"), ("agent_0", "opponent"),
            ("opponent", "agent_0"), ("agent_1", "opponent"), ("opponent", "agent_1"),
            ("opponent", "agent_0"), ("opponent", "agent_1"))
"""The recipe's seatings (``env.seat_to_agent``), ``opponent`` for its ``random`` seats."""


def column_features(board: list[list[str]], seat: int, legal: list[int]) -> np.ndarray:
    """``(len(legal), 15)``: per legal column, one-hot of the mover's longest line through the
    cell it fills (1-4), of the opponent's there (1-4), and of the column (0-6)."""
    out = np.zeros((len(legal), FEATURES))
    for i, column in enumerate(legal):
        row = next(r for r in range(len(board)) if board[r][column] == ".")
        for block, mark in enumerate(("xo"[seat], "xo"[1 - seat])):
            length = min(4, longest_line_through(board, row, column, mark))  # cell counted
            out[i, 4 * block + length - 1] = 1.0
        out[i, 8 + column] = 1.0
    return out


def probabilities(weights: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """The softmax over the legal columns."""
    logits = feats @ weights
    logits = logits - logits.max()
    p = np.exp(logits)
    return p / p.sum()


def entropy_gradient(p: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """d H(p) / d w for ``p = softmax(feats @ w)``: ``-sum_a p_a (log p_a + H) f_a``."""
    logp = np.log(np.maximum(p, 1e-30))
    h = -float(p @ logp)
    return -((p * (logp + h)) @ feats)


class Adam:
    """Adam on one weight vector (beta 0.9 / 0.999, eps 1e-8): the rate of every LLM recipe."""

    def __init__(self, size: int, lr: float) -> None:
        self.lr, self.m, self.v, self.t = lr, np.zeros(size), np.zeros(size), 0

    def ascend(self, weights: np.ndarray, grad: np.ndarray) -> None:
        self.t += 1
        self.m = 0.9 * self.m + 0.1 * grad
        self.v = 0.999 * self.v + 0.001 * grad * grad
        m_hat, v_hat = self.m / (1 - 0.9 ** self.t), self.v / (1 - 0.999 ** self.t)
        weights += self.lr * m_hat / (np.sqrt(v_hat) + 1e-8)


class SGD:
    """Plain gradient steps: each weight moves ``lr`` times its gradient (Adam moves each by
    about ``lr`` whatever its gradient's size, once its sign holds)."""

    def __init__(self, size: int, lr: float) -> None:
        self.lr = lr

    def ascend(self, weights: np.ndarray, grad: np.ndarray) -> None:
        weights += self.lr * grad


OPTIMIZERS = {"adam": Adam, "sgd": SGD}


def state_features(feats: np.ndarray) -> np.ndarray:
    """What the critic reads of a position, from its columns' features: a bias, whether the
    mover can win now, whether the opponent could win next, and both."""
    can_win, threatened = float(feats[:, 3].any()), float(feats[:, 7].any())
    return np.array([1.0, can_win, threatened, can_win * threatened])


class Baseline:
    """What a move's discounted return is measured against, per (agent, seat): ``rae``, a
    running mean of the targets (the last 1,000); ``critic``, a linear value of
    ``state_features`` fitted to them by least-mean-squares at ``value_lr`` (a per-position
    baseline, as the recipe's critic is; Monte-Carlo targets, GAE's lambda = 1). Read before it
    is updated."""

    def __init__(self, estimator: str, value_lr: float = 0.05) -> None:
        if estimator not in ("rae", "critic"):
            raise ValueError(f"estimator: expected 'rae' or 'critic', got {estimator!r}")
        self.estimator, self.value_lr = estimator, value_lr
        self.mean, self.seen, self.value = {}, {}, {}

    def __call__(self, key, feats: np.ndarray) -> float:
        if self.estimator == "rae":
            return self.mean.get(key, 0.0)
        return float(self.value.get(key, np.zeros(4)) @ state_features(feats))

    def update(self, key, feats: np.ndarray, target: float) -> None:
        if self.estimator == "rae":
            self.seen[key] = self.seen.get(key, 0) + 1
            mean = self.mean.get(key, 0.0)
            self.mean[key] = mean + (target - mean) / min(self.seen[key], 1000)
            return
        x = state_features(feats)
        w = self.value.setdefault(key, np.zeros(4))
        w += self.value_lr * (target - float(w @ x)) * x


def play(game, rng, weights: dict[str, np.ndarray], seating: tuple[str, str], opponent: str):
    """One game: ``{(agent, seat): [(features, chosen index, probabilities), ...]}`` and the
    returns per seat."""
    state = game.new_initial_state()
    moves = {}
    while not state.is_terminal():
        seat = state.current_player()
        who = seating[seat]
        if who == "opponent":
            state.apply_action(opponent_move(state, seat, opponent, rng))
            continue
        legal = state.legal_actions(seat)
        feats = column_features(_board(state), seat, legal)
        p = probabilities(weights[who], feats)
        index = int(rng.choice(len(legal), p=p))
        moves.setdefault((who, seat), []).append((feats, index, p))
        state.apply_action(legal[index])
    return moves, state.returns()


def probe(weights: np.ndarray, found, states) -> dict[str, dict[str, float]]:
    """Wins taken and blocks made (sampled and greedy) per seat, ``connect_four_policy.figures``."""
    out = {}
    for seat in (0, 1):
        rows = []
        for state in states[seat]:
            legal = state.legal_actions(seat)
            row = np.zeros(7)
            row[legal] = probabilities(weights, column_features(_board(state), seat, legal))
            rows.append(row)
        out["xo"[seat]] = figures(rows, found[seat])
    return out


def train(steps: int, games: int, lr: float, entropy: float, opponent: str, seed: int,
          eval_every: int, found, states, gamma: float = 1.0,
          optimizer: str = "adam", estimator: str = "rae") -> list[dict]:
    """One run; its evaluations (step 0 first)."""
    import pyspiel

    game = pyspiel.load_game("connect_four")
    rng = np.random.default_rng(seed)
    weights = {a: np.zeros(FEATURES) for a in ("agent_0", "agent_1")}
    optim = {a: OPTIMIZERS[optimizer](FEATURES, lr) for a in weights}
    baseline = Baseline(estimator)
    curve, wins, played = [], {a: 0 for a in weights}, {a: 0 for a in weights}

    def evaluate(step: int) -> None:
        row = {"step": step, "games": step * games, "agents": {
            a: probe(w, found, states) for a, w in weights.items()},
            "wins_vs_opponent": {a: round(wins[a] / played[a], 4) if played[a] else None
                                 for a in weights},
            "weights": {a: [round(float(x), 3) for x in w] for a, w in weights.items()}}
        curve.append(row)
        print(json.dumps(row), flush=True)
        wins.update({a: 0 for a in weights})
        played.update({a: 0 for a in weights})

    evaluate(0)
    for step in range(1, steps + 1):
        grads = {a: np.zeros(FEATURES) for a in weights}
        counts = {a: 0 for a in weights}
        for g in range(games):
            seating = SEATINGS[(step * games + g) % len(SEATINGS)]
            moves, returns = play(game, rng, weights, seating, opponent)
            for (agent, seat), taken in moves.items():
                key = (agent, seat)
                if "opponent" in seating:
                    wins[agent] += returns[seat] > 0
                    played[agent] += 1
                for left, (feats, index, p) in enumerate(reversed(taken)):
                    target = gamma ** left * returns[seat]  # the seat's own moves to the end
                    advantage = target - baseline(key, feats)  # read before it moves
                    grads[agent] += advantage * (feats[index] - p @ feats)
                    grads[agent] += entropy * entropy_gradient(p, feats)
                    counts[agent] += 1
                    baseline.update(key, feats, target)
        for agent in weights:
            if counts[agent]:
                optim[agent].ascend(weights[agent], grads[agent] / counts[agent])
        if step % eval_every == 0 or step == steps:
            evaluate(step)
    return curve


def plot(result: dict, path: Path) -> None:
    """Wins taken and blocks made (sampled and greedy) against games played: the mean over
    seeds, agents and seats, and their range (shaded); names the file in ``result["plot"]``."""
    from learning_plots import _pyplot, _save

    plt = _pyplot(result, path.parent)
    if plt is None:
        return
    figure, axis = plt.subplots(figsize=(6, 4))
    games = [row["games"] for row in result["runs"][0]]
    for name, color in (("wins_taken", "tab:green"), ("blocks_made", "tab:blue")):
        for prefix, style in (("", "-"), ("greedy_", "--")):
            table = np.array([[[run[i]["agents"][a][seat][prefix + name]
                                for a in ("agent_0", "agent_1") for seat in "xo"]
                               for run in result["runs"]] for i in range(len(games))])
            table = table.reshape(len(games), -1)
            axis.plot(games, table.mean(axis=1), style, color=color,
                      label=f"{prefix.replace('_', ' ')}{name.replace('_', ' ')}")
            axis.fill_between(games, table.min(axis=1), table.max(axis=1), color=color, alpha=0.12)
    settings = result["settings"]
    axis.set_title(f"stand-in: opponent {settings['opponent']}, gamma {settings['gamma']}, "
                   f"{settings['optimizer']} {settings['lr']}, {settings['estimator']}, "
                   f"{settings['seeds']} seeds",
                   fontsize=9)
    axis.set_xlabel("games played (each agent sits in 5 of every 8)")
    axis.set_ylabel("probability / share of positions")
    axis.set_ylim(0, 1.02)
    axis.legend(fontsize=8, loc="lower right")
    _save(plt, figure, path, result)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--games", type=int, default=128, help="games a step (the recipe's 128)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--entropy", type=float, default=0.05)
    parser.add_argument("--opponent", default="random", choices=("random", "winner"))
    parser.add_argument("--gamma", type=float, default=1.0,
                        help="discount per own move to the end (advantage.gamma)")
    parser.add_argument("--optimizer", default="adam", choices=tuple(OPTIMIZERS),
                        help="adam (the recipes') or sgd (plain steps; try --lr 1)")
    parser.add_argument("--estimator", default="rae", choices=("rae", "critic"),
                        help="the baseline: a running mean per (agent, seat), or a linear "
                             "critic of the position (Baseline)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--eval_every", type=int, default=10)
    parser.add_argument("--positions", type=int, default=100)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    found = positions(args.positions, seed=1)
    states = {seat: states_of(found[seat]) for seat in (0, 1)}
    runs = [train(args.steps, args.games, args.lr, args.entropy, args.opponent, seed,
                  args.eval_every, found, states, args.gamma, args.optimizer, args.estimator)
            for seed in range(args.seeds)]
    result = {"settings": {k: v for k, v in vars(args).items()}, "kinds": list(KINDS),
              "runs": runs, "seconds": round(time.perf_counter() - start, 1)}
    if os.environ.get("OUT"):
        plot(result, Path(os.environ["OUT"]) / "connect_four_stand_in.png")
    report.emit(result, "connect_four_stand_in.json")
    return result


if __name__ == "__main__":
    main()
