"""Play many episodes at once; every pending LLM turn of every env goes into ONE generate call.

Each step of the scheduler:
1. advance every live env through built-in opponents' turns (random, MCTS) until an LLM seat
   (a trained agent or a frozen snapshot) must act, or the episode ends;
2. render the acting seat's prompt, apply the chat template, and batch all those turns into one
   ``engine.generate`` call where each request names its adapter slot (mixed-adapter batch);
3. parse each answer, play it (or the fallback), and credit every seat's rewards to that seat's
   latest turn.
When all episodes are over, the trained agents' turns become rows of one ``TrajectoryBatch``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from roll.agentic.env.actions import (
    ActionConfig,
    FormatCounters,
    apply_parsed_action,
    parse_action,
)
from roll.agentic.env.base import MultiAgentEnv
from roll.agentic.env.opponents import Opponent, build_opponent
from roll.agentic.env.renderers import RenderedPrompt
from roll.agentic.env.seating import Seating, SeatSpec
from roll.batch import TrajectoryBatch
from roll.inference.base import GenerationRequest, SamplingParams
from roll.models.loading import apply_chat_template

EnvFactory = Callable[[], MultiAgentEnv]
Renderer = Callable[[MultiAgentEnv, int], RenderedPrompt]


@dataclass
class RolloutConfig:
    """How one batch of episodes is played."""

    num_groups: int = 4
    """Distinct seeds per rollout (GRPO groups)."""
    group_size: int = 2
    """Episodes per group; they share the seed (same deal, same chance outcomes)."""
    max_turns: int = 64
    """LLM turns per episode before it is cut off (counted as truncated, not as an error)."""
    max_prompt_tokens: int = 2048
    """Longest prompt (after the chat template); a longer one is an error naming the game."""
    constrained_decoding: bool = False
    """Let the model emit only '<answer>LEGAL MOVE</answer>' + EOS for one of the legal moves."""
    system_prompt: str | None = None
    """Optional system message before every prompt."""

    def validate(self) -> RolloutConfig:
        for name in ("num_groups", "group_size", "max_turns", "max_prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"rollout.{name}={value!r}: must be an integer >= 1")
        return self


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
    reward: float = 0.0
    """Rewards this seat received from this turn until its next turn, minus format penalty."""
    format_error: str | None = None


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


@dataclass
class RolloutResult:
    """Everything one rollout produced."""

    batch: TrajectoryBatch | None
    """Trained agents' turns as rows (None if no trained agent acted)."""
    turns: list[Turn]
    episodes: list[EpisodeResult]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Live:
    env: MultiAgentEnv
    group: int
    seed: int
    seating: Seating
    rng: np.random.Generator
    opponents: dict[int, Opponent]
    last_turn: dict[int, Turn] = field(default_factory=dict)
    carry: dict[int, float] = field(default_factory=dict)
    """Rewards a seat earned before its first turn (credited to that first turn)."""
    turns_per_seat: dict[int, int] = field(default_factory=dict)
    llm_turns: int = 0
    truncated: bool = False


