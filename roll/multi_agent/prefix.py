"""The rows' common leading tokens scored once per agent in each forward (``trainer.share_prefix``).

Why: the prompts of a game's turns open with the same text (the rules, the answer format):
about half of every Kuhn and Leduc prompt. A forward of B rows computes those columns B times
over. Here they run once per agent segment, and every row then attends to its agent's copy:

    head:  keys/values of tokens[:P] under agent s's adapter, one row per segment s   (S, P)
    tail:  model(tokens[b, P:]) attending to the head's keys/values of segment(b)     (B, T - P)

Exact up to floating-point order: causal attention makes positions < P independent of what
follows, and each row's prefix under its own adapter is the same computation as its
segment's. Gradients too: the rows' copies of the head's keys/values are an ``index_select``
whose backward sums every row's gradient into its segment's head, which is what B separate
prefixes would have summed into the adapter (tests/multi_agent/test_prefix.py).

How the keys/values reach the layers. Each decoder layer's call is wrapped (``layer_kv``) so
that its attention's ``past_key_values`` is a ``LayerKV`` of that layer alone: the head's forward
records each layer's keys/values in it, the tail's forward puts them before the row's own. A
transformers cache would pick its layer by the attention's layer index; ``LayerKV`` never reads
it, so one compiled graph serves every layer (``trainer.compile``: one graph per kind of
forward, not one per layer). The tail's model-level cache (a ``DynamicCache`` holding the head)
only tells the model the past's length, for positions and the causal mask.

Where it applies: forwards of right-padded rows (prompt at column 0, ``results.pad_rows``)
whose first P >= ``MIN_PREFIX`` columns are equal and attended, with P before the first
scored position; LoRA dropout off (a shared prefix would share one dropout mask among an
agent's rows); not under ZeRO-3 (deepspeed_strategy.py says why). Elsewhere: the plain forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

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


class LayerKV:
    """One decoder layer's keys/values of the shared prefix, in place of its attention's cache:
    empty, it records what the layer computes (the head's forward); holding (rows, heads, P,
    dim) tensors, it puts them before the layer's own (the tail's forward)."""

    def __init__(self, keys: Tensor | None = None, values: Tensor | None = None) -> None:
        self.keys, self.values = keys, values

    def update(self, keys: Tensor, values: Tensor, layer_idx: int, *args, **kwargs
               ) -> tuple[Tensor, Tensor]:
        """transformers' ``Cache.update``; the layer index is not read (see the module)."""
        if self.keys is None:
            self.keys, self.values = keys, values
            return keys, values
        return torch.cat([self.keys, keys], -2), torch.cat([self.values, values], -2)


@contextmanager
def layer_kv(layers: Sequence[nn.Module], per_layer: Sequence[LayerKV] | None) -> Iterator[None]:
    """While active, layer i's ``past_key_values`` is ``per_layer[i]`` (None: as they are).
    The wrapper goes around what the layer runs now (its compiled call inside
    ``CompiledLayers.active``, else its own), so the object enters a compiled graph as an
    argument, not as a constant of it."""
    if per_layer is None:
        yield
        return
    previous = [layer._compiled_call_impl for layer in layers]
    for layer, call, kv in zip(layers, previous, per_layer, strict=True):
        layer._compiled_call_impl = functools.partial(_with_kv, call or layer._call_impl, kv)
    try:
        yield
    finally:
        for layer, call in zip(layers, previous, strict=True):
            layer._compiled_call_impl = call


def _with_kv(call: Callable, kv: LayerKV, *args, **kwargs):
    kwargs["past_key_values"] = kv
    return call(*args, **kwargs)


RoutedForward = Callable[[Tensor, Tensor, "Tensor | None", dict, "list[LayerKV]"], Tensor]
"""(input_ids, attention_mask, agent_id or None, kwargs, per-layer keys/values) -> logits: the
model's forward, each row through its agent's adapter (eager or compiled), with ``layer_kv``."""


def prefix_logits(forward: RoutedForward, num_layers: int, input_ids: Tensor,
                  attention_mask: Tensor, agent_id: Tensor | None, length: int,
                  keep: tuple[int, int], kwargs: dict) -> Tensor:
    """Logits (B, stop - first, V) of the positions ``keep`` = (first, stop) of the full rows,
    their first ``length`` columns run once per agent segment (once for the reference,
    ``agent_id`` None). ``kwargs`` are the plain forward's; ``use_cache``, ``logits_to_keep``
    and ``past_key_values`` are set here."""
    from transformers.cache_utils import DynamicCache

    first, stop = keep
    device = input_ids.device
    if agent_id is None:
        starts = torch.zeros(1, dtype=torch.long, device=device)
        owner = torch.zeros(input_ids.shape[0], dtype=torch.long, device=device)
    else:
        new = torch.ones_like(agent_id, dtype=torch.bool)
        new[1:] = agent_id[1:] != agent_id[:-1]  # the first row of each run of one agent
        starts, owner = new.nonzero().flatten(), new.long().cumsum(0) - 1  # (S,), (B,)
    if len(starts) == 1:  # one segment runs as two rows, the copy unused (compiled.py's
        starts = starts.repeat(2)  # "logits" says why a size of 1 is avoided)
    head = input_ids[starts, :length]  # (S, P)
    plain = {key: value for key, value in kwargs.items()
             if key not in ("use_cache", "logits_to_keep", "past_key_values")}
    takes_keep = "logits_to_keep" in kwargs
    record = [LayerKV() for _ in range(num_layers)]
    forward(head, torch.ones_like(head), None if agent_id is None else agent_id[starts],
            dict(plain, use_cache=False, **({"logits_to_keep": 1} if takes_keep else {})),
            record)
    past, rows_kv = DynamicCache(), []
    for index, layer in enumerate(record):
        keys, values = layer.keys.index_select(0, owner), layer.values.index_select(0, owner)
        past.update(keys, values, index)  # the past's length, for positions and the mask
        rows_kv.append(LayerKV(keys, values))
    tail = dict(plain, use_cache=True, past_key_values=past)
    if takes_keep:
        tail["logits_to_keep"] = torch.arange(first - 1 - length, stop - 1 - length,
                                              device=device)
    logits = forward(input_ids[:, length:], attention_mask, agent_id, tail, rows_kv)
    return logits if takes_keep else logits[:, first - 1 - length : stop - 1 - length]


__all__ = ["MIN_PREFIX", "LayerKV", "common_prefix", "layer_kv", "prefix_logits"]
