"""Choosing the next token of every row of a mixed batch, each row with its own settings.

Sampling is Gumbel-max: ``argmax(z / T + g)`` with ``g = -log(-log(u))`` draws from
``softmax(z / T)``. The uniforms ``u`` are not taken from a shared torch generator but hashed
from (row seed, step, token id), so a row's tokens depend on its own seed only — not on the batch
it shares, the batch's order, the device's RNG state or the number of rows — and greedy rows
cost nothing extra.
"""

from __future__ import annotations

from collections.abc import Callable
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


def gumbel_noise(row_keys: Tensor, step: int | Tensor, vocab_keys: Tensor) -> Tensor:
    """Gumbel(0, 1) noise (N, V) from row keys (N,), the step (an int, or (N,) one per row)
    and per-token keys (V,)."""
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


def pick_tokens(logits: Tensor, temperature: Tensor, sampled: Tensor | None, row_keys: Tensor,
                steps: Tensor, vocab_keys: Tensor, masked: Tensor | None = None,
                top_k: Tensor | None = None, top_p: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
    """Every row's next token and its log-prob, in one function that ``torch.compile`` fuses.

    logits (n, V) in the model's dtype; temperature (n, 1), 1 for greedy rows; sampled (n,)
    bool, the rows that draw (None: every row is greedy); row_keys (n,) and steps (n,) int64,
    each row's noise key and token index; vocab_keys (V,); masked: the logits (n, V) float32
    with the tokens a constraint forbids at -inf (None: no constraint); top_k / top_p (n,):
    ``filter_top_k_top_p``'s (None: no row filters). Returns tokens (n,) int64 and log-probs
    (n,) float32 of those tokens under softmax(logits / temperature), the constraint not
    applied (the policy the trainer scores).

    Eager, these are ~10 passes over (n, V) (the cast, the noise's hashes, two logs, the
    divisions, two argmaxes, the log-softmax); compiled (``compiled_picker``), a few kernels
    that read the logits once or twice. On an H100 at 256 rows x 151,936 tokens the eager
    passes were ~15% of a decode step (benchmarks/README.md, "Where a batch-256 decode step
    goes").
    """
    z = logits.float()  # (n, V)
    choices = z if masked is None else masked
    tokens = choices.argmax(-1)  # (n,) greedy first
    if sampled is not None:
        scaled = choices / temperature  # (n, V)
        if top_k is not None:
            scaled = filter_top_k_top_p(scaled, top_k, top_p)
        noisy = scaled + gumbel_noise(row_keys, steps, vocab_keys)  # (n, V)
        tokens = torch.where(sampled, noisy.argmax(-1), tokens)
    logprobs = torch.log_softmax(z / temperature, -1).gather(-1, tokens[:, None])[:, 0]
    return tokens, logprobs


Picker = Callable[..., tuple[Tensor, Tensor]]
"""``pick_tokens`` or its compiled form (``compiled_picker``)."""


def compiled_picker(backend: str = "inductor") -> Picker:
    """``pick_tokens`` compiled by ``backend`` (dynamic row count; one variant per kind of
    call: sampled rows or not, a constraint or not, filters or not), run under the engine's
    recompile guard."""
    from roll.utils.compile_workers import compile_in_process
    from roll.utils.recompiles import recompile_guard

    compile_in_process()
    compiled = torch.compile(pick_tokens, dynamic=True, backend=backend)

    def call(*args: Tensor | None) -> tuple[Tensor, Tensor]:
        with recompile_guard("hf engine sampler"):
            return compiled(*args)

    return call


@dataclass
class BatchSampler:
    """Per-row sampling settings of one lock-step batch, as tensors on the device."""

    temperature: Tensor
    """(B, 1) each row's temperature, 1 for greedy rows (log-probs are taken at it)."""
    sampled: Tensor | None
    """(B,) bool: the rows that draw (None: every row is greedy)."""
    row_keys: Tensor
    """(B,) int64 noise keys (0 for greedy rows: unused)."""
    top_k: Tensor | None
    """(B,) top-k (0 = off); None where no row filters (the sort is skipped)."""
    top_p: Tensor | None
    """(B,) top-p (1 = off); None with ``top_k``."""
    vocab_keys: Tensor
    """(V,) int64 per-token keys."""
    steps: Tensor
    """(B,) int64: the index of the token each row picks next."""

    @classmethod
    def build(
        cls, params: list[SamplingParams], seeds: list[int], vocab_size: int, device
    ) -> BatchSampler:
        def tensor(values, dtype=None):
            return torch.tensor(values, dtype=dtype, device=device)

        filtered = any(not p.greedy and (p.top_k > 0 or p.top_p < 1.0) for p in params)
        return cls(
            temperature=tensor([1.0 if p.greedy else p.temperature for p in params],
                               torch.float32)[:, None],
            sampled=(None if all(p.greedy for p in params)
                     else tensor([not p.greedy for p in params])),
            row_keys=tensor([0 if p.greedy else seed_key(seed)
                             for p, seed in zip(params, seeds, strict=True)], torch.long),
            top_k=tensor([p.top_k for p in params], torch.long) if filtered else None,
            top_p=tensor([p.top_p for p in params], torch.float32) if filtered else None,
            vocab_keys=mix32(torch.arange(vocab_size, device=device) + _VOCAB_SALT),
            steps=torch.zeros(len(params), dtype=torch.long, device=device),
        )

    def select(self, logits: Tensor, masked: Tensor | None, pick: Picker = pick_tokens
               ) -> tuple[Tensor, Tensor]:
        """The next token (B,) of every row and its log-prob (B,) (``pick_tokens``), from the
        logits (B, V) and, where a constraint applies, the masked logits; advances the rows'
        token index."""
        tokens, logprobs = pick(logits, self.temperature, self.sampled, self.row_keys,
                                self.steps, self.vocab_keys, masked, self.top_k, self.top_p)
        self.steps += 1
        return tokens, logprobs
