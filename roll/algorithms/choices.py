"""The policy over legal moves under constrained decoding, and its regularisers.

Constrained decoding walks the prefix tree of the legal answers (``<answer>MOVE</answer>`` +
EOS): at a node with one child there is no choice; at a BRANCHING POINT with legal next tokens
c_1..c_k it samples c_i with probability ``softmax(z[c_1..c_k] / T)_i``, the model's own
next-token distribution renormalised over the legal tokens (z the logits). So the probability
of a move is the product, over the branching points on its path, of these choice
probabilities, and its log-probability is what the rollout's tokens already carry up to the
renormalisation.

Per row (one decision), with π_n the policy's and ρ_n the magnet's choice distribution at
point n of the row's sampled path:

    H_row  = sum_n H(π_n)                      (entropy over legal moves)
    KL_row = sum_n KL(π_n || ρ_n)              (KL(π || ρ) over legal moves)
    KL_rev = sum_n KL(ρ_n || π_n)              (the magnet's cross-entropy to π, less its own
                                                entropy; ``trainer.magnet_kl=reverse``)

Why both: toward the uniform magnet, KL(π || ρ) = ln k - H(π) has the entropy bonus's gradient
p_i (log p_i + H), which vanishes as π nears a deterministic policy, so a model that starts
nearly deterministic (SmolLM2 on Leduc: 0.2-0.5 nats over up to 3 moves) is barely pulled
back. KL(ρ || π) has gradient π - ρ with respect to the point's logits: a pull of fixed size
out of a corner (``benchmarks/tabular_leduc.py`` shows what it buys).

When the legal answers part at one token (Kuhn: Pass/Bet, Leduc: Fold/Call/Raise, Connect
Four), the row has one point and these ARE the entropy and the KL of the distribution over
legal moves, exactly. With deeper trees (TicTacToe's "x(1,2)": row, then column) the chain rule
gives H(π) = E_path[sum_n H(π_n)], so the row's sum is an unbiased estimate of it from the
sampled path (the usual entropy of an autoregressive action); the same holds for the KL. The
uniform magnet over legal MOVES has ρ_n(c) = (legal answers below c) / (legal answers below n)
(``uniform_logprobs``).

Shapes: (B, T, C), aligned with ``TrajectoryBatch.choice_tokens`` (position t is the point
that chose ``input_ids[:, t]``; C legal tokens at most; -1 / padding marks no token).
"""

from __future__ import annotations

import torch
from torch import Tensor

_FILL = -1e9
"""Logit put on padding entries: exp underflows to exactly 0, and nothing is inf or NaN."""


def choice_logprobs(choice_logits: Tensor, choice_tokens: Tensor) -> Tensor:
    """log π_n(c): the choice logits (B, T, C) (z / T of each legal token) renormalised over
    each point's legal tokens; ``_FILL`` on padding (it never counts: its probability is 0)."""
    valid = choice_tokens >= 0
    logits = torch.where(valid, choice_logits.float(), torch.full_like(choice_logits.float(),
                                                                       _FILL))
    return torch.log_softmax(logits, dim=-1)


def move_logprobs(token_logprobs: Tensor, choice_logits: Tensor, choice_tokens: Tensor,
                  input_ids: Tensor) -> Tensor:
    """(B, T) log-probs of the policy that constrained decoding PLAYS: log π_n(sampled token)
    at a branching point, 0 at a forced token (one legal token: probability 1), and the
    token's own log-prob (``token_logprobs``) where decoding was not constrained. Summed over
    a row they give log π(move) = sum_n log π_n(c_n); their gradient reaches only the legal
    tokens' logits at the branching points (``trainer.policy_over=moves``).

    ``token_logprobs`` (B, T) and ``input_ids`` (B, T) aligned as ``TrajectoryBatch``'s
    (position t holds the token chosen at t); ``choice_logits`` (B, T, C) from the model's
    ``choices=`` output; ``choice_tokens`` (B, T, C), -1 padded.
    """
    legal = choice_tokens >= 0
    picked = legal & (choice_tokens == input_ids.unsqueeze(-1))  # (B, T, C): the sampled one
    at_point = torch.where(picked, choice_logprobs(choice_logits, choice_tokens),
                           torch.zeros_like(choice_logits, dtype=torch.float32)).sum(-1)
    constrained = legal.any(-1)
    return torch.where(points(choice_tokens), at_point,
                       torch.where(constrained, torch.zeros_like(at_point),
                                   token_logprobs.float()))


def points(choice_tokens: Tensor) -> Tensor:
    """(B, T) bool: the branching points (two or more legal tokens)."""
    return (choice_tokens >= 0).sum(-1) >= 2


def choice_entropy(logprobs: Tensor, choice_tokens: Tensor) -> Tensor:
    """(B,) H_row: the sum over the row's points of the entropy of π_n (nats)."""
    return -_row_sum(logprobs.exp() * logprobs, choice_tokens)


def choice_kl(logprobs: Tensor, magnet_logprobs: Tensor, choice_tokens: Tensor) -> Tensor:
    """(B,) KL_row: the sum over the row's points of KL(π_n || ρ_n) (nats); the magnet's
    log-probs are constants."""
    magnet = torch.where(choice_tokens >= 0, magnet_logprobs.detach().float(),
                         torch.zeros_like(logprobs))
    return _row_sum(logprobs.exp() * (logprobs - magnet), choice_tokens)


def choice_reverse_kl(logprobs: Tensor, magnet_logprobs: Tensor, choice_tokens: Tensor) -> Tensor:
    """(B,) KL_rev: the sum over the row's points of KL(ρ_n || π_n) = sum_c ρ(c) (log ρ(c) -
    log π(c)) (nats); the magnet's log-probs are constants. Its gradient with respect to the
    point's legal logits is π_n - ρ_n."""
    magnet = torch.where(choice_tokens >= 0, magnet_logprobs.detach().float(),
                         torch.zeros_like(logprobs))
    return _row_sum(magnet.exp() * (magnet - logprobs), choice_tokens)


def _row_sum(terms: Tensor, choice_tokens: Tensor) -> Tensor:
    """(B,) the sum of per-token ``terms`` (B, T, C) over each row's legal tokens at its
    branching points; padding and other positions add exactly 0 (``torch.where``, so a
    garbage value there reaches neither the sum nor the gradient)."""
    keep = (choice_tokens >= 0) & points(choice_tokens).unsqueeze(-1)
    return torch.where(keep, terms, torch.zeros_like(terms)).sum((-1, -2))


def uniform_logprobs(choice_leaves: Tensor, choice_tokens: Tensor) -> Tensor:
    """log ρ_n(c) of the uniform policy over legal moves: the share of the point's legal
    answers that lie below c; 0 on padding."""
    valid = choice_tokens >= 0
    total = choice_leaves.sum(-1, keepdim=True).clamp(min=1.0)
    share = torch.where(valid, choice_leaves / total, torch.ones_like(choice_leaves))
    return share.clamp(min=1e-30).log()


__all__ = ["choice_entropy", "choice_kl", "choice_logprobs", "choice_reverse_kl",
           "move_logprobs", "points", "uniform_logprobs"]
