"""What a rollout produces: LLM turns, episode outcomes, and the two together.

Wins. ``EpisodeResult.outcome`` is the one definition of a win used by training metrics and
evaluation: a seat wins when its return is strictly above every other seat's (alone in the game:
above 0), draws when it ties the best of them. In a cooperative game (identical utilities, e.g.
Hanabi) every seat gets the same return, so there is no win rate: ``team/score`` (the shared
return) is reported instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from roll.agentic.env.actions import FormatCounters
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
    choices: list[tuple[int, list[int], list[int]]] | None = None
    """Constrained turns: the branching points along the response, ``(offset in the response,
    legal tokens there, legal answers below each)`` (``CompletionTrie.branch_points``)."""
    reward: float = 0.0
    """Rewards this seat received from this turn until its next turn, minus format penalty."""
    format_error: str | None = None
    truncated: bool = False
    """The answer hit max_new_tokens before any answer appeared in it (cut off, e.g. while
    thinking): a sign that rollout.sampling.max_new_tokens is too small."""
    ahead: bool = False
    """Played during an earlier rollout's tail (lookahead, play.py), with adapters one or more
    updates older than this rollout's."""


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


def turns_to_batch(turns: list[Turn], groups: Sequence[int], truncated: Sequence[bool],
                   agent_names: Sequence[str], pad_id: int, critic_view: bool
                   ) -> TrajectoryBatch | None:
    """The trained agents' turns as rows of one batch (None: no trained agent acted);
    ``groups[e]`` is episode e's group, ``truncated[e]`` whether it was cut."""
    rows = [turn for turn in turns if turn.trained_agent is not None]
    if not rows:
        return None
    input_ids, attention_mask, response_mask = pad_rows(
        [t.prompt_ids for t in rows], [t.response_ids for t in rows], pad_id)
    engine_logprobs = torch.zeros(response_mask.shape)
    engine_logprobs[response_mask.bool()] = torch.tensor(
        [logprob for t in rows for logprob in t.logprobs], dtype=torch.float32)

    def column(values):
        return torch.tensor(values, dtype=torch.long)

    extra = {}
    if critic_view:  # the centralised critic's layout: global view, then the response
        extra = dict(zip(("critic_input_ids", "critic_attention_mask", "critic_response_mask"),
                         pad_rows([t.critic_prompt_ids for t in rows],
                                  [t.response_ids for t in rows], pad_id), strict=True))
    if any(t.choices for t in rows):
        extra["choice_tokens"], extra["choice_leaves"] = choice_tensors(rows, input_ids.shape[1])
    return TrajectoryBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        agent_id=column([agent_names.index(t.trained_agent) for t in rows]),
        rewards=torch.tensor([t.reward for t in rows], dtype=torch.float32),
        env_id=column([t.env_index for t in rows]),
        seat=column([t.seat for t in rows]),
        group_id=column([groups[t.env_index] for t in rows]),
        turn=column([t.turn_index for t in rows]),
        truncated=torch.tensor([bool(truncated[t.env_index]) for t in rows]),
        engine_logprobs=engine_logprobs,
        **extra,
    )


def choice_tensors(rows: list[Turn], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``TrajectoryBatch.choice_tokens`` (B, T, C) long (-1 padded) and ``choice_leaves``
    (B, T, C) float of the rows' branching points, at their positions in the padded rows."""
    width = max((len(tokens) for t in rows for _, tokens, _ in t.choices or ()), default=1)
    tokens = torch.full((len(rows), length, width), -1, dtype=torch.long)
    leaves = torch.zeros((len(rows), length, width))
    for r, turn in enumerate(rows):
        for offset, legal, below in turn.choices or ():
            position = len(turn.prompt_ids) + offset
            tokens[r, position, :len(legal)] = torch.tensor(legal)
            leaves[r, position, :len(below)] = torch.tensor(below, dtype=torch.float32)
    return tokens, leaves


def pad_rows(prompts: list[list[int]], responses: list[list[int]], pad_id: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of prompt then response, right-padded: input_ids (B, T) long, attention_mask
    (B, T) long, response_mask (B, T) float."""
    length = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    n = len(prompts)
    input_ids = torch.full((n, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, length), dtype=torch.long)
    response_mask = torch.zeros((n, length))
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        p, r = len(prompt), len(response)
        input_ids[i, : p + r] = torch.tensor(prompt + response)
        attention_mask[i, : p + r] = 1
        response_mask[i, p : p + r] = 1
    return input_ids, attention_mask, response_mask


def rollout_metrics(turns: list[Turn], episodes: list[EpisodeResult],
                    agent_names: Sequence[str], cooperative: bool, counters: FormatCounters,
                    summarize: Callable[[list[dict[str, float]]], dict[str, float]] | None
                    ) -> dict[str, float]:
    """Per-agent keys ``<agent>/<metric>``, ``team/score`` (cooperative games) and
    ``rollout/...``; format counters of snapshot seats go under ``rollout/<spec>/``."""
    metrics: dict[str, float] = {}
    for agent in agent_names:
        own = [t for t in turns if t.trained_agent == agent]
        seats = [(ep, s) for ep in episodes for s in ep.seating.seats_of(agent)]
        if not own and not seats:
            continue
        metrics[f"{agent}/turns"] = float(len(own))
        if own:
            metrics[f"{agent}/response_length"] = float(
                np.mean([len(t.response_ids) for t in own]))
            metrics[f"{agent}/format_error_rate"] = float(
                np.mean([t.format_error is not None for t in own]))
            metrics[f"{agent}/truncated_rate"] = float(np.mean([t.truncated for t in own]))
            metrics[f"{agent}/turn_reward"] = float(np.mean([t.reward for t in own]))
        if seats:
            metrics[f"{agent}/episode_return"] = float(
                np.mean([ep.returns[s] for ep, s in seats]))
            if not cooperative and summarize is None:  # tasks have no winners
                metrics[f"{agent}/win_rate"] = float(
                    np.mean([ep.outcome(s) == "win" for ep, s in seats]))
    if cooperative and episodes:
        metrics["team/score"] = float(np.mean([ep.returns[0] for ep in episodes]))
    for key, value in counters.metrics().items():
        name, rest = key.split("/", 1)
        metrics[key if name in agent_names else f"rollout/{name}/{rest}"] = value
    if summarize is not None and episodes:
        metrics.update(summarize([ep.metrics for ep in episodes]))
    metrics["rollout/episodes"] = float(len(episodes))
    metrics["rollout/truncated_episodes"] = float(sum(ep.truncated for ep in episodes))
    metrics["rollout/llm_turns"] = float(len(turns))
    metrics["rollout/generated_tokens"] = float(sum(len(t.response_ids) for t in turns))
    if turns:  # what an engine-only reference should feed to compare like with like
        metrics["rollout/prompt_tokens"] = float(np.mean([len(t.prompt_ids) for t in turns]))
    return metrics
