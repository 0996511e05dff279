"""HAPPO's pieces by hand: the factor M, the episode log-ratio, the seeded order."""

from __future__ import annotations

import math

import torch

from roll.algorithms.happo_ratios import episode_log_ratio, happo_factors, happo_order


def test_factor_is_the_product_of_the_updated_agents_ratios_in_the_episode():
    # rows:         0     1     2     3     4
    # episode:      7     7     3     3     7
    # updated:      yes   no    yes   no    yes
    # log ratio:    0.1   9     -0.2  9     0.3     (not-updated rows' values must not count)
    # episode 7: exp(0.1 + 0.3) = exp(0.4) = 1.4918247; episode 3: exp(-0.2) = 0.8187308
    factors = happo_factors(torch.tensor([0.1, 9.0, -0.2, 9.0, 0.3]),
                            torch.tensor([True, False, True, False, True]),
                            torch.tensor([7, 7, 3, 3, 7]))
    want = [1.4918247, 1.4918247, 0.8187308, 0.8187308, 1.4918247]
    assert torch.allclose(factors, torch.tensor(want), atol=1e-6)


def test_no_agent_updated_yet_gives_factor_one():
    factors = happo_factors(torch.tensor([2.0, -1.0]), torch.tensor([False, False]),
                            torch.tensor([0, 1]))
    assert torch.equal(factors, torch.ones(2))


def test_episode_log_ratio_sums_response_tokens_only():
    new = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.3, 0.6]]))
    old = torch.log(torch.tensor([[0.25, 0.8, 0.1], [0.2, 0.1, 0.6]]))
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # row 0: log(0.4/0.8) + log(0.9/0.1) = log(4.5); row 1: log(1) + log(3) = log(3)
    got = episode_log_ratio(new, old, mask)
    assert torch.allclose(got, torch.tensor([math.log(4.5), math.log(3.0)]), atol=1e-6)


def test_order_is_a_seeded_permutation_that_changes_between_steps():
    names = ["a", "b", "c", "d"]
    orders = [happo_order(names, seed=5, step=step) for step in range(1, 13)]
    assert all(sorted(order) == names for order in orders)
    assert orders == [happo_order(names, seed=5, step=step) for step in range(1, 13)]
    assert len({tuple(order) for order in orders}) >= 4  # 12 draws of 24 permutations
    assert orders != [happo_order(names, seed=6, step=step) for step in range(1, 13)]


def test_long_episodes_keep_the_factor_within_its_bound():
    # Episode 0: the earlier agent took 20 turns of 10 response tokens at log-ratio 0.05 each:
    # summed log-ratio 20 * 10 * 0.05 = 10, an unbounded factor exp(10) = 22026 > 1e3.
    # Episode 1: the same, negative: exp(-10). Episode 2: exp(0.3) = 1.3498588, inside [1/2, 2].
    new = torch.full((41, 12), 0.05)
    new[20:40] = -0.05
    new[40] = 0.03
    old = torch.zeros(41, 12)
    mask = torch.zeros(41, 12)
    mask[:, 1:11] = 1  # 10 response tokens per turn
    log_ratio = episode_log_ratio(new, old, mask)
    episode = torch.tensor([0] * 20 + [1] * 20 + [2])
    updated = torch.ones(41, dtype=torch.bool)
    later_rows = torch.tensor([0, 20, 40])  # the next agent's rows sit in the same episodes
    unbounded = happo_factors(log_ratio, updated, episode)[later_rows]
    assert unbounded[0] > 1e3 and unbounded[1] < 1e-3
    bounded = happo_factors(log_ratio, updated, episode, clip=2.0)[later_rows]
    assert torch.allclose(bounded, torch.tensor([2.0, 0.5, math.exp(0.3)]), atol=1e-5)


def test_token_mean_log_ratio_is_each_rows_mean_over_its_response_tokens():
    # The rows of test_episode_log_ratio_sums_response_tokens_only: row 0 has 2 response
    # tokens, log(0.5) + log(9) = log(4.5), mean log(4.5) / 2 = 0.7520387; row 1:
    # (log(1) + log(3)) / 2 = 0.5493061; row 2 has no response token: 0, not 0 / 0.
    new = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.3, 0.6], [0.5, 0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.25, 0.8, 0.1], [0.2, 0.1, 0.6], [0.1, 0.1, 0.1]]))
    mask = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    got = episode_log_ratio(new, old, mask, "token_mean")
    assert torch.allclose(got, torch.tensor([0.7520387, 0.5493061, 0.0]), atol=1e-6)


def test_token_mean_keeps_long_episodes_near_one_without_the_clip():
    # The long episodes above (20 turns of 10 tokens at log-ratio 0.05): each turn's mean
    # log-ratio is 0.05, the episode's 20 * 0.05 = 1, M = e = 2.7182818 (the sum gave
    # exp(10)); the negative episode e^-1 = 0.3678794; episode 2: exp(0.03) = 1.0304545.
    new = torch.full((41, 12), 0.05)
    new[20:40] = -0.05
    new[40] = 0.03
    mask = torch.zeros(41, 12)
    mask[:, 1:11] = 1
    log_ratio = episode_log_ratio(new, torch.zeros(41, 12), mask, "token_mean")
    episode = torch.tensor([0] * 20 + [1] * 20 + [2])
    factors = happo_factors(log_ratio, torch.ones(41, dtype=torch.bool), episode)
    assert torch.allclose(factors[torch.tensor([0, 20, 40])],
                          torch.tensor([math.e, 1 / math.e, math.exp(0.03)]), atol=1e-5)


def test_an_unknown_log_ratio_reduction_is_refused():
    import pytest

    from roll.algorithms.advantages import AdvantageConfig
    from roll.errors import ConfigError

    with pytest.raises(ValueError, match="reduce='max'"):
        episode_log_ratio(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), "max")
    with pytest.raises(ConfigError, match="advantage.happo_log_ratio"):
        AdvantageConfig(estimator="happo", happo_log_ratio="max")
