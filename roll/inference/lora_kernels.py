"""Per-row multi-LoRA kernels (Triton) for a group of projections that read one input.

A decode step of a small model is bound by how many kernels it runs (28 layers × 7
projections), so ``FusedLoRA`` with ``kernels="triton"`` computes the deltas of q/k/v (and of
gate/up) together, in two kernels per group:

    shrink   h[m, j·R + r] = (A_{j,b} x[m])[r]       member j, slot b = row m's block
    expand   d[m, n]       = B_{j(n),b}[n] · h[m, j(n)·R : j(n)·R + R]

with ``a`` the members' stacked A factors one below the other, (G·C, K) with C = S·R columns
per member (member j's slot b: rows j·C + b·R … + R), and ``b`` the members' stacked B factors
(ΣN, C), member j's output rows [n_j, n_{j+1}). Each row reads only its own slot's factors
(the idea of punica's BGMV kernels, written here from that description). A row without a slot
(block −1) gets h = 0 and d = 0. Token m belongs to batch row ``m // tokens_per_row``.

The caller adds each member's slice of ``d`` to that member's output (a plain add that the
compiler fuses into whatever reads the output next). Both kernels are torch custom ops
(``roll::lora_shrink``, ``roll::lora_expand``), opaque nodes of a compiled, CUDA-graphed decode
step. On CPU tensors they run only in a process started with ``TRITON_INTERPRET=1`` (Triton's
interpreter: tests only, slow).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

MAX_GROUP = 3
"""Most projections in one group (q/k/v)."""


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, blocks_ptr, h_ptr, K, rank, columns, width, tokens_per_row,
                   stride_xm, stride_am, stride_hm,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)  # column of h: member·rank + r
    block = tl.load(blocks_ptr + m // tokens_per_row)
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    if block >= 0:
        a_rows = a_ptr + ((c // rank) * columns + block * rank + c % rank)[:, None] * stride_am
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
            a = tl.load(a_rows + k[None, :], mask=(c[:, None] < width) & (k[None, :] < K),
                        other=0.0).to(tl.float32)
            acc += tl.sum(a * xk[None, :], axis=1)
    tl.store(h_ptr + m * stride_hm + c, acc.to(h_ptr.dtype.element_ty), mask=c < width)


@triton.jit
def _expand_kernel(h_ptr, b_ptr, blocks_ptr, d_ptr, N, rank, split1, split2, tokens_per_row,
                   stride_hm, stride_bn, stride_dm,
                   BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    m = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    block = tl.load(blocks_ptr + m // tokens_per_row)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if block >= 0:
        r = tl.arange(0, BLOCK_R)
        member = (n >= split1).to(tl.int32) + (n >= split2).to(tl.int32)  # (BLOCK_N,)
        inside = (n[:, None] < N) & (r[None, :] < rank)
        h = tl.load(h_ptr + m * stride_hm + member[:, None] * rank + r[None, :], mask=inside,
                    other=0.0).to(tl.float32)
        b = tl.load(b_ptr + n[:, None] * stride_bn + (block * rank + r)[None, :], mask=inside,
                    other=0.0).to(tl.float32)
        acc += tl.sum(b * h, axis=1)
    tl.store(d_ptr + m * stride_dm + n, acc.to(d_ptr.dtype.element_ty), mask=n < N)


@triton.jit
def _delta_kernel(x_ptr, a_ptr, b_ptr, blocks_ptr, d_ptr, K, N, rank, columns, split1, split2,
                  chunk, tokens_per_row, stride_xm, stride_am, stride_bn, stride_dm,
                  BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Shrink and expand in one program: token m, output columns [n0, n0 + chunk) (inside one
    member: the host picks a chunk that divides every split)."""
    m = tl.program_id(0)
    n0 = tl.program_id(1) * chunk
    n_end = tl.minimum(n0 + chunk, N)
    block = tl.load(blocks_ptr + m // tokens_per_row)
    if block >= 0:
        member = (n0 >= split1).to(tl.int32) + (n0 >= split2).to(tl.int32)
        r = tl.arange(0, BLOCK_R)
        a_rows = a_ptr + (member * columns + block * rank + r)[:, None] * stride_am
        h = tl.zeros((BLOCK_R,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xk = tl.load(x_ptr + m * stride_xm + k, mask=k < K, other=0.0).to(tl.float32)
            a = tl.load(a_rows + k[None, :], mask=(r[:, None] < rank) & (k[None, :] < K),
                        other=0.0).to(tl.float32)
            h += tl.sum(a * xk[None, :], axis=1)
        h = h.to(a_ptr.dtype.element_ty).to(tl.float32)  # rounded as the stacked path rounds
        b_cols = b_ptr + (block * rank + r)[None, :]
        for j0 in range(n0, n_end, BLOCK_N):
            n = j0 + tl.arange(0, BLOCK_N)
            b = tl.load(b_cols + n[:, None] * stride_bn,
                        mask=(n[:, None] < n_end) & (r[None, :] < rank), other=0.0)
            d = tl.sum(b.to(tl.float32) * h[None, :], axis=1)
            tl.store(d_ptr + m * stride_dm + n, d.to(d_ptr.dtype.element_ty), mask=n < n_end)
    else:
        for j0 in range(n0, n_end, BLOCK_N):
            n = j0 + tl.arange(0, BLOCK_N)
            tl.store(d_ptr + m * stride_dm + n, tl.zeros((BLOCK_N,), d_ptr.dtype.element_ty),
                     mask=n < n_end)


def _check_device(t: Tensor) -> None:
    if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"the Triton LoRA kernels run on CUDA tensors (got {t.device.type}); on CPU only in "
            f"a process started with TRITON_INTERPRET=1 (tests): use lora_kernels='torch'"
        )


SHRINK = {"block_r": 4, "block_k": 1024, "num_warps": 4}
"""Launch settings of the shrink kernel (block_r: columns of h per program; block_k: input
columns per loop step). Chosen from ``benchmarks/lora_kernels.py`` (H100, batch 64 and 256)."""
EXPAND = {"block_n": 256, "num_warps": 4}
"""Launch settings of the expand kernel (block_n: output columns per program)."""


def _rows(t: Tensor) -> Tensor:
    """A 2-D tensor whose last dimension is contiguous (the kernels index rows by stride)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def launch_shrink(x: Tensor, a: Tensor, blocks: Tensor, h: Tensor, rank: int, columns: int,
                  tokens_per_row: int, block_r: int, block_k: int, num_warps: int) -> None:
    """Fill ``h`` (M, G·rank) with the shrink kernel under the given launch settings."""
    M, K = x.shape
    width = h.shape[1]
    grid = (M, triton.cdiv(width, block_r))
    _shrink_kernel[grid](x, a, blocks, h, K, rank, columns, width, tokens_per_row,
                         x.stride(0), a.stride(0), h.stride(0),
                         BLOCK_R=block_r, BLOCK_K=block_k, num_warps=num_warps)


def launch_expand(h: Tensor, b: Tensor, blocks: Tensor, d: Tensor, rank: int, splits: list[int],
                  tokens_per_row: int, block_n: int, num_warps: int) -> None:
    """Fill ``d`` (M, ΣN) with the expand kernel under the given launch settings."""
    M, N = d.shape
    bounds = [*splits, N, N][:MAX_GROUP - 1]
    grid = (M, triton.cdiv(N, block_n))
    _expand_kernel[grid](h, b, blocks, d, N, rank, bounds[0], bounds[1], tokens_per_row,
                         h.stride(0), b.stride(0), d.stride(0),
                         BLOCK_R=triton.next_power_of_2(rank), BLOCK_N=block_n,
                         num_warps=num_warps)


DELTA = {"chunk": 1024, "block_k": 512, "block_n": 128, "num_warps": 4}
"""Launch settings of the one-kernel delta (chunk: output columns per program, shrink
recomputed per chunk; block_k / block_n: loop steps over inputs / outputs)."""


def chunk_for(splits: list[int], chunk: int) -> int:
    """The largest power of two <= ``chunk`` that divides every split (a program's columns
    then lie inside one member)."""
    while any(split % chunk for split in splits):
        chunk //= 2
    return chunk


def launch_delta(x: Tensor, a: Tensor, b: Tensor, blocks: Tensor, d: Tensor, rank: int,
                 columns: int, splits: list[int], tokens_per_row: int, chunk: int, block_k: int,
                 block_n: int, num_warps: int) -> None:
    """Fill ``d`` (M, ΣN) with the one-kernel delta under the given launch settings."""
    (M, K), N = x.shape, d.shape[1]
    bounds = [*splits, N, N][:MAX_GROUP - 1]
    chunk = chunk_for(splits, chunk)
    grid = (M, triton.cdiv(N, chunk))
    _delta_kernel[grid](x, a, b, blocks, d, K, N, rank, columns, bounds[0], bounds[1], chunk,
                        tokens_per_row, x.stride(0), a.stride(0), b.stride(0), d.stride(0),
                        BLOCK_R=triton.next_power_of_2(rank), BLOCK_K=block_k, BLOCK_N=block_n,
                        num_warps=num_warps)


@torch.library.custom_op("roll::lora_delta", mutates_args=())
def lora_delta(x: Tensor, a: Tensor, b: Tensor, blocks: Tensor, rank: int, columns: int,
               splits: list[int], tokens_per_row: int) -> Tensor:
    """(M, K) tokens → deltas (M, ΣN) in B's dtype, one kernel: ``lora_expand(lora_shrink(x))``
    with h kept in registers (each program recomputes its member's h for its columns)."""
    _check_device(x)
    if len(splits) >= MAX_GROUP:
        raise ValueError(f"splits={splits}: groups have at most {MAX_GROUP} members")
    x, a, b = _rows(x), _rows(a), _rows(b)
    d = torch.empty(x.shape[0], b.shape[0], dtype=b.dtype, device=x.device)
    if x.shape[0]:
        launch_delta(x, a, b, blocks, d, rank, columns, splits, tokens_per_row, **DELTA)
    return d


@lora_delta.register_fake
def _(x, a, b, blocks, rank, columns, splits, tokens_per_row):
    return x.new_empty(x.shape[0], b.shape[0], dtype=b.dtype)


@torch.library.custom_op("roll::lora_shrink", mutates_args=())
def lora_shrink(x: Tensor, a: Tensor, blocks: Tensor, rank: int, columns: int,
                tokens_per_row: int) -> Tensor:
    """(M, K) tokens → h (M, G·rank) in A's dtype, G = a.shape[0] // columns members.

    ``a`` is (G·columns, K): each member's (S·rank, K) stack; ``blocks`` the int32 slot block
    of each batch row (−1: no adapter, h = 0)."""
    _check_device(x)
    x, a = _rows(x), _rows(a)
    M = x.shape[0]
    h = torch.empty(M, a.shape[0] // columns * rank, dtype=a.dtype, device=x.device)
    if M:
        launch_shrink(x, a, blocks, h, rank, columns, tokens_per_row, **SHRINK)
    return h


@lora_shrink.register_fake
def _(x, a, blocks, rank, columns, tokens_per_row):
    return x.new_empty(x.shape[0], a.shape[0] // columns * rank, dtype=a.dtype)


@torch.library.custom_op("roll::lora_expand", mutates_args=())
def lora_expand(h: Tensor, b: Tensor, blocks: Tensor, rank: int, splits: list[int],
                tokens_per_row: int) -> Tensor:
    """h (M, G·rank) → deltas (M, ΣN) in B's dtype; ``b`` is (ΣN, S·rank), member j's output
    rows start at ``splits[j - 1]`` (``splits``: the G − 1 inner boundaries)."""
    _check_device(h)
    if len(splits) >= MAX_GROUP:
        raise ValueError(f"splits={splits}: groups have at most {MAX_GROUP} members")
    h, b = _rows(h), _rows(b)
    d = torch.empty(h.shape[0], b.shape[0], dtype=b.dtype, device=h.device)
    if h.shape[0]:
        launch_expand(h, b, blocks, d, rank, splits, tokens_per_row, **EXPAND)
    return d


@lora_expand.register_fake
def _(h, b, blocks, rank, splits, tokens_per_row):
    return h.new_empty(h.shape[0], b.shape[0], dtype=b.dtype)
