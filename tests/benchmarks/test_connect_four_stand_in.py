"""benchmarks/connect_four_stand_in.py: the lines features of a board read by hand, the entropy
gradient against finite differences, Adam's first step by hand, and a short run that learns."""

import sys
from pathlib import Path

import numpy as np
import pytest

from tests.benchmarks.helpers import connect_four_after as after

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import connect_four_stand_in as si  # noqa: E402
from connect_four_baselines import _board  # noqa: E402


def test_features_read_the_lines_by_hand():
    # x: 1 2 3 on the bottom row; o: 6 6 6; x to move. Column 0 and 4 make x's four; column 6
    # tops o's three (o would make four there); column 3 lands on x's piece.
    state = after(1, 6, 2, 6, 3, 6)
    legal = state.legal_actions(0)
    feats = si.column_features(_board(state), 0, legal)
    assert feats.shape == (7, 15) and np.all(feats.sum(axis=1) == 3)
    own = {c: int(np.argmax(feats[i, 0:4])) + 1 for i, c in enumerate(legal)}
    opp = {c: int(np.argmax(feats[i, 4:8])) + 1 for i, c in enumerate(legal)}
    column = {c: int(np.argmax(feats[i, 8:])) for i, c in enumerate(legal)}
    assert own == {0: 4, 1: 2, 2: 2, 3: 2, 4: 4, 5: 1, 6: 1}
    # o's lines there: 6 tops its column (4); 5 sits next to o's bottom piece in 6 (2); in 0
    # and 4 an o touches only x's pieces, in 1-3 it sits on them with o's nearest piece (in 6,
    # rows 1-2) out of line: 1
    assert opp == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 4}
    assert column == {c: c for c in legal}
    # the board is left as it was
    assert _board(state) == _board(after(1, 6, 2, 6, 3, 6))


def test_softmax_and_entropy_gradient():
    rng = np.random.default_rng(0)
    feats = rng.normal(size=(5, 15))
    w = rng.normal(size=15) * 0.3
    p = si.probabilities(w, feats)
    assert p.sum() == pytest.approx(1.0)
    logits = feats @ w
    assert p == pytest.approx(np.exp(logits) / np.exp(logits).sum())

    def entropy(weights):
        q = si.probabilities(weights, feats)
        return -float(q @ np.log(q))

    eps = 1e-6
    numeric = np.array([(entropy(w + eps * e) - entropy(w - eps * e)) / (2 * eps)
                        for e in np.eye(15)])
    assert si.entropy_gradient(p, feats) == pytest.approx(numeric, abs=1e-6)
    # at uniform play the entropy is at its top: no gradient
    assert si.entropy_gradient(np.full(4, 0.25), np.eye(4, 15)) == pytest.approx(np.zeros(15))


def test_adam_first_steps_by_hand():
    # step 1: m_hat = g, v_hat = g^2: each weight moves lr * sign(g)
    adam = si.Adam(3, lr=0.1)
    w = np.zeros(3)
    adam.ascend(w, np.array([2.0, -0.5, 0.0]))
    assert w == pytest.approx([0.1, -0.1, 0.0])
    # step 2 with g = (2, 0.5, 0): m = 0.9 m + 0.1 g = (0.38, 0.005, 0),
    # v = 0.999 v + 0.001 g^2 = (0.007996, 0.00049975, 0); m_hat = m / 0.19 = (2, 0.026316),
    # v_hat = v / 0.001999 = (4, 0.25): the first weight +0.1 * 2 / 2 = +0.1, the second
    # +0.1 * 0.026316 / 0.5 = +0.005263 (the sign flip is damped by the first step's momentum)
    adam.ascend(w, np.array([2.0, 0.5, 0.0]))
    assert w == pytest.approx([0.2, -0.1 + 0.005263, 0.0], abs=1e-6)


def test_sgd_steps_by_hand():
    sgd = si.OPTIMIZERS["sgd"](3, lr=0.5)
    w = np.array([1.0, 0.0, -1.0])
    sgd.ascend(w, np.array([2.0, -0.5, 0.0]))
    assert w == pytest.approx([2.0, -0.25, -1.0])


def test_baselines_by_hand():
    # a position where the mover can win (own 4 in column 0) and is threatened (opp 4 in 6)
    both = np.zeros((3, 15))
    both[0, 3] = both[1, 7] = 1.0
    quiet = np.zeros((2, 15))
    quiet[:, 0] = 1.0
    assert si.state_features(both).tolist() == [1.0, 1.0, 1.0, 1.0]
    assert si.state_features(quiet).tolist() == [1.0, 0.0, 0.0, 0.0]
    # rae: the running mean of the targets, per key, read before each update
    rae = si.Baseline("rae")
    assert rae("k", quiet) == 0.0
    rae.update("k", quiet, 1.0)
    rae.update("k", both, 0.0)
    assert rae("k", both) == pytest.approx(0.5) and rae("other", both) == 0.0
    # critic: LMS at 0.05 on x = (1, 1, 1, 1), target 1 from w = 0: w = 0.05 x, V = 0.2;
    # then target 0 on the quiet x = (1, 0, 0, 0): V there 0.05, w0 -= 0.05 * 0.05 -> 0.0475
    critic = si.Baseline("critic", value_lr=0.05)
    critic.update("k", both, 1.0)
    assert critic("k", both) == pytest.approx(0.2)
    critic.update("k", quiet, 0.0)
    assert critic("k", quiet) == pytest.approx(0.0475)
    assert critic("k", both) == pytest.approx(0.0475 + 0.15)
    with pytest.raises(ValueError, match="estimator"):
        si.Baseline("grpo")


def test_a_short_run_learns_to_block(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = si.main(["--steps", "12", "--games", "64", "--eval_every", "12", "--positions", "30",
                      "--lr", "0.1"])
    first, last = result["runs"][0][0], result["runs"][0][-1]
    assert first["step"] == 0 and last["step"] == 12 and last["games"] == 768
    for agent in ("agent_0", "agent_1"):
        for seat in "xo":
            before, now = first["agents"][agent][seat], last["agents"][agent][seat]
            # uniform at the start (all weights 0): a fifth or so
            assert before["blocks_made"] < 0.3
            assert now["blocks_made"] > before["blocks_made"] + 0.05
            assert now["wins_taken"] > before["wins_taken"] + 0.05
        assert len(last["weights"][agent]) == 15
    assert (tmp_path / "connect_four_stand_in.json").exists()
    assert result["plot"] == "connect_four_stand_in.png"
    assert (tmp_path / "connect_four_stand_in.png").stat().st_size > 10_000
