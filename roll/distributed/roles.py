"""The trainer role as the pipeline sees it, whichever backend holds its ranks.

A ``TrainGroup`` updates every agent's adapter from one mixed batch (``train_step``) and leaves
the new adapters in the pipeline's own ``MultiAgentLoRAModel`` afterwards, which serves the
rollout engine, the old/reference log-probs and the checkpoints. ``LocalTrainGroup`` (a
``MultiAgentTrainer`` with the default torch strategy) is the local group: it trains that very
model in this process. ``RayTrainGroup`` (ray_train.py) keeps ``world_size`` data-parallel
replicas in Ray actors and copies the updated adapter tensors back (through the object store)
after each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from roll.batch import TrajectoryBatch
from roll.inference.base import InferenceEngine
from roll.multi_agent.config import AgentConfig, CriticConfig, TrainerConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.trainer import MultiAgentTrainer


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
    zero3_live_elements: int | None = None
    """ZeRO-3: the most elements gathered at once and prefetched (``actor_train.*``)."""
    tf32: bool = True
    """On CUDA, float32 matmuls use TensorFloat-32 (``model.tf32``)."""
    critic: CriticConfig | None = None
    """The run's critics (``critic.*``), built on every rank beside the agents; None or mode
    'none': no critics."""
    measure_resident: bool = False
    """Each rank records the most parameter elements it held at once, while loading and in
    every step after (roll/distributed/resident.py; for tests and benchmarks: it costs a
    census of the parameters per module call)."""


class TrainGroup(Protocol):
    """What the pipeline calls on its trainer."""

    global_step: int

    def logprob_passes(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch`` with its old log-probs (and over moves, and reference ones, as the trainer
        config asks) under the adapters as they are now: the no-grad passes, run where the
        train role runs (Ray: each rank on its share of the rows)."""
        ...

    agent_names: list[str]

    def policy_logprobs(self, batch: TrajectoryBatch, temperature: float) -> Tensor:
        """(B, T) log-probs of ``batch``'s response tokens, each row under its agent's adapter
        as it is now, at ``temperature``, where the train role runs (Ray: each rank on its
        share of the rows)."""
        ...

    def train_step(self, batch: TrajectoryBatch) -> dict[str, dict[str, float]]:
        """Update every agent that has rows; afterwards the pipeline's model holds the new
        adapters. Returns metrics keyed by agent name."""
        ...

    def hold(self) -> None:
        """Remember every agent's adapters, optimizer states and the step counter."""
        ...

    def rollback(self) -> None:
        """Undo every train step since ``hold`` (the pipeline's model too)."""
        ...

    def release(self) -> None:
        """Keep the steps taken since ``hold``."""
        ...

    def state_dict(self) -> dict:
        """Optimizers, schedulers, step counter (adapters are saved from the model)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Resume: the pipeline's model already holds the checkpoint's adapters."""
        ...


@torch.no_grad()
def response_logprobs(model: MultiAgentLoRAModel, batch: TrajectoryBatch, temperature: float,
                      forward_rows: int | None) -> Tensor:
    """(B, T) log-probs of ``batch``'s response tokens (``response_mask``), each row under its
    own agent's adapter as it is now, at ``temperature``, in forwards of ``forward_rows`` rows,
    on the model's device: what HAPPO's ratios and the exploitability tables read."""
    batch = batch.to(model.base_model.get_input_embeddings().weight.device)
    return model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id,
                          positions=batch.response_mask.bool(), temperature=temperature,
                          forward_rows=forward_rows)


class LocalTrainGroup(MultiAgentTrainer):
    """This process trains the pipeline's own model (``cluster.backend=local``)."""

    def policy_logprobs(self, batch: TrajectoryBatch, temperature: float) -> Tensor:
        return response_logprobs(self.model, batch, temperature, self.config.forward_rows)

    def close(self) -> None:
        """Nothing to release."""


def push_adapters(
    engine: InferenceEngine,
    model: MultiAgentLoRAModel,
    version: int,
    agents: list[str] | None = None,
) -> None:
    """Sync agents' adapters from the trainer's model into same-named engine slots.

    Only adapter tensors travel (DESIGN.md invariant 3); afterwards
    ``engine.adapter_version(name) == version`` for each synced agent.
    """
    for name in agents if agents is not None else model.agent_names:
        engine.load_adapter(name, model.export_adapter(name), model.peft_config(name), version)
