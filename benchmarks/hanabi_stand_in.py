"""The Hanabi recipes' update rules on a small network instead of an LLM: which can learn?

    python benchmarks/hanabi_stand_in.py                      # the default comparison, 3 seeds
    python benchmarks/hanabi_stand_in.py --settings grpo:0.05 mappo:0 --steps 300 --seeds 5

An LLM Hanabi run costs ~20 s a step on an H100; this costs ~0.2 s. It replays what
``learning.py --recipes hanabi_team`` (and its GRPO twin) do, on the examples' small Hanabi
(2 colours, ranks 1-3, hands of 2, 3 info tokens, 1 life: max 6), with each agent's policy a
two-layer MLP over OpenSpiel's observation tensor (HLE's canonical encoding: the same facts as
the prompt: hands, what hints told, fireworks, tokens, discards) instead of a LoRA adapter:

- two agents, each game seated [agent_0, agent_1] or [agent_1, agent_0] (half each),
  ``--games`` games a step on independent deals, groups of 4;
- a move is sampled from the softmax over the legal moves (the constrained answer at
  temperature 1);
- rewards as the rollout credits them: each move's change of the score (+1 a card played, minus
  the score when the last life goes) goes to each seat's latest move;
- ``grpo``: a seat's trajectory gets (R - group mean) / (group std + 1e-6) on every move, R its
  undiscounted return, the group the 4 games' trajectories of that seat
  (``advantage.estimator=grpo``);
- ``rtg``: each move gets its seat's discounted reward-to-go G_t = sum_k gamma^k r_{t+k}
  (``--gamma``), whitened over each agent's moves of the step (``advantage.estimator=reinforce
  advantage.gamma=G advantage.norm=whiten``): a card played now counts more than a life lost
  later, where GRPO's undiscounted return credits every move of a game that ends at 0 with 0;
- ``mappo``: one value MLP over both seats' observation tensors (``critic.mode=shared``,
  ``critic.input=global``), GAE over each seat's moves with gamma 1 and ``--lam``; the value
  fits the returns A + V (squared error, its own Adam at ``--critic_lr``);
- loss per agent = mean over its moves of -A log pi(a|s) - h H(pi(.|s)), one Adam step per
  rollout (``trainer.ppo_epochs=1``, one mini-batch: the ratio is 1), h the legal-move entropy
  bonus (``trainer.action_entropy_coef``), rate decayed linearly to 0 at the last step
  (``--schedule linear``, the recipe's ``team.optim.lr_scheduler=linear``) or held
  (``--schedule constant``).

What it leaves out, so its numbers are a guide, not a prediction: an adapter on a pretrained
LLM starts from a prior (SmolLM2's first moves score 0) and moves its states together; this
network starts near uniform and has its own generalisation. Evaluated every ``--eval_every``
steps on ``--eval_games`` fresh deals, sampled and greedy (argmax legal move); the reference
teams (benchmarks/hanabi_baselines.py): random 0.079, the rule 3.64. Prints one JSON line per
setting and seed, then one per setting with the mean and a 95% t-interval over seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
from hanabi_baselines import SMALL_HANABI, resolve_chance
from report import t_interval
from torch import nn

from roll.agentic.env.renderers import hanabi_playable
from roll.algorithms.losses import approx_kl_terms, ppo_policy_loss
from roll.algorithms.normalize import normalize_advantages
from roll.algorithms.trajectories import reverse_discounted_cumsum
from roll.multi_agent.config import OptimConfig
from roll.multi_agent.optim import schedule, step_schedules


def mlp(inputs: int, outputs: int, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(inputs, width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, outputs))


def gae(rewards: list[float], values: list[float], lam: float) -> list[float]:
    """GAE with gamma 1 over one trajectory's moves: A_t = sum_k lam^k delta_{t+k},
    delta_t = r_t + V_{t+1} - V_t, V after the last move = 0."""
    advantages, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        following = values[t + 1] if t + 1 < len(values) else 0.0
        running = rewards[t] + following - values[t] + lam * running
        advantages[t] = running
    return advantages


def reward_to_go(rewards: list[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma G_{t+1} over one trajectory's moves (G after the last move = 0):
    roll's own discounted sum (``advantage.estimator=reinforce``), one trajectory."""
    row = torch.tensor([rewards], dtype=torch.float64)
    return reverse_discounted_cumsum(row, gamma)[0].tolist()


