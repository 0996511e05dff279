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
from roll.agentic.rollout.scheduler import RolloutConfig, RolloutScheduler
from roll.inference.base import GenerationOutput, RoundsEngine, SamplingParams
from roll.models import load_tokenizer
from roll.multi_agent.config import AgentConfig
from roll.pipeline.builders import hf_engine_for

from ..multi_agent.helpers import make_team

AGENTS = ["alice", "bob"]


class CountingEngine(RoundsEngine):
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
    engine = hf_engine_for(team, tokenizer)
    for name in AGENTS:
        engine.load_adapter(name, team.export_adapter(name), team.peft_config(name), 1)
    return team, engine, tokenizer


def _scheduler(engine, tokenizer, game, seatings, constrained=True, groups=3, size=2,
               penalty=1.0, fallback="random", max_new_tokens=24, **options):
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
        config=RolloutConfig(num_groups=groups, group_size=size, max_turns=64,
                             shared_deals=options.pop("shared_deals", True),
                             max_prompt_tokens=options.pop("max_prompt_tokens", 2048),
                             constrained_decoding=constrained,
                             enable_thinking=options.pop("enable_thinking", False),
                             continuous=True, critic_view=options.pop("critic_view", False)),
        **options,
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
    assert result.metrics["alice/format_error_rate"] == 0.0
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
    # The engine's log-probs are the trainer's (same adapters).
    recomputed = team.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id)
    mask = batch.response_mask.bool()
    torch.testing.assert_close(batch.engine_logprobs[mask], recomputed[mask], atol=1e-4, rtol=0)
    # Response tokens are exactly the answer (and EOS); padding and prompt are masked out.
    row = 0
    response = batch.input_ids[row][mask[row]].tolist()
    text = tokenizer.decode(response, skip_special_tokens=True)
    assert text.startswith("<answer>") and text.endswith("</answer>")
    # The mean prompt length per turn (what an engine-only reference is fed): the prompt part
    # of each row, its tokens before the response mask starts, averaged over the rows.
    prompt_lengths = [int(mask[i].float().argmax()) - int(batch.attention_mask[i].float().argmax())
                      for i in range(len(batch))]
    assert result.metrics["rollout/prompt_tokens"] == pytest.approx(
        sum(prompt_lengths) / len(prompt_lengths))


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
    assert "alice/win_rate" in result.metrics
    # A GRPO group shares the opponent's randomness: random X opens with the same move in all
    # three of bob's episodes, so bob's first prompts are identical; across groups they need not.
    first_prompts = {tuple(t.prompt_ids) for t in result.turns
                     if t.trained_agent == "bob" and t.turn_index == 0}
    assert len(first_prompts) == 1


def test_independent_deals_give_each_episode_of_a_group_its_own_deal(team_engine):
    """rollout.shared_deals=false: members of a group draw their own deals and opponents'
    randomness (Kuhn: each episode's own cards); true (default): one deal per group."""
    _, engine, tokenizer = team_engine

    def deals(shared: bool) -> list[set[tuple[str, ...]]]:
        scheduler = _scheduler(engine, tokenizer, "kuhn_poker", [["alice", "random"]],
                               groups=2, size=8, shared_deals=shared)
        result = scheduler.rollout(seed=3)
        firsts = {}  # episode -> alice's first prompt (it shows her card)
        for turn in result.turns:
            if turn.turn_index == 0:
                firsts[turn.env_index] = tokenizer.decode(turn.prompt_ids)
        groups: list[set[tuple[str, ...]]] = [set(), set()]
        for episode in result.episodes:
            card = firsts[episode.env_index].split("Your card: ")[1][0]
            groups[episode.group].add(card)
        return groups

    assert [len(cards) for cards in deals(shared=True)] == [1, 1]
    # 8 independent deals of J, Q, K: all one card has probability 3 * (1/3)^8 < 0.001.
    assert all(len(cards) > 1 for cards in deals(shared=False))


