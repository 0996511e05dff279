"""The prefill of admitted prompts, their common leading tokens run once per adapter.

Why: the turns of a game open with the same text (the rules, the answer format), about half of
every Kuhn and Leduc prompt; on a CPU the prefill of those columns is half a rollout's time. With
``share``, a prefill of B prompts whose first P tokens agree runs

    head:  tokens[:P] once per distinct adapter among the rows                    (U, P)
    tail:  each prompt's own tokens, attending to its adapter's head keys/values   (B, W)

Exact up to floating-point order: causal attention makes positions < P independent of what
follows, and a row's prefix under its own adapter is the head row of that adapter. The captured
keys/values then hold, per row, the head's P columns followed by the row's W left-padded
columns, and go into the ring as a plain prefill's do.

Only where it saves work: at least ``MIN_SHARED`` common tokens, more rows than adapters, and
one token of its own left to every prompt (its last token's logits come from the tail).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from roll.inference.hf.ring import CaptureCache, additive_mask
from roll.utils.transfer import upload

if TYPE_CHECKING:
    from roll.inference.hf.engine import HFEngine
    from roll.inference.hf.prefill_graphs import PrefillGraphs

MIN_SHARED = 16
"""Fewer common tokens than this: one plain forward (a second call costs more than it saves)."""


def shared_length(prompts: list[list[int]], adapters: list) -> int:
    """Leading tokens every prompt holds, leaving each at least one of its own; 0 when that is
    fewer than ``MIN_SHARED`` or when there are no more rows than distinct adapters."""
    if len(prompts) <= len(set(adapters)):
        return 0
    # commonprefix compares element by element, lists included
    length = min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)
    return length if length >= MIN_SHARED else 0


class HeadCapture(CaptureCache):
    """The ``past_key_values`` of the tail's forward: each layer's keys/values are the row's
    head copy (``head``'s row ``row_head[b]``) followed by the row's own; both are recorded."""

    def __init__(self, head: CaptureCache, row_head: Tensor) -> None:
        super().__init__()
        self.head, self.row_head = head, row_head  # row_head (B,): the row's head row

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int,
               cache_kwargs=None) -> tuple[Tensor, Tensor]:
        keys = torch.cat([self.head.keys[layer_idx].index_select(0, self.row_head),
                          key_states], dim=2)  # (B, H, P + W, D)
        values = torch.cat([self.head.values[layer_idx].index_select(0, self.row_head),
                            value_states], dim=2)
        return super().update(keys, values, layer_idx)


def prefill(engine: HFEngine, prompts: list[list[int]], adapters: list, share: bool,
            dtype: torch.dtype, graphs: PrefillGraphs | None = None
            ) -> tuple[Tensor, CaptureCache, int, int]:
    """Logits (B, V) at each prompt's last token, and the captured keys/values per layer
    (B, H, P + W, D): columns [0, P) the shared head, [P, P + W) each prompt's own tokens,
    left-padded to W. Returns (logits, capture, P, P + W); P = 0 without sharing. ``graphs``:
    admissions that fit one of its buckets replay a captured graph (prefill_graphs.py; W is
    then the bucket's width and the capture may hold pad rows after the B real ones)."""
    device = engine.device
    shared = shared_length(prompts, adapters) if share else 0
    if not shared and graphs is not None and graphs.fits(prompts):
        logits, capture, width = graphs.run(prompts, adapters)
        return logits, capture, 0, width
    capture = CaptureCache()
    if shared:
        heads = list(dict.fromkeys(adapters))  # distinct adapters, in order of first row
        head = CaptureCache()
        head_ids = upload([prompts[0][:shared]] * len(heads), torch.long, device)  # (U, P)
        head_positions = torch.arange(shared, device=device).expand(len(heads), shared)
        causal = torch.ones(shared, shared, dtype=torch.bool, device=device).tril()
        engine.fused.set_rows(heads)
        engine.forward_last(head_ids, additive_mask(causal.expand(len(heads), 1, -1, -1), dtype),
                            head_positions, head)
        capture = HeadCapture(head, upload([heads.index(a) for a in adapters], torch.long,
                                           device))
    own = [prompt[shared:] for prompt in prompts]
    width = max(len(tokens) for tokens in own)
    input_ids, mask, positions = tail_inputs(engine, own, len(own), width, shared, dtype)
    engine.fused.set_rows(adapters)
    logits = engine.forward_last(input_ids, mask, positions, capture)  # (B, V)
    return logits, capture, shared, shared + width


def tail_inputs(engine: HFEngine, own: list[list[int]], rows: int, width: int, shared: int,
                dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """The forward's inputs for prompts ``own`` (each after ``shared`` head tokens), each
    left-padded to ``width``, in ``rows`` >= len(own) rows (the extra ones all padding, which
    attend to nothing: a finite mask keeps them finite): input_ids (rows, width), the additive
    mask (rows, 1, width, shared + width) and rotary positions (rows, width)."""
    device = engine.device
    input_ids = torch.full((rows, width), engine.pad_id, dtype=torch.long)
    real = torch.zeros(rows, width, dtype=torch.bool)
    for row, tokens in enumerate(own):
        input_ids[row, width - len(tokens):] = torch.tensor(tokens)
        real[row, width - len(tokens):] = True
    input_ids = upload(input_ids, torch.long, device)
    real = upload(real, torch.bool, device)
    positions = shared + (real.long().cumsum(-1) - 1).clamp(min=0)  # (rows, width)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    allowed = causal[None] & real[:, None, :]  # (rows, width, width)
    if shared:  # every row sees the whole head
        allowed = torch.cat([allowed.new_ones(rows, width, shared), allowed], dim=-1)
    return input_ids, additive_mask(allowed[:, None], dtype), positions