def whiten(values: np.ndarray) -> np.ndarray:
    """(x - mean) / (population std + 1e-6) over all of ``values``: roll's
    ``advantage.norm=whiten``, every move one row of one agent's key."""
    column = torch.from_numpy(np.asarray(values, dtype=np.float64))[:, None]  # (N, 1)
    keys = torch.zeros(len(column), dtype=torch.long)
    return normalize_advantages(column, torch.ones_like(column), keys, "whiten")[:, 0].numpy()


def group_relative(returns: np.ndarray) -> np.ndarray:
    """GRPO within one group: (R - mean) / (population std + 1e-6); 0 where all are equal."""
    centred = returns - returns.mean()
    if np.all(returns == returns[0]):
        return np.zeros_like(returns)
    return centred / (returns.std() + 1e-6)


class Games:
    """``n`` games played in lock-step; each move's legal mask, observation and seat kept."""

    def __init__(self, game, n: int, rng: np.random.Generator) -> None:
        self.game, self.rng = game, rng
        self.states = [game.new_initial_state() for _ in range(n)]
        for state in self.states:
            resolve_chance(state, rng)

    def live(self) -> list[int]:
        return [i for i, state in enumerate(self.states) if not state.is_terminal()]

    def step(self, index: int, action: int) -> list[float]:
        state = self.states[index]
        before = state.returns()
        state.apply_action(action)
        resolve_chance(state, self.rng)
        return [after - so_far for after, so_far in zip(state.returns(), before, strict=True)]


def features(state, seat: int, playable: bool) -> list[float]:
    """The seat's input: OpenSpiel's observation tensor, and with ``playable`` one flag per
    card (its own first) that the ``hanabi_words`` prompt marks "playable now"."""
    tensor = list(state.observation_tensor(seat))
    if not playable:
        return tensor
    size = SMALL_HANABI["hand_size"]  # a hand is short once the deck is out: pad with "no"
    return tensor + [float(flag) for hand in hanabi_playable(state.observation_string(seat))
                     for flag in hand + [False] * (size - len(hand))]


def play(game, policies: list[nn.Module], seatings: list[tuple[int, int]], rng, torch_rng,
         greedy: bool = False, critic: nn.Module | None = None, playable: bool = False) -> dict:
    """Play one game per seating; per (game, seat): the moves' observations, masks, actions,
    credited rewards and (with ``critic``) values; and each game's score."""
    games = Games(game, len(seatings), rng)
    n_actions = game.num_distinct_actions()
    moves = {(g, s): [] for g in range(len(seatings)) for s in (0, 1)}
    while live := games.live():
        seats = [games.states[g].current_player() for g in live]
        obs = torch.tensor([features(games.states[g], s, playable)
                            for g, s in zip(live, seats, strict=True)])
        mask = torch.zeros(len(live), n_actions, dtype=torch.bool)
        for row, (g, s) in enumerate(zip(live, seats, strict=True)):
            mask[row, games.states[g].legal_actions(s)] = True
        logits = torch.full((len(live), n_actions), -math.inf)
        with torch.no_grad():
            for agent, policy in enumerate(policies):
                rows = [r for r, (g, s) in enumerate(zip(live, seats, strict=True))
                        if seatings[g][s] == agent]
                if rows:
                    logits[rows] = policy(obs[rows])
            logits = logits.masked_fill(~mask, -math.inf)
            actions = (logits.argmax(-1) if greedy else
                       torch.multinomial(logits.softmax(-1), 1, generator=torch_rng)[:, 0])
            values = None
            if critic is not None:
                other = torch.tensor([features(games.states[g], 1 - s, playable)
                                      for g, s in zip(live, seats, strict=True)])
                values = critic(torch.cat([obs, other], -1))[:, 0]
        for row, (g, s) in enumerate(zip(live, seats, strict=True)):
            rewards = games.step(g, int(actions[row]))
            moves[(g, s)].append({"obs": obs[row], "mask": mask[row], "action": int(actions[row]),
                                  "reward": 0.0,
                                  "value": None if values is None else float(values[row]),
                                  "global": None if values is None else
                                  torch.cat([obs[row], other[row]])})
            for seat, reward in enumerate(rewards):  # to each seat's latest move
                if reward and moves[(g, seat)]:
                    moves[(g, seat)][-1]["reward"] += reward
    scores = [state.returns()[0] for state in games.states]
    return {"moves": moves, "scores": scores}


