"""The trainer role as the pipeline sees it, whichever backend holds its ranks.

A ``TrainGroup`` updates every agent's adapter from one mixed batch (``train_step``) and leaves
the new adapters in the pipeline's own ``MultiAgentLoRAModel`` afterwards, which serves the
rollout engine, the old/reference log-probs and the checkpoints. ``MultiAgentTrainer`` is the
local group (it trains that very model in this process); ``RayTrainGroup`` (ray_backend.py) keeps
``world_size`` data-parallel replicas in Ray actors and copies the updated adapter tensors back
(through the object store) after each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from roll.batch import TrajectoryBatch
from roll.multi_agent.config import AgentConfig, TrainerConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.worker import MultiAgentTrainer


class RoleFailed(RuntimeError):
    """A role's actor died or raised; the message is one line naming the role and rank."""


@dataclass(frozen=True)
class TrainSpec:
    """Everything a rank needs to build the team and its trainer by itself."""

    model_path: str
    """Local folder (or hub id) of the frozen base."""
    dtype: str
    device: str
    """Device kind of each rank ("cpu" or "cuda"; a Ray rank gets its own GPU as cuda:0)."""
    agents: tuple[AgentConfig, ...]
    trainer: TrainerConfig
    seed: int
    temperature: float
    """The rollouts' sampling temperature (the trainer's log-probs are taken at it)."""
    strategy: str = "torch"
    """How the ranks train: 'torch' (gradient all-reduce, per-agent AdamW on every rank) or
    'deepspeed' (the same gradients, the optimizer sharded by a ZeRO engine)."""
    zero_stage: int = 2
    """ZeRO stage of the 'deepspeed' strategy (2 or 3)."""


class TrainGroup(Protocol):
    """What the pipeline calls on its trainer."""

    global_step: int

    def train_step(self, batch: TrajectoryBatch) -> dict[str, dict[str, float]]:
        """Update every agent that has rows; afterwards the pipeline's model holds the new
        adapters. Returns metrics keyed by agent name."""
        ...

    def state_dict(self) -> dict:
        """Optimizers, schedulers, step counter (adapters are saved from the model)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Resume: the pipeline's model already holds the checkpoint's adapters."""
        ...


class LocalTrainGroup(MultiAgentTrainer):
    """This process trains the pipeline's own model (``cluster.backend=local``)."""

    def close(self) -> None:
        """Nothing to release."""


def build_train_group(spec: TrainSpec, model: MultiAgentLoRAModel, backend: str,
                      world_size: int = 1, cpus_per_rank: float = 1.0,
                      gpus_per_rank: float = 0.0, shared=None) -> TrainGroup:
    """The trainer for ``cluster.backend``: local (``world_size`` 1) or Ray actors (in the
    bundles ``shared`` with the engines when colocated)."""
    if backend == "local":
        if world_size != 1:
            raise ValueError(f"actor_train.world_size={world_size}: the local backend runs "
                             f"one rank; use cluster.backend=ray")
        return LocalTrainGroup(model, list(spec.agents), spec.trainer, spec.temperature)
    if backend == "ray":
        from roll.distributed.ray_backend import RayTrainGroup

        return RayTrainGroup(spec, model, world_size, cpus_per_rank, gpus_per_rank, shared)
    raise ValueError(f"cluster.backend={backend!r}: must be 'local' or 'ray'")
