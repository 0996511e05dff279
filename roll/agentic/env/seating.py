"""Who plays each seat: ``seat_to_agent`` from the config, parsed and validated.

Accepted specs for one seat:

- ``"<agent_name>"`` — a trained agent (its LoRA adapter acts and learns from this seat);
- ``"random"`` — built-in uniform random opponent;
- ``"mcts"`` or ``"mcts:<simulations>"`` — built-in OpenSpiel MCTS opponent
  (``DEFAULT_MCTS_SIMULATIONS`` when not given);
- ``"cfr"`` or ``"cfr:<iterations>"`` — the average policy of OpenSpiel's CFR+ after that many
  iterations (``DEFAULT_CFR_ITERATIONS`` when not given), for two-player zero-sum games with
  information states (Kuhn, Leduc, …): near a Nash equilibrium, the strongest fair opponent;
- ``"snapshot:<agent_name>@<step>"`` or ``"snapshot:<agent_name>@latest"`` — a frozen copy of an
  agent's adapter from a past checkpoint, played by the LLM but never trained.

``seat_to_agent`` is a list (index = seat) or a mapping seat → spec (keys may be YAML strings of
digits). Every error is a ValueError that names ``seat_to_agent`` and the bad value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MCTS_SIMULATIONS = 100
DEFAULT_CFR_ITERATIONS = 300
BUILTIN_OPPONENTS = ("random", "mcts", "cfr")
_MCTS = re.compile(r"mcts(?::(\d+))?")
_CFR = re.compile(r"cfr(?::(\d+))?")
_SNAPSHOT = re.compile(r"snapshot:([^@\s]+)@(latest|\d+)")
_SPEC_HELP = ("expected an agent name, 'random', 'mcts', 'mcts:<simulations>', 'cfr', "
              "'cfr:<iterations>', "
              "'snapshot:<agent>@<step>' or 'snapshot:<agent>@latest'")


@dataclass(frozen=True)
class SeatSpec:
    """Who plays one seat."""

    raw: str
    """The spec as written in the config."""
    kind: str
    """"agent", "random", "mcts", "cfr" or "snapshot"."""
    agent_name: str | None = None
    """The trained agent ("agent") or the agent whose old adapter plays ("snapshot")."""
    mcts_simulations: int | None = None
    """Simulations per move for "mcts"."""
    cfr_iterations: int | None = None
    """CFR+ iterations for "cfr"."""
    snapshot_step: int | None = None
    """Checkpoint step of a "snapshot"; None means the latest checkpoint."""

    @property
    def is_trained(self) -> bool:
        """True if this seat's turns are training samples for ``agent_name``."""
        return self.kind == "agent"

    @property
    def uses_llm(self) -> bool:
        """True if the LLM (with some adapter) generates this seat's moves."""
        return self.kind in ("agent", "snapshot")


@dataclass(frozen=True)
class Seating:
    """The validated seat → player assignment of one game."""

    seats: tuple[SeatSpec, ...]
    """One spec per seat, indexed by seat."""

    def __getitem__(self, seat: int) -> SeatSpec:
        return self.seats[seat]

    def __len__(self) -> int:
        return len(self.seats)

    def seats_of(self, agent_name: str) -> list[int]:
        """Seats where ``agent_name`` plays as a trained agent (several in self-play)."""
        return [seat for seat, spec in enumerate(self.seats)
                if spec.is_trained and spec.agent_name == agent_name]


def parse_seat_spec(value: object, agent_names: Sequence[str], where: str) -> SeatSpec:
    """Parse one seat's spec; ``where`` (e.g. ``"seat_to_agent[1]"``) prefixes errors."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: {value!r} is not a string; {_SPEC_HELP}")
    if value in agent_names:
        return SeatSpec(raw=value, kind="agent", agent_name=value)
    if value == "random":
        return SeatSpec(raw=value, kind="random")
    if (mcts := _MCTS.fullmatch(value)) is not None:
        simulations = int(mcts.group(1)) if mcts.group(1) else DEFAULT_MCTS_SIMULATIONS
        if simulations < 1:
            raise ValueError(f"{where}: {value!r} needs at least 1 MCTS simulation")
        return SeatSpec(raw=value, kind="mcts", mcts_simulations=simulations)
    if (solved := _CFR.fullmatch(value)) is not None:
        iterations = int(solved.group(1)) if solved.group(1) else DEFAULT_CFR_ITERATIONS
        if iterations < 1:
            raise ValueError(f"{where}: {value!r} needs at least 1 CFR iteration")
        return SeatSpec(raw=value, kind="cfr", cfr_iterations=iterations)
    if value.startswith("snapshot:"):
        snapshot = _SNAPSHOT.fullmatch(value)
        if snapshot is None:
            raise ValueError(f"{where}: malformed snapshot spec {value!r}; expected "
                             "'snapshot:<agent>@<step>' or 'snapshot:<agent>@latest'")
        if snapshot.group(1) not in agent_names:
            raise ValueError(f"{where}: snapshot of unknown agent {snapshot.group(1)!r} in "
                             f"{value!r}; known agents: {list(agent_names)}")
        step = None if snapshot.group(2) == "latest" else int(snapshot.group(2))
        return SeatSpec(raw=value, kind="snapshot", agent_name=snapshot.group(1),
                        snapshot_step=step)
    raise ValueError(f"{where}: unknown agent or malformed spec {value!r}; known agents: "
                     f"{list(agent_names)}; {_SPEC_HELP}")


def _specs_by_seat(seat_to_agent: object, num_seats: int) -> list[object]:
    """The raw spec of each seat, from a list or a mapping seat → spec."""
    if isinstance(seat_to_agent, Mapping):
        by_seat = {}
        for key, value in seat_to_agent.items():
            if isinstance(key, bool) or not str(key).isdigit():
                raise ValueError(f"seat_to_agent: seat key {key!r} is not a seat number")
            by_seat[int(key)] = value
        if sorted(by_seat) != list(range(num_seats)):
            raise ValueError(f"seat_to_agent: seats {sorted(by_seat)} given, the game has "
                             f"{num_seats} seats (0..{num_seats - 1})")
        return [by_seat[seat] for seat in range(num_seats)]
    if isinstance(seat_to_agent, str) or not isinstance(seat_to_agent, Sequence):
        raise ValueError(f"seat_to_agent: expected a list or a mapping seat → spec, "
                         f"got {seat_to_agent!r}")
    if len(seat_to_agent) != num_seats:
        raise ValueError(f"seat_to_agent: {len(seat_to_agent)} seats given "
                         f"({list(seat_to_agent)}), the game has {num_seats}")
    return list(seat_to_agent)


def build_seating(seat_to_agent: object, num_seats: int,
                  agent_names: Sequence[str]) -> Seating:
    """Validate ``seat_to_agent`` against the game's seat count and the configured agents.

    Raises:
        ValueError: naming ``seat_to_agent`` and the bad value on a wrong number of seats, an
            unknown agent, a malformed spec, or an agent name that clashes with a built-in spec.
    """
    for name in agent_names:
        if (name in BUILTIN_OPPONENTS or _MCTS.fullmatch(name) or _CFR.fullmatch(name)
                or name.startswith("snapshot:")):
            raise ValueError(f"seat_to_agent: agent name {name!r} clashes with a built-in "
                             "opponent spec; rename the agent")
    specs = _specs_by_seat(seat_to_agent, num_seats)
    return Seating(tuple(parse_seat_spec(value, agent_names, f"seat_to_agent[{seat}]")
                         for seat, value in enumerate(specs)))
