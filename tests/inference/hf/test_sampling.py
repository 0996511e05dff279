"""The hashed Gumbel noise: finite everywhere, so masked logits stay masked, and the draws follow
the distribution they should."""

from __future__ import annotations

import pytest
import torch

from roll.inference.hf.sampling import bits_to_uniform, gumbel_noise, mix32

from ..helpers import picker_inputs


def test_uniforms_stay_strictly_inside_zero_one_at_the_extremes():
    bits = torch.tensor([0, 1, 2**9 - 1, 2**31, 2**32 - 2**9, 2**32 - 1], dtype=torch.long)
    uniform = bits_to_uniform(bits)
    assert bool((uniform > 0).all()) and bool((uniform < 1).all())
    assert float(uniform[-1]) == 1 - 2**-24  # (2**23 - 1 + 0.5) / 2**23


def test_gumbel_noise_is_finite_over_many_keys_and_steps():
    rows = mix32(torch.arange(2048, dtype=torch.long) * 7919 + 1)
    vocab = mix32(torch.arange(611, dtype=torch.long) + 12345)
    for step in range(0, 40, 3):
        noise = gumbel_noise(rows, step, vocab)  # (2048, 611): 1.25M draws per step
        assert bool(torch.isfinite(noise).all()), step


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=len(probs)).double()
    expected = probs.double() * len(tokens)
    keep = expected > 0
    assert counts[~keep].sum() == 0  # nothing drawn where the probability is 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_draws_follow_the_tempered_and_filtered_softmax():
    """20,000 rows, each with its own seed, draw one token from the same logits. Against the
    distribution they should follow, Pearson's chi-square stays below the 0.1% critical value
    (18.47 for 4 degrees of freedom; 13.82 for 2); against a wrong one it is far above."""
    from roll.inference.base import SamplingParams
    from roll.inference.hf.sampling import BatchSampler

    logits = torch.log(torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05]))
    rows = 20_000

    def draw(**params) -> torch.Tensor:
        sampler = BatchSampler.build([SamplingParams(**params)] * rows, list(range(rows)), 5,
                                     "cpu")
        return sampler.select(logits.expand(rows, 5).clone(), None)[0]

    p1 = torch.softmax(logits, -1)
    assert _chi_square(draw(temperature=1.0), p1) < 18.47
    p2 = torch.softmax(logits / 2.0, -1)  # temperature 2: flatter
    at_two = draw(temperature=2.0)
    assert _chi_square(at_two, p2) < 18.47
    assert _chi_square(at_two, p1) > 100  # the test can tell temperatures apart
    top3 = torch.tensor([0.4, 0.3, 0.15, 0.0, 0.0]) / 0.85  # top-k 3, renormalised
    assert _chi_square(draw(temperature=1.0, top_k=3), top3) < 13.82
    nucleus = torch.tensor([0.4, 0.3, 0.0, 0.0, 0.0]) / 0.7  # top-p 0.6: 0.4 + 0.3 covers it
    assert _chi_square(draw(temperature=1.0, top_p=0.6), nucleus) < 10.83  # 1 dof, 0.1%


def test_pick_tokens_by_hand():
    """pick_tokens: greedy rows take the argmax of the (masked) logits; every log-prob is the
    picked token's under softmax(logits / T) without the mask (the policy the trainer
    scores)."""
    import math

    from roll.inference.hf.sampling import _VOCAB_SALT, pick_tokens

    logits = torch.tensor([[0.0, math.log(2.0), 0.0], [0.0, math.log(2.0), 0.0]],
                          dtype=torch.bfloat16)  # (2, 3): probabilities 1/4, 1/2, 1/4
    vocab_keys = mix32(torch.arange(3) + _VOCAB_SALT)
    keys, steps = torch.tensor([5, 7]), torch.tensor([0, 3])
    masked = logits.float().clone()
    masked[1, 1] = float("-inf")  # row 1 may not play token 1
    tokens, logprobs = pick_tokens(logits, torch.ones(2, 1), None, keys, steps, vocab_keys,
                                   masked)
    assert tokens.tolist() == [1, 0]  # row 1: the first of the two allowed ties
    assert torch.allclose(logprobs, torch.tensor([math.log(0.5), math.log(0.25)]), atol=1e-3)
    # temperature 2: probabilities proportional to 1, sqrt 2, 1
    _, at_two = pick_tokens(logits, torch.full((2, 1), 2.0), None, keys, steps, vocab_keys)
    assert abs(float(at_two[0]) - math.log(2**0.5 / (2 + 2**0.5))) < 1e-3


@pytest.mark.parametrize("backend", ["aot_eager",
                                     pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_picker_equals_eager(backend):
    """The compiled picker (as the engine compiles it on CUDA, where it picks for calls with
    top-k/top-p: the others go to the blocked picker) gives the same tokens and log-probs as the
    eager function: aot_eager for sampled, masked, filtered and greedy rows; inductor (C++ for
    this CPU, ~7 s a kind of call) for the filtered rows, the kind it serves on CUDA; both at
    two row counts (one dynamic graph)."""
    from roll.inference.hf.sampling import compiled_picker, pick_tokens

    inputs = picker_inputs()
    rows = inputs["logits"].shape[0]
    logits, temperature, sampled, keys, steps, vocab_keys, masked = (
        inputs[key] for key in ("logits", "temperature", "sampled", "keys", "steps",
                                "vocab_keys", "masked"))
    top_k = torch.where(torch.arange(rows) % 2 == 0, 5, 0)
    top_p = torch.full((rows,), 0.9)
    calls = [(logits, temperature, sampled, keys, steps, vocab_keys),
             (logits, temperature, sampled, keys, steps, vocab_keys, masked),
             (logits, temperature, sampled, keys, steps, vocab_keys, None, top_k, top_p),
             (logits, temperature, None, keys, steps, vocab_keys, masked)]
    if backend == "inductor":
        calls = calls[2:3]
    picker = compiled_picker(backend)
    for args in calls:
        want_tokens, want_logprobs = pick_tokens(*args)
        got_tokens, got_logprobs = picker(*args)
        assert torch.equal(got_tokens, want_tokens)
        assert torch.allclose(got_logprobs, want_logprobs, atol=1e-5)
    # a different row count reuses the dynamic graph and still agrees
    few = tuple(arg[:9] if arg is not None and arg.shape[0] == rows else arg
                for arg in calls[-1])
    assert torch.equal(picker(*few)[0], pick_tokens(*few)[0])
    # the sampled rows did draw: not all of them took the argmax
    assert not torch.equal(pick_tokens(*calls[0])[0][sampled],
                           logits.float().argmax(-1)[sampled])
