"""Compiled forwards of the multi-agent LoRA model (``trainer.compile=true``).

Why: the eager train step of a 0.6B model on a GPU is bound by the host launching ~66,000 small
kernels per step (benchmarks/README.md, the profile), not by the GPU. ``torch.compile`` fuses the
elementwise work of each decoder layer. It compiles ONE layer's forward ("regional
compilation"): every decoder layer runs the same code, so one graph per input signature serves
all of them and warm-up costs one layer's compile, not the whole model's.

Routing without data-dependent code. The eager path gives each contiguous run of an agent's rows
that agent's LoRA delta by slicing at Python-int row offsets, which a compiled graph would
specialise on (a recompile per mix of agents). Here each row gets its own agent's factors as
data: a forward hook on each adapted base layer stacks every agent's factors, A_all (N, r, in)
and B_all = [B_j s_j] (N, out, r), gathers each row's pair by the rows' agent index (B,), and
adds one batched product per row:

    A_b = A_all[agent[b]],  B_b = B_all[agent[b]],  delta[b] = x[b] A_b^T B_b^T,

so each row costs its own agent's rank only (not N times it, as a product over every agent's
stacked factors with a per-row mask would), rows may come in any order, and one graph serves
every mix of agents and row counts (the index is a tensor input). Agent j's A/B get gradients
from agent j's rows only: the gather's backward adds each row's weight gradient to its own
agent's factors (exact zeros for an agent without rows; and a NaN in one agent's rows stays in
that agent's gradient, where a one-hot matmul's transpose would spread 0 x NaN = NaN to all).
The reference policy is no delta at all (a graph of its own). PEFT's own LoRA is switched off
meanwhile (no active adapter).

One leaf per projection, not per agent. Where every agent adapts a layer at one rank, the
layer's factors of all agents are ONE leaf each, views into the team's buffer of factors
(team_factors.py), and each agent's optimizer steps one flat tensor: the host work of a train
step no longer grows with the number of agents' tensors. Layers whose agents differ in rank (or
that some agent does not adapt) stack the agents' own tensors in every forward.

Simplifications, stated: LoRA dropout is refused (each agent's masks come from its own
generator in the eager path; a compiled graph cannot keep that). LoRA products run in the base
layer's dtype with the adapter weights cast down, as in the eager path.
Not used by the inference engines: the compiled layers are switched in only around the
trainer's forwards.

Critics (``critic_names``, when none has LoRA dropout) go through the same compiled layers:
their rows are a second group of the routing (each row's own critic's factors, stacked per
forward), and ``hidden`` returns the final hidden states their value heads read. A forward is
one group's rows; each group has its graphs (dynamo guards on which group is routed).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from roll.multi_agent.prefix import LayerKV, layer_kv
from roll.multi_agent.routing import RowRouting, base_layers_only
from roll.utils.compile_workers import compile_in_process
from roll.utils.recompiles import recompile_guard
from roll.utils.stages import stage


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers causal LM: the longest ``nn.ModuleList`` whose
    entries all share one class (``model.layers`` of Qwen3 and Llama)."""
    best: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > len(best) and len(
                {type(entry) for entry in module}) == 1:
            best = list(module)
    if not best:
        raise ValueError(f"trainer.compile: found no repeated decoder layers in "
                         f"{type(model).__name__}")
    return best


