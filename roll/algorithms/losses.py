"""Mask-aware losses: aggregation, PPO clipped policy loss, KL to the reference, entropy, and
the critic's clipped value loss.

All per-token inputs are (B, T) and aligned with ``TrajectoryBatch.input_ids``; ``mask`` is the
response mask. Positions outside the mask (prompt, padding after EOS) are replaced by 0 with
``torch.where`` before any arithmetic that could overflow, so whatever sits there (garbage,
inf, NaN) changes neither a loss nor a gradient.

Loss terms are meant to be added: ``ppo_policy_loss + kl_loss + entropy_loss``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
KlKind = Literal["k1", "k2", "k3"]
KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3")
K3_LOG_RATIO_BOUND = 20.0
"""k3 takes log(ref / policy) clamped to [-20, 20] (as verl's low-variance KL)."""
K3_BOUND = 10.0
"""k3 per token is at most 10 nats (as verl's): beyond it the term stops pulling."""


def _masked(values: Tensor, mask: Tensor) -> Tensor:
    """values where mask is set, 0 elsewhere (no NaN/inf leaks from padding)."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(mask.bool(), values, zero)


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: AggMode = "token-mean",
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Reduce per-token values (B, T) over the masked tokens to a scalar.

    Modes:
        ``"token-mean"``: sum of masked values / number of masked tokens.
        ``"seq-mean-token-mean"``: mean over each row's masked tokens, then mean over the rows
            that have at least one masked token.
        ``"seq-mean-token-sum"``: sum over each row's masked tokens, then mean over those rows.

    ``normalizer`` replaces the denominator (the token count for ``"token-mean"``, the row count
    for the ``seq-mean-*`` modes). With gradient accumulation, pass the count of the whole
    mini-batch so that the micro-batch losses add up to the mini-batch loss. No masked token
    gives 0 (nothing to learn from), never NaN.
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} differ")
    if mode not in AGG_MODES:
        raise ValueError(f"aggregation mode must be one of {AGG_MODES}, got {mode!r}")
    if isinstance(normalizer, (int, float)) and not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer!r}")
    keep = mask.bool()
    masked = _masked(values, keep)  # (B, T)
    if mode == "token-mean":
        denominator = keep.sum().clamp(min=1) if normalizer is None else normalizer
        return masked.sum() / denominator
    row_tokens = keep.sum(dim=1)  # (B,)
    row_total = masked.sum(dim=1)  # (B,)
    if mode == "seq-mean-token-mean":
        row_total = row_total / row_tokens.clamp(min=1)
    denominator = (row_tokens > 0).sum().clamp(min=1) if normalizer is None else normalizer
    return row_total.sum() / denominator


def row_means(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) each row's mean of ``values`` (B, T) over its masked positions; 0 for a row
    without any."""
    keep = mask.bool()
    return _masked(values, keep).sum(-1) / keep.sum(-1).clamp(min=1)


def ppo_token_terms(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token terms of ``ppo_policy_loss`` (B, T), before aggregation: the clipped
    surrogate loss, whether the clipped term was the larger one, whether the dual clip capped
    it, and log(ratio); all 0 / False outside ``mask``. (The captured trainer sums them per
    row: roll/multi_agent/captured.py.)"""
    if not 0.0 < clip_low < 1.0:
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low!r}")
    if not clip_high > 0.0:
        raise ValueError(f"clip_high must be > 0, got {clip_high!r}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None), got {dual_clip!r}")
    keep = mask.bool()
    advantages = _masked(advantages.detach(), keep)
    log_ratio = _masked(logprobs - old_logprobs.detach(), keep)  # (B, T), 0 off the response
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    is_clipped = clipped > unclipped
    per_token = torch.where(is_clipped, clipped, unclipped)  # (B, T)
    is_dual_clipped = torch.zeros_like(keep)
    if dual_clip is not None:
        cap = -dual_clip * advantages
        is_dual_clipped = (advantages < 0) & (per_token > cap)
        per_token = torch.where(is_dual_clipped, cap, per_token)
    return per_token, is_clipped & keep, is_dual_clipped, log_ratio


def approx_kl_terms(log_ratio: Tensor) -> Tensor:
    """Per token, the k3 estimate of KL(old || new) from ``log_ratio`` = log(new / old):
    (r - 1) - log r with r = exp(log_ratio); >= 0, 0 where the policy has not moved. The
    ``approx_kl`` metric of every PPO path (eager, compiled, captured) is its masked mean."""
    return (torch.exp(log_ratio) - 1.0) - log_ratio


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: AggMode = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate loss (Schulman et al. 2017, eq. 7), optional dual clip.

    Per token, with ratio = exp(logprobs - old_logprobs):
        loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
    Separate ``clip_low``/``clip_high`` give asymmetric ("clip-higher", DAPO) clipping. Dual
    clip (Ye et al. 2020, c = ``dual_clip`` > 1): for A < 0 the loss is capped at -c * A, so a
    huge ratio on a bad token cannot blow the loss up.

    Args:
        logprobs, old_logprobs, advantages, mask: (B, T); ``old_logprobs`` and ``advantages``
            are treated as constants.

    Returns:
        (scalar loss aggregated with ``agg``/``normalizer``, metrics) where metrics are detached
        0-dim tensors over masked tokens: ``clip_frac`` (share of tokens where the clipped term
        is the larger loss), ``dual_clip_frac`` (share capped by the dual clip),
        ``approx_kl`` (k3 estimate of KL(old || new): mean of (ratio - 1) - log ratio),
        ``ratio_mean``.
    """
    per_token, is_clipped, is_dual_clipped, log_ratio = ppo_token_terms(
        logprobs, old_logprobs, advantages, mask, clip_low=clip_low, clip_high=clip_high,
        dual_clip=dual_clip)
    keep = mask.bool()
    ratio = torch.exp(log_ratio)
    loss = aggregate(per_token, keep, agg, normalizer)
    with torch.no_grad():
        metrics = {
            "clip_frac": aggregate(is_clipped.to(ratio.dtype), keep),
            "dual_clip_frac": aggregate(is_dual_clipped.to(ratio.dtype), keep),
            "approx_kl": aggregate(approx_kl_terms(log_ratio), keep),
            "ratio_mean": aggregate(ratio, keep),
        }
    return loss, {name: value.detach() for name, value in metrics.items()}


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip: float | None = 0.2,
    agg: AggMode = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped value loss of a critic (PPO's value clipping, as in OpenAI baselines' ppo2).

    Per token, with V the critic's new value, V_old its value when the rows were scored and R
    the return target (e.g. GAE's A + V_old):
        V_clip = V_old + clip(V - V_old, -clip, +clip)
        loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)
    so one update cannot move a value more than ``clip`` away from V_old to gain on the loss;
    ``clip=None`` gives 0.5 (V - R)^2. ``old_values`` and ``returns`` are constants.

    Returns:
        (scalar loss aggregated with ``agg``/``normalizer``, metrics) with detached 0-dim
        tensors over the masked tokens: ``value_clip_frac`` (share where the clipped term is the
        larger loss), ``value_error`` (mean (V - R)^2), ``value_mean``.
    """
    if clip is not None and not clip > 0.0:
        raise ValueError(f"value clip must be > 0 (or None), got {clip!r}")
    keep = mask.bool()
    returns = _masked(returns.detach(), keep)
    old_values = _masked(old_values.detach(), keep)
    values = _masked(values, keep)  # (B, T)
    unclipped = (values - returns).square()
    if clip is None:
        per_token, is_clipped = 0.5 * unclipped, torch.zeros_like(keep)
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns).square()
        is_clipped = clipped > unclipped
        per_token = 0.5 * torch.maximum(unclipped, clipped)
    loss = aggregate(per_token, keep, agg, normalizer)
    with torch.no_grad():
        metrics = {
            "value_clip_frac": aggregate(is_clipped.to(values.dtype), keep),
            "value_error": aggregate(unclipped, keep),
            "value_mean": aggregate(values, keep),
        }
    return loss, {name: value.detach() for name, value in metrics.items()}


def kl_per_token(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, kind: KlKind = "k3"
) -> Tensor:
    """Per-token estimate (B, T) of KL(policy || reference), zero outside ``mask``.

    Samples come from the policy; with log r = ref_logprobs - logprobs (Schulman, "Approximating
    KL divergence", 2020): ``"k1"`` = -log r = logprobs - ref_logprobs (unbiased, can be < 0);
    ``"k2"`` = 0.5 (log r)^2 (biased, >= 0; as a loss its gradient is the KL's own gradient in
    expectation); ``"k3"`` = (r - 1) - log r (unbiased, >= 0, lower variance; GRPO's KL term),
    with log r clamped to [-20, 20] and the value to <= 10 (``K3_*_BOUND``).
    As a LOSS, k1 is useless: its gradient is grad log pi, whose expectation under the policy's
    samples is 0 (the trainer config refuses it); it is meant for reward penalties.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"KL estimator must be one of {KL_KINDS}, got {kind!r}")
    log_ref_ratio = _masked(ref_logprobs - logprobs, mask)  # (B, T)
    if kind == "k1":
        return -log_ref_ratio
    if kind == "k2":
        return 0.5 * log_ref_ratio.square()
    # k3 grows like exp(log r): a token the policy has all but ruled out (log-prob -95, which
    # constrained decoding can force) against a reference at -1 would give exp(94), an inf loss
    # and gradient. Bounded as verl bounds it: log r to [-K3_LOG_RATIO_BOUND, +bound], then the
    # value to at most K3_BOUND (no gradient beyond either bound).
    log_ref_ratio = log_ref_ratio.clamp(-K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
    value = (torch.exp(log_ref_ratio) - 1.0 - log_ref_ratio).clamp(max=K3_BOUND)
    return _masked(value, mask)


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    beta: float,
    kind: KlKind = "k3",
    agg: AggMode = "token-mean",
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """KL-to-reference loss term: beta * aggregate(kl_per_token). Gradient flows to logprobs."""
    per_token = kl_per_token(logprobs, ref_logprobs.detach(), mask, kind)  # (B, T)
    return beta * aggregate(per_token, mask, agg, normalizer)


def kl_penalized_rewards(
    rewards: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    beta: float,
    kind: KlKind = "k1",
) -> tuple[Tensor, Tensor]:
    """KL as a reward penalty (Ziegler et al. 2019; InstructGPT), per turn.

    reward'_i = reward_i - beta * sum_t kl_t over row i's response tokens.

    Args:
        rewards: (B,) turn rewards. logprobs, ref_logprobs, mask: (B, T).

    Returns:
        (penalised rewards (B,), summed KL per row (B,)), both detached (rewards carry no
        gradient).
    """
    with torch.no_grad():
        row_kl = kl_per_token(logprobs, ref_logprobs, mask, kind).sum(dim=1)  # (B,)
        return rewards - beta * row_kl.to(rewards.dtype), row_kl


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (...) in nats of the categorical distributions given by logits (..., V).

    H = -sum_v p_v log p_v, computed in float32. Logits of -inf (masked vocabulary entries) are
    allowed and add 0.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    probs = logp.exp()
    # p log p -> 0 at p = 0; zero logp there first so backward never sees 0 * -inf.
    logp = torch.where(probs > 0, logp, torch.zeros((), dtype=logp.dtype, device=logp.device))
    return -(probs * logp).sum(dim=-1)


def entropy_loss(
    logits: Tensor,
    mask: Tensor,
    coef: float,
    agg: AggMode = "token-mean",
    normalizer: float | Tensor | None = None,
) -> Tensor:
    """Entropy bonus as a loss term: -coef * aggregate(entropy) over the masked tokens.

    ``logits`` (B, T, V) must already be shifted to the batch convention: ``logits[:, t]`` is the
    distribution token ``t`` was drawn from. Entropy is only computed at masked positions.
    """
    keep = mask.bool()
    entropy = torch.zeros(keep.shape, dtype=torch.float32, device=logits.device)  # (B, T)
    entropy = entropy.index_put((keep,), entropy_from_logits(logits[keep]))
    return -coef * aggregate(entropy, keep, agg, normalizer)