def test_a_prompt_too_long_ends_its_episode_as_truncated_and_the_rollout_goes_on(team_engine):
    """Kuhn: every first prompt fits, the longer prompt of seat 0's second turn (after "Pass,
    Bet") does not: those episodes end there, truncated and counted; the others finish."""
    _, engine, tokenizer = team_engine
    full = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], groups=4, size=4).rollout(seed=5)
    limit = max(len(t.prompt_ids) for t in full.turns if t.turn_index == 0)
    second = [t for t in full.turns if t.turn_index == 1]
    assert second and all(len(t.prompt_ids) > limit for t in second)  # this seed has some
    cut = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], groups=4, size=4,
                     max_prompt_tokens=limit).rollout(seed=5)
    reached = {t.env_index for t in second}  # the episodes that had a second turn to take
    assert [e.truncated for e in cut.episodes] == [i in reached for i in range(16)]
    assert cut.metrics["rollout/prompts_too_long"] == len(reached)
    assert cut.metrics["rollout/truncated_episodes"] == len(reached)
    assert all(t.turn_index == 0 for t in cut.turns)  # nothing past the cut was generated
    assert cut.batch.truncated.tolist() == [t.env_index in reached for t in cut.turns]
    assert full.batch.truncated.sum() == 0


def test_same_seed_same_rollout(team_engine):
    _, engine, tokenizer = team_engine
    first = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS]).rollout(seed=11)
    second = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS]).rollout(seed=11)
    assert torch.equal(first.batch.input_ids, second.batch.input_ids)
    assert [e.returns for e in first.episodes] == [e.returns for e in second.episodes]


class GarbageEngine(RoundsEngine):
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
            assert result.metrics[f"{agent}/format_error_rate"] == 1.0
            assert f"{agent}/format/error_rate" not in result.metrics  # one rate, not two
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


class StaleOutputEngine(RoundsEngine):
    """The real HFEngine, but its outputs claim another adapter version (a broken sync)."""

    def __init__(self, engine):
        self.engine = engine

    def adapter_version(self, slot):
        return self.engine.adapter_version(slot)

    def generate(self, requests):
        outputs = self.engine.generate(requests)
        for output in outputs:
            output.adapter_version = 0
        return outputs


def test_every_generate_call_checks_the_trainers_adapter_version(team_engine):
    _, engine, tokenizer = team_engine  # both agents loaded at version 1
    checked = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS],
                         expected_version=lambda agent: 1)
    assert checked.rollout(seed=0).batch is not None
    # The trainer moved on to version 2 but nobody synced: refused before generating.
    stale = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], expected_version=lambda a: 2)
    with pytest.raises(RuntimeError, match=r"agent 'alice': the engine holds adapter version 1, "
                                           r"but the trainer is at version 2"):
        stale.rollout(seed=0)
    # The engine holds version 1 but its outputs say otherwise: refused after generating.
    lying = _scheduler(StaleOutputEngine(engine), tokenizer, "kuhn_poker", [AGENTS],
                       expected_version=lambda a: 1)
    with pytest.raises(RuntimeError, match=r"agent 'alice': the engine generated with adapter "
                                           r"version 0, but the trainer is at version 1"):
        lying.rollout(seed=0)


class FixedEngine(RoundsEngine):
    """Answers every request with the same text and finish reason."""

    def __init__(self, text: str, finish_reason: str):
        self.text, self.finish_reason = text, finish_reason

    def generate(self, requests):
        return [GenerationOutput([5, 6], [-1.0, -1.0], self.text, self.finish_reason,
                                 request.adapter, 0) for request in requests]


@pytest.mark.parametrize(("text", "finish", "truncated"), [
    ("<think>let me count the cards fir", "length", 1.0),  # cut off while thinking
    ("<answer>Bet", "length", 1.0),                          # cut off inside the answer
    ("<answer>fold everything</answer>", "length", 0.0),     # an answer, just not legal
    ("I would rather not say.", "eos", 0.0),                 # finished, no answer
])
def test_truncated_rate_counts_answers_cut_off_before_any_answer(
    tiny_model_path, text, finish, truncated
):
    tokenizer = load_tokenizer(tiny_model_path)
    scheduler = _scheduler(FixedEngine(text, finish), tokenizer, "kuhn_poker", [AGENTS],
                           constrained=False)
    metrics = scheduler.rollout(seed=0).metrics
    for agent in AGENTS:
        assert metrics[f"{agent}/truncated_rate"] == truncated
        assert metrics[f"{agent}/format_error_rate"] == 1.0


