"""CORY (Ma et al. 2024, "Coevolving with the Other You"): one single-agent task, two agents.

A pioneer answers the problem; an observer then answers it seeing the pioneer's answer. The
two roles swap agents every K training steps (``env.swap_roles_every``, a pipeline setting:
the task itself always seats role 0 = pioneer, role 1 = observer), so both agents learn to
answer alone and to build on another answer.

What each role sees: the pioneer the problem and its instruction; the observer the problem,
the pioneer's answer (under ``[pioneer]``) and its instruction.

Rewards: each answer scores 1 if its final answer (last ``<answer>…</answer>``, else
``\\boxed{}``) equals the gold by math-verify, else 0 (no parseable answer: format error
``no_answer``). With ``collective=true`` (the paper's collective task reward, the default) both
roles get the sum of the two scores, paid at the end of the episode, so the task is
cooperative (``team/score``); with ``collective=false`` each role gets its own score.

``closed_answers=true`` lists the item's ``choices`` as the legal answers for constrained
decoding (the tiny offline model on CPU); ``lenient_answers=true`` also reads a last number.
Metrics: ``task/accuracy_pioneer``, ``task/accuracy_observer`` and ``task/observer_gain``
(observer minus pioneer accuracy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from roll.agentic.env.base import StepResult
from roll.agentic.tasks.base import (
    Transcript,
    TranscriptTask,
    choose_item,
    mean,
)
from roll.agentic.tasks.math_check import check_gold_answers, check_math_answer

ROLES = ("pioneer", "observer")
PIONEER, OBSERVER = range(2)
INSTRUCTIONS = {
    "pioneer": ("You are the pioneer. Solve the problem step by step, then give only the final "
                "answer as <answer>ANSWER</answer>."),
    "observer": ("You are the observer. Another model's answer is shown above; it may be wrong. "
                 "Solve the problem, then give only the final answer as <answer>ANSWER</answer>."),
}


class Cory(TranscriptTask):
    """Pioneer then observer on one problem (module docstring)."""

    name = "cory"
    roles = ROLES
    instructions = INSTRUCTIONS
    num_seats = len(ROLES)
    required_fields = ("question", "answer")

    def __init__(self, items: Sequence[dict[str, Any]], collective: bool = True,
                 closed_answers: bool = False, lenient_answers: bool = False) -> None:
        self.keep_items(items, closed_answers, lenient_answers, collective=collective)
        self.collective = collective
        self.cooperative = collective
        self.reset(0)

    @staticmethod
    def check_dataset(items: Sequence[dict[str, Any]]) -> None:
        check_gold_answers(items, "cory dataset")

    # ------------------------------------------------------------------ protocol
    def reset(self, seed: int, item: int | None = None) -> None:
        self.item = choose_item(self.items, seed, item)
        self.transcript = Transcript(f"Problem: {self.item['question']}")
        self.seat = PIONEER
        self.correct = [False, False]
        self.rewards = [0.0, 0.0]

    def legal_actions(self, seat: int) -> list[str]:
        return [str(c) for c in self.item["choices"]] if self.closed_answers else []

    def step(self, action: str) -> StepResult:
        seat = self.seat
        if seat is None:
            raise ValueError("cory: the episode is over")
        self.transcript.add(ROLES[seat], action)
        check = check_math_answer(action, str(self.item["answer"]), self.lenient)
        self.correct[seat] = check.correct
        format_error = None if check.answer is not None else "no_answer"
        self.seat = OBSERVER if seat == PIONEER else None
        rewards = [0.0, 0.0]
        if not self.collective:
            rewards[seat] = float(check.correct)
        elif self.seat is None:  # the end: both roles get the sum of both scores
            rewards = [float(sum(self.correct))] * 2
        self.rewards = [a + b for a, b in zip(self.rewards, rewards, strict=True)]
        return StepResult(rewards, self.done, format_error=format_error)

    # ------------------------------------------------------------------ metrics
    def metrics(self) -> dict[str, float]:
        return {"pioneer_correct": float(self.correct[PIONEER]),
                "observer_correct": float(self.correct[OBSERVER])}

    @staticmethod
    def summarize(episodes: Sequence[dict[str, float]]) -> dict[str, float]:
        pioneer = mean([e["pioneer_correct"] for e in episodes])
        observer = mean([e["observer_correct"] for e in episodes])
        return {"task/accuracy_pioneer": pioneer, "task/accuracy_observer": observer,
                "task/observer_gain": observer - pioneer}
