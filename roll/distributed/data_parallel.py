"""Data-parallel gradient sharing over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

``MultiAgentTrainer`` (roll/multi_agent/trainer.py) splits each agent's mini-batch across ranks
and its strategy asks a ``GradSync`` (roll/multi_agent/strategy.py) for the sum of the round's
gradients; this is that sum. We sum the
adapters' gradients by hand instead of wrapping the model in ``DistributedDataParallel``: each
round touches a different subset of agents (DDP's buckets assume every step reduces the same
parameters), and one flat all-reduce per round is all the traffic LoRA needs (a few MB).
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
from torch import Tensor


def free_port() -> int:
    """A TCP port free on every interface of this host now (for the rendezvous of the ranks:
    ranks on other nodes connect to it through this host's network address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def init_ranks(rank: int, world_size: int, address: str, device: str) -> None:
    """Join the process group of ``world_size`` ranks rendezvousing at ``address``
    ("host:port"): NCCL when the trainer runs on CUDA, gloo otherwise."""
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{address}", rank=rank,
                            world_size=world_size)


class TorchDistributedSync:
    """``GradSync`` over the default process group."""

    def __init__(self) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._gloo = dist.get_backend() == "gloo"

    def all_reduce(self, flat: Tensor) -> Tensor:
        buffer = flat.cpu() if self._gloo else flat  # gloo reduces CPU tensors
        dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
        return buffer.to(flat.device)

    def broadcast(self, tensors: list[Tensor], src: int = 0) -> None:
        """Overwrite ``tensors`` on every rank with rank ``src``'s values (in place)."""
        for tensor in tensors:
            buffer = tensor.detach().cpu() if self._gloo else tensor.detach()
            dist.broadcast(buffer, src=src)
            with torch.no_grad():
                tensor.copy_(buffer.to(tensor.device))