def test_chat_template_gets_enable_thinking(tiny_model_path):
    from ..models.test_models import THINKING_TEMPLATE

    tokenizer = load_tokenizer(tiny_model_path)
    tokenizer.chat_template = THINKING_TEMPLATE
    engine = FixedEngine("<answer>Pass</answer>", "eos")
    for enable, closed in ((False, True), (True, False)):
        scheduler = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], constrained=False,
                               enable_thinking=enable)
        turn = scheduler.rollout(seed=0).turns[0]
        prompt = tokenizer.decode(turn.prompt_ids)
        assert prompt.endswith("<think>\n\n</think>\n\n") == closed, prompt


def test_one_win_definition_for_training_metrics_and_evaluation():
    from roll.agentic.env.actions import FormatCounters
    from roll.agentic.rollout.results import EpisodeResult, rollout_metrics
    from roll.pipeline.evaluation import summarize_episodes

    seating = build_seating(AGENTS, 2, AGENTS)
    episodes = [EpisodeResult(0, 0, 0, [1.0, -1.0], seating),    # alice wins
                EpisodeResult(1, 0, 0, [0.0, 0.0], seating),     # draw
                EpisodeResult(2, 1, 1, [-2.0, 2.0], seating)]    # bob wins
    assert [e.outcome(0) for e in episodes] == ["win", "draw", "loss"]
    training = rollout_metrics([], episodes, AGENTS, False, FormatCounters(), None)
    evaluation = summarize_episodes(episodes, AGENTS)
    for agent, rate in (("alice", 1 / 3), ("bob", 1 / 3)):
        assert training[f"{agent}/win_rate"] == pytest.approx(rate)
        assert evaluation[f"eval/{agent}/win_rate"] == pytest.approx(rate)
    # Three seats: a positive return that is not the best is not a win.
    three = build_seating(["alice", "random", "random"], 3, AGENTS)
    assert EpisodeResult(0, 0, 0, [1.0, 2.0, -3.0], three).outcome(0) == "loss"
    assert EpisodeResult(0, 0, 0, [0.5], build_seating(["alice"], 1, AGENTS)).outcome(0) == "win"


def test_cooperative_game_reports_the_team_score_not_win_rates(team_engine):
    from roll.pipeline.evaluation import summarize_episodes

    _, engine, tokenizer = team_engine
    hanabi = {"players": 2, "colors": 2, "ranks": 3, "hand_size": 2,
              "max_information_tokens": 3, "max_life_tokens": 1}
    scheduler = RolloutScheduler(
        env_factory=lambda: OpenSpielEnv("hanabi", hanabi),
        render=render_prompt,
        seatings=[build_seating(AGENTS, 2, AGENTS)],
        agent_names=AGENTS, engine=engine, tokenizer=tokenizer,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
        action=ActionConfig(),
        config=RolloutConfig(num_groups=2, group_size=2, shared_deals=True, max_turns=6,
                             max_prompt_tokens=4096,
                             constrained_decoding=True, enable_thinking=False, continuous=True),
        cooperative=True,
    )
    result = scheduler.rollout(seed=0)
    shared = [episode.returns[0] for episode in result.episodes]
    assert all(len(set(episode.returns)) == 1 for episode in result.episodes)
    assert result.metrics["team/score"] == pytest.approx(sum(shared) / len(shared))
    assert not any(key.endswith("win_rate") for key in result.metrics)
    evaluation = summarize_episodes(result.episodes, AGENTS, cooperative=True)
    assert evaluation["eval/team/score"] == pytest.approx(sum(shared) / len(shared))
    assert evaluation["eval/team/score_low"] <= evaluation["eval/team/score"]
    assert not any(key.endswith("win_rate") for key in evaluation)


def test_constrained_answers_longer_than_the_budget_are_refused(team_engine):
    _, engine, tokenizer = team_engine
    scheduler = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"rollout.sampling.max_new_tokens=2: the constrained "
                                         r"answer"):
        scheduler.rollout(seed=0)


