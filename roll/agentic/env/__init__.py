"""Multi-agent environments: the protocol, action parsing and seat assignment.

This package's top level needs no game engine. OpenSpiel games (the ``games`` extra) live in
``openspiel_env`` (``OpenSpielEnv``), ``renderers`` (prompts) and ``opponents`` (random, MCTS).
"""

from roll.agentic.env.actions import (
    ActionConfig,
    FormatCounters,
    FormatError,
    ParsedAction,
    TurnOutcome,
    apply_parsed_action,
    parse_action,
)
from roll.agentic.env.base import MultiAgentEnv, StepResult
from roll.agentic.env.seating import Seating, SeatSpec, build_seating

__all__ = [
    "ActionConfig",
    "FormatCounters",
    "FormatError",
    "MultiAgentEnv",
    "ParsedAction",
    "SeatSpec",
    "Seating",
    "StepResult",
    "TurnOutcome",
    "apply_parsed_action",
    "build_seating",
    "parse_action",
]
