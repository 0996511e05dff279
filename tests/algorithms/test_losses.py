"""Losses against numbers worked out by hand; padding after EOS must never count."""

from __future__ import annotations

import math

import pytest
import torch

from roll.algorithms import (
    aggregate,
    entropy_from_logits,
    entropy_loss,
    kl_loss,
    kl_penalized_rewards,
    kl_per_token,
    ppo_policy_loss,
    value_loss,
)
from roll.algorithms.losses import approx_kl_terms

NAN, INF = float("nan"), float("inf")
LN2 = math.log(2.0)


# --- aggregation --------------------------------------------------------------------------------

# Row 0: tokens 1, 2, 3 then padding; row 1: token 4 then padding; row 2: no token at all.
# Padding holds inf/NaN: a mask multiply (inf * 0 = NaN) would leak it, so would a plain mean.
AGG_VALUES = torch.tensor([[1.0, 2.0, 3.0, INF], [4.0, NAN, -INF, 9.0], [NAN, 5.0, 6.0, 7.0]])
AGG_MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-mean", 3.0),  # (mean(1,2,3)=2 + mean(4)=4) / 2 rows with tokens
        ("seq-mean-token-sum", 5.0),  # (sum 6 + sum 4) / 2 rows with tokens
    ],
)
def test_aggregate_modes_ignore_padding_and_empty_rows(mode, expected):
    assert aggregate(AGG_VALUES, AGG_MASK, mode).item() == pytest.approx(expected)


def test_aggregate_explicit_normalizer_for_gradient_accumulation():
    # The mini-batch (rows 0, 1) has 4 tokens. Micro-batch row 0: 6 / 4 = 1.5; micro-batch
    # row 1: 4 / 4 = 1.0; together 2.5 = the mini-batch token-mean (own counts would give 2 + 4).
    first = aggregate(AGG_VALUES[:1], AGG_MASK[:1], "token-mean", normalizer=4)
    second = aggregate(AGG_VALUES[1:2], AGG_MASK[1:2], "token-mean", normalizer=4)
    assert first.item() == pytest.approx(1.5)
    assert second.item() == pytest.approx(1.0)
    # seq modes divide by rows instead: row 0 mean 2, over a mini-batch of 2 rows -> 1.0.
    row_norm = aggregate(AGG_VALUES[:1], AGG_MASK[:1], "seq-mean-token-mean", normalizer=2)
    assert row_norm.item() == pytest.approx(1.0)


def test_aggregate_no_tokens_is_zero_and_bad_arguments_are_refused():
    assert aggregate(AGG_VALUES[2:], AGG_MASK[2:], "token-mean").item() == 0.0
    assert aggregate(AGG_VALUES[2:], AGG_MASK[2:], "seq-mean-token-mean").item() == 0.0
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(AGG_VALUES, AGG_MASK, "mean")
    with pytest.raises(ValueError, match="normalizer must be > 0, got 0"):
        aggregate(AGG_VALUES, AGG_MASK, normalizer=0)


# --- PPO ----------------------------------------------------------------------------------------


def ppo_inputs(ratios: list[list[float]], advantages: list[list[float]], mask: list[list[int]]):
    """logprobs = old + log(ratio); old = -1. Padding: logprob 1000 (exp overflows), A = NaN."""
    mask_t = torch.tensor(mask)
    old = torch.full(mask_t.shape, -1.0)
    log_ratio = torch.tensor(ratios).log()
    logprobs = torch.where(mask_t.bool(), old + log_ratio, torch.tensor(1000.0))
    adv = torch.where(mask_t.bool(), torch.tensor(advantages), torch.tensor(NAN))
    return logprobs.requires_grad_(), old, adv, mask_t


# Row 0: prompt, tok1 (r=1.5, A=1), tok2 (r=0.5, A=-1), tok4 (r=1, A=-0.5).
# Row 1: prompt, tok3 (r=1.1, A=2), padding, padding.
PPO_RATIOS = [[1.0, 1.5, 0.5, 1.0], [1.0, 1.1, 1.0, 1.0]]
PPO_ADVANTAGES = [[0.0, 1.0, -1.0, -0.5], [0.0, 2.0, 0.0, 0.0]]
PPO_MASK = [[0, 1, 1, 1], [0, 1, 0, 0]]


def test_approx_kl_terms_by_hand():
    # (r - 1) - ln r at r = 1.5, 0.5, 1 (the numbers of the test below): 0.5 - 0.4054651,
    # -0.5 + 0.6931472, 0
    log_ratio = torch.log(torch.tensor([1.5, 0.5, 1.0]))
    torch.testing.assert_close(approx_kl_terms(log_ratio),
                               torch.tensor([0.0945349, 0.1931472, 0.0]), atol=1e-6, rtol=0)