@pytest.mark.parametrize(("game", "seatings", "constrained"), [
    ("tic_tac_toe", [AGENTS], True),
    ("kuhn_poker", [["alice", "random"], ["random", "bob"]], False),
    ("connect_four", [AGENTS], True),
    ("leduc_poker", [["alice", "bob"], ["bob", "alice"]], True),
    ("hanabi", [AGENTS], True),
])
def test_continuous_rollout_plays_the_same_episodes_as_rounds(team_engine, game, seatings,
                                                              constrained):
    """The hf engine serves turns continuously (an episode's next turn joins the running batch
    as soon as it exists); an engine with only ``generate`` plays rounds. Per-turn seeds make
    the sampled tokens independent of batching, so both give the same trajectories."""
    _, engine, tokenizer = team_engine
    counting = CountingEngine(engine)  # not continuous: rounds
    budget = 40 if game == "hanabi" else 16  # Hanabi's constrained answers are longer
    rounds = _scheduler(counting, tokenizer, game, seatings, constrained, groups=4, size=2,
                        max_new_tokens=budget).rollout(seed=5)
    before = engine.forward_calls
    continuous = _scheduler(engine, tokenizer, game, seatings, constrained, groups=4, size=2,
                            max_new_tokens=budget).rollout(seed=5)
    assert engine.last_serve["served"] == len(continuous.turns) == len(rounds.turns)
    assert engine.forward_calls > before and counting.calls
    for field in ("input_ids", "response_mask", "agent_id", "rewards", "env_id", "seat", "turn"):
        assert torch.equal(getattr(continuous.batch, field), getattr(rounds.batch, field)), field
    torch.testing.assert_close(continuous.batch.engine_logprobs, rounds.batch.engine_logprobs,
                               rtol=0, atol=1e-5)
    assert [e.returns for e in continuous.episodes] == [e.returns for e in rounds.episodes]
    for agent in AGENTS:  # the same per-agent turn counts, and only legal games (no errors)
        assert continuous.metrics.get(f"{agent}/turns") == rounds.metrics.get(f"{agent}/turns")
        if constrained:
            assert continuous.metrics.get(f"{agent}/format_error_rate", 0.0) == 0.0


def test_global_views_show_the_critic_every_seats_cards_with_the_same_responses(team_engine):
    """critic.input=global: each trained row also comes as (global view, same response)."""
    team, engine, tokenizer = team_engine
    batch = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], critic_view=True,
                       groups=2).rollout(seed=5).batch
    assert batch.critic_input_ids is not None and len(batch) >= 4
    for row in range(len(batch)):
        response = batch.input_ids[row][batch.response_mask[row].bool()]
        critic_response = batch.critic_input_ids[row][batch.critic_response_mask[row].bool()]
        assert torch.equal(response, critic_response)
        prompt = batch.input_ids[row][: int(batch.response_mask[row].argmax())]
        critic_prompt = batch.critic_input_ids[row][
            : int(batch.critic_response_mask[row].argmax())]
        text = tokenizer.decode(critic_prompt)
        assert "Seat 0 sees:" in text and "Seat 1 sees:" in text
        assert len(critic_prompt) > len(prompt)
        assert int(batch.critic_attention_mask[row].sum()) == len(critic_prompt) + len(response)
    plain = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], groups=2).rollout(seed=5)
    assert plain.batch.critic_input_ids is None
    assert torch.equal(plain.batch.input_ids, batch.input_ids)  # the agents' rows unchanged


def test_a_critic_view_too_long_ends_its_episode_like_a_prompt_too_long(team_engine):
    """critic.input=global: the critic's view of a turn is longer than the agent's prompt; a
    limit between the two ends every episode at its first trained turn, truncated and counted,
    instead of training the critic on a view longer than the limit (it was unchecked)."""
    _, engine, tokenizer = team_engine
    full = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], critic_view=True, groups=2)
    turns = full.rollout(seed=5).turns
    limit = max(len(t.prompt_ids) for t in turns)
    assert all(len(t.critic_prompt_ids) > limit for t in turns)
    cut = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], critic_view=True, groups=2,
                     max_prompt_tokens=limit).rollout(seed=5)
    assert cut.turns == [] and all(e.truncated for e in cut.episodes)
    assert cut.metrics["rollout/prompts_too_long"] == len(cut.episodes)


