"""Advantage estimators: turn rewards -> per-token advantages and returns.

Every estimator has the same signature, ``fn(batch, cfg) -> (advantages, returns)``, both (B, T)
and zero outside ``batch.response_mask``, and is found by name in a registry
(``get_advantage_estimator``). ``compute_advantages`` runs the configured estimator and then the
optional per-agent normalisation of ``roll.algorithms.normalize``. One estimator keeps state
between steps: ``rae`` reads and updates ``RunningBaselines`` (the run saves them in its
checkpoints), so ``compute_advantages`` takes them as an argument.

A trajectory is the rows that share ``env_id`` and ``seat`` (one seat's turns in one episode),
taken in ``turn`` order; the rows of the batch may come in any order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from roll.algorithms.happo_ratios import HAPPO_LOG_RATIOS
from roll.algorithms.normalize import (
    NORM_BY,
    NORM_MODES,
    group_index,
    normalization_keys,
    normalize_advantages,
)
from roll.algorithms.trajectories import (
    on_response,
    pack,
    per_unit,
    reverse_discounted_cumsum,
    trajectories,
    trajectory_returns,
)
from roll.batch import TrajectoryBatch
from roll.errors import ConfigError

AdvantageFn = Callable[[TrajectoryBatch, "AdvantageConfig"], tuple[Tensor, Tensor]]
_ESTIMATORS: dict[str, AdvantageFn] = {}


@dataclass
class AdvantageConfig:
    """How rewards become advantages (the run's ``advantage``). Checked on construction;
    errors name the key ``advantage.<field>``."""

    estimator: str = "grpo"
    """Registered estimator name: "reinforce", "grpo", "magrpo", "gae", "ippo", "mappo",
    "happo", "vdn", or one you registered first (gae, ippo, mappo, happo and vdn read the
    critics' values: critic.mode; happo also updates the agents one after another,
    roll/algorithms/happo_ratios.py)."""
    gamma: float = 1.0
    """Discount in [0, 1]: per turn for REINFORCE, per response token for GAE; unused by GRPO."""
    lam: float = 1.0
    """GAE lambda in [0, 1] (1: Monte-Carlo returns minus values; 0: one-step TD error)."""
    grpo_scale_by_std: bool = True
    """GRPO: divide by the group's std. False gives Dr. GRPO (Liu et al. 2025): centring only."""
    norm: str = "none"
    """Normalisation after the estimator: "none", "mean" (centre) or "whiten" (centre, /std)."""
    norm_by: str = "agent"
    """Statistics groups of the normalisation: "agent", "agent_seat" or "agent_group"."""
    eps: float = 1e-6
    """Added to a std before dividing by it (GRPO and whitening); > 0."""
    happo_factor_clip: float | None = 2.0
    """HAPPO: the factor M of the agents updated before one is clipped to [1/c, c] for this c
    (> 1); null: unbounded, as in the paper (roll/algorithms/happo_ratios.py says why not)."""
    happo_log_ratio: str = "sum"
    """HAPPO: an earlier turn's log-ratio in M is the "sum" over its response tokens (the
    turn's joint ratio, as the paper's product) or their "token_mean" (length-normalised:
    the geometric mean of its per-token ratios; happo_ratios.py says why)."""
    drop_zero_advantage: bool = False
    """Rows whose advantage is 0 on every response token (e.g. a GRPO group of equal returns)
    leave the policy update, as in DAPO's dynamic sampling (without its resampling): they
    would only dilute the token-mean and add KL/entropy terms. ``<agent>/zero_adv_fraction``
    still counts them; ``<agent>/dropped_rows`` says how many left. Critics keep every row."""
    rae_decay: float = 0.95
    """RAE: weight of the old baseline in its update, b <- decay * b + (1 - decay) * (mean
    return of the agent's trajectories in that seat this step); in [0, 1)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> AdvantageConfig:
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"advantage.{name}", value, "must be in [0, 1]")
        if self.happo_factor_clip is not None and not self.happo_factor_clip > 1.0:
            raise ConfigError("advantage.happo_factor_clip", self.happo_factor_clip,
                              "must be > 1 (M is kept in [1/c, c]) or null (unbounded)")
        if self.happo_log_ratio not in HAPPO_LOG_RATIOS:
            raise ConfigError("advantage.happo_log_ratio", self.happo_log_ratio,
                              f"must be one of {HAPPO_LOG_RATIOS}")
        if not 0.0 <= self.rae_decay < 1.0:
            raise ConfigError("advantage.rae_decay", self.rae_decay, "must be in [0, 1)")
        if not self.eps > 0.0:
            raise ConfigError("advantage.eps", self.eps, "must be > 0")
        if self.norm not in NORM_MODES:
            raise ConfigError("advantage.norm", self.norm, f"must be one of {NORM_MODES}")
        if self.norm_by not in NORM_BY:
            raise ConfigError("advantage.norm_by", self.norm_by, f"must be one of {NORM_BY}")
        if self.estimator not in _ESTIMATORS:
            raise ConfigError("advantage.estimator", self.estimator,
                              f"must be one of {sorted(_ESTIMATORS)}")
        return self


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding an estimator ``fn(batch, cfg) -> (advantages, returns)`` under ``name``."""

    def add(fn: AdvantageFn) -> AdvantageFn:
        if name in _ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        _ESTIMATORS[name] = fn
        return fn

    return add


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The estimator registered under ``name``; the error lists the known names."""
    if name not in _ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(_ESTIMATORS)}")
    return _ESTIMATORS[name]


def compute_advantages(batch: TrajectoryBatch, cfg: AdvantageConfig,
                       baselines: RunningBaselines | None = None) -> TrajectoryBatch:
    """Run ``cfg.estimator`` then ``cfg.norm``; a copy of ``batch`` with advantages and returns.

    Returns are the estimator's, never normalised (they are value targets). ``baselines``: the
    run's running baselines, read and updated by the ``rae`` estimator (required by it).
    """
    if cfg.estimator == "rae":
        if baselines is None:
            raise ValueError("advantage.estimator=rae keeps running baselines between steps: "
                             "pass compute_advantages(..., baselines=RunningBaselines(...))")
        advantages, returns = rae(batch, cfg, baselines)
    else:
        advantages, returns = get_advantage_estimator(cfg.estimator)(batch, cfg)
    if cfg.norm != "none":
        keys = normalization_keys(batch, cfg.norm_by)
        advantages = normalize_advantages(advantages, batch.response_mask, keys, cfg.norm, cfg.eps)
    return batch.with_fields(advantages=advantages, returns=returns)


def zero_advantage_rows(batch: TrajectoryBatch) -> Tensor:
    """(B,) bool: the rows whose every response token has advantage exactly 0 (nothing to
    learn from them: a group-relative baseline over equal returns, say)."""
    batch.require("advantages")
    return ((batch.advantages * batch.response_mask) != 0).sum(dim=-1) == 0


def zero_advantage_shares(zero: Tensor, agent_id: Tensor, agent_names: list[str]
                          ) -> dict[str, dict[str, float]]:
    """Per agent with rows, from ``zero`` (B,) = ``zero_advantage_rows(batch)`` and the rows'
    ``agent_id`` (B,): ``zero_adv_fraction``, the share of its rows with advantage 0 on every
    response token, and ``zero_adv_rows``, how many (one device->host copy)."""
    agents = len(agent_names)
    rows = torch.bincount(agent_id, minlength=agents)
    zeros = torch.bincount(agent_id[zero], minlength=agents)
    counts = torch.stack([rows, zeros]).tolist()
    return {name: {"zero_adv_fraction": counts[1][index] / counts[0][index],
                   "zero_adv_rows": float(counts[1][index])}
            for index, name in enumerate(agent_names) if counts[0][index]}


# --- estimators -------------------------------------------------------------------------------


@register_advantage("reinforce")
def reinforce(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """REINFORCE (Williams 1992) with turn-level reward-to-go.

    G_t = sum_{k >= t} gamma^(k - t) r_k over the turns of a trajectory (t, k count the
    trajectory's rows in turn order); every response token of turn t gets G_t. No baseline:
    use ``cfg.norm = "mean"`` or ``"whiten"`` for one. Advantages and returns are both G_t, (B, T).
    """
    batch.require("rewards")
    traj, rank, n_traj = trajectories(batch)
    rewards = pack(batch.rewards, traj, rank, n_traj)  # (N, turns)
    reward_to_go = reverse_discounted_cumsum(rewards, cfg.gamma)[traj, rank]  # (B,)
    returns = on_response(reward_to_go, batch.response_mask)
    return returns, returns.clone()


def _group_relative(values: Tensor, group: Tensor, cfg: AdvantageConfig) -> Tensor:
    """(values - group mean) / (group std + eps) for values (N,) in groups (N,) numbered
    0..G-1 (population std; ``grpo_scale_by_std=False``: centring only); exactly 0 in a group
    of one or whose values are all equal."""
    n_groups = int(group.max()) + 1 if group.numel() else 0
    size = torch.bincount(group, minlength=n_groups).to(values.dtype)  # (G,)
    total = torch.zeros_like(size).index_add_(0, group, values)
    centred = values - (total / size)[group]  # (N,)
    low = size.new_full((n_groups,), float("inf")).scatter_reduce(0, group, values, "amin")
    high = size.new_full((n_groups,), -float("inf")).scatter_reduce(0, group, values, "amax")
    # Exactly 0 for constant groups: float rounding of the mean must not become a signal.
    centred = torch.where((low == high)[group], torch.zeros_like(centred), centred)
    if cfg.grpo_scale_by_std:
        var = torch.zeros_like(size).index_add_(0, group, centred.square()) / size
        centred = centred / (var.sqrt()[group] + cfg.eps)
    return centred


@register_advantage("grpo")
def grpo(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath, sec. 4.1.2), per seat.

    Simplification, stated: a trajectory's return R is the UNDISCOUNTED sum of its turn rewards
    (``cfg.gamma`` is unused), and every response token of every turn of the trajectory gets the
    same advantage. R is normalised among the trajectories (not rows) sharing ``group_id`` AND
    ``seat``: A = (R - mean) / (std + eps), population std; with ``cfg.grpo_scale_by_std=False``
    A = R - mean (Dr. GRPO). A group of one trajectory, or whose returns are all equal, gives 0.
    Returns (B, T) are R on the response tokens.
    """
    batch.require("rewards", "group_id")
    traj, episode_return, n_traj = trajectory_returns(batch)
    group = per_unit(traj, group_index(batch.group_id, batch.seat), n_traj,
                      "trajectory (env_id, seat)")
    centred = _group_relative(episode_return, group, cfg)
    advantages = on_response(centred[traj], batch.response_mask)
    returns = on_response(episode_return[traj], batch.response_mask)
    return advantages, returns


def _joint_returns(batch: TrajectoryBatch) -> tuple[Tensor, Tensor, int, Tensor, Tensor]:
    """The team's joint return per episode: trajectory index (B,), number of trajectories N,
    episode index (B,), the episode of each trajectory (N,), and the joint return J (E,) = the
    MEAN of the episode's trajectories' undiscounted returns (the seats in the batch)."""
    traj, trajectory_return, n_traj = trajectory_returns(batch)
    episode = group_index(batch.env_id)  # (B,)
    n_episodes = int(episode.max()) + 1 if len(batch) else 0
    episode_of_traj = per_unit(traj, episode, n_traj, "trajectory")  # (N,)
    seats = torch.bincount(episode_of_traj, minlength=n_episodes).to(trajectory_return.dtype)
    joint = torch.zeros_like(seats).index_add_(0, episode_of_traj, trajectory_return) / seats
    return traj, n_traj, episode, episode_of_traj, joint


@register_advantage("magrpo")
def magrpo(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """MAGRPO (Liu et al. 2025, "LLM Collaboration With Multi-Agent Reinforcement Learning"):
    every agent of an episode gets the group-relative advantage of the team's joint return.

    The joint return J of an episode is the MEAN of its trajectories' undiscounted returns
    (every trained seat's turn rewards summed, then averaged over the seats in the batch, so a
    task that already pays every seat one joint reward has J = that reward). J is normalised
    among the episodes sharing ``group_id`` exactly as GRPO normalises returns, and every
    response token of every row of the episode gets that one advantage. Differs from ``grpo``
    only where seats' returns differ (e.g. the math team's roles): there each agent is pushed
    by the team's outcome, not its own. Returns (B, T) are J on the response tokens.
    """
    batch.require("rewards", "group_id")
    _, _, episode, _, joint = _joint_returns(batch)
    group = per_unit(episode, group_index(batch.group_id), len(joint), "episode (env_id)")
    centred = _group_relative(joint, group, cfg)  # (E,)
    advantages = on_response(centred[episode], batch.response_mask)
    returns = on_response(joint[episode], batch.response_mask)
    return advantages, returns


@register_advantage("gae")
def gae(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) across turns.

    The response tokens of a trajectory's turns, in turn order, form ONE token sequence (prompt
    and environment tokens between turns are part of the transition, not steps). Each turn's
    reward sits on that turn's last response token; ``values[:, t]`` is V of the state in which
    token t was generated. Then, over that sequence, with V = 0 after the last token of a
    finished episode:
        delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},
        returns_t = A_t + V_t.
    A truncated episode (``batch.truncated``: cut at ``max_turns`` or by a prompt too long)
    did not end there: its value after the last token is bootstrapped from the critic,
    V_{L} = V_{L-1}, the value of the trajectory's last scored state (the state after the cut
    was never shown to the critic; a prompt too long cannot be). ``gamma`` here discounts per
    response token. Every row needs >= 1 response token.
    """
    batch.require("rewards", "values")
    traj, rank, n_traj = trajectories(batch)
    keep = batch.response_mask.bool()  # (B, T)
    row_tokens = keep.sum(dim=1)  # (B,)
    if (row_tokens == 0).any():
        row = int(torch.nonzero(row_tokens == 0)[0])
        raise ValueError(f"GAE: row {row} has no response tokens to carry its turn reward")
    # Offset of each row in its trajectory's token sequence: tokens of the earlier turns.
    tokens_by_turn = pack(row_tokens, traj, rank, n_traj)  # (N, turns)
    offset = (torch.cumsum(tokens_by_turn, dim=1) - tokens_by_turn)[traj, rank]  # (B,)
    rank_in_row = torch.cumsum(keep.long(), dim=1) - 1  # (B, T)
    rows, cols = keep.nonzero(as_tuple=True)  # (M,) each, all response tokens
    seq_traj, seq_pos = traj[rows], offset[rows] + rank_in_row[rows, cols]
    is_last = rank_in_row[rows, cols] == row_tokens[rows] - 1
    values = batch.values.detach().to(batch.rewards.dtype)  # targets carry no gradient
    v = pack(values[rows, cols], seq_traj, seq_pos, n_traj)  # (N, L), zero-padded
    r = pack(torch.where(is_last, batch.rewards[rows], 0.0), seq_traj, seq_pos, n_traj)
    next_v = torch.cat([v[:, 1:], torch.zeros_like(v[:, :1])], dim=1)  # 0 after the end
    if batch.truncated is not None and bool(batch.truncated.any()):
        cut = torch.zeros(n_traj, dtype=torch.bool, device=v.device)
        cut[traj] = batch.truncated.bool()
        last = tokens_by_turn.sum(dim=1) - 1  # (N,) each trajectory's last position
        every = torch.arange(n_traj, device=v.device)
        next_v[every, last] = torch.where(cut, v[every, last], next_v[every, last])
    delta = r + cfg.gamma * next_v - v  # (N, L); 0 on the zero padding after a sequence
    seq_adv = reverse_discounted_cumsum(delta, cfg.gamma * cfg.lam)  # (N, L)
    advantages = torch.zeros_like(values)
    advantages[rows, cols] = seq_adv[seq_traj, seq_pos]
    returns = torch.where(keep, advantages + values, 0.0)
    return advantages, returns


@register_advantage("ippo")
def ippo(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """IPPO (de Witt et al. 2020, "Is Independent Learning All You Need in the StarCraft
    Multi-Agent Challenge?"): every agent is its own PPO learner with its own critic.

    The advantage is GAE (``gae``) over each seat's trajectory; what makes it IPPO is where
    ``values`` come from: each row's values are its own agent's critic's (critic.mode=
    per_agent, which the pipeline requires for this name), fitted on its own agent's returns
    only. Token-level values (each response token's state), as for ``gae``.
    """
    return gae(batch, cfg)


@register_advantage("mappo")
def mappo(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """MAPPO (Yu et al. 2022, "The Surprising Effectiveness of PPO in Cooperative Multi-Agent
    Games"): per-agent PPO policies with ONE centralised critic shared by every agent.

    The advantage is GAE (``gae``) over each seat's trajectory, with every row's values from
    the one shared critic (critic.mode=shared, which the pipeline requires for this name),
    fitted on every agent's returns. What the critic reads is ``critic.input``: the acting
    agent's own prompt ('local'), or that prompt plus every seat's observation ('global', the
    centralised state of the paper, hidden information included).
    """
    return gae(batch, cfg)


@register_advantage("happo")
def happo(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """HAPPO (Kuba et al. 2022): the advantage is GAE (``gae``) with the centralised critic's
    values (critic.mode=shared, as MAPPO); what makes it HAPPO is the update that follows —
    agents one after another in a random order, each agent's advantage weighted by the ratio of
    the agents updated before it (roll/algorithms/happo_ratios.py, driven by the pipeline).
    """
    return gae(batch, cfg)


@register_advantage("vdn")
def vdn(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """VDN (Sunehag et al. 2018, "Value-Decomposition Networks for Cooperative Multi-Agent
    Learning"): the team's value is the SUM of the agents' own values, fitted on the joint
    reward; each agent's advantage comes from its own value head.

    Simplification, stated — turn-based episodes and an actor-critic form (as VDAC-sum, Su et
    al. 2021, rather than VDN's Q-learning). Agents act at different times, so the decomposition
    is taken at each trajectory's start: V_i = agent i's critic's value before its first
    response token in the episode, V_tot = sum_i V_i over the episode's trajectories, and the
    team target is the joint return J (as ``magrpo``: the mean of the seats' undiscounted
    returns). Trajectory i is credited

        c_i = J - sum_{j != i} V_j          (what the others' heads do not already claim)

    on its last response token (its own turn rewards are replaced by c_i), and then ``gae``
    runs over its tokens with its OWN values. At its first token, with gamma = lam = 1, the
    advantage is c_i - V_i = J - V_tot (the team's error, the same for every agent) and the
    critic's target there is c_i, whose squared-error gradient w.r.t. V_i is V_tot - J: VDN's
    joint loss, each head taking its own gradient. Needs critic.mode=per_agent (one head per
    agent); with one trajectory per episode it is plain GAE on the return.
    """
    batch.require("rewards", "values")
    traj, n_traj, _, episode_of_traj, joint = _joint_returns(batch)
    _, rank, _ = trajectories(batch)
    response = batch.response_mask.bool()  # (B, T)
    first_token = torch.argmax(response.long(), dim=1)  # (B,) first response position
    row_value = batch.values.detach().to(joint.dtype)[torch.arange(len(batch)), first_token]
    first_turn = rank == 0
    value_first = torch.zeros(n_traj, dtype=joint.dtype, device=joint.device)
    value_first.index_add_(0, traj[first_turn], row_value[first_turn])  # (N,) V_i
    team_value = torch.zeros_like(joint).index_add_(0, episode_of_traj, value_first)  # (E,)
    credit = joint[episode_of_traj] - (team_value[episode_of_traj] - value_first)  # (N,) c_i
    turns = torch.bincount(traj, minlength=n_traj)  # (N,)
    last_turn = rank == turns[traj] - 1  # (B,)
    rewards = torch.where(last_turn, credit[traj], 0.0)
    return gae(batch.with_fields(rewards=rewards.to(batch.rewards.dtype)), cfg)


# --- role-conditioned advantage: a baseline that lives across steps ----------------------------


@dataclass
class RunningBaselines:
    """RAE's state: per (agent, seat) a running baseline of trajectory returns (a seat is a
    role: a zero-sum game's seats need baselines of their own, or one seat's wins would be
    centred against the other's losses)."""

    values: dict[str, float] = field(default_factory=dict)
    """``"<agent id>:<seat>"`` -> baseline; absent: 0 (no return seen yet)."""

    def state_dict(self) -> dict[str, float]:
        return dict(self.values)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.values = {str(key): float(value) for key, value in state.items()}


def rae(batch: TrajectoryBatch, cfg: AdvantageConfig,
        baselines: RunningBaselines) -> tuple[Tensor, Tensor]:
    """Role-conditioned advantage estimation (SPIRAL, Liu et al. 2025, eq. 5), per seat.

    A trajectory of agent k in seat s with undiscounted return R gets A = R - b_{k,s}, on every
    response token of every turn; b is READ BEFORE it is updated with this step's returns:
    b_{k,s} <- decay * b_{k,s} + (1 - decay) * mean(R over the step's trajectories of k in s).
    Simplification, stated: SPIRAL updates b after each trajectory; here once per step with the
    step's mean, so the result does not depend on the order of the rows. Returns (B, T) are R.
    """
    batch.require("rewards", "seat")
    traj, episode_return, n_traj = trajectory_returns(batch)
    agent = torch.zeros(n_traj, dtype=torch.long, device=traj.device)
    agent[traj] = batch.agent_id  # (N,): one seat of one episode is one agent
    seat = torch.zeros_like(agent)
    seat[traj] = batch.seat  # (N,)
    keys = [f"{a}:{s}" for a, s in zip(agent.tolist(), seat.tolist(), strict=True)]
    old = torch.tensor([baselines.values.get(key, 0.0) for key in keys],
                       dtype=episode_return.dtype, device=episode_return.device)
    advantages = on_response((episode_return - old)[traj], batch.response_mask)
    returns = on_response(episode_return[traj], batch.response_mask)
    sums: dict[str, list[float]] = {}
    for key, value in zip(keys, episode_return.tolist(), strict=True):
        sums.setdefault(key, []).append(value)
    for key, values in sums.items():
        mean = sum(values) / len(values)
        baselines.values[key] = (cfg.rae_decay * baselines.values.get(key, 0.0)
                                 + (1.0 - cfg.rae_decay) * mean)
    return advantages, returns


@register_advantage("rae")
def _rae_needs_baselines(batch: TrajectoryBatch, cfg: AdvantageConfig) -> tuple[Tensor, Tensor]:
    """``rae`` keeps state: run it through ``compute_advantages(..., baselines=...)``."""
    raise ValueError("advantage.estimator=rae keeps running baselines between steps: call "
                     "compute_advantages(batch, cfg, baselines=RunningBaselines())")
