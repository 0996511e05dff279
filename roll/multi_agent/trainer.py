"""Per-agent training: split a batch by ``agent_id`` and update each adapter on its own rows.

Each agent has its own AdamW, its own gradient-norm clipping and its own learning-rate schedule,
counted in its own optimizer steps. An agent with no rows in a step is not touched at all: no
forward, no ``optimizer.step()`` (AdamW would still decay its weights and advance its moments),
no scheduler step — so its weights and optimizer state stay bitwise equal (DESIGN.md invariant 1).

One train step, per agent: ``ppo_epochs`` passes over its rows; each pass shuffles them with the
agent's own generator and cuts them into mini-batches of ``ppo_mini_batch_size`` rows; each
mini-batch is one optimizer step (gradients accumulated over micro-batches, the loss normalised
by the mini-batch). Fused (the default), micro-batches of several agents are packed into ONE
forward/backward of at most micro_batch_size rows in which each row uses its own agent's
adapter; each agent's gradient reaches only its own A/B because each agent's loss reads only its
own rows. The agents advance in
ROUNDS: round k computes every agent's k-th mini-batch gradient, then checks every agent's loss
and gradient norm, then steps all of them. A NaN/inf anywhere refuses the whole step: nothing
is stepped in that round, and adapters, optimizers and schedulers are restored to the start of
the step if an earlier round had already stepped (invariant 5: no agent half-updated).

Data parallel (``grad_sync``, see roll/distributed/data_parallel.py): every rank holds the same
adapters and optimizers and gets the whole batch, so every rank makes the same plan (mini-batches,
normalisers). Each rank forwards only its share of each agent's mini-batch (rows rank, rank + k,
...), then the gradients, losses and metric sums of the round are summed over ranks in one
all-reduce, so clipping, the NaN check and the optimizer steps see the gradient of the whole
mini-batch and stay identical on every rank. Equal to one process up to the order of the sums
(exactly so without LoRA dropout: each rank draws its own dropout masks).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from roll.algorithms.losses import aggregate, kl_loss, ppo_policy_loss
from roll.batch import TrajectoryBatch
from roll.errors import NonFiniteLossError
from roll.multi_agent.config import AgentConfig, TrainerConfig
from roll.multi_agent.model import MultiAgentLoRAModel, agent_stream_seed
from roll.multi_agent.optim import adamw, clip_gradients, schedule

METRIC_PARTS = ("loss", "policy_loss", "kl_ref", "entropy", "clip_frac", "approx_kl", "grad_norm")
_SUMMED_PARTS = METRIC_PARTS[:-1]  # summed over ranks; grad_norm is taken after the sum


class GradSync(Protocol):
    """How data-parallel ranks share a round's gradients (roll/distributed implements it)."""

    rank: int
    world_size: int

    def all_reduce(self, flat: Tensor) -> Tensor:
        """The element-wise sum of ``flat`` over all ranks (same shape, same device)."""
        ...


