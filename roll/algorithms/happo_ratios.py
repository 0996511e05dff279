"""HAPPO's sequential update, as pure functions (Kuba et al. 2022, "Trust Region Policy
Optimisation in Multi-Agent Reinforcement Learning", Algorithm 2).

Each step the agents are updated one after another in a fresh random order i_1 … i_n. Agent
i_m maximises the PPO surrogate with its advantage weighted by

    M^{i_{1:m}} = prod_{j < m} pi_new^{i_j}(a^{i_j} | s) / pi_old^{i_j}(a^{i_j} | s),

the ratio of the agents already updated this step (their new policies against the rollout's),
held fixed (no gradient) while i_m trains.

Simplification, stated — turn-based episodes. In the paper every agent acts at every timestep,
so the ratios multiply per timestep. Here agents take turns, so the joint action whose ratio
the factor carries is an EPISODE's: an earlier agent's ratio is the product over all of its
response tokens in that episode (every turn it took), and every row of a later agent in that
episode gets the same factor.

Departure, stated — a bounded factor. The paper's M is unbounded (each agent's own PPO clip
bounds its per-token ratios, not their product). A product over every response token of an
episode is not: 40 tokens at ratio 1.2 each give 1.5e3, and Hanabi runs logged a mean M of
5.7e6 (benchmarks/README.md). So M is clipped to [1/c, c] (``advantage.happo_factor_clip``
= c, default 2; null: the paper's unbounded factor), in log space before the exponential.

Option, stated — a length-normalised factor (``advantage.happo_log_ratio=token_mean``). With
the sum, M grows with the number of tokens an earlier agent wrote; measured on the math team
(benchmarks/README.md, "GRPO and the bounded HAPPO"), M sat at its bound 2 in most steps,
because a PPO step raises the probability of the tokens it trained on in most episodes, so it
mostly doubled the later agents' advantages. ``token_mean`` takes each earlier turn's MEAN
log-ratio over its response tokens (the geometric mean of its per-token ratios) and M the
product of those over the earlier turns of the episode: one token's worth of ratio per turn,
whatever the length. Not the paper's M; the clip still applies after it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from roll.algorithms.normalize import group_index


def happo_order(agent_names: Sequence[str], seed: int, step: int) -> list[str]:
    """The agents' update order at training step ``step``: a uniformly random permutation
    drawn from (run seed, step) alone, so a resumed run draws the same orders."""
    digest = hashlib.sha256(f"{seed}/happo/{step}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return [agent_names[i] for i in torch.randperm(len(agent_names), generator=generator)]


HAPPO_LOG_RATIOS = ("sum", "token_mean")
"""How a turn's log-ratio is formed from its tokens' (``advantage.happo_log_ratio``)."""


def episode_log_ratio(new_logprobs: Tensor, old_logprobs: Tensor, response_mask: Tensor,
                      reduce: str = "sum") -> Tensor:
    """(B,) log pi_new - log pi_old over each row's response tokens (inputs (B, T)): their
    sum (``reduce="sum"``: the log of the turn's joint ratio), or their mean
    (``"token_mean"``: the log of the geometric mean of its per-token ratios; 0 for a row
    without response tokens)."""
    if reduce not in HAPPO_LOG_RATIOS:
        raise ValueError(f"reduce={reduce!r}: must be one of {HAPPO_LOG_RATIOS}")
    mask = response_mask.to(new_logprobs.dtype)
    total = ((new_logprobs - old_logprobs) * mask).sum(dim=-1)
    if reduce == "token_mean":
        return total / mask.sum(dim=-1).clamp(min=1.0)
    return total


def happo_factors(log_ratio: Tensor, updated: Tensor, episode: Tensor,
                  clip: float | None = None) -> Tensor:
    """M per row (B,): exp of the summed ``log_ratio`` (B,) of the rows already ``updated``
    (B,) bool in the row's ``episode`` (B,) (1 where none is); detached. ``clip`` = c > 1
    bounds M to [1/c, c] (None: unbounded, as in the paper)."""
    index = group_index(episode)  # (B,) dense episode index
    per_episode = torch.zeros(int(index.max()) + 1 if len(index) else 0,
                              dtype=log_ratio.dtype, device=log_ratio.device)
    per_episode.index_add_(0, index, torch.where(updated, log_ratio, 0.0).detach())
    if clip is not None:
        bound = math.log(clip)
        per_episode = per_episode.clamp(-bound, bound)
    return torch.exp(per_episode[index])
