"""Inference engines as Ray actors (``actor_infer.num_engines``): data-parallel generation.

Each ``InferRank`` holds its own engine with its own copy of the base: an hf engine (``HFEngine``
over the plain base) or a vLLM engine (``VLLMEngine``), the agents as adapter slots, as
``EngineSpec`` says. ``RayInferGroup`` is an ``InferenceEngine`` to the pipeline: adapters travel
to every rank as tensors through the object store (one ``ray.put`` per push), a ``generate`` call
is split round-robin over the ranks and merged back in request order, and every output carries
the adapter version its rank served, which the rollout checks against the trainer's (a stale
rank fails the step loudly). ``sleep``/``wake_up`` reach every rank (vLLM frees its KV cache
while the trainer runs; hf ranks ignore them). A rank that dies stops the call with one line
naming it.

``serve`` is continuous across the ranks: each rank runs its engine's own continuous ``serve``
over a stream (``InferRank.stream``, in a thread of the actor) that takes new requests while it
decodes (``submit``) and hands finished outputs back (``take``). The pipeline's side sends the
first requests round-robin, hands every finished output to the rollout's ``follow`` at once and
sends what it returns (and what the rollout's ``Later`` has ready: env steps on env workers) to
the rank with the fewest requests in flight: no rank waits for another's slowest request, no
round waits for all. ``rollout.continuous=false`` plays lock-step rounds of ``generate`` calls.
"""

from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass, field

import ray
import torch

from roll.distributed.ray_actors import ActorGroup, SharedBundles
from roll.distributed.roles import TrainSpec
from roll.inference.base import (
    Follow,
    GenerationOutput,
    GenerationRequest,
    Later,
)
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

    # ------------------------------------------------------------------ a continuous stream
    def open_stream(self) -> None:
        """Ready a stream's inbox and outbox (before ``stream``, ``submit`` or ``take``)."""
        self._inbox = _Inbox()
        self._outbox: queue.Queue = queue.Queue()

    def stream(self, first: list[tuple[int, GenerationRequest]], context_len: int | None
               ) -> int:
        """Serve ``first`` ((key, request) pairs) and every request ``submit`` brings, with the
        engine's own (continuous) ``serve``, until ``close_stream``; outputs go to ``take``.
        Runs in its own thread of the actor while ``submit``/``take`` come in (after
        ``open_stream``). Returns how many requests it served."""
        inbox, outbox = self._inbox, self._outbox  # this stream's, whatever opens next
        inbox.keys[:0] = [key for key, _ in first]

        def follow(local_key: int, output: GenerationOutput) -> list[GenerationRequest]:
            outbox.put((inbox.keys[local_key], output))
            return []

        try:
            if not first:
                return 0
            return self.engine.serve([request for _, request in first], follow,
                                     context_len=context_len, later=inbox)
        except BaseException as error:
            outbox.put(error)  # a waiting ``take`` raises it
            raise

    def submit(self, keyed: list[tuple[int, GenerationRequest]]) -> None:
        """More requests for the running stream (they join its batch as lanes free)."""
        self._inbox.put(keyed)

    def take(self, wait_s: float) -> list[tuple[int, GenerationOutput]]:
        """The outputs finished since the last call, (key, output); waits up to ``wait_s``
        seconds for the first one."""
        taken = []
        try:
            taken.append(self._outbox.get(timeout=wait_s))
            while True:
                taken.append(self._outbox.get_nowait())
        except queue.Empty:
            pass
        for item in taken:
            if isinstance(item, BaseException):
                raise RuntimeError(f"the engine's serve failed: {item}") from item
        return taken

    def close_stream(self) -> None:
        """No more requests: the stream ends once its requests are served."""
        self._inbox.close()


class _Inbox:
    """The requests ``InferRank.submit`` brings to a running ``serve``, as its ``Later``
    (thread-safe); ``keys[i]`` is the pipeline's key of the stream's i-th request."""

    def __init__(self) -> None:
        self.keys: list[int] = []
        self.items: list[tuple[int, GenerationRequest]] = []
        self.open = True
        self.changed = threading.Condition()

    def put(self, keyed: list[tuple[int, GenerationRequest]]) -> None:
        with self.changed:
            self.items.extend(keyed)
            self.changed.notify_all()

    def close(self) -> None:
        with self.changed:
            self.open = False
            self.changed.notify_all()

    def outstanding(self) -> int:
        with self.changed:
            return len(self.items) + int(self.open)

    def ready(self, wait: bool) -> list[GenerationRequest]:
        with self.changed:
            if wait:
                self.changed.wait_for(lambda: self.items or not self.open)
            taken, self.items = self.items, []
            self.keys.extend(key for key, _ in taken)
        return [request for _, request in taken]