class RolloutScheduler:
    """Plays ``num_groups * group_size`` episodes with mixed-adapter batched generation.

    Args:
        env_factory: makes a fresh env (one per episode slot).
        render: prompt of a seat in an env.
        seatings: who plays each seat; group ``g`` uses ``seatings[g % len(seatings)]`` (e.g.
            ``[agent_0, random]`` and ``[random, agent_1]`` so both agents face random).
        agent_names: trained agents in agent-id order.
        engine: an inference engine (``generate(list[GenerationRequest])``).
        tokenizer: for the chat template and constrained completions.
        sampling: sampling parameters of every LLM turn.
        action: answer parsing, format penalty and fallback.
        config: sizes and limits.
        snapshot_slot: maps a snapshot seat spec to the engine slot serving it.
    """

    def __init__(
        self,
        env_factory: EnvFactory,
        render: Renderer,
        seatings: Sequence[Seating],
        agent_names: Sequence[str],
        engine,
        tokenizer,
        sampling: SamplingParams,
        action: ActionConfig,
        config: RolloutConfig,
        snapshot_slot: Callable[[SeatSpec], str] | None = None,
    ) -> None:
        self.env_factory = env_factory
        self.render = render
        if not seatings:
            raise ValueError("RolloutScheduler needs at least one seating")
        self.seatings = list(seatings)
        self.agent_names = list(agent_names)
        self.engine = engine
        self.tokenizer = tokenizer
        self.sampling = sampling
        self.action = action
        self.config = config.validate()
        self.snapshot_slot = snapshot_slot
        self.counters = FormatCounters()

    # ------------------------------------------------------------------ public
    def rollout(
        self, seed: int, progress: Callable[[int, int], None] | None = None
    ) -> RolloutResult:
        """Play one batch of episodes. Group ``g`` uses env seed ``seed * 100_003 + g``."""
        cfg = self.config
        self.counters.reset()
        live: list[_Live] = []
        for group in range(cfg.num_groups):
            env_seed = seed * 100_003 + group
            seating = self.seatings[group % len(self.seatings)]
            for _ in range(cfg.group_size):
                env = self.env_factory()
                env.reset(env_seed)
                # Seeded by the group, not the episode: the members of a GRPO group face the same
                # chance outcomes AND the same opponent randomness, so their returns differ only
                # through what the trained agents chose (a much less noisy group baseline).
                rng = np.random.default_rng([seed, group])
                opponents = {
                    seat: build_opponent(spec, seed=int(rng.integers(2**31)))
                    for seat, spec in enumerate(seating.seats)
                    if not spec.uses_llm
                }
                live.append(_Live(env, group, env_seed, seating, rng, opponents))
        turns: list[Turn] = []
        while True:
            pending = self._advance_opponents(live)
            if not pending:
                break
            turns.extend(self._play_llm_turns(live, pending, seed))
            if progress is not None:
                progress(sum(item.env.done or item.truncated for item in live), len(live))
        episodes = [
            EpisodeResult(
                i, item.group, item.seed, list(item.env.returns()), item.seating, item.truncated
            )
            for i, item in enumerate(live)
        ]
        return RolloutResult(
            self._to_batch(turns, live), turns, episodes, self._metrics(turns, episodes)
        )

    # ------------------------------------------------------------------ stepping
    def _advance_opponents(self, live: list[_Live]) -> list[int]:
        """Play built-in opponents until each env needs the LLM; indices of those envs."""
        pending = []
        for index, item in enumerate(live):
            while not item.env.done and not item.truncated:
                seat = item.env.current_seat()
                spec = item.seating[seat]
                if spec.uses_llm:
                    if item.llm_turns >= self.config.max_turns:
                        item.truncated = True
                        break
                    pending.append(index)
                    break
                move = item.opponents[seat].choose(item.env, seat)
                self._credit(item, item.env.step(move).rewards)
        return pending

    def _play_llm_turns(
        self, live: list[_Live], pending: list[int], seed: int
    ) -> list[Turn]:
        requests, prompts = [], []
        for index in pending:
            env = live[index].env
            # A seed per (rollout, episode, turn): the same turn samples the same tokens
            # whatever else shares the batch, so runs (and resumed runs) are reproducible.
            turn_seed = (seed * 1_000_003 + index * 10_007 + live[index].llm_turns) % 2**31
            seat = env.current_seat()
            prompt = self.render(env, seat)
            prompt_ids = self._prompt_ids(env, prompt.text)
            prompts.append((seat, prompt, prompt_ids))
            requests.append(
                GenerationRequest(
                    prompt_ids=prompt_ids,
                    adapter=self._slot(live[index].seating[seat]),
                    sampling=replace(self.sampling, seed=turn_seed),
                    allowed_completions=self._completions(env, seat),
                )
            )
        outputs = self.engine.generate(requests)
        made = []
        for index, (seat, prompt, prompt_ids), request, output in zip(
            pending, prompts, requests, outputs, strict=True
        ):
            item = live[index]
            spec = item.seating[seat]
            parsed = parse_action(
                output.text,
                item.env.legal_actions(seat),
                self.action,
                numbered_moves=prompt.numbered_moves,
            )
            counter_name = spec.agent_name if spec.is_trained else spec.raw
            turn = Turn(
                env_index=index,
                seat=seat,
                slot=request.adapter,
                trained_agent=spec.agent_name if spec.is_trained else None,
                turn_index=item.turns_per_seat.get(seat, 0),
                prompt_ids=prompt_ids,
                response_ids=list(output.token_ids),
                logprobs=list(output.logprobs),
                reward=item.carry.pop(seat, 0.0),
            )
            item.turns_per_seat[seat] = turn.turn_index + 1
            item.last_turn[seat] = turn
            item.llm_turns += 1
            outcome = apply_parsed_action(
                item.env, seat, parsed, self.action, item.rng, self.counters, counter_name
            )
            turn.format_error = None if outcome.format_error is None else str(outcome.format_error)
            turn.reward -= outcome.penalty
            self._credit(item, outcome.step.rewards)
            made.append(turn)
        return made

    @staticmethod
    def _credit(item: _Live, rewards: Sequence[float]) -> None:
        """Each seat's step reward goes to its latest turn (or waits for its first turn)."""
        for seat, reward in enumerate(rewards):
            if reward == 0.0:
                continue
            if seat in item.last_turn:
                item.last_turn[seat].reward += float(reward)
            else:
                item.carry[seat] = item.carry.get(seat, 0.0) + float(reward)

    def _slot(self, spec: SeatSpec) -> str:
        if spec.kind == "agent":
            return spec.agent_name
        if self.snapshot_slot is None:
            raise ValueError(f"seat_to_agent: {spec.raw!r} needs a snapshot pool")
        return self.snapshot_slot(spec)

    def _prompt_ids(self, env: MultiAgentEnv, text: str) -> list[int]:
        messages = [{"role": "user", "content": text}]
        if self.config.system_prompt:
            messages.insert(0, {"role": "system", "content": self.config.system_prompt})
        ids = apply_chat_template(self.tokenizer, messages)
        if len(ids) > self.config.max_prompt_tokens:
            raise ValueError(
                f"rollout.max_prompt_tokens={self.config.max_prompt_tokens}: a prompt of "
                f"{env.name} has {len(ids)} tokens"
            )
        return ids

    def _completions(self, env: MultiAgentEnv, seat: int) -> list[list[int]] | None:
        if not self.config.constrained_decoding:
            return None
        legal = env.legal_actions(seat)
        if not legal:
            return None
        eos = self.tokenizer.eos_token_id
        return [
            self.tokenizer.encode(f"<answer>{move}</answer>", add_special_tokens=False) + [eos]
            for move in legal
        ]

    # ------------------------------------------------------------------ output
    def _to_batch(self, turns: list[Turn], live: list[_Live]) -> TrajectoryBatch | None:
        rows = [turn for turn in turns if turn.trained_agent is not None]
        if not rows:
            return None
        length = max(len(t.prompt_ids) + len(t.response_ids) for t in rows)
        pad = self.tokenizer.pad_token_id
        n = len(rows)
        input_ids = torch.full((n, length), pad, dtype=torch.long)
        attention_mask = torch.zeros((n, length), dtype=torch.long)
        response_mask = torch.zeros((n, length))
        old_logprobs = torch.zeros((n, length))
        for i, turn in enumerate(rows):
            p, r = len(turn.prompt_ids), len(turn.response_ids)
            input_ids[i, : p + r] = torch.tensor(turn.prompt_ids + turn.response_ids)
            attention_mask[i, : p + r] = 1
            response_mask[i, p : p + r] = 1
            old_logprobs[i, p : p + r] = torch.tensor(turn.logprobs, dtype=torch.float32)

        def column(values):
            return torch.tensor(values, dtype=torch.long)

        return TrajectoryBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            response_mask=response_mask,
            agent_id=column([self.agent_names.index(t.trained_agent) for t in rows]),
            rewards=torch.tensor([t.reward for t in rows], dtype=torch.float32),
            env_id=column([t.env_index for t in rows]),
            seat=column([t.seat for t in rows]),
            group_id=column([live[t.env_index].group for t in rows]),
            turn=column([t.turn_index for t in rows]),
            old_logprobs=old_logprobs,
        )

    def _metrics(self, turns: list[Turn], episodes: list[EpisodeResult]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for agent in self.agent_names:
            own = [t for t in turns if t.trained_agent == agent]
            returns = [ep.returns[s] for ep in episodes for s in ep.seating.seats_of(agent)]
            if not own and not returns:
                continue
            prefix = f"agent_{agent}"
            metrics[f"{prefix}/turns"] = float(len(own))
            if own:
                metrics[f"{prefix}/response_length"] = float(
                    np.mean([len(t.response_ids) for t in own])
                )
                metrics[f"{prefix}/format_error_rate"] = float(
                    np.mean([t.format_error is not None for t in own])
                )
                metrics[f"{prefix}/turn_reward"] = float(np.mean([t.reward for t in own]))
            if returns:
                metrics[f"{prefix}/episode_return"] = float(np.mean(returns))
                metrics[f"{prefix}/win_rate"] = float(np.mean([r > 0 for r in returns]))
        for key, value in self.counters.metrics().items():
            agent, rest = key.split("/", 1)
            metrics[f"agent_{agent}/{rest}"] = value
        metrics["rollout/episodes"] = float(len(episodes))
        metrics["rollout/truncated"] = float(sum(ep.truncated for ep in episodes))
        metrics["rollout/llm_turns"] = float(len(turns))
        return metrics
