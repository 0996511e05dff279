"""The rollout scheduler: many envs in flight, one mixed-adapter generate call per round."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

from roll.agentic.env.actions import ActionConfig
from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.renderers import render_prompt
from roll.agentic.env.seating import build_seating
from roll.agentic.rollout import RolloutConfig, RolloutScheduler
from roll.inference.base import GenerationOutput, SamplingParams
from roll.inference.hf_engine import HFEngine
from roll.models import load_tokenizer
from roll.multi_agent.config import AgentConfig

from ..multi_agent.helpers import make_team

AGENTS = ["alice", "bob"]


class CountingEngine:
    """The real HFEngine, recording each generate call's adapters (to see the batching)."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[list[str | None]] = []

    def generate(self, requests):
        self.calls.append([r.adapter for r in requests])
        return self.engine.generate(requests)


@pytest.fixture(scope="module")
def team_engine(tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig(a) for a in AGENTS])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in AGENTS:
            for param in team.agent_parameters(name):
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    tokenizer = load_tokenizer(tiny_model_path)
    engine = HFEngine(team, tokenizer)
    for name in AGENTS:
        engine.load_adapter(name, team.export_adapter(name), team.lora_config(name), 1)
    return team, engine, tokenizer


def _scheduler(engine, tokenizer, game, seatings, constrained=True, groups=3, size=2,
               penalty=1.0, fallback="random", max_new_tokens=24):
    num_seats = OpenSpielEnv(game).num_seats
    return RolloutScheduler(
        env_factory=lambda: OpenSpielEnv(game),
        render=render_prompt,
        seatings=[build_seating(s, num_seats, AGENTS) for s in seatings],
        agent_names=AGENTS,
        engine=engine,
        tokenizer=tokenizer,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
        action=ActionConfig(format_penalty=penalty, fallback=fallback),
        config=RolloutConfig(num_groups=groups, group_size=size, constrained_decoding=constrained),
    )


def test_selfplay_rollout_batches_all_agents_into_one_call(team_engine):
    team, engine, tokenizer = team_engine
    counting = CountingEngine(engine)
    scheduler = _scheduler(counting, tokenizer, "tic_tac_toe", [AGENTS])
    result = scheduler.rollout(seed=3)
    batch = result.batch
    # Tic-tac-toe alternates seats, so every round holds the same seat in all six envs; the
    # first call is all alice (X), the second all bob (O): each call is ONE generate.
    assert counting.calls[0] == ["alice"] * 6 and counting.calls[1] == ["bob"] * 6
    assert len(batch) == len(result.turns)
    # Seat 0 is alice (agent 0), seat 1 is bob (agent 1).
    assert torch.equal(batch.agent_id, batch.seat)
    # Constrained decoding: every answer is a legal move, so there are no penalties and each
    # seat's turn rewards add up to its game return.
    assert result.metrics["agent_alice/format_error_rate"] == 0.0
    totals = defaultdict(float)
    for env_id, seat, reward in zip(batch.env_id.tolist(), batch.seat.tolist(),
                                    batch.rewards.tolist(), strict=True):
        totals[env_id, seat] += reward
    for episode in result.episodes:
        for seat in range(2):
            assert totals[episode.env_index, seat] == pytest.approx(episode.returns[seat])
    # Turn indices count each seat's own turns: 0, 1, 2, ...
    for env_id in set(batch.env_id.tolist()):
        for seat in range(2):
            turns = batch.turn[(batch.env_id == env_id) & (batch.seat == seat)].tolist()
            assert sorted(turns) == list(range(len(turns)))
    # Groups: group_size envs share a seed.
    assert batch.group_id.unique().tolist() == [0, 1, 2]
    # The engine's log-probs are the trainer's (same adapters): ready as old_logprobs.
    recomputed = team.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(batch.old_logprobs[mask], recomputed[mask], atol=1e-4, rtol=0)
    # Response tokens are exactly the answer (and EOS); padding and prompt are masked out.
    row = 0
    response = batch.input_ids[row][mask[row]].tolist()
    text = tokenizer.decode(response, skip_special_tokens=True)
    assert text.startswith("<answer>") and text.endswith("</answer>")


