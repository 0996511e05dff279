"""Writing team (MAGRPO, as CoMLRL's writing baseline): two writers, two parts, one joint reward.

Roles: ``background`` writes the background of the prompt's topic, then ``method`` writes the
method. Each sees only the prompt and its own instruction (CoMLRL's writers answer the same
prompt independently); ``see_partner=true`` shows the method writer the background part too.

The joint reward, the same for both writers once both parts are written, is the mean of four
scores in [0, 1] over the parts' words (lower-cased runs of letters and digits):
- ``length``: min(1, words / target_words) per part, averaged over the two parts (a part of
  ``target_words`` words or more scores 1);
- ``balance``: min(words_a, words_b) / max(words_a, words_b);
- ``diversity``: distinct words / words over both parts together;
- ``distinct``: 1 - Jaccard overlap of the two parts' word sets (complementary parts, not one
  text twice).
An empty part (nothing but whitespace) is the format error ``empty_answer`` and makes the joint
reward 0. Both roles get the joint reward, so GRPO's group-relative advantage of each writer is
exactly MAGRPO's (every agent of an episode gets the group-normalised joint reward).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from roll.agentic.env.base import StepResult
from roll.agentic.tasks.base import Transcript, check_items, mean

ROLES = ("background", "method")
INSTRUCTIONS = {
    "background": "You are the background writer. Write only the background of this topic: "
                  "why it matters and what is known. Do not describe a method.",
    "method": "You are the method writer. Write only the method: what to do and how, step by "
              "step. Do not repeat the background.",
}
_WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def joint_scores(part_a: str, part_b: str, target_words: int) -> dict[str, float]:
    """The four scores and their mean ``joint`` (module docstring); all 0 if a part is empty."""
    a, b = words(part_a), words(part_b)
    if not a or not b:
        return dict.fromkeys(("length", "balance", "diversity", "distinct", "joint"), 0.0)
    scores = {
        "length": (min(1.0, len(a) / target_words) + min(1.0, len(b) / target_words)) / 2,
        "balance": min(len(a), len(b)) / max(len(a), len(b)),
        "diversity": len(set(a) | set(b)) / (len(a) + len(b)),
        "distinct": 1.0 - len(set(a) & set(b)) / len(set(a) | set(b)),
    }
    scores["joint"] = sum(scores.values()) / 4
    return scores


class WritingTeam:
    """The writing team as an env of the game protocol (roll/agentic/tasks/base.py)."""

    name = "writing_team"
    roles = ROLES
    num_seats = len(ROLES)
    cooperative = True
    parses_answers = True
    required_fields = ("prompt",)

    def __init__(self, items: Sequence[dict[str, Any]], target_words: int = 60,
                 see_partner: bool = False) -> None:
        if not isinstance(target_words, int) or isinstance(target_words, bool) \
                or target_words < 1:
            raise ValueError(f"env.params.target_words={target_words!r}: must be an integer "
                             ">= 1")
        if not isinstance(see_partner, bool):
            raise ValueError(f"env.params.see_partner={see_partner!r}: must be true or false")
        if not items:
            raise ValueError("writing_team: the dataset has no items")
        check_items(items, self.required_fields, "writing_team dataset")
        self.items = list(items)
        self.target_words = target_words
        self.see_partner = see_partner
        self.reset(0)

    def reset(self, seed: int, item: int | None = None) -> None:
        self.item = self.items[(seed if item is None else item) % len(self.items)]
        self.transcript = Transcript(str(self.item["prompt"]))
        self.seat: int | None = 0
        self.scores: dict[str, float] = {}

    @property
    def done(self) -> bool:
        return self.seat is None

    def current_seat(self) -> int | None:
        return self.seat

    def observation(self, seat: int) -> str:
        seen = ROLES[:1] if self.see_partner else ()
        return self.transcript.render(INSTRUCTIONS[ROLES[seat]], roles=seen)

    def legal_actions(self, seat: int) -> list[str]:
        return []

    def step(self, action: str) -> StepResult:
        seat = self.seat
        if seat is None:
            raise ValueError("writing_team: the episode is over")
        self.transcript.add(ROLES[seat], action)
        format_error = None if action.strip() else "empty_answer"
        if seat == 0:
            self.seat = 1
            return StepResult([0.0, 0.0], False, format_error=format_error)
        self.seat = None
        self.scores = joint_scores(self.transcript.last(ROLES[0]) or "",
                                   self.transcript.last(ROLES[1]) or "", self.target_words)
        joint = self.scores["joint"]
        return StepResult([joint, joint], True, format_error=format_error)

    def forfeit(self, seat: int) -> StepResult:
        """Ends the episode with joint reward 0 (the rollout never forfeits a task)."""
        self.seat = None
        return StepResult([0.0, 0.0], True)

    def returns(self) -> list[float]:
        joint = self.scores.get("joint", 0.0)
        return [joint, joint]

    def metrics(self) -> dict[str, float]:
        return dict(self.scores)

    @staticmethod
    def summarize(episodes: Sequence[dict[str, float]]) -> dict[str, float]:
        keys = ("length", "balance", "diversity", "distinct", "joint")
        return {f"task/{key}": mean([e.get(key, 0.0) for e in episodes]) for key in keys}
