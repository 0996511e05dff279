"""How many parameter elements a process holds: at rest, and at its fullest moment.

Under ZeRO-3 a rank keeps only its partition of each weight (``param.ds_tensor``) and gathers a
layer whole (``param.data``) just while that layer runs, so its weights in memory should never
come near the whole base, neither while the model loads nor during a step.
``ResidentPeak.recording()`` keeps the largest count seen at every moment a weight can appear
or be gathered: each parameter's registration (a module being built, before ZeRO partitions
it), and the end of every module's forward (ZeRO's gathered weights are released only after).
It is a measurement for tests and benchmarks (``TrainSpec.measure_resident``): the hooks cost
a census of every parameter per module call.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def resident(param: torch.Tensor) -> int:
    """Elements of ``param`` in this process's memory now: its data (whole when not
    partitioned, or while gathered; empty otherwise) plus its ZeRO-3 partition, if any."""
    if param.is_meta:  # a shape only (roll.models.load_shape)
        return 0
    shard = getattr(param, "ds_tensor", None)
    return param.data.numel() + (shard.numel() if shard is not None else 0)


def resident_elements(module: nn.Module) -> int:
    """Parameter elements ``module`` holds now (ZeRO-3: its partitions plus whatever is
    gathered; otherwise every parameter whole)."""
    return sum(resident(param) for param in module.parameters())


class ResidentPeak:
    """The most parameter elements held at once by the parameters created while recording."""

    def __init__(self) -> None:
        self._params: dict[int, weakref.ref] = {}
        """id -> weak reference of every parameter seen (a WeakSet would compare two tensors
        with == when one parameter is registered twice, as tied weights are)."""
        self.peak = 0

    def add(self, param: torch.Tensor) -> None:
        self._params[id(param)] = weakref.ref(param)

    def census(self) -> int:
        alive = (ref() for ref in list(self._params.values()))
        return sum(resident(param) for param in alive if param is not None)

    def sample(self) -> int:
        self.peak = max(self.peak, self.census())
        return self.peak

    @contextmanager
    def recording(self) -> Iterator[ResidentPeak]:
        """Sample at every parameter registration and after every module's forward, in this
        process, until exit (global hooks of torch.nn)."""
        def registered(module, name, param):
            if param is not None:
                self.add(param)
                self.sample()

        def forwarded(module, args, output):
            self.sample()

        handles = [nn.modules.module.register_module_parameter_registration_hook(registered),
                   nn.modules.module.register_module_forward_hook(forwarded)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()
            self.sample()


__all__ = ["ResidentPeak", "resident", "resident_elements"]
