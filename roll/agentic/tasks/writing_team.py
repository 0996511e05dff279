"""Writing team (MAGRPO, as CoMLRL's writing baseline): writers of complementary parts, one
joint reward.

Roles: one writer per part of ``parts`` (default ``background`` then ``method``; e.g. four:
background, method, results, discussion), each writing only its part of the prompt's topic, in
that order. Each sees only the prompt and its own instruction (CoMLRL's writers answer the same
prompt independently); ``see_partner=true`` shows each writer the parts written before its own.

The joint reward, the same for every writer once all parts are written, is the mean of the
scores named in ``scores`` (default all four), each in [0, 1] over the parts' words (lower-cased
runs of letters and digits):
- ``length``: max(0, 1 - |words - target| / target) per part, averaged over the parts: 1 at
  the part's target, 0 at none or twice it (``target_words``: one target for every part, or a
  list with one per part, e.g. a short background and a long method);
- ``balance``: the shortest part's words / the longest part's;
- ``diversity``: distinct words / words over all parts together;
- ``distinct``: 1 - the mean Jaccard overlap of the parts' word sets over every pair of parts
  (complementary parts, not one text several times).
An empty part (nothing but whitespace) is the format error ``empty_answer`` and makes the joint
reward 0. Every role gets the joint reward, so GRPO's group-relative advantage of each writer is
exactly MAGRPO's (every agent of an episode gets the group-normalised joint reward). Metrics
also report each part's words (``words_<part>``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from roll.agentic.env.base import StepResult
from roll.agentic.tasks.base import (
    Transcript,
    TranscriptTask,
    check_flags,
    check_items,
    choose_item,
    mean,
)
from roll.errors import ConfigError

PARTS = ("background", "method")
INSTRUCTIONS = {
    "background": "You are the background writer. Write only the background of this topic: "
                  "why it matters and what is known. Do not describe a method.",
    "method": "You are the method writer. Write only the method: what to do and how, step by "
              "step. Do not repeat the background.",
}
OTHER_PART = ("You are the {part} writer. Write only the {part} section for this topic; do not "
              "repeat what the other sections say.")
_WORD = re.compile(r"[a-z0-9]+")
SCORES = ("length", "balance", "diversity", "distinct")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def joint_scores(parts: Sequence[str], target_words: int | Sequence[int],
                 scores: Sequence[str] = SCORES) -> dict[str, float]:
    """The four scores and ``joint``, the mean of those named in ``scores`` (module
    docstring); all 0 if a part is empty."""
    split = [words(part) for part in parts]
    if not all(split):
        return dict.fromkeys((*SCORES, "joint"), 0.0)
    targets = ([target_words] * len(parts) if isinstance(target_words, int)
               else list(target_words))
    sizes = [len(part) for part in split]
    sets = [set(part) for part in split]
    overlaps = [len(sets[i] & sets[j]) / len(sets[i] | sets[j])
                for i in range(len(sets)) for j in range(i + 1, len(sets))]
    values = {
        "length": mean([max(0.0, 1.0 - abs(size - target) / target)
                        for size, target in zip(sizes, targets, strict=True)]),
        "balance": min(sizes) / max(sizes),
        "diversity": len(set().union(*sets)) / sum(sizes),
        "distinct": 1.0 - mean(overlaps),
    }
    values["joint"] = mean([values[name] for name in scores])
    return values


class WritingTeam(TranscriptTask):
    """The writing team as an env of the game protocol (roll/agentic/tasks/base.py)."""

    name = "writing_team"
    cooperative = True
    required_fields = ("prompt",)

    def __init__(self, items: Sequence[dict[str, Any]], target_words: int | Sequence[int] = 60,
                 see_partner: bool = False, parts: Sequence[str] = PARTS,
                 scores: Sequence[str] = SCORES) -> None:
        check_flags(see_partner=see_partner)
        parts = tuple(parts) if isinstance(parts, list | tuple) else (parts,)  # a str, or 0
        if len(parts) < 2 or len(set(parts)) != len(parts) or not all(
                isinstance(part, str) and part.strip() for part in parts):
            raise ConfigError("env.params.parts", list(parts),
                              "must name two or more distinct parts")
        targets = [target_words] if isinstance(target_words, int) else list(target_words)
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in targets) \
                or len(targets) not in (1, len(parts)):
            raise ConfigError("env.params.target_words", target_words,
                              f"must be an integer >= 1, or a list of one per part "
                              f"({len(parts)})")
        scores = [scores] if isinstance(scores, str) else list(scores)
        if not scores or not set(scores) <= set(SCORES):
            raise ValueError(f"env.params.scores={scores!r}: must name one or more of "
                             f"{list(SCORES)}")
        self.scores_used = tuple(scores)
        self.roles = parts
        self.num_seats = len(parts)
        if not items:
            raise ValueError("writing_team: the dataset has no items")
        check_items(items, self.required_fields, "writing_team dataset")
        self.items = list(items)
        self.target_words = targets[0] if len(targets) == 1 else targets
        self.see_partner = see_partner
        self.reset(0)

    def reset(self, seed: int, item: int | None = None) -> None:
        self.item = choose_item(self.items, seed, item)
        self.transcript = Transcript(str(self.item["prompt"]))
        self.seat = 0
        self.scores: dict[str, float] = {}

    def observation(self, seat: int) -> str:
        part = self.roles[seat]
        seen = self.roles[:seat] if self.see_partner else ()
        return self.transcript.render(INSTRUCTIONS.get(part, OTHER_PART.format(part=part)),
                                      roles=seen)

    def legal_actions(self, seat: int) -> list[str]:
        return []

    def step(self, action: str) -> StepResult:
        seat = self.seat
        if seat is None:
            raise ValueError("writing_team: the episode is over")
        self.transcript.add(self.roles[seat], action)
        format_error = None if action.strip() else "empty_answer"
        if seat < self.num_seats - 1:
            self.seat = seat + 1
            return StepResult([0.0] * self.num_seats, False, format_error=format_error)
        self.seat = None
        texts = [self.transcript.last(part) or "" for part in self.roles]
        self.scores = joint_scores(texts, self.target_words, self.scores_used)
        self.scores.update({f"words_{part}": float(len(words(text)))
                            for part, text in zip(self.roles, texts, strict=True)})
        return StepResult([self.scores["joint"]] * self.num_seats, True,
                          format_error=format_error)

    def returns(self) -> list[float]:
        return [self.scores.get("joint", 0.0)] * self.num_seats

    def metrics(self) -> dict[str, float]:
        return dict(self.scores)

    @staticmethod
    def summarize(episodes: Sequence[dict[str, float]]) -> dict[str, float]:
        keys = dict.fromkeys((*SCORES, "joint", *(key for e in episodes for key in e)))
        return {f"task/{key}": mean([e.get(key, 0.0) for e in episodes]) for key in keys}
