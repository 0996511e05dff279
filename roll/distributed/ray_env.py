"""Env workers as Ray actors (``env_workers.num_workers``): the env side of a rollout elsewhere.

Each ``EnvWorker`` actor holds its share of a rollout's episodes (``LocalEpisodes``, episode.py):
episode ``i`` of ``k`` workers lives on worker ``i mod k``. There the envs step, built-in
opponents (random, MCTS) choose their moves and prompts are rendered; the rollout in the
pipeline's process sends each answer's text and gets back what it did and the episode's next
prompt. Env steps of different workers run side by side, and beside the decoding: the rollout
starts a step and takes its result when it is ready (``start`` / ``done``). Only text and
numbers travel, so the same seeds give the same episodes as in-process
play (tested). A worker that dies stops the rollout with one line naming it (``RoleFailed``),
and the pipeline adds the last good checkpoint to continue from.
"""

from __future__ import annotations

import sys

import ray

from roll.agentic.rollout.episode import (
    Ask,
    EpisodeOutcome,
    EpisodeSetup,
    EpisodeSpec,
    LocalEpisodes,
    Played,
)
from roll.distributed.ray_actors import ActorGroup

UNUSED_BY_WORKERS = ("torch", "transformers", "peft", "roll.multi_agent", "roll.inference",
                     "roll.algorithms", "roll.pipeline", "roll.batch")
"""Modules an env worker has no use for, none of them imported in its process (~145 MB a
worker; ~330 MB when it imported them all; tests/distributed/test_env_workers.py)."""


def loaded_unused_modules() -> list[str]:
    """Which of ``UNUSED_BY_WORKERS`` this process has imported."""
    return sorted(name for name in UNUSED_BY_WORKERS if name in sys.modules)


class EnvWorker:
    """One env worker (inside a Ray actor): a share of the rollout's episodes."""

    def __init__(self) -> None:
        self.host = LocalEpisodes()

    def open(self, setup: EpisodeSetup, specs: list[EpisodeSpec]) -> list[Ask | None]:
        return self.host.open(setup, specs)

    def play(self, index: int, text: str) -> tuple[Played, Ask | None]:
        return self.host.play(index, text)

    def cut(self, index: int) -> None:
        self.host.cut(index)

    def outcomes(self) -> list[EpisodeOutcome]:
        return self.host.outcomes()


class RayEpisodes:
    """An ``EpisodeHost`` over ``num_workers`` EnvWorker actors in one placement group."""

    def __init__(self, num_workers: int, cpus_per_worker: float = 1.0) -> None:
        self.num_workers = num_workers
        self.actors = ActorGroup("env worker", EnvWorker, num_workers, cpus_per_worker, 0.0,
                                 lambda index: ())
        self.count = 0
        self.started: dict = {}
        """Env steps under way (each worker plays its calls in order, workers side by side):
        their result's ref -> the episode's index."""

    @property
    def workers(self) -> list:
        """The worker actors (empty once closed)."""
        return self.actors.actors

    def open(self, setup: EpisodeSetup, specs: list[EpisodeSpec]) -> list[Ask | None]:
        k = self.num_workers
        self.count = len(specs)
        self.started = {}
        setup_ref = ray.put(setup)
        shares = self.actors.get(
            [worker.open.remote(setup_ref, specs[index::k])
             for index, worker in enumerate(self.workers)], "episode start")
        return self._merge(shares)

    def start(self, index: int, text: str) -> None:
        worker = index % self.num_workers
        self.started[self.workers[worker].play.remote(index // self.num_workers, text)] = index

    def done(self, wait: bool) -> list[tuple[int, Played, Ask | None]]:
        if not self.started:
            return []
        refs = list(self.started)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if not ready and wait:
            ready, _ = ray.wait(refs, num_returns=1)
        ready = sorted(ready, key=self.started.__getitem__)  # by episode
        indices = [self.started.pop(ref) for ref in ready]
        results = self.actors.get(ready, "an env step", [i % self.num_workers for i in indices])
        return [(index, played, ask)
                for index, (played, ask) in zip(indices, results, strict=True)]

    def outstanding(self) -> int:
        return len(self.started)

    def cut(self, index: int) -> None:
        worker = index % self.num_workers
        ref = self.workers[worker].cut.remote(index // self.num_workers)
        self.actors.get([ref], "an episode cut", [worker])

    def outcomes(self) -> list[EpisodeOutcome]:
        return self._merge(self.actors.get([worker.outcomes.remote()
                                            for worker in self.workers], "episode results"))

    def close(self) -> None:
        """Kill the workers and free their placement group (idempotent)."""
        self.actors.close()

    def _merge(self, shares: list[list]) -> list:
        merged: list = [None] * self.count
        for worker, share in enumerate(shares):
            merged[worker::self.num_workers] = share
        return merged
