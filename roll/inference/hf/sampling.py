"""Choosing the next token of every row of a mixed batch, each row with its own settings.

Sampling is Gumbel-max: ``argmax(z / T + g)`` with ``g = -log(-log(u))`` draws from
``softmax(z / T)``. The uniforms ``u`` are not taken from a shared torch generator but hashed
from (row seed, step, token id), so a row's tokens depend on its own seed only — not on the batch
it shares, the batch's order, the device's RNG state or the number of rows — and greedy rows
cost nothing extra.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from roll.inference.base import SamplingParams

_MASK32 = 0xFFFFFFFF
# Odd multipliers below 2**31, so that a 32-bit value times one fits in int64 without overflow.
_MUL1, _MUL2 = 0x7FEB352D, 0x6A09E667
_STEP_SALT, _VOCAB_SALT = 0x3C6EF372, 0x1F83D9AB


def mix32(x):
    """A 32-bit integer hash (xor-shift-multiply); works on Python ints and int64 tensors."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 16)


def seed_key(seed: int) -> int:
    """A request seed (any int >= 0) → the 32-bit key of its noise stream."""
    return mix32(mix32(seed & _MASK32) ^ mix32((seed >> 32) + _STEP_SALT))


def gumbel_noise(row_keys: Tensor, step: int, vocab_keys: Tensor) -> Tensor:
    """Gumbel(0, 1) noise (N, V) from row keys (N,), the step and per-token keys (V,)."""
    step_keys = mix32(row_keys ^ mix32(step + _STEP_SALT))  # (N,)
    bits = mix32(step_keys[:, None] ^ vocab_keys[None, :])  # (N, V) in [0, 2**32)
    return -torch.log(-torch.log(bits_to_uniform(bits)))


def bits_to_uniform(bits: Tensor) -> Tensor:
    """32-bit integers → float32 uniforms strictly inside (0, 1).

    Keep 23 bits: (k + 0.5) * 2**-23 is exact in float32 for k < 2**23, so the largest value is
    1 - 2**-24 < 1. (With 24 bits, (2**24 - 1) + 0.5 rounds to 2**24 and u == 1 gives infinite
    noise, which turns a masked -inf logit into NaN and lets argmax pick a forbidden token.)
    """
    return ((bits >> 9).to(torch.float32) + 0.5) * 2.0**-23


def filter_top_k_top_p(logits: Tensor, top_k: Tensor, top_p: Tensor) -> Tensor:
    """Set logits outside each row's top-k, then outside its top-p nucleus, to -inf.

    logits (N, V) already divided by temperature; top_k (N,) with 0 = off; top_p (N,) with
    1 = off. The most likely token is always kept.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (N, V)
    ranks = torch.arange(vocab, device=logits.device)  # (V,)
    k = torch.where(top_k > 0, top_k, vocab)  # (N,)
    drop = ranks[None, :] >= k[:, None]  # (N, V)
    probs = torch.softmax(sorted_logits.masked_fill(drop, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # (N, V): probability of better tokens
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


@dataclass
class BatchSampler:
    """Per-row sampling settings of one batch, as tensors on the device."""

    sampled_rows: Tensor
    """(N,) indices of rows with temperature > 0 (the others are greedy)."""
    temperature: Tensor
    """(N,) temperatures of the sampled rows."""
    top_k: Tensor
    """(N,) top-k of the sampled rows (0 = off)."""
    top_p: Tensor
    """(N,) top-p of the sampled rows (1 = off)."""
    row_keys: Tensor
    """(N,) int64 noise keys of the sampled rows."""
    vocab_keys: Tensor
    """(V,) int64 per-token keys."""
    filtered: bool
    """Whether any sampled row uses top-k or top-p (else the sort is skipped)."""

    @classmethod
    def build(
        cls, params: list[SamplingParams], seeds: list[int], vocab_size: int, device
    ) -> BatchSampler:
        rows = [i for i, p in enumerate(params) if not p.greedy]
        picked = [params[i] for i in rows]
        return cls(
            sampled_rows=torch.tensor(rows, dtype=torch.long, device=device),
            temperature=torch.tensor([p.temperature for p in picked], device=device),
            top_k=torch.tensor([p.top_k for p in picked], dtype=torch.long, device=device),
            top_p=torch.tensor([p.top_p for p in picked], device=device),
            row_keys=torch.tensor([seed_key(seeds[i]) for i in rows], dtype=torch.long,
                                  device=device),
            vocab_keys=mix32(torch.arange(vocab_size, device=device) + _VOCAB_SALT),
            filtered=any(p.top_k > 0 or p.top_p < 1.0 for p in picked),
        )

    def select(self, logits: Tensor, step: int) -> Tensor:
        """Next token (B,) of every row from its (masked) logits (B, V) at step ``step``."""
        tokens = logits.argmax(dim=-1)  # (B,) greedy for every row first
        if self.sampled_rows.numel() == 0:
            return tokens
        scaled = logits[self.sampled_rows] / self.temperature[:, None]  # (N, V)
        if self.filtered:
            scaled = filter_top_k_top_p(scaled, self.top_k, self.top_p)
        noisy = scaled + gumbel_noise(self.row_keys, step, self.vocab_keys)
        tokens[self.sampled_rows] = noisy.argmax(dim=-1)
        return tokens
