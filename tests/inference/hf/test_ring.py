"""The ring's decode attention against attention written out head by head."""

from __future__ import annotations

import math

import torch

from roll.inference.hf.ring import additive_mask, aligned_columns, ring_decode_attention


def _by_hand(query, key, value, allowed, scale):
    """Query head h reads kv head h // (Hq / Hkv); softmax over the allowed columns only."""
    batch, query_heads, _, head_dim = query.shape
    group = query_heads // key.shape[1]
    out = torch.zeros(batch, 1, query_heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(query_heads):
            columns = [c for c in range(key.shape[2]) if allowed[b, c]]
            scores = [scale * sum(query[b, h, 0, d].item() * key[b, h // group, c, d].item()
                                  for d in range(head_dim)) for c in columns]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for d in range(head_dim):
                out[b, 0, h, d] = sum(w / total * value[b, h // group, c, d].item()
                                      for w, c in zip(weights, columns, strict=True))
    return out


def test_grouped_query_ring_attention_equals_the_hand_computed_one():
    """4 query heads over 2 kv heads, 2 lanes, 5 ring columns (lane 1 may see 3 of them)."""
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 4, 1, 3, generator=gen, dtype=torch.float64)
    key = torch.randn(2, 2, 5, 3, generator=gen, dtype=torch.float64)
    value = torch.randn(2, 2, 5, 3, generator=gen, dtype=torch.float64)
    allowed = torch.tensor([[True] * 5, [True, False, True, False, True]])
    mask = additive_mask(allowed[:, None, None, :], torch.float64)  # (B, 1, 1, C)
    out, weights = ring_decode_attention(None, query, key, value, mask, scaling=0.7)
    assert weights is None and out.shape == (2, 1, 4, 3)
    torch.testing.assert_close(out, _by_hand(query, key, value, allowed, 0.7),
                               rtol=1e-9, atol=1e-9)
    # a masked column's keys and values do not matter
    key[1, :, 1], value[1, :, 3] = 100.0, -100.0
    again, _ = ring_decode_attention(None, query, key, value, mask, scaling=0.7)
    torch.testing.assert_close(again[1], out[1], rtol=1e-9, atol=1e-9)
    # the default scale is head_dim ** -0.5
    default, _ = ring_decode_attention(None, query, key, value, mask)
    torch.testing.assert_close(default, _by_hand(query, key, value, allowed, 3 ** -0.5),
                               rtol=1e-9, atol=1e-9)


def test_ring_columns_are_aligned_to_16():
    assert [aligned_columns(n) for n in (1, 16, 17, 40, 48)] == [16, 16, 32, 48, 48]