class MultiAgentTrainer:
    """Updates every agent's adapter from one mixed batch.

    Args:
        model: the team's MultiAgentLoRAModel.
        agents: resolved agent configs (``optim`` set), in agent-id order.
        config: loss and batching settings shared by the team.
        temperature: the rollouts' sampling temperature (> 0; use 1 for greedy rollouts):
            every log-prob, ratio, KL and entropy is taken at it, as the engines report them.
        grad_sync: data-parallel ranks (module docstring); None: this process alone.
    """

    def __init__(
        self,
        model: MultiAgentLoRAModel,
        agents: Sequence[AgentConfig],
        config: TrainerConfig,
        temperature: float = 1.0,
        grad_sync: GradSync | None = None,
    ) -> None:
        if [a.name for a in agents] != model.agent_names:
            raise ValueError(
                f"trainer agents {[a.name for a in agents]} differ from model agents "
                f"{model.agent_names}"
            )
        if not temperature > 0:
            raise ValueError(f"temperature={temperature!r}: must be > 0 (greedy rollouts: use 1)")
        self.model = model
        self.config = config.validate()
        if self.config.compile:
            model.enable_compile(self.config.compile_backend)
        self.temperature = float(temperature)
        self.agent_names = model.agent_names
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        for agent in agents:
            optim = agent.optim
            params = model.optimizer_parameters(agent.name)
            optimizer = adamw(params, optim)
            self.optimizers[agent.name] = optimizer
            self.schedulers[agent.name] = schedule(optimizer, optim)
        self.max_grad_norm = {agent.name: agent.optim.max_grad_norm for agent in agents}
        self.global_step = 0
        self.grad_sync = grad_sync
        self.rows_forwarded = 0
        """Rows this process ran forward/backward on in its last train step (its share)."""

    # ------------------------------------------------------------------ public
    def train_step(self, batch: TrajectoryBatch) -> dict[str, dict[str, float]]:
        """One update of every agent that has rows; returns metrics keyed by agent name."""
        batch.require("advantages")
        batch = self._with_behaviour_logprobs(batch)
        own: dict[str, Tensor] = {}  # agent -> its rows (indices into batch)
        ids = batch.agent_id.tolist()  # one device->host copy, not one per agent
        for index, name in enumerate(self.agent_names):
            rows = [row for row, agent in enumerate(ids) if agent == index]
            if rows:
                own[name] = torch.tensor(rows, device=batch.agent_id.device)
        plan = {name: [rows[mini.to(rows.device)] for mini in self._mini_batches(name, len(rows))]
                for name, rows in own.items()}
        rounds = max((len(minis) for minis in plan.values()), default=0)
        self.rows_forwarded = 0
        snapshot = self._snapshot(list(own)) if rounds > 1 else None
        sums = {name: dict.fromkeys(METRIC_PARTS, 0.0) for name in own}
        try:
            for round_index in range(rounds):
                minis = {name: plan[name][round_index] for name in own
                         if round_index < len(plan[name])}
                checks = self._backward(batch, minis, sums)
                self._refuse_non_finite(checks, round_index, rounds)
                self._step(list(minis))
        except NonFiniteLossError:
            if snapshot is not None:
                self._restore(snapshot)
            raise
        finally:
            for name in own:
                self.optimizers[name].zero_grad(set_to_none=True)
        self.global_step += 1
        return self._metrics(batch, own, sums, {name: len(plan[name]) for name in own})

    def state_dict(self) -> dict:
        """Optimizers, schedulers and the step counter (adapters are saved as PEFT folders)."""
        return {
            "global_step": self.global_step,
            "optimizers": {name: self.model.portable_optimizer_state(name, opt.state_dict())
                           for name, opt in self.optimizers.items()},
            "schedulers": {name: s.state_dict() for name, s in self.schedulers.items()},
        }

    def export_adapters(self, names: Sequence[str]) -> dict[str, dict[str, Tensor]]:
        """These agents' adapter tensors (PEFT keys), as the model holds them now."""
        return {name: self.model.export_adapter(name) for name in names}

    def load_adapters(self, adapters: dict[str, dict[str, Tensor]]) -> None:
        """Overwrite agents' adapters (resume: the checkpoint's tensors)."""
        for name, tensors in adapters.items():
            self.model.import_adapter(name, tensors)

    def load_state_dict(self, state: dict) -> None:
        self.global_step = state["global_step"]
        for name in self.agent_names:
            self.optimizers[name].load_state_dict(
                self.model.native_optimizer_state(name, state["optimizers"][name]))
            self.schedulers[name].load_state_dict(state["schedulers"][name])

    # ------------------------------------------------------------------ plan
    def _with_behaviour_logprobs(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """Fill old (and, with a KL term, reference) log-probs that the caller did not bring."""
        common = dict(positions=batch.response_mask.bool(), temperature=self.temperature,
                      micro_batch_size=self.config.forward_rows)
        if batch.old_logprobs is None:
            # On-policy: the rows were generated by the current adapters.
            batch = batch.with_fields(old_logprobs=self.model.logprobs(
                batch.input_ids, batch.attention_mask, batch.agent_id, **common))
        if self.config.kl_coef > 0 and batch.ref_logprobs is None:
            batch = batch.with_fields(ref_logprobs=self.model.reference_logprobs(
                batch.input_ids, batch.attention_mask, **common))
        return batch

    def _mini_batches(self, name: str, num_rows: int) -> list[Tensor]:
        """Positions (among the agent's rows) of each of its optimizer steps, epoch by epoch.

        Shuffled per epoch by a generator seeded from (run seed, agent name, the agent's own
        optimizer steps so far): the same alone or in any team, and after a resume.
        """
        size = self.config.ppo_mini_batch_size or num_rows
        if size >= num_rows:
            return [torch.arange(num_rows)] * self.config.ppo_epochs
        done = self.schedulers[name].last_epoch
        generator = torch.Generator().manual_seed(
            agent_stream_seed(self.model.seed, name, done, "shuffle")
        )
        minis: list[Tensor] = []
        for _ in range(self.config.ppo_epochs):
            minis.extend(torch.randperm(num_rows, generator=generator).split(size))
        return minis

    def _micro_groups(self, minis: dict[str, Tensor]) -> list[list[tuple[str, Tensor]]]:
        """Which rows share a forward/backward. Each agent's micro-batches are what they would
        be alone (so are its dropout masks and its gradient sums); sequential, one agent's
        micro-batch per forward; fused, micro-batches of several agents (at most one of each,
        in each agent's own order) are packed into one forward of at most ``micro_batch_size``
        rows, so memory per forward does not grow with the number of agents."""
        size = self.config.micro_batch_size
        split = {name: rows.split(size) for name, rows in minis.items()}
        if not self.config.fused:
            return [[(name, micro)] for name, micros in split.items() for micro in micros]
        count = max(len(micros) for micros in split.values())
        queue = [(name, micros[k]) for k in range(count) for name, micros in split.items()
                 if k < len(micros)]
        groups: list[list[tuple[str, Tensor]]] = []
        current: list[tuple[str, Tensor]] = []
        for name, micro in queue:
            rows = sum(len(m) for _, m in current)
            if current and (rows + len(micro) > size or any(n == name for n, _ in current)):
                groups.append(current)
                current = []
            current.append((name, micro))
        if current:
            groups.append(current)
        return groups

    # ------------------------------------------------------------------ one round
    def _backward(
        self, batch: TrajectoryBatch, minis: dict[str, Tensor], sums: dict
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """Gradients of every agent's mini-batch of this round, clipped per agent.

        Returns {agent: (loss, gradient norm before clipping)} as device tensors, unchecked.
        """
        cfg = self.config
        mask = batch.response_mask.float()
        normalisers = {}
        for name, rows in minis.items():
            self.optimizers[name].zero_grad(set_to_none=True)
            # Normalise by the whole mini-batch, not each micro-batch, so gradient accumulation
            # gives the same gradient as one big batch.
            if cfg.loss_agg_mode == "token-mean":
                normalisers[name] = mask[rows].sum().clamp(min=1.0)
            else:
                normalisers[name] = (mask[rows].sum(-1) > 0).sum().float().clamp(min=1.0)
        parts_of = {name: dict.fromkeys(_SUMMED_PARTS, 0.0) for name in minis}  # this round
        steps = {name: self.schedulers[name].last_epoch for name in minis}
        sync, mine, stream = self.grad_sync, minis, "dropout"
        if sync is not None and sync.world_size > 1:  # this rank's share of each mini-batch
            mine = {name: rows[sync.rank::sync.world_size] for name, rows in minis.items()}
            mine = {name: rows for name, rows in mine.items() if len(rows)}
            stream = f"dropout/rank{sync.rank}"
        groups = self._micro_groups(mine) if mine else []
        padding = self._padding_passes(len(groups))
        with self.model.training_forward(steps, stream):
            for group in groups:
                micro = batch.select(torch.cat([rows for _, rows in group]))
                self.rows_forwarded += len(micro)
                logprobs, entropy = self.model(
                    micro.input_ids, micro.attention_mask, micro.agent_id,
                    positions=micro.response_mask.bool(), temperature=self.temperature,
                    with_entropy=cfg.entropy_coef > 0,
                )
                total = torch.zeros((), device=mask.device)
                start = 0
                for name, rows in group:
                    part = slice(start, start + len(rows))
                    start += len(rows)
                    parts = self._loss(micro.select(part), logprobs[part], entropy[part],
                                       normalisers[name])
                    total = total + parts["loss"]
                    for key, value in parts.items():
                        parts_of[name][key] = parts_of[name][key] + value.detach()
                self._local_backward(total, [name for name, _ in group])
            for _ in range(padding):
                self._padding_pass(batch)
        if sync is not None and sync.world_size > 1:
            self._sum_over_ranks(list(minis), parts_of, mask.device)
        checks = {}
        for name in minis:
            for key, value in parts_of[name].items():
                sums[name][key] = sums[name][key] + value
            grad_norm = self._clip(name)
            sums[name]["grad_norm"] = sums[name]["grad_norm"] + grad_norm
            checks[name] = (torch.as_tensor(parts_of[name]["loss"], device=mask.device),
                            grad_norm)
        return checks

    def _sum_over_ranks(self, names: list[str], parts_of: dict, device: torch.device) -> None:
        """One all-reduce of these agents' gradients and loss parts of the round. A parameter
        keeps ``grad=None`` only if it has none on every rank (AdamW skips such a parameter;
        a zero gradient would still decay it and move its moments)."""
        params = [param for name in names
                  for param in self.optimizers[name].param_groups[0]["params"]]
        has_grad = [param.grad is not None for param in params]
        flat = torch.cat(
            [(param.grad if param.grad is not None else torch.zeros_like(param))
             .reshape(-1).float().to(device) for param in params]
            + [torch.tensor(has_grad, dtype=torch.float32, device=device)]
            + [torch.stack([torch.as_tensor(parts_of[name][key], device=device).float()
                            for key in _SUMMED_PARTS]) for name in names])
        summed = self.grad_sync.all_reduce(flat)
        sizes = [param.numel() for param in params]
        grads = summed[:sum(sizes)].split(sizes)
        any_grad = summed[sum(sizes):sum(sizes) + len(params)].tolist()  # one host sync
        for param, grad, has in zip(params, grads, any_grad, strict=True):
            param.grad = grad.view_as(param).to(param.dtype) if has > 0 else None
        offset = sum(sizes) + len(params)
        for name in names:
            parts = summed[offset:offset + len(_SUMMED_PARTS)]
            offset += len(_SUMMED_PARTS)
            parts_of[name] = dict(zip(_SUMMED_PARTS, parts, strict=True))

    # ------------------------------------------------------------------ strategy seams
    def _local_backward(self, total: Tensor, names: list[str]) -> None:
        """Add the gradient of one forward's loss to the ``.grad`` of these agents' optimizer
        parameters."""
        total.backward()

    def _padding_passes(self, passes: int) -> int:
        """How many ``_padding_pass`` to run after this rank's ``passes`` forward/backward
        passes of a round: none here (a strategy whose forwards are collectives makes every
        rank run as many as the busiest one)."""
        return 0

    def _padding_pass(self, batch: TrajectoryBatch) -> None:
        """One forward/backward that changes nothing (see ``_padding_passes``)."""
        raise NotImplementedError

    def _step(self, names: list[str]) -> None:
        """Apply these agents' (summed, clipped) gradients: one optimizer and scheduler step
        each."""
        for name in names:
            self.optimizers[name].step()
            self.schedulers[name].step()

    def _loss(
        self, micro: TrajectoryBatch, logprobs: Tensor, entropy: Tensor, normaliser: Tensor
    ) -> dict[str, Tensor]:
        """One agent's loss on its rows of a micro-batch, scaled by its mini-batch normaliser
        (so micro-batch parts sum to the mini-batch's value); ``loss`` keeps its graph."""
        cfg = self.config
        mask = micro.response_mask.float()
        policy, policy_metrics = ppo_policy_loss(
            logprobs,
            micro.old_logprobs,
            micro.advantages,
            mask,
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            dual_clip=cfg.dual_clip,
            agg=cfg.loss_agg_mode,
            normalizer=normaliser,
        )
        loss = policy
        parts = {"policy_loss": policy.detach()}
        share = _share(mask, normaliser, cfg.loss_agg_mode)
        for key in ("clip_frac", "approx_kl"):
            parts[key] = policy_metrics[key] * share
        if cfg.kl_coef > 0:
            kl = kl_loss(
                logprobs,
                micro.ref_logprobs,
                mask,
                beta=1.0,
                kind=cfg.kl_estimator,
                agg=cfg.loss_agg_mode,
                normalizer=normaliser,
            )
            loss = loss + cfg.kl_coef * kl
            parts["kl_ref"] = kl.detach()
        ent = aggregate(entropy, mask, cfg.loss_agg_mode, normaliser)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * ent
        parts["entropy"] = ent.detach()
        parts["loss"] = loss
        return parts

    def _clip(self, name: str) -> Tensor:
        """Clip this agent's gradient norm to its max_grad_norm; the norm before clipping."""
        return clip_gradients(self.optimizers[name].param_groups[0]["params"],
                              self.max_grad_norm[name])

    def _refuse_non_finite(
        self, checks: dict[str, tuple[Tensor, Tensor]], round_index: int, rounds: int
    ) -> None:
        """One host sync per round: every agent's loss and gradient norm must be finite."""
        if not checks:
            return
        values = torch.stack([torch.stack(pair).float() for pair in checks.values()]).tolist()
        for name, (loss, grad_norm) in zip(checks, values, strict=True):
            for what, value in (("loss", loss), ("gradient norm", grad_norm)):
                if not math.isfinite(value):
                    raise NonFiniteLossError(
                        f"agent {name!r}: {what} is {value} at train step {self.global_step} "
                        f"(mini-batch round {round_index + 1} of {rounds}); the step is "
                        f"refused and no agent was updated"
                    )

    # ------------------------------------------------------------------ all or none
    def _snapshot(self, names: list[str]) -> dict:
        """Adapters, optimizer and scheduler states of these agents (restored on refusal)."""
        return {
            name: (
                [p.detach().clone() for p in self.model.agent_parameters(name)],
                copy.deepcopy(self.optimizers[name].state_dict()),
                copy.deepcopy(self.schedulers[name].state_dict()),
            )
            for name in names
        }

    @torch.no_grad()
    def _restore(self, snapshot: dict) -> None:
        for name, (params, optimizer_state, scheduler_state) in snapshot.items():
            for param, saved in zip(self.model.agent_parameters(name), params, strict=True):
                param.copy_(saved)
            self.optimizers[name].load_state_dict(optimizer_state)
            self.schedulers[name].load_state_dict(scheduler_state)

    # ------------------------------------------------------------------ metrics
    def _metrics(self, batch: TrajectoryBatch, own: dict[str, Tensor], sums: dict,
                 optimizer_steps: dict[str, int]) -> dict[str, dict[str, float]]:
        """Per agent: loss parts averaged over its optimizer steps, plus row statistics; every
        agent's figures come to the host in one copy."""
        keys = [key for key in METRIC_PARTS if key != "kl_ref" or self.config.kl_coef > 0]
        stats = ["num_tokens", "advantage_mean"] + (["reward_mean"] if batch.rewards is not None
                                                    else [])
        device = batch.advantages.device
        columns = []
        for name, rows in own.items():
            part = batch.select(rows)
            mask = part.response_mask.float()
            tokens = mask.sum()
            figures = [torch.as_tensor(sums[name][key], dtype=torch.float32, device=device)
                       / optimizer_steps[name] for key in keys]
            figures += [tokens, (part.advantages * mask).sum() / tokens.clamp(min=1.0)]
            if batch.rewards is not None:
                figures.append(part.rewards.float().mean())
            columns.append(torch.stack([figure.float().reshape(()) for figure in figures]))
        values = torch.stack(columns).tolist() if columns else []
        result = {}
        for (name, rows), row in zip(own.items(), values, strict=True):
            metrics = dict(zip(keys + stats, row, strict=True))
            metrics["num_rows"] = float(len(rows))
            metrics["optimizer_steps"] = float(optimizer_steps[name])
            metrics["lr"] = self.schedulers[name].get_last_lr()[0]
            result[name] = metrics
        return result


def _share(mask: Tensor, normaliser: Tensor, mode: str) -> Tensor:
    """Fraction of the mini-batch's normaliser this micro-batch holds (to sum token-weighted
    metrics), as a device tensor."""
    if mode == "token-mean":
        return mask.sum() / normaliser
    return (mask.sum(-1) > 0).sum() / normaliser


__all__ = ["MultiAgentTrainer"]
