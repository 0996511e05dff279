"""The Kuhn recipe's update rule on a table instead of an LLM: which settings can converge?

    python benchmarks/tabular_kuhn.py                                   # the default sweep
    python benchmarks/tabular_kuhn.py --games 256 --entropy 0.2 --lr 0.03 --schedule linear

An LLM run of 1,000 Kuhn steps costs about an hour of GPU; this costs a second. It replays
what `examples/kuhn_poker/nash.yaml` does, with the policy held as one logit per information
state (12 per agent: 6 per seat) instead of an adapter:

- two agents play self-play in both seats (seatings [agent_0, agent_1] and [agent_1, agent_0],
  half of the games each), ``--games`` games per update;
- advantage = the trajectory's return minus the running baseline of its (agent, seat), read
  before the update b <- decay * b + (1 - decay) * mean(returns) (``advantage.estimator=rae``);
- loss per agent = mean over its decisions of -A * log pi(a|s) - h * H(pi(.|s)) (the REINFORCE
  part of the PPO loss at ratio 1, and ``trainer.action_entropy_coef`` = h);
- Adam (torch's update, bias-corrected) or plain SGD, constant or linearly decayed rate;
- ``--epochs`` x ``--minibatches`` optimizer steps per rollout (``trainer.ppo_epochs``,
  ``ppo_mini_batch_size``), each on PPO's clipped surrogate (``--clip``) against the rollout's
  policy: at one step per rollout the ratio is 1 and this is the REINFORCE loss above;
- ``--magnet m --magnet_refresh K``: plus m * KL(pi(.|s) || rho(.|s)) per decision, rho the
  agent's own policy as it was K steps ago, refreshed every K steps (``trainer.magnet_coef``,
  ``magnet=snapshot``, ``magnet_refresh``: magnetic mirror descent with a moving magnet);
- ``--reverse_uniform u``: plus u * KL(uniform || pi(.|s)) per decision, whose gradient
  u (p - 1/2) does not vanish near a deterministic policy (``trainer.magnet_coef=u``,
  ``magnet=uniform``, ``magnet_kl=reverse``).

``--common_share s`` replaces the table by one weight vector per agent shared by its 12
states, with the share of their gradients that an adapter has in common (SmolLM2: 0.94,
benchmarks/state_gradients.py): there a step for one state moves the others, as on an LLM.

What it leaves out, so its numbers are a guide, not a prediction: an LLM's features change as
it trains (the stand-in's are fixed). The recipe's loss (``trainer.policy_over=moves``) weighs
each decision once, as here; the token-level loss (``tokens``) would divide a decision's
gradient by its answer's tokens (about 7 for SmolLM2's Kuhn answers). Exploitability is exact,
OpenSpiel's NashConv / 2 (uniform play 0.458, the best deterministic profile 0.1667). Prints
one JSON line per setting.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time

import numpy as np

# Information states (index into a seat's 6 logits; the logit is that of betting/calling):
#   seat 0: 0..2 = card J/Q/K at the start, 3..5 = card after "pass, bet" (call or fold)
#   seat 1: 0..2 = card after "pass" (bet or pass), 3..5 = card after "bet" (call or fold)
DEALS = [(a, b) for a in range(3) for b in range(3) if a != b]


def _showdown(card0, card1, stake):
    """Seat 0's winnings at a showdown for ``stake`` chips (arrays or scalars)."""
    return np.where(card0 > card1, stake, -stake)


def exploitability(seat0: np.ndarray, seat1: np.ndarray) -> float:
    """Exact exploitability (NashConv / 2) of the policy that plays ``seat0`` (6 probabilities
    of betting/calling) in seat 0 and ``seat1`` in seat 1."""
    best1 = 0.0  # seat 1's best response against seat0: one choice per (card, history)
    for card1 in range(3):
        bet = passed = call = fold = 0.0
        for card0 in range(3):
            if card0 == card1:
                continue
            reach_pass, reach_bet = (1 - seat0[card0]) / 6, seat0[card0] / 6
            passed += reach_pass * -_showdown(card0, card1, 1)
            bet += reach_pass * (seat0[3 + card0] * -_showdown(card0, card1, 2)
                                 + (1 - seat0[3 + card0]) * 1)
            call += reach_bet * -_showdown(card0, card1, 2)
            fold += reach_bet * -1
        best1 += max(bet, passed) + max(call, fold)
    best0 = 0.0  # seat 0's best response against seat1
    for card0 in range(3):
        others = [c for c in range(3) if c != card0]
        call = sum(seat1[c] * _showdown(card0, c, 2) for c in others) / 6
        fold = sum(seat1[c] * -1 for c in others) / 6
        passed = sum((1 - seat1[c]) * _showdown(card0, c, 1) for c in others) / 6 + max(call,
                                                                                          fold)
        bet = sum((1 - seat1[3 + c]) + seat1[3 + c] * _showdown(card0, c, 2) for c in others) / 6
        best0 += max(passed, bet)
    return float((best0 + best1) / 2)


