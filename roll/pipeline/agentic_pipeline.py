"""The training loop of a team of agents (DESIGN.md "Data flow of one step"), one process.

    evaluation at step 0 (if eval.eval_steps and eval.before_training)
    for step in 1..max_steps:
        [engine awake]  sync adapters → engine   (only LoRA tensors travel)
                        train rollouts           (all pending turns → one mixed-adapter batch)
        old/reference log-probs       (trainer's forward at the sampling temperature)
        values                        (critic.mode: the critics' V, roll/multi_agent/critics.py)
        advantages                    (roll/algorithms: estimator, then per-agent normalisation)
        per-agent update              (roll/multi_agent/trainer.py; trainer.global_step += 1;
                                       happo: one agent after another, happo_update.py)
        critics' update               (on the advantages' returns)
        [engine awake]  sync adapters → engine, validation rollouts  (every eval.eval_steps
                        and at the last step: evaluation sees the update it reports)
        metrics → trackers; checkpoint every save_steps

Every rollout syncs first, inside the engine's awake window (a sleeping vLLM engine must not
take adapters), pushing only the agents whose engine slot is not at the trainer's version
(``trainer.global_step``). The rollout scheduler checks at every generate call that the engine
serves exactly that version of every trained agent, so a skipped sync fails loudly. With
rollout.overlap the next step's sync and rollout run in a thread while this step's passes and
update run (overlap.py); its generate calls are checked against the version it synced.

In Ray mode with engine actors or a vLLM engine this process loads no weights: its model is the
base's shape plus the agents' adapters, read from the train ranks (``controller_holds_base``).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from roll.agentic.env.seating import Seating, SeatSpec
from roll.agentic.rollout.results import RolloutResult
from roll.agentic.rollout.scheduler import EnvFactory, Renderer, RolloutScheduler
from roll.agentic.tasks.datasets import ItemSampler
from roll.algorithms.advantages import RunningBaselines
from roll.distributed.roles import TrainGroup, adapter_payloads, load_adapters
from roll.errors import NonFiniteLossError, RoleFailed, RunInterrupted
from roll.models import load_tokenizer
from roll.multi_agent.critics import Critics, critic_agents
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.pipeline.builders import (
    build_engine,
    build_env_host,
    build_shared_bundles,
    build_train_group,
    controller_holds_base,
    critics_where_trained,
    engine_reports_policy_logprobs,
    load_base,
    model_path,
    rollout_settings,
    start_ray,
    train_spec,
)
from roll.pipeline.cluster_checks import train_gpus_per_rank
from roll.pipeline.config import PipelineConfig
from roll.pipeline.env_setup import build_env_setup, check_first_prompts, run_seatings
from roll.pipeline.eval_phase import evaluate_now
from roll.pipeline.evaluation import before_after, team_return
from roll.pipeline.overlap import NextRollout
from roll.pipeline.policy_update import SnapshotMagnet, behaviour_passes, update_agents
from roll.pipeline.run_state import load_run, resume_if_asked, save_run
from roll.pipeline.snapshot_pool import pool_for_seatings
from roll.pipeline.stalls import StallWatch
from roll.pipeline.step_metrics import capture_metrics, rollout_phase_metrics
from roll.pipeline.step_plan import StepPlan
from roll.utils.checkpoint import resolve_resume
from roll.utils.recompiles import CompileWatch
from roll.utils.run_lock import RunLock
from roll.utils.stages import log_line, stage
from roll.utils.tracking import Tracker, agent_metrics


class AgenticPipeline:
    """Builds every part from a validated PipelineConfig and runs the loop."""

    def __init__(
        self,
        cfg: PipelineConfig,
        env_factory: EnvFactory | None = None,
        render: Renderer | None = None,
    ) -> None:
        """``env_factory``/``render`` replace the OpenSpiel game of ``cfg.env`` (custom tasks;
        the env must have as many seats as the configured game)."""
        self.cfg = cfg
        self.env_factory = env_factory
        self.output_dir = Path(cfg.output_dir)
        if cfg.cluster.backend == "ray":
            start_ray(cfg)  # and check its resources, before any model loads
        torch.manual_seed(cfg.seed)
        agents = cfg.team.resolved_agents()
        self.agent_names = [a.name for a in agents]
        self.env_setup = build_env_setup(cfg)
        """The game or team task: seats, env factories, renderer, datasets (env_setup.py)."""
        self.render = render or self.env_setup.render
        """The prompts of every consumer (rollouts, env workers, the exact policy): the
        renderer given, else the run's (``env.renderer``, the game's own, or the task's)."""
        self.train_seatings, self.eval_seatings = run_seatings(cfg, self.env_setup,
                                                               self.agent_names)
        holds_base = controller_holds_base(cfg)
        self.device = cfg.model.device if holds_base else "cpu"
        """Where this process keeps batches and adapters (CPU when it holds no base)."""
        with stage(f"loading the model ({cfg.model.path} on {self.device})" if holds_base
                   else f"reading the model's shape ({cfg.model.path}; no weights here)"):
            path = model_path(cfg)
            self.tokenizer = load_tokenizer(path)
            # A first prompt that cannot fit would cut every episode: refused before the load.
            check_first_prompts(cfg, self.env_setup, self.train_seatings, self.tokenizer,
                                env_factory, self.render)
            base = load_base(cfg, path)
        critics = critic_agents(cfg.critic, self.agent_names)
        self.model = MultiAgentLoRAModel(base, agents, seed=cfg.seed, critics=critics)
        self.critics = (Critics(cfg.critic, self.model, critics, trainer=cfg.trainer)
                        if critics else None)
        """Value models (adapters on the same base) when critic.mode asks for them."""
        self.baselines = RunningBaselines() if cfg.advantage.estimator == "rae" else None
        """advantage.estimator=rae: each (agent, seat)'s running baseline, kept in checkpoints."""
        self.magnet = (SnapshotMagnet(self.agent_names, cfg.trainer.magnet_refresh)
                       if cfg.trainer.magnet_coef > 0 and cfg.trainer.magnet == "snapshot"
                       else None)
        """trainer.magnet=snapshot: the agents' adapters at the last refresh (policy_update.py)."""
        # Sampling temperature is part of the policy: every log-prob is taken at it (greedy
        # rollouts have none; their log-probs are taken at 1).
        self.policy_temperature = cfg.rollout.sampling.temperature or 1.0
        self.engine_logprobs_comparable = engine_reports_policy_logprobs(cfg)
        spec = train_spec(cfg, path, agents, self.policy_temperature, bool(critics))
        self.shared_bundles = build_shared_bundles(cfg)
        """actor_infer.colocate: the placement group whose bundle i holds train rank i and
        engine i; None otherwise."""
        with stage(f"building the trainer ({cfg.cluster.backend}, "
                   f"{cfg.actor_train.world_size} rank(s)"
                   + (", compiled forwards" if spec.trainer.compile else "") + ")"):
            self.trainer: TrainGroup = build_train_group(
                spec, self.model, cfg.cluster.backend, cfg.actor_train.world_size,
                cfg.actor_train.cpus_per_rank, train_gpus_per_rank(cfg), self.shared_bundles,
            )
        """In this process, or data-parallel Ray ranks that copy the new adapters into
        ``self.model`` after each step (roll/distributed)."""
        self.critics = critics_where_trained(cfg, self.critics, self.trainer)
        self.cooperative = self.env_setup.cooperative
        self.items = (ItemSampler(self.env_setup.train_items, cfg.seed, cfg.env.data.shuffle)
                      if self.env_setup.is_task else None)
        """Team tasks: deals the training items to the groups (position saved in checkpoints)."""
        self.pool, snapshot_specs = pool_for_seatings(
            self.model, self.train_seatings + self.eval_seatings, self.output_dir,
            cfg.snapshot_pool.max_size)
        self.snapshot_slot_of: dict[str, str] = {}
        """Engine slot each snapshot spec plays with now (stale slots are unloaded)."""
        with stage(f"building the {cfg.rollout.engine} engine"):
            self.engine = build_engine(cfg, self.model, self.tokenizer, path,
                                       snapshot_specs, spec, self.shared_bundles)
        self.env_host = build_env_host(cfg)
        """Env worker actors holding the rollouts' episodes (env_workers.num_workers), or None:
        episodes in this process."""
        self.step = 0
        self.served_version: int | None = None
        """The adapter version last synced to the engines: every rollout's generate calls are
        checked against it (with rollout.overlap the trainer is an update ahead of it)."""
        self.next_rollout: NextRollout[tuple[RolloutResult, float]] = NextRollout()
        """rollout.overlap: the next step's rollout, played while this step trains."""
        self.plan = StepPlan(cfg)
        """Which step saves, looks ahead, starts the next rollout (step_plan.py)."""
        self.compiles = CompileWatch("pipeline")
        """Graphs torch.compile builds in this process per step (``compile/new_graphs``)."""
        self.run_id: str | None = None
        """The tracking (WandB) run id, kept in checkpoints so a resumed run continues it."""
        self._greedy_eval: RolloutScheduler | None = None
        """eval.greedy_too's scheduler, made once so that its prompt memo carries over."""

    # ------------------------------------------------------------------ parts
    def scheduler(self, seatings: list[Seating], evaluation: bool,
                  temperature: float | None = None) -> RolloutScheduler:
        """Plays ``seatings`` for training or evaluation; ``temperature`` (evaluation only)
        instead of ``eval.temperature``, e.g. 0 for the greedy policy."""
        params, rollout = rollout_settings(self.cfg, len(seatings), evaluation, temperature)
        setup = self.env_setup
        return RolloutScheduler(
            env_factory=self.env_factory or (setup.eval_factory if evaluation
                                             else setup.train_factory),
            render=self.render,
            seatings=seatings,
            agent_names=self.agent_names,
            engine=self.engine,
            tokenizer=self.tokenizer,
            sampling=params,
            action=self.cfg.env.action,
            config=rollout,
            snapshot_slot=self._snapshot_slot,
            expected_version=lambda agent: self.served_version,
            cooperative=self.cooperative,
            episodes=self.env_host,
            summarize=setup.summarize,
        )

    def _snapshot_slot(self, spec: SeatSpec) -> str:
        agent, step = self.pool.choose(spec)
        slot = f"{agent}@step{step}"
        old = self.snapshot_slot_of.get(spec.raw)
        self.snapshot_slot_of[spec.raw] = slot
        if old is not None and old != slot and old not in self.snapshot_slot_of.values():
            self.engine.remove_adapter(old)  # unload first: vLLM holds at most max_loras
        if self.engine.adapter_version(slot) != step:
            self.engine.load_adapter(
                slot, self.pool.snapshots[agent][step], self.model.peft_config(agent), step
            )
        return slot

    @contextmanager
    def engine_awake(self) -> Iterator[dict[str, float]]:
        """Engines that can sleep (vLLM with sleep mode) hold their KV cache only while rolling
        out, so training gets the memory back between rollout phases. Yields a dict that holds
        ``time/wake`` once awake and ``time/sleep`` once asleep again (seconds), empty when the
        engine does not sleep between phases."""
        phases: dict[str, float] = {}
        if not self.cfg.rollout.vllm.sleep_between_phases:  # others' sleep/wake_up do nothing
            yield phases
            return
        start = time.perf_counter()
        self.engine.wake_up()
        phases["time/wake"] = time.perf_counter() - start
        try:
            yield phases
        finally:
            start = time.perf_counter()
            self.engine.sleep()
            phases["time/sleep"] = time.perf_counter() - start

    def sync_adapters(self) -> list[str]:
        """Bring every agent's engine slot to the trainer's version (``trainer.global_step``):
        push the adapters of the agents whose slot is at another version; return their names.
        Call it with the engine awake."""
        return self.adapter_sync()()

    def adapter_sync(self) -> Callable[[], list[str]]:
        """``sync_adapters`` in two halves: what to push is taken now (the trainer's version,
        the stale agents' adapters at it); the call returned pushes and checks it, also from
        another thread while the trainer moves on (rollout.overlap)."""
        version = self.trainer.global_step
        stale = [name for name in self.agent_names if self.engine.adapter_version(name) != version]
        payloads = adapter_payloads(self.engine, self.model, stale,
                                    self.trainer.published_adapters(version)) if stale else {}

        def push() -> list[str]:
            load_adapters(self.engine, self.model, version, payloads)
            for name in stale:
                if self.engine.adapter_version(name) != version:
                    raise RuntimeError(f"engine did not take agent {name!r} version {version}")
            self.served_version = version
            return stale

        return push

    def synced_rollout(
        self, scheduler: RolloutScheduler, seed: int, tracker: Tracker, what: str,
        items: list[int] | None = None, ahead_seeds: list[int] | None = None,
    ) -> tuple[RolloutResult, dict[str, float]]:
        """Wake the engine, sync the adapters, roll out (team tasks: group g plays dataset item
        ``items[g]``; ``ahead_seeds``: the next rollouts', played ahead in idle lanes);
        (result, seconds of the phases around the rollout: ``time/sync``, and ``time/wake`` /
        ``time/sleep`` where the engine sleeps between phases)."""
        with self.engine_awake() as phases:
            start = time.perf_counter()
            self.sync_adapters()
            phases["time/sync"] = time.perf_counter() - start
            result = scheduler.rollout(
                seed=seed, progress=lambda done, total: tracker.progress(done, total, what),
                items=items, ahead_seeds=ahead_seeds or (),
            )
        return result, phases

    # ------------------------------------------------------------------ loop
    def run(self) -> dict[str, float]:
        """Train ``max_steps`` steps (resuming first if asked); the last step's metrics. A
        dead or failed role, or an interruption, stops the run with one line naming it and the
        last checkpoint."""
        try:
            with RunLock(self.output_dir):  # re-entrant: the CLI took it before loading
                return self._run()
        except RoleFailed as error:
            self.close_roles()  # the others may wait on the dead one (or hold its resources)
            raise RoleFailed(f"{error} -- {self._last_good()}") from error
        except NonFiniteLossError as error:  # the step was refused; the run cannot go on
            self.close_roles()
            raise NonFiniteLossError(f"{error} -- {self._last_good(diverged=True)}") from error
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one by the CLI
            self.close_roles()  # the tracker's files were closed on the way out of _run
            raise RunInterrupted(f"interrupted during step {self.step} of {self.cfg.max_steps} "
                                 f"-- {self._last_good()}") from None

    def _last_good(self, diverged: bool = False) -> str:
        """Where a stopped run continues from, said at the end of its one line; after a
        divergence the latest checkpoint may hold the weights that diverged."""
        latest = resolve_resume("latest", self.output_dir)
        if latest is None:
            return "no checkpoint yet" if diverged else "last good checkpoint: none yet"
        if diverged:
            return (f"latest checkpoint: {latest} (its weights may be the ones that diverged: "
                    "resume=<an earlier checkpoint> with a lower learning rate)")
        return f"last good checkpoint: {latest} (continue with resume=latest)"

    def close_roles(self) -> None:
        """Release the roles' Ray actors (train ranks, env workers, engine actors); local
        roles hold nothing to release. Idempotent."""
        self.trainer.close()
        if self.env_host is not None:
            self.env_host.close()
        if self.cfg.actor_infer.num_engines:
            self.engine.close()
        if self.shared_bundles is not None:
            self.shared_bundles.close()

    def _run(self) -> dict[str, float]:
        cfg = self.cfg
        self._maybe_resume()
        if self.step == 0:
            self.pool.take(0)
        if self.run_id is None:
            self.run_id = uuid.uuid4().hex[:16]
        tracking = dataclasses.replace(
            cfg.tracking, run_name=cfg.tracking.run_name or self.output_dir.name)
        train_schedulers = [self.scheduler(self.train_seatings, evaluation=False)]
        if cfg.env.swap_roles_every:  # the same seatings with the two seats' players swapped
            train_schedulers.append(self.scheduler(
                [Seating(tuple(reversed(s.seats))) for s in self.train_seatings], False))
        eval_scheduler = self.scheduler(self.eval_seatings, evaluation=True)
        if cfg.rollout.overlap:  # say when it cannot pay: every step saves or evaluates
            starting = sum(map(self.plan.starts_next, range(self.step + 1, cfg.max_steps + 1)))
            log_line(f"rollout.overlap: {starting} of the {cfg.max_steps - self.step} steps to go "
                     "start the next rollout as they train (none that saves, evaluates, ends)")
        last: dict[str, float] = {}
        first_eval: dict[str, float] = {}
        last_eval: dict[str, float] = {}
        with Tracker(tracking, str(self.output_dir), run_config=dataclasses.asdict(cfg),
                     run_id=self.run_id) as tracker:
            if cfg.eval.eval_steps and cfg.eval.before_training and self.step == 0:
                with stage("evaluation before training"):
                    first_eval = self.evaluate(eval_scheduler, tracker)
                tracker.log(first_eval, step=0)
            quiet = "console" not in cfg.tracking.backends  # the console prints each step
            plan = self.plan
            stalls = StallWatch(self.agent_names)  # says when an agent has nothing to learn
            while self.step < cfg.max_steps:
                self.step += 1
                scheduler = train_schedulers[plan.scheduler_of(self.step)]
                if self.step == 1 or quiet:
                    log_line(f"step {self.step}/{cfg.max_steps} ..."
                             + (" (the first compiles what it needs)" if self.step == 1 else ""))
                following = plan.overlapped_next(self.step)
                metrics = self.train_step(
                    scheduler, tracker, plan.ahead_steps(self.step),
                    None if following is None else (train_schedulers[following[0]],
                                                    following[1]))
                if quiet:
                    log_line(f"step {self.step}/{cfg.max_steps}: done in "
                             f"{metrics['time/step']:.1f} s")
                if cfg.env.swap_roles_every:
                    metrics["team/roles_swapped"] = float(plan.block_of(self.step) % 2)
                if cfg.eval.eval_steps and (
                    self.step % cfg.eval.eval_steps == 0 or self.step == cfg.max_steps
                ):
                    with stage(f"evaluation at step {self.step}"):
                        last_eval = self.evaluate(eval_scheduler, tracker)
                    metrics.update(last_eval)
                tracker.log(metrics, step=self.step)
                for line in stalls.observe(metrics, self.step):
                    log_line(line)
                last = metrics
                if plan.saves_after(self.step):
                    self.save()
        self.close_roles()  # Ray: the actors are done; local: nothing to release
        if first_eval and last_eval:
            print(before_after(first_eval, last_eval, self.agent_names, self.step), flush=True)
        return last

    def train_step(self, scheduler: RolloutScheduler, tracker: Tracker,
                   ahead_steps: list[int] | None = None,
                   overlapped_next: tuple[RolloutScheduler, list[int]] | None = None,
                   ) -> dict[str, float]:
        """One step: roll out (``ahead_steps`` fill idle lanes) or take the rollout the step
        before started, start the next one (``overlapped_next``: its scheduler and lookahead
        steps), score, update the agents (and critics). ``compile/new_graphs``: graphs
        torch.compile built in this process during the step (said in a line after step 1)."""
        with self.compiles.watch("step", f"step {self.step}"):
            metrics = self._train_step(scheduler, tracker, ahead_steps, overlapped_next)
        metrics["compile/new_graphs"] = float(self.compiles.last)
        return metrics

    def _rollout_args(self, step: int, scheduler: RolloutScheduler, ahead_steps: list[int] | None
                      ) -> tuple[int, list[int] | None, list[int]]:
        """Step ``step``'s rollout seed, dataset items (drawn now, in step order) and the
        seeds of the steps it plays ahead."""
        items = None if self.items is None else self.items.take(scheduler.config.num_groups)
        seed = self.cfg.seed * 1_000_003 + step
        return seed, items, [seed + later - step for later in ahead_steps or ()]

    def _next_play(self, scheduler: RolloutScheduler, ahead_steps: list[int]
                   ) -> Callable[[], tuple[RolloutResult, float]]:
        """The next step's adapter sync and rollout, to be played in the background
        (rollout.overlap; quiet: no progress lines), everything they read taken now; the
        call returns (the rollout's result, the sync's seconds)."""
        push = self.adapter_sync()
        seed, items, ahead_seeds = self._rollout_args(self.step + 1, scheduler, ahead_steps)

        def play() -> tuple[RolloutResult, float]:
            start = time.perf_counter()
            push()
            synced = time.perf_counter() - start
            return scheduler.rollout(seed=seed, items=items, ahead_seeds=ahead_seeds), synced

        return play

    def _train_step(self, scheduler: RolloutScheduler, tracker: Tracker,
                    ahead_steps: list[int] | None,
                    overlapped_next: tuple[RolloutScheduler, list[int]] | None,
                    ) -> dict[str, float]:
        times: dict[str, float] = {}
        start = time.perf_counter()
        played_before = self.next_rollout.take(self.step)  # ((result, its sync's s), s)
        if played_before is None:
            seed, items, ahead_seeds = self._rollout_args(self.step, scheduler, ahead_steps)
            result, phases = self.synced_rollout(scheduler, seed, tracker, "episodes", items,
                                                 ahead_seeds)
            times.update(phases)
            played = times["time/rollout"] = time.perf_counter() - start - sum(phases.values())
        else:  # played while the step before trained: this step waited for what was left
            (result, synced), played = played_before
            played -= synced
            times["time/rollout"] = time.perf_counter() - start
        metrics = dict(result.metrics)
        metrics.update(rollout_phase_metrics(metrics, self.engine.last_serve, played))
        metrics["rollout/played_s"] = played
        if played_before is not None:
            metrics["rollout/sync_s"] = synced  # in the background, before the rollout
        if overlapped_next is not None:  # engines awake throughout (validation)
            self.next_rollout.start(self.step + 1, self._next_play(*overlapped_next))
        metrics.update(team_return(result.episodes))
        batch = result.batch
        if batch is None:
            metrics.update(times)
            return metrics
        batch = batch.to(self.device)

        start = time.perf_counter()
        batch, passes = behaviour_passes(self.cfg, self.trainer, batch, result.turns,
                                         self.engine_logprobs_comparable,
                                         stale=played_before is not None)
        metrics.update(passes)
        times["time/logprobs"] = time.perf_counter() - start

        start = time.perf_counter()
        captured = getattr(self.trainer, "captured", None)  # local trainer.capture only
        counts = captured.counts() if captured is not None else None
        if self.critics is not None:
            batch = self.critics.with_values(batch)
        per_agent, critic_metrics = update_agents(
            self.cfg, self.trainer, self.model, batch, self.step, self.policy_temperature,
            self.baselines, self.magnet, self.critics)
        times["time/train"] = time.perf_counter() - start  # agents and critics
        if captured is not None:
            metrics.update(capture_metrics(counts, captured.counts()))
        metrics.update(agent_metrics(per_agent))
        metrics.update(critic_metrics)
        metrics.update(times)
        metrics["time/step"] = sum(times.values())
        return metrics

    def evaluate(self, scheduler: RolloutScheduler, tracker: Tracker) -> dict[str, float]:
        """Validation rollouts with the trainer's current adapters (eval_phase.py)."""
        return evaluate_now(self, scheduler, tracker)

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        """A checkpoint of the run now (run_state.py says what it holds)."""
        return save_run(self)

    def load(self, path: Path) -> None:
        """Continue from the checkpoint at ``path``."""
        load_run(self, path)

    def _maybe_resume(self) -> None:
        resume_if_asked(self)

__all__ = ["AgenticPipeline"]
