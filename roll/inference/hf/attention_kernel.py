"""Grouped-query decode attention (Triton) that reads only the key/value columns a lane may see.

``ring_decode_attention`` (ring.py) hands one fused ``scaled_dot_product_attention`` call the
whole cache: every lane's keys and values over all C columns, the additive mask hiding the
columns it may not see. On an H200 at 256 lanes that call read the whole 256-column cache in
every layer and step at 2.25 TB/s (43% of a decode step) while the lanes' mean live context was
192: benchmarks/README.md, "The decode step's kernels". This kernel takes the same inputs and
never loads a hidden column, wherever the live columns sit (a ring wraps around).

One program per (lane, kv head, chunk of columns) runs an online softmax (Milakov & Gimelshein
2018's running max and sum, as flash attention does) over its chunk in blocks of ``block_n``
columns, the G = Hq / Hkv query heads that share the kv head as the rows of one tensor-core
product (padded to 16). fp32 softmax and accumulation; probabilities enter the value product in
the cache's dtype, as flash attention does. With one chunk (the default: on an H200 it was the
fastest at 32-256 lanes, benchmarks/decode_attention.py) the program writes the output; with
several (flash decoding's split-K), each writes its (max, sum, weighted values) and a second
kernel combines a lane's chunks. A lane that may see nothing gets zeros (SDPA gives the mean of
all values there; such a lane is idle and its output unused).

A torch custom op (``roll::ring_attention``): an opaque node of a compiled, CUDA-graphed decode
step. On CPU tensors it runs only in a process started with ``TRITON_INTERPRET=1`` (tests).
``launch`` takes the tile sizes explicitly (benchmarks/decode_attention.py sweeps them).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from roll.inference.hf.pdl import launch_options, pdl_on, pdl_prologue

BLOCK_N = 128
"""Columns per block of the inner loop where shared memory allows (``block_columns``)."""
STAGES = 2
"""Software-pipelined stages of the inner loop's loads."""
VISIBLE = -1e30
"""An additive mask value above this is a visible column (hidden ones are the dtype's min)."""
_SHARED_MEMORY: dict[int, int] = {}


@triton.jit
def _block(q, k_lane, v_lane, c, d, seen, d_live, bias, scale, best, total, acc, stride_kc,
           stride_vc, PRECISION: tl.constexpr):
    """One block of columns into the running softmax state (best, total, acc)."""
    kv_mask = seen[:, None] & d_live[None, :]
    k = tl.load(k_lane + c[:, None] * stride_kc + d[None, :], mask=kv_mask, other=0.0)  # (N, D)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale  # (G, N)
    scores = tl.where(seen[None, :], scores + bias[None, :], float("-inf"))
    new_best = tl.maximum(best, tl.max(scores, axis=1))
    # a row whose every column so far is hidden keeps best = -inf: exp must not see
    # (-inf) - (-inf)
    base = tl.where(new_best == float("-inf"), 0.0, new_best)
    weights = tl.exp(scores - base[:, None])  # (G, N); 0 where hidden
    rescale = tl.exp(best - base)
    total = total * rescale + tl.sum(weights, axis=1)
    v = tl.load(v_lane + c[:, None] * stride_vc + d[None, :], mask=kv_mask, other=0.0)  # (N, D)
    acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
    return new_best, total, acc


