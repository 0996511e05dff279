"""Debate and majority vote on math: N answerers, R rounds, the team answer by majority.

Round 1: every debater answers the problem on its own (sees only the problem). Round r > 1:
each sees the problem, its own answer of round r - 1 and the others' answers of round r - 1
(all of them, under their role names), and answers again. Within a round the debaters act in
seat order, but none sees another's answer of the SAME round, so the order does not matter.
``majority_vote`` is one round (independent voters, no debate).

Team answer: the majority of the last round's final answers, votes counted by math-verify
equivalence (``7``, ``7.0`` and ``14/2`` are one vote); a tie goes to the answer given first
in seat order; unparseable answers do not vote.

Rewards of a debater's turn: ``own_weight`` × (its answer of that turn is correct), plus, on
its last-round turn, ``team_weight`` × (the team answer is correct). No parseable final answer
is the format error ``no_answer``. Metrics: team accuracy, the debaters' mean accuracy in the
first and the last round (and the gain between them), and how often a last-round answer agrees
with the team answer.

``closed_answers=true``: the answers are the item's ``choices`` (constrained decoding), and
``lenient_answers=true``: an answer may also be the last number of the text, as in math_team.
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
from roll.agentic.tasks.math_check import (
    check_gold_answers,
    check_math_answer,
    equivalent,
)
from roll.errors import ConfigError

INSTRUCTION_FIRST = ("You are {role}. Solve the problem step by step, then give only the final "
                     "answer as <answer>ANSWER</answer>.")
INSTRUCTION_LATER = ("You are {role}. Above are your answer and the other debaters' answers "
                     "from the last round. Weigh them, solve the problem again, then give only "
                     "the final answer as <answer>ANSWER</answer>.")


def majority(answers: Sequence[str | None]) -> str | None:
    """The answer most debaters gave (math-verify equivalence), the earliest on a tie; None
    when no answer parses."""
    clusters: list[tuple[str, int]] = []  # (first answer of the cluster, votes)
    for answer in answers:
        if answer is None:
            continue
        for index, (first, votes) in enumerate(clusters):
            if equivalent(first, answer):
                clusters[index] = (first, votes + 1)
                break
        else:
            clusters.append((answer, 1))
    if not clusters:
        return None
    best = max(votes for _, votes in clusters)
    return next(first for first, votes in clusters if votes == best)


class Debate(TranscriptTask):
    """Debate (or majority vote) as an env of the game protocol (roll/agentic/tasks/base.py)."""

    cooperative = False
    required_fields = ("question", "answer")

    def __init__(self, items: Sequence[dict[str, Any]], debaters: int = 3, rounds: int = 2,
                 team_weight: float = 1.0, own_weight: float = 1.0,
                 closed_answers: bool = False, lenient_answers: bool = False, *,
                 name: str = "debate",
                 role: str = "debater") -> None:
        for key, value, low in (("debaters", debaters, 2), ("rounds", rounds, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"env.params.{key}", value, f"must be an integer >= {low}")
        for key, value in (("team_weight", team_weight), ("own_weight", own_weight)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"env.params.{key}", value, "must be a number >= 0")
        self.name = name
        self.keep_items(items, closed_answers, lenient_answers)
        self.roles = tuple(f"{role}_{i}" for i in range(debaters))
        self.num_seats = debaters
        self.rounds = rounds
        self.team_weight = float(team_weight)
        self.own_weight = float(own_weight)
        self.reset(0)

    @staticmethod
    def check_dataset(items: Sequence[dict[str, Any]]) -> None:
        check_gold_answers(items, "debate dataset")

    def reset(self, seed: int, item: int | None = None) -> None:
        self.item = choose_item(self.items, seed, item)
        self.round = 0
        self.seat = 0
        self.texts: list[list[str]] = [[] for _ in range(self.rounds)]
        """Each round's answers, in seat order."""
        self.answers: list[list[str | None]] = [[] for _ in range(self.rounds)]
        self.correct: list[list[bool]] = [[] for _ in range(self.rounds)]
        self.rewards = [0.0] * self.num_seats
        self.team_answer: str | None = None
        self.team_correct = False

    def global_observation(self) -> str:
        """The problem and every answer of every round so far (what a centralised critic
        reads)."""
        transcript = Transcript(f"Problem: {self.item['question']}")
        for number, texts in enumerate(self.texts[: self.round + 1], start=1):
            for seat, text in enumerate(texts):
                transcript.add(f"{self.roles[seat]}, round {number}", text)
        return transcript.render(None)

    def observation(self, seat: int) -> str:
        transcript = Transcript(f"Problem: {self.item['question']}")
        role = self.roles[seat]
        if self.round == 0:
            return transcript.render(INSTRUCTION_FIRST.format(role=role))
        for other, text in enumerate(self.texts[self.round - 1]):
            transcript.add(self.roles[other] + (" (you)" if other == seat else ""), text)
        return transcript.render(INSTRUCTION_LATER.format(role=role))

    def legal_actions(self, seat: int) -> list[str]:
        return [str(c) for c in self.item["choices"]] if self.closed_answers else []

    def step(self, action: str) -> StepResult:
        seat = self.seat
        if seat is None:
            raise ValueError(f"{self.name}: the episode is over")
        check = check_math_answer(action, str(self.item["answer"]), self.lenient)
        self.texts[self.round].append(action.strip())
        self.answers[self.round].append(check.answer)
        self.correct[self.round].append(check.correct)
        rewards = [0.0] * self.num_seats
        rewards[seat] = self.own_weight * check.correct
        last_turn = self.round == self.rounds - 1 and seat == self.num_seats - 1
        if seat < self.num_seats - 1:
            self.seat = seat + 1
        elif self.round < self.rounds - 1:
            self.round, self.seat = self.round + 1, 0
        else:
            self.seat = None
        if last_turn:  # the team's answer: every debater's last turn gets its share
            self.team_answer = majority(self.answers[-1])
            self.team_correct = self.team_answer is not None and check_math_answer(
                f"<answer>{self.team_answer}</answer>", str(self.item["answer"])).correct
            for other in range(self.num_seats):
                rewards[other] += self.team_weight * self.team_correct
        for other, reward in enumerate(rewards):
            self.rewards[other] += reward
        return StepResult(rewards, self.done,
                          format_error=None if check.answer is not None else "no_answer")

    def metrics(self) -> dict[str, float]:
        last = self.answers[-1]
        agree = [answer is not None and self.team_answer is not None
                 and equivalent(answer, self.team_answer) for answer in last]
        return {
            "team_correct": float(self.team_correct),
            "first_round_accuracy": mean([float(c) for c in self.correct[0]]),
            "last_round_accuracy": mean([float(c) for c in self.correct[-1]]),
            "agreement": mean([float(a) for a in agree]),
        }

    @staticmethod
    def summarize(episodes: Sequence[dict[str, float]]) -> dict[str, float]:
        first = mean([e["first_round_accuracy"] for e in episodes])
        last = mean([e["last_round_accuracy"] for e in episodes])
        return {
            "task/team_accuracy": mean([e["team_correct"] for e in episodes]),
            "task/accuracy_first_round": first,
            "task/accuracy_last_round": last,
            "task/debate_gain": last - first,
            "task/agreement": mean([e["agreement"] for e in episodes]),
        }


def majority_vote(items: Sequence[dict[str, Any]], voters: int = 3, team_weight: float = 1.0,
                  own_weight: float = 1.0, closed_answers: bool = False,
                  lenient_answers: bool = False) -> Debate:
    """Independent voters, the team answer by majority: a debate of one round."""
    if not isinstance(voters, int) or isinstance(voters, bool) or voters < 2:
        raise ConfigError("env.params.voters", voters, "must be an integer >= 2")
    return Debate(items, debaters=voters, rounds=1, team_weight=team_weight,
                  own_weight=own_weight, closed_answers=closed_answers,
                  lenient_answers=lenient_answers, name="majority_vote", role="voter")