def _play(rng, seat0: np.ndarray, seat1: np.ndarray, games: int):
    """``games`` games; returns seat 0's winnings (games,) and each seat's decisions as
    (game index, state index, action taken) arrays."""
    cards = np.array([rng.permutation(3)[:2] for _ in range(games)])
    card0, card1 = cards[:, 0], cards[:, 1]
    first = rng.random(games) < seat0[card0]
    reply_state = np.where(first, 3 + card1, card1)
    reply = rng.random(games) < seat1[reply_state]
    third = ~first & reply  # pass, bet: seat 0 calls or folds
    calls = rng.random(games) < seat0[3 + card0]
    win0 = np.where(first, np.where(reply, _showdown(card0, card1, 2), 1),
                    np.where(reply, np.where(calls, _showdown(card0, card1, 2), -1),
                             _showdown(card0, card1, 1)))
    games_ix = np.arange(games)
    decisions0 = (np.concatenate([games_ix, games_ix[third]]),
                  np.concatenate([card0, 3 + card0[third]]),
                  np.concatenate([first, calls[third]]))
    decisions1 = (games_ix, reply_state, reply)
    return win0, (decisions0, decisions1)


# SmolLM2-135M's log-odds of betting/calling before training (benchmarks/state_gradients.py,
# the recipe's prompt), per (seat, state) in this file's order: the shared-feature model's start.
SMOLLM2_LOG_ODDS = np.array([[-0.761, -0.893, -0.854, -1.776, -1.909, -1.912],
                             [-1.292, -1.44, -1.45, -0.404, -0.535, -0.454]])


def shared_features(common_share: float, width: int, rng) -> np.ndarray:
    """Features (2 seats, 6 states, width) whose gradients share ``common_share`` of their
    energy: phi_s = c + eps * d_s (c, d_s random unit vectors; the share is |mean phi|^2 /
    mean |phi|^2, as benchmarks/state_gradients.py measures it on an adapter). Scaled so that a
    full Adam step (lr * sign) along one state's own gradient moves its logit by ``lr``."""
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
    eps = np.sqrt(max(1 - common_share, 0.0) / max(common_share - 1 / 12, 1e-9))
    phi = unit(rng.normal(size=width)) + eps * unit(rng.normal(size=(2, 6, width)))
    return phi / np.abs(phi).sum(-1).mean()


def surrogate_gradient(p, p_old, action, advantage, entropy: float, clip: float,
                       magnet: float = 0.0, p_magnet=0.5):
    """d/dlogit of one decision's loss -min(r A, clip(r, 1 - clip, 1 + clip) A) - h H(pi)
    + m KL(pi || rho), pi = (p, 1 - p) the probability of betting, r = pi(action) /
    pi_old(action), rho = (p_magnet, 1 - p_magnet): PPO's clipped surrogate, whose gradient is
    0 where the ratio left [1 - clip, 1 + clip] in the advantage's own direction (never at
    r = 1), plus the entropy bonus and the magnet's pull. With z = log(p / (1 - p)):
    d(-H)/dz = p (1 - p) z and dKL/dz = p (1 - p) (z - log(p_magnet / (1 - p_magnet))).
    Arrays or scalars."""
    ratio = np.where(action, p / p_old, (1 - p) / (1 - p_old))
    active = ~(((advantage > 0) & (ratio > 1 + clip)) | ((advantage < 0) & (ratio < 1 - clip)))
    logit = np.log(p / (1 - p))
    return (-advantage * ratio * (action - p) * active + entropy * p * (1 - p) * logit
            + magnet * p * (1 - p) * (logit - np.log(p_magnet / (1 - p_magnet))))


