"""Every agent's LoRA factors in one buffer: what the compiled trainer reads and steps.

Why. With N agents on a 28-layer model each agent has 392 LoRA tensors. Held as PEFT holds them,
the compiled forward would read 2N leaves per adapted layer, every backward would accumulate
N x 392 gradients one kernel each, and every optimizer step would clip and update 392 tensors
per agent: host work that grows with N while the GPU work does not (8 agents cost 1.6x one
agent's train step; benchmarks/README.md). Here:

- ``values`` (N, total) holds, row i, every factor of agent i in the layers where all agents
  share a shape (the common case: one rank for the team). Each agent's PEFT tensor is a view
  of its slice of row i (``param.data`` points there), so PEFT export, checkpoints, adapter
  sync and the eager forward read and write the same memory.
- each such layer's A and B are read by the compiled forward as ONE leaf each, the (N, r, in)
  and (N, out, r) views of ``values`` across the agents' rows; their gradients accumulate in
  place into the same views of ``grads`` (N, total), set before each round.
- each agent's optimizer steps ONE tensor, ``flat[i]`` = row i of ``values``, whose gradient
  is row i of ``grads``: one norm and one fused AdamW kernel per agent and step.

Factors of layers where the agents differ (rank, or a layer some agent does not adapt) stay
PEFT's own tensors (the compiled forward stacks them per forward), and their optimizers step
them as usual. Checkpoints keep one optimizer format: ``portable_state`` writes a flat
optimizer's state per PEFT tensor (as an eager run saves it), ``native_state`` reads it back.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn


@contextmanager
def layout_warning_ignored() -> Iterator[None]:
    """Backwards inside are quiet about the stacks' leaves: a leaf that is a strided view (one
    layer's factors across the agents' rows) gets its gradient accumulated into a view of the
    same layout, and torch warns that such a layout "may impair performance" of DDP-style
    bucketing, which this path does not use. Only inside: importing roll filters nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="grad and param do not obey the gradient layout")
        yield


class Stack:
    """One layer's factors across the agents: leaves ``a`` (N, r, in) and ``b`` (N, out, r),
    each agent's ``scales`` (N, 1, 1) (alpha / r)."""

    def __init__(self, leaves: list[tuple[Tensor, Tensor]], scales: Tensor) -> None:
        (self.a, a_grad), (self.b, b_grad) = leaves  # (leaf, its gradient's view) of A, B
        self.scales = scales
        self._grads = (a_grad, b_grad)

    def open(self) -> None:
        self.a.grad, self.b.grad = self._grads

    def close(self) -> None:
        self.a.grad = self.b.grad = None


def uniform(layer: nn.Module, agent_names: Sequence[str]) -> bool:
    """Whether every agent adapts this LoRA layer with factors of one shape, dtype, device."""
    if not all(name in layer.lora_A for name in agent_names):
        return False
    return len({(layer.lora_A[name].weight.shape, layer.lora_B[name].weight.shape,
                 layer.lora_A[name].weight.dtype, layer.lora_A[name].weight.device)
                for name in agent_names}) == 1