def test_ppo_clipped_loss_metrics_and_gradients():
    # clip 0.2 on both sides; per-token loss = max(-A r, -A clip(r, 0.8, 1.2)):
    #   tok1: max(-1.5, -1.2) = -1.2  (clipped)
    #   tok2: max( 0.5,  0.8) =  0.8  (clipped)
    #   tok4: max( 0.5,  0.5) =  0.5
    #   tok3: max(-2.2, -2.2) = -2.2
    # token-mean = (-1.2 + 0.8 + 0.5 - 2.2) / 4 = -2.1 / 4 = -0.525
    # clip_frac = 2/4 = 0.5; ratio_mean = (1.5 + 0.5 + 1 + 1.1) / 4 = 1.025
    # approx_kl = mean((r - 1) - ln r):
    #   tok1 0.5 - 0.4054651 = 0.0945349; tok2 -0.5 + 0.6931472 = 0.1931472;
    #   tok4 0; tok3 0.1 - 0.0953102 = 0.0046898 -> 0.2923719 / 4 = 0.0730930
    logprobs, old, adv, mask = ppo_inputs(PPO_RATIOS, PPO_ADVANTAGES, PPO_MASK)
    loss, metrics = ppo_policy_loss(logprobs, old, adv, mask)
    assert loss.item() == pytest.approx(-0.525, abs=1e-6)
    assert metrics["clip_frac"].item() == pytest.approx(0.5)
    assert metrics["dual_clip_frac"].item() == 0.0
    assert metrics["ratio_mean"].item() == pytest.approx(1.025, abs=1e-6)
    assert metrics["approx_kl"].item() == pytest.approx(0.0730930, abs=1e-6)
    assert not any(value.requires_grad for value in metrics.values())
    # d loss / d logprob = -A r / 4 on unclipped tokens, 0 on clipped ones and off the response:
    #   tok4: 0.5 * 1 / 4 = 0.125; tok3: -2 * 1.1 / 4 = -0.55.
    loss.backward()
    expected_grad = torch.tensor([[0.0, 0.0, 0.0, 0.125], [0.0, -0.55, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected_grad)


def test_ppo_seq_mean_token_mean():
    # Row 0: (-1.2 + 0.8 + 0.5) / 3 = 0.0333333; row 1: -2.2; mean = -2.1666667 / 2 = -1.0833333
    logprobs, old, adv, mask = ppo_inputs(PPO_RATIOS, PPO_ADVANTAGES, PPO_MASK)
    loss, _ = ppo_policy_loss(logprobs, old, adv, mask, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-1.0833333, abs=1e-6)


def test_ppo_padding_after_eos_does_not_count():
    # Same response tokens, wildly different padding (and a longer T): identical loss.
    logprobs, old, adv, mask = ppo_inputs(PPO_RATIOS, PPO_ADVANTAGES, PPO_MASK)
    base, _ = ppo_policy_loss(logprobs, old, adv, mask)
    pad = torch.tensor([[-3.0, 7.0], [50.0, -50.0]])
    widened = [torch.cat([t.detach(), pad], dim=1) for t in (logprobs, old, adv)]
    wide_mask = torch.cat([mask, torch.zeros(2, 2, dtype=mask.dtype)], dim=1)
    wide, wide_metrics = ppo_policy_loss(*widened, wide_mask)
    assert wide.item() == pytest.approx(base.item(), abs=1e-7)
    assert wide_metrics["clip_frac"].item() == pytest.approx(0.5)


def test_ppo_asymmetric_clip_bounds_act_independently():
    # tok a: r = 1.25, A = +1 -> only the upper bound can bind: loss max(-1.25, -A clip(r));
    # tok b: r = 0.75, A = -2 -> only the lower bound can bind: loss max(1.5, 2 clip(r)).
    #   low 0.3, high 0.28: a clip 1.25 -> -1.25;          b clip 0.75 -> 1.5
    #       -> mean 0.125, clip_frac 0
    #   low 0.1, high 0.3:  a -1.25;                        b clip 0.9 -> max(1.5, 1.8) = 1.8
    #       -> mean 0.275, clip_frac 0.5
    #   low 0.3, high 0.1:  a clip 1.1 -> max(-1.25, -1.1) = -1.1;   b 1.5
    #       -> mean 0.2, clip_frac 0.5
    #   low 0.2, high 0.2:  a -1.2; b clip 0.8 -> 1.6 -> mean 0.2, clip_frac 1.0
    logprobs, old, adv, mask = ppo_inputs([[1.25, 0.75]], [[1.0, -2.0]], [[1, 1]])
    for clip_low, clip_high, expected_loss, expected_frac in [
        (0.3, 0.28, 0.125, 0.0),
        (0.1, 0.3, 0.275, 0.5),
        (0.3, 0.1, 0.2, 0.5),
        (0.2, 0.2, 0.2, 1.0),
    ]:
        loss, metrics = ppo_policy_loss(
            logprobs, old, adv, mask, clip_low=clip_low, clip_high=clip_high
        )
        assert loss.item() == pytest.approx(expected_loss, abs=1e-6), (clip_low, clip_high)
        assert metrics["clip_frac"].item() == pytest.approx(expected_frac), (clip_low, clip_high)


def test_ppo_dual_clip_caps_negative_advantages_only():
    # c = 3. tok a: r = 5, A = -1: max(5, 1.2) = 5, capped at -cA = 3 -> 3 (dual-clipped);
    # tok b: r = 2, A = -1: max(2, 1.2) = 2 < 3 -> 2; tok c: r = 5, A = +1: max(-5, -1.2) = -1.2
    # (a cap of -cA = -3 must NOT apply to A > 0). Mean = (3 + 2 - 1.2) / 3 = 1.2666667.
    # Without dual clip: (5 + 2 - 1.2) / 3 = 1.9333333.
    # clip_frac: only tok c's clipped term is larger -> 1/3; dual_clip_frac 1/3.
    logprobs, old, adv, mask = ppo_inputs([[5.0, 2.0, 5.0]], [[-1.0, -1.0, 1.0]], [[1, 1, 1]])
    loss, metrics = ppo_policy_loss(logprobs, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.8 / 3, abs=1e-5)
    assert metrics["dual_clip_frac"].item() == pytest.approx(1 / 3)
    assert metrics["clip_frac"].item() == pytest.approx(1 / 3)
    plain, _ = ppo_policy_loss(logprobs, old, adv, mask)
    assert plain.item() == pytest.approx(5.8 / 3, abs=1e-5)
    # The capped token is a constant: no gradient. tok b: -A r / 3 = 2/3; tok c clipped: 0.
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 2.0 / 3.0, 0.0]]))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"clip_low": 1.0}, "clip_low"),
        ({"clip_high": 0.0}, "clip_high"),
        ({"dual_clip": 1.0}, "dual_clip"),
    ],
)
def test_ppo_refuses_bad_clip_settings(kwargs, field):
    logprobs, old, adv, mask = ppo_inputs([[1.0]], [[1.0]], [[1]])
    with pytest.raises(ValueError, match=field):
        ppo_policy_loss(logprobs, old, adv, mask, **kwargs)


