"""The team-task protocol: roles taking turns on a shared history, per-turn and joint rewards.

A team task is an env of the game protocol (``roll.agentic.env.base.MultiAgentEnv``): a seat is
a role (``roles[seat]``), exactly one role acts at a time, ``step`` takes its answer and
``returns`` sums its rewards; the rollout drives games and tasks through the same episode code
(``roll.agentic.rollout.episode``). What a task adds to that protocol:

- ``parses_answers = True``: ``step`` gets the role's WHOLE answer (thinking removed), not a
  move parsed out of it, because the next roles read it (a critic judges the reasoning, not just
  the final number). The task parses what it needs and reports an unusable answer in
  ``StepResult.format_error``; the episode then subtracts the format penalty from that turn and
  counts it in the metrics. A task never forfeits and never crashes on model output.
- ``legal_actions(seat)``: usually ``[]`` (free text). A task may list answers instead (e.g. a
  critic's ``["Correct", "Incorrect"]``); with ``rollout.constrained_decoding`` the model can then
  only answer ``<answer>ONE</answer>``, which the task still parses from the text.
- ``reset(seed, item)``: ``item`` is the dataset item of the episode's group (every episode of a
  GRPO group gets the same one); the items come from ``roll.agentic.tasks.datasets``.
- ``metrics()``: per-episode numbers (e.g. ``initial_correct``); the task's ``summarize`` turns
  a rollout's list of them into ``task/...`` metrics.

What each role sees is the task's choice and is documented in its module; ``Transcript`` renders
the common one: the item's question, then every earlier turn in order, each under its role's
name, then the acting role's instruction. ``TranscriptTask`` holds what the tasks share (the
acting seat, the global view, forfeit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.agentic.env.base import StepResult
from roll.errors import ConfigError


@dataclass
class TurnRecord:
    """One turn of the shared history."""

    role: str
    text: str


@dataclass
class Transcript:
    """The shared history of one episode and the prompts rendered from it."""

    header: str
    """What every role sees first (the question or writing prompt)."""
    turns: list[TurnRecord] = field(default_factory=list)

    def add(self, role: str, text: str) -> None:
        self.turns.append(TurnRecord(role, text.strip()))

    def render(self, instruction: str | None, roles: Sequence[str] | None = None) -> str:
        """``header``, then every earlier turn as ``[role]\\ntext`` (only those of ``roles``
        when given), then ``instruction`` (None: none, the history alone, which is the task's
        global state for a centralised critic); blocks separated by blank lines."""
        blocks = [self.header]
        blocks += [f"[{turn.role}]\n{turn.text}" for turn in self.turns
                   if roles is None or turn.role in roles]
        if instruction is not None:
            blocks.append(instruction)
        return "\n\n".join(blocks)

    def last(self, role: str) -> str | None:
        """The latest text of ``role`` (None before its first turn)."""
        for turn in reversed(self.turns):
            if turn.role == role:
                return turn.text
        return None


class TranscriptTask:
    """What the team tasks share: one role acts at a time (``seat``; None once the episode is
    over), the global view is the whole shared ``transcript``, each role sees it under its own
    instruction (``instructions``: role -> text), and a forfeit ends the episode with no
    further reward. A task sets ``roles`` and ``num_seats``, and overrides what it renders
    otherwise."""

    parses_answers = True
    name: str
    required_fields: tuple[str, ...]
    roles: tuple[str, ...]
    num_seats: int
    instructions: dict[str, str]
    seat: int | None
    transcript: Transcript
    rewards: list[float]

    @property
    def done(self) -> bool:
        return self.seat is None

    def current_seat(self) -> int | None:
        return self.seat

    def global_observation(self) -> str:
        """The whole history, every role's turn (what a centralised critic reads)."""
        return self.transcript.render(None)

    def observation(self, seat: int) -> str:
        return self.transcript.render(self.instructions[self.roles[seat]])

    def forfeit(self, seat: int) -> StepResult:
        """Ends the episode with no further reward (the rollout never forfeits a task)."""
        self.seat = None
        return StepResult([0.0] * self.num_seats, True)

    def returns(self) -> list[float]:
        return list(self.rewards)

    def keep_items(self, items: Sequence[dict[str, Any]], closed_answers: bool,
                   lenient_answers: bool, **flags: object) -> None:
        """Checks the answer flags (and any other ``flags``: ``env.params.<flag>``) and the
        dataset (not empty; every item has ``required_fields``, and ``choices`` when answers
        are closed), then keeps ``items``, ``closed_answers`` and ``lenient`` (=
        ``lenient_answers``)."""
        check_flags(**flags, closed_answers=closed_answers, lenient_answers=lenient_answers)
        if not items:
            raise ValueError(f"{self.name}: the dataset has no items")
        check_items(items, self.required_fields + (("choices",) if closed_answers else ()),
                    f"{self.name} dataset")
        self.items = list(items)
        self.closed_answers = closed_answers
        self.lenient = lenient_answers


class TeamTask(Protocol):
    """What the rollout and the pipeline use of a task beyond ``MultiAgentEnv``."""

    name: str
    roles: tuple[str, ...]
    """Role of each seat (seat i plays roles[i])."""
    cooperative: bool
    """Every role's return is the same joint reward (reported as ``team/score``)."""
    parses_answers: bool
    """Always True for a task (module docstring)."""
    required_fields: tuple[str, ...]
    """Fields every dataset item must have (e.g. question, answer)."""

    def reset(self, seed: int, item: int | None = None) -> None: ...

    def metrics(self) -> dict[str, float]:
        """This episode's numbers (call once it is done)."""
        ...


def mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, 0 when the denominator is 0 (no such case in the rollout)."""
    return float(numerator / denominator) if denominator else 0.0


def choose_item(items: Sequence[dict[str, Any]], seed: int, item: int | None) -> dict[str, Any]:
    """The episode's dataset item: ``items[item]`` (the group's), else one picked by ``seed``."""
    return items[(seed if item is None else item) % len(items)]


def check_flags(**flags: object) -> None:
    """Each flag is true or false (ConfigError naming ``env.params.<flag>`` otherwise)."""
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"env.params.{key}", value, "must be true or false")


def check_items(items: Sequence[dict[str, Any]], required: Sequence[str], where: str) -> None:
    """Every item has every required field (ValueError naming the first missing one)."""
    for index, item in enumerate(items):
        for name in required:
            if name not in item:
                raise ValueError(f"{where}: item {index} has no field {name!r} "
                                 f"(it has {sorted(item)})")
