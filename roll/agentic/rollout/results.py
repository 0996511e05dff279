"""What a rollout produces: LLM turns, episode outcomes, and the two together.

Wins. ``EpisodeResult.outcome`` is the one definition of a win used by training metrics and
evaluation: a seat wins when its return is strictly above every other seat's (alone in the game:
above 0), draws when it ties the best of them. In a cooperative game (identical utilities, e.g.
Hanabi) every seat gets the same return, so there is no win rate: ``team/score`` (the shared
return) is reported instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roll.agentic.env.seating import Seating
from roll.batch import TrajectoryBatch


@dataclass
class Turn:
    """One LLM turn: what the seat saw, what it said, what it earned until its next turn."""

    env_index: int
    seat: int
    slot: str
    """Adapter slot that generated it (agent name, or a snapshot slot)."""
    trained_agent: str | None
    """Agent that learns from this turn (None for snapshot seats)."""
    turn_index: int
    """Index among this seat's turns in the episode."""
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    critic_prompt_ids: list[int] | None = None
    """What a centralised critic reads before the response (``critic.input=global``)."""
    reward: float = 0.0
    """Rewards this seat received from this turn until its next turn, minus format penalty."""
    format_error: str | None = None
    truncated: bool = False
    """The answer hit max_new_tokens before any answer appeared in it (cut off, e.g. while
    thinking): a sign that rollout.sampling.max_new_tokens is too small."""


@dataclass
class EpisodeResult:
    """Outcome of one episode."""

    env_index: int
    group: int
    seed: int
    returns: list[float]
    """Game returns per seat (format penalties not included)."""
    seating: Seating
    """Who played each seat."""
    truncated: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    """Team tasks: the task's own numbers for this episode (e.g. ``final_correct``)."""

    def outcome(self, seat: int) -> Literal["win", "draw", "loss"]:
        """'win' when the seat's return is strictly above every other seat's (in a one-seat
        game: above 0), 'draw' when it equals the best of them, else 'loss'."""
        mine = self.returns[seat]
        best_other = max((r for s, r in enumerate(self.returns) if s != seat), default=0.0)
        if mine > best_other:
            return "win"
        return "draw" if mine == best_other else "loss"


@dataclass
class RolloutResult:
    """Everything one rollout produced."""

    batch: TrajectoryBatch | None
    """Trained agents' turns as rows (None if no trained agent acted)."""
    turns: list[Turn]
    episodes: list[EpisodeResult]
    metrics: dict[str, float] = field(default_factory=dict)