# --- KL -----------------------------------------------------------------------------------------

# Row 0: tok a (p = 0.5, p_ref = 0.25), tok a again, padding (ref -1000: exp would overflow).
# Row 1: tok b (p = 0.2, p_ref = 0.4), tok c (p = p_ref = 0.3), padding.
KL_LOGP = torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.3, 0.9]]).log()
KL_REF = torch.tensor([[0.25, 0.25, 0.0], [0.4, 0.3, 0.0]]).log().clamp(min=-1000.0)
KL_MASK = torch.tensor([[1, 1, 0], [1, 1, 0]])


def test_kl_k1_k2_and_k3_per_token():
    # k1 = ln p - ln p_ref: a ln 2 = 0.6931472; b ln 0.5 = -0.6931472; c 0.
    # k2 = 0.5 (ln r)^2: a, b 0.5 * 0.4804530 = 0.2402265; c 0.
    # k3 = (r - 1) - ln r with r = p_ref / p:
    #   a: r = 0.5 -> -0.5 + 0.6931472 = 0.1931472
    #   b: r = 2   ->  1   - 0.6931472 = 0.3068528
    #   c: r = 1   ->  0
    k1 = kl_per_token(KL_LOGP, KL_REF, KL_MASK, "k1")
    k2 = kl_per_token(KL_LOGP, KL_REF, KL_MASK, "k2")
    k3 = kl_per_token(KL_LOGP, KL_REF, KL_MASK, "k3")
    torch.testing.assert_close(k1, torch.tensor([[LN2, LN2, 0.0], [-LN2, 0.0, 0.0]]))
    torch.testing.assert_close(
        k2, torch.tensor([[0.2402265, 0.2402265, 0.0], [0.2402265, 0.0, 0.0]])
    )
    torch.testing.assert_close(
        k3, torch.tensor([[LN2 - 0.5, LN2 - 0.5, 0.0], [1.0 - LN2, 0.0, 0.0]])
    )
    with pytest.raises(ValueError, match="'k1', 'k2', 'k3'"):
        kl_per_token(KL_LOGP, KL_REF, KL_MASK, "k4")


