"""torch.compile's recompile limit, raised where our compiled code runs, and a hit reported.

torch compiles at most ``recompile_limit`` variants of a function (8 by default); past it a new
kind of input runs eagerly: the same numbers, slower, and only one warning in torch's log.
The trainer's compiled decoder layers (grad and no-grad, policy and reference, each kind of
input attention and routing bring: 6 of those 8 in one pipeline run) and the engine's decode
step (one variant per batch bucket x cache length x LoRA layout) raise the limit to
``RECOMPILE_LIMIT`` while they run, and a hit of it is printed as a timestamped line of ours
naming the function and counted (``limit_hits``), never left to the log alone.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from roll.utils.stages import log_line

RECOMPILE_LIMIT = 64
"""Compiled variants a guarded function may have."""

limit_hits = 0
"""How often a guarded block hit torch's recompile limit in this process."""


class _LimitReport(logging.Handler):
    """Turns torch's "hit config.recompile_limit" warning into our line and count."""

    def __init__(self, who: str) -> None:
        super().__init__(logging.WARNING)
        self.who = who

    def emit(self, record: logging.LogRecord) -> None:
        global limit_hits
        message = record.getMessage()
        if "hit config." not in message:
            return
        limit_hits += 1
        function = next((line.split("function:", 1)[1].strip()
                         for line in message.splitlines() if "function:" in line), "?")
        log_line(f"{self.who}: torch.compile hit its recompile limit for {function}; new kinds "
                 "of input to it now run uncompiled (same numbers, slower). TORCH_LOGS="
                 "recompiles says what changed")


def compile_count() -> int:
    """Graphs torch.compile has built in this process (forward and backward, all regions, the
    trainer's and the engine's): a count that grows after the first step means a new kind of
    input compiled again, seconds to minutes on a GPU."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class CompileWatch:
    """Graphs torch.compile builds in this process during a block (``last``), and one line
    naming ``who`` when a block compiles that is not the first of its kind (the first's
    compiles are the expected warm-up; a later one costs seconds to minutes on a GPU and
    would otherwise pass in silence)."""

    def __init__(self, who: str) -> None:
        self.who = who
        self.last = 0
        """Graphs built during the last block."""
        self._kinds: set[str] = set()

    @contextmanager
    def watch(self, kind: str, label: str) -> Iterator[None]:
        """Count the block's graphs; ``kind``: blocks alike (the first of a kind is silent),
        ``label``: this block, as the line names it."""
        start = compile_count()
        yield
        self.last = compile_count() - start
        if self.last and kind in self._kinds:
            log_line(f"{self.who}: torch.compile built {self.last} new graph(s) in {label} (a "
                     "new kind of input; TORCH_LOGS=recompiles says which)")
        self._kinds.add(kind)


@contextmanager
def recompile_guard(who: str) -> Iterator[None]:
    """Inside the block, torch's recompile limit is ``RECOMPILE_LIMIT`` (patched for the block
    only), and a hit of it prints one line naming ``who`` and the function."""
    import torch

    handler = _LimitReport(who)
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(handler)
    try:
        with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
            yield
    finally:
        logger.removeHandler(handler)
