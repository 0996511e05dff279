"""``rollout.overlap``: the next step's rollout played while this step trains.

Without it a step is a sum: rollout, then the log-prob passes, the update and the adapter sync,
each waiting for the one before, so the engines idle while the ranks train and the other way
round. With it, step s (after its own rollout is in hand) starts, in a thread of this process,
the sync of update s - 1's adapters to the engines (taken from the trainer before it moves on)
and step s + 1's rollout, then drives its own passes and update on the train ranks; step s + 1
begins by waiting for that rollout. A step then costs about max(sync + rollout, passes +
update) and the engines and ranks work at once (on other GPUs, or sharing one).

What changes: step s + 1's episodes come from the adapters of update s - 1, one update older
than without overlap, and are trained on as they are (no importance correction: the PPO ratio is
taken against the log-probs the trainer recomputes, as for every row; the rows count as played
ahead, so ``rollout/ahead_logprob_gap`` shows how far one update moved them). The engines are
checked against the version they were synced to (the scheduler's version check, pinned per
rollout). What does not: the steps' episodes, seeds, items and order. No rollout starts across a
checkpoint (a resumed run is the run that was not interrupted) or an evaluation (it sees the
update it reports), and none after the last step.

Only engine actors (validation): an engine in this process would share the update's GPU stream
and, on one device, the very adapter tensors the update writes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Result = TypeVar("Result")


class NextRollout(Generic[Result]):
    """At most one rollout in flight in a background thread, for a known step."""

    def __init__(self) -> None:
        self._step: int | None = None
        self._thread: threading.Thread | None = None
        self._outcome: tuple[Result, float] | BaseException | None = None

    @property
    def step(self) -> int | None:
        """The step whose rollout is in flight (or finished and not yet taken), else None."""
        return self._step

    def start(self, step: int, play: Callable[[], Result]) -> None:
        """Run ``play()`` (step ``step``'s rollout) in a thread; ``take(step)`` waits for it."""
        if self._step is not None:
            raise RuntimeError(f"rollout.overlap: step {self._step}'s rollout is still "
                               f"pending; step {step}'s cannot start")

        def body() -> None:
            start = time.perf_counter()
            try:
                self._outcome = (play(), time.perf_counter() - start)
            except BaseException as error:  # re-raised in the caller's thread by take()
                self._outcome = error

        self._step = step
        self._thread = threading.Thread(target=body, name=f"rollout-step-{step}", daemon=True)
        self._thread.start()

    def take(self, step: int) -> tuple[Result, float] | None:
        """Step ``step``'s rollout, waited for: (its result, the seconds it played), or None
        when none was started for it. Its error, if it raised one, is raised here."""
        if self._step is None:
            return None
        if self._step != step:
            raise RuntimeError(f"rollout.overlap: step {self._step}'s rollout is pending, "
                               f"not step {step}'s")
        assert self._thread is not None
        self._thread.join()
        outcome, self._outcome = self._outcome, None
        self._step, self._thread = None, None
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome


__all__ = ["NextRollout"]
