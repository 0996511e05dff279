"""The hashed Gumbel noise: finite everywhere, so masked logits stay masked."""

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
