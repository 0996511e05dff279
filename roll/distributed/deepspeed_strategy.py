"""``actor_train.strategy=deepspeed``: DeepSpeed ZeRO-2/3 holds the adapters' optimizer.

The PEFT model with every agent's adapter is built first; ``deepspeed.initialize`` then wraps it
with ONE optimizer that has one parameter group per agent (``AgentGroupAdamW``). ZeRO-2 shards
that optimizer's state and its fp32 master weights over the ranks. ZeRO-3 shards the
parameters as well, the frozen base included, and gathers them per layer where they are used.

ZeRO-3's forwards and backwards are collectives (each layer's weights are all-gathered), so
every rank must run the same layers in the same order the same number of times:
- each decoder layer (or, ``gather="projection"``, each adapted projection) is one ZeRO
  "leaf": its base weights and every agent's A/B are gathered at once, so which agents' rows a
  forward holds never changes what is gathered, and no hooks run inside it (per projection,
  the hooks of 7 projections and their norms per layer made a 0.6B step 3.49x ZeRO-2's on an
  H100; per layer 2.25x);
- a rank with fewer forward/backward passes in a mini-batch round than another runs the
  difference on one row with a zero loss, its gradients dropped (``_padding_pass``);
- the adapters are gathered (``_gathered``) wherever the trainer reads or writes them whole:
  handing gradients to ZeRO, export, load, the refusal snapshot.

Why one engine with per-agent groups, not one engine per agent: a fused forward puts several
agents' LoRA in one graph, and per-agent ZeRO engines each hook the same backward (measured on
DeepSpeed 0.19.8: ZeRO-2 stops with "Gradient computed twice for this partition"); one engine
reduces and steps every agent in one pass.

Invariant 1 across ranks, and what DeepSpeed does or does not do:
- each rank computes its share's gradients with ``torch.autograd.grad`` (DeepSpeed's gradient
  hooks stay out of the uneven, agent-dependent graphs), then the trainer sums them over ranks,
  clips each agent by its own max_grad_norm and refuses NaN/inf BEFORE anything steps — the very
  code of the torch strategy (a ``TorchStrategy`` over stand-ins of the adapter tensors:
  roll/multi_agent/strategy.py);
- the finished gradients reach DeepSpeed through one backward of ``sum(p * g)`` over every
  adapter tensor (ZeRO-2), the same graph on every rank, so ZeRO's reduce-scatter lines up, or
  straight into ZeRO-3's reduce-scatter buckets (its own hooks fire on the leaf layers'
  backward, which this trainer's passes must not feed); every rank feeds the same ``g``, so
  ZeRO's average is ``g`` exactly;
- ``AgentGroupAdamW`` steps only the groups of agents that have a gradient this round: an idle
  agent's weights and moments stay bitwise (AdamW on a zero gradient would still move both);
- learning rates come from each agent's own LambdaLR, exactly as in the torch strategy;
- checkpoints hold the same per-agent AdamW state dicts as the torch strategy (gathered from
  the shards), so either strategy resumes the other's checkpoint at any number of ranks.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from functools import partial

import torch
from torch import Tensor, nn

from roll.distributed.zero3_memory import (
    base_stays_gathered,
    release_after_each_use,
    save_weights_not_views,
)
from roll.multi_agent.config import AgentConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.strategy import GradSync, TorchStrategy

ZERO_STAGES = (2, 3)
ZERO3_GATHERS = ("layer", "projection")
"""What ZeRO-3 gathers whole at once (``actor_train.zero3_gather``)."""


class AgentGroupAdamW(torch.optim.AdamW):
    """AdamW with one parameter group per agent (``group["agent"]``) that steps only the
    groups of the agents in ``active``; another group only gets the zero state torch's AdamW
    would create on a first step (DeepSpeed links its shards to the state after a first step).

    ZeRO hands this optimizer its own flat fp32 shards as the groups' params and may call
    ``step()`` once per group with ``param_groups`` cut to that group: groups are told apart by
    their ``agent`` key, never by position.
    """

    def __init__(self, groups: list[dict]) -> None:
        super().__init__(groups, foreach=False)
        self.active: set[str] = set()
        self.agent_groups = list(self.param_groups)
        """Every agent's group dict (ZeRO swaps their params for its shards in place)."""

    @torch.no_grad()
    def step(self, closure=None):
        every = self.param_groups
        for group in self.agent_groups:
            if group["agent"] not in self.active:
                for param in group["params"]:
                    if not self.state[param]:
                        self.state[param].update(
                            step=torch.tensor(0.0), exp_avg=torch.zeros_like(param),
                            exp_avg_sq=torch.zeros_like(param))
        self.param_groups = [group for group in every if group["agent"] in self.active]
        try:
            if self.param_groups:
                super().step(closure)
        finally:
            self.param_groups = every