def same_rows(one, other):
    """Two rollouts played the same games: the same rows (tokens, ids, rewards) and returns."""
    for field in ("input_ids", "response_mask", "agent_id", "rewards", "env_id", "seat", "turn",
                  "group_id"):
        assert torch.equal(getattr(one.batch, field), getattr(other.batch, field)), field
    assert [e.returns for e in one.episodes] == [e.returns for e in other.episodes]


def _same_batches(one, other):
    same_rows(one, other)
    # other rows share the batch: the same tokens, log-probs up to float summation order
    torch.testing.assert_close(one.batch.engine_logprobs, other.batch.engine_logprobs,
                               rtol=0, atol=1e-4)


def lookahead_plays_the_plain_rollouts(plain, ahead):
    """Rollouts 5 and 6 of ``ahead`` (6's episodes started in 5's idle lanes) play what
    ``plain``'s play without lookahead (engines serving unchanged adapters)."""
    expected = [plain.rollout(seed=5), plain.rollout(seed=6)]
    played = [ahead.rollout(seed=5, ahead_seeds=[6]), ahead.rollout(seed=6)]
    assert played[0].metrics["rollout/next_episodes_started"] > 0
    assert played[1].metrics["rollout/ahead_turns"] > 0
    for got, want in zip(played, expected, strict=True):
        same_rows(got, want)


@pytest.mark.slow  # the full CI runs it (quick subset < 3 min)
def test_lookahead_fills_the_tail_with_the_next_rollouts_episodes_unchanged(team_engine):
    """rollout(ahead_seeds=) admits the next rollout's episodes into the lanes this rollout's
    tail leaves idle and parks them when it ends; the next rollout goes on from there. With
    the same adapters both rollouts' trajectories equal those played without lookahead, the
    next rollout starts with turns already played, and its serve needs fewer decode steps."""
    _, engine, tokenizer = team_engine
    game, seatings = "tic_tac_toe", [AGENTS, ["bob", "alice"]]  # 5 to 9 moves: a ragged tail

    def scheduler():
        return _scheduler(engine, tokenizer, game, seatings, groups=6, size=2,
                          max_new_tokens=16)

    plain = scheduler()
    first = plain.rollout(seed=5)
    plain_steps = engine.last_serve["decode_steps"]
    second = plain.rollout(seed=6)
    second_steps = engine.last_serve["decode_steps"]
    assert "rollout/ahead_turns" not in first.metrics

    ahead = scheduler()
    first_ahead = ahead.rollout(seed=5, ahead_seeds=[6])
    first_ahead_steps = engine.last_serve["decode_steps"]
    second_ahead = ahead.rollout(seed=6)
    _same_batches(first_ahead, first)
    _same_batches(second_ahead, second)
    assert first_ahead.metrics["rollout/ahead_turns"] == 0
    started = first_ahead.metrics["rollout/next_episodes_started"]
    assert 0 < started <= 12
    played_ahead = [t for t in second_ahead.turns if t.ahead]
    assert second_ahead.metrics["rollout/ahead_turns"] == len(played_ahead) > 0
    assert {t.env_index for t in played_ahead} == set(range(int(started)))  # in episode order
    # The tail took the next rollout's turns: more tokens decoded in (about) the same steps,
    # and the next rollout had less left to decode.
    assert first_ahead.metrics["rollout/decoded_tokens"] > first.metrics["rollout/decoded_tokens"]
    assert first.metrics["rollout/decoded_tokens"] == first.metrics["rollout/generated_tokens"]
    assert first_ahead_steps <= plain_steps + 16  # at most one more answer's worth of steps
    assert engine.last_serve["decode_steps"] < second_steps
    assert (second_ahead.metrics["rollout/decoded_tokens"]
            == second.metrics["rollout/generated_tokens"]
            - sum(len(t.response_ids) for t in played_ahead))
    # Another seed than the one played ahead: those episodes are forgotten, nothing is mixed.
    third = ahead.rollout(seed=7, ahead_seeds=[8])
    fourth = ahead.rollout(seed=9)
    _same_batches(third, plain.rollout(seed=7))
    _same_batches(fourth, plain.rollout(seed=9))
    assert not any(t.ahead for t in fourth.turns)


