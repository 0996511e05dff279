"""Win rates and mean scores with 95% intervals, numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from roll.agentic.env.seating import build_seating
from roll.agentic.rollout.results import EpisodeResult
from roll.pipeline.evaluation import (
    mean_interval,
    summarize_episodes,
    team_return,
    wilson_interval,
)


def test_mean_interval_by_hand():
    # mean 0.75; s^2 = (3 * 0.25^2 + 0.75^2) / 3 = 0.25, s = 0.5; half = 1.96 * 0.5 / 2
    mean, low, high = mean_interval([1.0, 0.0, 1.0, 1.0])
    assert mean == 0.75
    assert low == pytest.approx(0.75 - 0.4899909961, abs=1e-9)
    assert high == pytest.approx(0.75 + 0.4899909961, abs=1e-9)
    assert mean_interval([2.0]) == (2.0, 2.0, 2.0)
    assert all(math.isnan(v) for v in mean_interval([]))


def test_wilson_interval_by_hand():
    # 8 of 10: z^2 = 3.8415; centre = (0.8 + z^2/20) / (1 + z^2/10) = 0.71674
    # half = z * sqrt(0.8*0.2/10 + z^2/400) / (1 + z^2/10) = 0.22658
    rate, low, high = wilson_interval(8, 10)
    assert rate == 0.8
    assert low == pytest.approx(0.4902, abs=1e-4)
    assert high == pytest.approx(0.9433, abs=1e-4)
    rate, low, high = wilson_interval(0, 5)  # never below 0, and not a zero-width interval
    assert (rate, low) == (0.0, 0.0) and high > 0.4


def test_summary_counts_each_agent_in_its_own_seats():
    agents = ["alice", "bob"]
    as_x = build_seating(["alice", "random"], 2, agents)
    as_o = build_seating(["random", "bob"], 2, agents)
    episodes = [
        EpisodeResult(0, 0, 1, [1.0, -1.0], as_x),   # alice wins
        EpisodeResult(1, 1, 2, [0.0, 0.0], as_o),    # bob draws
        EpisodeResult(2, 2, 3, [-1.0, 1.0], as_o),   # bob wins
        EpisodeResult(3, 3, 4, [-1.0, 1.0], as_x),   # alice loses
    ]
    metrics = summarize_episodes(episodes, agents)
    assert metrics["eval/alice/win_rate"] == 0.5
    assert metrics["eval/alice/mean_return"] == 0.0
    assert metrics["eval/bob/win_rate"] == 0.5
    assert metrics["eval/bob/draw_rate"] == 0.5
    assert metrics["eval/bob/mean_return"] == 0.5
    assert metrics["eval/alice/episodes"] == 2.0
    # Losses and non-losses (wins + draws): alice 1 win 1 loss, bob 1 win 1 draw.
    assert metrics["eval/alice/loss_rate"] == 0.5 and metrics["eval/bob/loss_rate"] == 0.0
    assert metrics["eval/alice/non_loss_rate"] == 0.5
    assert metrics["eval/bob/non_loss_rate"] == 1.0
    # 2 of 2: Wilson low = 1 / (1 + z^2/2) = 0.3424 (z = 1.96), high = 1.
    assert metrics["eval/bob/non_loss_rate_low"] == pytest.approx(0.3424, abs=1e-4)
    assert metrics["eval/bob/non_loss_rate_high"] == pytest.approx(1.0)
    # Per seat: alice played only seat 0 (won once, lost once), bob only seat 1.
    assert metrics["eval/alice/seat0/win_rate"] == 0.5
    assert metrics["eval/bob/seat1/non_loss_rate"] == 1.0
    assert "eval/alice/seat1/win_rate" not in metrics


def test_team_return_averages_the_trained_seats_and_is_left_out_where_it_is_zero_by_sum():
    agents = ["alice", "bob"]
    vs_random = build_seating(["alice", "random"], 2, agents)
    self_play = build_seating(["alice", "bob"], 2, agents)
    # against a random player: alice's seat alone, (1 - 1 + 0.5) / 3
    assert team_return([EpisodeResult(0, 0, 1, [1.0, -1.0], vs_random),
                        EpisodeResult(1, 0, 2, [-1.0, 1.0], vs_random),
                        EpisodeResult(2, 1, 3, [0.5, -0.5], vs_random)]) == {
        "team/episode_return": 0.5 / 3}
    # zero-sum self-play: both seats trained, every game sums to 0 -> always 0, left out
    zero_sum = [EpisodeResult(0, 0, 1, [2.0, -2.0], self_play),
                EpisodeResult(1, 0, 2, [-1.0, 1.0], self_play)]
    assert team_return(zero_sum) == {}
    # a shared score (cooperative): every seat's return, (3 + 3 + 1 + 1) / 4
    assert team_return([EpisodeResult(0, 0, 1, [3.0, 3.0], self_play),
                        EpisodeResult(1, 0, 2, [1.0, 1.0], self_play)]) == {
        "team/episode_return": 2.0}
    # one self-play game and one against random: kept, over the three trained seats
    assert team_return([*zero_sum[:1], EpisodeResult(2, 1, 3, [1.0, -1.0], vs_random)]) == {
        "team/episode_return": 1.0 / 3}
    assert team_return([]) == {}
