"""Programmatic dependent launch (PDL) for the engine's own Triton kernels (Hopper and later).

A decode step replays ~500 kernels from one CUDA graph, and between two of them the GPU idles
while the second one launches (benchmarks/README.md, "Where the batch-256 decode step's 4.53 ms
go": ~0.5 ms a step). With PDL a kernel may launch while the kernel before it still runs: it
first waits for that kernel's grid to finish and its writes to be visible
(``griddepcontrol.wait``), then lets the kernel after it launch early
(``griddepcontrol.launch_dependents``), so only its launch and prologue overlap, never its
reads. Off unless ``ROLL_TRITON_PDL=1`` and the device is CUDA of compute capability >= 9: a
measurement, not yet a default (inductor's own kernels follow ``TORCHINDUCTOR_ENABLE_PDL``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def pdl_on(t: torch.Tensor) -> bool:
    """Whether kernels on ``t``'s device launch with PDL (``ROLL_TRITON_PDL=1``, CUDA sm90+)."""
    return (os.environ.get("ROLL_TRITON_PDL") == "1" and t.device.type == "cuda"
            and torch.cuda.get_device_capability(t.device)[0] >= 9)


def launch_options(on: bool) -> dict:
    """The launch keyword that asks Triton for a PDL launch (none when off)."""
    return {"launch_pdl": True} if on else {}


@triton.jit
def pdl_prologue(USE_PDL: tl.constexpr):
    """A kernel's first statement: wait for the kernel before (its writes visible), then let
    the kernel after launch. Nothing when ``USE_PDL`` is false."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


__all__ = ["launch_options", "pdl_on", "pdl_prologue"]
