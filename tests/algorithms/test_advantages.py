"""Advantage estimators and per-agent normalisation, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from roll.algorithms import (
    AdvantageConfig,
    RunningBaselines,
    compute_advantages,
    gae,
    get_advantage_estimator,
    grpo,
    magrpo,
    normalization_keys,
    normalize_advantages,
    register_advantage,
    reinforce,
    vdn,
)
from roll.algorithms.advantages import zero_advantage_rows, zero_advantage_shares
from roll.batch import TrajectoryBatch
from roll.errors import ConfigError

NAN = float("nan")


def make_batch(rows: list[dict], length: int) -> TrajectoryBatch:
    """Rows of ``prompt`` tokens, then ``response`` tokens, then padding up to ``length``.

    Each row dict holds prompt, response (token counts) and scalar fields: agent, reward, env,
    seat, group, turn; ``values`` (optional) lists one value per position.
    """
    attention, response = torch.zeros(len(rows), length), torch.zeros(len(rows), length)
    for i, row in enumerate(rows):
        attention[i, : row["prompt"] + row["response"]] = 1
        response[i, row["prompt"] : row["prompt"] + row["response"]] = 1

    def column(key: str, default: float = 0, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor([row.get(key, default) for row in rows], dtype=dtype)

    values = None
    if "values" in rows[0]:
        values = torch.tensor([row["values"] for row in rows], dtype=torch.float32)
    return TrajectoryBatch(
        input_ids=torch.arange(len(rows) * length).reshape(len(rows), length),
        attention_mask=attention.long(),
        response_mask=response,
        agent_id=column("agent"),
        rewards=column("reward", dtype=torch.float32),
        env_id=column("env"),
        seat=column("seat"),
        group_id=column("group"),
        turn=column("turn"),
        values=values,
    )


def response_values(tensor: torch.Tensor, batch: TrajectoryBatch) -> list[list[float]]:
    """Per row, the entries at the response tokens (in position order)."""
    return [tensor[i][batch.response_mask[i].bool()].tolist() for i in range(len(batch))]


def assert_rows(actual: list[list[float]], expected: list[list[float]], tol: float = 1e-5) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got == pytest.approx(want, abs=tol), (actual, expected)


def assert_zero_off_response(tensor: torch.Tensor, batch: TrajectoryBatch) -> None:
    assert torch.all(tensor[~batch.response_mask.bool()] == 0)


# --- REINFORCE ----------------------------------------------------------------------------------


def test_reinforce_three_turn_reward_to_go_rows_shuffled():
    # Env 0, seat 0 takes 3 turns with rewards r0=1, r1=0, r2=2; gamma=0.9:
    #   G2 = 2
    #   G1 = 0 + 0.9*2    = 1.8
    #   G0 = 1 + 0.9*1.8  = 2.62
    # Env 0, seat 1 takes 2 turns with rewards -1, 0.5 (its own trajectory):
    #   G1 = 0.5,  G0 = -1 + 0.9*0.5 = -0.55
    # Rows come in scrambled order; prompt and padding tokens must stay 0.
    rows = [
        dict(prompt=1, response=2, reward=0.0, env=0, seat=0, turn=1),
        dict(prompt=2, response=1, reward=0.5, env=0, seat=1, turn=1),
        dict(prompt=3, response=1, reward=2.0, env=0, seat=0, turn=2),
        dict(prompt=1, response=3, reward=1.0, env=0, seat=0, turn=0),
        dict(prompt=1, response=1, reward=-1.0, env=0, seat=1, turn=0),
    ]
    batch = make_batch(rows, length=6)
    advantages, returns = reinforce(batch, AdvantageConfig(estimator="reinforce", gamma=0.9))
    expected = [[1.8, 1.8], [0.5], [2.0], [2.62, 2.62, 2.62], [-0.55]]
    assert_rows(response_values(advantages, batch), expected)
    assert_rows(response_values(returns, batch), expected)
    assert_zero_off_response(advantages, batch)
    assert_zero_off_response(returns, batch)


def test_reinforce_gamma_one_sums_future_rewards_and_envs_stay_apart():
    # gamma=1: env 1 turns (rewards 1, 2) -> G0 = 3, G1 = 2; env 2 (reward 5, same seat) -> 5.
    rows = [
        dict(prompt=1, response=1, reward=1.0, env=1, turn=0),
        dict(prompt=1, response=1, reward=2.0, env=1, turn=1),
        dict(prompt=1, response=1, reward=5.0, env=2, turn=0),
    ]
    batch = make_batch(rows, length=3)
    advantages, _ = reinforce(batch, AdvantageConfig(estimator="reinforce", gamma=1.0))
    assert_rows(response_values(advantages, batch), [[3.0], [2.0], [5.0]])


def test_trajectory_with_repeated_turn_is_refused():
    rows = [dict(prompt=1, response=1, env=3, seat=1, turn=0)] * 2
    with pytest.raises(ValueError, match="env_id=3, seat=1, turn=0"):
        reinforce(make_batch(rows, length=2), AdvantageConfig(estimator="reinforce"))


# --- GRPO ---------------------------------------------------------------------------------------


def grpo_two_group_batch() -> TrajectoryBatch:
    # Group 0: env 0 return 1; env 1 return 0; env 2 two turns 0.5 + 1.5 = 2 (undiscounted).
    # Group 1: env 3 return 3; env 4 return 1.
    rows = [
        dict(prompt=1, response=2, reward=1.0, env=0, group=0),
        dict(prompt=2, response=1, reward=0.0, env=1, group=0),
        dict(prompt=1, response=1, reward=0.5, env=2, group=0, turn=0),
        dict(prompt=1, response=2, reward=1.5, env=2, group=0, turn=1),
        dict(prompt=1, response=1, reward=3.0, env=3, group=1),
        dict(prompt=1, response=1, reward=1.0, env=4, group=1),
    ]
    return make_batch(rows, length=4)


def test_grpo_two_groups_whitened():
    # Statistics over trajectories (env 2 counts once, not per row), population std:
    # group 0: returns (1, 0, 2): mean 1, var (0 + 1 + 1)/3 = 2/3, std = sqrt(2/3) = 0.8164966
    #   A = (0, -1/0.8164966, +1/0.8164966) = (0, -1.2247449, 1.2247449); env 2's both turns.
    # group 1: returns (3, 1): mean 2, std 1 -> A = (+1, -1) / (1 + 1e-6).
    # gamma=0.5 is ignored by GRPO (returns are undiscounted).
    batch = grpo_two_group_batch()
    advantages, returns = grpo(batch, AdvantageConfig(gamma=0.5))
    a = 1.0 / math.sqrt(2.0 / 3.0)
    assert_rows(
        response_values(advantages, batch),
        [[0.0, 0.0], [-a], [a], [a, a], [1.0], [-1.0]],
    )
    assert_rows(response_values(returns, batch), [[1.0, 1.0], [0.0], [2.0], [2.0, 2.0], [3], [1]])
    assert_zero_off_response(advantages, batch)


def test_dr_grpo_centres_without_std():
    # Same returns, no std division: group 0 -> (0, -1, 1); group 1 -> (3-2, 1-2) = (1, -1).
    batch = grpo_two_group_batch()
    advantages, _ = grpo(batch, AdvantageConfig(grpo_scale_by_std=False))
    assert_rows(
        response_values(advantages, batch),
        [[0.0, 0.0], [-1.0], [1.0], [1.0, 1.0], [1.0], [-1.0]],
    )


def test_grpo_groups_by_seat_within_a_group():
    # One game group, two episodes, two seats. Seat 0 returns (1, 0): mean 0.5 -> +-0.5;
    # seat 1 returns (4, 2): mean 3 -> +-1. (Pooling the seats would give mean 1.75.)
    rows = [
        dict(prompt=1, response=1, reward=1.0, env=10, seat=0, group=7),
        dict(prompt=1, response=1, reward=4.0, env=10, seat=1, group=7),
        dict(prompt=1, response=1, reward=0.0, env=11, seat=0, group=7),
        dict(prompt=1, response=1, reward=2.0, env=11, seat=1, group=7),
    ]
    batch = make_batch(rows, length=2)
    advantages, _ = grpo(batch, AdvantageConfig(grpo_scale_by_std=False))
    assert_rows(response_values(advantages, batch), [[0.5], [1.0], [-0.5], [-1.0]])


def test_grpo_single_member_and_constant_groups_give_exact_zero():
    # Group 0 has one episode; group 1 has three episodes that all scored 0.9. In float32,
    # 0.9 - (3 * 0.9) / 3 = 6e-8, not 0: that rounding must not become a signal.
    rows = [dict(prompt=1, response=1, reward=0.7, env=0, group=0)] + [
        dict(prompt=1, response=1, reward=0.9, env=env, group=1) for env in (1, 2, 3)
    ]
    batch = make_batch(rows, length=2)
    for scale in (True, False):
        advantages, _ = grpo(batch, AdvantageConfig(grpo_scale_by_std=scale))
        assert not torch.isnan(advantages).any()
        assert torch.all(advantages == 0)


def test_grpo_refuses_trajectory_spanning_two_groups():
    rows = [
        dict(prompt=1, response=1, env=4, group=0, turn=0),
        dict(prompt=1, response=1, env=4, group=1, turn=1),
    ]
    with pytest.raises(ValueError, match="different group_id"):
        grpo(make_batch(rows, length=2), AdvantageConfig())


# --- MAGRPO -------------------------------------------------------------------------------------


def test_magrpo_gives_every_seat_the_group_relative_joint_return():
    # Group 7: episode 10, seats' returns (1, 4) -> joint J = mean = 2.5; episode 11 (0, 2)
    # -> J = 1. Mean 1.75: centred +0.75 / -0.75, population std 0.75.
    # Group 8: episode 12, seat 0 two turns 0.5 + 1.5 = 2 and seat 1 0 -> J = 1; episode 13
    # only seat 0 in the batch, 3 -> J = 3. Mean 2: centred -1 / +1, std 1.
    # Every row of an episode gets its episode's advantage (GRPO would give seat 0 and seat 1
    # of episode 10 different ones: +0.5 and +1 centred).
    rows = [
        dict(prompt=1, response=1, reward=1.0, env=10, seat=0, group=7),
        dict(prompt=1, response=2, reward=4.0, env=10, seat=1, group=7),
        dict(prompt=1, response=1, reward=0.0, env=11, seat=0, group=7),
        dict(prompt=1, response=1, reward=2.0, env=11, seat=1, group=7),
        dict(prompt=1, response=1, reward=0.5, env=12, seat=0, group=8, turn=0),
        dict(prompt=1, response=1, reward=1.5, env=12, seat=0, group=8, turn=1),
        dict(prompt=1, response=1, reward=0.0, env=12, seat=1, group=8),
        dict(prompt=1, response=1, reward=3.0, env=13, seat=0, group=8),
    ]
    batch = make_batch(rows, length=3)
    centred, _ = magrpo(batch, AdvantageConfig(grpo_scale_by_std=False))
    assert_rows(response_values(centred, batch),
                [[0.75], [0.75, 0.75], [-0.75], [-0.75], [-1.0], [-1.0], [-1.0], [1.0]])
    whitened, returns = magrpo(batch, AdvantageConfig())
    a, b = 0.75 / (0.75 + 1e-6), 1.0 / (1.0 + 1e-6)
    assert_rows(response_values(whitened, batch),
                [[a], [a, a], [-a], [-a], [-b], [-b], [-b], [b]])
    assert_rows(response_values(returns, batch),
                [[2.5], [2.5, 2.5], [1.0], [1.0], [1.0], [1.0], [1.0], [3.0]])
    assert_zero_off_response(whitened, batch)
    assert get_advantage_estimator("magrpo") is magrpo


def test_magrpo_equals_grpo_when_every_seat_gets_the_joint_reward():
    rows = [dict(prompt=1, response=1, reward=r, env=env, seat=seat, group=0)
            for env, r in ((0, 0.2), (1, 0.9), (2, 0.4)) for seat in (0, 1)]
    batch = make_batch(rows, length=2)
    assert torch.equal(magrpo(batch, AdvantageConfig())[0], grpo(batch, AdvantageConfig())[0])


def test_magrpo_refuses_an_episode_spanning_two_groups():
    rows = [dict(prompt=1, response=1, env=4, seat=0, group=0),
            dict(prompt=1, response=1, env=4, seat=1, group=1)]
    with pytest.raises(ValueError, match=r"episode \(env_id\) carry different group_id"):
        magrpo(make_batch(rows, length=2), AdvantageConfig())


# --- GAE ----------------------------------------------------------------------------------------

GAE_PAD = 100.0  # values at prompt positions: garbage that must not be read


def gae_batch() -> TrajectoryBatch:
    # Seat 0 of env 0: the token sequence across turns is s0 s1 | s2 | s3 with values
    # V = (0.5, 1.0, 0.2, 1.5); turn rewards 1 (turn 0, on s1), 0 (turn 1, on s2), 2 (turn 2,
    # on s3). Seat 1 of env 0: one token, V = 0.4, reward 1. Padding holds NaN.
    P, N = GAE_PAD, NAN
    rows = [
        dict(prompt=3, response=1, reward=2.0, turn=2, values=[P, P, P, 1.5, N, N]),
        dict(prompt=2, response=2, reward=1.0, turn=0, values=[P, P, 0.5, 1.0, N, N]),
        dict(prompt=1, response=1, reward=1.0, seat=1, values=[P, 0.4, N, N, N, N]),
        dict(prompt=4, response=1, reward=0.0, turn=1, values=[P, P, P, P, 0.2, N]),
    ]
    return make_batch(rows, length=6)


@pytest.mark.parametrize("estimator", ["gae", "ippo", "mappo", "happo"])
def test_gae_three_turns_gamma_lambda(estimator):
    """IPPO, MAPPO and HAPPO are GAE by name (where their values come from differs)."""
    # gamma = 0.9, lam = 0.8, gamma*lam = 0.72; V after the last token = 0.
    #   d3 = 2 + 0        - 1.5 = 0.5
    #   d2 = 0 + 0.9*1.5  - 0.2 = 1.15
    #   d1 = 1 + 0.9*0.2  - 1.0 = 0.18
    #   d0 = 0 + 0.9*1.0  - 0.5 = 0.4
    #   A3 = 0.5
    #   A2 = 1.15 + 0.72*0.5    = 1.51
    #   A1 = 0.18 + 0.72*1.51   = 1.2672
    #   A0 = 0.4  + 0.72*1.2672 = 1.312384
    #   returns = A + V = (1.812384, 2.2672, 1.71, 2.0)
    # Seat 1: d = 1 - 0.4 = 0.6 = A; return 1.0.
    batch = gae_batch()
    out = compute_advantages(batch, AdvantageConfig(estimator=estimator, gamma=0.9, lam=0.8))
    advantages, returns = out.advantages, out.returns
    assert_rows(response_values(advantages, batch), [[0.5], [1.312384, 1.2672], [0.6], [1.51]])
    assert_rows(response_values(returns, batch), [[2.0], [1.812384, 2.2672], [1.0], [1.71]])
    assert_zero_off_response(advantages, batch)
    assert_zero_off_response(returns, batch)


def test_gae_lambda_one_gamma_one_returns_are_monte_carlo():
    # lam = gamma = 1: returns = sum of future rewards = (3, 3, 2, 2) on s0..s3, whatever V is;
    # A = returns - V = (2.5, 2.0, 1.8, 0.5).
    batch = gae_batch()
    advantages, returns = gae(batch, AdvantageConfig(estimator="gae", gamma=1.0, lam=1.0))
    assert_rows(response_values(returns, batch), [[2.0], [3.0, 3.0], [1.0], [2.0]])
    assert_rows(response_values(advantages, batch), [[0.5], [2.5, 2.0], [0.6], [1.8]])


def test_gae_bootstraps_a_truncated_episode_from_the_critic():
    """A truncated episode's value after its last token is the critic's value of the last
    scored state (V_L = V_{L-1}); a finished episode in the same batch keeps V_L = 0."""
    # Env 0 of gae_batch, truncated; gamma 0.9, lam 0.8 (0.72). Seat 0, V_L = 1.5:
    #   d3 = 2 + 0.9*1.5 - 1.5 = 1.85;  d2 = 1.15;  d1 = 0.18;  d0 = 0.4 (as before)
    #   A3 = 1.85;  A2 = 1.15 + 0.72*1.85 = 2.482;  A1 = 0.18 + 0.72*2.482 = 1.96704
    #   A0 = 0.4 + 0.72*1.96704 = 1.8162688;  returns = A + V
    # Seat 1, V_L = 0.4: d = 1 + 0.9*0.4 - 0.4 = 0.96.  Env 1 (finished): A = 2 - 0.3 = 1.7.
    rows = [dict(prompt=3, response=1, reward=2.0, turn=2,
                 values=[GAE_PAD, GAE_PAD, GAE_PAD, 1.5, NAN, NAN]),
            dict(prompt=2, response=2, reward=1.0, turn=0,
                 values=[GAE_PAD, GAE_PAD, 0.5, 1.0, NAN, NAN]),
            dict(prompt=1, response=1, reward=1.0, seat=1,
                 values=[GAE_PAD, 0.4, NAN, NAN, NAN, NAN]),
            dict(prompt=4, response=1, reward=0.0, turn=1,
                 values=[GAE_PAD, GAE_PAD, GAE_PAD, GAE_PAD, 0.2, NAN]),
            dict(prompt=1, response=1, reward=2.0, env=1,
                 values=[GAE_PAD, 0.3, NAN, NAN, NAN, NAN])]
    batch = make_batch(rows, length=6)
    batch = batch.with_fields(truncated=torch.tensor([True, True, True, True, False]))
    advantages, returns = gae(batch, AdvantageConfig(estimator="gae", gamma=0.9, lam=0.8))
    assert_rows(response_values(advantages, batch),
                [[1.85], [1.8162688, 1.96704], [0.96], [2.482], [1.7]])
    assert_rows(response_values(returns, batch),
                [[3.35], [2.3162688, 2.96704], [1.36], [2.682], [2.0]])
    # Nothing truncated: the finished-episode figures of test_gae_three_turns_gamma_lambda.
    finished = gae(batch.with_fields(truncated=torch.zeros(5, dtype=torch.bool)),
                   AdvantageConfig(estimator="gae", gamma=0.9, lam=0.8))[0]
    assert_rows(response_values(finished, batch)[:4], [[0.5], [1.312384, 1.2672], [0.6], [1.51]])


# --- VDN ----------------------------------------------------------------------------------------


def vdn_batch() -> TrajectoryBatch:
    # Env 0: seat 0 (agent 0) takes two turns, tokens s0 s1 | s2 with V = (0.3, 0.6, 0.8) and
    # turn rewards 1, 0; seat 1 (agent 1) one token, V = 0.5, reward 3. Env 1: seat 0 alone,
    # one token, V = 0.2, reward 2. Rows out of order; prompt positions hold garbage values.
    P, N = GAE_PAD, NAN
    rows = [
        dict(prompt=1, response=1, reward=3.0, seat=1, agent=1, values=[P, 0.5, N, N]),
        dict(prompt=2, response=1, reward=0.0, turn=1, values=[P, P, 0.8, N]),
        dict(prompt=1, response=1, reward=2.0, env=1, values=[P, 0.2, N, N]),
        dict(prompt=1, response=2, reward=1.0, turn=0, values=[P, 0.3, 0.6, N]),
    ]
    return make_batch(rows, length=4)


def test_vdn_credits_each_trajectory_the_joint_return_minus_the_others_values():
    # Env 0: returns 1 (seat 0) and 3 (seat 1): J = 2. First values V_0 = 0.3, V_1 = 0.5.
    #   c_0 = 2 - 0.5 = 1.5 on s2;  c_1 = 2 - 0.3 = 1.7.
    # Seat 0, gamma 0.9, lam 0.8 (0.72):
    #   d2 = 1.5 - 0.8 = 0.7;  d1 = 0.9*0.8 - 0.6 = 0.12;  d0 = 0.9*0.6 - 0.3 = 0.24
    #   A2 = 0.7;  A1 = 0.12 + 0.72*0.7 = 0.624;  A0 = 0.24 + 0.72*0.624 = 0.68928
    #   returns = (0.98928, 1.224, 1.5)
    # Seat 1: A = 1.7 - 0.5 = 1.2, return 1.7.  Env 1 (alone): J = 2, A = 2 - 0.2 = 1.8.
    batch = vdn_batch()
    out = compute_advantages(batch, AdvantageConfig(estimator="vdn", gamma=0.9, lam=0.8))
    assert_rows(response_values(out.advantages, batch), [[1.2], [0.7], [1.8], [0.68928, 0.624]])
    assert_rows(response_values(out.returns, batch), [[1.7], [1.5], [2.0], [0.98928, 1.224]])
    assert_zero_off_response(out.advantages, batch)
    assert_zero_off_response(out.returns, batch)


def test_vdn_first_advantage_is_the_teams_error_for_every_agent():
    # gamma = lam = 1: at each trajectory's first token A = c_i - V_i = J - V_tot
    # = 2 - (0.3 + 0.5) = 1.2 for both seats of env 0 (a seat's own rewards do not matter).
    batch = vdn_batch()
    advantages, returns = vdn(batch, AdvantageConfig(estimator="vdn", gamma=1.0, lam=1.0))
    firsts = [row[0] for row in response_values(advantages, batch)]
    assert firsts == pytest.approx([1.2, 1.5 - 0.8, 1.8, 1.2])
    # the critics' targets at the first tokens sum with the others' values to J
    assert response_values(returns, batch)[3][0] + 0.5 == pytest.approx(2.0)


def test_gae_refuses_row_without_response_tokens():
    rows = [dict(prompt=2, response=0, values=[0.0, 0.0])]
    with pytest.raises(ValueError, match="row 0 has no response tokens"):
        gae(make_batch(rows, length=2), AdvantageConfig(estimator="gae"))


# --- per-agent normalisation --------------------------------------------------------------------


def normalisation_batch() -> tuple[TrajectoryBatch, torch.Tensor]:
    # Agent 0: row 0 (seat 0) advantages (1, 3), row 1 (seat 1) advantage (2).
    # Agent 1: row 2 (seat 0) advantages (10, 20). Prompt/padding entries are NaN.
    rows = [
        dict(prompt=1, response=2, agent=0, seat=0, env=0),
        dict(prompt=2, response=1, agent=0, seat=1, env=0),
        dict(prompt=1, response=2, agent=1, seat=0, env=1),
    ]
    batch = make_batch(rows, length=4)
    advantages = torch.tensor([[NAN, 1.0, 3.0, NAN], [NAN, NAN, 2.0, NAN], [NAN, 10.0, 20.0, NAN]])
    return batch, advantages


def test_whiten_per_agent():
    # Agent 0 tokens (1, 3, 2): mean 2, var (1 + 1 + 0)/3 = 2/3, std 0.8164966
    #   -> (-1.2247449, 1.2247449), (0).
    # Agent 1 tokens (10, 20): mean 15, std 5 -> (-1, 1).
    batch, advantages = normalisation_batch()
    keys = normalization_keys(batch, "agent")
    out = normalize_advantages(advantages, batch.response_mask, keys, "whiten", eps=1e-6)
    a = 1.0 / math.sqrt(2.0 / 3.0)
    assert_rows(response_values(out, batch), [[-a, a], [0.0], [-1.0, 1.0]])
    assert_zero_off_response(out, batch)


def test_mean_centre_per_agent():
    # Agent 0: mean 2 -> (-1, 1), (0). Agent 1: mean 15 -> (-5, 5).
    batch, advantages = normalisation_batch()
    keys = normalization_keys(batch, "agent")
    out = normalize_advantages(advantages, batch.response_mask, keys, "mean")
    assert_rows(response_values(out, batch), [[-1.0, 1.0], [0.0], [-5.0, 5.0]])


def test_whiten_per_agent_and_seat():
    # (agent 0, seat 0): (1, 3) -> mean 2, std 1 -> (-1, 1); (agent 0, seat 1): (2) alone -> 0;
    # (agent 1, seat 0): (10, 20) -> (-1, 1) (shares seat 0 with agent 0 but not statistics).
    batch, advantages = normalisation_batch()
    keys = normalization_keys(batch, "agent_seat")
    out = normalize_advantages(advantages, batch.response_mask, keys, "whiten", eps=1e-6)
    assert_rows(response_values(out, batch), [[-1.0, 1.0], [0.0], [-1.0, 1.0]])


def test_one_agent_never_moves_another_agents_advantages():
    batch, advantages = normalisation_batch()
    keys = normalization_keys(batch, "agent")
    before = normalize_advantages(advantages, batch.response_mask, keys, "whiten")
    # Agent 1's advantages change wildly: agent 0's results must be bitwise identical.
    changed = advantages.clone()
    changed[2] = changed[2] * 100.0 - 7.0
    after = normalize_advantages(changed, batch.response_mask, keys, "whiten")
    assert torch.equal(before[:2], after[:2])
    assert_rows(response_values(after, batch)[2:], [[-1.0, 1.0]])


def test_compute_advantages_isolates_agents_end_to_end():
    # REINFORCE (gamma 1) then mean-centring per agent.
    # Agent 0: env 0 returns 1 and env 1 returns 3 -> mean 2 -> (-1), (+1).
    # Agent 1: env 2 returns 10 -> alone -> 0. Scaling agent 1's reward leaves agent 0 alone.
    rows = [
        dict(prompt=1, response=1, reward=1.0, env=0, agent=0),
        dict(prompt=1, response=1, reward=3.0, env=1, agent=0),
        dict(prompt=1, response=1, reward=10.0, env=2, agent=1),
    ]
    batch = make_batch(rows, length=3)
    cfg = AdvantageConfig(estimator="reinforce", norm="mean", norm_by="agent")
    out = compute_advantages(batch, cfg)
    assert_rows(response_values(out.advantages, out), [[-1.0], [1.0], [0.0]])
    assert_rows(response_values(out.returns, out), [[1.0], [3.0], [10.0]])  # not normalised
    scaled = compute_advantages(batch.with_fields(rewards=torch.tensor([1.0, 3.0, -50.0])), cfg)
    assert torch.equal(scaled.advantages[:2], out.advantages[:2])


# --- config and registry ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gamma", 1.5),
        ("gamma", -0.1),
        ("lam", 2.0),
        ("eps", 0.0),
        ("norm", "zscore"),
        ("norm_by", "seat"),
    ],
)
def test_config_errors_name_field_and_value(field, value):
    with pytest.raises(ConfigError, match=rf"advantage\.{field}=.*{value}"):
        AdvantageConfig(**{field: value})


def test_unknown_estimator_lists_known_names():
    known = r"'gae', 'grpo', 'happo', 'ippo', 'magrpo', 'mappo', 'rae', 'reinforce', 'vdn'"
    with pytest.raises(ValueError, match=known):
        get_advantage_estimator("ppo")
    with pytest.raises(ConfigError, match=r"advantage\.estimator=.*'gae', 'grpo'"):
        AdvantageConfig(estimator="ppo")


def test_registry_refuses_a_second_estimator_under_a_taken_name():
    assert get_advantage_estimator("grpo") is grpo
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_advantage("grpo")(reinforce)
    assert get_advantage_estimator("grpo") is grpo


# --- RAE ----------------------------------------------------------------------------------------


def rae_batch(returns: dict[tuple[int, int, int], float]) -> TrajectoryBatch:
    """One one-turn trajectory per (env, agent, seat) with the given return."""
    rows = [dict(prompt=1, response=2, reward=value, env=env, agent=agent, seat=seat)
            for (env, agent, seat), value in returns.items()]
    return make_batch(rows, length=3)


def test_rae_baseline_per_agent_and_seat_read_before_its_update():
    # Agent 0 plays seat 0 in env 0 and seat 1 in env 1 (a shared adapter playing both seats
    # of a zero-sum game): its two seats keep separate baselines, so its win in seat 0 is not
    # centred against its loss in seat 1.
    baselines = RunningBaselines()
    cfg = AdvantageConfig(estimator="rae", rae_decay=0.5)
    step1 = rae_batch({(0, 0, 0): 1.0, (0, 1, 1): -1.0, (1, 0, 1): -1.0, (1, 1, 0): 1.0,
                       (2, 0, 0): 3.0})
    out = compute_advantages(step1, cfg, baselines)
    # every baseline starts at 0: A = R
    assert_rows(response_values(out.advantages, step1), [[1, 1], [-1, -1], [-1, -1], [1, 1],
                                                         [3, 3]])
    # b = 0.5 * 0 + 0.5 * mean: agent 0 seat 0: mean(1, 3) = 2 -> 1; agent 0 seat 1: -1 -> -0.5;
    # agent 1 seat 1: -1 -> -0.5; agent 1 seat 0: 1 -> 0.5
    assert baselines.values == {"0:0": 1.0, "0:1": -0.5, "1:1": -0.5, "1:0": 0.5}
    step2 = rae_batch({(0, 0, 0): 0.0, (0, 1, 1): 2.0})
    out = compute_advantages(step2, cfg, baselines)
    # read before the update: A = 0 - 1 = -1 (agent 0 seat 0), 2 - (-0.5) = 2.5 (agent 1 seat 1)
    assert_rows(response_values(out.advantages, step2), [[-1, -1], [2.5, 2.5]])
    assert_rows(response_values(out.returns, step2), [[0, 0], [2, 2]])
    assert_zero_off_response(out.advantages, step2)
    # then b = 0.5 * 1 + 0.5 * 0 = 0.5 and 0.5 * -0.5 + 0.5 * 2 = 0.75; untouched keys stay
    assert baselines.values == {"0:0": 0.5, "0:1": -0.5, "1:1": 0.75, "1:0": 0.5}
    restored = RunningBaselines()
    restored.load_state_dict(baselines.state_dict())
    assert restored == baselines


def test_rae_needs_its_baselines_and_a_decay_below_one():
    batch = rae_batch({(0, 0, 0): 1.0})
    with pytest.raises(ValueError, match="running baselines"):
        compute_advantages(batch, AdvantageConfig(estimator="rae"))
    with pytest.raises(ConfigError, match=r"advantage.rae_decay=1.0"):
        AdvantageConfig(estimator="rae", rae_decay=1.0)


def test_zero_advantage_share_is_counted_per_agent():
    """``<agent>/zero_adv_fraction``: the share of the agent's rows whose every response token
    has advantage exactly 0 (nothing to learn from them)."""
    rows = [dict(prompt=1, response=2, agent=agent, env=i) for i, agent in
            enumerate([0, 1, 0, 1, 0, 1, 0])]
    batch = make_batch(rows, length=4)
    advantages = torch.tensor([[0, 0, 0, 0],    # agent 0: zero
                               [0, 0, 0, 0],    # agent 1: zero
                               [0, 1, 0, 0],    # agent 0
                               [5, 0, 0, 0],    # agent 1: a value on the prompt token only
                               [0, 0, 0, 0],    # agent 0: zero
                               [0, 0, -2, 0],   # agent 1
                               [0, 0, 0, 3.0]]) * 1  # agent 0: a value on padding only
    batch = batch.with_fields(advantages=advantages)
    assert zero_advantage_rows(batch).tolist() == [True, True, False, True, True, False, True]
    zero = zero_advantage_rows(batch)
    assert zero_advantage_shares(zero, batch.agent_id, ["a", "b"]) == {
        "a": {"zero_adv_fraction": 3 / 4, "zero_adv_rows": 3.0},
        "b": {"zero_adv_fraction": 2 / 3, "zero_adv_rows": 2.0}}
    bob = batch.agent_id == 1
    assert zero_advantage_shares(zero[bob], batch.agent_id[bob], ["a", "b"]).keys() == {"b"}