def update(policy, optim, obs, mask, action, advantage, bonus: float, args, torch_rng
           ) -> float | None:
    """One agent's update from its rows of a step: one Adam step on the whole batch (the
    recipes' one mini-batch, where the ratio is 1: -A log pi), or with ``--minibatches`` M > 1
    M Adam steps, each on a shuffled M-th of the rows, of PPO's clipped objective
    min(r A, clip(r, 1 - eps, 1 + eps) A), r = pi / pi_old, pi_old the policy that played
    (``trainer.ppo_mini_batch_size``, ``trainer.clip_ratio``); the legal-move bonus on each.
    Returns (M > 1) the trainer's ``approx_kl``: the k3 estimate of KL(played || current) on
    each mini-batch's moves before its Adam step, averaged over the mini-batches; None (M = 1)."""
    def log_probs_of(rows):
        return policy(obs[rows]).masked_fill(~mask[rows], -math.inf).log_softmax(-1)

    def entropy_of(log_probs, rows):
        return -(log_probs.exp() * log_probs.masked_fill(~mask[rows], 0.0)).sum(-1)

    everything = torch.arange(len(action))
    if args.minibatches == 1:
        log_probs = log_probs_of(everything)
        chosen = log_probs.gather(1, action[:, None])[:, 0]
        loss = -(advantage * chosen).mean() - bonus * entropy_of(log_probs, everything).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        return None
    with torch.no_grad():
        old = log_probs_of(everything).gather(1, action[:, None])[:, 0]
    order = torch.randperm(len(action), generator=torch_rng)
    kls = []
    for rows in order.chunk(args.minibatches):
        log_probs = log_probs_of(rows)
        chosen = log_probs.gather(1, action[rows, None])  # (rows, 1): one "token" a move
        kls.append(float(approx_kl_terms(chosen.detach() - old[rows, None]).mean()))
        surrogate, _ = ppo_policy_loss(chosen, old[rows, None], advantage[rows, None],
                                       torch.ones_like(chosen), clip_low=args.clip,
                                       clip_high=args.clip)  # the trainer's own loss
        loss = surrogate - bonus * entropy_of(log_probs, rows).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
    return float(np.mean(kls))


def rate_config(args, target_kl: float = 0.0) -> OptimConfig:
    """The recipes' rate, as roll's trainer reads it (``team.optim``): ``--lr`` decayed
    linearly to 0 at the last step (``--schedule linear``) or held; with ``target_kl`` (a
    policy's, ``--target_kl``) steered by each step's approx_kl (optim.RateFactor)."""
    return OptimConfig(lr=args.lr, total_steps=args.steps, target_kl=target_kl,
                       lr_scheduler="linear" if args.schedule == "linear" else "constant")