def test_kl_loss_term():
    # k3 token-mean over 4 tokens: (2 * 0.1931472 + 0.3068528 + 0) / 4 = 0.6931472 / 4
    #   = 0.1732868; times beta 0.1 = 0.01732868.
    # k3 seq-mean-token-sum: row sums 0.3862944 and 0.3068528 -> mean 0.3465736 -> 0.03465736.
    logprobs = KL_LOGP.clone().requires_grad_()
    loss = kl_loss(logprobs, KL_REF, KL_MASK, beta=0.1, kind="k3")
    assert loss.item() == pytest.approx(0.01732868, abs=1e-7)
    summed = kl_loss(logprobs, KL_REF, KL_MASK, beta=0.1, kind="k3", agg="seq-mean-token-sum")
    assert summed.item() == pytest.approx(0.03465736, abs=1e-7)
    # d k3 / d logp = 1 - r: a: 0.5, b: -1, c: 0; times beta / 4 tokens = 0.0125, -0.025, 0.
    loss.backward()
    expected = torch.tensor([[0.0125, 0.0125, 0.0], [-0.025, 0.0, 0.0]])
    torch.testing.assert_close(logprobs.grad, expected)


def test_kl_reward_penalty_per_row():
    # beta 0.1. k1 row sums: row 0 2 ln2 = 1.3862944, row 1 -ln2 = -0.6931472.
    #   rewards (1.0, 0.5) -> (1 - 0.1386294, 0.5 + 0.0693147) = (0.8613706, 0.5693147)
    # k3 row sums: row 0 0.3862944, row 1 0.3068528 -> (0.9613706, 0.4693147)
    rewards = torch.tensor([1.0, 0.5])
    penalised, row_kl = kl_penalized_rewards(rewards, KL_LOGP, KL_REF, KL_MASK, beta=0.1)
    torch.testing.assert_close(row_kl, torch.tensor([2 * LN2, -LN2]))
    torch.testing.assert_close(penalised, torch.tensor([0.8613706, 0.5693147]))
    penalised, _ = kl_penalized_rewards(rewards, KL_LOGP, KL_REF, KL_MASK, beta=0.1, kind="k3")
    torch.testing.assert_close(penalised, torch.tensor([0.9613706, 0.4693147]))


# --- entropy ------------------------------------------------------------------------------------

UNIFORM4 = [0.0, 0.0, 0.0, 0.0]  # H = ln 4 = 1.3862944
HALF_QUARTERS = [math.log(0.5), math.log(0.25), math.log(0.25), -INF]  # H = 1.5 ln 2 = 1.0397208
ONE_HOT = [0.0, -INF, -INF, -INF]  # H = 0


def test_entropy_from_logits():
    logits = torch.tensor([UNIFORM4, HALF_QUARTERS, ONE_HOT], requires_grad=True)
    entropy = entropy_from_logits(logits)
    torch.testing.assert_close(entropy, torch.tensor([2 * LN2, 1.5 * LN2, 0.0]))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_entropy_loss_ignores_prompt_and_padding():
    # Row 0: prompt, uniform (1.3862944), half-quarters (1.0397208), padding (NaN logits).
    # Row 1: prompt, one-hot (0), padding, padding.
    # token-mean = (1.3862944 + 1.0397208 + 0) / 3 = 0.8086717 -> loss -0.01 * that.
    # seq-mean-token-mean = ((1.3862944 + 1.0397208)/2 + 0) / 2 = 0.6065038.
    garbage = [NAN, 3.0, -INF, 1.0]
    logits = torch.tensor(
        [[garbage, UNIFORM4, HALF_QUARTERS, garbage], [garbage, ONE_HOT, garbage, garbage]],
        requires_grad=True,
    )
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
    loss = entropy_loss(logits, mask, coef=0.01)
    assert loss.item() == pytest.approx(-0.008086717, abs=1e-8)
    seq = entropy_loss(logits, mask, coef=0.01, agg="seq-mean-token-mean")
    assert seq.item() == pytest.approx(-0.006065038, abs=1e-8)
    loss.backward()
    assert torch.all(logits.grad[~mask.bool()] == 0)
    assert torch.isfinite(logits.grad).all()


