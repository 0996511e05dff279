"""Inference engines as Ray actors (``actor_infer.num_engines``): data-parallel generation.

Each ``InferRank`` holds its own copy of the base with the team's adapters in an hf engine
(``HFEngine``). ``RayInferGroup`` is an ``InferenceEngine`` to the pipeline: adapters travel to
every rank as tensors through the object store (one ``ray.put`` per push), a ``generate`` call is
split round-robin over the ranks and merged back in request order, and every output carries the
adapter version its rank served, which the rollout checks against the trainer's (a stale rank
fails the step loudly). It has no ``serve``: the rollout plays lock-step rounds over it.
A rank that dies stops the call with one line naming it.
"""

from __future__ import annotations

import ray
import torch

from roll.distributed.ray_actors import ActorGroup
from roll.distributed.train_group import TrainSpec
from roll.inference.base import GenerationOutput, GenerationRequest
from roll.models import load_model, load_tokenizer
from roll.multi_agent.model import MultiAgentLoRAModel


class InferRank:
    """One inference engine (inside a Ray actor): the team on its own base, an HFEngine."""

    def __init__(self, spec: TrainSpec, max_batch_size: int, cpu_threads: int) -> None:
        from roll.inference.hf_engine import HFEngine

        if spec.device == "cpu":
            torch.set_num_threads(max(1, cpu_threads))
        torch.manual_seed(spec.seed)
        base = load_model(spec.model_path, dtype=spec.dtype, device=spec.device)
        model = MultiAgentLoRAModel(base, list(spec.agents), seed=spec.seed)
        self.engine = HFEngine(model, load_tokenizer(spec.model_path), device=spec.device,
                               max_batch_size=max_batch_size, seed=spec.seed)

    def load_adapter(self, slot: str, tensors: dict, lora_config, version: int) -> None:
        self.engine.load_adapter(slot, tensors, lora_config, version)

    def remove_adapter(self, slot: str) -> None:
        self.engine.remove_adapter(slot)

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return self.engine.generate(requests)

    def versions(self) -> dict[str, int | None]:
        return {slot: self.engine.adapter_version(slot) for slot in self.engine.slots}


class RayInferGroup:
    """``num_engines`` InferRank actors in one placement group, as one ``InferenceEngine``."""

    def __init__(self, spec: TrainSpec, num_engines: int, max_batch_size: int,
                 cpus_per_engine: float = 1.0, gpus_per_engine: float = 0.0) -> None:
        self.num_engines = num_engines
        self.actors = ActorGroup(
            "actor_infer engine", InferRank, num_engines, cpus_per_engine, gpus_per_engine,
            lambda index: (spec, max_batch_size, max(1, int(cpus_per_engine))))
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

    def rank_versions(self) -> list[dict[str, int | None]]:
        """What each rank serves now (they must agree)."""
        return self._get([rank.versions.remote() for rank in self.ranks], "version check")

    def close(self) -> None:
        """Kill the engines and free their placement group (idempotent)."""
        self.actors.close()
