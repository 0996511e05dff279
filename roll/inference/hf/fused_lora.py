"""Fused multi-LoRA: every adapter slot applied to a mixed batch in one pass.

For each target linear layer W (in → out) all slots' LoRA factors are stacked side by side:

    A_stack (S·R, in)    rows  [b·R, b·R + r_b) hold slot b's lora_A, the rest zeros
    B_stack (out, S·R)   cols  [b·R, b·R + r_b) hold slot b's lora_B · (alpha / r_b)

with S the slot capacity and R the rank capacity (ranks padded to R with zeros; a slot that does
not target this layer has zeros there). Each batch row carries a 0/1 mask over the S·R columns
that selects its slot's block, so for every row

    y = W x + B_stack ((A_stack x) ⊙ mask_row) = W x + B_b A_b x · scaling_b

— two dense matmuls per layer for the whole batch, whatever the mix of slots. Base-model rows
have an all-zero mask and get exactly W x. Compared with gathering A[idx] per row this reads each
factor once per step instead of once per row, and every shape is static (CUDA-graph friendly);
it spends S× the FLOPs of one adapter on the (tiny) LoRA products.

The delta is added by forward hooks on the base ``nn.Linear`` of each target layer, registered
only for the duration of a generation (``FusedLoRA.active``); the caller runs the model with
its own (PEFT) adapters off. The engine's copy of the factors lives only in these stacks.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roll.inference.hf.lora_groups import PRODUCT, Group, Stack, build_groups, shares_inputs
from roll.utils.transfer import to_device, upload

PEFT_PREFIX = "base_model.model."
# Layout keys are unique across all FusedLoRA objects of the process: a compiled step guards on
# the key, so two engines (or two layouts of one engine) can never share a compiled graph. They
# are strings because torch.compile may turn a changing int into a symbol and stop guarding it.
_LAYOUT_KEYS = (f"layout-{n}" for n in itertools.count())
KERNELS = ("torch", "triton", "triton_streams")
_SUFFIXES = {".lora_A.weight": "A", ".lora_B.weight": "B"}


def resolve_kernels(choice: str, device: torch.device) -> str:
    """``lora_kernels`` → the FusedLoRA kernels: 'auto' takes triton_streams on CUDA when
    Triton is importable (on an H100 the decode step 1.09x / 1.18x / 1.02x 'triton' at 32 / 64 /
    256 rows, continuous batching at 32 lanes 1.13x: benchmarks/README.md, session 73), torch
    otherwise."""
    has_triton = importlib.util.find_spec("triton") is not None
    if choice == "auto":
        return "triton_streams" if device.type == "cuda" and has_triton else "torch"
    if choice.startswith("triton"):
        if not has_triton:
            raise ValueError(f"lora_kernels={choice!r} but triton is not installed")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"lora_kernels={choice!r} runs on CUDA, not {device.type} (on CPU "
                             f"only under TRITON_INTERPRET=1, for tests)")
    return choice


@dataclass
class SlotInfo:
    """Book-keeping of one adapter slot."""

    name: str
    """Slot name, e.g. 'alice' or 'alice@step10'."""
    version: int
    """Version of the weights it serves."""
    block: int
    """Index of its column block in every stack."""
    rank: int
    """LoRA rank r (<= the rank capacity)."""
    scaling: float
    """alpha / r (or alpha / sqrt(r) with rsLoRA), folded into B_stack."""
    modules: frozenset[str]
    """Module paths (e.g. 'model.layers.0.self_attn.q_proj') the slot adapts."""


def parse_peft_tensors(tensors: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """PEFT state-dict keys → {module path: {'A': (r, in), 'B': (out, r)}}."""
    modules: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        suffix = next((s for s in _SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            raise ValueError(
                f"unsupported adapter tensor {key!r}: the hf engine serves plain LoRA "
                f"(lora_A/lora_B weights of linear layers) only"
            )
        path = key[: -len(suffix)]
        path = path[len(PEFT_PREFIX):] if path.startswith(PEFT_PREFIX) else path
        modules.setdefault(path, {})[_SUFFIXES[suffix]] = value
    for path, pair in modules.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"adapter module {path!r} has lora_{set(pair).pop()} only")
    return modules


def lora_scaling(lora_config) -> tuple[int, float]:
    """(r, scaling) of a peft LoraConfig; refuses options the fused path does not implement."""
    for option in ("use_dora", "lora_bias"):
        if getattr(lora_config, option, False):
            raise ValueError(f"lora_config.{option}=True is not supported by the hf engine")
    for option in ("rank_pattern", "alpha_pattern"):
        if getattr(lora_config, option, None):
            raise ValueError(f"lora_config.{option} is not supported by the hf engine")
    rank, alpha = int(lora_config.r), float(lora_config.lora_alpha)
    if rank <= 0:
        raise ValueError(f"lora_config.r={rank}: must be > 0")
    scale = alpha / math.sqrt(rank) if getattr(lora_config, "use_rslora", False) else alpha / rank
    return rank, scale


class FusedLoRA:
    """Adapter slots of one model, stacked per target layer for a single fused pass.

    Args:
        model: the transformers causal LM whose linear layers get the deltas (PEFT-wrapped
            layers are fine: the hook goes on their ``base_layer``).
        dtype: dtype of the stacks and of the LoRA products (usually the base weights' dtype).
        slot_capacity, rank_capacity: initial S and R; both grow on demand (a growth
            reallocates the stacks and draws a new ``layout_key``).
        device: where the stacks live (the model's device).
        static_addresses: mark every stack and row mask as a static address for CUDA graphs.
        kernels: ``"torch"`` (the stacked products above: three kernels per layer and step) or
            ``"triton"`` on decode steps (``lora_kernels.py``: rows of one slot as tiles that
            read their slot's factors once; one kernel per group of projections with one
            input — q/k/v, o, gate/up, down — instead of three per projection; prefills keep
            the stacked products; CUDA only, or CPU under ``TRITON_INTERPRET=1``), or
            ``"triton_streams"``: the same kernel beside each group's base GEMM on a second
            CUDA stream (``lora_kernels.linear_lora``; the first member's product, or its
            projection family's, is computed by ``_side_product``).
    """

    def __init__(
        self,
        model: nn.Module,
        dtype: torch.dtype,
        device: torch.device,
        slot_capacity: int = 1,
        rank_capacity: int = 1,
        static_addresses: bool = False,
        kernels: str = "torch",
    ) -> None:
        if kernels not in KERNELS:
            raise ValueError(f"kernels={kernels!r}: must be one of {list(KERNELS)}")
        self.model = model
        self.kernels = kernels
        self.dtype = dtype
        self.device = device
        self.slot_capacity = max(1, slot_capacity)
        self.rank_capacity = max(1, rank_capacity)
        self.static_addresses = static_addresses
        self.slots: dict[str, SlotInfo] = {}
        self.stacks: dict[str, Stack] = {}
        self.row_mask = torch.zeros(0, self.columns, dtype=dtype, device=device)  # (B, S·R)
        self._row_masks: dict[torch.Size, Tensor] = {}
        self.groups: dict[str, tuple[Group, int]] = {}  # triton: path -> (group, position)
        self._regroup_due = False
        self.share_inputs = shares_inputs(model)
        # triton: rows in slot order, and tiles of them (lora_kernels.row_tiles)
        self.row_order = torch.zeros(0, dtype=torch.int32, device=device)  # (B,)
        self.row_tiles = torch.zeros(0, 3, dtype=torch.int32, device=device)  # (T, 3)
        self._row_orders: dict[torch.Size, Tensor] = {}
        self._row_tile_tables: dict[torch.Size, Tensor] = {}
        self._side_forwards: dict[str, tuple] = {}  # triton_streams: path -> (product, forward)
        self.layout_key = next(_LAYOUT_KEYS)
        """Changes whenever the set of hooked layers or any stack's shape/address changes."""

    @property
    def tiled(self) -> bool:
        """Decode steps run the tiled Triton kernel (``lora_kernels.py``)."""
        return self.kernels != "torch"

    @property
    def columns(self) -> int:
        return self.slot_capacity * self.rank_capacity

    @property
    def nbytes(self) -> int:
        """Bytes held by the stacks (the engine's only copy of the adapters)."""
        return sum(s.A.nbytes + s.B.nbytes for s in self.stacks.values())

    # ------------------------------------------------------------------ slots
    def version(self, slot: str) -> int:
        return self._info(slot).version

    def _info(self, slot: str) -> SlotInfo:
        try:
            return self.slots[slot]
        except KeyError:
            known = sorted(self.slots)
            raise KeyError(f"unknown adapter slot {slot!r}; slots are {known}") from None

    def linear(self, path: str) -> nn.Linear:
        """The base nn.Linear at a module path (unwrapping a PEFT LoRA layer)."""
        try:
            module = self.model.get_submodule(path)
        except AttributeError:
            raise ValueError(f"adapter targets {path!r}, not a module of the model") from None
        module = getattr(module, "base_layer", module)
        if not isinstance(module, nn.Linear):
            raise ValueError(f"adapter targets {path!r}, a {type(module).__name__}, not nn.Linear")
        return module

    def load(self, slot: str, tensors: dict[str, Tensor], lora_config, version: int) -> None:
        """Create or replace a slot. Everything is validated before any state changes."""
        if not isinstance(slot, str) or not slot:
            raise ValueError(f"slot={slot!r}: must be a non-empty string")
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise ValueError(f"version={version!r}: must be an int >= 0 (slot {slot!r})")
        if slot in self.slots and version < self.slots[slot].version:
            raise ValueError(
                f"slot {slot!r} serves version {self.slots[slot].version}; refusing older "
                f"version {version} (remove_adapter first to roll back)"
            )
        rank, scaling = lora_scaling(lora_config)
        modules = parse_peft_tensors(tensors)
        if not modules:
            raise ValueError(f"no adapter tensors given for slot {slot!r}")
        for path, pair in modules.items():
            linear = self.linear(path)
            a_shape, b_shape = tuple(pair["A"].shape), tuple(pair["B"].shape)
            if a_shape != (rank, linear.in_features) or b_shape != (linear.out_features, rank):
                raise ValueError(
                    f"slot {slot!r}, {path}: lora_A {a_shape} / lora_B {b_shape} do not match "
                    f"r={rank} and the layer ({linear.in_features} → {linear.out_features})"
                )

        if slot in self.slots:
            block = self.slots[slot].block
        else:
            used = {info.block for info in self.slots.values()}
            free = [b for b in range(self.slot_capacity) if b not in used]
            block = free[0] if free else self.slot_capacity
        full = block >= self.slot_capacity
        if full or rank > self.rank_capacity:
            slot_capacity = 2 * self.slot_capacity if full else self.slot_capacity
            self._resize(slot_capacity, max(self.rank_capacity, rank))
        for path in modules:
            if path not in self.stacks:
                self.stacks[path] = self._new_stack(self.linear(path))
                self.layout_key = next(_LAYOUT_KEYS)
                self._regroup_due = True
        if self._regroup_due:
            self._regroup()

        lo, hi = block * self.rank_capacity, (block + 1) * self.rank_capacity
        with torch.no_grad():
            for path, stack in self.stacks.items():
                stack.A[lo:hi].zero_()
                stack.B[:, lo:hi].zero_()
                if path in modules:
                    pair = modules[path]
                    # host tensors (an exported adapter) go up without waiting on the device
                    a, b = (to_device(pair[key], stack.A.device) for key in ("A", "B"))
                    stack.A[lo : lo + rank].copy_(a)
                    stack.B[:, lo : lo + rank].copy_(b.to(torch.float32) * scaling)
        self.slots[slot] = SlotInfo(slot, version, block, rank, scaling, frozenset(modules))

    def remove(self, slot: str) -> None:
        info = self._info(slot)
        lo, hi = info.block * self.rank_capacity, (info.block + 1) * self.rank_capacity
        with torch.no_grad():
            for stack in self.stacks.values():
                stack.A[lo:hi].zero_()
                stack.B[:, lo:hi].zero_()
        del self.slots[slot]

    def _new_stack(self, linear: nn.Linear) -> Stack:
        stack = Stack(linear, self.columns, self.dtype, self.device)
        if self.static_addresses:
            torch._dynamo.mark_static_address(stack.A)
            torch._dynamo.mark_static_address(stack.B)
        return stack

    def _resize(self, slot_capacity: int, rank_capacity: int) -> None:
        """Reallocate every stack as (slot_capacity · rank_capacity) columns, keeping blocks."""
        old_rank = self.rank_capacity
        self.slot_capacity, self.rank_capacity = slot_capacity, rank_capacity
        for path, old in self.stacks.items():
            new = self._new_stack(old.linear)
            for info in self.slots.values():
                src = slice(info.block * old_rank, (info.block + 1) * old_rank)
                dst = slice(info.block * rank_capacity, info.block * rank_capacity + old_rank)
                new.A[dst] = old.A[src]
                new.B[:, dst] = old.B[:, src]
            self.stacks[path] = new
        self.groups, self._regroup_due = {}, True  # load() regroups the new stacks
        self.row_mask = torch.zeros(0, self.columns, dtype=self.dtype, device=self.device)
        self._row_masks = {}
        self.layout_key = next(_LAYOUT_KEYS)

    def _regroup(self) -> None:
        """Triton kernels: move the stacks into group buffers (``lora_groups.py``)."""
        self._regroup_due = False
        self._side_forwards = {}
        if self.tiled:
            self.groups = build_groups(self.stacks, self.columns, self.share_inputs,
                                       self.static_addresses)
            self.layout_key = next(_LAYOUT_KEYS)

    # ------------------------------------------------------------------ fused pass
    def set_rows(self, slots: list[str | None]) -> None:
        """Which slot each batch row uses (None: base model). Fills the (B, S·R) row mask."""
        blocks = torch.full((len(slots),), -1, dtype=torch.long)
        for row, slot in enumerate(slots):
            if slot is not None:
                blocks[row] = self._info(slot).block
        column_block = torch.arange(self.columns) // self.rank_capacity  # (S·R,)
        mask = (blocks[:, None] == column_block[None, :]).to(self.dtype)  # (B, S·R)
        self.row_mask = self._refill(self._row_masks, mask)
        if self.tiled:
            from roll.inference.hf.lora_kernels import row_tiles

            order, tiles = row_tiles(blocks.tolist(), self.slot_capacity)
            self.row_order = self._refill(self._row_orders, order)
            self.row_tiles = self._refill(self._row_tile_tables, tiles)

    def _refill(self, buffers: dict[torch.Size, Tensor], values: Tensor) -> Tensor:
        """``values`` copied into the device buffer kept for their shape. One buffer per batch
        size, reused: a captured graph (continuous decoding) keeps reading the same memory
        while prefills of other sizes come and go."""
        buffer = buffers.get(values.shape)
        if buffer is None:
            buffer = torch.zeros(values.shape, dtype=values.dtype, device=self.device)
            if self.static_addresses:
                torch._dynamo.mark_static_address(buffer)
            buffers[values.shape] = buffer
        buffer.copy_(upload(values, values.dtype, self.device))  # no wait for the device
        return buffer

    def _hook(self, stack: Stack, module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        x = args[0]  # (B, T, in)
        h = F.linear(x.to(stack.A.dtype), stack.A)  # (B, T, S·R)
        h = h * self.row_mask.unsqueeze(1)  # keep each row's own slot block
        return output + F.linear(h, stack.B).to(output.dtype)  # (B, T, out)

    def _group_hook(self, stack: Stack, group: Group, position: int, module: nn.Module,
                    args: tuple, output: Tensor) -> Tensor:
        """``_hook`` with the Triton kernels on decode steps (one token per row): the group's
        first member computes every member's delta (one kernel), each member adds its slice.
        Prefills (many tokens per row: large products) take the stacked path. With
        ``triton_streams`` the first member's deltas were computed beside its product
        (``_side_product``) and wait in ``group.delta``."""
        from roll.inference.hf import lora_kernels

        x = args[0]  # (B, 1, in)
        if x.shape[-2] != 1:
            return self._hook(stack, module, args, output)
        if group.delta is None:
            alone = position > 0  # called before the group's first member: its own delta
            A, B, splits = (stack.A, stack.B, []) if alone else (group.A, group.B, group.splits)
            delta = lora_kernels.lora_tiled(x.reshape(-1, x.shape[-1]), A, B, self.row_order,
                                            self.row_tiles, self.rank_capacity, self.columns,
                                            splits)  # (B, ΣN)
            if alone:
                return output + delta.reshape(output.shape).to(output.dtype)
            group.delta = delta
        start = group.splits[position - 1] if position else 0
        mine = group.delta[:, start:start + output.shape[-1]]
        if position == group.size - 1:
            group.delta = None
        return output + mine.reshape(output.shape).to(output.dtype)

    def _side_product(self, group: Group, x: Tensor, weight: Tensor,
                      bias: Tensor | None) -> Tensor:
        """x Wᵀ + bias for a group's first member (W its weight, or its projection family's
        stacked weights), on a decode step with the group's deltas computed beside it on a
        side stream (``lora_kernels.linear_lora``) and left in ``group.delta`` for the hook."""
        if x.shape[-2] != 1:
            return F.linear(x, weight, bias)
        from roll.inference.hf.lora_kernels import linear_lora

        product, group.delta = linear_lora(
            x.reshape(-1, x.shape[-1]), weight, bias, group.A, group.B, self.row_order,
            self.row_tiles, self.rank_capacity, self.columns, group.splits)  # (B, N), (B, ΣN)
        return product.reshape(*x.shape[:-1], product.shape[-1])

    def _side_forwards_of(self, path: str, group: Group) -> tuple:
        """(product, forward) of a group's first member, made once per layout (a compiled
        step then sees the same functions at every call)."""
        made = self._side_forwards.get(path)
        if made is None:
            linear = self.stacks[path].linear
            product = partial(self._side_product, group)
            made = self._side_forwards[path] = (
                product, lambda x: product(x, linear.weight, linear.bias))
        return made

    @contextmanager
    def active(self) -> Iterator[None]:
        """Hooks that add the fused deltas to every stacked layer, removed on exit.

        The hooks are registered for every stacked layer whatever the batch holds, so that a
        compiled forward always sees the same set of hooks for a given ``layout_key``. With
        ``triton_streams`` each group's first member also computes its product through
        ``_side_product``: set as its ``forward``, or, where a projection family is active
        already (fused_projections.py: the member's forward is the family's), as the product
        the family's ``_first`` calls. A group whose first member is a later one of its family
        gets no side stream (its hook computes the deltas).
        """
        handles = [
            stack.linear.register_forward_hook(
                partial(self._group_hook, stack, *self.groups[path]) if path in self.groups
                else partial(self._hook, stack))
            for path, stack in self.stacks.items()
        ]
        streams = self.kernels == "triton_streams"
        firsts = [(path, group) for path, (group, position) in self.groups.items()
                  if streams and position == 0]
        own_forward = []
        for path, group in firsts:
            linear = self.stacks[path].linear
            product, forward = self._side_forwards_of(path, group)
            setattr(linear, PRODUCT, product)
            if "forward" not in vars(linear):  # no active family's forward (it calls PRODUCT)
                linear.forward = forward
                own_forward.append(linear)
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()
            for path, _ in firsts:
                delattr(self.stacks[path].linear, PRODUCT)
            for linear in own_forward:
                del linear.forward
            for group, _ in self.groups.values():
                group.delta = None
