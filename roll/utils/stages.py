"""Timestamped lines around the long stages of a run (model load, compile warm-ups, steps):
a user watching a terminal tells a warm-up from a hang by the last line and its time."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


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
