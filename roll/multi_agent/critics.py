"""Critics: value models as adapters on the one frozen base (issue 13), their update, and the
critics of a run.

A critic is the shared base + its own LoRA adapter (held by the same PEFT model as the agents,
listed in ``MultiAgentLoRAModel.critic_names``, never synced to an engine) + a scalar value
head, ``Linear(hidden, 1)`` in fp32, zero-initialised (every value starts at 0). So invariant 2
holds: however many critics, the base exists once.

Values are per token: ``values[:, t]`` is V of the state in which token t was generated, i.e.
the head applied to the final hidden state at position t - 1 (the position whose output
predicts token t) — the alignment GAE reads (roll/algorithms/advantages.py). Token-level rather
than turn-level values, because the PPO loss is per token and GAE with gamma = lam = 1 over a
turn reduces to the turn's return minus its first value anyway.

Rows are routed to critics exactly as the agents' forward routes rows to agents: each
contiguous run of one critic's rows gets that critic's LoRA delta (``routing.segment_lora``),
with PEFT's own LoRA off, so a critic's gradients come from its own rows only.

Under ``trainer.compile`` (and no critic dropout) the critics' forwards run through the
agents' compiled decoder layers, each row routed to its own critic's factors (compiled.py):
a TicTacToe critic update of ~1,060 rows in micro-batches of 32 took 10.3 s eager and 9.2 s
compiled on an H100 (benchmarks/README.md, session 54).

A critic is saved as a standard PEFT adapter folder plus ``value_head.safetensors``.

Update (``CriticTrainer``): each critic trains its own LoRA adapter and value head on its own
rows. One train step = one optimizer step per critic that has rows: the clipped value loss
(``roll.algorithms.losses.value_loss``) of its rows against their return targets, token-mean
over the critic's response tokens, accumulated over micro-batches of ``micro_batch_size`` of
its rows (null: the trainer's), its gradient norm clipped to its ``optim.max_grad_norm``, then
its own AdamW and learning-rate schedule. The no-grad value pass runs in forwards of the
trainer's ``forward_rows`` (on a GPU an eager forward costs about the same for 8 rows as for
128: 8-row forwards made the critics 80% of a TicTacToe step on an H100). Critics never share
a forward here (one critic's micro-batch at a time; a critic is one forward more per step,
not a fused path), so invariant 1 holds as for agents:
critics trained together get exactly what each gets alone, and a critic without rows keeps its
weights and optimizer state bitwise. A non-finite loss or gradient norm in any critic refuses
the whole step before any critic moves.

Simplification, stated: one pass over the rows per step (no PPO epochs or mini-batches for
critics yet).

The run's critics (``Critics``, ``critic.mode``): which exist, their values before the
advantages, their update after the agents', their checkpoint folders.

    per_agent   critic_<agent> for each trained agent; a row's critic is its agent's (IPPO)
    shared      one centralised critic for every agent's rows (MAPPO)

The critics are adapters of the trainer's PEFT model (``MultiAgentLoRAModel(critics=...)``),
so the base stays one copy (invariant 2); engines never see them. In a step:

    rollout → old/reference log-probs → values (this module) → advantages (GAE reads values)
            → agents' update → critics' update on the returns (this module)

The values the advantages use are the critics' before their update, and the same values are
the clip anchors of the value loss.

``critic.input=global``: the critics read each row's global view (``critic_input_ids``: the
acting seat's prompt plus every seat's observation, then the same response tokens) instead of
the agent's prompt. Values and returns stay in the agents' (B, T) layout; they move between
the two layouts by response-token order (``relayout``), which both layouts share.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from roll.algorithms.losses import value_loss
from roll.batch import TrajectoryBatch
from roll.errors import NonFiniteLossError
from roll.multi_agent.config import AgentConfig, CriticConfig, TrainerConfig
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.optim import build_optimizer, clip_gradients, schedule
from roll.multi_agent.routing import agent_segments, segment_lora
from roll.multi_agent.strategy import GradSync, sum_gradients
from roll.utils.checkpoint import critic_dir

VALUE_HEAD = "value_head.safetensors"
SUMMED = ("value_loss", "value_clip_frac", "value_error")
"""A critic's loss parts, summed over its micro-batches (and data-parallel ranks)."""


