"""Inference engines as Ray actors (``actor_infer.num_engines``): data-parallel generation.

Each ``InferRank`` holds its own engine with its own copy of the base: an hf engine (``HFEngine``
over the plain base) or a vLLM engine (``VLLMEngine``), the agents as adapter slots, as
``EngineSpec`` says. ``RayInferGroup`` is an ``InferenceEngine`` to the pipeline: adapters travel
to every rank as tensors through the object store (one ``ray.put`` per push), a ``generate`` call
is split round-robin over the ranks and merged back in request order, and every output carries
the adapter version its rank served, which the rollout checks against the trainer's (a stale
rank fails the step loudly). ``sleep``/``wake_up`` reach every rank (vLLM frees its KV cache
while the trainer runs; hf ranks ignore them). It is not continuous: the rollout plays lock-step
rounds over it (``RoundsEngine``). A rank that dies stops the call with one line naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import ray
import torch

from roll.distributed.ray_actors import ActorGroup, SharedBundles
from roll.distributed.roles import TrainSpec
from roll.inference.base import GenerationOutput, GenerationRequest, RoundsEngine
from roll.models import load_model, load_tokenizer


@dataclass(frozen=True)
class EngineSpec:
    """Which engine each rank builds: ``kind`` 'hf' (options: ``max_batch_size``) or 'vllm'
    (options: ``VLLMEngine``'s keyword arguments). ``env``: environment variables set in the
    rank before the engine loads (the pipeline forwards its own ``VLLM_*`` ones)."""

    kind: str = "hf"
    options: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)


def forwarded_env() -> dict[str, str]:
    """This process's ``VLLM_*`` variables, for the engine ranks."""
    return {key: value for key, value in os.environ.items() if key.startswith("VLLM_")}


class InferRank:
    """One inference engine (inside a Ray actor) with its own base copy."""

    def __init__(self, spec: TrainSpec, engine: EngineSpec, cpu_threads: int) -> None:
        os.environ.update(engine.env)
        if spec.device == "cpu":
            torch.set_num_threads(max(1, cpu_threads))
        torch.manual_seed(spec.seed)
        tokenizer = load_tokenizer(spec.model_path)
        if engine.kind == "vllm":
            from roll.inference.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(spec.model_path, tokenizer, **engine.options)
            return
        from roll.inference.hf.engine import HFEngine

        base = load_model(spec.model_path, dtype=spec.dtype, device=spec.device,
                          tf32=spec.tf32)
        self.engine = HFEngine(base, tokenizer, device=spec.device, seed=spec.seed,
                               slot_capacity=len(spec.agents),
                               rank_capacity=max(agent.lora.rank for agent in spec.agents),
                               **engine.options)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def load_adapter(self, slot: str, tensors: dict, lora_config, version: int) -> None:
        self.engine.load_adapter(slot, tensors, lora_config, version)

    def remove_adapter(self, slot: str) -> None:
        self.engine.remove_adapter(slot)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return self.engine.generate(requests)

    def versions(self) -> dict[str, int | None]:
        return {slot: self.engine.adapter_version(slot) for slot in self.engine.slots}


class RayInferGroup(RoundsEngine):
    """``num_engines`` InferRank actors in one placement group (or in bundles ``shared`` with
    the train ranks: colocated), as one ``InferenceEngine`` that serves in rounds."""

    def __init__(self, spec: TrainSpec, num_engines: int, engine: EngineSpec,
                 cpus_per_engine: float = 1.0, gpus_per_engine: float = 0.0,
                 shared: SharedBundles | None = None) -> None:
        self.num_engines = num_engines
        self.kind = engine.kind
        self.actors = ActorGroup(
            "actor_infer engine", InferRank, num_engines, cpus_per_engine, gpus_per_engine,
            lambda index: (spec, engine, max(1, int(cpus_per_engine))), shared)
        self._versions: dict[str, int] = {}
        self._get([rank.versions.remote() for rank in self.ranks], "start")

    @property
    def ranks(self) -> list:
        """The engine actors (empty once closed)."""
        return self.actors.actors

    def _get(self, refs: list, what: str, indices: list[int] | None = None) -> list:
        return self.actors.get(refs, what, indices)

    # ------------------------------------------------------------------ InferenceEngine
    def load_adapter(self, slot: str, tensors: dict, lora_config, version: int) -> None:
        ref = ray.put(tensors)  # once, for every rank
        self._get([rank.load_adapter.remote(slot, ref, lora_config, version)
                   for rank in self.ranks], f"adapter load of {slot!r}")
        self._versions[slot] = version

    def remove_adapter(self, slot: str) -> None:
        if slot not in self._versions:
            raise KeyError(f"slot {slot!r} is not loaded; slots are {sorted(self._versions)}")
        self._get([rank.remove_adapter.remote(slot) for rank in self.ranks],
                  f"adapter removal of {slot!r}")
        del self._versions[slot]

    def adapter_version(self, slot: str) -> int | None:
        return self._versions.get(slot)

    @property
    def slots(self) -> list[str]:
        return sorted(self._versions)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """Rows i, i + m, ... to rank i (m ranks); outputs back in request order."""
        shares = [requests[index::self.num_engines] for index in range(self.num_engines)]
        busy = [(index, share) for index, share in enumerate(shares) if share]
        results = self._get([self.ranks[index].generate.remote(share) for index, share in busy],
                            "generate", [index for index, _ in busy])
        outputs: list[GenerationOutput | None] = [None] * len(requests)
        for (index, _), result in zip(busy, results, strict=True):
            outputs[index::self.num_engines] = result
        return outputs

    def sleep(self) -> None:
        """Every rank frees what its engine can (vLLM: KV cache, weights offloaded)."""
        self._get([rank.sleep.remote() for rank in self.ranks], "sleep")

    def wake_up(self) -> None:
        self._get([rank.wake_up.remote() for rank in self.ranks], "wake-up")

    def rank_versions(self) -> list[dict[str, int | None]]:
        """What each rank serves now (they must agree)."""
        return self._get([rank.versions.remote() for rank in self.ranks], "version check")

    def close(self) -> None:
        """Kill the engines and free their placement group (idempotent)."""
        self.actors.close()
