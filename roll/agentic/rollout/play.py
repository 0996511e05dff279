"""One rollout's episodes while they are played, and the engine calls that serve them.

A ``Play`` holds the scheduler's side of a batch of episodes in flight: the requests waiting on
the engine, the answers whose env steps are under way, the LLM turns so far, the format
counters. ``serve_plays`` serves a rollout's ``Play`` and, optionally, the NEXT rollouts'
(lookahead): whenever one of this rollout's episodes ends and fewer requests are in flight than
it has lanes (decode lanes left idle by the rollout's tail), the next rollouts' episodes are
admitted one by one, in episode order, the nearest rollout's first, and played with the
adapters of now. When this rollout's last episode ends, admission stops: the requests still in
flight finish (one answer each at most) and every episode's next turn waits, *parked*, for its
own rollout or the one before it, which serves it with the adapters of then
(``RolloutScheduler.rollout(ahead_seeds=)``).

What lookahead changes and what it does not. The later rollouts' episodes (seeds, seatings,
groups, order) and every turn's sampling seed are the same with or without it, so with adapters
that do not change in between their trajectories are the same; with training in between, the
turns played ahead come from adapters one or more updates older (``Turn.ahead``), and are
trained on as they are (no importance correction: the PPO ratio is taken against the log-probs
the trainer recomputes, as for every row).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

from roll.agentic.env.actions import FormatCounters
from roll.agentic.rollout.episode import Ask, EpisodeHost, EpisodeSetup, EpisodeSpec
from roll.agentic.rollout.results import Turn
from roll.inference.base import GenerationOutput, GenerationRequest, serve
from roll.inference.constrained import CompletionTrie

if TYPE_CHECKING:  # annotations only: the scheduler imports this module
    from roll.agentic.rollout.scheduler import RolloutScheduler


class Serving:
    """The requests of one ``serve`` call: numbered in the order they are made (base.Follow),
    each owned by the ``Play`` that made it; tokens decoded for every play."""

    def __init__(self) -> None:
        self.keys = itertools.count()
        self.owner: dict[int, Play] = {}
        self.decoded_tokens = 0
        """Tokens generated in this call, whichever rollout they belong to."""

    def key(self, play: Play) -> int:
        key = next(self.keys)
        self.owner[key] = play
        return key


class Play:
    """A rollout's episodes in flight (module docstring). Opens them on ``host`` at once; each
    one's next LLM turn is *parked* until requested (``unpark``) or served at once (``played``)
    while the play is ``admitting``."""

    def __init__(self, scheduler: RolloutScheduler, host: EpisodeHost, setup: EpisodeSetup,
                 specs: list[EpisodeSpec], seed: int, ahead: bool = False) -> None:
        self.scheduler, self.host, self.specs, self.seed = scheduler, host, specs, seed
        self.ahead = ahead
        """Played during an earlier rollout (lookahead): turns made now are ``Turn.ahead``."""
        self.admitting = True
        """False: an episode's next turn is parked instead of requested (a lookahead whose
        rollout ended)."""
        self.progress: Callable[[int, int], None] | None = None
        self.waiting: dict[int, tuple[int, Ask, list[int], list[int] | None,
                                      GenerationRequest]] = {}
        """request key -> (episode index, ask, prompt ids, critic view ids, request)."""
        self.stepping: dict[int, tuple[Ask, list[int], list[int] | None, GenerationRequest,
                                       GenerationOutput]] = {}
        """episode index -> its answer whose env step is under way (one per episode)."""
        self.turns: list[Turn] = []
        self.turns_per_seat: list[dict[int, int]] = [{} for _ in specs]
        self.counters = FormatCounters()
        self.prompts_too_long = 0
        """Episodes cut because a prompt exceeded max_prompt_tokens."""
        self.parked: dict[int, Ask] = {}
        self.started: set[int] = set()
        """Episodes whose turns have been requested (a lookahead: the ones admitted)."""
        self.done = 0
        for index, ask in enumerate(host.open(setup, specs)):
            if ask is None:
                self.done += 1
            else:
                self.parked[index] = ask

    @property
    def finished(self) -> bool:
        return self.done == len(self.specs)

    def unpark(self, serving: Serving, limit: int | None = None) -> list[GenerationRequest]:
        """Requests for the parked turns, in episode order (at most ``limit`` episodes)."""
        new: list[GenerationRequest] = []
        for index in sorted(self.parked)[:limit]:
            self.started.add(index)
            new += self.request(index, self.parked.pop(index), serving)
        return new

    def request(self, index: int, ask: Ask, serving: Serving) -> list[GenerationRequest]:
        """The turn's request; none when its prompt (or the centralised critic's view of the
        turn) is too long: the episode ends there, truncated (counted, never trained as a
        finished game)."""
        scheduler = self.scheduler
        prompt_ids = scheduler.chat_ids(ask.prompt.text)
        critic_ids = (scheduler.chat_ids(ask.critic_prompt)
                      if ask.critic_prompt is not None
                      and self.specs[index].seating[ask.seat].is_trained else None)
        longest = max(len(prompt_ids), len(critic_ids) if critic_ids is not None else 0)
        if longest > scheduler.config.max_prompt_tokens:
            self.host.cut(index)
            self.prompts_too_long += 1
            self._episode_over()
            return []
        made = scheduler.turn_request(self.specs[index], ask, index, self.seed, prompt_ids)
        self.waiting[serving.key(self)] = (index, ask, prompt_ids, critic_ids, made)
        return [made]

    def follow(self, key: int, output: GenerationOutput, serving: Serving
               ) -> list[GenerationRequest]:
        """An answer is done: its env step starts (here, or on an env worker while the engine
        goes on); the follow-ups of every env step done by now."""
        index, ask, prompt_ids, critic_ids, made = self.waiting.pop(key)
        self.scheduler.check_output_version(made, output)
        serving.decoded_tokens += len(output.token_ids)
        self.stepping[index] = (ask, prompt_ids, critic_ids, made, output)
        self.host.start(index, output.text)
        return self.played(False, serving)

    def played(self, wait: bool, serving: Serving) -> list[GenerationRequest]:
        """Turns of the env steps done by now; each episode's next request, if any (parked
        instead when the play is not admitting)."""
        new: list[GenerationRequest] = []
        for index, result, following in self.host.done(wait):
            ask, prompt_ids, critic_ids, made, output = self.stepping.pop(index)
            spec = self.specs[index].seating[ask.seat]
            counted = self.turns_per_seat[index]
            turn_index = counted.get(ask.seat, 0)
            counted[ask.seat] = turn_index + 1
            self.counters.record(spec.agent_name if spec.is_trained else spec.raw,
                                 result.format_error, result.fallback)
            self.turns.append(Turn(
                env_index=index, seat=ask.seat, slot=made.adapter,
                trained_agent=spec.agent_name if spec.is_trained else None,
                turn_index=turn_index, prompt_ids=prompt_ids,
                response_ids=list(output.token_ids), logprobs=list(output.logprobs),
                choices=(None if made.allowed_completions is None else CompletionTrie.of(
                    made.allowed_completions).branch_points(list(output.token_ids))),
                critic_prompt_ids=critic_ids,
                format_error=result.format_error,
                truncated=output.finish_reason == "length" and result.no_answer,
                ahead=self.ahead,
            ))
            if following is None:
                self._episode_over()
            elif self.admitting:
                new += self.request(index, following, serving)
            else:
                self.parked[index] = following
        return new

    def _episode_over(self) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, len(self.specs))


def serve_plays(scheduler: RolloutScheduler, play: Play, aheads: list[Play]) -> Serving:
    """Serve ``play`` to its end on the scheduler's engine, admitting the episodes of the
    rollouts after it (``aheads``, nearest first) into the lanes its tail leaves idle (module
    docstring)."""
    serving = Serving()
    first = play.unpark(serving)
    if not first:
        return serving  # nothing to serve; lookaheads stay parked (as if never admitted)
    # The lanes of a rollout of these episodes: a play that began ahead has fewer turns left
    # to start with, and the next rollouts' episodes take the lanes they leave.
    lanes = min(len(play.specs), getattr(scheduler.engine, "max_batch_size", len(play.specs)))
    plays = [play, *aheads]

    def admit() -> list[GenerationRequest]:
        """The next rollouts' turns, one episode at a time (the nearest rollout's first),
        while lanes are idle."""
        if not aheads or not aheads[0].admitting:
            return []
        if play.finished:
            for ahead in aheads:
                ahead.admitting = False  # the rest waits for the next rollouts
            return []
        new: list[GenerationRequest] = []
        for ahead in aheads:
            while sum(len(p.waiting) for p in plays) < lanes and ahead.parked:
                new += ahead.unpark(serving, limit=1)
        return new

    def follow(key: int, output: GenerationOutput) -> list[GenerationRequest]:
        return serving.owner.pop(key).follow(key, output, serving) + admit()

    class Later:  # the env steps still under way, as the engine's ``serve`` sees them
        @staticmethod
        def outstanding() -> int:
            return sum(p.host.outstanding() for p in plays)

        @staticmethod
        def ready(wait: bool) -> list[GenerationRequest]:
            new = [made for ahead in aheads for made in ahead.played(False, serving)]
            return new + play.played(wait and not new, serving) + admit()

    first += admit()
    serve(scheduler.engine, first, follow,
          context_len=scheduler.config.max_prompt_tokens + scheduler.sampling.max_new_tokens,
          continuous=scheduler.config.continuous, later=Later())
    return serving
