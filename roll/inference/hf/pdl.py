"""Programmatic dependent launch (PDL) for the engine's own Triton kernels (Hopper and later).

A decode step replays ~500 kernels from one CUDA graph, and between two of them the GPU idles
while the second one launches (benchmarks/README.md, "Where the batch-256 decode step's 4.53 ms
go": ~0.5 ms a step). With PDL a kernel may launch while the kernel before it still runs: it
first waits for that kernel's grid to finish and its writes to be visible
(``griddepcontrol.wait``), then lets the kernel after it launch early
(``griddepcontrol.launch_dependents``), so only its launch and prologue overlap, never its
reads. Off unless ``ROLL_TRITON_PDL=1`` and the device is CUDA of compute capability >= 9: on an
H200 it bought nothing measurable (batch-256 mixed 4-LoRA decode at 33.5% of the HBM roofline
with it, 34.0% without, same tokens; benchmarks/README.md, "The blocked picker by default …
programmatic dependent launch: nothing", session 71), so it stays a switch. Inductor's own
kernels follow ``TORCHINDUCTOR_ENABLE_PDL`` (no gain either).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def pdl_wanted(flag: str | None, device_type: str, major: int | None) -> bool:
    """PDL for a device of this type and compute capability major (None off CUDA) under the
    ``ROLL_TRITON_PDL`` value ``flag`` (unset or ``0``: off; ``1``: on where it can hold)."""
    if flag not in (None, "", "0", "1"):
        raise ValueError(f"ROLL_TRITON_PDL={flag!r}: must be 0 (off, the default) or 1 (on "
                         f"where the device allows it: CUDA compute capability 9 or more)")
    return flag == "1" and device_type == "cuda" and major is not None and major >= 9


def pdl_on(t: torch.Tensor) -> bool:
    """Whether kernels on ``t``'s device launch with PDL (``ROLL_TRITON_PDL=1``, CUDA sm90+)."""
    cuda = t.device.type == "cuda"
    return pdl_wanted(os.environ.get("ROLL_TRITON_PDL"), t.device.type,
                      torch.cuda.get_device_capability(t.device)[0] if cuda else None)


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


__all__ = ["launch_options", "pdl_on", "pdl_prologue", "pdl_wanted"]
