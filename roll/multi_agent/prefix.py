"""The rows' common leading tokens scored once per agent in each forward (``trainer.share_prefix``).

Why: the prompts of a game's turns open with the same text (the rules, the answer format):
about half of every Kuhn and Leduc prompt. A forward of B rows computes those columns B times
over. Here they run once per agent segment, and every row then attends to its agent's copy from
a KV cache:

    prefix:  h_s = model(tokens[:P]) under agent s's adapter, one row per segment s  (S, P)
    suffix:  model(tokens[b, P:], past = h_{segment(b)})                           (B, T - P)

Exact up to floating-point order: causal attention makes positions < P independent of what
follows, and each row's prefix under its own adapter is the same computation as its
segment's. Gradients too: the cache's copies are an ``index_select`` whose backward sums every
row's gradient into its segment's prefix, which is what B separate prefixes would have summed
into the adapter (tested against the plain forward, tests/multi_agent/test_prefix.py).

Where it applies: the eager forwards (training, old-log-prob, reference) of right-padded rows
(prompt at column 0, ``results.pad_rows``) whose first P columns are equal and attended, with P
before the first scored position; LoRA dropout off (a shared prefix would share one dropout
mask among an agent's rows); a plain ``DynamicCache`` (no sliding layers). Elsewhere the
forward is the plain one. The compiled forwards (``trainer.compile``) do not share yet.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from roll.multi_agent.routing import agent_segments, segment_lora

MIN_PREFIX = 16
"""Fewer common tokens than this: the plain forward (two calls would cost more than they save)."""


def common_prefix(input_ids: Tensor, attention_mask: Tensor, limit: int) -> int:
    """Leading columns (at most ``limit``) in which every row holds row 0's token and attends
    to it; 0 when that is fewer than ``MIN_PREFIX`` or there is one row only."""
    if input_ids.shape[0] < 2 or limit < MIN_PREFIX:
        return 0
    head = input_ids[:, :limit]
    same = (head == head[:1]).all(0) & attention_mask[:, :limit].bool().all(0)  # (limit,)
    differs = (~same).nonzero()
    length = int(differs[0]) if len(differs) else limit
    return length if length >= MIN_PREFIX else 0


def prefix_logits(peft_model: nn.Module, lora_layers, agent_names, input_ids: Tensor,
                  attention_mask: Tensor, agent_id: Tensor | None, length: int,
                  keep: tuple[int, int], kwargs: dict) -> Tensor | None:
    """Logits (B, stop - first, V) of the positions ``keep`` = (first, stop) of the full rows,
    the first ``length`` columns run once per agent segment (once for the reference,
    ``agent_id`` None, called inside the model's adapters-off context); None when the model's
    cache cannot be shared (the caller then runs the plain forward). ``kwargs`` are the plain
    forward's (``use_cache`` and ``logits_to_keep`` are set here)."""
    from transformers.cache_utils import DynamicCache

    first, stop = keep
    rows = input_ids.shape[0]
    if agent_id is None:
        segments, starts = None, torch.zeros(1, dtype=torch.long, device=input_ids.device)
        owner = torch.zeros(rows, dtype=torch.long, device=input_ids.device)
    else:
        segments = agent_segments(agent_id.tolist(), agent_names)
        starts = torch.tensor([start for _, start, _ in segments], device=input_ids.device)
        owner = torch.repeat_interleave(
            torch.arange(len(segments), device=input_ids.device),
            torch.tensor([stop_ - start for _, start, stop_ in segments],
                         device=input_ids.device))  # (B,) each row's segment
    head = input_ids[starts, :length]  # (S, P)
    plain = {key: value for key, value in kwargs.items()
             if key not in ("use_cache", "logits_to_keep", "adapter_names")}
    head_kwargs = dict(plain, use_cache=True)
    tail_kwargs = dict(plain, use_cache=True)
    if "adapter_names" in kwargs:  # PEFT adds no LoRA of its own: the hooks add each agent's
        head_kwargs["adapter_names"] = ["__base__"] * len(starts)
        tail_kwargs["adapter_names"] = ["__base__"] * rows
    takes_keep = "logits_to_keep" in kwargs
    if takes_keep:
        head_kwargs["logits_to_keep"] = 1
        tail_kwargs["logits_to_keep"] = torch.arange(first - 1 - length, stop - 1 - length,
                                                     device=input_ids.device)
    each = [(name, index, index + 1) for index, (name, _, _) in enumerate(segments or [])]
    with _routed(lora_layers, each):
        cache = peft_model(input_ids=head, attention_mask=torch.ones_like(head),
                           **head_kwargs).past_key_values
    if type(cache) is not DynamicCache or any(layer.is_sliding for layer in cache.layers):
        return None
    cache.reorder_cache(owner)  # (S, H, P, D) -> (B, H, P, D), differentiable
    with _routed(lora_layers, segments):
        logits = peft_model(input_ids=input_ids[:, length:], attention_mask=attention_mask,
                            past_key_values=cache, **tail_kwargs).logits
    if not takes_keep:
        logits = logits[:, first - 1 - length : stop - 1 - length]
    return logits


def _routed(lora_layers, segments):
    """Each segment's rows through its agent's adapter (``segment_lora``); None: as is."""
    from contextlib import nullcontext

    return nullcontext() if segments is None else segment_lora(lora_layers, segments)


__all__ = ["MIN_PREFIX", "common_prefix", "prefix_logits"]
