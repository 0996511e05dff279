"""Advantage normalisation per agent (optionally per agent and seat, or per agent and group).

Statistics are taken over response tokens only, separately for every key; every key contains
the agent id, so one agent's rows never move another agent's normalised advantages (DESIGN.md,
invariant 1). Standard deviations are population ones (divide by the count, not count - 1).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from roll.batch import TrajectoryBatch

NormMode = Literal["none", "mean", "whiten"]
NormBy = Literal["agent", "agent_seat", "agent_group"]
NORM_MODES: tuple[str, ...] = ("none", "mean", "whiten")
NORM_BY: tuple[str, ...] = ("agent", "agent_seat", "agent_group")


def group_index(*columns: Tensor) -> Tensor:
    """Dense index (B,) long of the distinct tuples formed by equal-length (B,) columns."""
    stacked = torch.stack([column.long() for column in columns], dim=1)  # (B, K)
    return torch.unique(stacked, dim=0, return_inverse=True)[1]


def normalization_keys(batch: TrajectoryBatch, by: NormBy = "agent") -> Tensor:
    """Key (B,) long of the statistics group of each row.

    ``"agent"``: one group per ``agent_id``; ``"agent_seat"``: per (agent, seat);
    ``"agent_group"``: per (agent, group_id), i.e. per agent and game/prompt.
    """
    if by == "agent":
        return group_index(batch.agent_id)
    if by == "agent_seat":
        batch.require("seat")
        return group_index(batch.agent_id, batch.seat)
    if by == "agent_group":
        batch.require("group_id")
        return group_index(batch.agent_id, batch.group_id)
    raise ValueError(f"normalisation key must be one of {NORM_BY}, got {by!r}")


def normalize_advantages(
    advantages: Tensor,
    response_mask: Tensor,
    keys: Tensor,
    mode: NormMode = "whiten",
    eps: float = 1e-6,
) -> Tensor:
    """Centre (``"mean"``) or whiten (``"whiten"``) advantages within each key.

    Args:
        advantages: (B, T) per-token advantages.
        response_mask: (B, T) 1 on response tokens; only they enter the statistics.
        keys: (B,) long statistics group per row (see ``normalization_keys``); must contain the
            agent id so agents stay independent.
        mode: ``"none"`` (unchanged), ``"mean"`` (A - mean), ``"whiten"`` ((A - mean)/(std + eps)).
        eps: added to the std before dividing.

    Returns:
        (B, T) normalised advantages, zero outside ``response_mask``.
    """
    if mode not in NORM_MODES:
        raise ValueError(f"normalisation mode must be one of {NORM_MODES}, got {mode!r}")
    keep = response_mask.bool()
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    masked = torch.where(keep, advantages, zero)  # (B, T)
    if mode == "none":
        return masked
    n_keys = int(keys.max()) + 1 if keys.numel() else 0
    count = torch.zeros(n_keys, dtype=advantages.dtype, device=advantages.device)
    count.index_add_(0, keys, keep.sum(dim=1).to(advantages.dtype))  # (K,) tokens per key
    total = torch.zeros_like(count).index_add_(0, keys, masked.sum(dim=1))
    mean = total / count.clamp(min=1)  # (K,)
    centred = torch.where(keep, advantages - mean[keys].unsqueeze(1), zero)  # (B, T)
    if mode == "mean":
        return centred
    sq = torch.zeros_like(count).index_add_(0, keys, centred.square().sum(dim=1))
    std = (sq / count.clamp(min=1)).sqrt()  # (K,) population std
    return centred / (std[keys].unsqueeze(1) + eps)