def train(games=64, entropy=0.01, lr=0.03, schedule="const", optimizer="adam", steps=1000,
          decay=0.9, seed=0, every=50, betas=(0.9, 0.999), common_share=None,
          width=512, epochs=1, clip=0.2, minibatches=1, magnet=0.0,
          magnet_refresh=50, entropy_final=None, reverse_uniform=0.0,
          ema=None) -> list[dict]:
    """One run; returns [{step, exploitability: [agent_0, agent_1]}] every ``every`` steps.

    ``common_share`` None: one free logit per information state (a table). Else each agent's
    12 logits are SMOLLM2_LOG_ODDS + features @ w, with one weight vector w per agent shared by
    all its states (``shared_features``): an adapter's situation, where a step for one state
    moves the others.

    ``ema`` d: also the exploitability of each agent's averaged weights, w_avg <- d w_avg +
    (1 - d) w after every update (``exploitability_ema``; an "average policy" check, no
    pipeline option does this)."""
    rng = np.random.default_rng(seed)
    if common_share is None:
        logits = rng.normal(0.0, 0.5, (2, 2, 6))  # (agent, seat, state)
        weights = logits  # a table's weights ARE its logits: one array, stepped in place
    else:
        features = shared_features(common_share, width, rng)
        weights = np.zeros((2, width))
        logits = SMOLLM2_LOG_ODDS + np.einsum("kij,aj->aki", features, weights)
    first_moment, second_moment = np.zeros_like(weights), np.zeros_like(weights)
    averaged = weights.copy()
    baseline = np.zeros((2, 2))  # (agent, seat)
    curve = []
    for step in range(steps):
        rate = lr * (1 - step / steps) if schedule == "linear" else lr
        # trainer.action_entropy_final: the bonus's weight moves linearly from ``entropy`` to
        # ``entropy_final`` over the run (None: constant)
        weight = (entropy if entropy_final is None
                  else entropy + (entropy_final - entropy) * step / steps)
        prob = 1 / (1 + np.exp(-logits))
        if step % magnet_refresh == 0:
            rho = prob.copy()  # the snapshot magnet: the policy at the last refresh
        played = []  # (agent, seat, state, action, advantage) per decision, this rollout
        returns = {}
        for seating in range(2):  # agent `seating` sits in seat 0
            agents = (seating, 1 - seating)
            win0, per_seat = _play(rng, prob[agents[0], 0], prob[agents[1], 1], games // 2)
            for seat, (game, state, action) in enumerate(per_seat):
                agent = agents[seat]
                ret = win0 if seat == 0 else -win0
                returns[agent, seat] = ret
                played.append((agent, seat, game, state, action,
                               ret[game] - baseline[agent, seat]))
        for (agent, seat), ret in returns.items():
            baseline[agent, seat] = decay * baseline[agent, seat] + (1 - decay) * ret.mean()
        old = prob.copy()  # the behaviour policy, fixed over the epochs
        # trainer.ppo_epochs x mini-batches optimizer steps, the games split by index
        for update, minibatch in itertools.product(range(epochs), range(minibatches)):
            prob = 1 / (1 + np.exp(-logits))
            grad = np.zeros_like(logits)
            decisions = np.zeros(2)
            for agent, seat, game, state, action, advantage in played:
                keep = game % minibatches == minibatch
                state, action, advantage = state[keep], action[keep], advantage[keep]
                g = surrogate_gradient(prob[agent, seat, state], old[agent, seat, state],
                                       action, advantage, weight, clip, magnet,
                                       rho[agent, seat, state])
                g = g + reverse_uniform * (prob[agent, seat, state] - 0.5)
                np.add.at(grad[agent, seat], state, g)
                decisions[agent] += len(state)
            grad /= np.maximum(decisions, 1)[:, None, None]
            if common_share is not None:  # chain rule through logits = offset + features @ w
                grad = np.einsum("aki,kij->aj", grad, features)
            t = (step * epochs + update) * minibatches + minibatch + 1
            if optimizer == "adam":  # torch.optim.Adam's update (eps 1e-8)
                beta1, beta2 = betas
                first_moment = beta1 * first_moment + (1 - beta1) * grad
                second_moment = beta2 * second_moment + (1 - beta2) * grad ** 2
                m_hat = first_moment / (1 - beta1 ** t)
                v_hat = second_moment / (1 - beta2 ** t)
                weights -= rate * m_hat / (np.sqrt(v_hat) + 1e-8)
            else:
                weights -= rate * grad
            if common_share is not None:
                logits = SMOLLM2_LOG_ODDS + np.einsum("kij,aj->aki", features, weights)
        if ema is not None:
            averaged = ema * averaged + (1 - ema) * weights
        if (step + 1) % every == 0:
            prob = 1 / (1 + np.exp(-logits))
            point = {"step": step + 1, "exploitability": [
                round(exploitability(prob[a, 0], prob[a, 1]), 4) for a in range(2)]}
            if ema is not None:
                mean_logits = (averaged if common_share is None else SMOLLM2_LOG_ODDS
                               + np.einsum("kij,aj->aki", features, averaged))
                mean_prob = 1 / (1 + np.exp(-mean_logits))
                point["exploitability_ema"] = [
                    round(exploitability(mean_prob[a, 0], mean_prob[a, 1]), 4) for a in range(2)]
            curve.append(point)
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--entropy", type=float, nargs="+", default=[0.01, 0.05, 0.2])
    parser.add_argument("--lr", type=float, nargs="+", default=[0.03])
    parser.add_argument("--schedule", nargs="+", default=["const", "linear"])
    parser.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, nargs="+", default=[1],
                        help="optimizer steps per rollout (trainer.ppo_epochs)")
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--minibatches", type=int, nargs="+", default=[1],
                        help="optimizer steps per epoch (rows / trainer.ppo_mini_batch_size)")
    parser.add_argument("--common_share", type=float, nargs="+", default=[None],
                        help="shared features instead of a table (see train); e.g. 0.92, "
                        "SmolLM2's adapter on the recipe's prompt")
    parser.add_argument("--entropy_final", type=float, nargs="+", default=[None],
                        help="the entropy weight at the run's end, reached linearly "
                        "(trainer.action_entropy_final); default: constant")
    parser.add_argument("--magnet", type=float, nargs="+", default=[0.0],
                        help="weight of KL(policy || snapshot magnet) (trainer.magnet_coef)")
    parser.add_argument("--magnet_refresh", type=int, nargs="+", default=[50],
                        help="steps between refreshes of the magnet (trainer.magnet_refresh)")
    parser.add_argument("--reverse_uniform", type=float, nargs="+", default=[0.0],
                        help="weight of KL(uniform || policy) (trainer.magnet_coef with "
                        "magnet=uniform, magnet_kl=reverse)")
    parser.add_argument("--ema", type=float, nargs="+", default=[None],
                        help="also score each agent's exponential average of its weights "
                        "with this decay (no pipeline option does this)")
    args = parser.parse_args()
    for (games, entropy, lr, schedule, share, epochs, minibatches, magnet,
         refresh, entropy_final, reverse, ema) in itertools.product(
            args.games, args.entropy, args.lr, args.schedule, args.common_share, args.epochs,
            args.minibatches, args.magnet, args.magnet_refresh, args.entropy_final,
            args.reverse_uniform, args.ema):
        start = time.perf_counter()
        curves = [train(games, entropy, lr, schedule, args.optimizer, args.steps, seed=seed,
                        common_share=share, epochs=epochs, clip=args.clip,
                        minibatches=minibatches, magnet=magnet, magnet_refresh=refresh,
                        entropy_final=entropy_final, reverse_uniform=reverse, ema=ema)
                  for seed in range(args.seeds)]
        worse = np.array([[max(p["exploitability"]) for p in c] for c in curves])
        averaged = {}
        if ema is not None:
            worse_ema = np.array([[max(p["exploitability_ema"]) for p in c] for c in curves])
            averaged = {"ema": ema, "worse_agent_ema_last_per_seed":
                        [round(float(x), 3) for x in worse_ema[:, -1]],
                        "worse_agent_ema_last_mean": round(float(worse_ema[:, -1].mean()), 3)}
        marks = [i for i, p in enumerate(curves[0]) if p["step"] in
                 (args.steps // 4, args.steps // 2, args.steps)]
        print(json.dumps({
            "games": games, "entropy": entropy, "entropy_final": entropy_final, "lr": lr,
            "schedule": schedule,
            "optimizer": args.optimizer, "seeds": args.seeds, "common_share": share,
            "epochs": epochs, "minibatches": minibatches, "clip": args.clip,
            "magnet": magnet, "magnet_refresh": refresh, "reverse_uniform": reverse,
            "worse_agent_mean": {curves[0][i]["step"]: round(float(worse[:, i].mean()), 3)
                                 for i in marks},
            "worse_agent_last_per_seed": [round(float(x), 3) for x in worse[:, -1]],
            **averaged,
            "seconds": round(time.perf_counter() - start, 1)}), flush=True)


if __name__ == "__main__":
    main()
