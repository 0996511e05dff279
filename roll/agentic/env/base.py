"""The multi-agent environment protocol: seats taking turns, text in, text out.

One protocol serves both kinds of task:

- games (OpenSpiel): a seat is a player; ``legal_actions`` lists the moves as strings;
- team tasks (``roll.agentic.tasks``): a seat is a role (generator, critic, ...) taking its turn
  on a shared history; ``legal_actions`` is usually empty (free text), ``step`` gets the whole
  answer (``parses_answers``, see roll/agentic/tasks/base.py), and a joint reward arrives as
  equal per-seat rewards.

Turn-based only: exactly one seat acts at a time (``current_seat``). The rollout asks whose turn
it is, maps the seat to an agent (``seating.py``), renders that seat's observation into a prompt,
parses the answer (``actions.py``) and calls ``step``. Environments satisfy the protocol
structurally; they do not inherit from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class StepResult:
    """What one ``step`` (or ``forfeit``) produced."""

    rewards: list[float]
    """Reward each seat received during this step, indexed by seat (length ``num_seats``).
    Summed over an episode these equal ``returns()``."""
    done: bool
    """True when the episode ended with this step."""
    info: dict[str, Any] = field(default_factory=dict)
    """Diagnostics for logging (e.g. ``forfeit_seat``); never needed for correctness."""
    format_error: str | None = None
    """Team tasks that parse their own answers (``parses_answers``): why the acting role's
    answer was unusable (the episode subtracts the format penalty); None otherwise."""


@runtime_checkable
class MultiAgentEnv(Protocol):
    """A turn-based environment with ``num_seats`` seats and string actions.

    Life cycle: ``reset(seed)``, then while not ``done``: ``seat = current_seat()``,
    ``observation(seat)``, ``legal_actions(seat)``, ``step(action)``. ``returns()`` gives the
    episode return of every seat at any time (final once ``done``).
    """

    @property
    def name(self) -> str:
        """Task name (game short name), used to pick a prompt renderer and to group metrics."""
        ...

    @property
    def num_seats(self) -> int:
        """Number of seats (players or roles)."""
        ...

    @property
    def done(self) -> bool:
        """True once the episode has ended (terminal state or forfeit)."""
        ...

    def reset(self, seed: int) -> None:
        """Start a new episode; all randomness of the environment derives from ``seed``."""
        ...

    def current_seat(self) -> int | None:
        """Seat that acts now, or None when the episode is done."""
        ...

    def observation(self, seat: int) -> str:
        """Text describing the state from ``seat``'s point of view (hides what it may not see)."""
        ...

    def legal_actions(self, seat: int) -> list[str]:
        """Distinct action strings ``seat`` may play now; an empty list means free-form text."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply ``action`` for the current seat. Raises ValueError if the action is illegal."""
        ...

    def forfeit(self, seat: int) -> StepResult:
        """End the episode now with ``seat`` penalised (its answer could not be used).

        Each environment documents the outcome; games give the forfeiting seat the worst
        outcome, team tasks fail the whole team.
        """
        ...

    def returns(self) -> list[float]:
        """Episode return per seat so far (final once ``done``)."""
        ...


def global_view(env: MultiAgentEnv, seat: int, prompt: str) -> str:
    """What a centralised critic reads for ``seat``'s turn (``critic.input=global``): the
    acting seat's own ``prompt``, then the state as the whole table knows it.

    That state is ``env.global_observation()`` when the env defines one, else every seat's
    ``observation`` in seat order (an observation equal to an earlier seat's is shown once),
    so hidden information of one seat (a card, a hand) is visible to the critic. The critic
    alone reads it: the acting agent's prompt is unchanged.
    """
    describe = getattr(env, "global_observation", None)
    if callable(describe):
        state = describe()
    else:
        views: dict[str, int] = {}  # observation text -> first seat that sees it
        for other in range(env.num_seats):
            views.setdefault(env.observation(other), other)
        state = "\n\n".join(f"Seat {other} sees:\n{view}" for view, other in views.items())
    return f"{prompt}\n\n[The whole table; seat {seat} acts now]\n{state}"
