"""Per-agent training: split a batch by ``agent_id`` and update each adapter on its own rows.

Each agent has its own AdamW, its own gradient-norm clipping and its own learning-rate schedule,
counted in its own train steps (one schedule step per train step with rows, whatever its
mini-batches). An agent with no rows in a step is not touched at all: no
forward, no ``optimizer.step()`` (AdamW would still decay its weights and advance its moments),
no scheduler step — so its weights and optimizer state stay bitwise equal (DESIGN.md invariant 1).

One train step, per agent: ``ppo_epochs`` passes over its rows; each pass shuffles them with the
agent's own generator and cuts them into nearly equal mini-batches of at most
``ppo_mini_batch_size`` rows; each mini-batch is one optimizer step (gradients accumulated
over micro-batches, the loss normalised by the mini-batch). Fused (the default), micro-batches
of several agents are packed into ONE forward/backward of at most micro_batch_size rows in
which each row uses its own agent's adapter; each agent's gradient reaches only its own A/B
because each agent's loss reads only its own rows. The agents advance in ROUNDS: round k
computes every agent's k-th mini-batch gradient, then checks every agent's loss and gradient
norm, then steps all of them. A NaN/inf anywhere refuses the whole step: nothing is stepped in
that round, and adapters, optimizers and schedulers are restored to the start of the step if
an earlier round had already stepped (invariant 5: no agent half-updated).

What depends on where the optimizers' state lives (building them, backward, summing gradients
over ranks, clipping, stepping, state dicts, snapshots) is the ``strategy``'s (strategy.py):
``TorchStrategy`` by default, DeepSpeed ZeRO in roll/distributed/deepspeed_strategy.py.

Data parallel (the strategy's ``grad_sync``, see roll/distributed/data_parallel.py): every rank
holds the same
adapters and optimizers and gets the whole batch, so every rank makes the same plan (mini-batches,
normalisers). Each rank forwards only its share of each agent's mini-batch (rows rank, rank + k,
...), then the gradients, losses and metric sums of the round are summed over ranks in one
all-reduce, so clipping, the NaN check and the optimizer steps see the gradient of the whole
mini-batch and stay identical on every rank. Equal to one process up to the order of the sums
(exactly so without LoRA dropout: each rank draws its own dropout masks).
Old log-probs: a no-grad pass first for the agents taking several optimizer steps; for one
taking one, its training forward's own, detached (plan.py ``old_pass_agents``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from roll.algorithms.choices import (
    choice_entropy,
    choice_kl,
    choice_logprobs,
    choice_reverse_kl,
    move_logprobs,
    points,
    uniform_logprobs,
)
from roll.algorithms.losses import (
    aggregate,
    approx_kl_terms,
    kl_loss,
    ppo_policy_loss,
    ppo_token_terms,
    row_means,
)
from roll.batch import TrajectoryBatch
from roll.errors import ConfigError, NonFiniteLossError
from roll.multi_agent.captured import CapturedSteps, capture_refusal
from roll.multi_agent.config import AgentConfig, TrainerConfig
from roll.multi_agent.logprobs import behaviour_logprobs, with_old_of_rows
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.optim import step_schedules
from roll.multi_agent.plan import agent_dropout, micro_groups, mini_batches, old_pass_agents
from roll.multi_agent.seeds import agent_stream_seed
from roll.multi_agent.strategy import GradSync, TorchStrategy, TrainStrategy
from roll.utils.transfer import upload

METRIC_PARTS = ("loss", "policy_loss", "kl_ref", "entropy", "action_entropy", "magnet_kl",
                "clip_frac", "approx_kl", "grad_norm")
_SUMMED_PARTS = METRIC_PARTS[:-1]  # summed over ranks; grad_norm is taken after the sum


class MultiAgentTrainer:
    """Updates every agent's adapter from one mixed batch.

    Args:
        model: the team's MultiAgentLoRAModel.
        agents: resolved agent configs (``optim`` set), in agent-id order.
        config: loss and batching settings shared by the team.
        temperature: the rollouts' sampling temperature (> 0; use 1 for greedy rollouts):
            every log-prob, ratio, KL and entropy is taken at it, as the engines report them.
        strategy: what builds, sums, clips and steps the optimizers (strategy.py); None:
            ``TorchStrategy()``, this process alone.
    """

    def __init__(
        self,
        model: MultiAgentLoRAModel,
        agents: Sequence[AgentConfig],
        config: TrainerConfig,
        temperature: float = 1.0,
        strategy: TrainStrategy | None = None,
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
        model.share_prefix = bool(self.config.share_prefix)
        self.temperature = float(temperature)
        self.agent_names = model.agent_names
        self.strategy: TrainStrategy = strategy if strategy is not None else TorchStrategy()
        self.strategy.setup(model, agents)
        self.max_grad_norm = {agent.name: agent.optim.max_grad_norm for agent in agents}
        self.dropout = agent_dropout(agents)
        self.global_step = 0
        self._held: tuple[object, int] | None = None
        self.bonus_scale: dict[str, float] = {}  # each agent's, in its last train step
        self.captured = self._captured_steps()
        """The micro-batches' captured graphs (captured.py), None when ``capture`` is off."""
        self.rows_forwarded = 0  # rows this process ran forward/backward on in its last step
        self.own_old: set[str] = set()  # agents whose last step read the forward's own old

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Each agent's optimizer (the strategy's: its tensors carry the agent's gradient)."""
        return self.strategy.optimizers

    @property
    def schedulers(self) -> dict[str, torch.optim.lr_scheduler.LambdaLR]:
        """Each agent's learning-rate schedule (``last_epoch``: its train steps with rows)."""
        return self.strategy.schedulers

    @property
    def grad_sync(self) -> GradSync | None:
        """The data-parallel ranks (the strategy's); None: this process alone."""
        return self.strategy.grad_sync

    # ------------------------------------------------------------------ public
    def logprob_passes(self, batch: TrajectoryBatch, old: bool = True) -> TrajectoryBatch:
        """``batch`` with the log-probs this trainer's loss reads (``behaviour_logprobs``: old,
        over moves when ``policy_over=moves``, reference when ``kl_coef`` > 0); ``old`` False
        (``old_pass_agents``): the reference pass alone."""
        return behaviour_logprobs(self.model, batch, self.temperature, self.config.forward_rows,
                                  reference=self.config.kl_coef > 0,
                                  moves=self.config.policy_over == "moves", old=old)

    def train_step(self, batch: TrajectoryBatch) -> dict[str, dict[str, float]]:
        """One update of every agent that has rows; returns metrics keyed by agent name."""
        batch.require("advantages")
        own: dict[str, Tensor] = {}  # agent -> its rows (indices into batch)
        ids = batch.agent_id.tolist()  # one device->host copy, not one per agent
        for index, name in enumerate(self.agent_names):
            rows = [row for row, agent in enumerate(ids) if agent == index]
            if rows:
                own[name] = upload(rows, torch.long, batch.agent_id.device)  # no wait
        plan = {name: [rows[mini.to(rows.device)] for mini in self._mini_batches(name, len(rows))]
                for name, rows in own.items()}
        need = old_pass_agents(self.config, {n: len(r) for n, r in own.items()}, self.dropout)
        self.own_old = set(own) - need  # their training forward gives their old log-probs
        batch = self.logprob_passes(batch, old=False)  # the reference's, where it is paid
        moves = self.config.policy_over == "moves" and batch.choice_tokens is not None
        if need and (batch.old_logprobs is None or moves and batch.old_move_logprobs is None):
            rows = torch.cat([own[name] for name in need])
            batch = with_old_of_rows(batch, rows, self.logprob_passes(batch.select(rows)))
        if self.config.magnet_coef > 0:
            batch = self._with_magnet(batch)
        rounds = max((len(minis) for minis in plan.values()), default=0)
        self.rows_forwarded = 0
        snapshot = self.strategy.snapshot(list(own)) if rounds > 1 else None
        sums = {name: dict.fromkeys(METRIC_PARTS, 0.0) for name in own}
        try:
            for round_index in range(rounds):
                minis = {name: plan[name][round_index] for name in own
                         if round_index < len(plan[name])}
                checks = self._backward(batch, minis, sums, round_index)
                self._refuse_non_finite(checks, round_index, rounds)
                self.strategy.step(list(minis))
        except NonFiniteLossError:
            if snapshot is not None:
                self.strategy.restore(snapshot)
            raise
        finally:
            self.strategy.zero_grad(list(own))
        metrics = self._metrics(batch, own, sums, {name: len(plan[name]) for name in own})
        # One schedule step per train step, whatever its mini-batches (total_steps = max_steps);
        # a rate with target_kl reads the step's approx_kl first.
        step_schedules(self.schedulers, metrics)
        self.global_step += 1
        return metrics

    def hold(self) -> None:
        """Remember every agent's adapters, optimizer and scheduler states and the step
        counter, so that several train steps (HAPPO's agents one after another) can be undone
        as one by ``rollback`` when a later one is refused (invariant 5)."""
        self._held = (self.strategy.snapshot(list(self.agent_names)), self.global_step)

    def rollback(self) -> None:
        """Put back what ``hold`` remembered (then forget it)."""
        snapshot, self.global_step = self._held
        self.strategy.restore(snapshot)
        self._held = None

    def release(self) -> None:  # forget what ``hold`` remembered (the steps stand)
        self._held = None

    def state_dict(self) -> dict:
        """Optimizers, schedulers and the step counter (adapters are saved as PEFT folders)."""
        return {"global_step": self.global_step, **self.strategy.state_dict()}

    def export_adapters(self, names: Sequence[str]) -> dict[str, dict[str, Tensor]]:
        """These agents' adapter tensors (PEFT keys), as the model holds them now."""
        return self.strategy.export_adapters(names)

    def load_adapters(self, adapters: dict[str, dict[str, Tensor]]) -> None:
        """Overwrite agents' adapters (resume: the checkpoint's tensors)."""
        self.strategy.load_adapters(adapters)

    def load_state_dict(self, state: dict) -> None:  # state_dict's
        self.global_step = state["global_step"]
        self.strategy.load_state_dict(state)

    def _captured_steps(self) -> CapturedSteps | None:
        """``trainer.capture``: None resolves to on where the compiled trainer runs on CUDA
        and the setup allows; true where it cannot is refused with the reason."""
        wanted = self.config.capture
        if wanted is False:
            return None
        device = self.model.tensor_device
        reason = capture_refusal(self.config, self.model, self.strategy)
        if reason is not None:
            if wanted:
                raise ConfigError("trainer.capture", True, f"cannot capture: {reason}")
            return None
        if wanted is None and device.type != "cuda":
            return None
        return CapturedSteps(self.model, self.config, self.temperature, device)

    # ------------------------------------------------------------------ plan
    def _mini_batches(self, name: str, num_rows: int) -> list[Tensor]:
        """``plan.mini_batches`` of agent ``name``: shuffled by a seed of (run seed, agent
        name, the agent's own train steps so far)."""
        seed = agent_stream_seed(self.model.seed, name, self.schedulers[name].last_epoch,
                                 "shuffle")
        return mini_batches(num_rows, self.config.ppo_mini_batch_size, self.config.ppo_epochs,
                            seed)

    # ------------------------------------------------------------------ one round
    def _backward(
        self, batch: TrajectoryBatch, minis: dict[str, Tensor], sums: dict, round_index: int = 0
    ) -> dict[str, tuple[Tensor, Tensor]]:
        """Gradients of every agent's mini-batch of this round, clipped per agent.

        Returns {agent: (loss, gradient norm before clipping)} as device tensors, unchecked.
        """
        cfg = self.config
        mask = batch.response_mask.float()
        normalisers, decisions = {}, {}
        self.strategy.zero_grad(list(minis))
        for name, rows in minis.items():
            # Normalise by the whole mini-batch, not each micro-batch, so gradient accumulation
            # gives the same gradient as one big batch.
            if cfg.loss_agg_mode == "token-mean":
                normalisers[name] = mask[rows].sum().clamp(min=1.0)
            else:
                normalisers[name] = (mask[rows].sum(-1) > 0).sum().float().clamp(min=1.0)
            if batch.choice_tokens is not None:  # the legal-move terms are per decision (row)
                decisions[name] = points(batch.choice_tokens[rows]).any(-1).sum().float().clamp(
                    min=1.0)
        parts_of = {name: dict.fromkeys(_SUMMED_PARTS, 0.0) for name in minis}  # this round
        # dropout masks: one stream per (agent, its train steps so far, round, rank)
        steps = {name: self.schedulers[name].last_epoch for name in minis}
        self.bonus_scale.update({name: self._bonus_scale(steps[name]) for name in minis})
        sync, mine, stream = self.grad_sync, minis, "dropout"
        if sync is not None and sync.world_size > 1:  # this rank's share of each mini-batch
            mine = {name: rows[sync.rank::sync.world_size] for name, rows in minis.items()}
            mine = {name: rows for name, rows in mine.items() if len(rows)}
            stream = f"dropout/rank{sync.rank}"
        if round_index:
            stream = f"{stream}/round{round_index}"
        groups = (micro_groups(mine, self.config.micro_batch_size, self.config.fused)
                  if mine else [])
        padding = self.strategy.padding_passes(len(groups))
        captured = self.captured
        with self.model.training_forward(steps, stream):
            if captured is not None:  # each micro-batch replayed from its graph: captured.py
                self.rows_forwarded += captured.run_round(batch, groups, normalisers,
                                                          decisions, self.bonus_scale,
                                                          self.own_old)
            else:
                self._forward_backward(batch, groups, normalisers, decisions, parts_of)
            for _ in range(padding):
                self._padding_pass(batch)
        if captured is not None:
            for name, parts in captured.sums().items():
                if name in parts_of:
                    parts_of[name].update(parts)
        if sync is not None and sync.world_size > 1:
            self._sum_over_ranks(list(minis), parts_of, mask.device)
        checks = {}
        for name in minis:
            for key, value in parts_of[name].items():
                sums[name][key] = sums[name][key] + value
            grad_norm = self.strategy.clip(name, self.max_grad_norm[name])
            sums[name]["grad_norm"] = sums[name]["grad_norm"] + grad_norm
            checks[name] = (torch.as_tensor(parts_of[name]["loss"], device=mask.device),
                            grad_norm)
        return checks

    def _forward_backward(self, batch: TrajectoryBatch, groups: list,
                          normalisers: dict[str, Tensor], decisions: dict[str, Tensor],
                          parts_of: dict) -> None:
        """The round's micro-batches launched op by op (uncaptured): each ``group`` of
        (agent, rows) one forward and backward, each agent's loss on its own rows; the loss
        parts add to ``parts_of``."""
        for group in groups:
            micro = batch.select(torch.cat([rows for _, rows in group]))
            self.rows_forwarded += len(micro)
            logprobs, entropy, *choices = self.model(
                micro.input_ids, micro.attention_mask, micro.agent_id,
                positions=micro.response_mask.bool(), temperature=self.temperature,
                # always measured (<agent>/entropy); it adds to the gradient only through the
                # loss, when entropy_coef > 0
                with_entropy=True, choices=micro.choice_tokens,
            )
            total = torch.zeros((), device=logprobs.device)
            start = 0
            for name, rows in group:
                part = slice(start, start + len(rows))
                start += len(rows)
                parts = self._loss(micro.select(part), logprobs[part], entropy[part],
                                   normalisers[name], choices[0][part] if choices else None,
                                   decisions.get(name), self.bonus_scale[name],
                                   name in self.own_old)
                total = total + parts["loss"]
                for key, value in parts.items():
                    parts_of[name][key] = parts_of[name][key] + value.detach()
            self.strategy.backward(total, [name for name, _ in group])

    def _sum_over_ranks(self, names: list[str], parts_of: dict, device: torch.device) -> None:
        """Sum these agents' gradients and loss parts of the round over the ranks (one
        all-reduce, the strategy's)."""
        summed = self.strategy.sum_over_ranks(names, torch.cat(
            [torch.stack([torch.as_tensor(parts_of[name][key], device=device).float()
                          for key in _SUMMED_PARTS]) for name in names]))
        for index, name in enumerate(names):
            parts = summed[index * len(_SUMMED_PARTS):(index + 1) * len(_SUMMED_PARTS)]
            parts_of[name] = dict(zip(_SUMMED_PARTS, parts, strict=True))

    def _padding_pass(self, batch: TrajectoryBatch) -> None:
        """The batch's first row forward and backward with a zero loss, gradients dropped (see
        the strategy's ``padding_passes``)."""
        row = batch.select(torch.zeros(1, dtype=torch.long, device=batch.agent_id.device))
        logprobs, _ = self.model(row.input_ids, row.attention_mask, row.agent_id,
                                 positions=row.response_mask.bool(), temperature=self.temperature)
        self.strategy.padding_backward(logprobs.sum() * 0.0,
                                       self.agent_names[int(row.agent_id[0])])

    def _loss(
        self, micro: TrajectoryBatch, logprobs: Tensor, entropy: Tensor, normaliser: Tensor,
        choice_logits: Tensor | None = None, decisions: Tensor | None = None,
        bonus_scale: float = 1.0, own_old: bool = False,
    ) -> dict[str, Tensor]:
        """One agent's loss on its rows of a micro-batch, scaled by its mini-batch normaliser
        (so micro-batch parts sum to the mini-batch's value); ``loss`` keeps its graph. The
        legal-move terms (``choice_logits`` given) are means over the mini-batch's
        ``decisions`` (rows with a branching point), whatever ``loss_agg_mode``; the entropy
        bonuses weigh ``bonus_scale`` times their coefficients (``bonus_decay_steps``)."""
        cfg = self.config
        mask = micro.response_mask.float()
        if cfg.policy_over == "moves" and micro.choice_tokens is None:  # no decision: no term
            policy = logprobs.sum() * 0.0
            policy_metrics = {"clip_frac": policy.detach(), "approx_kl": policy.detach()}
            share = policy.detach()
        elif cfg.policy_over == "moves":  # the constrained policy, one weight per decision
            policy_mask = points(micro.choice_tokens).float() * mask
            new = move_logprobs(logprobs, choice_logits, micro.choice_tokens, micro.input_ids)
            old = new.detach() if own_old else micro.old_move_logprobs
            per_token, is_clipped, _, log_ratio = ppo_token_terms(
                new, old, micro.advantages, policy_mask,
                clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip)
            policy = aggregate(per_token, policy_mask, "seq-mean-token-sum", decisions)
            with torch.no_grad():  # each decision's own share of its points, over decisions:
                # the same whatever the micro-batches (and per row, as captured.py sums it)
                policy_metrics = {
                    "clip_frac": row_means(is_clipped.float(), policy_mask).sum() / decisions,
                    "approx_kl": row_means(approx_kl_terms(log_ratio), policy_mask).sum()
                    / decisions}
            share = 1.0
        else:
            # the micro-batch's fraction of the mini-batch (to sum token-weighted metrics)
            share = aggregate(torch.ones_like(mask), mask, cfg.loss_agg_mode, normaliser)
            old = logprobs.detach() if own_old else micro.old_logprobs
            policy, policy_metrics = ppo_policy_loss(
                logprobs, old, micro.advantages, mask, clip_low=cfg.clip_low,
                clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, agg=cfg.loss_agg_mode,
                normalizer=normaliser)
        loss = policy
        parts = {"policy_loss": policy.detach()}
        for key in ("clip_frac", "approx_kl"):
            parts[key] = policy_metrics[key] * share
        if cfg.kl_coef > 0:
            kl = kl_loss(logprobs, micro.ref_logprobs, mask, beta=1.0, kind=cfg.kl_estimator,
                         agg=cfg.loss_agg_mode, normalizer=normaliser)
            loss = loss + cfg.kl_coef * kl
            parts["kl_ref"] = kl.detach()
        ent = aggregate(entropy, mask, cfg.loss_agg_mode, normaliser)
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * bonus_scale * ent
        parts["entropy"] = ent.detach()
        if choice_logits is not None:
            moves = choice_logprobs(choice_logits, micro.choice_tokens)
            action_entropy = choice_entropy(moves, micro.choice_tokens).sum() / decisions
            if cfg.action_entropy_coef > 0:
                loss = loss - cfg.action_entropy_coef * bonus_scale * action_entropy
            parts["action_entropy"] = action_entropy.detach()
            if cfg.magnet_coef > 0:
                pull = choice_kl if cfg.magnet_kl == "forward" else choice_reverse_kl
                kl = pull(moves, micro.magnet_logprobs, micro.choice_tokens).sum() / decisions
                loss = loss + cfg.magnet_coef * kl
                parts["magnet_kl"] = kl.detach()
        parts["loss"] = loss
        return parts

    def _bonus_scale(self, steps_done: int) -> float:
        """The entropy bonuses' multiplier at an agent's train step ``steps_done + 1``."""
        decay = self.config.bonus_decay_steps
        return max(0.0, 1.0 - steps_done / decay) if decay else 1.0

    def _with_magnet(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """``batch`` with ``magnet_logprobs``: the uniform policy over legal moves unless the
        batch brings its own (a snapshot magnet's, written by the pipeline)."""
        if batch.magnet_logprobs is not None or batch.choice_tokens is None:
            return batch
        if self.config.magnet != "uniform":
            raise ValueError(f"trainer.magnet={self.config.magnet!r}: the batch has no "
                             "magnet_logprobs (the pipeline writes the snapshot's)")
        return batch.with_fields(magnet_logprobs=uniform_logprobs(batch.choice_leaves,
                                                                  batch.choice_tokens))

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

    # ------------------------------------------------------------------ metrics
    def _metrics(self, batch: TrajectoryBatch, own: dict[str, Tensor], sums: dict,
                 optimizer_steps: dict[str, int]) -> dict[str, dict[str, float]]:
        """Per agent: loss parts averaged over its optimizer steps, plus row statistics; every
        agent's figures come to the host in one copy."""
        off = {"kl_ref": self.config.kl_coef == 0, "action_entropy": batch.choice_tokens is None,
               "magnet_kl": batch.choice_tokens is None or self.config.magnet_coef == 0}
        keys = [key for key in METRIC_PARTS if not off.get(key, False)]
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
            if self.config.bonus_decay_steps:
                metrics["bonus_scale"] = self.bonus_scale[name]
            result[name] = metrics
        return result



__all__ = ["GradSync", "MultiAgentTrainer", "TorchStrategy", "TrainStrategy"]
