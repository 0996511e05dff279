"""Training micro-batches replayed from captured CUDA graphs (``trainer.capture``).

Why. At the default micro-batch of 8 rows the compiled train step of a 0.6B model is bound by
the host: ~4,240 kernel launches a micro-batch, the GPU busy a quarter of the step (12-18% MFU
on an H200), while the same micro-batches replayed from one CUDA graph each reach ~35% MFU
(benchmarks/README.md, ``train_capture.py``). torch.compile's own CUDA graphs cannot replay the
per-layer compiled backward (session 68), so the trainer records a whole micro-batch's forward,
loss and backward itself.

What a graph needs: static shapes and no host reads. So, per micro-batch:

- its rows are padded to ``micro_batch_size`` (copies of its first row, weight 0) and its
  columns to a multiple of ``BUCKET``; the scored window starts at the first response column
  rounded down to a multiple of ``BUCKET``: one graph per (rows, width, window start) bucket,
  at most ``MAX_GRAPHS`` (later buckets run the same step without a graph, counted);
- every window position is scored (``TokenLogProb`` over all of them; the mask weighs them),
  so the number of scored tokens is static;
- the loss is summed per ROW, each row weighted by its own agent's mini-batch normaliser
  (1 / its agent's response tokens), so one graph serves any mix of agents: the sum over an
  agent's rows is the eager path's per-agent token-mean term (trainer.py ``_loss``), and the
  per-agent metric sums are an ``index_add`` by agent into a buffer that stays on the device;
- gradients accumulate in place into the team's buffer (team_factors.py), which the graph
  writes like the eager backward does.

Supported: the token-level PPO loss with ``loss_agg_mode='token-mean'``, the KL-to-reference
and entropy terms, dual clip; the legal-move terms, ``policy_over='moves'``, other
aggregations, a shared prefix, DeepSpeed and data-parallel ranks run uncaptured
(``capture_refusal`` names the reason). On the CPU there is no graph: the same padded per-row
step runs eagerly (what the tests compare against the eager trainer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from roll.algorithms.losses import kl_per_token, ppo_token_terms
from roll.batch import TrajectoryBatch
from roll.multi_agent.config import TrainerConfig
from roll.multi_agent.logprobs import TokenLogProb, response_window
from roll.utils.stages import log_line
from roll.utils.transfer import upload

BUCKET = 64
"""Widths and window starts are multiples of this many columns (one graph per bucket)."""
MAX_GRAPHS = 16
"""Buckets captured at most; a micro-batch of a later bucket runs without a graph."""
PARTS = ("loss", "policy_loss", "kl_ref", "entropy", "clip_frac", "approx_kl")
"""The per-agent sums one replay adds to (trainer.py METRIC_PARTS' terms of this loss)."""


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
    """One (rows, width, window start) shape: the step's static inputs and its graph."""

    first: int
    input_ids: Tensor  # (R, W) long
    attention_mask: Tensor  # (R, W) long
    agent_id: Tensor  # (R,) long
    mask: Tensor  # (R, W - first) fp32: response tokens of the window; 0 on padding
    advantages: Tensor  # (R, W - first) fp32
    old: Tensor  # (R, W - first) fp32
    ref: Tensor | None  # (R, W - first) fp32, with a KL term
    scale: Tensor  # (R,) fp32: 1 / the row's agent's mini-batch tokens; 0 on padding rows
    bonus: Tensor  # (R,) fp32: the row's agent's entropy weight (coef x bonus scale)
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
        self.scale = torch.zeros(agents, device=device)
        self.bonus = torch.zeros(agents, device=device)
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.captures, self.capture_s, self.uncaptured = 0, 0.0, 0

    # ------------------------------------------------------------------ rounds
    def run_round(self, batch: TrajectoryBatch, groups: list, normalisers: dict[str, Tensor],
                  bonus: dict[str, float]) -> int:
        """One round's micro-batches (``groups`` of (agent, rows), trainer.py's plan), each
        agent's loss normalised by ``normalisers[agent]`` and its entropy weighed by
        ``bonus[agent]``; returns the rows run. ``sums`` then holds the round's metrics."""
        self.open_round(normalisers, bonus)
        rows = 0
        for group in groups:
            micro = batch.select(torch.cat([agent_rows for _, agent_rows in group]))
            rows += len(micro)
            self.run(micro)
        return rows

    def open_round(self, normalisers: dict[str, Tensor], bonus: dict[str, float]) -> None:
        """This round's per-agent weights; the metric sums start at 0."""
        self.acc.zero_()
        self.scale.zero_()
        names = self.model.agent_names
        for name, normaliser in normalisers.items():
            self.scale[names.index(name)] = 1.0 / normaliser
        self.bonus.copy_(upload([bonus.get(name, 0.0) for name in names], torch.float32,
                                self.device))

    def sums(self) -> dict[str, dict[str, Tensor]]:
        """Each agent's sums of this round (device scalars), keyed by PARTS."""
        acc = self.acc.clone()
        return {name: dict(zip(PARTS, acc[index], strict=True))
                for index, name in enumerate(self.model.agent_names)}

    # ------------------------------------------------------------------ one micro-batch
    def run(self, micro: TrajectoryBatch) -> None:
        """Forward, loss and backward of one micro-batch (at most ``micro_batch_size`` rows):
        copied into its bucket's static inputs, then replayed (or run, without a graph)."""
        width = -(-micro.input_ids.shape[1] // BUCKET) * BUCKET
        first, _ = response_window(micro.response_mask.bool())  # one host read
        first = max(1, first // BUCKET * BUCKET)
        bucket = self.buckets.get((width, first))
        if bucket is None:
            bucket = self._bucket(width, first, self.config.kl_coef > 0)
            if self.graphs and len(self.buckets) >= MAX_GRAPHS:
                self._fill(bucket, micro)
                self.uncaptured += 1
                self._step(bucket)
                return
            self.buckets[(width, first)] = bucket
            self._fill(bucket, micro)
            if self.graphs:
                self._capture(bucket)
        else:
            self._fill(bucket, micro)
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            self._step(bucket)

    def _bucket(self, width: int, first: int, with_ref: bool) -> _Bucket:
        rows, window, device = self.rows, width - first, self.device

        def zeros(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=device)

        return _Bucket(first, zeros(rows, width, dtype=torch.long),
                       zeros(rows, width, dtype=torch.long), zeros(rows, dtype=torch.long),
                       zeros(rows, window), zeros(rows, window), zeros(rows, window),
                       zeros(rows, window) if with_ref else None, zeros(rows), zeros(rows))

    def _fill(self, bucket: _Bucket, micro: TrajectoryBatch) -> None:
        """The micro-batch's rows into the bucket's inputs; padding rows repeat its first row
        (finite logits) with weight 0, padding columns are masked out."""
        rows, columns = micro.input_ids.shape
        first = bucket.first
        for static, value in ((bucket.input_ids, micro.input_ids),
                              (bucket.attention_mask, micro.attention_mask)):
            static[:rows, :columns].copy_(value)
            static[:rows, columns:].zero_()
            static[rows:].copy_(static[:1].expand(len(static) - rows, -1))
        bucket.agent_id[:rows].copy_(micro.agent_id)
        bucket.agent_id[rows:].copy_(micro.agent_id[:1].expand(len(bucket.agent_id) - rows))
        for static, value in ((bucket.mask, micro.response_mask),
                              (bucket.advantages, micro.advantages),
                              (bucket.old, micro.old_logprobs), (bucket.ref, micro.ref_logprobs)):
            if static is None:
                continue
            static.zero_()
            static[:rows, :columns - first].copy_(value[:, first:])
        bucket.scale.zero_()
        bucket.scale[:rows].copy_(self.scale[micro.agent_id])
        bucket.bonus.copy_(self.bonus[bucket.agent_id])

    def _step(self, bucket: _Bucket) -> None:
        """The graph's body: every window token scored, the loss summed per row, backward,
        each agent's sums added to ``acc``. No host read; every shape is the bucket's."""
        cfg, first = self.config, bucket.first
        ids = bucket.input_ids
        rows, width = ids.shape
        logits = self.model._window_logits(ids, bucket.attention_mask, bucket.agent_id,
                                           (first, width))  # (R, W - first, V)
        window = width - first
        scored = torch.arange(rows * window, device=ids.device)
        logprobs, entropy = TokenLogProb.apply(
            logits.reshape(rows * window, -1), ids[:, first:].reshape(-1), scored,
            self.temperature, True)
        logprobs, entropy = logprobs.view(rows, window), entropy.view(rows, window)
        mask = bucket.mask
        per_token, is_clipped, _, log_ratio = ppo_token_terms(
            logprobs, bucket.old, bucket.advantages, mask, clip_low=cfg.clip_low,
            clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
        keep = mask.bool()
        scale = bucket.scale

        def per_row(values: Tensor) -> Tensor:  # (R,): each row's share of its agent's mean
            return torch.where(keep, values, torch.zeros((), device=values.device)).sum(-1) \
                * scale

        policy = per_row(per_token)
        ent = per_row(entropy)
        loss = policy - bucket.bonus * ent if cfg.entropy_coef > 0 else policy
        kl = torch.zeros_like(policy)
        if bucket.ref is not None:
            kl = per_row(kl_per_token(logprobs, bucket.ref.detach(), mask, cfg.kl_estimator))
            loss = loss + cfg.kl_coef * kl
        loss.sum().backward()
        with torch.no_grad():
            ratio = torch.exp(log_ratio)
            parts = torch.stack([loss, policy, kl, ent, per_row(is_clipped.float()),
                                 per_row((ratio - 1.0) - log_ratio)], dim=1)  # (R, PARTS)
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


__all__ = ["BUCKET", "MAX_GRAPHS", "PARTS", "CapturedSteps", "capture_refusal"]