class TeamFactors:
    """The factors of ``layers`` (each ``uniform``) of every agent in one buffer (module
    docstring)."""

    def __init__(self, layers: Sequence[nn.Module], agent_names: Sequence[str]) -> None:
        self.agent_names = list(agent_names)
        agents = len(self.agent_names)
        params = [[(layer.lora_A[name].weight, layer.lora_B[name].weight)
                   for layer in layers] for name in self.agent_names]
        first = params[0][0][0]
        total = sum(a.numel() + b.numel() for a, b in params[0])
        self.values = torch.empty(agents, total, dtype=first.dtype, device=first.device)
        self.grads = torch.zeros_like(self.values)
        self.stacks: dict[int, Stack] = {}  # id(layer) -> its stack
        self.slices: dict[int, tuple[int, int]] = {}  # id(param) -> (start, stop) in its row
        self.params: list[list[nn.Parameter]] = [[] for _ in self.agent_names]
        self._addresses: list[tuple[nn.Parameter, int]] | None = None  # where each must live
        start = 0
        with torch.no_grad():
            for index, layer in enumerate(layers):
                leaves = []
                for part in (0, 1):  # A, then B
                    shape = params[0][index][part].shape
                    stop = start + shape.numel()
                    for agent in range(agents):
                        param = params[agent][index][part]
                        self.values[agent, start:stop].copy_(param.reshape(-1))
                        param.data = self.values[agent, start:stop].view(shape)
                        self.slices[id(param)] = (start, stop)
                        self.params[agent].append(param)
                    leaf = self.values.detach()[:, start:stop].view(agents, *shape)
                    leaves.append((leaf.requires_grad_(True),
                                   self.grads[:, start:stop].view(agents, *shape)))
                    start = stop
                scales = torch.tensor([float(layer.scaling[name]) for name in self.agent_names],
                                      device=first.device).view(-1, 1, 1)
                self.stacks[id(layer)] = Stack(leaves, scales)
        self.flat = [self.values.detach()[agent].requires_grad_(True) for agent in range(agents)]

    # ------------------------------------------------------------------ rounds
    def open_round(self) -> None:
        """Zero the gradients; the stacks' leaves accumulate into them from now on."""
        self.check()
        self.grads.zero_()
        for stack in self.stacks.values():
            stack.open()

    def close_round(self, names: Sequence[str]) -> None:
        """These agents' flat tensors get their rows of the gradients; the others none (they
        had no rows: their optimizers must not step)."""
        for stack in self.stacks.values():
            stack.close()
        for name in names:
            if name in self.agent_names:
                index = self.agent_names.index(name)
                self.flat[index].grad = self.grads[index]

    def check(self) -> None:
        """Refuse to train if an agent's tensor no longer lives in the buffer (something
        replaced ``param.data``): the compiled forward would read stale factors."""
        # every round: one comparison a tensor against addresses listed once (a lookup and
        # the arithmetic per tensor took ~1 ms a round for 8 agents of 392 tensors)
        if self._addresses is None:
            row = self.values.stride(0) * self.values.element_size()
            base = self.values.data_ptr()
            self._addresses = [(param, base + agent * row + self.slices[id(param)][0]
                                * self.values.element_size())
                               for agent, params in enumerate(self.params) for param in params]
        for param, address in self._addresses:
            if param.data_ptr() != address:
                raise RuntimeError(
                    "trainer.compile: an agent's LoRA tensor was replaced after the "
                    "compiled forward moved it into the team's buffer (param.data "
                    "reassigned); load weights with copy_ (import_adapter) instead")

    def release(self) -> None:
        """Each agent's PEFT tensors in memory of their own again (values kept). Optimizers
        built over ``flat`` still hold the old rows: build a new trainer after this."""
        for params in self.params:
            for param in params:
                param.data = param.data.clone()

    # ------------------------------------------------------------------ optimizers
    def optimizer_parameters(self, name: str, params: Sequence[nn.Parameter]) -> list[Tensor]:
        """What agent ``name``'s optimizer steps, given its PEFT tensors ``params``: its flat
        row, then its tensors outside the buffer."""
        return [self.flat[self.agent_names.index(name)],
                *[param for param in params if id(param) not in self.slices]]

    def gradients(self, name: str, params: Sequence[nn.Parameter]) -> list[Tensor | None]:
        """The gradient of each of ``params`` (agent ``name``'s PEFT tensors) as its optimizer
        holds it."""
        flat = self.flat[self.agent_names.index(name)].grad
        out = []
        for param in params:
            if id(param) not in self.slices:
                out.append(param.grad)
            elif flat is None:
                out.append(None)
            else:
                start, stop = self.slices[id(param)]
                out.append(flat[start:stop].view(param.shape))
        return out

    def portable_state(self, name: str, params: Sequence[nn.Parameter], native: dict) -> dict:
        """A flat optimizer's ``state_dict`` as an optimizer of ``params`` would hold it (one
        entry per PEFT tensor, tensors copied out of the flat state)."""
        positions = self._positions(params)
        state = {}
        flat_state = native["state"].get(0)
        for index, param in enumerate(params):
            if id(param) in self.slices:
                if flat_state is not None:
                    start, stop = self.slices[id(param)]
                    state[index] = {key: _cut(value, start, stop, param.shape)
                                    for key, value in flat_state.items()}
            elif positions[index] in native["state"]:
                state[index] = native["state"][positions[index]]
        groups = [dict(group, params=list(range(len(params)))) for group in native["param_groups"]]
        return {"state": state, "param_groups": groups}

    def native_state(self, name: str, params: Sequence[nn.Parameter], portable: dict) -> dict:
        """Inverse of ``portable_state``: one entry per PEFT tensor → the flat optimizer's."""
        positions = self._positions(params)
        covered = sorted((self.slices[id(param)][0], index)
                         for index, param in enumerate(params) if id(param) in self.slices)
        entries = [portable["state"].get(index) for _, index in covered]
        state = {}
        if any(entry is not None for entry in entries):
            if any(entry is None for entry in entries):
                raise ValueError(f"optimizer state of agent {name!r}: some of its LoRA tensors "
                                 f"have AdamW moments and some do not")
            steps = {float(entry["step"]) for entry in entries}
            if len(steps) > 1:
                raise ValueError(f"optimizer state of agent {name!r}: its LoRA tensors were "
                                 f"stepped different numbers of times {sorted(steps)}")
            state[0] = {key: (value.clone() if value.dim() == 0 else
                              torch.cat([entry[key].reshape(-1) for entry in entries]))
                        for key, value in entries[0].items()}
        for index, position in positions.items():
            if position and index in portable["state"]:
                state[position] = portable["state"][index]
        groups = [dict(group, params=list(range(1 + len(params) - len(covered))))
                  for group in portable["param_groups"]]
        return {"state": state, "param_groups": groups}

    def _positions(self, params: Sequence[nn.Parameter]) -> dict[int, int]:
        """Index of each of ``params`` → its position among the flat optimizer's tensors
        (0: the flat row)."""
        positions, rest = {}, 1
        for index, param in enumerate(params):
            if id(param) in self.slices:
                positions[index] = 0
            else:
                positions[index], rest = rest, rest + 1
        return positions