def test_lookahead_is_for_games_played_in_this_process(team_engine):
    _, engine, tokenizer = team_engine
    scheduler = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS], groups=2, size=1)
    with pytest.raises(ValueError, match="lookahead"):
        scheduler.rollout(seed=1, items=[0, 1], ahead_seeds=[2])


@pytest.mark.slow  # two full rollouts; the one-step lookahead test stays quick
def test_lookahead_of_two_rollouts_admits_the_nearer_first(team_engine):
    """ahead_seeds=[2, 3]: rollout 1's idle lanes take rollout 2's episodes, then (all of
    2's started) 3's; each later rollout goes on from what was played ahead for it, and all
    equal the plain ones (Hanabi: games of very different lengths; 4 episodes a rollout, 4.5 s
    here, where 6 took 33 s)."""
    _, engine, tokenizer = team_engine

    def scheduler():
        return _scheduler(engine, tokenizer, "hanabi", [AGENTS], groups=2, size=2,
                          max_new_tokens=40)

    plain = scheduler()
    expected = [plain.rollout(seed=s) for s in (1, 2, 3)]
    ahead = scheduler()
    played = [ahead.rollout(seed=1, ahead_seeds=[2, 3])]
    two, three = ahead._ahead
    assert len(two.started) == len(two.specs) == 4 and len(three.started) > 0
    assert played[0].metrics["rollout/next_episodes_started"] == 4 + len(three.started)
    played += [ahead.rollout(seed=2, ahead_seeds=[3]), ahead.rollout(seed=3)]
    for got, want in zip(played, expected, strict=True):
        _same_batches(got, want)
    assert played[1].metrics["rollout/ahead_turns"] > 0
    assert played[2].metrics["rollout/ahead_turns"] > 0


def test_prompts_and_answers_are_tokenised_once_and_handed_out_as_fresh_lists(team_engine):
    """The scheduler's memo (scheduler.chat_ids, _completions): the same ids as the tokenizer
    gives, a new list at every call (a caller that changes one cannot change the next), the
    tokenizer called once per distinct prompt; and CompletionTrie.of shares one trie per set."""
    from roll.agentic.env.actions import answer_token_ids
    from roll.inference.constrained import CompletionTrie
    from roll.models.loading import prompt_ids

    _, engine, tokenizer = team_engine
    scheduler = _scheduler(engine, tokenizer, "kuhn_poker", [AGENTS])
    calls = {"n": 0}
    template = tokenizer.apply_chat_template

    def counted(*args, **kwargs):
        calls["n"] += 1
        return template(*args, **kwargs)
    tokenizer.apply_chat_template = counted
    try:
        first = scheduler.chat_ids("Your card: K.")
        first.append(-1)
        second = scheduler.chat_ids("Your card: K.")
        other = scheduler.chat_ids("Your card: Q.")
    finally:
        del tokenizer.apply_chat_template
    assert second == prompt_ids(tokenizer, "Your card: K.", None, False) and -1 not in second
    assert other != second and calls["n"] == 2
    legal = ["Pass", "Bet"]

    class Ask:  # what _completions reads of a turn's ask
        env_name = "kuhn_poker"
    Ask.legal = legal
    answers = scheduler._completions(Ask())
    assert answers == answer_token_ids(tokenizer, legal)
    answers[0].append(-1)
    assert scheduler._completions(Ask()) == answer_token_ids(tokenizer, legal)
    assert CompletionTrie.of([[1, 2], [3]], 10) is CompletionTrie.of([[1, 2], [3]], 10)
    assert CompletionTrie.of([[1, 2], [3]], 10) is not CompletionTrie.of([[1, 2], [4]], 10)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CompletionTrie.of([[1, 12]], 10)
