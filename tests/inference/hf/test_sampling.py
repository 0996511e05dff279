"""The hashed Gumbel noise: finite everywhere, so masked logits stay masked, and the draws follow
the distribution they should."""

from __future__ import annotations

import torch

from roll.inference.hf.sampling import bits_to_uniform, gumbel_noise, mix32


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
        return sampler.select(logits.expand(rows, 5).clone(), step=3)

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
