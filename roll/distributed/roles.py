"""The trainer role as the pipeline sees it, whichever backend holds its ranks.

A ``TrainGroup`` updates every agent's adapter from one mixed batch (``train_step``) and leaves
the new adapters in the pipeline's own ``MultiAgentLoRAModel`` afterwards, which serves the
rollout engine and the checkpoints. Every other forward of the team runs where the group
trains, each rank on its share of the rows: the old and reference log-probs
(``logprob_passes``), HAPPO's ratios (``policy_logprobs``), the agents' policy distance
(``divergence_rows``) and the legal-move log-probs at branching points, of the agents as they
are (the exploitability tables) or of a snapshot magnet (``choice_logprobs``); the helpers
below are their one implementation. ``LocalTrainGroup`` (a
``MultiAgentTrainer`` with the default torch strategy) is the local group: it trains that very
model in this process. ``RayTrainGroup`` (ray_train.py) keeps ``world_size`` data-parallel
replicas in Ray actors; after each step rank 0 publishes the updated adapters for the engine
actors (``published_adapters``) and the pipeline's model takes them when it first reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from roll.algorithms.choices import choice_logprobs
from roll.batch import TrajectoryBatch
from roll.distributed.deepspeed_strategy import PERSIST_ELEMENTS
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
    zero3_gather: str = "layer"
    """ZeRO-3: what is gathered whole at once, 'layer' or 'projection' (``actor_train.*``)."""
    zero3_persist_elements: int = PERSIST_ELEMENTS
    """ZeRO-3: tensors of at most this many elements stay whole on every rank
    (``actor_train.*``)."""
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

    config: TrainerConfig
    dropout: dict[str, float]
    """Each agent's LoRA dropout (plan.py ``old_pass_agents`` reads it)."""

    def logprob_passes(self, batch: TrajectoryBatch, old: bool = True) -> TrajectoryBatch:
        """``batch`` with its old log-probs (and over moves, and reference ones, as the trainer
        config asks) under the adapters as they are now: the no-grad passes, run where the
        train role runs (Ray: each rank on its share of the rows); ``old`` False: the
        reference pass alone (plan.py ``old_pass_agents`` says whose rows need the old one)."""
        ...

    agent_names: list[str]

    def policy_logprobs(self, batch: TrajectoryBatch, temperature: float) -> Tensor:
        """(B, T) log-probs of ``batch``'s response tokens, each row under its agent's adapter
        as it is now, at ``temperature``, where the train role runs (Ray: each rank on its
        share of the rows)."""
        ...

    def divergence_rows(self, batch: TrajectoryBatch, agent_a: str, agent_b: str,
                        temperature: float) -> Tensor:
        """(B,) each row's summed KL(p_a || p_b) over its response tokens
        (``MultiAgentLoRAModel.divergence_rows``), where the train role runs."""
        ...

    def choice_logprobs(self, batch: TrajectoryBatch, temperature: float,
                        adapters: dict[str, dict[str, Tensor]] | None = None) -> Tensor:
        """(B, T, C) log-probs of each row's legal tokens at its branching points
        (``batch.choice_tokens``), renormalised per point, each row under its agent's adapter
        as it is now, or under ``adapters`` of its agent (a snapshot magnet; the agents' own
        are put back afterwards), where the train role runs."""
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

    def published_adapters(self, version: int) -> dict:
        """Agent -> an object reference to the train role's own copy of its adapter at
        ``version``, for engine actors to fetch directly (Ray); {} when there is none."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Resume: the pipeline's model already holds the checkpoint's adapters."""
        ...


def _on_model(model: MultiAgentLoRAModel, batch: TrajectoryBatch) -> TrajectoryBatch:
    return batch.to(model.tensor_device)


@torch.no_grad()
def response_logprobs(model: MultiAgentLoRAModel, batch: TrajectoryBatch, temperature: float,
                      forward_rows: int | None) -> Tensor:
    """(B, T) log-probs of ``batch``'s response tokens (``response_mask``), each row under its
    own agent's adapter as it is now, at ``temperature``, in forwards of ``forward_rows`` rows,
    on the model's device: what HAPPO's ratios and the exploitability tables read."""
    batch = _on_model(model, batch)
    return model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id,
                          positions=batch.response_mask.bool(), temperature=temperature,
                          forward_rows=forward_rows)


def response_divergences(model: MultiAgentLoRAModel, batch: TrajectoryBatch, agent_a: str,
                         agent_b: str, temperature: float, forward_rows: int | None) -> Tensor:
    """(B,) each row's KL(p_a || p_b) summed over its response tokens (the agents' policy
    distance an evaluation of a team task reports)."""
    batch = _on_model(model, batch)
    return model.divergence_rows(batch.input_ids, batch.attention_mask, agent_a, agent_b,
                                 positions=batch.response_mask, temperature=temperature,
                                 forward_rows=forward_rows)


