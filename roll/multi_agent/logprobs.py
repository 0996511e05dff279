"""Token log-probs and entropies of a causal LM without full-vocabulary float32 copies.

A naive ``log_softmax(logits.float())`` over (rows, tokens, vocab) builds an fp32 copy of the
whole logits tensor (Qwen3's vocabulary is 151,936: 192 rows x 400 tokens is ~47 GB), keeps it
for backward, and spends it on prompt tokens that the loss never reads. Here:

1. the model's LM head runs only on the window of positions that predict a selected token
   (``logits_to_keep``), so prompt-only columns get no logits at all;
2. ``TokenLogProb`` takes, per selected token, ``z[token] - logsumexp(z)`` with ``z = logits / T``
   in fp32, ``CHUNK_BYTES`` of fp32 at a time, and saves only the logits it was given (no fp32
   copy) for backward, where it recomputes the softmax chunk by chunk;
3. the entropy comes from the same chunk (one more reduction) and carries a gradient only
   when the loss uses it.

Temperature ``T`` is part of the policy (rollouts sample from ``softmax(z / T)``), so ratios,
KL and entropy are all taken at it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from roll.batch import TrajectoryBatch

if TYPE_CHECKING:
    from roll.multi_agent.model import MultiAgentLoRAModel

CHUNK_BYTES = 1 << 28
"""Size of the fp32 working copy of one chunk of logits (256 MiB)."""


def chunk_rows(vocab_size: int) -> int:
    """Rows of (vocab_size,) fp32 logits per chunk."""
    return max(1, CHUNK_BYTES // (4 * vocab_size))


class TokenLogProb(torch.autograd.Function):
    """log p(token) and entropy at temperature T for selected rows of a (N, V) logits matrix.

    forward(logits (N, V), targets (N,), index (M,), temperature, with_entropy)
        -> logprob (M,) fp32, entropy (M,) fp32 (zeros when ``with_entropy`` is False);
    row ``index[i]`` of ``logits`` gives output i. Gradients reach ``logits`` only:
        d logprob / d z_j = 1[j = token] - p_j,   d H / d z_j = -p_j (log p_j + H),
    each divided by T for d / d logits.
    """

    @staticmethod
    def forward(ctx, logits, targets, index, temperature, with_entropy):
        logprob = torch.zeros(index.numel(), dtype=torch.float32, device=logits.device)
        entropy = torch.zeros_like(logprob)
        step = chunk_rows(logits.shape[-1])
        for start in range(0, index.numel(), step):
            rows = index[start : start + step]
            z = logits.index_select(0, rows).float() / temperature  # (C, V) fp32, one chunk
            lse = torch.logsumexp(z, dim=-1)  # (C,)
            logprob[start : start + step] = z.gather(-1, targets[rows, None]).squeeze(-1) - lse
            if with_entropy:
                probs = torch.exp(z - lse[:, None])
                entropy[start : start + step] = lse - (probs * z).sum(-1)
        ctx.save_for_backward(logits, targets, index, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        logits, targets, index, entropy = ctx.saved_tensors
        if not ctx.needs_input_grad[0] or (grad_logprob is None and grad_entropy is None):
            return None, None, None, None, None
        temperature = ctx.temperature
        grad = torch.zeros_like(logits)  # (N, V), the logits' own dtype
        step = chunk_rows(logits.shape[-1])
        for start in range(0, index.numel(), step):
            rows = index[start : start + step]
            z = logits.index_select(0, rows).float() / temperature  # (C, V)
            logp = torch.log_softmax(z, dim=-1)
            probs = logp.exp()
            g = torch.zeros_like(z)
            if grad_logprob is not None:
                upstream = grad_logprob[start : start + step, None]  # (C, 1)
                g -= probs * upstream
                g.scatter_add_(-1, targets[rows, None], upstream)
            if grad_entropy is not None:
                h = entropy[start : start + step, None]
                g -= probs * (logp + h) * grad_entropy[start : start + step, None]
            grad.index_copy_(0, rows, (g / temperature).to(grad.dtype))
        return grad, None, None, None, None


def _fused_forward(logits: Tensor, targets: Tensor, temperature: float):
    """log p(target), entropy and logsumexp (M,) fp32 of (M, V) logits at ``temperature``."""
    z = logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1)
    logprob = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    entropy = lse - (torch.exp(z - lse[:, None]) * z).sum(-1)
    return logprob, entropy, lse


def _fused_backward(logits: Tensor, targets: Tensor, lse: Tensor, entropy: Tensor,
                    grad_logprob: Tensor, grad_entropy: Tensor, temperature: float) -> Tensor:
    """d(logprob . grad_logprob + entropy . grad_entropy) / d logits, in the logits' dtype."""
    logp = logits.float() / temperature - lse[:, None]
    probs = torch.exp(logp)
    hit = torch.arange(logits.shape[-1], device=logits.device)[None, :] == targets[:, None]
    grad = (hit.float() - probs) * grad_logprob[:, None] \
        - probs * (logp + entropy[:, None]) * grad_entropy[:, None]
    return (grad / temperature).to(logits.dtype)