def zero3_leaf_types(model: MultiAgentLoRAModel, gather: str) -> list[type]:
    """The module types ZeRO-3 gathers whole (its "leaf" modules: no hooks inside them)."""
    projections = list({type(layer) for _, layer in model.lora_layers})
    if gather == "projection":
        return projections
    names = set(getattr(model.base_model, "_no_split_modules", None) or ())
    layers = list({type(module) for module in model.base_model.modules()
                   if type(module).__name__ in names})
    if not layers:
        print(f"actor_train.zero3_gather=layer: {type(model.base_model).__name__} names no "
              "decoder layer (_no_split_modules); gathering per projection", flush=True)
        return projections
    return layers


def list_leaf_parameters_once(model: nn.Module, leaf_types: Sequence[type]) -> None:
    """Each ZeRO-3 leaf module of ``model`` answers ``named_parameters()`` from a listing made
    here, once.

    DeepSpeed's fetch and release of a leaf (before and after its forward, and again around
    its backward) each call ``leaf.named_parameters(recurse=True)``, which walks every module
    inside the leaf: a decoder layer holds ~150 with PEFT's LoRA modules of four agents, and
    those walks took 12-16% of a 28-layer ZeRO-3 step on this project's CPU
    (benchmarks/README.md, "the leaves' parameters listed once"). What a leaf holds is fixed
    once DeepSpeed has wrapped the model (every adapter and critic is injected before), so the
    listing stays right; a call with other arguments still walks."""
    for module in model.modules():
        if isinstance(module, tuple(leaf_types)):
            listing = list(type(module).named_parameters(module))
            module.__dict__["named_parameters"] = partial(_listed, module, listing)


def _listed(module: nn.Module, listing: list[tuple[str, nn.Parameter]], prefix: str = "",
            recurse: bool = True, remove_duplicate: bool = True) -> Iterator:
    if prefix == "" and recurse and remove_duplicate:
        return iter(listing)
    return type(module).named_parameters(module, prefix, recurse, remove_duplicate)


PERSIST_ELEMENTS = 100_000
"""ZeRO-3: tensors of at most this many elements stay whole on every rank by default (DeepSpeed's
own default threshold): every LoRA tensor of a 0.6B-8B base at rank 32 and the norms, never a
base weight matrix of such a model."""


def deepspeed_config(stage: int, live_elements: int | None = None,
                     persist_elements: int = 0) -> dict:
    """The engine's config: ZeRO ``stage``, no clipping or scaling of its own (the trainer
    clips per agent), fp32 reduction; stage 3: at most ``live_elements`` gathered at once and
    prefetched (None: DeepSpeed's defaults), tensors of at most ``persist_elements`` elements
    kept whole (0: every tensor partitioned, as the partitioned load builds the base)."""
    if stage not in ZERO_STAGES:
        raise ValueError(f"actor_train.zero_stage={stage!r}: must be 2 or 3")
    zero = {"stage": stage, "reduce_bucket_size": 50_000_000}
    if stage == 3:
        # Persistent tensors are never gathered or released: each one left partitioned costs
        # host time at every gather and release of its layer (DeepSpeed walks and partitions a
        # layer's tensors one by one, and a layer holds 14 LoRA tensors per agent beside its 7
        # weights). On a CPU, a 28-layer model with four agents: a ZeRO-3 step ~1.9x a ZeRO-2
        # step with nothing persistent, ~1.5x with the adapters and norms whole
        # (benchmarks/README.md). The engine applies the threshold to every tensor, the
        # base's too: its norms persist, its weight matrices (over 100k at 0.6B) do not.
        zero["stage3_param_persistence_threshold"] = persist_elements
        # Keep torch's own linear: DeepSpeed's "memory-efficient" one (the default) replaces
        # torch.nn.functional.linear for the whole process, runs a matmul where torch fuses
        # an addmm and gathers a weight again in the backward; our leaves (a decoder layer,
        # or an adapted projection) are gathered whole in their forward and backward already.
        zero["memory_efficient_linear"] = False
        if live_elements is not None:
            # Live: gathered at once; prefetch: fetched ahead; reuse distance: a gathered
            # weight used again within this many elements (the backward after a forward) is
            # kept, which by default keeps a small model whole through a step.
            for key in ("max_live_parameters", "prefetch_bucket_size", "max_reuse_distance"):
                zero[f"stage3_{key}"] = live_elements
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": zero,
        "communication_data_type": "fp32",
        "steps_per_print": 2**31 - 1,
    }


