"""benchmarks/tabular_leduc.py: its exploitability, its per-decision gradient and its update rule
against numbers worked out by hand (recipe advice from a wrong stand-in would be worthless)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tabular_leduc  # noqa: E402


@pytest.fixture(scope="module")
def leduc():
    return tabular_leduc.Leduc()


def test_uniform_play_has_the_known_exploitability(leduc):
    # Uniform random play in Leduc: NashConv 4.7472, exploitability (NashConv / 2) 2.3736, the
    # figure the issue and the papers quote.
    uniform = leduc.legal / leduc.legal.sum(-1, keepdims=True)
    assert leduc.exploitability(uniform) == pytest.approx(2.3736, abs=1e-4)
    assert len(leduc.legal) == 936  # information states of both seats


def test_decision_gradient_by_hand():
    legal = np.array([[True, True, True], [True, True, False]])
    p = np.array([[1 / 3, 1 / 3, 1 / 3], [0.75, 0.25, 0.0]])
    # Row 0 at ratio 1, action 0, A = 1: -A (onehot - p) = (-2/3, 1/3, 1/3); the entropy term is
    # 0 at the uniform policy (log p_i + H = -ln 3 + ln 3) and so is the magnet's (p - u).
    # Row 1, action 1, A = -2, ratio 1 (p_old = p): -A (onehot - p) = 2 (-0.75, 0.75, 0) =
    # (-1.5, 1.5, 0); entropy weight 0.1: p_i (log p_i + H), H = 0.5623,
    # 0.1 (0.75 (-0.2877 + 0.5623), 0.25 (-1.3863 + 0.5623), 0) = (0.02060, -0.02060, 0);
    # magnet 0.5: 0.5 ((0.75, 0.25) - (0.5, 0.5)) = (0.125, -0.125, 0).
    g = tabular_leduc.decision_gradient(p, p.copy(), np.array([0, 1]), np.array([1.0, -2.0]),
                                        0.1, 0.2, legal, magnet=0.5)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    entropy_part = [0.1 * 0.75 * (math.log(0.75) + h), 0.1 * 0.25 * (math.log(0.25) + h)]
    assert g[0] == pytest.approx([-2 / 3, 1 / 3, 1 / 3], abs=1e-12)
    assert entropy_part == pytest.approx([0.02060, -0.02060], abs=1e-5)
    assert g[1] == pytest.approx([-1.5 + entropy_part[0] + 0.125,
                                  1.5 + entropy_part[1] - 0.125, 0.0], abs=1e-12)
    # The clip: a positive advantage whose ratio already left 1 + 0.2 pushes no further.
    moved = np.array([[0.5, 0.25, 0.25]])
    g = tabular_leduc.decision_gradient(moved, np.array([[0.4, 0.3, 0.3]]), np.array([0]),
                                        np.array([1.0]), 0.0, 0.2, legal[:1])
    assert g == pytest.approx(np.zeros((1, 3)))


@pytest.mark.slow  # a tabular learning run (~2 s): the quick subset stays under 3 minutes
def test_the_recipe_rule_learns_below_the_uniform_policy(leduc):
    # 80 steps of 128 games from near-uniform tables: both agents well under uniform's 2.37
    # (1.54 / 1.67 with this seed).
    curve = tabular_leduc.train(leduc, games=128, entropy=0.2, lr=0.1, steps=80, every=80)
    assert max(curve[-1]["exploitability"]) < 1.9