class ValueHeads(nn.Module):
    """One scalar head per critic, ``Linear(hidden_size, 1)`` in fp32, zero-initialised."""

    def __init__(self, names: Sequence[str], hidden_size: int,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.heads = nn.ModuleDict()
        for name in names:
            head = nn.Linear(hidden_size, 1, device=device, dtype=torch.float32)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            self.heads[name] = head

    def forward(self, name: str, hidden: Tensor) -> Tensor:
        """Values (b, T) of hidden states (b, T, H) through ``name``'s head."""
        return self.heads[name](hidden.float()).squeeze(-1)


def critic_values(model: MultiAgentLoRAModel, heads: ValueHeads, input_ids: Tensor,
                  attention_mask: Tensor, critic_id: Tensor,
                  positions: Tensor | None = None,
                  segments: list[tuple[str, int, int]] | None = None) -> Tensor:
    """Values (B, T) of each row's critic (``critic_id`` (B,) indexes ``model.critic_names``):
    ``values[:, t]`` = V(state before token t); 0 at t = 0 and outside ``positions`` (B, T).
    Differentiable in the critics' adapters and heads. Keep each critic's rows contiguous
    (its dropout masks are then those of a forward of its rows alone). ``segments``: the
    rows' (critic, first, stop) runs when the caller knows them (else read from ``critic_id``,
    one wait for the device)."""
    if segments is None:
        segments = agent_segments(critic_id.tolist(), model.critic_names)
    compiled = model._compiled
    if compiled is not None and compiled.routes_critics:  # trainer.compile (compiled.py)
        hidden = compiled.hidden(input_ids, attention_mask, critic_id)
    else:
        kwargs = {"use_cache": False}
        if model._takes_logits_to_keep:
            kwargs["logits_to_keep"] = 1  # one position's logits: the values read hidden states
        # the segment hooks add each row's critic's delta to the base layers' outputs
        with segment_lora(model.lora_layers, segments):
            output = model.peft_model(input_ids=input_ids, attention_mask=attention_mask,
                                      output_hidden_states=True, **kwargs)
        hidden = output.hidden_states[-1]  # (B, T, H), after the final norm
    values = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    parts = [heads(name, hidden[first:stop, :-1]) for name, first, stop in segments]
    values = torch.cat([values[:, :1], torch.cat(parts)], dim=1) if parts else values
    if positions is not None:
        values = torch.where(positions.bool(), values, torch.zeros_like(values))
    return values


def save_critic(model: MultiAgentLoRAModel, heads: ValueHeads, name: str,
                directory: str | os.PathLike) -> Path:
    """A PEFT adapter folder (the critic's LoRA) + ``value_head.safetensors`` (its head)."""
    from safetensors.torch import save_file

    if name not in model.critic_names:
        raise KeyError(f"unknown critic {name!r}; critics are {model.critic_names}")
    folder = model.save_agent(name, directory)
    head = heads.heads[name]
    save_file({"weight": head.weight.detach().cpu().contiguous(),
               "bias": head.bias.detach().cpu().contiguous()}, str(folder / VALUE_HEAD))
    return folder


def load_critic(model: MultiAgentLoRAModel, heads: ValueHeads, name: str,
                directory: str | os.PathLike) -> None:
    """Load a folder written by ``save_critic`` into critic ``name`` (shapes must match)."""
    from safetensors.torch import load_file

    path = Path(directory) / VALUE_HEAD
    if not path.is_file():
        raise FileNotFoundError(f"no {VALUE_HEAD} in {directory} (critic {name!r})")
    model.load_agent(name, directory)
    tensors = load_file(str(path))
    head = heads.heads[name]
    with torch.no_grad():
        for key, param in (("weight", head.weight), ("bias", head.bias)):
            if tensors[key].shape != param.shape:
                raise ValueError(f"{path}: {key} has shape {tuple(tensors[key].shape)}, "
                                 f"expected {tuple(param.shape)}")
            param.copy_(tensors[key])


class CriticTrainer:
    """Per-critic AdamW over (its LoRA tensors, its head), clipped value loss.

    Args:
        model: holds the critics' adapters (``critic_names``) on the shared base.
        heads: their value heads.
        critics: each critic's config (name, lora, optim), in ``model.critic_names`` order.
    """

    def __init__(self, model: MultiAgentLoRAModel, heads: ValueHeads,
                 critics: Sequence[AgentConfig], config: CriticConfig,
                 grad_sync: GradSync | None = None,
                 trainer: TrainerConfig | None = None) -> None:
        if [c.name for c in critics] != model.critic_names:
            raise ValueError(f"critic trainer critics {[c.name for c in critics]} differ from "
                             f"the model's {model.critic_names}")
        self.model, self.heads, self.config = model, heads, config.validate()
        self.names = list(model.critic_names)
        self.grad_sync = grad_sync
        """Data-parallel ranks summing the critics' gradients (None: this process alone)."""
        trainer = trainer or TrainerConfig()
        self.micro_batch_size = config.micro_batch_size or trainer.micro_batch_size
        """Rows per forward/backward of the update (``critic.micro_batch_size``, else the
        agents' trainer's)."""
        self.forward_rows = trainer.forward_rows
        """Rows per forward of the no-grad value pass (the trainer's log-prob passes')."""
        self.rows_forwarded = 0
        """Rows this process ran forward/backward in the last ``backward`` (its share)."""
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        self.max_grad_norm = {critic.name: critic.optim.max_grad_norm for critic in critics}
        for critic in critics:
            optim = critic.optim
            params = [*model.agent_parameters(critic.name), *heads.heads[critic.name].parameters()]
            self.optimizers[critic.name] = build_optimizer(params, optim)
            self.schedulers[critic.name] = schedule(self.optimizers[critic.name], optim)

    def parameters(self, name: str) -> list[torch.nn.Parameter]:
        """Critic ``name``'s trained tensors: its adapter's, then its head's."""
        return list(self.optimizers[name].param_groups[0]["params"])

    @torch.no_grad()
    def values(self, batch: TrajectoryBatch, critic_id: Tensor) -> Tensor:
        """Values (B, T) on the response tokens, each row through its critic (``critic_id``
        (B,)), in forwards of at most ``forward_rows`` of one critic's rows."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32,
                          device=batch.input_ids.device)
        for name, rows in self._rows(critic_id).items():
            for chunk in rows.split(self.forward_rows):
                out[chunk] = self._forward(batch, critic_id, chunk, name)
        return out

    def train_step(self, batch: TrajectoryBatch, critic_id: Tensor) -> dict[str, dict[str, float]]:
        """One update of every critic with rows. ``batch`` needs ``values`` (the critics'
        values when the rows were scored) and ``returns`` (the targets), (B, T)."""
        return self.step(self.backward(batch, critic_id))

    def backward(self, batch: TrajectoryBatch, critic_id: Tensor) -> dict[str, dict[str, float]]:
        """The first half of ``train_step``: every critic's gradient, clipped and checked
        (a non-finite loss or norm raises ``NonFiniteLossError`` with every gradient dropped);
        nothing is stepped until ``step`` (or dropped by ``discard``). Returns the metrics
        so far.

        Data parallel (``grad_sync`` of k ranks, each given the whole batch): each rank
        forwards rows rank, rank + k, … of each critic, the normaliser is the whole batch's,
        and gradients and loss sums are summed over the ranks in one all-reduce before the
        clip and the check, so every rank steps the same gradient as one process would."""
        batch.require("values", "returns")
        rows_of = self._rows(critic_id)
        mask = batch.response_mask.float()
        sync, stream = self.grad_sync, "critic_dropout"
        parallel = sync is not None and sync.world_size > 1
        if parallel:
            stream = f"critic_dropout/rank{sync.rank}"
        sums = {name: dict.fromkeys(SUMMED, 0.0) for name in rows_of}
        steps = {name: self.schedulers[name].last_epoch for name in rows_of}
        self.discard()
        self.rows_forwarded = 0
        for name, rows in rows_of.items():
            normaliser = mask[rows].sum().clamp(min=1.0)
            mine = rows[sync.rank::sync.world_size] if parallel else rows
            self.rows_forwarded += len(mine)
            with self.model.training_forward({name: steps[name]}, stream):
                for micro in mine.split(self.micro_batch_size):
                    values = self._forward(batch, critic_id, micro, name)
                    loss, parts = value_loss(values, batch.values[micro], batch.returns[micro],
                                             mask[micro], clip=self.config.value_clip,
                                             normalizer=normaliser)
                    loss.backward()
                    share = mask[micro].sum() / normaliser
                    sums[name]["value_loss"] += loss.detach()
                    sums[name]["value_clip_frac"] += parts["value_clip_frac"] * share
                    sums[name]["value_error"] += parts["value_error"] * share
        if parallel:
            device = mask.device
            extra = torch.stack([torch.as_tensor(sums[name][key], device=device).float()
                                 for name in rows_of for key in SUMMED])
            params = [param for name in rows_of for param in self.parameters(name)]
            summed = sum_gradients(params, extra, sync).view(len(rows_of), len(SUMMED))
            sums = {name: dict(zip(SUMMED, summed[index], strict=True))
                    for index, name in enumerate(rows_of)}
        metrics: dict[str, dict[str, float]] = {}
        norms: dict[str, Tensor] = {}
        losses: dict[str, Tensor] = {}
        for name, rows in rows_of.items():
            losses[name] = torch.as_tensor(sums[name]["value_loss"])
            norms[name] = self._clip(name)
            metrics[name] = {key: float(value) for key, value in sums[name].items()}
            metrics[name]["num_rows"] = float(len(rows))
            metrics[name]["grad_norm"] = float(norms[name])
        self._refuse_non_finite(losses, norms)
        return metrics

    def step(self, metrics: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """The second half: step the critics ``backward`` prepared; returns its metrics."""
        for name in metrics:
            self.optimizers[name].step()
            self.schedulers[name].step()
        self.discard()
        return metrics

    def discard(self) -> None:
        """Drop the gradients ``backward`` prepared: no critic steps."""
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        """Optimizers and schedulers (adapters and heads are saved by ``save_critic``)."""
        return {"optimizers": {n: o.state_dict() for n, o in self.optimizers.items()},
                "schedulers": {n: s.state_dict() for n, s in self.schedulers.items()}}

    def load_state_dict(self, state: dict) -> None:
        for name in self.names:
            self.optimizers[name].load_state_dict(state["optimizers"][name])
            self.schedulers[name].load_state_dict(state["schedulers"][name])

    # ------------------------------------------------------------------ internals
    def _rows(self, critic_id: Tensor) -> dict[str, Tensor]:
        """Each critic with rows -> its rows (indices, in batch order)."""
        rows_of = {}
        for index, name in enumerate(self.names):
            rows = (critic_id == index).nonzero().squeeze(-1)
            if rows.numel():
                rows_of[name] = rows
        return rows_of

    def _forward(self, batch: TrajectoryBatch, critic_id: Tensor, rows: Tensor,
                 name: str) -> Tensor:
        """Values of ``rows``, every one of them critic ``name``'s."""
        return critic_values(self.model, self.heads, batch.input_ids[rows],
                             batch.attention_mask[rows], critic_id[rows],
                             positions=batch.response_mask[rows].bool(),
                             segments=[(name, 0, len(rows))])

    def _clip(self, name: str) -> Tensor:
        return clip_gradients(self.parameters(name), self.max_grad_norm[name])

    def _refuse_non_finite(self, losses: dict[str, Tensor], norms: dict[str, Tensor]) -> None:
        for name in losses:
            for what, value in (("value loss", losses[name]), ("gradient norm", norms[name])):
                if not math.isfinite(float(value)):
                    self.discard()
                    raise NonFiniteLossError(
                        f"critic {name!r}: {what} is {float(value)}; the critic step was "
                        "refused and no critic was updated")


SHARED_CRITIC = "critic"


def critic_agents(cfg: CriticConfig, agent_names: list[str]) -> list[AgentConfig]:
    """The critics ``cfg.mode`` asks for, as adapter configs (none for mode 'none')."""
    if cfg.mode == "none":
        return []
    names = ([f"critic_{name}" for name in agent_names] if cfg.mode == "per_agent"
             else [SHARED_CRITIC])
    return [AgentConfig(name, lora=cfg.lora, optim=cfg.optim) for name in names]


def relayout(x: Tensor, source_mask: Tensor, target_mask: Tensor) -> Tensor:
    """``x`` (B, T) moved from the response tokens of ``source_mask`` (B, T) to those of
    ``target_mask`` (B, T'), in order; zero elsewhere. Both masks must mark as many tokens per
    row (the same responses under different prompts)."""
    source, target = source_mask.bool(), target_mask.bool()
    if not torch.equal(source.sum(dim=1), target.sum(dim=1)):
        raise ValueError("relayout: the two layouts mark different response lengths")
    out = torch.zeros(target.shape, dtype=x.dtype, device=x.device)
    out[target] = x[source]  # row-major order: row by row, left to right in both
    return out


class Critics:
    """The run's critics on ``model`` (which must hold ``critic_agents(cfg, ...)``)."""

    def __init__(self, cfg: CriticConfig, model: MultiAgentLoRAModel,
                 critics: list[AgentConfig], grad_sync: GradSync | None = None,
                 trainer: TrainerConfig | None = None) -> None:
        """``trainer``: the agents' trainer config (None: its defaults), whose sizes the
        critics take where ``cfg`` leaves them null (micro-batch rows; the no-grad pass's
        rows)."""
        self._prepared: tuple[dict, dict[str, float]] | None = None
        self.mode = cfg.mode
        self.input = cfg.input
        self.model = model
        self.heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size,
                                model.tensor_device)
        self.trainer = CriticTrainer(model, self.heads, critics, cfg, grad_sync, trainer)

    @property
    def names(self) -> list[str]:
        return list(self.model.critic_names)

    def critic_id(self, batch: TrajectoryBatch) -> Tensor:
        """(B,) each row's critic, an index into ``names``."""
        if self.mode == "per_agent":
            return batch.agent_id  # critic_<agent i> is critic i
        return torch.zeros_like(batch.agent_id)

    def with_values(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch`` with ``values`` (B, T): each row's critic's V before each response token."""
        view = self._view(batch)
        values = self.trainer.values(view, self.critic_id(batch))
        if view is not batch:
            values = relayout(values, view.response_mask, batch.response_mask)
        return batch.with_fields(values=values)

    def train_step(self, batch: TrajectoryBatch) -> dict[str, float]:
        """One update of every critic with rows (``batch`` has ``values`` and ``returns``);
        metrics ``critic/<critic>/<name>`` plus ``critic/explained_variance`` of the values
        it was given (1: the values predicted the returns, 0: no better than their mean)."""
        self.backward(batch)
        return self.step()

    def backward(self, batch: TrajectoryBatch) -> dict[str, float]:
        """``train_step``'s first half: every critic's gradient, checked (``NonFiniteLossError``
        names the critic, nothing kept); no critic steps until ``step()`` or ``discard()``.
        Returns the metrics ``step()`` will."""
        view = self._view(batch)
        if view is not batch:
            view = view.with_fields(**{
                name: relayout(getattr(batch, name), batch.response_mask, view.response_mask)
                for name in ("values", "returns")})
        per_critic = self.trainer.backward(view, self.critic_id(batch))
        metrics = {f"critic/{critic}/{key}": value
                   for critic, parts in per_critic.items() for key, value in parts.items()}
        mask = batch.response_mask.bool()
        returns, values = batch.returns[mask].float(), batch.values[mask].float()
        if returns.numel() > 1:
            variance = returns.var(unbiased=False)
            residual = (returns - values).var(unbiased=False)
            metrics["critic/explained_variance"] = float(
                1.0 - residual / variance) if variance > 0 else 0.0
        self._prepared = (per_critic, metrics)
        return metrics

    def step(self) -> dict[str, float]:
        """Step the critics ``backward`` prepared; their metrics."""
        per_critic, metrics = self._prepared
        self._prepared = None
        self.trainer.step(per_critic)
        return metrics

    def discard(self) -> None:
        """Drop what ``backward`` prepared: no critic steps."""
        self._prepared = None
        self.trainer.discard()

    def _view(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """The rows as the critics read them: ``batch`` itself (critic.input=local) or its
        global-view layout (critic.input=global)."""
        if self.input == "local":
            return batch
        if batch.critic_input_ids is None:
            raise ValueError("critic.input='global': the batch has no critic_input_ids (the "
                             "rollout must render global views: RolloutConfig.critic_view)")
        return batch.with_fields(input_ids=batch.critic_input_ids,
                                 attention_mask=batch.critic_attention_mask,
                                 response_mask=batch.critic_response_mask)

    # ------------------------------------------------------------------ tensors, checkpoints
    def export_tensors(self) -> dict[str, dict[str, dict[str, Tensor]]]:
        """Every critic's trained tensors on CPU: ``{critic: {"adapter": PEFT-keyed LoRA
        tensors, "head": {"weight", "bias"}}}`` (what travels between Ray ranks and the
        pipeline: KBs to MBs, never the base)."""
        return {name: {"adapter": self.model.export_adapter(name),
                       "head": {key: param.detach().cpu().clone() for key, param
                                in self.heads.heads[name].named_parameters()}}
                for name in self.names}

    @torch.no_grad()
    def load_tensors(self, tensors: dict[str, dict[str, dict[str, Tensor]]]) -> None:
        """Overwrite critics' adapters and heads with ``export_tensors()``'s output."""
        for name, parts in tensors.items():
            self.model.import_adapter(name, parts["adapter"])
            for key, param in self.heads.heads[name].named_parameters():
                param.copy_(parts["head"][key])

    def save(self, checkpoint: Path) -> None:
        """Each critic's folder (PEFT adapter + value head) under ``checkpoint/critics/``."""
        for name in self.names:
            save_critic(self.model, self.heads, name, critic_dir(checkpoint, name))

    def state_dict(self) -> dict:
        return {"mode": self.mode, "names": self.names, "trainer": self.trainer.state_dict()}

    def load(self, checkpoint: Path, state: dict | None) -> None:
        """Adapters, heads, optimizers and schedulers from a checkpoint ``save`` wrote into
        (``state``: ``state_dict()`` as saved in the trainer state)."""
        if state is None or state["names"] != self.names:
            saved = "no critics" if state is None else f"critics {state['names']}"
            raise ValueError(f"resume={str(checkpoint)!r}: the checkpoint has {saved}, the "
                             f"config's critic.mode={self.mode!r} asks for {self.names}")
        for name in self.names:
            load_critic(self.model, self.heads, name, critic_dir(checkpoint, name))
        self.trainer.load_state_dict(state["trainer"])
