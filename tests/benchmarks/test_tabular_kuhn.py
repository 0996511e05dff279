"""benchmarks/tabular_kuhn.py: its exact exploitability is OpenSpiel's, and its update rule
learns (a run that could not learn would make its recipe advice worthless)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyspiel
import pytest
from open_spiel.python import policy as policy_lib
from open_spiel.python.algorithms import exploitability as openspiel_exploitability

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tabular_kuhn  # noqa: E402

# OpenSpiel's information-state strings for the table's indices (card 0/1/2 = J/Q/K).
SEAT0 = ["0", "1", "2", "0pb", "1pb", "2pb"]
SEAT1 = ["0p", "1p", "2p", "0b", "1b", "2b"]


def _openspiel(seat0: np.ndarray, seat1: np.ndarray) -> float:
    game = pyspiel.load_game("kuhn_poker")
    policy = policy_lib.TabularPolicy(game)
    for strings, probs in ((SEAT0, seat0), (SEAT1, seat1)):
        for key, bet in zip(strings, probs, strict=True):
            policy.policy_for_key(key)[:] = [1.0 - bet, bet]  # actions: 0 pass, 1 bet
    return openspiel_exploitability.exploitability(game, policy)


def test_exploitability_is_openspiels():
    assert tabular_kuhn.exploitability(np.full(6, 0.5), np.full(6, 0.5)) == pytest.approx(
        0.458333, abs=1e-6)  # uniform play: 11/24
    alpha = 0.2  # a Nash equilibrium: the first player's family, the second's unique reply
    nash0 = np.array([alpha, 0.0, 3 * alpha, 0.0, alpha + 1 / 3, 1.0])
    nash1 = np.array([1 / 3, 0.0, 1.0, 0.0, 1 / 3, 1.0])
    assert tabular_kuhn.exploitability(nash0, nash1) == pytest.approx(0.0, abs=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(5):
        seat0, seat1 = rng.random(6), rng.random(6)
        assert tabular_kuhn.exploitability(seat0, seat1) == pytest.approx(
            _openspiel(seat0, seat1), abs=1e-9)


def test_the_update_rule_learns():
    # From random logits (exploitability ~0.4) to well below the deterministic floor 0.1667.
    curve = tabular_kuhn.train(games=256, entropy=0.2, lr=0.03, schedule="linear", steps=400,
                               seed=0, every=400)
    assert max(curve[-1]["exploitability"]) < 0.12


def test_shared_features_have_the_common_share_asked_for():
    rng = np.random.default_rng(0)
    for share in (0.5, 0.92, 0.99):
        phi = tabular_kuhn.shared_features(share, 4096, rng).reshape(12, -1)
        measured = np.square(phi.mean(0)).sum() / np.square(phi).sum(1).mean()
        assert measured == pytest.approx(share, abs=0.02)
        assert np.abs(phi).sum(1).mean() == pytest.approx(1.0)  # a full Adam step moves ~lr


def test_shared_features_need_a_larger_step_than_the_table():
    # What the GPU runs showed (benchmarks/README.md): with 92% of the gradient shared, the
    # table's rate leaves the agents near "always bet" (1/3) for hundreds of steps; 5x more
    # reaches below the deterministic floor.
    kwargs = dict(games=128, entropy=0.2, schedule="linear", steps=1000, seed=0, every=250,
                  common_share=0.92)
    slow = tabular_kuhn.train(lr=0.1, **kwargs)
    fast = tabular_kuhn.train(lr=0.5, **kwargs)
    assert max(slow[0]["exploitability"]) > 0.25
    assert max(fast[-1]["exploitability"]) < 0.1
    # The start is SmolLM2's own policy (log-odds measured by state_gradients.py).
    start = tabular_kuhn.train(lr=0.0, steps=1, every=1, common_share=0.92, seed=0)
    probs = 1 / (1 + np.exp(-tabular_kuhn.SMOLLM2_LOG_ODDS))
    assert start[0]["exploitability"][0] == pytest.approx(
        tabular_kuhn.exploitability(probs[0], probs[1]), abs=1e-4)


def test_clipped_surrogate_gradient_by_hand():
    grad = tabular_kuhn.surrogate_gradient
    # bet (action 1) with advantage 1, p_old 0.5: r = p / 0.5
    assert grad(0.6, 0.5, 1, 1.0, 0.0, 0.2) == pytest.approx(-1.2 * 0.4)  # r 1.2: still active
    assert grad(0.7, 0.5, 1, 1.0, 0.0, 0.2) == 0.0  # r 1.4 > 1.2 in A's direction: clipped
    assert grad(0.3, 0.5, 1, 1.0, 0.0, 0.2) == pytest.approx(-0.6 * 0.7)  # r 0.6: A > 0 pulls
    # pass (action 0) with advantage -1: r = (1 - p) / 0.5
    assert grad(0.4, 0.5, 0, -1.0, 0.0, 0.2) == pytest.approx(1.2 * -0.4)  # r 1.2, active
    assert grad(0.7, 0.5, 0, -1.0, 0.0, 0.2) == 0.0  # r 0.6 < 0.8 in A's direction: clipped
    # the entropy bonus alone: h p (1 - p) log(p / (1 - p)) = 0.1 * 0.16 * log 4
    assert grad(0.8, 0.8, 1, 0.0, 0.1, 0.2) == pytest.approx(0.1 * 0.16 * np.log(4.0))


def test_magnet_pull_by_hand():
    grad = tabular_kuhn.surrogate_gradient
    # m p (1 - p) (log(p / (1 - p)) - log(q / (1 - q))), p = 0.8 (log-odds log 4), m = 0.5
    assert grad(0.8, 0.8, 1, 0.0, 0.0, 0.2, 0.5, 0.5) == pytest.approx(0.5 * 0.16 * np.log(4.0))
    assert grad(0.8, 0.8, 1, 0.0, 0.0, 0.2, 0.5, 0.8) == pytest.approx(0.0)  # at the magnet
    assert grad(0.8, 0.8, 1, 0.0, 0.0, 0.2, 0.5, 0.2) == pytest.approx(0.5 * 0.16 * 2 * np.log(4.0))
    # against a uniform magnet the pull is the entropy bonus's gradient at the same weight
    assert grad(0.3, 0.3, 0, 0.0, 0.0, 0.2, 0.7) == pytest.approx(grad(0.3, 0.3, 0, 0.0, 0.7, 0.2))


def test_a_magnet_refreshed_every_step_changes_nothing_before_the_first_step():
    # a magnet that is the policy itself pulls with zero force at the refresh: with refresh 1
    # and one optimizer step per rollout, every step starts at the magnet, so the run equals the
    # magnet-free run exactly
    kwargs = dict(games=64, entropy=0.2, lr=0.3, steps=20, seed=0, every=10)
    pulled = tabular_kuhn.train(magnet=1.0, magnet_refresh=1, **kwargs)
    assert pulled == tabular_kuhn.train(**kwargs)


@pytest.mark.slow  # a tabular learning run (~2 s): the quick subset stays under 3 minutes
def test_four_steps_per_rollout_beat_one_on_shared_features():
    # benchmarks/README.md ("kuhn_nash, four steps per rollout"): at share 0.94 and lr 0.7, one
    # step per rollout is at ~0.17 at step 250; four mini-batches at the same compute ~0.10.
    kwargs = dict(games=128, entropy=0.2, lr=0.7, schedule="linear", steps=1000, seed=0,
                  every=250, common_share=0.94)
    one = tabular_kuhn.train(**kwargs)
    four = tabular_kuhn.train(minibatches=4, **kwargs)
    assert max(one[0]["exploitability"]) > 0.14
    assert max(four[0]["exploitability"]) < 0.13


def test_entropy_final_moves_the_weight_linearly_over_the_run():
    """A final weight equal to the first is the constant bonus, bitwise; at lr 0 nothing moves
    whatever the weight; a different final weight changes the run."""
    kwargs = dict(games=32, entropy=0.2, lr=0.03, steps=40, every=20, seed=1)
    constant = tabular_kuhn.train(**kwargs)
    assert tabular_kuhn.train(entropy_final=0.2, **kwargs) == constant
    assert tabular_kuhn.train(entropy_final=0.0, **kwargs) != constant
    frozen = dict(kwargs, lr=0.0)
    assert tabular_kuhn.train(entropy_final=0.0, **frozen) == tabular_kuhn.train(**frozen)


def test_a_strong_reverse_uniform_magnet_holds_every_state_near_one_half():
    # The pull u (p - 1/2) per decision, weight 20 against advantages of a few chips: after 60
    # steps every state's betting probability stays near 1/2, so the exploitability is close
    # to the uniform policy's 0.458 (without it the table leaves uniform play far behind).
    held = tabular_kuhn.train(games=64, entropy=0.0, lr=0.1, steps=60, every=60, seed=0,
                              reverse_uniform=20.0)
    free = tabular_kuhn.train(games=64, entropy=0.0, lr=0.1, steps=60, every=60, seed=0)
    assert max(held[-1]["exploitability"]) == pytest.approx(0.458, abs=0.04)
    assert max(free[-1]["exploitability"]) < 0.35


def test_the_weight_average_by_hand():
    """--ema d: w_avg <- d w_avg + (1 - d) w after every update. d = 0 is the current weights
    (same exploitability, and the run itself unchanged); d = 1 never leaves the start, so on
    shared features (weights 0 at the start) it scores SmolLM2's starting log-odds."""
    kwargs = dict(games=64, entropy=0.2, lr=0.5, steps=30, every=10, seed=0, common_share=0.94)
    plain = tabular_kuhn.train(**kwargs)
    current = tabular_kuhn.train(ema=0.0, **kwargs)
    assert [p["exploitability"] for p in current] == [p["exploitability"] for p in plain]
    assert all(p["exploitability_ema"] == p["exploitability"] for p in current)
    start = 1 / (1 + np.exp(-tabular_kuhn.SMOLLM2_LOG_ODDS))  # (seat, state) betting probs
    frozen = tabular_kuhn.exploitability(start[0], start[1])
    assert all(p["exploitability_ema"] == [pytest.approx(frozen, abs=1e-4)] * 2
               for p in tabular_kuhn.train(ema=1.0, **kwargs))
    halfway = tabular_kuhn.train(ema=0.5, **kwargs)  # in between: neither of the two
    assert all(p["exploitability_ema"] != p["exploitability"] for p in halfway)
