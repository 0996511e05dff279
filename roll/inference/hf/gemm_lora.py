"""A family's base GEMM and its rows' LoRA deltas in one Triton kernel (measured slower: unused).

The engine runs, per family of projections with one input (q/k/v, o, gate/up, down), the base
GEMM (cuBLAS) and then the tiled LoRA kernel (``lora_kernels.py``), which repeats the GEMM's
loop over the inputs for its shrink. On an H200 at batch 256 the pair took 1.39 ms of a 4.45 ms
decode step where the GEMMs alone took 0.70 ms, although the adapters are 0.16 GB a step
(~34 µs of traffic): the LoRA kernel's cost is its chain of dependent loads, not its bytes
(benchmarks/README.md, session 71). Here one program computes a tile of rows × output columns
of one member j and, in the same loop over the inputs, the shrink of those rows for every slot:

    acc = X Wᵀ                        (rows, cols)    the base product
    z   = X A_jᵀ                      (rows, S·R)     every slot's shrink, in the same loop
    z  := z where column c // R == the row's slot, else 0, rounded to the factors' dtype
    out = acc + z B_jᵀ  (+ bias)      rounded once to the output dtype

so the LoRA work rides on the GEMM's loads of X, and the expand is the tile's epilogue. The
shrink is computed for all S slots and masked (S·R columns: 128 for 4 slots of rank 32), which
keeps a tile of mixed rows one program; its cost grows with S·R.

``a``, ``b`` are ``lora_kernels``' stacked factors: ``a`` (G·C, K) with C = S·R (member j's
slot s: rows j·C + s·R … + R), ``b`` (ΣN, C) (member j's output rows [n_j, n_{j+1})). Rows
without a slot (block −1) get the base product alone. A torch custom op (``roll::gemm_lora``);
on CPU tensors it runs only in a process started with ``TRITON_INTERPRET=1`` (tests).
``benchmarks/lora_kernels.py --sweep fused`` times it against the GEMM + tiled kernel: on an
H200 (session 71) the best of 24 settings per family took 1.98 ms a decode step at batch 256
against 1.43 ms for cuBLAS + the tiled kernel (1.63 / 1.22 at batch 64). Its loop over the
inputs runs in one program per tile (no split over K), and the down projection's 3,072 inputs
(21.8 µs against 14.3) show it; a version that splits K, then adds the deltas where the
partial sums meet, is what would have to beat cuBLAS here. Not wired into the engine.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from roll.inference.hf.lora_kernels import MAX_GROUP, _check_device, _dot, _rows, chunk_for
from roll.inference.hf.pdl import launch_options, pdl_on, pdl_prologue

FUSED = {"block_m": 64, "block_n": 128, "block_k": 64, "num_warps": 4, "num_stages": 3}
"""Launch settings (``benchmarks/lora_kernels.py --sweep fused`` tries others)."""


@triton.jit
def _gemm_lora_kernel(x_ptr, w_ptr, bias_ptr, a_ptr, b_ptr, blocks_ptr, out_ptr, M, K, N, rank,
                      columns, split1, split2, stride_xm, stride_wn, stride_am, stride_bn,
                      stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr, HAS_BIAS: tl.constexpr,
                      IEEE: tl.constexpr, USE_PDL: tl.constexpr):
    """One tile: rows [m0, m0 + BLOCK_M) × output columns [n0, n0 + BLOCK_N) of one member."""
    pdl_prologue(USE_PDL)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n0 = tl.program_id(1) * BLOCK_N
    n = n0 + tl.arange(0, BLOCK_N)
    c = tl.arange(0, BLOCK_C)
    live_m, live_n, live_c = m < M, n < N, c < columns
    member = (n0 >= split1).to(tl.int32) + (n0 >= split2).to(tl.int32)
    a_cols = a_ptr + (member * columns + c)[None, :] * stride_am
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    z = tl.zeros((BLOCK_M, BLOCK_C), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        live_k = k < K
        xk = tl.load(x_ptr + m[:, None] * stride_xm + k[None, :],
                     mask=live_m[:, None] & live_k[None, :], other=0.0)  # (M, K)
        wk = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None],
                     mask=live_k[:, None] & live_n[None, :], other=0.0)  # (K, N)
        ak = tl.load(a_cols + k[:, None], mask=live_k[:, None] & live_c[None, :],
                     other=0.0)  # (K, C)
        acc += _dot(xk, wk, IEEE)
        z += _dot(xk, ak, IEEE)
    slot = tl.load(blocks_ptr + m, mask=live_m, other=-1)  # (M,); -1: no adapter
    own = ((c // rank)[None, :] == slot[:, None]) & live_c[None, :]
    z = tl.where(own, z, 0.0).to(a_ptr.dtype.element_ty)  # rounded as the stacked path rounds h
    bt = tl.load(b_ptr + n[None, :] * stride_bn + c[:, None],
                 mask=live_c[:, None] & live_n[None, :], other=0.0)  # (C, N)
    acc += _dot(z, bt, IEEE)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=live_n, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + m[:, None] * stride_om + n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=live_m[:, None] & live_n[None, :])


def launch_gemm_lora(x: Tensor, w: Tensor, bias: Tensor | None, a: Tensor, b: Tensor,
                     blocks: Tensor, out: Tensor, rank: int, columns: int, splits: list[int],
                     block_m: int, block_n: int, block_k: int, num_warps: int,
                     num_stages: int | None = None) -> None:
    """Fill ``out`` (M, ΣN) under the given launch settings (``block_n`` lowered to divide the
    splits, so that a tile's columns lie inside one member)."""
    (M, K), N = x.shape, w.shape[0]
    bounds = [*splits, N, N][:MAX_GROUP - 1]
    block_n = chunk_for(splits, block_n)
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
    pdl = pdl_on(x)
    _gemm_lora_kernel[grid](
        x, w, bias if bias is not None else w, a, b, blocks, out, M, K, N, rank, columns,
        bounds[0], bounds[1], x.stride(0), w.stride(0), a.stride(0), b.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        BLOCK_C=max(16, triton.next_power_of_2(columns)), HAS_BIAS=bias is not None,
        IEEE=x.dtype == torch.float32, USE_PDL=pdl, num_warps=num_warps,
        **launch_options(pdl), **({} if num_stages is None else {"num_stages": num_stages}))


@torch.library.custom_op("roll::gemm_lora", mutates_args=())
def gemm_lora(x: Tensor, w: Tensor, bias: Tensor | None, a: Tensor, b: Tensor, blocks: Tensor,
              rank: int, columns: int, splits: list[int]) -> Tensor:
    """(M, K) inputs → (M, ΣN) = X Wᵀ (+ bias) + each row's LoRA delta (its slot ``blocks[i]``,
    −1: none), in X's dtype, one kernel (``FUSED`` settings)."""
    _check_device(x)
    if len(splits) >= MAX_GROUP:
        raise ValueError(f"splits={splits}: families have at most {MAX_GROUP} members")
    if blocks.shape != (x.shape[0],):
        raise ValueError(f"blocks has shape {tuple(blocks.shape)}: one slot per row of the "
                         f"{x.shape[0]} inputs expected")
    if a.shape[0] != (len(splits) + 1) * columns or b.shape != (w.shape[0], columns):
        raise ValueError(f"a {tuple(a.shape)} / b {tuple(b.shape)}: expected "
                         f"({(len(splits) + 1) * columns}, K) / ({w.shape[0]}, {columns})")
    x, w, a, b = _rows(x), _rows(w), _rows(a), _rows(b)
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0]:
        launch_gemm_lora(x, w, bias, a, b, blocks.to(torch.int32).contiguous(), out, rank,
                         columns, splits, **FUSED)
    return out


@gemm_lora.register_fake
def _(x, w, bias, a, b, blocks, rank, columns, splits):
    return x.new_empty(x.shape[0], w.shape[0])


__all__ = ["FUSED", "gemm_lora", "launch_gemm_lora"]