# --- value loss ---------------------------------------------------------------------------------


def test_clipped_value_loss_by_hand():
    """V, V_old, R per token (clip 0.2), the last position padding (NaN everywhere):
    t1 V 1.1, V_old 0.8 -> V_clip 1.0; (1.1-2)^2 = 0.81 < (1.0-2)^2 = 1.00: clipped, 0.5.
    t2 V 0.5, V_old 0.8 -> V_clip 0.6; (0.5-0)^2 = 0.25 < 0.6^2 = 0.36: clipped, 0.18.
    t3 V 3.0, V_old 2.0 -> V_clip 2.2; (3-1)^2 = 4 > 1.2^2 = 1.44: unclipped, 2.0.
    t4 V = V_old = 2.0, R 2.5: both 0.25, 0.125.
    token-mean (0.5 + 0.18 + 2.0 + 0.125) / 4 = 0.70125; a clipped term does not depend on V
    (the clamp saturates), so dL/dV = [0, 0, 0.5 * 2 * (3 - 1), 2.0 - 2.5] / 4."""
    values = torch.tensor([[1.1, 0.5, 3.0, 2.0, NAN]], requires_grad=True)
    old_values = torch.tensor([[0.8, 0.8, 2.0, 2.0, NAN]])
    returns = torch.tensor([[2.0, 0.0, 1.0, 2.5, INF]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, metrics = value_loss(values, old_values, returns, mask, clip=0.2)
    assert loss.item() == pytest.approx(0.70125)
    loss.backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.0, 0.5, -0.125, 0.0]]))
    assert metrics["value_clip_frac"].item() == pytest.approx(0.5)
    assert metrics["value_error"].item() == pytest.approx((0.81 + 0.25 + 4 + 0.25) / 4)
    assert metrics["value_mean"].item() == pytest.approx((1.1 + 0.5 + 3 + 2) / 4)
    unclipped, _ = value_loss(values, old_values, returns, mask, clip=None)
    assert unclipped.item() == pytest.approx(0.5 * (0.81 + 0.25 + 4 + 0.25) / 4)
    with pytest.raises(ValueError, match="value clip must be > 0"):
        value_loss(values, old_values, returns, mask, clip=0.0)


def test_k3_is_bounded_where_a_forced_token_would_make_it_infinite():
    """log-prob -95 against a reference at -1 (constrained decoding can force such a token):
    unclamped, k3 = exp(94) - 1 - 94 = inf in float32. Clamped: log r to 20, the value to 10."""
    mask = torch.ones(1, 3)
    logprobs = torch.tensor([[-95.0, -1.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -3.0, -1.0]])
    k3 = kl_per_token(logprobs, ref, mask, "k3")
    # Inside the bounds the value is unchanged: log r = -2: e^-2 + 1 = 1.1353; log r = 2:
    # e^2 - 3 = 4.3891.
    assert k3[0].tolist() == pytest.approx([10.0, math.exp(-2.0) + 1.0, math.exp(2.0) - 3.0],
                                           rel=1e-5)
    kl_loss(logprobs, ref, mask, beta=1.0, kind="k3", agg="token-mean").backward()
    grad = logprobs.grad[0]
    assert torch.isfinite(grad).all()
    assert grad[0] == 0.0  # beyond the bound the term no longer pulls
    # d k3 / d logprob = 1 - r, r = exp(ref - logprob), over 3 tokens (token-mean).
    assert grad[1:].tolist() == pytest.approx([(1 - math.exp(-2.0)) / 3, (1 - math.exp(2.0)) / 3],
                                              rel=1e-5)
    # Around the value bound (10): log r = 2.5 and 2.6 inside, 2.7 beyond.
    at = kl_per_token(torch.tensor([[0.0]]), torch.tensor([[2.5]]), torch.ones(1, 1), "k3")
    assert at.item() == pytest.approx(min(10.0, math.exp(2.5) - 1 - 2.5))  # 8.6825, inside
    over = kl_per_token(torch.tensor([[0.0]]), torch.tensor([[2.6]]), torch.ones(1, 1), "k3")
    assert over.item() == pytest.approx(min(10.0, math.exp(2.6) - 1 - 2.6))  # 9.8637, inside
    beyond = kl_per_token(torch.tensor([[0.0]]), torch.tensor([[2.7]]), torch.ones(1, 1), "k3")
    assert beyond.item() == 10.0  # exp(2.7) - 3.7 = 11.18 > 10