def test_mixed_adapters_share_one_call_when_seats_differ(team_engine):
    _, engine, tokenizer = team_engine
    counting = CountingEngine(engine)
    # Group 0: alice is X against random; group 1: bob is O against random. In the first
    # round alice's envs wait for her and bob's for him: one call with both adapters.
    scheduler = _scheduler(counting, tokenizer, "tic_tac_toe",
                           [["alice", "random"], ["random", "bob"]], groups=2, size=3)
    result = scheduler.rollout(seed=0)
    assert sorted(counting.calls[0]) == ["alice"] * 3 + ["bob"] * 3
    batch = result.batch
    assert set(batch.seat[batch.agent_id == 0].tolist()) == {0}
    assert set(batch.seat[batch.agent_id == 1].tolist()) == {1}
    assert result.metrics["rollout/episodes"] == 6.0
    assert "agent_alice/win_rate" in result.metrics
    # A GRPO group shares the opponent's randomness: random X opens with the same move in all
    # three of bob's episodes, so bob's first prompts are identical; across groups they need not.
    first_prompts = {tuple(t.prompt_ids) for t in result.turns
                     if t.trained_agent == "bob" and t.turn_index == 0}
    assert len(first_prompts) == 1


def test_same_seed_same_rollout(team_engine):
    _, engine, tokenizer = team_engine
    first = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS]).rollout(seed=11)
    second = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS]).rollout(seed=11)
    assert torch.equal(first.batch.input_ids, second.batch.input_ids)
    assert [e.returns for e in first.episodes] == [e.returns for e in second.episodes]


class GarbageEngine:
    """Returns adversarial model outputs (what a broken or untrained model may say)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.count = 0

    def _garbage(self) -> str:
        choice = self.rng.randrange(8)
        if choice == 0:
            return ""
        if choice == 1:
            return "".join(chr(self.rng.randrange(0x20, 0x2FFF)) for _ in range(50))
        if choice == 2:
            return "<answer>" * 200
        if choice == 3:
            return "<think>" + "x" * 5000
        if choice == 4:
            return "<answer><answer>Bet</answer"
        if choice == 5:
            return "<answer>x(9,9)</answer>"
        if choice == 6:
            return bytes(self.rng.randrange(256) for _ in range(64)).decode("latin-1")
        return "<answer>99999</answer><think>"

    def generate(self, requests):
        outputs = []
        for request in requests:
            self.count += 1
            ids = [5, 6, 7][: 1 + self.count % 3]
            outputs.append(GenerationOutput(ids, [-1.0] * len(ids), self._garbage(), "length",
                                            request.adapter, 0))
        return outputs


@pytest.mark.parametrize("fallback", ["random", "forfeit"])
def test_garbage_outputs_never_crash_and_are_penalised(tiny_model_path, fallback):
    tokenizer = load_tokenizer(tiny_model_path)
    engine = GarbageEngine(seed=1)
    games = ["tic_tac_toe", "kuhn_poker", "connect_four"]
    turns = 0
    round_index = 0
    while engine.count < 1000:
        game = games[round_index % 3]
        scheduler = _scheduler(engine, tokenizer, game, [AGENTS], constrained=False,
                               groups=8, size=4, penalty=0.5, fallback=fallback)
        result = scheduler.rollout(seed=round_index)
        round_index += 1
        turns += len(result.turns)
        acted = {turn.trained_agent for turn in result.turns}
        assert "alice" in acted  # alice moves first in all three games
        for agent in acted:
            assert result.metrics[f"agent_{agent}/format_error_rate"] == 1.0
            assert result.metrics[f"agent_{agent}/format/error_rate"] == 1.0
        # Every turn carries the penalty on top of the game's own reward.
        for turn in result.turns:
            assert turn.format_error is not None
        episodes_returns = {e.env_index: e.returns for e in result.episodes}
        per_seat = defaultdict(float)
        for turn in result.turns:
            per_seat[turn.env_index, turn.seat] += turn.reward
        counts = defaultdict(int)
        for turn in result.turns:
            counts[turn.env_index, turn.seat] += 1
        for (env_index, seat), total in per_seat.items():
            expected = episodes_returns[env_index][seat] - 0.5 * counts[env_index, seat]
            assert total == pytest.approx(expected)
    assert turns >= 1000