class RayInferGroup:
    """``num_engines`` InferRank actors in one placement group (or in bundles ``shared`` with
    the train ranks: colocated), as one continuous ``InferenceEngine``."""

    continuous = True
    TAKE_WAIT_S = 0.05
    """How long a rank's ``take`` waits for an output before the pipeline looks again (at the
    rollout's ``Later`` and at the other ranks)."""

    def __init__(self, spec: TrainSpec, num_engines: int, engine: EngineSpec,
                 cpus_per_engine: float = 1.0, gpus_per_engine: float = 0.0,
                 shared: SharedBundles | None = None) -> None:
        self.num_engines = num_engines
        self.kind = engine.kind
        self.engine_spec = engine
        """What each actor builds (its engine kind, options and forwarded environment)."""
        self.actors = ActorGroup(
            "actor_infer engine", InferRank, num_engines, cpus_per_engine, gpus_per_engine,
            lambda index: (spec, engine, max(1, int(cpus_per_engine))), shared,
            max_concurrency=3)  # a stream, its submissions and takes at once
        self._versions: dict[str, int] = {}
        self.last_serve: dict[str, int] = {}
        self._get([rank.versions.remote() for rank in self.ranks], "start")

    @property
    def ranks(self) -> list:
        """The engine actors (empty once closed)."""
        return self.actors.actors

    def _get(self, refs: list, what: str, indices: list[int] | None = None) -> list:
        return self.actors.get(refs, what, indices)

    # ------------------------------------------------------------------ InferenceEngine
    takes_references = True
    """``load_adapter`` takes an object reference in place of the tensors (``push_adapters``
    sends rank 0's published copy: the tensors go from the train rank to the engines)."""

    def load_adapter(self, slot: str, tensors: dict | ray.ObjectRef, lora_config,
                     version: int) -> None:
        # once, for every rank (a reference: already in the object store)
        ref = tensors if isinstance(tensors, ray.ObjectRef) else ray.put(tensors)
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

    def serve(self, first: list[GenerationRequest], follow: Follow,
              context_len: int | None = None, later: Later | None = None) -> int:
        """Continuous across the ranks (see the module's docstring); keys as base.Follow
        says. Returns how many requests were served."""
        if not first:
            return 0
        count = self.num_engines
        load = [0] * count  # requests in flight per rank
        made = 0

        def keyed(requests: list[GenerationRequest], ranks: list[int]) -> dict[int, list]:
            nonlocal made
            per_rank: dict[int, list] = {}
            for request, rank in zip(requests, ranks, strict=True):
                per_rank.setdefault(rank, []).append((made, request))
                load[rank] += 1
                made += 1
            return per_rank

        shares = keyed(first, [index % count for index in range(len(first))])
        self._get([self.ranks[rank].open_stream.remote() for rank in shares], "generate",
                  list(shares))
        streams = {rank: self.ranks[rank].stream.remote(share, context_len)
                   for rank, share in shares.items()}

        def send(requests: list[GenerationRequest]) -> None:
            planned = list(load)
            ranks = []
            for _ in requests:  # each to the rank with the fewest in flight
                ranks.append(min(streams, key=lambda index: (planned[index], index)))
                planned[ranks[-1]] += 1
            for rank, items in keyed(requests, ranks).items():
                self._get([self.ranks[rank].submit.remote(items)], "generate", [rank])

        takes: dict = {}
        served = 0
        try:
            while sum(load) or (later is not None and later.outstanding()):
                if later is not None and later.outstanding():
                    send(later.ready(wait=not sum(load)))
                for rank in streams:
                    if load[rank] and rank not in takes.values():
                        takes[self.ranks[rank].take.remote(self.TAKE_WAIT_S)] = rank
                if not takes:
                    continue
                ready, _ = ray.wait(list(takes), num_returns=1)
                rank = takes.pop(ready[0])
                for key, output in self._get(ready, "generate", [rank])[0]:
                    load[rank] -= 1
                    served += 1
                    send(follow(key, output))
        finally:
            if self.ranks:
                for rank in streams:
                    self.ranks[rank].close_stream.remote()
                if takes:
                    ray.wait(list(takes), num_returns=len(takes))
        counts = self._get(list(streams.values()), "generate", list(streams))
        self.last_serve = {"served": served, "engines": len(streams),
                           "per_engine": sum(counts)}
        return served

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
