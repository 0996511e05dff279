"""Rows -> trajectories: the plumbing every advantage estimator shares.

A trajectory is the rows that share ``env_id`` and ``seat`` (one seat's turns in one episode),
taken in ``turn`` order; the rows of the batch may come in any order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from roll.algorithms.normalize import group_index
from roll.batch import TrajectoryBatch


def trajectories(batch: TrajectoryBatch) -> tuple[Tensor, Tensor, int]:
    """Trajectory index (B,), turn rank (B,) within the trajectory, number of trajectories.

    Rank is the row's position among its trajectory's rows sorted by ``turn`` (0, 1, ...).
    """
    batch.require("env_id", "seat", "turn")
    traj = group_index(batch.env_id, batch.seat)  # (B,)
    n_traj = int(traj.max()) + 1 if len(batch) else 0
    by_turn = torch.sort(batch.turn, stable=True).indices
    order = by_turn[torch.sort(traj[by_turn], stable=True).indices]  # by (trajectory, turn)
    sorted_traj, sorted_turn = traj[order], batch.turn[order]
    repeated = (sorted_traj[1:] == sorted_traj[:-1]) & (sorted_turn[1:] == sorted_turn[:-1])
    if repeated.any():
        row = int(order[1:][repeated][0])
        raise ValueError(
            f"two rows share env_id={int(batch.env_id[row])}, seat={int(batch.seat[row])}, "
            f"turn={int(batch.turn[row])}"
        )
    count = torch.bincount(traj, minlength=n_traj)  # (N,)
    start = torch.cumsum(count, 0) - count  # first sorted position of each trajectory
    rank = torch.empty_like(traj)
    rank[order] = torch.arange(len(batch), device=traj.device) - start[sorted_traj]
    return traj, rank, n_traj


def pack(x: Tensor, traj: Tensor, pos: Tensor, n_traj: int) -> Tensor:
    """Scatter entries x (M,) to a zero-padded (N, L) matrix at (traj, pos)."""
    length = int(pos.max()) + 1 if pos.numel() else 0
    packed = torch.zeros(n_traj, length, dtype=x.dtype, device=x.device)
    packed[traj, pos] = x
    return packed


def reverse_discounted_cumsum(x: Tensor, discount: float) -> Tensor:
    """y[:, t] = x[:, t] + discount * y[:, t + 1] for x (N, L), with y[:, L] = 0.

    Rows are packed from the left and zero-padded, so padding contributes nothing.
    """
    out = torch.zeros_like(x)
    running = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)  # (N,)
    for t in reversed(range(x.shape[1])):  # a loop over time, vectorised over trajectories
        running = x[:, t] + discount * running
        out[:, t] = running
    return out


def on_response(per_row: Tensor, response_mask: Tensor) -> Tensor:
    """Broadcast (B,) to (B, T), zero outside the response."""
    return torch.where(response_mask.bool(), per_row.unsqueeze(1), 0.0)


def trajectory_returns(batch: TrajectoryBatch) -> tuple[Tensor, Tensor, int]:
    """Trajectory index (B,), each trajectory's undiscounted return (N,), N."""
    traj, _, n_traj = trajectories(batch)
    episode_return = torch.zeros(n_traj, dtype=batch.rewards.dtype, device=batch.rewards.device)
    episode_return.index_add_(0, traj, batch.rewards)  # (N,)
    return traj, episode_return, n_traj


def per_unit(unit: Tensor, row_key: Tensor, n_units: int, name: str) -> Tensor:
    """The value of ``row_key`` (B,) for each unit (N,) of rows ``unit`` (B,); a unit whose
    rows disagree is a ValueError naming ``name``."""
    per_unit = torch.zeros(n_units, dtype=torch.long, device=unit.device)
    per_unit[unit] = row_key
    if (per_unit[unit] != row_key).any():
        raise ValueError(f"rows of one {name} carry different group_id values")
    return per_unit