class CompiledLayers:
    """The compiled decoder layers of one model, switched in only inside ``active``."""

    def __init__(self, base_model: nn.Module, backend: str = "inductor") -> None:
        self.layers = decoder_layers(base_model)
        self.embeddings = base_model.get_input_embeddings()
        # One compiled callable per layer; they share one code object, so dynamo's cache (and
        # its compiled graphs) is shared by every layer. Rows and tokens vary from one forward
        # to the next: dynamic from the start, not one static graph and then a dynamic one.
        compile_in_process()  # roll/utils/compile_workers.py says why
        # (torch.compile's mode 'reduce-overhead', the layers replayed as CUDA graphs, failed
        # on an H200: a layer's replay overwrote the output the next layer was reading
        # (session 63); with each layer's output cloned it ran 40x slower than this mode, every
        # replay re-recorded behind the earlier layers' pending backwards (session 68;
        # benchmarks/README.md)
        self._compiled = [torch.compile(layer._call_impl, backend=backend, dynamic=True)
                          for layer in self.layers]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Calls of the decoder layers go through their compiled forwards (nn.Module.__call__
        runs ``_compiled_call_impl`` when set; ``nn.Module.compile`` sets it the same way)."""
        for layer, compiled in zip(self.layers, self._compiled, strict=True):
            layer._compiled_call_impl = compiled
        # With gradients on, the first layer's input (the frozen embeddings' output) would be
        # the only one not requiring grad: a second graph for layer 0 alone. Marked here, as
        # transformers' enable_input_require_grads does, one graph serves every layer.
        handle = self.embeddings.register_forward_hook(
            lambda module, args, output: output.requires_grad_(True)
            if torch.is_grad_enabled() and not output.requires_grad else output)
        try:
            with recompile_guard("trainer"):
                yield
        finally:
            handle.remove()
            for layer in self.layers:
                layer._compiled_call_impl = None


class CompiledForward:
    """Logits of a PEFT model through the compiled layers, PEFT's own LoRA off (no active
    adapter) and each row's own agent's delta added by the row routing."""

    def __init__(self, peft_model: nn.Module, lora_layers: Sequence[nn.Module],
                 agent_names: Sequence[str], backend: str = "inductor",
                 critic_names: Sequence[str] = ()) -> None:
        self.peft_model = peft_model
        self.lora_layers = list(lora_layers)
        self.layers = CompiledLayers(peft_model.get_base_model(), backend)
        self.decoder = peft_model.get_base_model().get_decoder() if critic_names else None
        """The decoder stack without the LM head (the critics read its final hidden states)."""
        self.routing = RowRouting(self.lora_layers, agent_names, critic_names)
        self.routes_critics = bool(critic_names)
        """Whether critics' forwards (``hidden``) run here too (module docstring)."""
        self.warmed: set[str] = set()  # "training" / "no-grad": forwards compiled so far

    def close(self) -> None:
        """Back to the eager model: routing hooks removed (the compiled layers are switched in
        only inside ``logits``)."""
        self.routing.close()

    @property
    def factors(self):
        """The team's buffer of factors (team_factors.py), None if no layer is shared."""
        return self.routing.factors

    def logits(self, input_ids: Tensor, attention_mask: Tensor, agent_id: Tensor | None,
               kwargs: dict, per_layer: list[LayerKV] | None = None) -> Tensor:
        """The logits of these rows, each through its agent's adapter (None: the reference);
        ``per_layer``: the shared prefix's keys/values (prefix.py)."""
        return self._output(input_ids, attention_mask, agent_id, kwargs, per_layer).logits

    def hidden(self, input_ids: Tensor, attention_mask: Tensor, critic_id: Tensor) -> Tensor:
        """The final hidden states (B, T, H) of these rows (after the final norm), each
        through its own critic's adapter (``critic_id`` indexes the critics).

        From the decoder stack itself (no LM head), not from ``output_hidden_states=True``:
        that flag makes transformers run a recording hook after every decoder layer, inside
        the compiled region, where it breaks each layer's graph in two (a ContextVar read;
        transformers/utils/output_capturing.py): three graphs to compile instead of one and
        a return to Python in every layer of every forward (a 30-layer model's critics'
        training forward took 120 s to compile on an H100, the policy's 28 s)."""
        return self._output(input_ids, attention_mask, critic_id, {}, None, critics=True)

    def _output(self, input_ids: Tensor, attention_mask: Tensor, row_id: Tensor | None,
                kwargs: dict, per_layer: list[LayerKV] | None, critics: bool = False):
        if row_id is not None:  # the routing gathers factors with it, on the rows' device
            row_id = row_id.to(input_ids.device)
        if input_ids.shape[0] == 1:
            # A one-row batch runs as that row twice, and the copy's outputs are dropped (no
            # gradient reaches it): dynamic shapes specialise a size of 1 into graphs of its
            # own, and inductor's CPU backward of that graph corrupted the heap (double free,
            # torch 2.13; a 1-row tail of a mini-batch crashed a Kuhn run at step 11). Two rows
            # reuse the general graph; no extra compile. (A shared prefix never has one row.)
            twice = row_id.repeat(2) if row_id is not None else None
            output = self._warmed(input_ids.repeat(2, 1), attention_mask.repeat(2, 1), twice,
                                  kwargs, per_layer, critics)
            return _first_row(output)
        return self._warmed(input_ids, attention_mask, row_id, kwargs, per_layer, critics)

    def _warmed(self, input_ids: Tensor, attention_mask: Tensor, row_id: Tensor | None,
                kwargs: dict, per_layer: list[LayerKV] | None, critics: bool):
        # The first forward of each kind compiles its graphs (10-60 s on a GPU, inside a
        # step's first passes): a timestamped line, so a warm-up is not read as a hang.
        kind = ("critics' " if critics else "") + (
            "training" if torch.is_grad_enabled() else "no-grad")
        if per_layer is not None:  # the shared prefix's head records, its tail reads
            kind += " shared-prefix " + ("head" if per_layer[0].keys is None else "tail")
        args = (input_ids, attention_mask, row_id, kwargs, per_layer, critics)
        if kind in self.warmed:
            return self._routed(*args)
        with stage(f"trainer: compiling the {kind} forward (first use; later calls reuse it)"):
            output = self._routed(*args)
        self.warmed.add(kind)
        return output

    def _routed(self, input_ids: Tensor, attention_mask: Tensor, row_id: Tensor | None,
                kwargs: dict, per_layer: list[LayerKV] | None, critics: bool):
        # PEFT's own LoRA off (its flag, as in the eager forwards): the routing adds each row's
        # own agent's delta inside the compiled layers
        with base_layers_only(self.lora_layers), \
                self.routing.route(row_id, self.layers.embeddings.weight.dtype, critics), \
                self.layers.active(), layer_kv(self.layers.layers, per_layer):
            if critics:  # the final hidden states (``hidden`` says why not the LM)
                return self.decoder(input_ids=input_ids, attention_mask=attention_mask,
                                    use_cache=False).last_hidden_state
            return self.peft_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def _first_row(output):
    """The first row of the doubled one-row batch of ``CompiledForward._output``: of the
    critics' hidden states (a tensor), or of a model output's logits."""
    if isinstance(output, Tensor):
        return output[:1]
    output.logits = output.logits[:1]
    return output