_FUSED: dict[str, tuple] = {}  # backend -> the compiled (forward, backward)


class FusedTokenLogProb(torch.autograd.Function):
    """``TokenLogProb`` for EVERY row of (M, V) logits, forward and backward each one compiled
    function (``backend``): on a GPU inductor fuses each into kernels that read the logits
    once, without the fp32 working copies of the chunked loop (~20 GB of traffic a captured
    micro-batch of 8 x 320 tokens; captured.py). Static shapes, no host read: what a CUDA
    graph needs. Same formulas: d logprob / d z_j = 1[j = token] - p_j, d H / d z_j =
    -p_j (log p_j + H), each divided by T."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, backend):
        if backend not in _FUSED:
            _FUSED[backend] = (torch.compile(_fused_forward, backend=backend, dynamic=True),
                               torch.compile(_fused_backward, backend=backend, dynamic=True))
        logprob, entropy, lse = _FUSED[backend][0](logits, targets, temperature)
        ctx.save_for_backward(logits, targets, lse, entropy)
        ctx.temperature, ctx.backend = temperature, backend
        return logprob, entropy

    @staticmethod
    def backward(ctx, grad_logprob, grad_entropy):
        logits, targets, lse, entropy = ctx.saved_tensors
        grad = _FUSED[ctx.backend][1](logits, targets, lse, entropy, grad_logprob,
                                      grad_entropy, ctx.temperature)
        return grad, None, None, None


def behaviour_logprobs(model: MultiAgentLoRAModel, batch: TrajectoryBatch, temperature: float,
                       forward_rows: int, reference: bool,
                       moves: bool = False, old: bool = True) -> TrajectoryBatch:
    """``batch`` with ``old_logprobs`` (B, T): each row's tokens under its own agent's adapter,
    the trainer's forward at the sampling ``temperature`` without gradient (on-policy: the rows
    were generated by these adapters, so PPO ratios start at exactly 1); with ``moves`` (and
    the batch's ``choice_tokens``), also ``old_move_logprobs`` from the same forward; and, when
    ``reference``, ``ref_logprobs`` (B, T) under the base with adapters off. The one place
    these are computed (the pipeline before the advantages, the trainer for a batch that comes
    without them); fields the batch already has are kept. Zero outside ``response_mask``.
    ``old`` False: the reference pass alone (``with_old_of_rows`` adds the old log-probs of
    the agents that need them)."""
    passes = dict(positions=batch.response_mask.bool(), temperature=temperature,
                  forward_rows=forward_rows)
    moves = moves and batch.choice_tokens is not None
    if old and (batch.old_logprobs is None or (moves and batch.old_move_logprobs is None)):
        if moves:
            old, old_moves = model.logprobs(batch.input_ids, batch.attention_mask,
                                            batch.agent_id, choices=batch.choice_tokens,
                                            **passes)
            batch = batch.with_fields(old_move_logprobs=old_moves)
        else:
            old = model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id,
                                 **passes)
        if batch.old_logprobs is None:
            batch = batch.with_fields(old_logprobs=old)
    if reference and batch.ref_logprobs is None:
        batch = batch.with_fields(ref_logprobs=model.reference_logprobs(
            batch.input_ids, batch.attention_mask, **passes))
    return batch


def with_old_of_rows(batch: TrajectoryBatch, rows: Tensor,
                     part: TrajectoryBatch) -> TrajectoryBatch:
    """``batch`` with the old log-probs (and over moves) of ``part`` (its ``rows``, after the
    old pass) in those rows and 0 in the others: the rows of agents whose training forward
    gives their own (plan.py ``old_pass_agents``)."""
    fields = {}
    for key in ("old_logprobs", "old_move_logprobs"):
        value = getattr(part, key)
        if value is not None:
            full = value.new_zeros((len(batch), *value.shape[1:]))
            full[rows.to(value.device)] = value
            fields[key] = full
    return batch.with_fields(**fields)


def response_window(positions: Tensor) -> tuple[int, int]:
    """(first, stop): the columns [first, stop) that hold every selected position of a (B, T)
    boolean mask; ``first`` >= 1 (a token needs context). Nothing selected: (1, 2), one
    column, so the model still runs (under ZeRO-3 a forward is a collective: a rank that
    skipped it would leave the others waiting) and scores nothing."""
    if positions.shape[1] < 2:
        raise ValueError(f"{positions.shape[1]} column(s): a scored token needs one before it")
    # both ends in one device -> host read (not nonzero() and two int()s: three waits)
    used = positions.any(dim=0)
    width = used.numel()
    columns = torch.arange(width, device=used.device)
    first, last = torch.stack([torch.where(used, columns, width).min(),
                               torch.where(used, columns, -1).max()]).tolist()
    if last < 0:
        return 1, 2
    stop = last + 1
    if first < 1:
        raise ValueError("position 0 has no context; it cannot be a scored token")
    return first, stop


def sequence_logprobs(
    window_logits: Tensor,
    input_ids: Tensor,
    positions: Tensor,
    window: tuple[int, int],
    temperature: float,
    with_entropy: bool,
) -> tuple[Tensor, Tensor]:
    """Scatter per-token log-probs and entropies back to (B, T).

    Args:
        window_logits: (B, stop - first, V) logits of positions first-1 … stop-2, i.e. the
            distributions that produced tokens first … stop-1.
        input_ids: (B, T) tokens.
        positions: (B, T) bool, the tokens to score; others come back as 0.
        window: (first, stop) from ``response_window(positions)``.
    Returns:
        logprobs (B, T) fp32 and entropy (B, T) fp32 (zeros unless ``with_entropy``).
    """
    first, stop = window
    rows, width, vocab = window_logits.shape
    targets = input_ids[:, first:stop].reshape(-1)  # (B * K,)
    index = positions[:, first:stop].reshape(-1).nonzero().squeeze(-1)  # (M,)
    logprob, entropy = TokenLogProb.apply(
        window_logits.reshape(-1, vocab), targets, index, float(temperature), with_entropy
    )
    pad = (first, input_ids.shape[1] - stop)

    def scatter(values: Tensor) -> Tensor:
        flat = torch.zeros(rows * width, dtype=torch.float32, device=values.device)
        return F.pad(flat.index_put((index,), values).view(rows, width), pad)

    return scatter(logprob), scatter(entropy)


def choice_logits(window_logits: Tensor, choice_tokens: Tensor, window: tuple[int, int],
                  temperature: float) -> Tensor:
    """(B, T, C) fp32: z / T of each legal token at each branching point of constrained
    decoding (``TrajectoryBatch.choice_tokens``, -1 padded; 0 there and outside the window),
    gathered from the window's logits with their gradient (roll/algorithms/choices.py)."""
    first, stop = window
    gathered = window_choice_logits(window_logits, choice_tokens[:, first:stop], temperature)
    return F.pad(gathered, (0, 0, first, choice_tokens.shape[1] - stop))


def window_choice_logits(window_logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """``choice_logits`` on the window's own columns: (B, K, C) fp32 z / T of each legal token
    of ``tokens`` (B, K, C), -1 padded (0 there), from the window's logits (B, K, V)."""
    gathered = window_logits.gather(-1, tokens.clamp(min=0)).float() / temperature
    return torch.where(tokens >= 0, gathered, torch.zeros_like(gathered))


__all__ = ["CHUNK_BYTES", "FusedTokenLogProb", "TokenLogProb", "behaviour_logprobs",
           "choice_logits", "response_window", "sequence_logprobs", "window_choice_logits",
           "with_old_of_rows"]
