"""The Leduc recipe's update rule on a table instead of an LLM: how many steps, games per step
and which weights can reach the goal (exploitability <= 1.2)?

    python benchmarks/tabular_leduc.py --steps 300 --games 128 256 --seeds 3
    python benchmarks/tabular_leduc.py --steps 600 --games 256 --entropy 0.05 0.2 --lr 0.5 1.4

A 300-step SmolLM2 Leduc run costs about an hour of GPU; a setting here costs a minute. It
replays what `examples/leduc_poker/nash.yaml` does (as `tabular_kuhn.py` does for Kuhn), with
each agent's policy held as one row of three logits (fold, call, raise) per information state
of either seat (OpenSpiel's ``TabularPolicy`` rows, 936 in all) instead of an adapter:

- two agents in both seats (seatings [agent_0, agent_1] and [agent_1, agent_0], half of the
  games each), ``--games`` games per update with independent deals;
- advantage = the game's return to the seat minus the running baseline of its (agent, seat),
  read before the update b <- decay * b + (1 - decay) * mean(returns) (``estimator=rae``);
- per decision PPO's clipped surrogate against the rollout's policy, minus ``--entropy`` times
  the entropy of the distribution over LEGAL moves (``trainer.action_entropy_coef``), averaged
  over the agent's decisions (``policy_over=moves``);
- ``--minibatches`` Adam steps per rollout (the games split by index), rate linear to 0.

``--common_share s``: instead of a free table, logits = features @ w with one weight vector
per agent, features whose gradients share ``s`` of their energy across states (as an adapter's
do: Kuhn on SmolLM2 0.94), so a step for one state moves the others.

What it leaves out: an LLM's features change as it trains, and it starts nearly deterministic
(SmolLM2 puts 0.2-0.5 nats on up to three moves); the table starts near uniform. Exploitability
is exact, OpenSpiel's NashConv / 2 (uniform play 2.374). One JSON line per setting.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np


class Leduc:
    """The game, its information-state rows and exact exploitability (OpenSpiel)."""

    def __init__(self):
        import pyspiel
        from open_spiel.python import policy as policy_lib

        self.game = pyspiel.load_game("leduc_poker")
        self.table = policy_lib.TabularPolicy(self.game)
        self.rows = self.table.state_lookup  # information-state string -> row
        self.legal = self.table.legal_actions_mask.astype(bool)  # (rows, 3)

    def exploitability(self, probs: np.ndarray) -> float:
        """NashConv / 2 of the policy whose row r plays ``probs[r]`` (rows, 3) in both seats."""
        from open_spiel.python.algorithms import exploitability

        self.table.action_probability_array[:] = probs
        return float(exploitability.exploitability(self.game, self.table))

    def play(self, rng, probs_by_seat, games: int):
        """``games`` games, seat s playing the rows of ``probs_by_seat[s]``. Returns each seat's
        return (games, 2) and the decisions as lists of (game, row, action) per seat."""
        returns = np.zeros((games, 2))
        decisions = ([], [])
        for g in range(games):
            state = self.game.new_initial_state()
            while not state.is_terminal():
                if state.is_chance_node():
                    outcomes, chances = zip(*state.chance_outcomes(), strict=True)
                    state.apply_action(int(rng.choice(outcomes, p=chances)))
                    continue
                seat = state.current_player()
                row = self.rows[state.information_state_string()]
                action = int(rng.choice(3, p=probs_by_seat[seat][row]))
                decisions[seat].append((g, row, action))
                state.apply_action(action)
            returns[g] = state.returns()
        return returns, [np.array(d, dtype=np.int64).reshape(-1, 3) for d in decisions]


def softmax(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """Softmax over the legal moves of each row (illegal moves get probability 0)."""
    z = np.where(legal, logits, -np.inf)
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def decision_gradient(p, p_old, action, advantage, entropy: float, clip: float,
                      legal, magnet: float = 0.0) -> np.ndarray:
    """d/dlogits (n, 3) of each decision's loss -min(r A, clip(r, 1 - clip, 1 + clip) A)
    - h H(pi) + m KL(u || pi), pi = p (n, 3) over the legal moves, r = p[a] / p_old[a], u
    uniform over the legal moves.

    The surrogate's gradient is -A r (onehot(a) - p) where the clip does not bind (it binds
    where r left [1 - clip, 1 + clip] in the advantage's own direction; never at r = 1);
    d(-H)/dz_i = p_i (log p_i + H), 0 on illegal moves; dKL(u || pi)/dz = p - u
    (``trainer.magnet_coef`` with ``magnet_kl=reverse``)."""
    n = len(action)
    taken = p[np.arange(n), action]
    ratio = taken / p_old[np.arange(n), action]
    active = ~(((advantage > 0) & (ratio > 1 + clip)) | ((advantage < 0) & (ratio < 1 - clip)))
    onehot = np.zeros_like(p)
    onehot[np.arange(n), action] = 1.0
    surrogate = -(advantage * ratio * active)[:, None] * (onehot - p)
    log_p = np.where(legal, np.log(np.where(legal, p, 1.0)), 0.0)
    entropy_now = -(p * log_p).sum(-1, keepdims=True)
    uniform = legal / legal.sum(-1, keepdims=True)
    return surrogate + entropy * p * (log_p + entropy_now) + magnet * (p - uniform)


def train(leduc: Leduc, games=128, entropy=0.2, lr=1.4, steps=300, decay=0.9, seed=0,
          every=50, clip=0.2, minibatches=4, common_share=None, width=4096,
          init_std=0.5, magnet=0.0) -> list[dict]:
    """One run; returns [{step, exploitability: [agent_0, agent_1]}] every ``every`` steps."""
    rng = np.random.default_rng(seed)
    rows = len(leduc.legal)
    if common_share is None:
        weights = rng.normal(0.0, init_std, (2, rows, 3))  # the table's weights are its logits
        features = None
    else:  # phi[row, a] = c_a + eps d_{row, a}: the share of |mean phi|^2 in mean |phi|^2
        unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
        eps = np.sqrt(max(1 - common_share, 0.0) / max(common_share - 1 / rows, 1e-9))
        features = unit(rng.normal(size=(1, 3, width))) + eps * unit(
            rng.normal(size=(rows, 3, width)))
        features /= np.abs(features).sum(-1).mean()
        weights = np.zeros((2, width))

    def logits_of(w):
        return w if features is None else np.einsum("rak,gk->gra", features, w)

    first_moment, second_moment = np.zeros_like(weights), np.zeros_like(weights)
    baseline = np.zeros((2, 2))  # (agent, seat)
    curve = []
    t = 0
    for step in range(steps):
        rate = lr * (1 - step / steps)
        probs = softmax(logits_of(weights), leduc.legal[None])
        played = []  # (agent, seat, decisions (n, 3), advantage per decision)
        returns = {}
        for first in range(2):  # agent `first` sits in seat 0
            agents = (first, 1 - first)
            ret, per_seat = leduc.play(rng, [probs[agents[0]], probs[agents[1]]], games // 2)
            for seat, decided in enumerate(per_seat):
                agent = agents[seat]
                returns[agent, seat] = ret[:, seat]
                played.append((agent, decided,
                               ret[decided[:, 0], seat] - baseline[agent, seat]))
        for (agent, seat), ret in returns.items():
            baseline[agent, seat] = decay * baseline[agent, seat] + (1 - decay) * ret.mean()
        old = probs
        for minibatch in range(minibatches):
            probs = softmax(logits_of(weights), leduc.legal[None])
            grad = np.zeros((2, rows, 3))
            count = np.zeros(2)
            for agent, decided, advantage in played:
                keep = decided[:, 0] % minibatches == minibatch
                row, action, adv = decided[keep, 1], decided[keep, 2], advantage[keep]
                g = decision_gradient(probs[agent, row], old[agent, row], action, adv, entropy,
                                      clip, leduc.legal[row], magnet)
                np.add.at(grad[agent], row, g)
                count[agent] += len(row)
            grad /= np.maximum(count, 1)[:, None, None]
            if features is not None:
                grad = np.einsum("gra,rak->gk", grad, features)
            t += 1  # torch.optim.Adam's update (betas 0.9, 0.999, eps 1e-8)
            first_moment = 0.9 * first_moment + 0.1 * grad
            second_moment = 0.999 * second_moment + 0.001 * grad ** 2
            weights = weights - rate * (first_moment / (1 - 0.9 ** t)) / (
                np.sqrt(second_moment / (1 - 0.999 ** t)) + 1e-8)
        if (step + 1) % every == 0:
            probs = softmax(logits_of(weights), leduc.legal[None])
            curve.append({"step": step + 1, "exploitability": [
                round(leduc.exploitability(probs[a]), 4) for a in range(2)]})
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--entropy", type=float, nargs="+", default=[0.2])
    parser.add_argument("--lr", type=float, nargs="+", default=[1.4])
    parser.add_argument("--steps", type=int, nargs="+", default=[300])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--minibatches", type=int, nargs="+", default=[4])
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--common_share", type=float, nargs="+", default=[None])
    parser.add_argument("--init_std", type=float, nargs="+", default=[0.5],
                        help="std of the table's starting logits: 0.5 starts near uniform "
                        "(0.77 nats, exploitability 2.38), 3 as sharp as SmolLM2 (0.32 nats, "
                        "3.15; SmolLM2 starts at 3.15 with 0.2-0.5 nats)")
    parser.add_argument("--magnet", type=float, nargs="+", default=[0.0],
                        help="weight of KL(uniform || policy) over legal moves "
                        "(trainer.magnet_coef with trainer.magnet_kl=reverse)")
    args = parser.parse_args()
    leduc = Leduc()
    for games, entropy, lr, steps, minibatches, share, init_std, magnet in itertools.product(
            args.games, args.entropy, args.lr, args.steps, args.minibatches,
            args.common_share, args.init_std, args.magnet):
        start = time.perf_counter()
        curves = [train(leduc, games, entropy, lr, steps, seed=seed, every=args.every,
                        minibatches=minibatches, common_share=share, init_std=init_std,
                        magnet=magnet)
                  for seed in range(args.seeds)]
        worse = np.array([[max(p["exploitability"]) for p in c] for c in curves])
        print(json.dumps({
            "games": games, "entropy": entropy, "lr": lr, "steps": steps,
            "minibatches": minibatches, "common_share": share, "init_std": init_std,
            "magnet": magnet, "seeds": args.seeds,
            "worse_agent_mean": {p["step"]: round(float(worse[:, i].mean()), 3)
                                 for i, p in enumerate(curves[0])},
            "worse_agent_last_per_seed": [round(float(x), 3) for x in worse[:, -1]],
            "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
