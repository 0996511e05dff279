"""The policy over legal moves under constrained decoding: branching points, entropy and KL to a
magnet, against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from roll.algorithms.choices import (
    choice_entropy,
    choice_kl,
    choice_logprobs,
    choice_reverse_kl,
    move_logprobs,
    uniform_logprobs,
)
from roll.inference.constrained import CompletionTrie


def test_branch_points_of_a_two_level_tree():
    # Three legal answers: [5, 7, 9], [5, 8, 9], [6, 9]. Root chooses 5 or 6 (2 answers below
    # 5, 1 below 6); after 5 a choice of 7 or 8; everything else is forced.
    trie = CompletionTrie([[5, 7, 9], [5, 8, 9], [6, 9]])
    assert trie.branch_points([5, 8, 9]) == [(0, [5, 6], [2, 1]), (1, [7, 8], [1, 1])]
    assert trie.branch_points([6, 9]) == [(0, [5, 6], [2, 1])]
    # An engine that dropped the last token: the points up to there.
    assert trie.branch_points([5, 7]) == [(0, [5, 6], [2, 1]), (1, [7, 8], [1, 1])]
    # One legal answer: no choice anywhere.
    assert CompletionTrie([[1, 2, 3]]).branch_points([1, 2, 3]) == []


def _row(points: list[tuple[int, list[float], list[int]]], length: int = 4, width: int = 3):
    """(logits, tokens) of one row (1, T, C) with the given points: (position, logits of the
    legal tokens, legal token ids)."""
    logits = torch.zeros(1, length, width)
    tokens = torch.full((1, length, width), -1, dtype=torch.long)
    for position, values, ids in points:
        logits[0, position, :len(values)] = torch.tensor(values)
        tokens[0, position, :len(ids)] = torch.tensor(ids)
    return logits, tokens


def test_entropy_over_legal_moves_by_hand():
    # One point with logits (ln 3, 0): p = (3/4, 1/4); H = -(3/4 ln 3/4 + 1/4 ln 1/4).
    logits, tokens = _row([(2, [math.log(3.0), 0.0], [11, 12])])
    logp = choice_logprobs(logits, tokens)
    assert logp[0, 2, :2].exp().tolist() == pytest.approx([0.75, 0.25])
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))  # 0.5623
    assert choice_entropy(logp, tokens).tolist() == pytest.approx([expected])
    # Two points on the path (a two-level tree): the sum, 0.5623 + ln 3 (uniform over three).
    logits, tokens = _row([(1, [math.log(3.0), 0.0], [11, 12]), (2, [0.0, 0.0, 0.0], [4, 5, 6])])
    assert choice_entropy(choice_logprobs(logits, tokens), tokens).tolist() == pytest.approx(
        [expected + math.log(3.0)])
    # No point: 0, never NaN.
    logits, tokens = _row([])
    assert choice_entropy(choice_logprobs(logits, tokens), tokens).tolist() == [0.0]


def test_kl_to_the_uniform_magnet_by_hand():
    # Point 1: p = (3/4, 1/4), and 2 legal answers lie below the first token, 1 below the
    # second: the uniform policy over MOVES is (2/3, 1/3) there, not (1/2, 1/2).
    logits, tokens = _row([(1, [math.log(3.0), 0.0], [11, 12])])
    leaves = torch.zeros(1, 4, 3)
    leaves[0, 1, :2] = torch.tensor([2.0, 1.0])
    magnet = uniform_logprobs(leaves, tokens)
    assert magnet[0, 1, :2].exp().tolist() == pytest.approx([2 / 3, 1 / 3])
    kl = 0.75 * math.log(0.75 / (2 / 3)) + 0.25 * math.log(0.25 / (1 / 3))  # 0.01643
    assert choice_kl(choice_logprobs(logits, tokens), magnet, tokens).tolist() == pytest.approx(
        [kl])
    # Where the magnet is uniform over the point's tokens, KL = ln k - H.
    leaves[0, 1, :2] = 1.0
    magnet = uniform_logprobs(leaves, tokens)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert choice_kl(choice_logprobs(logits, tokens), magnet, tokens).tolist() == pytest.approx(
        [math.log(2.0) - h])


def test_reverse_kl_to_the_magnet_by_hand():
    # p = (0.8, 0.2) against the magnet (1/2, 1/2):
    #   KL(rho || p) = 0.5 ln(0.5 / 0.8) + 0.5 ln(0.5 / 0.2) = 0.5 (-0.47000) + 0.5 (0.91629)
    #                = 0.22314,   KL(p || rho) = 0.8 ln 1.6 + 0.2 ln 0.4 = 0.19274.
    logits, tokens = _row([(1, [math.log(4.0), 0.0], [11, 12])])
    magnet = torch.full((1, 4, 3), math.log(0.5))
    logp = choice_logprobs(logits, tokens)
    assert choice_reverse_kl(logp, magnet, tokens).tolist() == pytest.approx([0.22314], abs=1e-5)
    assert choice_kl(logp, magnet, tokens).tolist() == pytest.approx([0.19274], abs=1e-5)
    # Its gradient with respect to the point's logits is p - rho = (0.3, -0.3).
    logits.requires_grad_(True)
    choice_reverse_kl(choice_logprobs(logits, tokens), magnet, tokens).sum().backward()
    assert logits.grad[0, 1, :2].tolist() == pytest.approx([0.3, -0.3], abs=1e-6)
    assert logits.grad[0, 1, 2] == 0 and logits.grad[0, [0, 2, 3]].abs().sum() == 0


def test_near_a_deterministic_policy_only_the_reverse_kl_still_pulls():
    # p = (1 - 1e-6, 1e-6): the forward KL's gradient p_i (log p_i - log rho_i - KL) is ~1e-5,
    # the reverse KL's is p - rho = (0.5, -0.5) (up to 1e-6).
    forward_grad, reverse_grad = [], []
    for pull, grads in ((choice_kl, forward_grad), (choice_reverse_kl, reverse_grad)):
        logits, tokens = _row([(0, [math.log(1e6), 0.0], [3, 4])])
        logits.requires_grad_(True)
        pull(choice_logprobs(logits, tokens), torch.full((1, 4, 3), math.log(0.5)),
             tokens).sum().backward()
        grads.extend(logits.grad[0, 0, :2].tolist())
    assert max(abs(g) for g in forward_grad) < 2e-5
    assert reverse_grad == pytest.approx([0.5, -0.5], abs=1e-5)


def test_gradients_reach_only_the_legal_logits_and_match_the_hand_derivative():
    # dH/dz_i = -p_i (log p_i + H) for the renormalised distribution p = softmax(z).
    z = torch.tensor([0.3, -0.2])
    logits, tokens = _row([(0, z.tolist(), [3, 4])])
    logits.requires_grad_(True)
    h = choice_entropy(choice_logprobs(logits, tokens), tokens).sum()
    h.backward()
    p = torch.softmax(z, -1)
    expected = -p * (p.log() + h.detach())
    assert logits.grad[0, 0, :2].tolist() == pytest.approx(expected.tolist(), abs=1e-6)
    assert logits.grad[0, 0, 2] == 0 and logits.grad[0, 1:].abs().sum() == 0
    # The magnet is a constant: its log-probs get no gradient.
    logits.grad = None
    magnet = torch.log(torch.tensor([0.5, 0.5, 1.0])).expand(1, 4, 3).clone().requires_grad_(True)
    choice_kl(choice_logprobs(logits, tokens), magnet, tokens).sum().backward()
    assert magnet.grad is None or magnet.grad.abs().sum() == 0
    # dKL/dz_i (uniform magnet over 2) = -dH/dz_i.
    assert logits.grad[0, 0, :2].tolist() == pytest.approx((-expected).tolist(), abs=1e-6)


def test_move_logprobs_by_hand():
    # Row of 5 tokens: position 1 free (no constraint), position 2 forced (one legal token),
    # position 3 a branching point between tokens 11 and 12 with logits (ln 3, 0), and 12 was
    # played: log pi = log 1/4; position 4 a point between 4, 5, 6 (uniform), 6 played.
    logits, tokens = _row([(2, [0.0], [9]), (3, [math.log(3.0), 0.0], [11, 12]),
                           (4, [0.0, 0.0, 0.0], [4, 5, 6])], length=5)
    input_ids = torch.tensor([[1, 2, 9, 12, 6]])
    token_logprobs = torch.tensor([[0.0, -0.7, -0.3, -2.0, -5.0]])
    moves = move_logprobs(token_logprobs, logits, tokens, input_ids)
    assert moves[0].tolist() == pytest.approx([0.0, -0.7, 0.0, math.log(0.25), math.log(1 / 3)])
    # The gradient reaches only the legal tokens' logits at the points: d/dz of log(1/4) is
    # (0 - 3/4, 1 - 1/4) at position 3, and nothing at the forced position 2.
    logits.requires_grad_(True)
    move_logprobs(token_logprobs, logits, tokens, input_ids)[0, 3].backward()
    assert logits.grad[0, 3, :2].tolist() == pytest.approx([-0.75, 0.75])
    assert logits.grad[0, 2].abs().sum() == 0
