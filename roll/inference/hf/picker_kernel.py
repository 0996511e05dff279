"""Every row's next token and its log-prob in two Triton kernels (``sampling.pick_tokens``'s
arithmetic, without its top-k/top-p filters).

The compiled ``pick_tokens`` runs three reductions over each row's whole vocabulary (the max, the
softmax's sum, the argmax): at 256 rows × 151,936 tokens on an H200 they took ~190 µs of a 4.5 ms
decode step (benchmarks/README.md, "Where the batch-256 decode step's 4.53 ms go"), ~1.2 TB/s
over the bf16 logits read three times. Here the vocabulary is cut into blocks: one program per
(row, block) reads its logits once and keeps, for that block, the running softmax state of
``z / T`` (max and sum of exp) and the best candidate (the greedy argmax of the choices, or for a
drawing row the argmax of ``choices / T + g`` with the same hashed Gumbel noise, computed from the
token ids as ``BatchSampler`` builds its vocabulary keys); a second kernel, one program per row,
combines the blocks (the first maximum wins, as ``torch.argmax``) and reads the chosen token's
logit for its log-prob.

The engine's picker where its decode step is compiled on CUDA (``blocked_picker``): on an H200
at 256 rows it took 78-192 µs where the compiled ``pick_tokens`` took 217-338
(``benchmarks/picker.py``; benchmarks/README.md, session 71). On CPU tensors it runs only under
``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import os
from functools import partial

import torch
import triton
import triton.language as tl
from torch import Tensor

from roll.inference.hf.pdl import launch_options, pdl_on, pdl_prologue
from roll.inference.hf.sampling import _MUL1, _MUL2, _STEP_SALT, _VOCAB_SALT, Picker, pick_tokens

# sampling.py's hash constants, as constants of the kernels
MUL1: tl.constexpr = tl.constexpr(_MUL1)
MUL2: tl.constexpr = tl.constexpr(_MUL2)
STEP_SALT: tl.constexpr = tl.constexpr(_STEP_SALT)
VOCAB_SALT: tl.constexpr = tl.constexpr(_VOCAB_SALT)

BLOCK = 2048
"""Vocabulary columns per program (151,936 tokens: 75 blocks a row). On an H200 the fastest of
2,048 / 4,096 / 8,192 in 5 of 6 cases (64 and 256 rows; greedy, sampled, constrained):
256 sampled rows 192 / 240 / 322 µs (``benchmarks/picker.py``, session 71)."""


@triton.jit
def _mix32(x):
    """``sampling.mix32`` on int64 values."""
    x = x & 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * MUL1) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * MUL2) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _block_kernel(logits_ptr, masked_ptr, temperature_ptr, sampled_ptr, keys_ptr, steps_ptr,
                  state_ptr, best_ptr, index_ptr, vocab, parts, stride_l, stride_m,
                  BLOCK_V: tl.constexpr, MASKED: tl.constexpr, SAMPLED: tl.constexpr,
                  USE_PDL: tl.constexpr):
    pdl_prologue(USE_PDL)
    row = tl.program_id(0)
    part = tl.program_id(1)
    columns = part * BLOCK_V + tl.arange(0, BLOCK_V)
    live = columns < vocab
    z = tl.load(logits_ptr + row * stride_l + columns, mask=live,
                other=float("-inf")).to(tl.float32)
    temperature = tl.load(temperature_ptr + row)
    scaled = z / temperature
    top = tl.max(scaled, axis=0)
    total = tl.sum(tl.exp(scaled - top), axis=0)  # padded columns: exp(-inf) = 0
    if MASKED:
        choices = tl.load(masked_ptr + row * stride_m + columns, mask=live, other=float("-inf"))
    else:
        choices = z
    if SAMPLED:
        draws = tl.load(sampled_ptr + row) != 0
        key = tl.load(keys_ptr + row)
        step = tl.load(steps_ptr + row)
        step_key = _mix32(key ^ _mix32(step + STEP_SALT))
        bits = _mix32(step_key ^ _mix32(columns.to(tl.int64) + VOCAB_SALT))
        uniform = ((bits >> 9).to(tl.float32) + 0.5) * 1.1920928955078125e-07  # 2 ** -23
        noisy = choices / temperature - tl.log(-tl.log(uniform))
        choices = tl.where(draws, noisy, choices)
    choices = tl.where(live, choices, float("-inf"))
    slot = row * parts + part
    tl.store(state_ptr + 2 * slot, top)
    tl.store(state_ptr + 2 * slot + 1, total)
    tl.store(best_ptr + slot, tl.max(choices, axis=0))
    tl.store(index_ptr + slot, part * BLOCK_V + tl.argmax(choices, axis=0))


@triton.jit
def _combine_kernel(logits_ptr, temperature_ptr, state_ptr, best_ptr, index_ptr, tokens_ptr,
                    logprobs_ptr, parts, stride_l, PARTS: tl.constexpr, USE_PDL: tl.constexpr):
    pdl_prologue(USE_PDL)
    row = tl.program_id(0)
    p = tl.arange(0, PARTS)
    live = p < parts
    slots = row * parts + p
    tops = tl.load(state_ptr + 2 * slots, mask=live, other=float("-inf"))
    totals = tl.load(state_ptr + 2 * slots + 1, mask=live, other=0.0)
    top = tl.max(tops, axis=0)
    log_total = top + tl.log(tl.sum(totals * tl.exp(tops - top), axis=0))
    bests = tl.load(best_ptr + slots, mask=live, other=float("-inf"))
    token = tl.load(index_ptr + row * parts + tl.argmax(bests, axis=0))  # first block wins
    temperature = tl.load(temperature_ptr + row)
    z = tl.load(logits_ptr + row * stride_l + token).to(tl.float32)
    tl.store(tokens_ptr + row, token)
    tl.store(logprobs_ptr + row, z / temperature - log_total)


def pick_tokens_blocked(logits: Tensor, temperature: Tensor, sampled: Tensor | None,
                        row_keys: Tensor, steps: Tensor, vocab_keys: Tensor,
                        masked: Tensor | None = None, top_k: Tensor | None = None,
                        top_p: Tensor | None = None, block: int = BLOCK,
                        filtered: Picker = pick_tokens) -> tuple[Tensor, Tensor]:
    """``sampling.pick_tokens`` (same arguments, same tokens and log-probs up to float order)
    by vocabulary blocks; calls with row filters (``top_k``/``top_p``: a sort) go to
    ``filtered`` (``pick_tokens`` itself unless given). ``vocab_keys`` is not read: the kernel
    hashes the token ids as ``BatchSampler`` does."""
    if top_k is not None or top_p is not None:
        return filtered(logits, temperature, sampled, row_keys, steps, vocab_keys, masked,
                        top_k, top_p)
    if logits.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the blocked picker runs on CUDA tensors; on CPU only in a process "
                           "started with TRITON_INTERPRET=1 (tests)")
    rows, vocab = logits.shape
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    parts = triton.cdiv(vocab, block)
    device = logits.device
    state = torch.empty(rows, parts, 2, dtype=torch.float32, device=device)
    best = torch.empty(rows, parts, dtype=torch.float32, device=device)
    index = torch.empty(rows, parts, dtype=torch.int64, device=device)
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=device)
    if not rows:
        return tokens, logprobs
    temperature = temperature.reshape(rows).float().contiguous()
    draw = (sampled if sampled is not None else torch.zeros(rows, dtype=torch.bool,
                                                             device=device)).to(torch.int8)
    masked_in = masked if masked is not None else logits
    pdl = pdl_on(logits)
    _block_kernel[(rows, parts)](
        logits, masked_in, temperature, draw, row_keys.contiguous(), steps.contiguous(), state,
        best, index, vocab, parts, logits.stride(0), masked_in.stride(0), BLOCK_V=block,
        MASKED=masked is not None, SAMPLED=sampled is not None, USE_PDL=pdl,
        **launch_options(pdl))
    _combine_kernel[(rows,)](logits, temperature, state, best, index, tokens, logprobs, parts,
                             logits.stride(0), PARTS=max(2, triton.next_power_of_2(parts)),
                             USE_PDL=pdl, **launch_options(pdl))
    return tokens, logprobs


def blocked_picker(filtered: Picker = pick_tokens) -> Picker:
    """The engine's ``Picker`` on CUDA: ``pick_tokens_blocked``, its calls with top-k/top-p
    going to ``filtered`` (the engine passes the compiled ``pick_tokens``)."""
    return partial(pick_tokens_blocked, filtered=filtered)


__all__ = ["BLOCK", "blocked_picker", "pick_tokens_blocked"]
