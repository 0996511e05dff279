"""The KV stores and the decode attention of continuous batching (continuous.py).

``RingCache`` holds, per layer, (lanes, kv heads, capacity, head dim) keys and values; every
decode step writes one column for every lane. ``CaptureCache`` records a prefill's keys and
values for copying into the ring. Both are duck-typed ``past_key_values`` for transformers
models: the engine passes positions and a ready 4D mask, so nothing else of a Cache is read.
``ring_decode_attention`` is registered with transformers for the decode step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class RingCache:
    """The ``past_key_values`` of a decode step: per layer (lanes, kv heads, capacity, head
    dim) keys and values; ``update`` writes the step's one token at ``column`` for every lane
    and returns the whole ring (the mask says which columns each lane sees).

    Each layer's keys and values are tensors of their own, not views of one stacked tensor: a
    compiled step that writes into a view of its input copies the whole base tensor back
    (measured on an H100: 0.7 ms per layer and step at 64 lanes, 45 ms a step)."""

    is_compileable = False

    def __init__(self, layers: int, lanes: int, heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (lanes, heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # (1,) write column

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int,
               cache_kwargs=None) -> tuple[Tensor, Tensor]:
        self.keys[layer_idx].index_copy_(2, self.column, key_states)  # (lanes, H, 1, D)
        self.values[layer_idx].index_copy_(2, self.column, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # never read: the engine passes positions and a ready 4D mask

    def write(self, capture: CaptureCache, lanes: Tensor, columns: Tensor, rows: Tensor,
              positions: Tensor) -> None:
        """Copy prefilled keys/values into the ring, one indexed copy per layer: token p of the
        flattened index tensors (P,) goes from ``capture``'s (row, position) to this ring's
        (lane, column)."""
        for layer, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            keys[lanes, :, columns] = capture.keys[layer][rows, :, positions]  # (P, H, D)
            values[lanes, :, columns] = capture.values[layer][rows, :, positions]

    def unroll(self, capacity: int, order: Tensor) -> None:
        """Grow every layer to ``capacity`` columns: old column ``order[i]`` becomes column i,
        the new columns (zeros) follow."""
        for layers in (self.keys, self.values):
            for layer, ring in enumerate(layers):  # (lanes, H, C, D)
                grown = ring.new_zeros(*ring.shape[:2], capacity, ring.shape[-1])
                grown[:, :, :len(order)] = ring.index_select(2, order)
                layers[layer] = grown


RING_ATTENTION = "roll_ring_decode"
"""Name under which ``ring_decode_attention`` is registered with transformers."""


COLUMN_ALIGN = 16
"""Ring capacities are multiples of this, so the mask's rows are aligned for the fused
attention kernels (for its memory-efficient kernel torch pads a copy of a misaligned mask, in
every layer and step). Not measured on its own: the cost is at most 15 idle columns a lane."""


def aligned_columns(columns: int) -> int:
    """``columns`` rounded up to a multiple of ``COLUMN_ALIGN``."""
    return -(-columns // COLUMN_ALIGN) * COLUMN_ALIGN


def ring_decode_attention(module, query: Tensor, key: Tensor, value: Tensor,
                          attention_mask: Tensor, dropout: float = 0.0,
                          scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """Attention of one new token per lane over the whole ring, grouped-query without copying
    keys/values per query head (transformers' sdpa path repeats them when a mask is given,
    which at decode costs more than the attention itself).

    The G = Hq / Hkv query heads that share a kv head are laid out as G query positions of that
    head, so one fused attention kernel (``scaled_dot_product_attention``) reads each lane's
    keys and values once. (Two batched matmuls did the same sums, but cuBLAS runs a
    (G x D) @ (D x C) product per lane and head with a slow fp32 kernel: 150 µs a layer at 64
    lanes on an H100, more than half of the decode step.)

    query (B, Hq, 1, D); key/value (B, Hkv, C, D); attention_mask (B, 1, 1, C) additive.
    Query head h reads kv head h // (Hq / Hkv), as transformers' ``repeat_kv`` arranges them.
    Returns (B, 1, Hq, D), the layout the attention modules expect.
    """
    batch, query_heads, length, head_dim = query.shape
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, query_heads // kv_heads * length, head_dim)
    out = torch.nn.functional.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling)  # (B, Hkv, G, D)
    return out.reshape(batch, query_heads, length, head_dim).transpose(1, 2), None


def ring_decode_attention_triton(module, query: Tensor, key: Tensor, value: Tensor,
                                 attention_mask: Tensor, dropout: float = 0.0,
                                 scaling: float | None = None, **kwargs) -> tuple[Tensor, None]:
    """``ring_decode_attention``'s contract through the Triton kernel of attention_kernel.py,
    which loads only the key/value columns a lane's mask lets it see. One token per lane."""
    from roll.inference.hf.attention_kernel import ring_attention

    batch, query_heads, length, head_dim = query.shape
    if length != 1:
        raise ValueError(f"the Triton ring attention decodes one token per lane, not {length}")
    scale = scaling if scaling is not None else head_dim ** -0.5
    out = ring_attention(query[:, :, 0], key, value, attention_mask[:, 0, 0], scale)
    return out[:, None], None  # (B, 1, Hq, D)


ATTENTION_KERNELS = {"sdpa": RING_ATTENTION, "triton": RING_ATTENTION + "_triton"}
"""The decode attention's implementations (``HFEngine(attention_kernel=...)``): one fused
``scaled_dot_product_attention`` over the whole cache, or the Triton kernel that never loads
the columns a lane cannot see (attention_kernel.py; the pipeline's default on CUDA)."""


def register_ring_attention() -> None:
    """Make the decode attentions selectable as ``config._attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_KERNELS["sdpa"], ring_decode_attention)
    AttentionInterface.register(ATTENTION_KERNELS["triton"], ring_decode_attention_triton)


@contextmanager
def decode_attention(model: nn.Module, kernel: str = "sdpa") -> Iterator[None]:
    """The model's attention layers run the decode attention ``kernel`` (ATTENTION_KERNELS)
    inside (one new token per row, a ready 4D additive mask); set outside a compiled or
    captured step, so the step sees one value throughout."""
    register_ring_attention()
    config = model.config
    usual, config._attn_implementation = config._attn_implementation, ATTENTION_KERNELS[kernel]
    try:
        yield
    finally:
        config._attn_implementation = usual


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean 'may attend' (…, q, k) → the additive float mask the model adds to scores
    (a large negative, not -inf, so a row that may attend nothing stays finite)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)


class CaptureCache:
    """The ``past_key_values`` of a prefill: no past; records each layer's keys and values
    (rows, kv heads, width, head dim) for copying into the ring."""

    is_compileable = False

    def __init__(self) -> None:
        self.keys: dict[int, Tensor] = {}
        self.values: dict[int, Tensor] = {}

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int,
               cache_kwargs=None) -> tuple[Tensor, Tensor]:
        self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0
