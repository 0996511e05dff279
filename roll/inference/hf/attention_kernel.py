"""Grouped-query decode attention (Triton) that reads only the key/value blocks a lane may see.

``ring_decode_attention`` (ring.py) hands one fused ``scaled_dot_product_attention`` call the
whole cache: every lane's keys and values over all C columns, the additive mask hiding the
columns it may not see. On an H100 at 256 lanes that call read the whole 256-column cache in
every layer and step (40% of a decode step) while the lanes' mean live context was 192:
benchmarks/README.md, "Where a batch-256 decode step goes". This kernel takes the same inputs
and skips every block of ``BLOCK_N`` columns that the lane's mask hides entirely, so it reads
what is live (rounded up to blocks), wherever the live columns sit (a ring wraps around).

One program per (lane, kv head): the G = Hq / Hkv query heads that share the kv head, an
online softmax over the visible blocks (Milakov & Gimelshein 2018's running max and sum, as
flash attention does), fp32 accumulation. A lane that may see nothing gets zeros (SDPA gives
the mean of all values there; such a lane is idle and its output unused).

A torch custom op (``roll::ring_attention``): an opaque node of a compiled, CUDA-graphed decode
step. On CPU tensors it runs only in a process started with ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

BLOCK_N = 32
"""Columns per block: the unit of skipping (a ring's capacity is a multiple of 16)."""
VISIBLE = -1e30
"""An additive mask value above this is a visible column (hidden ones are the dtype's min)."""


@triton.jit
def _ring_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, columns, scale, groups,
                           head_dim, stride_qb, stride_qh, stride_kb, stride_kh, stride_kc,
                           stride_vb, stride_vh, stride_vc, stride_mb, stride_ob, stride_oh,
                           BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                           VISIBLE: tl.constexpr):
    lane = tl.program_id(0)
    head = tl.program_id(1)  # kv head
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_live, d_live = g < groups, d < head_dim
    q_rows = q_ptr + lane * stride_qb + (head * groups + g)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_rows, mask=g_live[:, None] & d_live[None, :], other=0.0).to(tl.float32)
    q = q * scale  # (G, D)
    best = tl.full((BLOCK_G,), float("-inf"), tl.float32)  # running max of the scores
    total = tl.zeros((BLOCK_G,), tl.float32)  # running sum of exp(score - best)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    k_lane = k_ptr + lane * stride_kb + head * stride_kh
    v_lane = v_ptr + lane * stride_vb + head * stride_vh
    for c0 in range(0, columns, BLOCK_N):
        c = c0 + tl.arange(0, BLOCK_N)
        c_live = c < columns
        bias = tl.load(mask_ptr + lane * stride_mb + c, mask=c_live,
                       other=float("-inf")).to(tl.float32)  # (N,)
        if tl.max(bias, axis=0) > VISIBLE:  # a block the lane sees none of is never read
            seen = c_live & (bias > VISIBLE)
            kv_mask = seen[:, None] & d_live[None, :]
            k = tl.load(k_lane + c[:, None] * stride_kc + d[None, :], mask=kv_mask,
                        other=0.0).to(tl.float32)  # (N, D)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2)  # (G, N)
            scores = tl.where(seen[None, :], scores + bias[None, :], float("-inf"))
            new_best = tl.maximum(best, tl.max(scores, axis=1))
            weights = tl.exp(scores - new_best[:, None])  # (G, N); 0 where hidden
            rescale = tl.exp(best - new_best)
            total = total * rescale + tl.sum(weights, axis=1)
            v = tl.load(v_lane + c[:, None] * stride_vc + d[None, :], mask=kv_mask,
                        other=0.0).to(tl.float32)  # (N, D)
            acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
            best = new_best
    out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a lane that sees nothing: zeros
    out_rows = out_ptr + lane * stride_ob + (head * groups + g)[:, None] * stride_oh + d[None, :]
    tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=g_live[:, None] & d_live[None, :])


@torch.library.custom_op("roll::ring_attention", mutates_args=())
def ring_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor,
                   scale: float) -> Tensor:
    """query (B, Hq, D) one token per lane; key/value (B, Hkv, C, D); mask (B, C) additive
    (0 visible, the dtype's min hidden) → (B, Hq, D) in the query's dtype. Query head h reads
    kv head h // (Hq / Hkv)."""
    if query.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton ring attention runs on CUDA tensors; on CPU only in a "
                           "process started with TRITON_INTERPRET=1 (tests)")
    batch, query_heads, head_dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    for name, t in (("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"ring_attention: {name}'s last dimension must be contiguous")
    query = query if query.stride(-1) == 1 else query.contiguous()
    mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    out = torch.empty(batch, query_heads, head_dim, dtype=query.dtype, device=query.device)
    groups = query_heads // kv_heads
    _ring_attention_kernel[(batch, kv_heads)](
        query, key, value, mask, out, columns, scale, groups, head_dim,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), mask.stride(0), out.stride(0),
        out.stride(1), BLOCK_G=triton.next_power_of_2(groups),
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_N=BLOCK_N, VISIBLE=VISIBLE,
        num_warps=4)
    return out


@ring_attention.register_fake
def _(query, key, value, mask, scale):
    return torch.empty_like(query)
