"""A role's Ray actors: one placement group, one actor per bundle, fail-fast calls.

Shared by the trainer ranks (ray_train.py) and the inference engines (ray_infer.py). A
colocated layout (``actor_infer.colocate``) gives both roles one ``SharedBundles``: bundle i
holds train rank i AND engine i (e.g. one GPU, half for each), so every GPU gets one of each.
"""

from __future__ import annotations

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from roll.errors import RoleFailed


class SharedBundles:
    """One PACKed placement group of ``count`` bundles of ``cpus`` CPUs and ``gpus`` GPUs,
    which several roles' ActorGroups fill (actor ``i`` of each role in bundle ``i``)."""

    def __init__(self, count: int, cpus: float, gpus: float) -> None:
        self.count = count
        bundle = {"CPU": cpus} | ({"GPU": gpus} if gpus else {})
        self.group = placement_group([bundle] * count, strategy="PACK")
        ray.get(self.group.ready(), timeout=120)
        self.removed = False

    def close(self) -> None:
        """Free the placement group (idempotent); kill its actors first."""
        if not self.removed:
            remove_placement_group(self.group)
            self.removed = True


class ActorGroup:
    """``count`` actors of ``cls`` for the role ``role`` (e.g. "actor_train rank"), each
    taking ``cpus`` CPUs and ``gpus`` GPUs: in a bundle of its own in a new PACKed placement
    group, or in bundle ``index`` of ``shared`` (colocated with another role's actors there);
    ``make_args(index)`` gives each actor's constructor arguments; ``max_concurrency`` > 1
    lets an actor run that many calls at once (threads: a long-running call beside short
    ones)."""

    def __init__(self, role: str, cls: type, count: int, cpus: float, gpus: float,
                 make_args, shared: SharedBundles | None = None,
                 max_concurrency: int = 1) -> None:
        self.role = role
        self.count = count
        self.owned = shared is None
        if shared is None:
            shared = SharedBundles(count, cpus, gpus)
        elif count > shared.count:
            raise ValueError(f"{role}: {count} actors but the shared placement group has "
                             f"{shared.count} bundles")
        self.shared = shared
        self.group = shared.group
        actor = ray.remote(cls)
        self.actors = [
            actor.options(
                num_cpus=cpus, num_gpus=gpus, max_concurrency=max_concurrency,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=index),
            ).remote(*make_args(index))
            for index in range(count)
        ]

    def get(self, refs: list, what: str, indices: list[int] | None = None) -> list:
        """ray.get of one call per actor (``indices``: which actor each ref belongs to),
        failing fast: the first actor that dies or raises stops the call with one line naming
        it and the group is torn down (the others may be waiting for it in a collective)."""
        index_of = dict(zip(refs, indices if indices is not None else range(len(refs)),
                            strict=True))
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except (RayActorError, RayTaskError) as error:
                self.close()
                # A task error's own text starts with Ray's call site; its cause is the
                # actor's exception (e.g. NonFiniteLossError naming the agent).
                cause = error.cause if isinstance(error, RayTaskError) else error
                text = str(cause).strip()
                raise RoleFailed(
                    f"{self.role} {index_of[ready[0]]} of {self.count} failed during {what}: "
                    f"{type(cause).__name__}: {text.splitlines()[0] if text else ''}"
                ) from error
        return ray.get(refs)

    def close(self) -> None:
        """Kill the actors and free their placement group if it is their own (idempotent)."""
        for actor in self.actors:
            ray.kill(actor)
        if self.owned:
            self.shared.close()
        self.actors = []
