"""Math team: a generator solves, a critic judges, a refiner corrects, up to ``max_rounds`` times.

Turn order: generator → critic → (refiner → critic) × at most ``max_rounds``; the episode ends
when the critic accepts (verdict Correct) or after the critic's turn on the last refinement.

What each role sees: everything (the problem, then every earlier turn in order under its role's
name, as in rLLM's math team), then its own instruction (``INSTRUCTIONS``).

Rewards, per turn (before the format penalty the episode subtracts for an unusable answer):
- generator, refiner: 1 if the final answer (last ``<answer>…</answer>``, else ``\\boxed{}``)
  equals the gold by math-verify, else 0; no parseable final answer is the format error
  ``no_answer``;
- critic: 1 if its verdict is right (Correct for a correct solution, Incorrect for a wrong one),
  else 0; the verdict is the last ``<verdict>…</verdict>``, else the last ``<answer>…</answer>``,
  reading Correct/Incorrect case-insensitively; anything else is the format error
  ``no_verdict``, scores 0 and does not accept (the refiner goes on).
Returns are each role's summed turn rewards, so the roles are not cooperative.

Metrics (``summarize``): accuracy of the initial and of the final answer, the refinement gain
(final - initial), the critic's accuracy and its precision/recall at FLAGGING a wrong solution
(positive = verdict Incorrect; precision = wrong among flagged, recall = flagged among wrong),
and the refinements per episode.

``lenient_answers=true`` is for small models that do not tag their answers: a solution's final
answer may also be its last number, and a verdict the last word "correct" or "incorrect".

``closed_answers=true`` turns answers into choices for constrained decoding: the critic's legal
answers are Correct/Incorrect and the generator's and refiner's the item's ``choices`` (a list
of strings every item must then have) — how the tiny offline model can learn this task on CPU.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from roll.agentic.env.base import StepResult
from roll.agentic.tasks.base import (
    Transcript,
    TranscriptTask,
    choose_item,
    mean,
    ratio,
)
from roll.agentic.tasks.math_check import (
    check_gold_answers,
    check_math_answer,
    tag_contents,
)
from roll.errors import ConfigError

ROLES = ("generator", "critic", "refiner")
GENERATOR, CRITIC, REFINER = range(3)
INSTRUCTIONS = {
    "generator": ("You are the generator. Solve the problem step by step, then give only the "
                  "final answer as <answer>ANSWER</answer>."),
    "critic": ("You are the critic. Check the latest solution above. Say briefly why it is right "
               "or wrong, then give your verdict as <verdict>Correct</verdict> or "
               "<verdict>Incorrect</verdict>."),
    "refiner": ("You are the refiner. Using the critique, write a corrected solution, then give "
                "only the final answer as <answer>ANSWER</answer>."),
}
VERDICTS = ("Correct", "Incorrect")
_VERDICT_WORD = re.compile(r"\b(incorrect|correct)\b", re.IGNORECASE)


def parse_verdict(text: str, lenient: bool = False) -> str | None:
    """'correct', 'incorrect' or None (module docstring)."""
    found = (tag_contents(text, "verdict", ignore_case=True)
             or tag_contents(text, "answer", ignore_case=True)
             or (_VERDICT_WORD.findall(text) if lenient else []))
    if not found:
        return None
    word = found[-1].strip().strip(".*`'\" ").lower()
    return word if word in ("correct", "incorrect") else None


class MathTeam(TranscriptTask):
    """The math team as an env of the game protocol (roll/agentic/tasks/base.py)."""

    name = "math_team"
    roles = ROLES
    instructions = INSTRUCTIONS
    num_seats = len(ROLES)
    cooperative = False
    required_fields = ("question", "answer")

    def __init__(self, items: Sequence[dict[str, Any]], max_rounds: int = 2,
                 closed_answers: bool = False, lenient_answers: bool = False) -> None:
        if not isinstance(max_rounds, int) or isinstance(max_rounds, bool) or max_rounds < 0:
            raise ConfigError("env.params.max_rounds", max_rounds, "must be an integer >= 0")
        self.keep_items(items, closed_answers, lenient_answers)
        self.max_rounds = max_rounds
        self.reset(0)

    @staticmethod
    def check_dataset(items: Sequence[dict[str, Any]]) -> None:
        """Every gold answer parses (a dataset error otherwise, found before any rollout)."""
        check_gold_answers(items, "math_team dataset")

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int, item: int | None = None) -> None:
        self.item = choose_item(self.items, seed, item)
        self.transcript = Transcript(f"Problem: {self.item['question']}")
        self.seat = GENERATOR
        self.rewards = [0.0] * self.num_seats
        self.solutions: list[bool] = []
        """Whether each solution (initial, then each refinement) was correct."""
        self.judged: list[tuple[str | None, bool]] = []
        """(verdict, the judged solution was correct) per critic turn."""

    def legal_actions(self, seat: int) -> list[str]:
        if not self.closed_answers:
            return []
        return list(VERDICTS) if seat == CRITIC else [str(c) for c in self.item["choices"]]

    def step(self, action: str) -> StepResult:
        seat = self.seat
        if seat is None:
            raise ValueError("math_team: the episode is over")
        self.transcript.add(ROLES[seat], action)
        format_error = None
        if seat == CRITIC:
            verdict = parse_verdict(action, self.lenient)
            solution_correct = self.solutions[-1]
            self.judged.append((verdict, solution_correct))
            reward = float(verdict is not None and (verdict == "correct") == solution_correct)
            format_error = None if verdict is not None else "no_verdict"
            refinements = len(self.solutions) - 1
            self.seat = None if verdict == "correct" or refinements >= self.max_rounds else REFINER
        else:
            check = check_math_answer(action, str(self.item["answer"]), self.lenient)
            self.solutions.append(check.correct)
            reward = float(check.correct)
            format_error = None if check.answer is not None else "no_answer"
            self.seat = CRITIC
        rewards = [0.0] * self.num_seats
        rewards[seat] = reward
        self.rewards[seat] += reward
        return StepResult(rewards, self.done, format_error=format_error)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, float]:
        flagged_wrong = sum(v == "incorrect" and not ok for v, ok in self.judged)
        return {
            "initial_correct": float(self.solutions[0]) if self.solutions else 0.0,
            "final_correct": float(self.solutions[-1]) if self.solutions else 0.0,
            "refinements": float(max(0, len(self.solutions) - 1)),
            "critic_turns": float(len(self.judged)),
            "critic_right": float(sum(
                v is not None and (v == "correct") == ok for v, ok in self.judged)),
            "critic_flagged": float(sum(v == "incorrect" for v, _ in self.judged)),
            "critic_flagged_wrong": float(flagged_wrong),
            "critic_judged_wrong": float(sum(not ok for _, ok in self.judged)),
        }

    @staticmethod
    def summarize(episodes: Sequence[dict[str, float]]) -> dict[str, float]:
        """``task/...`` metrics of a rollout from its episodes' ``metrics()``."""
        def total(key: str) -> float:
            return sum(e[key] for e in episodes)

        initial = mean([e["initial_correct"] for e in episodes])
        final = mean([e["final_correct"] for e in episodes])
        return {
            "task/accuracy_initial": initial,
            "task/accuracy_final": final,
            "task/refinement_gain": final - initial,
            "task/refinements": mean([e["refinements"] for e in episodes]),
            "task/critic_accuracy": ratio(total("critic_right"), total("critic_turns")),
            "task/critic_precision": ratio(total("critic_flagged_wrong"),
                                           total("critic_flagged")),
            "task/critic_recall": ratio(total("critic_flagged_wrong"),
                                        total("critic_judged_wrong")),
        }
