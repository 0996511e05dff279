"""N named LoRA adapters on one frozen base model (PEFT).

The base weights exist once. Each agent is one PEFT adapter named after the agent; the
reference policy is the same module with every adapter disabled (DESIGN.md invariant 2).
Checkpoints are standard PEFT adapter folders (invariant 4).

An agent's tensors are found through PEFT's per-adapter structures (``lora_A[name]``,
``lora_B[name]``, … of every LoRA layer), never by matching names in parameter paths, so any
name PEFT can hold is safe (``model``, ``mlp``, ``q_proj``, ``weight`` included).

Dropout. PEFT's LoRA dropout draws masks from the global RNG, so an agent's masks would depend
on which other agents trained before it. Each agent's dropout here draws from its own
generator, reseeded from (run seed, agent name, the agent's own train step, round) at every
training mini-batch, and is active only inside ``training_forward`` — never in rollouts,
old-log-prob or reference passes. The base model is kept in eval mode throughout (its own
dropout, if any, stays off, as in verl and OpenRLHF for RL fine-tuning).

Adapters without a base: on a base whose weights are on the meta device (``load_shape``)
the model holds only its adapters, on CPU (``holds_base`` False; shape_only.py): a Ray
controller's store. Everything but the forwards works on it.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import Tensor, nn

from roll.algorithms.choices import move_logprobs
from roll.models.peft_io import ADAPTER_WEIGHTS, write_peft_folder
from roll.multi_agent.compiled import CompiledForward, decoder_layers
from roll.multi_agent.config import AgentConfig, LoRAConfig
from roll.multi_agent.dropout import AgentDropout
from roll.multi_agent.logprobs import choice_logits, response_window, sequence_logprobs
from roll.multi_agent.prefix import LayerKV, common_prefix, layer_kv, prefix_logits
from roll.multi_agent.routing import agent_segments, base_layers_only, segment_lora
from roll.multi_agent.seeds import adapter_init_seed, agent_stream_seed
from roll.multi_agent.shape_only import adapters_on_cpu
from roll.multi_agent.team_factors import layout_warning_ignored
from roll.utils.transfer import host_copies


def _peft_lora_config(lora: LoRAConfig, base_name_or_path: str | None):
    from peft import LoraConfig, TaskType

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type=TaskType.CAUSAL_LM,
        base_model_name_or_path=base_name_or_path,
    )


class MultiAgentLoRAModel(nn.Module):
    """One frozen base, one PEFT LoRA adapter per agent.

    Args:
        base_model: a loaded causal LM (its weights are frozen here and never copied).
        agents: resolved agent configs (each with ``lora`` set), in agent-id order.
        seed: run seed; each adapter's init depends on (seed, agent name) only, and so do its
            dropout masks (with the agent's train step and mini-batch round).
    """

    def __init__(self, base_model: nn.Module, agents: Sequence[AgentConfig], seed: int = 0,
                 critics: Sequence[AgentConfig] = ()):
        super().__init__()
        from peft import get_peft_model
        from peft.tuners.lora import LoraLayer

        if not agents:
            raise ValueError("MultiAgentLoRAModel needs at least one agent")
        clash = sorted({a.name for a in agents} & {c.name for c in critics})
        if clash:
            raise ValueError(f"critic names {clash} are also agent names")
        base_path = getattr(base_model.config, "_name_or_path", None) or None
        for param in base_model.parameters():
            param.requires_grad_(False)
        self.agent_names: list[str] = [agent.name for agent in agents]
        self._deferred: dict[str, Callable[[], dict[str, Tensor]]] = {}
        """agent -> where its newer tensors come from, imported at their first read."""
        self.critic_names: list[str] = [critic.name for critic in critics]
        """Adapters of value models (roll/multi_agent/critics.py): in the same PEFT model, never
        synced to an engine."""
        self.seed = seed
        peft_model = None
        for agent in [*agents, *critics]:
            config = _peft_lora_config(agent.lora, base_path)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(adapter_init_seed(seed, agent.name))
                if peft_model is None:
                    peft_model = get_peft_model(base_model, config, adapter_name=agent.name)
                else:
                    peft_model.add_adapter(agent.name, config)
        self.peft_model = peft_model
        self.peft_model.eval()  # dropout (LoRA and base) off outside training_forward
        self.lora_layers: list[tuple[str, nn.Module]] = [
            (path, module) for path, module in peft_model.named_modules()
            if isinstance(module, LoraLayer)]
        """(module path, PEFT LoRA layer) of every adapted projection, in module order."""
        self._dropout_generators: dict[str, dict[torch.device, torch.Generator]] = {}
        self._dropouts: dict[str, list[AgentDropout]] = {}
        for agent in [*agents, *critics]:
            self._install_dropout(agent.name, agent.lora.dropout)
        self._takes_logits_to_keep = ("logits_to_keep"
                                      in inspect.signature(self.base_model.forward).parameters)
        self._compiled = None  # compiled.CompiledForward once enable_compile() ran
        self._trainable: list[nn.Parameter] | None = None  # every adapter tensor (_all_trainable)
        self.share_prefix = False  # trainer.share_prefix (the trainer sets it): prefix.py
        self._layers: list[nn.Module] = []  # the decoder layers, found at the first sharing
        self.holds_base = not any(p.is_meta for p in base_model.parameters())  # shape_only.py
        if not self.holds_base:
            adapters_on_cpu(self.lora_layers)
        self.set_active_agent(self.agent_names[0])
        self._all_trainable()  # PEFT's add_adapter left the later adapters frozen

    @property
    def tensor_device(self) -> torch.device:
        """Where the trainable tensors live: the base's device, or CPU for a shape-only base."""
        weight = self.base_model.get_input_embeddings().weight
        return weight.device if self.holds_base else torch.device("cpu")

    def _install_dropout(self, name: str, p: float) -> None:
        generators: dict[torch.device, torch.Generator] = {}
        layers = []
        for _, layer in self.lora_layers:
            if name in layer.lora_dropout:
                layer.lora_dropout[name] = AgentDropout(p, generators)
                layers.append(layer.lora_dropout[name])
        self._dropout_generators[name] = generators
        self._dropouts[name] = layers

    # ------------------------------------------------------------------ adapters
    @property
    def base_model(self) -> nn.Module:
        """The underlying transformers model (shared by every agent and the reference)."""
        return self.peft_model.get_base_model()

    def agent_index(self, name: str) -> int:
        try:
            return self.agent_names.index(name)
        except ValueError:
            raise KeyError(f"unknown agent {name!r}; agents are {self.agent_names}") from None

    def _check_adapter(self, name: str) -> None:
        if name not in self.critic_names:
            self.agent_index(name)

    def set_active_agent(self, name: str) -> None:
        """The adapter PEFT's own forward applies when ``peft_model`` is called directly
        (``forward`` routes every row itself and does not depend on it).

        Read from PEFT, never cached here: code holding ``peft_model`` may switch it.
        """
        self.agent_index(name)
        if self.peft_model.active_adapter == name:
            return
        self.peft_model.set_adapter(name)
        self._all_trainable()

    def _all_trainable(self) -> None:
        """PEFT leaves only the active adapter trainable (set_adapter, and again when
        disable_adapter ends); every agent's tensors stay trainable here (a mixed forward
        trains several), and a tensor outside the graph simply gets no gradient. Every round
        comes here: the tensors are listed once (walked again while an import is deferred:
        the walk imports it)."""
        if self._deferred or self._trainable is None:
            self._trainable = [param for agent in [*self.agent_names, *self.critic_names]
                               for param in self.agent_parameters(agent)]
        for param in self._trainable:
            if not param.requires_grad:
                param.requires_grad_(True)

    def agent_parameters(self, name: str) -> list[nn.Parameter]:
        """This agent's adapter tensors (and nothing else), in a stable order."""
        return [param for _, param in self.named_agent_tensors(name)]

    @property
    def _team_factors(self):
        """The team buffer of ``trainer.compile`` (team_factors.py), or None."""
        return self._compiled.factors if self._compiled is not None else None

    def named_agent_tensors(self, name: str) -> Iterator[tuple[str, nn.Parameter]]:
        """(PEFT on-disk key, tensor) of each of this agent's adapter tensors, module order.

        Read from each LoRA layer's per-adapter containers (``lora_A[name]`` …), so one agent's
        name can never select another agent's tensors, whatever the names. Critics' names
        (``critic_names``) are accepted too.
        """
        self._check_adapter(name)
        fetch = self._deferred.pop(name, None)
        if fetch is not None:
            self.import_adapter(name, fetch())
        for path, layer in self.lora_layers:
            for container_name in layer.adapter_layer_names:
                container = getattr(layer, container_name, None)
                if container is None or name not in container:
                    continue
                entry = container[name]
                if isinstance(entry, nn.Parameter):
                    yield f"{path}.{container_name}", entry
                else:
                    for param_name, param in entry.named_parameters():
                        yield f"{path}.{container_name}.{param_name}", param

    @contextmanager
    def reference(self) -> Iterator[None]:
        """Adapters off: the base model is the reference policy (no second copy)."""
        with base_layers_only(layer for _, layer in self.lora_layers):
            yield

    # ------------------------------------------------------------------ forward
    @contextmanager
    def training_forward(self, train_steps: dict[str, int],
                         stream: str = "dropout") -> Iterator[None]:
        """Forwards with these agents' LoRA dropout on, each agent's masks drawn from its own
        generator seeded by (run seed, agent name, its train step in ``train_steps``,
        ``stream``: the trainer names each mini-batch round and data-parallel rank its own, so
        they draw different masks).

        Every agent's tensors are made trainable on entry: PEFT's own ``set_adapter`` and
        ``disable_adapter`` (which code holding ``peft_model`` may call) leave only the active
        adapter trainable, and a mixed forward would then give the others no gradient.
        On exit every agent's gradients are on its optimizer's tensors (team_factors.py's
        ``optimizer_parameters``;
        the compiled path accumulates them in the team's buffer meanwhile: team_factors.py).
        """
        self._all_trainable()
        factors = self._team_factors
        if factors is not None:
            factors.open_round()
        for name, step in train_steps.items():
            seed = agent_stream_seed(self.seed, name, step, stream)
            device = next(self.named_agent_tensors(name))[1].device
            self._dropout_generators[name][device] = torch.Generator(device=device).manual_seed(
                seed
            )
        # only layers that drop anything (an agent's layers share its p; 0 passes the input)
        dropping = [layer for name in train_steps if self._dropouts[name][:1]
                    and self._dropouts[name][0].p > 0 for layer in self._dropouts[name]]
        for layer in dropping:
            layer.active = True
        try:
            with nullcontext() if factors is None else layout_warning_ignored():
                yield
        finally:
            for layer in dropping:
                layer.active = False
            if factors is not None:
                factors.close_round(list(train_steps))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        agent_id: Tensor | None,
        *,
        positions: Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
        choices: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        """Token log-probs and entropies (B, T), each row through its own agent's adapter;
        given ``choices`` (``TrajectoryBatch.choice_tokens``), also their logits / T (B, T, C).

        ``agent_id`` (B,) indexes ``agent_names``; None runs the reference (adapters off). One
        forward serves any mix of agents: each run of rows of one agent gets that agent's LoRA
        delta (``routing.segment_lora``), so gradients reach every agent's A/B from its own rows
        only. Keep each agent's rows contiguous: an agent's dropout masks are then those of a
        forward of its rows alone.
        ``positions`` (B, T) selects the tokens to score (e.g. the response mask); None scores
        every token after the first; unselected tokens come back as 0. Log-probs and entropy
        are those of ``softmax(logits / temperature)``; the entropy carries a gradient only
        when ``with_entropy``.
        """
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r}: must be > 0 (greedy rollouts: use 1)")
        if positions is None:
            positions = torch.ones_like(input_ids, dtype=torch.bool)
            positions[:, 0] = False
        positions = positions.bool()
        window = response_window(positions)  # one column when nothing is scored
        logits = self._window_logits(input_ids, attention_mask, agent_id, window)
        scored = sequence_logprobs(logits, input_ids, positions, window, temperature,
                                   with_entropy)
        if choices is None:
            return scored
        return *scored, choice_logits(logits, choices, window, temperature)

    def _window_logits(self, input_ids: Tensor, attention_mask: Tensor,
                       agent_id: Tensor | None, window: tuple[int, int]) -> Tensor:
        """Logits (B, stop - first, V) of the positions predicting tokens first..stop-1,
        each row through its agent's adapter (None: the reference)."""
        first, stop = window
        kwargs = {"use_cache": False}  # scoring: no KV cache to build
        if self._takes_logits_to_keep:
            # Only the positions that predict a scored token get logits: (B, stop-first, V).
            kwargs["logits_to_keep"] = torch.arange(first - 1, stop - 1, device=input_ids.device)
        forward = self._eager_logits if self._compiled is None else self._compiled.logits
        length = common_prefix(input_ids, attention_mask, first - 1) if self.share_prefix else 0
        ids = [] if agent_id is None or not length else agent_id.unique().tolist()
        if length and not any(layer.active and layer.p > 0 for i in ids  # dropout: prefix.py
                              for layer in self._dropouts[self.agent_names[i]][:1]):
            self._layers = self._layers or decoder_layers(self.base_model)
            return prefix_logits(forward, len(self._layers), input_ids, attention_mask,
                                 agent_id, length, window, kwargs)
        logits = forward(input_ids, attention_mask, agent_id, kwargs)
        return logits if self._takes_logits_to_keep else logits[:, first - 1 : stop - 1]

    def _eager_logits(self, input_ids: Tensor, attention_mask: Tensor, agent_id: Tensor | None,
                      kwargs: dict, per_layer: list[LayerKV] | None = None) -> Tensor:
        """The eager forward's logits, each row through its agent's adapter (None: the
        reference); ``per_layer``: the shared prefix's keys/values (prefix.py)."""
        with layer_kv(self._layers, per_layer):
            if agent_id is None:
                with self.reference():
                    return self.peft_model(input_ids=input_ids, attention_mask=attention_mask,
                                           **kwargs).logits
            # the hooks add each row segment's own agent's delta to the base layers' outputs
            with segment_lora(self.lora_layers,
                              agent_segments(agent_id.tolist(), self.agent_names)):
                return self.peft_model(input_ids=input_ids, attention_mask=attention_mask,
                                       **kwargs).logits

    def enable_compile(self, backend: str = "inductor") -> None:
        """Route every forward of this model through compiled decoder layers, each row's
        own agent's LoRA picked per row (compiled.py; ``trainer.compile``). Refused with LoRA
        dropout on."""
        dropout = {name: layers[0].p for name, layers in self._dropouts.items() if layers}
        for name in self.agent_names:
            if dropout.get(name, 0) > 0:
                raise ValueError(f"trainer.compile=true needs LoRA dropout 0; agent {name!r} "
                                 f"has dropout {dropout[name]}")
        # Critics are compiled too, unless one has LoRA dropout (then all stay eager).
        critics = [] if any(dropout.get(n, 0) > 0 for n in self.critic_names) else self.critic_names
        self._compiled = CompiledForward(self.peft_model, [layer for _, layer in self.lora_layers],
                                         self.agent_names, backend, critics)

    def disable_compile(self) -> None:
        """Undo ``enable_compile``: eager forwards, no hooks left on the base model's layers
        (needed before another team compiles on the same base)."""
        if self._compiled is not None:
            self._compiled.close()
            self._compiled = None

    @torch.no_grad()
    def divergence_rows(self, input_ids: Tensor, attention_mask: Tensor, agent_a: str,
                        agent_b: str, *, positions: Tensor, temperature: float = 1.0,
                        forward_rows: int | None = None) -> Tensor:
        """(B,) each row's sum over its ``positions`` tokens of KL(p_a || p_b) in nats: how far
        agent_b's next-token distribution (softmax of logits / temperature, full vocabulary)
        is from agent_a's on the same rows, in forwards of at most ``forward_rows`` rows."""
        positions = positions.bool()
        rows = input_ids.shape[0]
        step = forward_rows or rows
        sums = torch.zeros(rows, dtype=torch.float64, device=input_ids.device)
        for start in range(0, rows, step):
            chunk = slice(start, start + step)
            window = response_window(positions[chunk])  # one column when nothing is scored
            first, stop = window
            logp = [torch.log_softmax(self._window_logits(
                        input_ids[chunk], attention_mask[chunk],
                        torch.full((len(input_ids[chunk]),), self.agent_index(agent),
                                   device=input_ids.device), window).float() / temperature, -1)
                    for agent in (agent_a, agent_b)]
            kl = (logp[0].exp() * (logp[0] - logp[1])).sum(-1)  # (b, stop - first)
            sums[chunk] = (kl * positions[chunk, first:stop]).sum(-1).double()
        return sums

    @torch.no_grad()
    def logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        agent_id: Tensor,
        *,
        positions: Tensor | None = None,
        temperature: float = 1.0,
        forward_rows: int | None = None,
        choices: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Per-row log-probs (B, T), each row through its own agent's adapter, in mixed-agent
        forwards of at most ``forward_rows`` rows (None: one forward). Given the branching
        points' legal tokens ``choices`` (B, T, C), the pair (those, the log-probs of the
        policy constrained decoding plays: ``algorithms.choices.move_logprobs``)."""
        return self._chunked(input_ids, attention_mask, agent_id, positions, temperature,
                             forward_rows, choices)

    @torch.no_grad()
    def reference_logprobs(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        *,
        positions: Tensor | None = None,
        temperature: float = 1.0,
        forward_rows: int | None = None,
    ) -> Tensor:
        """Log-probs (B, T) of the base model with every adapter disabled, in forwards of at
        most ``forward_rows`` rows (None: one forward)."""
        return self._chunked(input_ids, attention_mask, None, positions, temperature,
                             forward_rows)

    def _chunked(self, input_ids, attention_mask, agent_id, positions, temperature,
                 forward_rows, choices=None):
        """No-grad log-probs in forwards of at most ``forward_rows`` rows, sorted by
        agent so that each forward holds each agent's rows as one segment; with ``choices``,
        also the constrained policy's (a pair)."""
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        moves = None if choices is None else torch.zeros_like(out)
        count = input_ids.shape[0]
        step = forward_rows or max(1, count)
        order = (torch.arange(count, device=input_ids.device) if agent_id is None
                 else torch.sort(agent_id, stable=True).indices)
        for start in range(0, count, step):
            rows = order[start : start + step]
            scored = self.forward(
                input_ids[rows],
                attention_mask[rows],
                None if agent_id is None else agent_id[rows],
                positions=None if positions is None else positions[rows],
                temperature=temperature,
                choices=None if choices is None else choices[rows],
            )
            out[rows] = scored[0]
            if choices is not None:
                moves[rows] = move_logprobs(scored[0], scored[2], choices[rows],
                                            input_ids[rows])
        return out if choices is None else (out, moves)

    # ------------------------------------------------------------------ interchange
    def export_adapter(self, name: str) -> dict[str, Tensor]:
        """One agent's adapter tensors with PEFT's on-disk key names (detached CPU copies,
        read from the device in one transfer, not one wait per tensor)."""
        named = list(self.named_agent_tensors(name))
        return dict(zip([key for key, _ in named], host_copies([p for _, p in named]),
                        strict=True))

    @torch.no_grad()
    def import_adapter(self, name: str, tensors: dict[str, Tensor]) -> None:
        """Overwrite one agent's adapter with tensors from export_adapter (or a PEFT file)."""
        self._deferred.pop(name, None)  # these are newer
        params = dict(self.named_agent_tensors(name))
        if set(tensors) != set(params):
            missing = sorted(set(params) - set(tensors))[:3]
            extra = sorted(set(tensors) - set(params))[:3]
            raise ValueError(
                f"adapter tensors for agent {name!r} do not match its LoRA shape: "
                f"missing {missing}, unexpected {extra}"
            )
        for key, param in params.items():
            if tensors[key].shape != param.shape:
                raise ValueError(
                    f"adapter tensor {key} of agent {name!r} has shape "
                    f"{tuple(tensors[key].shape)}, expected {tuple(param.shape)}"
                )
            param.copy_(tensors[key].to(device=param.device, dtype=param.dtype))

    def defer_import(self, name: str, fetch: Callable[[], dict[str, Tensor]]) -> None:
        """Agent ``name``'s adapter is now ``fetch()``'s tensors (``export_adapter``'s
        format), imported when something first reads the agent's tensors (export, save,
        parameters): a copy that changes every step but is read only at checkpoints (a Ray
        controller's store) then moves only when read."""
        self._check_adapter(name)
        self._deferred[name] = fetch

    def import_deferred(self) -> None:
        """Import every deferred adapter now (before its source goes away)."""
        for name in list(self._deferred):
            self.import_adapter(name, self._deferred.pop(name)())

    def peft_config(self, name: str):
        """The PEFT LoraConfig of one agent (or critic)."""
        self._check_adapter(name)
        return self.peft_model.peft_config[name]

    def save_agent(self, name: str, directory: str | os.PathLike) -> Path:
        """Write one agent as a standard PEFT adapter folder (safetensors + adapter_config.json).

        Stock ``peft.PeftModel.from_pretrained(base, directory)`` and vLLM load it unchanged.
        """
        return write_peft_folder(directory, self.export_adapter(name), self.peft_config(name))

    def load_agent(self, name: str, directory: str | os.PathLike) -> None:
        """Load a PEFT adapter folder into an existing agent (shapes must match)."""
        from safetensors.torch import load_file

        path = Path(directory) / ADAPTER_WEIGHTS
        if not path.is_file():
            raise FileNotFoundError(f"no {ADAPTER_WEIGHTS} in {directory} (agent {name!r})")
        self.import_adapter(name, load_file(str(path)))
