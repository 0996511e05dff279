"""Timestamped lines around the long stages of a run (model load, compile warm-ups, steps):
a user watching a terminal tells a warm-up from a hang by the last line and its time."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch


def log_line(text: str) -> None:
    """``[HH:MM:SS] text`` on stdout, flushed."""
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stdout, flush=True)


@contextmanager
def stage(what: str) -> Iterator[None]:
    """A line when ``what`` starts and one when it ends (with its seconds), or fails."""
    start = time.perf_counter()
    log_line(f"{what} ...")
    try:
        yield
    except BaseException:
        log_line(f"{what}: failed after {time.perf_counter() - start:.1f} s")
        raise
    log_line(f"{what}: done in {time.perf_counter() - start:.1f} s")


_QUIET = nullcontext()


def profiled(name: str):
    """A ``torch.profiler`` range named ``name`` while a profiler records (its report then
    sums the host and device time of what ran inside, e.g. ``benchmarks/run_hooks.py``'s
    rollout profile), else nothing: a hot loop pays one flag check (~0.06 us) per call
    instead of a range's ~4 us."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return _QUIET
