"""The env side of episodes: everything a rollout does between two LLM answers.

An ``Episode`` owns one env with its seating, built-in opponents and the random stream of its
group. It plays the opponents' turns, renders the prompt of the LLM seat that must act next
(``Ask``), plays that seat's answer (parse, fallback or forfeit) and credits every seat's step
rewards to its latest turn. The rollout (scheduler.py) keeps the other side: tokens, requests,
engine calls, trajectories. Between the two only text and numbers travel, so the episodes of a
rollout can live in the rollout's process (``LocalEpisodes``, the default) or in env worker
processes (``roll.distributed.ray_env``, Ray actors for CPU-heavy games and opponents):
the same seeds give the same episodes either way.

Rewards. A seat's turn earns what the seat receives from that turn until its next one, minus the
format penalty; rewards a seat receives before its first turn are carried to that turn.

Team tasks (roll/agentic/tasks/base.py) are envs that parse their own answers: their ``step``
gets the whole answer text (thinking removed), reports an unusable answer as
``StepResult.format_error`` (penalised and counted like a game's) and nothing is played in its
place. Their episodes get the dataset item of their group (``EpisodeSpec.item``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from roll.agentic.env.actions import (
    ActionConfig,
    apply_parsed_action,
    parse_action,
    strip_thinking,
)
from roll.agentic.env.base import MultiAgentEnv, global_view
from roll.agentic.env.renderers import RenderedPrompt
from roll.agentic.env.seating import Seating

EnvFactory = Callable[[], MultiAgentEnv]
Renderer = Callable[[MultiAgentEnv, int], RenderedPrompt]


@dataclass(frozen=True)
class EpisodeSetup:
    """What every episode of a rollout shares (sent once per rollout to each env worker)."""

    env_factory: EnvFactory
    render: Renderer
    action: ActionConfig
    max_turns: int
    """LLM turns before the episode is cut off (truncated)."""
    critic_view: bool = False
    """Also render each LLM turn's global view for centralised critics (``Ask.critic_prompt``,
    ``roll.agentic.env.base.global_view``)."""


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode: its GRPO group, env seed, seating and the rollout's seed."""

    group: int
    seed: int
    seating: Seating
    rollout_seed: int
    item: int | None = None
    """Team tasks: the dataset item of the episode's group (None for games)."""
    member: int | None = None
    """Independent deals (``RolloutConfig.shared_deals=False``): the episode's index in its
    group, which seeds its own opponent randomness; None: the group's, shared."""


@dataclass
class Ask:
    """An LLM seat must act: its prompt and legal moves (empty: free-form answer)."""

    seat: int
    prompt: RenderedPrompt
    legal: list[str]
    env_name: str
    turn: int
    """The episode's LLM turns so far (0 for its first)."""
    critic_prompt: str | None = None
    """With ``EpisodeSetup.critic_view``: the global view a centralised critic reads for this
    turn (the acting seat's prompt plus every seat's observation); None otherwise."""


@dataclass
class Played:
    """What playing an answer did."""

    format_error: str | None
    """The kind of format error (None: the answer was a legal move)."""
    fallback: str | None
    """'random' or 'forfeit' when the answer could not be played."""
    no_answer: bool
    """No answer could be parsed from the text at all."""


