"""What a training step reports about its rollout phase and its log-prob passes.

- ``rollout_phase_metrics``: decode figures of the phase (tok/s over what it decoded, lanes,
  decode steps, busy lanes), from the rollout's metrics and the engine's ``last_serve``.
- ``capture_metrics``: what ``trainer.capture`` did in the step (graphs captured, seconds,
  micro-batches past its cap).
- ``logprob_metrics``: how far the engine's log-probs are from the trainer's recomputed ones
  (a check that the engine served the trainer's weights; turns played ahead apart: how far one
  update moved them), and the KL to the reference model.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from roll.agentic.rollout.results import Turn
from roll.algorithms.losses import kl_per_token
from roll.batch import TrajectoryBatch
from roll.inference.hf.continuous import HOST_PARTS


def rollout_phase_metrics(rollout: dict[str, float], served: dict[str, int],
                          seconds: float) -> dict[str, float]:
    """``rollout/tokens_per_s`` over what the phase decoded (with lookahead: the next step's
    turns too) and, when the engine served anything this phase (a step whose episodes were
    all played ahead serves nothing), its lanes, decode steps, prefills, CUDA graph captures
    so far, ``rollout/shared_tokens`` (prompt tokens a prefill's shared head saved), the
    prefills a graph's bucket served (``rollout/prefill_replays``; the others ran eagerly), the
    prefill graphs the phase captured and the seconds they took (``rollout/prefill_captures``,
    ``rollout/prefill_capture_s``: part of ``serve_admit_s``),
    ``rollout/serve_<part>_s`` (where the serve loop's host time went: hf/continuous.py
    HOST_PARTS), and
    ``rollout/busy_lanes``: rows decoding per decode step on average (each request's first
    token comes from its prefill), where a rollout's tail shows as idle lanes.
    """
    decoded = rollout["rollout/decoded_tokens"]
    out = {"rollout/tokens_per_s": decoded / max(seconds, 1e-9)}
    if not (served and decoded):
        return out
    for name in ("lanes", "decode_steps", "prefills", "graph_captures", "shared_tokens",
                 "prefill_replays", "prefill_captures", "prefill_capture_s"):
        if name in served:  # vLLM reports no prefills or graph captures
            out[f"rollout/{name}"] = float(served[name])
    for part in HOST_PARTS:  # where the serve loop's host time went (hf engine)
        if f"{part}_s" in served:
            out[f"rollout/serve_{part}_s"] = float(served[f"{part}_s"])
    if served.get("decode_steps") and "served" in served:
        out["rollout/busy_lanes"] = (decoded - served["served"]) / served["decode_steps"]
    return out


def capture_metrics(before: tuple[int, float, int], after: tuple[int, float, int]
                    ) -> dict[str, float]:
    """The step's share of ``CapturedSteps.counts`` (taken before and after its update):
    ``compile/train_captures`` (micro-batch graphs captured: a first step's, or a new bucket's
    later), ``compile/train_capture_s`` (their warm-up and capture, part of ``time/train``) and
    ``compile/train_uncaptured`` (micro-batches of a shape past ``MAX_GRAPHS``, run without a
    graph: a run that keeps meeting new shapes)."""
    return {"compile/train_captures": float(after[0] - before[0]),
            "compile/train_capture_s": after[1] - before[1],
            "compile/train_uncaptured": float(after[2] - before[2])}


def logprob_metrics(batch: TrajectoryBatch, turns: Sequence[Turn], comparable: bool,
                    stale: bool = False) -> dict[str, float]:
    """After the old-log-prob (and reference) pass. ``comparable``: the engine reports the
    trainer's definition of a log-prob (builders.engine_reports_policy_logprobs); then
    ``rollout/engine_logprob_gap`` is the mean |old - engine| per response token over rows
    generated this step (when any), and ``rollout/ahead_logprob_gap`` the same over rows
    played ahead (``Turn.ahead``, or every row when ``stale``: a rollout played while the step
    before trained, rollout.overlap; the batch's rows are the trained turns in ``turns``
    order)."""
    mask = batch.response_mask
    out: dict[str, float] = {}
    if comparable:
        gap = (batch.old_logprobs - batch.engine_logprobs).abs() * mask
        ahead = torch.tensor([stale or t.ahead for t in turns if t.trained_agent is not None],
                             device=gap.device)[:, None]
        fresh, stale = mask * ~ahead, mask * ahead
        if fresh.any():  # none when every row was played ahead
            out["rollout/engine_logprob_gap"] = float((gap * fresh).sum() / fresh.sum())
        if ahead.any():
            out["rollout/ahead_logprob_gap"] = float((gap * stale).sum()
                                                     / stale.sum().clamp(min=1))
    if batch.ref_logprobs is not None:
        out["team/kl_ref"] = float(
            kl_per_token(batch.old_logprobs, batch.ref_logprobs, mask, "k3").sum()
            / mask.sum().clamp(min=1))
    return out
