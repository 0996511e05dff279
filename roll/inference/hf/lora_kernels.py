"""Multi-LoRA kernel (Triton) for the decode steps of a group of projections with one input.

A decode step of a small model is bound by how many kernels it runs (28 layers × 7
projections), so ``FusedLoRA`` with ``kernels="triton"`` computes the deltas of q/k/v (and of
gate/up) together, in one kernel per group. The batch rows are put in slot order and cut into
tiles of at most ``TILE_ROWS`` rows of one slot (``row_tiles``, on the host, once per batch);
a program takes one tile and one chunk of output columns (inside one member j) and computes

    h = X_tile A_{j,b}ᵀ          (rows, R)     slot b = the tile's slot
    d = h B_{j,b}ᵀ               (rows, chunk)

with ``a`` the members' stacked A factors one below the other, (G·C, K) with C = S·R columns
per member (member j's slot b: rows j·C + b·R … + R), and ``b`` the members' stacked B factors
(ΣN, C), member j's output rows [n_j, n_{j+1}). A tile reads its slot's factors once, with
tensor-core products; rows without a slot (block −1) get d = 0. This is the segmented-gather
idea of punica/S-LoRA's SGMV kernels, written here from that description. (Per-row kernels —
each row reading its own slot's factors, in a shrink and an expand kernel — were measured 1.4×
slower at batch 64 and 2.8× at 256: ``benchmarks/README.md``.)

The caller adds each member's slice of ``d`` to that member's output (a plain add that the
compiler fuses into whatever reads the output next). The kernel is a torch custom op
(``roll::lora_tiled``), an opaque node of a compiled, CUDA-graphed decode step. On CPU tensors
it runs only in a process started with ``TRITON_INTERPRET=1`` (Triton's interpreter: tests
only, slow).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from roll.inference.hf.pdl import launch_options, pdl_on, pdl_prologue

MAX_GROUP = 3
"""Most projections in one group (q/k/v)."""


@triton.jit
def _tile_rows(tiles_ptr, order_ptr, BLOCK_M: tl.constexpr):
    """The program's tile (axis 0 of the grid): its slot block, its span [start, end) of the
    rows in slot order, those rows' token indices (BLOCK_M,) and which of them are live."""
    tile = tl.program_id(0)
    block = tl.load(tiles_ptr + 3 * tile)
    start = tl.load(tiles_ptr + 3 * tile + 1)
    end = tl.load(tiles_ptr + 3 * tile + 2)
    i = start + tl.arange(0, BLOCK_M)
    live = i < end
    rows = tl.load(order_ptr + i, mask=live, other=0)
    return block, start, end, rows, live


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b on tensor cores, or in full fp32 (``IEEE``: fp32 inputs, the CPU tests)."""
    if IEEE:
        out = tl.dot(a, b, input_precision="ieee")
    else:
        out = tl.dot(a, b)
    return out


@triton.jit
def _tile_kernel(x_ptr, a_ptr, b_ptr, order_ptr, tiles_ptr, d_ptr, K, N, rank, columns, split1,
                 split2, chunk, stride_xm, stride_am, stride_bn, stride_dm,
                 BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, IEEE: tl.constexpr, USE_PDL: tl.constexpr):
    """One tile of rows that share a slot, output columns [n0, n0 + chunk) (inside one member:
    the host picks a chunk that divides every split): h = X A_jᵀ, then d = h B_jᵀ."""
    pdl_prologue(USE_PDL)
    n0 = tl.program_id(1) * chunk
    n_end = tl.minimum(n0 + chunk, N)
    block, start, end, rows, live = _tile_rows(tiles_ptr, order_ptr, BLOCK_M)
    if start < end:
        if block >= 0:
            member = (n0 >= split1).to(tl.int32) + (n0 >= split2).to(tl.int32)
            r = tl.arange(0, BLOCK_R)
            a_cols = a_ptr + (member * columns + block * rank + r)[None, :] * stride_am
            h = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                xk = tl.load(x_ptr + rows[:, None] * stride_xm + k[None, :],
                             mask=live[:, None] & (k[None, :] < K), other=0.0)  # (M, K)
                ak = tl.load(a_cols + k[:, None], mask=(k[:, None] < K) & (r[None, :] < rank),
                             other=0.0)  # (K, R)
                h += _dot(xk, ak, IEEE)
            h = h.to(a_ptr.dtype.element_ty)  # rounded as the stacked path rounds
            b_rows = b_ptr + (block * rank + r)[:, None]
            for j0 in range(n0, n_end, BLOCK_N):
                n = j0 + tl.arange(0, BLOCK_N)
                bt = tl.load(b_rows + n[None, :] * stride_bn,
                             mask=(r[:, None] < rank) & (n[None, :] < n_end), other=0.0)  # (R, N)
                d = _dot(h, bt, IEEE)
                tl.store(d_ptr + rows[:, None] * stride_dm + n[None, :],
                         d.to(d_ptr.dtype.element_ty), mask=live[:, None] & (n[None, :] < n_end))
        else:
            for j0 in range(n0, n_end, BLOCK_N):
                n = j0 + tl.arange(0, BLOCK_N)
                tl.store(d_ptr + rows[:, None] * stride_dm + n[None, :],
                         tl.zeros((BLOCK_M, BLOCK_N), d_ptr.dtype.element_ty),
                         mask=live[:, None] & (n[None, :] < n_end))


@triton.jit
def _expand_kernel(p_ptr, b_ptr, order_ptr, tiles_ptr, N, rank, columns, split1, split2, chunk,
                   stride_pm, stride_bn, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_N: tl.constexpr, IEEE: tl.constexpr, USE_PDL: tl.constexpr):
    """The expand half alone, its shrink already in the product: ``p`` (rows, N + G·C) holds the
    base outputs in columns [0, N) and h = X A_jᵀ of every member and slot after them (the
    base weight with the stacked A factors appended, one GEMM). One tile of rows that share
    slot b, output columns [n0, n0 + chunk) of member j: p[:, n] += h_{j,b} B_{j,b}ᵀ in place
    (rows without a slot are left as they are)."""
    pdl_prologue(USE_PDL)
    n0 = tl.program_id(1) * chunk
    n_end = tl.minimum(n0 + chunk, N)
    block, start, end, rows, live = _tile_rows(tiles_ptr, order_ptr, BLOCK_M)
    if (start < end) & (block >= 0):
        member = (n0 >= split1).to(tl.int32) + (n0 >= split2).to(tl.int32)
        r = tl.arange(0, BLOCK_R)
        h = tl.load(p_ptr + rows[:, None] * stride_pm
                    + (N + member * columns + block * rank + r)[None, :],
                    mask=live[:, None] & (r[None, :] < rank), other=0.0)  # (M, R)
        b_rows = b_ptr + (block * rank + r)[:, None]
        for j0 in range(n0, n_end, BLOCK_N):
            n = j0 + tl.arange(0, BLOCK_N)
            bt = tl.load(b_rows + n[None, :] * stride_bn,
                         mask=(r[:, None] < rank) & (n[None, :] < n_end), other=0.0)  # (R, N)
            d = _dot(h, bt, IEEE)
            out = p_ptr + rows[:, None] * stride_pm + n[None, :]
            keep = live[:, None] & (n[None, :] < n_end)
            base = tl.load(out, mask=keep, other=0.0).to(tl.float32)
            tl.store(out, (base + d).to(p_ptr.dtype.element_ty), mask=keep)


def _check_device(t: Tensor) -> None:
    if t.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"the Triton LoRA kernels run on CUDA tensors (got {t.device.type}); on CPU only in "
            f"a process started with TRITON_INTERPRET=1 (tests): use lora_kernels='torch'"
        )


def _rows(t: Tensor) -> Tensor:
    """A 2-D tensor whose last dimension is contiguous (the kernels index rows by stride)."""
    return t if t.stride(-1) == 1 else t.contiguous()


TILE_ROWS = 16
"""Rows per tile of the tiled kernel (``tl.dot`` needs at least 16)."""
TILED = {"block_k": 256, "block_n": 256, "num_warps": 4}
"""Launch settings of the tiled kernel (block_k / block_n: loop steps over inputs / outputs).
Chosen with ``benchmarks/lora_kernels.py`` (H100, batch 64 and 256)."""


def chunk_size(rows: int, inputs: int, outputs: int) -> int:
    """Output columns per program: about 32·N·tiles / K, a power of two in [256, 4096].

    A program's work is its shrink (K) plus its chunk; more, smaller chunks spread a group
    over more programs but repeat the shrink. This rule matched the best chunk of every
    Qwen3-0.6B group at batch 64 and 256 (``benchmarks/lora_kernels.py``, H100)."""
    tiles = -(-rows // TILE_ROWS)
    target = 32 * outputs * tiles // max(inputs, 1)
    return min(4096, max(256, 1 << max(target, 1).bit_length() - 1))


def chunk_for(splits: list[int], chunk: int) -> int:
    """The largest power of two <= ``chunk`` that divides every split (a program's columns
    then lie inside one member)."""
    while any(split % chunk for split in splits):
        chunk //= 2
    return chunk


def row_tiles(blocks: list[int], slot_capacity: int) -> tuple[Tensor, Tensor]:
    """Rows grouped by slot for the tiled kernel: ``order`` (B,) int32, the row indices sorted
    by slot block (stable), and ``tiles`` (T, 3) int32, rows (block, start, end) of ``order``
    with at most TILE_ROWS rows of one block each (block −1: rows without adapter, d = 0),
    padded with empty tiles to T = ⌈B / TILE_ROWS⌉ + slot_capacity + 1, a count fixed by
    the batch size and the slot capacity (a captured graph keeps its grid)."""
    order = sorted(range(len(blocks)), key=blocks.__getitem__)
    count = -(-len(blocks) // TILE_ROWS) + slot_capacity + 1
    tiles = []
    start = 0
    while start < len(order):
        block = blocks[order[start]]
        end = start
        while end < len(order) and end - start < TILE_ROWS and blocks[order[end]] == block:
            end += 1
        tiles.append((block, start, end))
        start = end
    tiles += [(-1, 0, 0)] * (count - len(tiles))
    return (torch.tensor(order, dtype=torch.int32),
            torch.tensor(tiles, dtype=torch.int32).reshape(count, 3))


def launch_tiled(x: Tensor, a: Tensor, b: Tensor, order: Tensor, tiles: Tensor, d: Tensor,
                 rank: int, columns: int, splits: list[int], block_k: int, block_n: int,
                 num_warps: int, chunk: int | None = None, num_stages: int | None = None) -> None:
    """Fill ``d`` (B, ΣN) with the tiled kernel under the given launch settings (``chunk``:
    output columns per program, ``chunk_size`` when None; lowered to divide the splits;
    ``num_stages``: Triton's software pipelining of the loops, its default when None)."""
    (M, K), N = x.shape, d.shape[1]
    bounds = [*splits, N, N][:MAX_GROUP - 1]
    chunk = chunk_for(splits, chunk or chunk_size(M, K, N))
    grid = (tiles.shape[0], triton.cdiv(N, chunk))
    _tile_kernel[grid](x, a, b, order, tiles, d, K, N, rank, columns, bounds[0], bounds[1], chunk,
                       x.stride(0), a.stride(0), b.stride(0), d.stride(0),
                       BLOCK_M=TILE_ROWS, BLOCK_R=max(16, triton.next_power_of_2(rank)),
                       BLOCK_K=block_k, BLOCK_N=block_n, IEEE=x.dtype == torch.float32,
                       num_warps=num_warps, USE_PDL=pdl_on(x), **launch_options(pdl_on(x)),
                       **({} if num_stages is None else {"num_stages": num_stages}))


def launch_expand(product: Tensor, b: Tensor, order: Tensor, tiles: Tensor, rank: int,
                  columns: int, splits: list[int], block_n: int = 256, num_warps: int = 4,
                  chunk: int | None = None) -> None:
    """Add each row's LoRA delta to the base outputs in ``product`` (rows, ΣN + G·C), in place,
    from the shrink h already in its last G·C columns (``_expand_kernel``; ΣN = ``b``'s rows).
    Not yet used by the engine: ``benchmarks/lora_kernels.py --shrink-in-gemm`` times the
    extended GEMM plus this against the GEMM plus ``lora_tiled``."""
    _check_device(product)
    if product.stride(-1) != 1:
        raise ValueError("launch_expand: the product's last dimension must be contiguous")
    M, N = product.shape[0], b.shape[0]
    if product.shape[1] != N + (len(splits) + 1) * columns:
        raise ValueError(f"launch_expand: product has {product.shape[1]} columns, not the "
                         f"{N} outputs + {len(splits) + 1} x {columns} shrink columns")
    bounds = [*splits, N, N][:MAX_GROUP - 1]
    chunk = chunk_for(splits, chunk or block_n)
    grid = (tiles.shape[0], triton.cdiv(N, chunk))
    b = _rows(b)
    if M:
        _expand_kernel[grid](product, b, order, tiles, N, rank, columns, bounds[0], bounds[1],
                             chunk, product.stride(0), b.stride(0), BLOCK_M=TILE_ROWS,
                             BLOCK_R=max(16, triton.next_power_of_2(rank)), BLOCK_N=block_n,
                             IEEE=product.dtype == torch.float32, num_warps=num_warps,
                             USE_PDL=pdl_on(product), **launch_options(pdl_on(product)))


@torch.library.custom_op("roll::lora_tiled", mutates_args=())
def lora_tiled(x: Tensor, a: Tensor, b: Tensor, order: Tensor, tiles: Tensor, rank: int,
               columns: int, splits: list[int]) -> Tensor:
    """(B, K) decode tokens → deltas (B, ΣN) in B's dtype, one kernel: rows that share a slot
    run as tiles (``row_tiles``), so each tile reads its slot's factors once (tensor-core
    products), and the shrink's h stays in registers."""
    x, a, b, d = _tiled_operands(x, a, b, order, splits)
    if x.shape[0]:
        launch_tiled(x, a, b, order, tiles, d, rank, columns, splits, **TILED)
    return d


def _tiled_operands(x: Tensor, a: Tensor, b: Tensor, order: Tensor,
                    splits: list[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The checked, row-contiguous x, a, b of a ``launch_tiled`` call and its output (B, ΣN)."""
    _check_device(x)
    if len(splits) >= MAX_GROUP:
        raise ValueError(f"splits={splits}: groups have at most {MAX_GROUP} members")
    if order.shape[0] != x.shape[0]:
        raise ValueError(f"{x.shape[0]} tokens but row tiles for {order.shape[0]} rows")
    x, a, b = _rows(x), _rows(a), _rows(b)
    return x, a, b, torch.empty(x.shape[0], b.shape[0], dtype=b.dtype, device=x.device)


@lora_tiled.register_fake
def _(x, a, b, order, tiles, rank, columns, splits):
    return x.new_empty(x.shape[0], b.shape[0], dtype=b.dtype)


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream per CUDA device that ``linear_lora`` runs its deltas on."""
    stream = _SIDE_STREAMS.get(device)
    if stream is None:
        stream = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return stream


@torch.library.custom_op("roll::linear_lora", mutates_args=())
def linear_lora(x: Tensor, weight: Tensor, bias: Tensor | None, a: Tensor, b: Tensor,
                order: Tensor, tiles: Tensor, rank: int, columns: int,
                splits: list[int]) -> tuple[Tensor, Tensor]:
    """(B, K) decode tokens → (the base product x Wᵀ + bias (B, N), ``lora_tiled``'s deltas
    (B, ΣN)), the two launched side by side on CUDA: the deltas' kernel on a side stream that
    waits for what came before on the current one, the GEMM on the current stream, which then
    waits for the side stream. Neither kernel fills the GPU at decode sizes (the GEMM's
    output tiles, the LoRA kernel's chain of dependent loads), so they overlap (a captured
    graph keeps the fork and the join as two branches). Elsewhere (the interpreter) one
    after the other. Either way the values are those of ``F.linear`` and ``lora_tiled``."""
    x, a, b, d = _tiled_operands(x, a, b, order, splits)
    if not x.shape[0] or x.device.type != "cuda":
        if x.shape[0]:
            launch_tiled(x, a, b, order, tiles, d, rank, columns, splits, **TILED)
        return F.linear(x, weight, bias), d
    main, side = torch.cuda.current_stream(x.device), side_stream(x.device)
    side.wait_stream(main)  # x, the factors and the row tiles are ready
    with torch.cuda.stream(side):
        launch_tiled(x, a, b, order, tiles, d, rank, columns, splits, **TILED)
    product = F.linear(x, weight, bias)
    # d and x were allocated on (and are freed by) the current stream, which waits here for
    # the side stream's reads and writes: the allocator's reuse stays safe
    main.wait_stream(side)
    return product, d


@linear_lora.register_fake
def _(x, weight, bias, a, b, order, tiles, rank, columns, splits):
    return (x.new_empty(x.shape[0], weight.shape[0]),
            x.new_empty(x.shape[0], b.shape[0], dtype=b.dtype))
