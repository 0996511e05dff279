"""Host <-> device copies that do not make the host wait for the GPU.

A plain host -> CUDA copy of pageable memory synchronises the stream (the host waits for every
kernel already launched), and so does every device -> host read. In a step whose host launches
work ahead of the GPU, each such wait empties the queue: these helpers stage host values in
pinned memory and copy them asynchronously, in stream order (the pinned block is not reused
before its copy has run), and read many device tensors back in one transfer. Measured sites:
``benchmarks/learning.py --sync_step``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def to_device(tensor: Tensor, device: torch.device | str) -> Tensor:
    """``tensor`` on ``device``: a CPU tensor goes to CUDA through pinned memory without
    waiting; anything else as ``Tensor.to`` does it (no copy when it is already there)."""
    device = torch.device(device)
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def upload(values, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """Host values (a list or a CPU tensor) -> a ``dtype`` tensor on ``device``, without
    waiting for the device (``to_device``)."""
    return to_device(torch.as_tensor(values, dtype=dtype), device)


def host_copies(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Detached CPU copies of ``tensors`` (each its own storage, as ``.to("cpu", copy=True)``
    gives), read from each device in one transfer per dtype instead of one per tensor."""
    out: list[Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, tensor in enumerate(tensors):  # (host tensors take the same path: tested)
        groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    for indices in groups.values():
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in indices]).cpu()
        for i, part in zip(indices, flat.split([tensors[i].numel() for i in indices]),
                           strict=True):
            out[i] = part.view(tensors[i].shape).clone()
    return out  # type: ignore[return-value]


__all__ = ["host_copies", "to_device", "upload"]
