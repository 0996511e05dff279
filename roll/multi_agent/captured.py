"""Training micro-batches replayed from captured CUDA graphs (``trainer.capture``).

Why. At the default micro-batch of 8 rows the compiled train step of a 0.6B model is bound by
the host: ~4,240 kernel launches a micro-batch, the GPU busy a quarter of the step (12-18% MFU
on an H200), while the same micro-batches replayed from one CUDA graph each reach ~35% MFU
(benchmarks/README.md, ``train_capture.py``). torch.compile's own CUDA graphs cannot replay the
per-layer compiled backward (session 68), so the trainer records a whole micro-batch's forward,
loss and backward itself.

What a graph needs: static shapes and no host reads. So, per micro-batch:

- its rows are padded to ``micro_batch_size`` (copies of its first row, weight 0) and its
  columns up to the grid of ``BUCKET``; the scored window starts at the first response column
  rounded down to the grid of ``START_BUCKET`` (``grid``: at most 1/8 padding on long rows):
  one graph per (width, window start, legal-token width) bucket, at most ``MAX_GRAPHS``
  (later buckets run the same step without a graph, counted);
- every window position is scored (``FusedTokenLogProb``: log-prob and entropy of all of
  them in one compiled function each way; the mask weighs them), so the number of scored
  tokens is static;
- the loss is summed per ROW, each row weighted by its own agent's mini-batch normaliser
  (1 / its agent's response tokens), so one graph serves any mix of agents: the sum over an
  agent's rows is the eager path's per-agent token-mean term (trainer.py ``_loss``), and the
  per-agent metric sums are an ``index_add`` by agent into a buffer that stays on the device
  (the host reads each micro-batch's window once per round, all together, not per replay);
- gradients accumulate in place into the team's buffer (team_factors.py), which the graph
  writes like the eager backward does.

Supported: the PPO loss with ``loss_agg_mode='token-mean'``, the KL-to-reference and entropy
terms, dual clip, and where answers are constrained the legal-move entropy and magnet terms
and ``policy_over='moves'`` (each row's sum over its branching points / its agent's
decisions; the legal tokens padded to a power of two, a third part of the bucket). Other
aggregations, a shared prefix, DeepSpeed and data-parallel ranks run uncaptured
(``capture_refusal`` names the reason). On the CPU there is no graph: the same padded per-row
step runs eagerly (what the tests compare against the eager trainer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from roll.algorithms.choices import (
    choice_entropy,
    choice_kl,
    choice_logprobs,
    choice_reverse_kl,
    move_logprobs,
    points,
)
from roll.algorithms.losses import approx_kl_terms, kl_per_token, ppo_token_terms, row_means
from roll.batch import TrajectoryBatch
from roll.multi_agent.config import TrainerConfig
from roll.multi_agent.logprobs import FusedTokenLogProb, window_choice_logits
from roll.utils.stages import log_line
from roll.utils.transfer import upload

BUCKET = 64
"""Widths are multiples of this many columns, or of an eighth of their power of two when that
is more (one graph per bucket; at most 1/8 of the columns padding)."""
START_BUCKET = 32
"""Window starts are multiples of this many columns, or of an eighth of their power of two
when that is more (every column before the first response token is scored for nothing, over
the whole vocabulary)."""
MAX_GRAPHS = 32
"""Buckets captured at most; a micro-batch of a later bucket runs without a graph (counted).
The graphs share one memory pool (one micro-batch's activations, not one per graph)."""


def grid(columns: int, step: int, up: bool) -> int:
    """``columns`` rounded up (or down) to a multiple of ``step`` or, when more, of an eighth
    of the power of two at or below it: 1100 -> 1152 up (steps of 128), 600 -> 576 down."""
    if columns <= 0:
        return 0
    step = max(step, (1 << (columns.bit_length() - 1)) // 8)
    return -(-columns // step) * step if up else columns // step * step


PARTS = ("loss", "policy_loss", "kl_ref", "entropy", "action_entropy", "magnet_kl",
         "clip_frac", "approx_kl")
"""The per-agent sums one replay adds to (trainer.py METRIC_PARTS' terms of this loss)."""
WEIGHTS = ("scale", "bonus", "per_decision", "action_bonus", "own_old")
"""Each agent's weights in a round: 1 / its response tokens in the mini-batch, its token
entropy's weight, 1 / its decisions (rows with a branching point), its legal-move entropy's
weight, 1 where its old log-probs are the forward's own (one optimizer step: trainer.py);
a row reads its own agent's (0 on padding rows)."""


def capture_refusal(config: TrainerConfig, model, strategy) -> str | None:
    """Why this trainer's micro-batches cannot be captured (None: they can)."""
    from roll.multi_agent.strategy import TorchStrategy

    reason = config.capture_refusal()
    if reason:
        return reason
    compiled = model._compiled
    if compiled is None:
        return "trainer.compile is off (rows are routed to their adapters by tensor there)"
    if model.share_prefix:
        return "trainer.share_prefix is on (it reads the rows' common prefix on the host)"
    factors = compiled.factors
    if factors is None or len(factors.stacks) != len(compiled.lora_layers):
        return "the agents' LoRA shapes differ (their factors are not one team buffer)"
    if type(strategy) is not TorchStrategy or strategy.grad_sync is not None:
        return "the strategy is not the torch strategy on one rank"
    return None


@dataclass
class _Bucket:
    """One (width, window start, legal-token width) shape: the step's static inputs and its
    graph."""

    first: int
    input_ids: Tensor  # (R, W) long
    attention_mask: Tensor  # (R, W) long
    agent_id: Tensor  # (R,) long
    mask: Tensor  # (R, W - first) fp32: response tokens of the window; 0 on padding
    advantages: Tensor  # (R, W - first) fp32
    old: Tensor  # (R, W - first) fp32
    ref: Tensor | None  # (R, W - first) fp32, with a KL term
    weights: Tensor  # (R, len(WEIGHTS)) fp32: the row's agent's
    choices: Tensor | None  # (R, W - first, C) long, -1 padded: legal tokens (constrained)
    magnet: Tensor | None  # (R, W - first, C) fp32: the magnet's log-probs, with its term
    old_moves: Tensor | None  # (R, W - first) fp32: old log-probs of the moves (policy_over)
    graph: object = None  # torch.cuda.CUDAGraph once captured


class CapturedSteps:
    """The trainer's micro-batches as replays of captured graphs (module docstring).

    Per round: ``open_round`` (each agent's normaliser and entropy weight), ``run`` per
    micro-batch (forward, loss and backward; gradients into the team's buffer), then
    ``sums`` (each agent's PARTS, device tensors)."""

    def __init__(self, model, config: TrainerConfig, temperature: float,
                 device: torch.device) -> None:
        self.model, self.config, self.temperature = model, config, float(temperature)
        self.rows = config.micro_batch_size
        self.graphs = device.type == "cuda"
        self.device = device
        agents = len(model.agent_names)
        self.acc = torch.zeros(agents, len(PARTS), device=device)
        self.weights = torch.zeros(agents, len(WEIGHTS), device=device)
        self.buckets: dict[tuple[int, int, int], _Bucket] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.captures, self.capture_s, self.uncaptured = 0, 0.0, 0

    def counts(self) -> tuple[int, float, int]:
        """(graphs captured, seconds spent capturing, micro-batches run past ``MAX_GRAPHS``)
        so far."""
        return self.captures, self.capture_s, self.uncaptured

    # ------------------------------------------------------------------ rounds
    def run_round(self, batch: TrajectoryBatch, groups: list, normalisers: dict[str, Tensor],
                  decisions: dict[str, Tensor], bonus: dict[str, float],
                  own_old: set[str] = frozenset()) -> int:
        """One round's micro-batches (``groups`` of (agent, rows), trainer.py's plan), each
        agent's loss normalised by ``normalisers[agent]`` (its legal-move terms by
        ``decisions[agent]``, when the batch has choices), its entropy bonuses weighed by
        ``bonus[agent]`` (the bonus decay's scale), the agents of ``own_old`` reading their
        old log-probs from the forward itself; returns the rows run. ``sums`` then holds the
        round's metrics."""
        self.open_round(normalisers, decisions, bonus, own_old)
        selected = [torch.cat([agent_rows for _, agent_rows in group]) for group in groups]
        # each micro-batch's first response column, all in one host read (not one a replay)
        scored = batch.response_mask.bool()
        columns = torch.arange(scored.shape[1], device=scored.device)
        starts = torch.where(scored, columns, scored.shape[1]).amin(dim=1)  # (B,), T: none
        firsts = torch.stack([starts[rows].min() for rows in selected]).tolist() \
            if selected else []
        for rows, first in zip(selected, firsts, strict=True):
            self.run(batch.select(rows), first)
        return sum(len(rows) for rows in selected)

    def open_round(self, normalisers: dict[str, Tensor], decisions: dict[str, Tensor],
                   bonus: dict[str, float], own_old: set[str] = frozenset()) -> None:
        """This round's per-agent weights (``WEIGHTS``); the metric sums start at 0."""
        cfg, names = self.config, self.model.agent_names
        self.acc.zero_()
        self.weights.zero_()
        coefs = upload([[0.0, cfg.entropy_coef * bonus.get(name, 0.0), 0.0,
                         cfg.action_entropy_coef * bonus.get(name, 0.0),
                         float(name in own_old)] for name in names], torch.float32, self.device)
        self.weights.copy_(coefs)
        for name, normaliser in normalisers.items():
            self.weights[names.index(name), 0] = 1.0 / normaliser
        for name, count in decisions.items():
            self.weights[names.index(name), 2] = 1.0 / count

    def sums(self) -> dict[str, dict[str, Tensor]]:
        """Each agent's sums of this round (device scalars), keyed by PARTS."""
        acc = self.acc.clone()
        return {name: dict(zip(PARTS, acc[index], strict=True))
                for index, name in enumerate(self.model.agent_names)}

    # ------------------------------------------------------------------ one micro-batch
    def run(self, micro: TrajectoryBatch, first: int) -> None:
        """Forward, loss and backward of one micro-batch (at most ``micro_batch_size`` rows)
        whose first response token is in column ``first`` (its width: none): copied into its
        bucket's static inputs, then replayed (or run, without a graph)."""
        width = grid(micro.input_ids.shape[1], BUCKET, up=True)
        if first == 0:
            raise ValueError("position 0 has no context; it cannot be a scored token")
        first = 1 if first >= micro.input_ids.shape[1] else first
        first = max(1, grid(first, START_BUCKET, up=False))
        legal = 0 if micro.choice_tokens is None else micro.choice_tokens.shape[-1]
        legal = 1 << (legal - 1).bit_length() if legal else 0  # a power of two
        key = (width, first, legal)
        bucket = self.buckets.get(key)
        new_kept = False
        if bucket is None:
            bucket = self._bucket(width, first, legal)
            new_kept = len(self.buckets) < MAX_GRAPHS  # (on a CPU too: none kept past it)
            if new_kept:
                self.buckets[key] = bucket
            else:
                self.uncaptured += 1  # run once without a graph, not kept
        self._fill(bucket, micro)
        if new_kept and self.graphs:
            self._capture(bucket)
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            self._step(bucket)

    def _bucket(self, width: int, first: int, legal: int) -> _Bucket:
        cfg, rows, window, device = self.config, self.rows, width - first, self.device

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=device)

        return _Bucket(first, zeros(rows, width, dtype=torch.long),
                       zeros(rows, width, dtype=torch.long), zeros(rows, dtype=torch.long),
                       zeros(rows, window), zeros(rows, window), zeros(rows, window),
                       zeros(rows, window) if cfg.kl_coef > 0 else None,
                       zeros(rows, len(WEIGHTS)),
                       zeros(rows, window, legal, dtype=torch.long) if legal else None,
                       zeros(rows, window, legal) if legal and cfg.magnet_coef > 0 else None,
                       zeros(rows, window) if legal and cfg.policy_over == "moves" else None)

    def _fill(self, bucket: _Bucket, micro: TrajectoryBatch) -> None:
        """The micro-batch's rows into the bucket's inputs; padding rows repeat its first row
        (finite logits) with weight 0, padding columns and legal tokens are masked out."""
        rows, columns = micro.input_ids.shape
        first = bucket.first
        for static, value in ((bucket.input_ids, micro.input_ids),
                              (bucket.attention_mask, micro.attention_mask)):
            static[:rows, :columns].copy_(value)
            static[:rows, columns:].zero_()
            static[rows:].copy_(static[:1].expand(len(static) - rows, -1))
        bucket.agent_id[:rows].copy_(micro.agent_id)
        bucket.agent_id[rows:].copy_(micro.agent_id[:1].expand(len(bucket.agent_id) - rows))
        for static, value, pad in (
                (bucket.mask, micro.response_mask, 0), (bucket.advantages, micro.advantages, 0),
                (bucket.old, micro.old_logprobs, 0), (bucket.ref, micro.ref_logprobs, 0),
                (bucket.choices, micro.choice_tokens, -1),
                (bucket.magnet, micro.magnet_logprobs, 0),
                (bucket.old_moves, micro.old_move_logprobs, 0)):
            if static is None:
                continue
            static.fill_(pad)
            if value is None:  # old log-probs of agents that read the forward's own
                continue
            part = value[:, first:]
            target = static[:rows, :columns - first]
            if part.dim() == 3:  # legal tokens: the batch's own width of them
                target = target[..., :part.shape[-1]]
            target.copy_(part)
        bucket.weights.zero_()
        bucket.weights[:rows].copy_(self.weights[micro.agent_id])

    def _step(self, bucket: _Bucket) -> None:
        """The graph's body: every window token scored, the loss summed per row, backward,
        each agent's sums added to ``acc``. No host read; every shape is the bucket's."""
        cfg, first = self.config, bucket.first
        ids = bucket.input_ids
        rows, width = ids.shape
        logits = self.model._window_logits(ids, bucket.attention_mask, bucket.agent_id,
                                           (first, width))  # (R, W - first, V)
        window = width - first
        logprobs, entropy = FusedTokenLogProb.apply(
            logits.reshape(rows * window, -1), ids[:, first:].reshape(-1), self.temperature,
            cfg.compile_backend)
        logprobs, entropy = logprobs.view(rows, window), entropy.view(rows, window)
        mask = bucket.mask
        keep = mask.bool()
        scale, bonus, per_decision, action_bonus, own_old = bucket.weights.unbind(-1)  # (R,)
        own_old = own_old[:, None] > 0  # (R, 1): this forward's log-probs are the old ones

        def per_row(values: Tensor) -> Tensor:  # (R,): each row's share of its agent's mean
            return torch.where(keep, values, torch.zeros((), device=values.device)).sum(-1) \
                * scale

        zero = torch.zeros_like(scale)
        clip_frac = approx_kl = kl = action_entropy = magnet_kl = zero
        policy = logprobs.sum(-1) * 0.0  # moves without a decision: no term (but a graph)
        tokens = bucket.choices  # (R, W - first, C) legal tokens, or None
        if tokens is not None:  # the legal tokens' logits / T, renormalised at each point
            choice_logits = window_choice_logits(logits, tokens, self.temperature)
            moves = choice_logprobs(choice_logits, tokens)
        if cfg.policy_over == "tokens":
            old = torch.where(own_old, logprobs.detach(), bucket.old)
            per_token, is_clipped, _, log_ratio = ppo_token_terms(
                logprobs, old, bucket.advantages, mask, clip_low=cfg.clip_low,
                clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
            policy = per_row(per_token)
            with torch.no_grad():
                clip_frac = per_row(is_clipped.float())
                approx_kl = per_row(approx_kl_terms(log_ratio))
        elif tokens is not None:  # the moves constrained decoding plays, one weight a decision
            points_mask = points(tokens).float() * mask
            new = move_logprobs(logprobs, choice_logits, tokens, ids[:, first:])
            old = torch.where(own_old, new.detach(), bucket.old_moves)
            per_token, is_clipped, _, log_ratio = ppo_token_terms(
                new, old, bucket.advantages, points_mask, clip_low=cfg.clip_low,
                clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
            policy = torch.where(points_mask.bool(), per_token, 0.0).sum(-1) * per_decision
            with torch.no_grad():
                clip_frac = row_means(is_clipped.float(), points_mask) * per_decision
                approx_kl = row_means(approx_kl_terms(log_ratio), points_mask) * per_decision
        ent = per_row(entropy)
        loss = policy - bonus * ent if cfg.entropy_coef > 0 else policy
        if bucket.ref is not None:
            kl = per_row(kl_per_token(logprobs, bucket.ref.detach(), mask, cfg.kl_estimator))
            loss = loss + cfg.kl_coef * kl
        if tokens is not None:  # the legal-move terms, per decision (trainer._loss)
            action_entropy = choice_entropy(moves, tokens) * per_decision
            if cfg.action_entropy_coef > 0:
                loss = loss - action_bonus * action_entropy
            if bucket.magnet is not None:
                pull = choice_kl if cfg.magnet_kl == "forward" else choice_reverse_kl
                magnet_kl = pull(moves, bucket.magnet, tokens) * per_decision
                loss = loss + cfg.magnet_coef * magnet_kl
        loss.sum().backward()
        with torch.no_grad():
            parts = torch.stack([loss, policy, kl, ent, action_entropy, magnet_kl, clip_frac,
                                 approx_kl], dim=1)  # (R, PARTS)
            self.acc.index_add_(0, bucket.agent_id, parts.detach())

    def _capture(self, bucket: _Bucket) -> None:
        """Warm up on a side stream (compiles, allocator), then record ``_step``. Neither may
        change a gradient or a sum: both are put back (a capture runs nothing)."""
        start = time.perf_counter()
        factors = self.model._compiled.factors
        grads, acc = factors.grads.clone(), self.acc.clone()
        # While a stream captures, transformers always builds the 4-D attention mask (its
        # is_tracing() is true); outside, a mask of ones gives none (a host read decides). The
        # warm-up must compile the variant the capture runs (a compile while capturing fails),
        # so it sees one padded key, the last column of the first row (no row left without one)
        mask = bucket.attention_mask
        last = mask[0, -1].clone()
        mask[0, -1] = 0
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step(bucket)
        torch.cuda.current_stream().wait_stream(stream)
        mask[0, -1] = last
        factors.grads.copy_(grads)
        self.acc.copy_(acc)
        bucket.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(bucket.graph, pool=self.pool):
            self._step(bucket)
        seconds = time.perf_counter() - start
        self.captures += 1
        self.capture_s += seconds
        log_line(f"trainer: captured micro-batch graph {len(self.buckets)} (rows {self.rows}, "
                 f"width {mask.shape[1]}, window from {bucket.first}) in {seconds:.1f} s")


__all__ = ["BUCKET", "MAX_GRAPHS", "PARTS", "grid", "START_BUCKET", "WEIGHTS", "CapturedSteps",
           "capture_refusal"]