@triton.jit
def _chunk_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, part_ptr, stat_ptr, columns, chunk,
                  scale, groups, head_dim, stride_qb, stride_qh, stride_kb, stride_kh,
                  stride_kc, stride_vb, stride_vh, stride_vc, stride_mb, stride_ob, stride_oh,
                  BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  VISIBLE: tl.constexpr, SPLIT: tl.constexpr, SKIP: tl.constexpr,
                  PRECISION: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_prologue(USE_PDL)
    lane = tl.program_id(0)
    head = tl.program_id(1)  # kv head
    part = tl.program_id(2)  # chunk of columns
    heads = tl.num_programs(1)
    parts = tl.num_programs(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_live, d_live = g < groups, d < head_dim
    q_rows = q_ptr + lane * stride_qb + (head * groups + g)[:, None] * stride_qh + d[None, :]
    q = tl.load(q_rows, mask=g_live[:, None] & d_live[None, :], other=0.0)  # (G, D)
    best = tl.full((BLOCK_G,), float("-inf"), tl.float32)  # running max of the scores
    total = tl.zeros((BLOCK_G,), tl.float32)  # running sum of exp(score - best)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    k_lane = k_ptr + lane * stride_kb + head * stride_kh
    v_lane = v_ptr + lane * stride_vb + head * stride_vh
    start = part * chunk
    end = tl.minimum(start + chunk, columns)
    for c0 in range(start, end, BLOCK_N):
        c = c0 + tl.arange(0, BLOCK_N)
        c_live = c < end
        bias = tl.load(mask_ptr + lane * stride_mb + c, mask=c_live,
                       other=float("-inf")).to(tl.float32)  # (N,)
        seen = c_live & (bias > VISIBLE)  # a hidden column is never loaded
        if SKIP:  # a block whose every column is hidden is not even entered
            if tl.max(bias, axis=0) > VISIBLE:
                best, total, acc = _block(q, k_lane, v_lane, c, d, seen, d_live, bias, scale,
                                          best, total, acc, stride_kc, stride_vc, PRECISION)
        else:
            best, total, acc = _block(q, k_lane, v_lane, c, d, seen, d_live, bias, scale, best,
                                      total, acc, stride_kc, stride_vc, PRECISION)
    if SPLIT:  # this chunk's softmax state, for _combine_kernel
        slot = (lane * heads + head) * parts + part
        tl.store(stat_ptr + slot * 2 * BLOCK_G + g, best)
        tl.store(stat_ptr + slot * 2 * BLOCK_G + BLOCK_G + g, total)
        tl.store(part_ptr + slot * BLOCK_G * BLOCK_D + g[:, None] * BLOCK_D + d[None, :], acc)
    else:
        out = acc / tl.where(total > 0, total, 1.0)[:, None]  # a lane that sees nothing: zeros
        out_rows = (out_ptr + lane * stride_ob + (head * groups + g)[:, None] * stride_oh
                    + d[None, :])
        tl.store(out_rows, out.to(out_ptr.dtype.element_ty),
                 mask=g_live[:, None] & d_live[None, :])


@triton.jit
def _combine_kernel(part_ptr, stat_ptr, out_ptr, parts, groups, head_dim, stride_ob, stride_oh,
                    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_prologue(USE_PDL)
    lane = tl.program_id(0)
    head = tl.program_id(1)
    heads = tl.num_programs(1)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    best = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for part in range(0, parts):
        slot = (lane * heads + head) * parts + part
        part_best = tl.load(stat_ptr + slot * 2 * BLOCK_G + g)
        part_total = tl.load(stat_ptr + slot * 2 * BLOCK_G + BLOCK_G + g)
        part_acc = tl.load(part_ptr + slot * BLOCK_G * BLOCK_D + g[:, None] * BLOCK_D
                           + d[None, :])
        new_best = tl.maximum(best, part_best)
        base = tl.where(new_best == float("-inf"), 0.0, new_best)
        old_scale = tl.exp(best - base)  # 0 for a state that has seen nothing (-inf)
        part_scale = tl.exp(part_best - base)
        total = total * old_scale + part_total * part_scale
        acc = acc * old_scale[:, None] + part_acc * part_scale[:, None]
        best = new_best
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    out_rows = out_ptr + lane * stride_ob + (head * groups + g)[:, None] * stride_oh + d[None, :]
    tl.store(out_rows, out.to(out_ptr.dtype.element_ty),
             mask=(g < groups)[:, None] & (d < head_dim)[None, :])


def block_columns(device: torch.device, head_dim: int, itemsize: int) -> int:
    """``BLOCK_N``, halved until a block's keys and values in every pipelined stage take at
    most 3/4 of the device's shared memory (an H100/H200 at head dim 128: 128 columns; an A100
    or a head dim of 256: 64). Without a CUDA device (the interpreter): ``BLOCK_N``."""
    if device.type != "cuda":
        return BLOCK_N
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED_MEMORY:
        from triton.runtime import driver

        _SHARED_MEMORY[index] = driver.active.utils.get_device_properties(index)["max_shared_mem"]
    block_d = max(16, triton.next_power_of_2(head_dim))
    block = BLOCK_N
    while block > 16 and 2 * block * block_d * itemsize * STAGES > 0.75 * _SHARED_MEMORY[index]:
        block //= 2
    return block


def launch(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float, *,
           block_n: int | None = None, chunk: int | None = None, num_warps: int = 4,
           num_stages: int | None = STAGES, skip: bool = False) -> Tensor:
    """``ring_attention`` with its tiles chosen by the caller: ``block_n`` columns per inner
    step (None: ``block_columns``), ``chunk`` columns per program (None: the whole cache, one
    chunk per lane; fewer split it, flash decoding's split-K), ``skip`` a block whose every
    column is hidden without entering it (its loads are masked off either way)."""
    block_n = block_n or block_columns(key.device, key.shape[-1], key.element_size())
    batch, query_heads, head_dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    for name, t in (("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"ring_attention: {name}'s last dimension must be contiguous")
    query = query if query.stride(-1) == 1 else query.contiguous()
    mask = mask if mask.stride(-1) == 1 else mask.contiguous()
    groups = query_heads // kv_heads
    chunk = chunk or columns
    parts = -(-columns // chunk)
    block_g = max(16, triton.next_power_of_2(groups))  # a tensor-core product has >= 16 rows
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty(batch, query_heads, head_dim, dtype=query.dtype, device=query.device)
    split = parts > 1
    part = torch.empty(batch * kv_heads * parts * block_g * block_d if split else 1,
                       dtype=torch.float32, device=query.device)
    stat = torch.empty(batch * kv_heads * parts * 2 * block_g if split else 1,
                       dtype=torch.float32, device=query.device)
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    extra = {} if num_stages is None else {"num_stages": num_stages}
    pdl = pdl_on(query)
    extra |= launch_options(pdl)
    _chunk_kernel[(batch, kv_heads, parts)](
        query, key, value, mask, out, part, stat, columns, chunk, scale, groups, head_dim,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), mask.stride(0), out.stride(0),
        out.stride(1), BLOCK_G=block_g, BLOCK_D=block_d, BLOCK_N=block_n, VISIBLE=VISIBLE,
        SPLIT=split, SKIP=skip, PRECISION=precision, USE_PDL=pdl, num_warps=num_warps, **extra)
    if split:
        _combine_kernel[(batch, kv_heads)](
            part, stat, out, parts, groups, head_dim, out.stride(0), out.stride(1),
            BLOCK_G=block_g, BLOCK_D=block_d, USE_PDL=pdl, num_warps=num_warps,
            **launch_options(pdl))
    return out


@torch.library.custom_op("roll::ring_attention", mutates_args=())
def ring_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor,
                   scale: float) -> Tensor:
    """query (B, Hq, D) one token per lane; key/value (B, Hkv, C, D); mask (B, C) additive
    (0 visible, the dtype's min hidden) → (B, Hq, D) in the query's dtype. Query head h reads
    kv head h // (Hq / Hkv)."""
    if query.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton ring attention runs on CUDA tensors; on CPU only in a "
                           "process started with TRITON_INTERPRET=1 (tests)")
    return launch(query, key, value, mask, scale)


@ring_attention.register_fake
def _(query, key, value, mask, scale):
    return torch.empty_like(query)