class DeepSpeedStrategy:
    """A ``TrainStrategy`` (roll/multi_agent/strategy.py) whose adapters' optimizer lives in a
    DeepSpeed ZeRO engine: ``MultiAgentTrainer(..., strategy=DeepSpeedStrategy(stage, sync))``.

    Needs ``torch.distributed`` initialised (the Ray train ranks do it); every method is a
    collective: call the trainer's public methods on every rank.
    """

    def __init__(self, zero_stage: int, grad_sync: GradSync | None = None,
                 live_elements: int | None = None, gather: str = "layer",
                 persist_elements: int = PERSIST_ELEMENTS) -> None:
        if gather not in ZERO3_GATHERS:
            raise ValueError(f"gather={gather!r}: must be one of {list(ZERO3_GATHERS)}")
        self.zero_stage = zero_stage
        self.gather = gather
        """ZeRO-3: what is gathered whole at once ("layer": each decoder layer of the base,
        its projections, norms and every agent's adapters; "projection": each adapted
        projection with every agent's A/B)."""
        self.live_elements = live_elements
        """ZeRO-3: the most elements gathered at once, prefetched and kept for reuse
        (``deepspeed_config``)."""
        self.persist_elements = persist_elements
        """ZeRO-3: tensors of at most this many elements are kept whole on every rank (the
        adapters' and the norms', at the usual sizes; ``deepspeed_config``)."""
        self.leaf_types: list[type] = []
        """ZeRO-3: the module types gathered whole (set up by ``setup``)."""
        self.carriers = TorchStrategy(grad_sync)
        """Per agent an AdamW over stand-ins of its adapter tensors (one element of memory
        each) that never steps: they carry the gradients (the real tensors' .grad belongs to
        ZeRO's hooks), the hyperparameters and the LambdaLR schedules; summed over ranks and
        clipped by the torch strategy's own code."""

    @property
    def grad_sync(self) -> GradSync | None:
        return self.carriers.grad_sync

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return self.carriers.optimizers

    @property
    def schedulers(self) -> dict[str, torch.optim.lr_scheduler.LambdaLR]:
        return self.carriers.schedulers

    def setup(self, model: MultiAgentLoRAModel, agents: Sequence[AgentConfig]) -> None:
        if model.peft_model.training:
            raise ValueError("the team must be in eval mode (dropout only in training_forward)")
        if str(next(model.parameters()).device) == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        # Each rank sees one device (a Ray actor gets its own GPU as cuda:0).
        os.environ.setdefault("LOCAL_RANK", "0")
        import deepspeed

        model._all_trainable()
        zero_stage = self.zero_stage
        if zero_stage == 3:  # a released weight must free its memory (zero3_memory.py)
            save_weights_not_views(model.peft_model)
        self.model = model
        self.agent_names = model.agent_names
        self.params = {agent.name: model.agent_parameters(agent.name) for agent in agents}
        if zero_stage == 3:
            # One forward per micro-batch: ZeRO-3 releases a layer's partitions after its
            # forward, and a backward through a second forward of it (the shared prefix's,
            # prefix.py) found them empty.
            model.share_prefix = False
            # Each adapted layer (its base weight and every agent's A/B) is gathered as one:
            # which agents a forward routes to then never changes the ranks' collectives.
            from deepspeed.utils import set_z3_leaf_modules

            self.leaf_types = zero3_leaf_types(model, self.gather)
            set_z3_leaf_modules(model, self.leaf_types)
        self.inner = AgentGroupAdamW([
            dict(params=self.params[agent.name], agent=agent.name, lr=agent.optim.lr,
                 betas=tuple(agent.optim.betas), eps=agent.optim.eps,
                 weight_decay=agent.optim.weight_decay)
            for agent in agents])
        deepspeed.init_distributed(dist_backend="gloo" if self._on_cpu() else "nccl")
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=self.inner,
                                               config=deepspeed_config(
                                                   zero_stage, self.live_elements,
                                                   self.persist_elements))
        if zero_stage == 3:
            for handle in self.engine.optimizer._leaf_module_hooks:
                handle.remove()
            list_leaf_parameters_once(model, self.leaf_types)
            if not base_stays_gathered(model, self.live_elements):
                release_after_each_use(self.engine)
        model.peft_model.eval()
        self.adam_steps = dict.fromkeys(self.agent_names, 0)
        stand_ins = {}
        for agent in agents:
            tensors = [torch.zeros((), dtype=param.dtype, device=param.device)
                       .expand(_whole_shape(param)) for param in self.params[agent.name]]
            stand_ins[agent.name] = torch.optim.AdamW(
                tensors, lr=agent.optim.lr, betas=tuple(agent.optim.betas), eps=agent.optim.eps,
                weight_decay=agent.optim.weight_decay)
        self.carriers.setup(model, agents, optimizers=stand_ins)
        self.step([])  # no agent moves: ZeRO-2 links its shards to the state a 1st step makes

    def _on_cpu(self) -> bool:
        return str(next(iter(self.params.values()))[0].device) == "cpu"

    def _gathered(self, modify: bool = False):
        """ZeRO-3: every adapter tensor whole on every rank while inside (a collective);
        ``modify``: what rank 0 writes is partitioned back on exit. ZeRO-2: nothing to do."""
        if self.zero_stage != 3:
            return nullcontext()
        import deepspeed

        params = [p for params in self.params.values() for p in params]
        return deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None)

    # ------------------------------------------------------------------ gradients
    def _stand_ins(self, name: str) -> list[Tensor]:
        return self.carriers.carriers(name)

    def _grad(self, total: Tensor, params: list[Tensor]) -> tuple[Tensor | None, ...]:
        """d total / d params, outside DeepSpeed's backward; ZeRO-3 then releases what its
        backward hooks left gathered (layers whose input needs no gradient)."""
        grads = torch.autograd.grad(total, params, allow_unused=True)
        if self.zero_stage == 3:
            self.engine.optimizer.backward_epilogue()
        return grads

    def backward(self, total: Tensor, names: list[str]) -> None:
        params = [p for name in names for p in self.params[name]]
        grads = self._grad(total, params)
        stand_ins = [s for name in names for s in self._stand_ins(name)]
        for stand_in, grad in zip(stand_ins, grads, strict=True):
            if grad is not None:
                stand_in.grad = grad if stand_in.grad is None else stand_in.grad + grad

    def padding_passes(self, passes: int) -> int:
        """ZeRO-3 gathers each layer's weights in every forward and backward, a collective:
        a rank with fewer passes this round than another pads with that many more (agreed
        before any pass runs)."""
        if self.zero_stage != 3:
            return 0
        import torch.distributed as dist

        most = torch.tensor([passes], device=self.engine.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most) - passes

    def padding_backward(self, loss: Tensor, name: str) -> None:
        self._grad(loss, self.params[name])

    def sum_over_ranks(self, names: list[str], extra: Tensor) -> Tensor:
        return self.carriers.sum_over_ranks(names, extra)

    def clip(self, name: str, limit: float) -> Tensor:
        return self.carriers.clip(name, limit)

    def zero_grad(self, names: list[str]) -> None:
        self.carriers.zero_grad(names)

    def step(self, names: list[str]) -> None:
        stepping = [name for name in names
                    if any(s.grad is not None for s in self._stand_ins(name))]
        grads = {name: [s.grad for s in self._stand_ins(name)] for name in self.agent_names}
        for params in self.params.values():
            for param in params:
                param.grad = None
        self.inner.active = set(stepping)
        for name in stepping:
            group = self.inner.param_groups[self.agent_names.index(name)]
            group["lr"] = self.optimizers[name].param_groups[0]["lr"]
        # What engine.forward() would do first (the surrogate stands in for a forward): reset
        # ZeRO's per-backward hook counters.
        self.engine.optimizer.clear_backward_seen_flag()
        if self.zero_stage == 3:
            self._reduce_directly(grads)
        else:
            surrogate = torch.zeros((), device=self.engine.device)
            for name, params in self.params.items():
                for param, grad in zip(params, grads[name], strict=True):
                    if grad is None:
                        grad = torch.zeros_like(param)
                    surrogate = surrogate + (param * grad.detach()).sum()
            self.engine.backward(surrogate)
        self.engine.step()
        self.inner.active = set()
        for name in stepping:
            self.adam_steps[name] += 1

    def _reduce_directly(self, grads: dict[str, list[Tensor | None]]) -> None:
        """ZeRO-3: hand the finished gradients to ZeRO's reduce-scatter buckets as its own
        backward hooks would (those hooks sit on the adapted layers as leaf modules and were
        removed: the trainer's passes must not feed them)."""
        optimizer = self.engine.optimizer
        with self._gathered():
            for name, params in self.params.items():
                for param, grad in zip(params, grads[name], strict=True):
                    param.grad = torch.zeros_like(param) if grad is None else grad.detach()
                    optimizer.reduce_independent_p_g_buckets_and_remove_grads(param)
        optimizer.independent_gradient_partition_epilogue()

    # ------------------------------------------------------------------ state
    def export_adapters(self, names: Sequence[str]) -> dict[str, dict[str, Tensor]]:
        with self._gathered():
            return {name: self.model.export_adapter(name) for name in names}

    def load_adapters(self, adapters: dict[str, dict[str, Tensor]]) -> None:
        """The model's tensors AND ZeRO's fp32 master copies (which the next step updates)."""
        from deepspeed.utils import safe_set_full_fp32_param

        with self._gathered(modify=True):
            self.carriers.load_adapters(adapters)
        for name, tensors in adapters.items():
            for key, param in self.model.named_agent_tensors(name):
                safe_set_full_fp32_param(param, tensors[key].to(self.engine.device).float())

    def state_dict(self) -> dict:
        """The torch strategy's format: per-agent AdamW state dicts, gathered from ZeRO."""
        from deepspeed.utils import safe_get_full_optimizer_state

        state = self.carriers.state_dict()
        for name, params in self.params.items():
            if not self.adam_steps[name]:
                continue
            step = torch.tensor(float(self.adam_steps[name]))
            state["optimizers"][name]["state"] = {
                index: {"step": step.clone(),
                        **{key: safe_get_full_optimizer_state(param, key).detach().cpu().clone()
                           for key in ("exp_avg", "exp_avg_sq")}}
                for index, param in enumerate(params)}
        return state

    def load_state_dict(self, state: dict) -> None:
        from deepspeed.utils import safe_set_full_optimizer_state

        self.carriers.load_state_dict(state)
        for name, params in self.params.items():
            saved = state["optimizers"][name]["state"]
            self.optimizers[name].state.clear()
            steps = int(saved[0]["step"]) if saved else 0
            self.adam_steps[name] = steps
            for index, param in enumerate(params):
                for key in ("exp_avg", "exp_avg_sq"):
                    value = saved[index][key] if saved else torch.zeros(_whole_shape(param))
                    safe_set_full_optimizer_state(param, value.to(param.device).float(), key)
            flat = self._shards()[self.agent_names.index(name)]
            self.inner.state[flat]["step"] = torch.tensor(float(steps))

    def _shards(self) -> list[Tensor]:
        """This rank's ZeRO fp32 shard of each agent's group (what the inner AdamW steps)."""
        optimizer = self.engine.optimizer
        if self.zero_stage == 3:
            return optimizer.fp32_partitioned_groups_flat
        return optimizer.single_partition_of_fp32_groups

    def snapshot(self, names: list[str]) -> dict:
        """This rank's own copy of what a step changes: the model's adapter tensors, its fp32
        shards and their AdamW state, the schedules. Each rank restores its own (under ZeRO-3
        gathering the adapters is a collective: every rank snapshots and restores together, as
        every rank plans the same rounds and refuses the same non-finite step)."""
        with self._gathered():
            params = [p.detach().clone() for params in self.params.values() for p in params]
        return {
            "params": params,
            "shards": [shard.detach().clone() for shard in self._shards()],
            "moments": [{key: value.clone() for key, value in self.inner.state[shard].items()}
                        for shard in self._shards()],
            "schedulers": {name: copy.deepcopy(s.state_dict())
                           for name, s in self.schedulers.items()},
            "adam_steps": dict(self.adam_steps),
        }

    @torch.no_grad()
    def restore(self, snapshot: dict) -> None:
        params = [p for params in self.params.values() for p in params]
        with self._gathered(modify=True):
            for param, saved in zip(params, snapshot["params"], strict=True):
                param.copy_(saved)
        for shard, saved, moments in zip(self._shards(), snapshot["shards"], snapshot["moments"],
                                         strict=True):
            shard.copy_(saved)
            for key, value in moments.items():  # in place: ZeRO holds views of these tensors
                self.inner.state[shard][key].copy_(value)
        for name, state in snapshot["schedulers"].items():
            self.schedulers[name].load_state_dict(state)
        self.adam_steps = dict(snapshot["adam_steps"])


def _whole_shape(param: Tensor) -> torch.Size:
    """A parameter's shape, also while ZeRO-3 holds only this rank's partition of it."""
    return getattr(param, "ds_shape", param.shape)


__all__ = ["AgentGroupAdamW", "DeepSpeedStrategy", "ZERO_STAGES", "deepspeed_config"]
