"""The team tasks by name (``env.task``) and how the rollout builds their episodes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from roll.agentic.env.renderers import RenderedPrompt
from roll.agentic.tasks.math_team import MathTeam
from roll.agentic.tasks.writing_team import WritingTeam

TASKS: dict[str, type] = {"math_team": MathTeam, "writing_team": WritingTeam}


def task_class(name: str) -> type:
    if name not in TASKS:
        raise ValueError(f"env.task={name!r}: unknown task; expected one of {sorted(TASKS)}")
    return TASKS[name]


def task_factory(name: str, params: dict[str, Any], items: Sequence[dict[str, Any]]
                 ) -> Callable[[], Any]:
    """A factory of fresh episodes of task ``name`` on ``items``; checks ``params`` (each is a
    keyword of the task's constructor) and the items once, here."""
    cls = task_class(name)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in
                ("self", "items")]
    for key in params:
        if key not in accepted:
            raise ValueError(f"env.params.{key}: {name} takes no such parameter; it takes "
                             f"{accepted}")
    params = dict(params)
    cls(items, **params)  # raises on bad values, naming env.params.<key>
    check = getattr(cls, "check_dataset", None)
    if check is not None:
        check(items)
    items = list(items)
    return lambda: cls(items, **params)


def render_task(env: Any, seat: int) -> RenderedPrompt:
    """A task's prompt is its own observation (the shared history it chose to show)."""
    return RenderedPrompt(env.observation(seat), numbered_moves=False)