@torch.no_grad()
def choice_logprobs_under(trainer: MultiAgentTrainer, batch: TrajectoryBatch,
                          adapters: dict[str, dict[str, Tensor]] | None,
                          temperature: float) -> Tensor:
    """(B, T, C) log-probs of each row's legal tokens at its branching points (renormalised
    per point), each row under ``adapters[its agent]`` (None: the trainer's own, as they
    are); the trainer's own adapters are put back afterwards, whatever happens (through the
    trainer: ZeRO-3 gathers them)."""
    batch = _on_model(trainer.model, batch)
    batch.require("choice_tokens")
    current = trainer.export_adapters(list(adapters)) if adapters else {}
    out = torch.zeros(batch.choice_tokens.shape, dtype=torch.float32,
                      device=batch.choice_tokens.device)
    step = trainer.config.forward_rows
    try:
        if adapters:
            trainer.load_adapters(adapters)
        for start in range(0, len(batch), step):
            rows = batch.select(torch.arange(start, min(start + step, len(batch)),
                                             device=batch.agent_id.device))
            *_, logits = trainer.model(rows.input_ids, rows.attention_mask, rows.agent_id,
                                       positions=rows.response_mask.bool(),
                                       temperature=temperature, choices=rows.choice_tokens)
            out[start:start + len(rows)] = choice_logprobs(logits, rows.choice_tokens)
    finally:
        if adapters:
            trainer.load_adapters(current)
    return out


class LocalTrainGroup(MultiAgentTrainer):
    """This process trains the pipeline's own model (``cluster.backend=local``)."""

    def policy_logprobs(self, batch: TrajectoryBatch, temperature: float) -> Tensor:
        return response_logprobs(self.model, batch, temperature, self.config.forward_rows)

    def divergence_rows(self, batch: TrajectoryBatch, agent_a: str, agent_b: str,
                        temperature: float) -> Tensor:
        return response_divergences(self.model, batch, agent_a, agent_b, temperature,
                                    self.config.forward_rows)

    def choice_logprobs(self, batch: TrajectoryBatch, temperature: float,
                        adapters: dict[str, dict[str, Tensor]] | None = None) -> Tensor:
        return choice_logprobs_under(self, batch, adapters, temperature)

    def published_adapters(self, version: int) -> dict:
        """Nothing is published: engines take the tensors from this very model."""
        return {}

    def close(self) -> None:
        """Nothing to release."""


def push_adapters(
    engine: InferenceEngine,
    model: MultiAgentLoRAModel,
    version: int,
    agents: list[str] | None = None,
    published: dict | None = None,
) -> None:
    """Sync agents' adapters from the trainer's model into same-named engine slots.

    Only adapter tensors travel (DESIGN.md invariant 3); afterwards
    ``engine.adapter_version(name) == version`` for each synced agent. ``published``: agent ->
    object reference to the train role's own copy at ``version`` (``TrainGroup.
    published_adapters``), sent instead of the model's tensors to engines that fetch
    references themselves (``takes_references``: engine actors).
    """
    load_adapters(engine, model, version, adapter_payloads(engine, model, agents, published))


def adapter_payloads(engine: InferenceEngine, model: MultiAgentLoRAModel,
                     agents: list[str] | None = None, published: dict | None = None) -> dict:
    """What ``push_adapters`` sends each agent's slot, taken now: the published reference,
    or the model's tensors (``_adapter_for``). A reference or a host copy loaded later
    (``load_adapters``, e.g. in another thread while the trainer moves on) is still this
    version; the live tensors an engine in this process on the model's device gets are not
    (rollout.overlap needs engine actors)."""
    by_reference = published if published and getattr(engine, "takes_references", False) else {}
    payloads = {}
    for name in agents if agents is not None else model.agent_names:
        payload = by_reference.get(name)
        payloads[name] = payload if payload is not None else _adapter_for(engine, model, name)
    return payloads


def load_adapters(engine: InferenceEngine, model: MultiAgentLoRAModel, version: int,
                  payloads: dict) -> None:
    """Each agent's payload (``adapter_payloads``) into its engine slot at ``version``."""
    for name, payload in payloads.items():
        engine.load_adapter(name, payload, model.peft_config(name), version)


def _adapter_for(engine: InferenceEngine, model: MultiAgentLoRAModel,
                 name: str) -> dict[str, Tensor]:
    """One agent's adapter as ``engine.load_adapter`` takes it: the model's own tensors
    (detached, no copy) for an engine in this process on the model's device, which copies
    them into its stacks; detached host copies (``export_adapter``) for any other. The host's
    round trip cost an H200 Hanabi step 1.2 s of sync with 8 agents (0.15 s with one)."""
    named = dict(model.named_agent_tensors(name))
    device = next(iter(named.values())).device
    if getattr(engine, "device", None) == device:
        return {key: tensor.detach() for key, tensor in named.items()}
    return model.export_adapter(name)