@dataclass
class EpisodeOutcome:
    """An episode once over: returns, truncation, and each seat's turn rewards in order."""

    returns: list[float]
    truncated: bool
    turn_rewards: dict[int, list[float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    """Team tasks: the task's own numbers for this episode (``metrics()``); {} for games."""


class Episode:
    """One episode, from reset to its end (see the module docstring)."""

    def __init__(self, setup: EpisodeSetup, spec: EpisodeSpec) -> None:
        self.setup = setup
        self.seating = spec.seating
        self.env = setup.env_factory()
        if spec.item is None:
            self.env.reset(spec.seed)
        else:
            self.env.reset(spec.seed, item=spec.item)
        # Seeded by the group, not the episode: the members of a GRPO group face the same chance
        # outcomes AND the same opponent randomness, so their returns differ only through what
        # the trained agents chose (a much less noisy group baseline) -- unless deals are
        # independent (spec.member set).
        self.rng = np.random.default_rng(
            [spec.rollout_seed, spec.group] + ([] if spec.member is None else [spec.member]))
        self.opponents = {}
        for seat, seat_spec in enumerate(spec.seating.seats):
            if not seat_spec.uses_llm:
                from roll.agentic.env.opponents import build_opponent  # OpenSpiel: games only

                self.opponents[seat] = build_opponent(seat_spec,
                                                      seed=int(self.rng.integers(2**31)))
        self.turn_rewards: dict[int, list[float]] = {}
        self.carry: dict[int, float] = {}
        self.llm_turns = 0
        self.truncated = False
        self.asked: Ask | None = None

    def next_ask(self) -> Ask | None:
        """Play built-in opponents until an LLM seat must act (its ``Ask``) or the episode is
        over (None)."""
        env = self.env
        while not env.done and not self.truncated:
            seat = env.current_seat()
            spec = self.seating[seat]
            if spec.uses_llm:
                if self.llm_turns >= self.setup.max_turns:
                    self.truncated = True
                    break
                prompt = self.setup.render(env, seat)
                critic_prompt = (global_view(env, seat, prompt.text) if self.setup.critic_view
                                 else None)
                self.asked = Ask(seat, prompt, env.legal_actions(seat), env.name,
                                 self.llm_turns, critic_prompt)
                return self.asked
            self._credit(env.step(self.opponents[seat].choose(env, seat)).rewards)
        self.asked = None
        return None

    def play(self, text: str) -> Played:
        """Play the asked seat's answer ``text`` (or the fallback) and credit the rewards."""
        if self.asked is None:
            raise RuntimeError("Episode.play: no LLM seat was asked to act")
        seat, prompt = self.asked.seat, self.asked.prompt
        rewards = self.turn_rewards.setdefault(seat, [])
        rewards.append(self.carry.pop(seat, 0.0))
        self.llm_turns += 1
        self.asked = None
        if getattr(self.env, "parses_answers", False):
            step = self.env.step(strip_thinking(text))
            if step.format_error is not None:
                rewards[-1] -= self.setup.action.format_penalty
            self._credit(step.rewards)
            return Played(step.format_error, None, step.format_error is not None)
        parsed = parse_action(text, self.env.legal_actions(seat), self.setup.action,
                              numbered_moves=prompt.numbered_moves)
        outcome = apply_parsed_action(self.env, seat, parsed, self.setup.action, self.rng)
        rewards[-1] -= outcome.penalty
        self._credit(outcome.step.rewards)
        return Played(None if outcome.format_error is None else str(outcome.format_error),
                      outcome.fallback, parsed.answer is None)

    def cut(self) -> None:
        """End the episode here, as truncated (its next prompt cannot be served)."""
        self.truncated = True
        self.asked = None

    def outcome(self) -> EpisodeOutcome:
        task_metrics = getattr(self.env, "metrics", None)
        return EpisodeOutcome(list(self.env.returns()), self.truncated,
                              {seat: list(r) for seat, r in self.turn_rewards.items()},
                              dict(task_metrics()) if callable(task_metrics) else {})

    def _credit(self, rewards: Sequence[float]) -> None:
        """Each seat's step reward goes to its latest turn (or waits for its first turn)."""
        for seat, reward in enumerate(rewards):
            if reward == 0.0:
                continue
            if seat in self.turn_rewards:
                self.turn_rewards[seat][-1] += float(reward)
            else:
                self.carry[seat] = self.carry.get(seat, 0.0) + float(reward)


class EpisodeHost(Protocol):
    """Where a rollout's episodes live. Episodes are numbered in the order ``open`` got them."""

    def open(self, setup: EpisodeSetup, specs: list[EpisodeSpec]) -> list[Ask | None]:
        """Start these episodes (forgetting earlier ones); each one's first ``Ask`` (None: over
        before any LLM turn)."""
        ...

    def start(self, index: int, text: str) -> None:
        """Begin playing episode ``index``'s answer (it may run elsewhere meanwhile; one answer
        per episode at a time)."""
        ...

    def done(self, wait: bool) -> list[tuple[int, Played, Ask | None]]:
        """The answers played since the last call, by episode index: (index, what it did, the
        episode's next ``Ask``); ``wait``: block until at least one is, if any is started."""
        ...

    def outstanding(self) -> int:
        """Answers started and not yet returned by ``done``."""
        ...

    def cut(self, index: int) -> None:
        """End episode ``index`` as truncated (its next prompt is too long to serve)."""
        ...

    def outcomes(self) -> list[EpisodeOutcome]:
        """Every episode's outcome, in episode order (call once all are over)."""
        ...


class LocalEpisodes:
    """Episodes in this process (the default host)."""

    def __init__(self) -> None:
        self.episodes: list[Episode] = []
        self.played: list[tuple[int, Played, Ask | None]] = []

    def open(self, setup: EpisodeSetup, specs: list[EpisodeSpec]) -> list[Ask | None]:
        self.episodes = [Episode(setup, spec) for spec in specs]
        self.played = []
        return [episode.next_ask() for episode in self.episodes]

    def play(self, index: int, text: str) -> tuple[Played, Ask | None]:
        """Play episode ``index``'s answer now: what it did and its next ``Ask``."""
        episode = self.episodes[index]
        played = episode.play(text)
        return played, episode.next_ask()

    def start(self, index: int, text: str) -> None:
        self.played.append((index, *self.play(index, text)))  # here and now

    def done(self, wait: bool) -> list[tuple[int, Played, Ask | None]]:
        played, self.played = self.played, []
        return played

    def outstanding(self) -> int:
        return len(self.played)

    def cut(self, index: int) -> None:
        self.episodes[index].cut()

    def outcomes(self) -> list[EpisodeOutcome]:
        return [episode.outcome() for episode in self.episodes]
