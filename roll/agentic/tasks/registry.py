"""The team tasks by name (``env.task``) and how the rollout builds their episodes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from roll.agentic.env.renderers import RenderedPrompt
from roll.agentic.tasks.cory import Cory
from roll.agentic.tasks.debate import Debate, majority_vote
from roll.agentic.tasks.math_team import MathTeam
from roll.agentic.tasks.writing_team import WritingTeam
from roll.errors import ConfigError


@dataclass(frozen=True)
class TaskSpec:
    make: Callable[..., Any]
    """(items, **params) -> a fresh episode env."""
    required_fields: tuple[str, ...]
    """Fields every dataset item must have."""


TASKS: dict[str, TaskSpec] = {
    "math_team": TaskSpec(MathTeam, MathTeam.required_fields),
    "writing_team": TaskSpec(WritingTeam, WritingTeam.required_fields),
    "debate": TaskSpec(Debate, Debate.required_fields),
    "majority_vote": TaskSpec(majority_vote, Debate.required_fields),
    "cory": TaskSpec(Cory, Cory.required_fields),
}


def task_spec(name: str) -> TaskSpec:
    if name not in TASKS:
        raise ConfigError("env.task", name, f"unknown task; expected one of {sorted(TASKS)}")
    return TASKS[name]


def task_parameters(name: str) -> list[str]:
    """The parameters (``env.params`` keys) task ``name`` takes."""
    signature = inspect.signature(task_spec(name).make)
    return [p.name for p in signature.parameters.values()
            if p.kind == p.POSITIONAL_OR_KEYWORD and p.name not in ("self", "items")]


def task_factory(name: str, params: dict[str, Any], items: Sequence[dict[str, Any]]
                 ) -> Callable[[], Any]:
    """A factory of fresh episodes of task ``name`` on ``items``; checks ``params`` and the
    items once, here (ConfigError naming ``env.params.<key>``, ValueError naming the item)."""
    make = task_spec(name).make
    accepted = task_parameters(name)
    for key in params:
        if key not in accepted:
            raise ConfigError(f"env.params.{key}", params[key],
                              f"{name} takes no such parameter; it takes {accepted}")
    params = dict(params)
    prototype = make(items, **params)
    check = getattr(prototype, "check_dataset", None)
    if check is not None:
        check(items)
    items = list(items)
    return lambda: make(items, **params)


def render_task(env: Any, seat: int) -> RenderedPrompt:
    """A task's prompt is its own observation (the shared history it chose to show)."""
    return RenderedPrompt(env.observation(seat), numbered_moves=False)