def run(setting: str, seed: int, args) -> dict:
    import pyspiel

    estimator, bonus = setting.split(":")
    bonus = float(bonus)
    params = {**SMALL_HANABI, **args.params}
    game = pyspiel.load_game("hanabi", params)
    rng, torch_rng = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    width, n_obs = args.width, game.observation_tensor_shape()[0]
    if args.playable:  # one flag per card of every hand
        n_obs += params["players"] * params["hand_size"]
    policies = [mlp(n_obs, game.num_distinct_actions(), width) for _ in range(2)]
    optims = [torch.optim.Adam(p.parameters(), lr=args.lr) for p in policies]
    critic = mlp(2 * n_obs, 1, width) if estimator == "mappo" else None
    critic_optim = torch.optim.Adam(critic.parameters(), lr=args.critic_lr) if critic else None
    schedules = [schedule(optim, rate_config(args, args.target_kl)) for optim in optims]
    critic_schedule = schedule(critic_optim, rate_config(args)) if critic else None
    curve, start, kls = [], time.perf_counter(), []
    for step in range(args.steps + 1):
        if step % args.eval_every == 0:
            point = {"step": step}
            if kls:  # the agents' mean approx_kl over the steps since the last point
                point["approx_kl"] = float(f"{np.mean(kls):.3g}")
                point["lr"] = [float(f"{s.get_last_lr()[0]:.3g}") for s in schedules]
                kls = []
            for mode in ("sampled", "greedy"):
                seatings = [(0, 1) if i % 2 == 0 else (1, 0) for i in range(args.eval_games)]
                scores = play(game, policies, seatings, np.random.default_rng(10**6 + step),
                              torch.Generator().manual_seed(step), mode == "greedy",
                              playable=args.playable)["scores"]
                point[mode] = round(float(np.mean(scores)), 4)
            curve.append(point)
        if step == args.steps:
            break
        seatings = [(0, 1) if (i // 4) % 2 == 0 else (1, 0) for i in range(args.games)]
        batch = play(game, policies, seatings, rng, torch_rng, critic=critic,
                     playable=args.playable)
        rows = {0: [], 1: []}  # agent -> (obs, mask, action, advantage)
        figures = {}  # agent -> what the trainer's metrics would hold for its schedule
        critic_rows = []
        for group in range(args.games // 4):
            for seat in (0, 1):
                trajectories = [batch["moves"][(g, seat)] for g in range(4 * group, 4 * group + 4)]
                if estimator == "grpo":
                    advantage = group_relative(np.array([sum(m["reward"] for m in t)
                                                         for t in trajectories]))
                for k, moves in enumerate(trajectories):
                    if estimator == "grpo":
                        advantages = [float(advantage[k])] * len(moves)
                    elif estimator == "rtg":
                        advantages = reward_to_go([m["reward"] for m in moves], args.gamma)
                    else:
                        values = [m["value"] for m in moves]
                        advantages = gae([m["reward"] for m in moves], values, args.lam)
                        critic_rows += [(m["global"], a + v) for m, a, v in
                                        zip(moves, advantages, values, strict=True)]
                    agent = seatings[4 * group + k][seat]
                    rows[agent] += [(m["obs"], m["mask"], m["action"], a)
                                    for m, a in zip(moves, advantages, strict=True)]
        for agent, policy in enumerate(policies):
            if not rows[agent]:
                continue
            obs = torch.stack([r[0] for r in rows[agent]])
            mask = torch.stack([r[1] for r in rows[agent]])
            action = torch.tensor([r[2] for r in rows[agent]])
            advantage = np.array([r[3] for r in rows[agent]])
            if estimator == "rtg":
                advantage = whiten(advantage)
            advantage = torch.tensor(advantage, dtype=torch.float32)
            kl = update(policy, optims[agent], obs, mask, action, advantage, bonus, args,
                        torch_rng)
            kls += [] if kl is None else [kl]
            figures[agent] = {"optimizer_steps": args.minibatches, "approx_kl": kl or 0.0}
        if critic is not None and critic_rows:
            inputs = torch.stack([r[0] for r in critic_rows])
            targets = torch.tensor([r[1] for r in critic_rows], dtype=torch.float32)
            value_loss = (critic(inputs)[:, 0] - targets).square().mean()
            critic_optim.zero_grad()
            value_loss.backward()
            critic_optim.step()
        step_schedules(dict(enumerate(schedules)), figures)  # as the trainer: the KL, then the step
        if critic_schedule is not None:
            critic_schedule.step()
    return {"setting": setting, "seed": seed, "games": args.games, "steps": args.steps,
            "params": args.params, "lr": args.lr, "minibatches": args.minibatches,
            "target_kl": args.target_kl,
            "seconds": round(time.perf_counter() - start, 1), "curve": curve}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+",
                        default=["grpo:0.05", "grpo:0", "mappo:0", "mappo:0.05"],
                        help="ESTIMATOR:BONUS, estimator grpo, rtg or mappo, BONUS the legal-move "
                             "entropy weight")
    parser.add_argument("--games", type=int, default=128, help="games a step (groups of 4)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--critic_lr", type=float, default=1e-3)
    parser.add_argument("--lam", type=float, default=0.95)
    parser.add_argument("--gamma", type=float, default=0.9, help="rtg's discount per move")
    parser.add_argument("--schedule", choices=("linear", "constant"), default="linear",
                        help="the rate decayed linearly to 0 at the last step, or held")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--minibatches", type=int, default=1,
                        help="Adam steps per rollout, each on a shuffled share of an agent's "
                             "rows, PPO-clipped (1: the recipes' one step, ratio 1)")
    parser.add_argument("--clip", type=float, default=0.2, help="PPO's clip (minibatches > 1)")
    parser.add_argument("--target_kl", type=float, default=0.0,
                        help="steer each policy's rate by its approx_kl (team.optim.target_kl; "
                             "minibatches > 1); 0: the schedule alone")
    parser.add_argument("--eval_every", type=int, default=25)
    parser.add_argument("--eval_games", type=int, default=400)
    parser.add_argument("--playable", action="store_true", help="add the flags the "
                        "hanabi_words prompt shows (each card playable now or not)")
    parser.add_argument("--params", type=json.loads, default={},
                        help='game parameters over the example\'s, e.g. \'{"max_life_tokens": 3}\'')
    args = parser.parse_args()
    if args.playable and "hand_size" in args.params:
        parser.error("--playable reads the example's hand size: leave hand_size out of --params")
    if not 0.0 <= args.gamma <= 1.0:
        parser.error(f"--gamma {args.gamma}: must be in [0, 1]")
    if args.minibatches < 1:
        parser.error(f"--minibatches {args.minibatches}: must be >= 1")
    if args.target_kl and args.minibatches < 2:
        parser.error(f"--target_kl {args.target_kl}: needs --minibatches >= 2 (one step's "
                     "approx_kl is 0)")
    if args.games % 4:
        parser.error(f"--games {args.games}: must be a multiple of 4 (groups of 4)")
    for setting in args.settings:
        if setting.split(":")[0] not in ("grpo", "rtg", "mappo") or ":" not in setting:
            parser.error(f"--settings {setting!r}: expected grpo:BONUS, rtg:BONUS or "
                         f"mappo:BONUS")
    torch.set_num_threads(1)
    for setting in args.settings:
        runs = [run(setting, seed, args) for seed in range(args.seeds)]
        for result in runs:
            print(json.dumps(result), flush=True)
        last = [r["curve"][-1] for r in runs]
        print(json.dumps({"setting": setting, "seeds": args.seeds, "steps": args.steps,
                          "games": args.games,
                          **{mode: [round(x, 4) for x in t_interval([p[mode] for p in last])]
                             for mode in ("sampled", "greedy")}}), flush=True)


if __name__ == "__main__":
    main()