def _cut(value: Tensor, start: int, stop: int, shape: torch.Size) -> Tensor:
    """One PEFT tensor's part of a flat optimizer state entry (a scalar such as ``step`` as
    is)."""
    if value.dim() == 0:
        return value.clone()
    return value[start:stop].view(shape).clone()


# ---------------------------------------------------------------- what an agent's optimizer steps
# Functions of a MultiAgentLoRAModel (``model``): its adapter tensors, or with trainer.compile
# its row of the team's buffer, whichever the agent's optimizer holds.

def _factors_of(model, name: str):
    factors = model._team_factors
    return factors if factors is not None and name in factors.agent_names else None


def optimizer_parameters(model, name: str) -> list[Tensor]:
    """The tensors agent ``name``'s optimizer steps: its adapter tensors, or with
    ``trainer.compile`` its row of the team's buffer and the rest."""
    factors, params = _factors_of(model, name), model.agent_parameters(name)
    return params if factors is None else factors.optimizer_parameters(name, params)


def agent_gradients(model, name: str) -> list[Tensor | None]:
    """The gradient of each of ``model.agent_parameters(name)``, wherever its optimizer
    holds it."""
    factors, params = _factors_of(model, name), model.agent_parameters(name)
    return [p.grad for p in params] if factors is None else factors.gradients(name, params)


def portable_optimizer_state(model, name: str, state: dict) -> dict:
    """Agent ``name``'s optimizer ``state_dict`` with one entry per adapter tensor (the
    checkpoint format, whatever tensors the optimizer steps)."""
    factors = _factors_of(model, name)
    return state if factors is None else factors.portable_state(
        name, model.agent_parameters(name), state)


def native_optimizer_state(model, name: str, state: dict) -> dict:
    """Inverse of ``portable_optimizer_state`` (for ``load_state_dict``)."""
    factors = _factors_of(model, name)
    return state if factors is None else factors.native_state(
        name, model.agent_parameters(name), state)
