"""Data-parallel trainer ranks as Ray actors in one placement group.

Each rank (``TrainRank``) builds the same team from the same ``TrainSpec`` (same base, same
seeded adapter init), joins a torch.distributed group and runs ``MultiAgentTrainer`` with a
strategy (torch or DeepSpeed) summing over a ``TorchDistributedSync``: every rank gets the whole
batch (one ``ray.put``), forwards its share of each agent's mini-batch, and the ranks sum their
gradients, so all replicas stay equal (roll/multi_agent/trainer.py). After each step rank 0
puts the trained agents' adapters in the object store in the base's dtype, for the engine actors
to fetch (``published_adapters``), and the driver's model takes them from the ranks in fp32 when
it first reads them (``MultiAgentLoRAModel.defer_import``; never the base). A store whose base is
only a shape (``roll.pipeline.builders.controller_holds_base``) takes rank 0's initial adapters
at start. A rank that dies stops the step with one line naming it.
"""

from __future__ import annotations

import hashlib
from contextlib import nullcontext

import ray
import torch

from roll.batch import TrajectoryBatch
from roll.distributed.data_parallel import TorchDistributedSync, free_port, init_ranks
from roll.distributed.ray_actors import ActorGroup, SharedBundles
from roll.distributed.resident import ResidentPeak, resident_elements
from roll.distributed.roles import (
    TrainSpec,
    choice_logprobs_under,
    response_divergences,
    response_logprobs,
)
from roll.models import load_model, resolve_dtype
from roll.multi_agent.critics import Critics, critic_agents
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.multi_agent.plan import agent_dropout
from roll.multi_agent.strategy import TorchStrategy
from roll.multi_agent.trainer import MultiAgentTrainer
from roll.utils.recompiles import CompileWatch

PASS_FIELDS = ("old_logprobs", "old_move_logprobs", "ref_logprobs")
"""What the no-grad passes write (roll/multi_agent/trainer.py ``behaviour_logprobs``)."""


class TrainRank:
    """One data-parallel replica of the team and its trainer (runs inside a Ray actor)."""

    def __init__(self, spec: TrainSpec, rank: int, world_size: int, cpu_threads: int) -> None:
        if spec.device == "cpu":
            torch.set_num_threads(max(1, cpu_threads))
        self.spec, self.rank, self.world_size = spec, rank, world_size
        self.device = spec.device

    def rendezvous_address(self) -> str:
        """The rendezvous of the ranks' process group, as host:port on THIS actor's node (asked
        of rank 0: the driver's node may hold no rank at all when the cluster has several)."""
        return f"{ray.util.get_node_ip_address()}:{free_port()}"

    def join(self, address: str) -> None:
        """Join the ranks' process group at ``address``, then build the team and its trainer
        (every rank at once: joining waits for all of them)."""
        spec, rank = self.spec, self.rank
        init_ranks(rank, self.world_size, address, spec.device)
        torch.manual_seed(spec.seed)
        self.meter = ResidentPeak() if spec.measure_resident else None
        self.compiles = CompileWatch(f"train rank {rank}")
        """A line when a rank's pass compiles after its first of a kind (the ranks compile in
        their own processes: the pipeline's ``compile/new_graphs`` does not see them)."""
        with self.meter.recording() if self.meter else nullcontext():
            self._build()
        self.load_peak = self.meter.peak if self.meter else None

    def _build(self) -> None:
        spec = self.spec
        if spec.strategy == "deepspeed" and spec.zero_stage == 3:
            from roll.distributed.zero3_load import load_partitioned

            base = load_partitioned(spec.model_path, spec.dtype, spec.device, spec.tf32)
        else:
            base = load_model(spec.model_path, dtype=spec.dtype, device=spec.device,
                              tf32=spec.tf32)
        critics = ([] if spec.critic is None else
                   critic_agents(spec.critic, [agent.name for agent in spec.agents]))
        self.model = MultiAgentLoRAModel(base, list(spec.agents), seed=spec.seed,
                                         critics=critics)
        self.critics = (Critics(spec.critic, self.model, critics, TorchDistributedSync(),
                                trainer=spec.trainer)
                        if critics else None)
        if spec.strategy == "deepspeed":
            from roll.distributed.deepspeed_strategy import DeepSpeedStrategy

            strategy = DeepSpeedStrategy(spec.zero_stage, TorchDistributedSync(),
                                         spec.zero3_live_elements, spec.zero3_gather,
                                         spec.zero3_persist_elements)
        else:
            strategy = TorchStrategy(TorchDistributedSync())
        self.trainer = MultiAgentTrainer(self.model, list(spec.agents), spec.trainer,
                                         temperature=spec.temperature, strategy=strategy)

    def logprob_passes(self, batch: TrajectoryBatch, rows: torch.Tensor,
                       old: bool = True) -> dict:
        """The no-grad log-prob fields of ``batch``'s ``rows`` (this rank's share), on CPU."""
        with self.compiles.watch("logprobs", f"the log-prob passes of step "
                                 f"{self.trainer.global_step + 1}"):
            share = self.trainer.logprob_passes(batch.select(rows).to(self.device), old=old)
        return {key: getattr(share, key).cpu() for key in PASS_FIELDS
                if getattr(share, key) is not None}

    def policy_logprobs(self, batch: TrajectoryBatch, rows: torch.Tensor, temperature: float
                        ) -> torch.Tensor:
        """``roles.response_logprobs`` of ``batch``'s ``rows`` (this rank's share), on CPU."""
        return response_logprobs(self.model, batch.select(rows), temperature,
                                 self.trainer.config.forward_rows).cpu()

    def divergence_rows(self, batch: TrajectoryBatch, rows: torch.Tensor, agent_a: str,
                        agent_b: str, temperature: float) -> torch.Tensor:
        """``roles.response_divergences`` of ``batch``'s ``rows`` (this rank's share)."""
        return response_divergences(self.model, batch.select(rows), agent_a, agent_b,
                                    temperature, self.trainer.config.forward_rows).cpu()

    def choice_logprobs(self, batch: TrajectoryBatch, rows: torch.Tensor, temperature: float,
                        adapters: dict | None) -> torch.Tensor:
        """``roles.choice_logprobs_under`` of ``batch``'s ``rows`` (this rank's share)."""
        return choice_logprobs_under(self.trainer, batch.select(rows), adapters,
                                     temperature).cpu()

    def critic_values(self, batch: TrajectoryBatch, rows: torch.Tensor) -> torch.Tensor:
        """The critics' values (share, T) of ``batch``'s ``rows`` (this rank's share), on CPU."""
        return self.critics.with_values(batch.select(rows).to(self.device)).values.cpu()

    def critic_backward(self, batch: TrajectoryBatch) -> tuple[dict, int]:
        """Every critic's gradient, summed over the ranks and checked; held until
        ``critic_step`` or ``critic_discard``. (The critics' metrics, rows this rank ran.)"""
        metrics = self.critics.backward(batch.to(self.device))
        return metrics, self.critics.trainer.rows_forwarded

    def critic_step(self) -> dict | None:
        """Step the prepared critics; rank 0 returns their tensors (``export_tensors``)."""
        self.critics.step()
        return self.critics.export_tensors() if self.rank == 0 else None

    def critic_discard(self) -> None:
        self.critics.discard()

    def critic_tensors(self) -> dict | None:
        """Rank 0's critic tensors (``export_tensors``; every replica holds the same)."""
        return self.critics.export_tensors() if self.rank == 0 else None

    def critic_state(self) -> dict | None:
        """The critics' optimizers and schedulers (rank 0's; every replica holds the same)."""
        return self.critics.trainer.state_dict() if self.rank == 0 else None

    def load_critics(self, tensors: dict, trainer_state: dict) -> None:
        self.critics.load_tensors(tensors)
        self.critics.trainer.load_state_dict(trainer_state)

    def train_step(self, batch: TrajectoryBatch) -> tuple[dict, int, int]:
        """(metrics per agent, global step, rows this rank ran forward/backward)."""
        with (self.meter.recording() if self.meter else nullcontext(),
              self.compiles.watch("train", f"train step {self.trainer.global_step + 1}")):
            metrics = self.trainer.train_step(batch.to(self.device))
        return metrics, self.trainer.global_step, self.trainer.rows_forwarded

    # Every method below is called on every rank (under ZeRO they are collectives); the
    # group keeps rank 0's answer.
    def hold(self) -> None:
        self.trainer.hold()

    def rollback(self) -> None:
        self.trainer.rollback()

    def release(self) -> None:
        self.trainer.release()

    def export_adapters(self, names: list[str]) -> dict[str, dict[str, torch.Tensor]] | None:
        adapters = self.trainer.export_adapters(names)
        return adapters if self.rank == 0 else None

    def publish_adapters(self, names: list[str]) -> dict | None:
        """Agents ``names``' adapters put in the object store by rank 0 in the base's dtype,
        the precision engines compute LoRA in (hf stacks and vLLM slots both cast to it;
        casting here rounds as they would): what the engine actors fetch straight from rank
        0, half the bytes of fp32 for a bf16 base. Every rank exports (under ZeRO-3 a
        collective gather); only rank 0 answers, {name: reference}."""
        adapters = self.trainer.export_adapters(names)
        if self.rank != 0:
            return None
        dtype = resolve_dtype(self.spec.dtype)
        return {name: ray.put({key: tensor.to(dtype) for key, tensor in tensors.items()})
                for name, tensors in adapters.items()}

    def load(self, adapters: dict[str, dict[str, torch.Tensor]], state: dict | None) -> None:
        self.trainer.load_adapters(adapters)
        if state is not None:
            self.trainer.load_state_dict(state)

    def state_dict(self) -> dict | None:
        state = self.trainer.state_dict()
        return state if self.rank == 0 else None

    def resident_elements(self) -> dict[str, int | None]:
        """Parameter elements this rank holds at rest ("held"; ZeRO-3: its partitions of the
        base and the adapters, otherwise the whole model), and the most it held at once while
        building the team ("load_peak") and since ("peak"; both None unless
        ``TrainSpec.measure_resident``)."""
        return {"held": resident_elements(self.model), "load_peak": self.load_peak,
                "peak": self.meter.peak if self.meter else None}

    def digest(self) -> str:
        """SHA-256 of every adapter tensor and optimizer state tensor (replicas must agree)."""
        sha = hashlib.sha256()
        adapters = self.trainer.export_adapters(self.model.agent_names)
        optimizers = self.trainer.state_dict()["optimizers"]
        for name in self.model.agent_names:
            for key, tensor in adapters[name].items():
                sha.update(key.encode())
                sha.update(tensor.float().numpy().tobytes())
            for index, slot in sorted(optimizers[name]["state"].items()):
                for key in sorted(slot):
                    sha.update(f"{index}.{key}".encode())
                    sha.update(torch.as_tensor(slot[key]).float().cpu().numpy().tobytes())
        return sha.hexdigest()


class RayTrainGroup:
    """``world_size`` TrainRank actors, packed in one placement group (a ``TrainGroup``), or in
    bundles ``shared`` with the engines (colocated)."""

    def __init__(self, spec: TrainSpec, model: MultiAgentLoRAModel, world_size: int,
                 cpus_per_rank: float = 1.0, gpus_per_rank: float = 0.0,
                 shared: SharedBundles | None = None) -> None:
        if not ray.is_initialized():
            raise RuntimeError("cluster.backend=ray: call ray.init() (the pipeline does) before "
                               "building the train group")
        self.model = model
        self.world_size = world_size
        self.global_step = 0
        self.config = spec.trainer
        self.dropout = agent_dropout(spec.agents)  # as the ranks' trainers read it
        self._held: tuple[dict, int] | None = None
        self._published: dict[str, tuple[int, ray.ObjectRef]] = {}
        """agent -> (global step, rank 0's engine copy of its adapter in the object store)."""
        self.rows_per_rank: list[int] = []
        """Rows each rank ran forward/backward in the last step (their shares)."""
        self.pass_rows_per_rank: list[int] = []
        """Real rows of each rank's share in the last no-grad passes (padding not counted)."""
        self.critic_rows_per_rank: list[int] = []
        """Rows each rank ran through the critics' update in the last step (their shares)."""
        self.actors = ActorGroup(
            "actor_train rank", TrainRank, world_size, cpus_per_rank, gpus_per_rank,
            lambda rank: (spec, rank, world_size, max(1, int(cpus_per_rank))), shared)
        self.address = self._get([self.ranks[0].rendezvous_address.remote()], "rendezvous")[0]
        """Where the ranks' process group rendezvoused: a free port on rank 0's node."""
        self._get([rank.join.remote(self.address) for rank in self.ranks], "start")
        self._get([rank.digest.remote() for rank in self.ranks], "start")
        # A store without a base (roll.models.load_shape) has zeros where the ranks have the
        # seeded initial adapters: it takes rank 0's (a loaded model has them already, or
        # whatever was imported into it since, which load_state_dict pushes to the ranks).
        if not model.holds_base:
            self._pull_adapters(model.agent_names)

    @property
    def ranks(self) -> list:
        """The rank actors (empty once closed)."""
        return self.actors.actors

    def _get(self, refs: list, what: str) -> list:
        return self.actors.get(refs, what)

    def logprob_passes(self, batch: TrajectoryBatch, old: bool = True) -> TrajectoryBatch:
        """The no-grad passes on the ranks, each on a contiguous share of the rows (the batch
        travels once, through the object store), put back together in row order; ``old``
        False and no reference pass: nothing to run, ``batch`` as it is."""
        if not old and self.config.kl_coef == 0:
            return batch
        parts = self._by_shares(batch, "logprob_passes", "log-prob passes", old)
        return batch.with_fields(**{key: torch.cat([part[key] for part in parts]).to(
            batch.input_ids.device) for key in parts[0]})

    def critic_values(self, batch: TrajectoryBatch) -> torch.Tensor:
        """The critics' values (B, T) (``Critics.with_values``), each rank on its share."""
        parts = self._by_shares(batch, "critic_values", "critic values")
        return torch.cat(parts).to(batch.input_ids.device)

    @property
    def agent_names(self) -> list[str]:
        return self.model.agent_names

    def policy_logprobs(self, batch: TrajectoryBatch, temperature: float) -> torch.Tensor:
        """(B, T) log-probs of the response tokens under the adapters as they are now (HAPPO's
        ratios), each rank on its share of the rows."""
        parts = self._by_shares(batch, "policy_logprobs", "policy log-probs", temperature)
        return torch.cat(parts).to(batch.input_ids.device)

    def divergence_rows(self, batch: TrajectoryBatch, agent_a: str, agent_b: str,
                        temperature: float) -> torch.Tensor:
        """(B,) each row's summed KL(p_a || p_b), each rank on its share of the rows."""
        return torch.cat(self._by_shares(batch, "divergence_rows", "policy divergences",
                                         agent_a, agent_b, temperature))

    def choice_logprobs(self, batch: TrajectoryBatch, temperature: float,
                        adapters: dict | None = None) -> torch.Tensor:
        """(B, T, C) legal-move log-probs at the branching points, of the agents as they are
        or under ``adapters`` (a magnet, whose tensors travel once, through the object store),
        each rank on its share of the rows."""
        parts = self._by_shares(batch, "choice_logprobs", "legal-move log-probs", temperature,
                                ray.put(adapters) if adapters else None)
        return torch.cat(parts).to(batch.input_ids.device)

    def _by_shares(self, batch: TrajectoryBatch, method: str, what: str, *args) -> list:
        """Rank r runs ``method(batch, rows, *args)`` on rows r*s … (r+1)*s - 1,
        s = ceil(rows / k); its answer (a tensor or a dict of tensors, one row each) comes
        back cut to the real rows. The last shares are padded with copies of row 0 whose
        results are dropped: under ZeRO-3 every rank must join every forward (each gathers
        its partitions), so all must forward the same number of chunks of the same size."""
        rows = len(batch)
        size = -(-rows // self.world_size)
        shares = [torch.arange(rank * size, min((rank + 1) * size, rows))
                  for rank in range(self.world_size)]
        self.pass_rows_per_rank = [len(share) for share in shares]
        padded = [torch.cat([share, torch.zeros(size - len(share), dtype=torch.long)])
                  for share in shares]
        batch_ref = ray.put(batch.to("cpu"))
        parts = self._get([getattr(rank, method).remote(batch_ref, share, *args)
                           for rank, share in zip(self.ranks, padded, strict=True)], what)
        return [{key: value[:len(share)] for key, value in part.items()}
                if isinstance(part, dict) else part[:len(share)]
                for part, share in zip(parts, shares, strict=True)]

    def critic_backward(self, batch: TrajectoryBatch) -> dict[str, float]:
        """Every critic's gradient on the ranks (each its share of every critic's rows,
        summed over the ranks); nothing steps until ``critic_step``. The critics' metrics."""
        batch_ref = ray.put(batch.to("cpu"))
        results = self._get([rank.critic_backward.remote(batch_ref) for rank in self.ranks],
                            "critic update")
        self.critic_rows_per_rank = [rows for _, rows in results]
        return results[0][0]

    def critic_step(self) -> dict:
        """Step the critics on every rank; rank 0's critic tensors (``export_tensors``)."""
        return self._get([rank.critic_step.remote() for rank in self.ranks], "critic update")[0]

    def critic_discard(self) -> None:
        if self.ranks:
            self._get([rank.critic_discard.remote() for rank in self.ranks], "critic discard")

    def critic_tensors(self) -> dict:
        """Rank 0's critic tensors (adapters and value heads, ``Critics.export_tensors``)."""
        return self._get([rank.critic_tensors.remote() for rank in self.ranks],
                         "critic export")[0]

    def critic_state(self) -> dict:
        return self._get([rank.critic_state.remote() for rank in self.ranks], "state export")[0]

    def load_critics(self, tensors: dict, trainer_state: dict) -> None:
        self._get([rank.load_critics.remote(tensors, trainer_state) for rank in self.ranks],
                  "resume")

    def train_step(self, batch: TrajectoryBatch) -> dict[str, dict[str, float]]:
        batch_ref = ray.put(batch.to("cpu"))
        results = self._get([rank.train_step.remote(batch_ref) for rank in self.ranks],
                            f"train step {self.global_step + 1}")
        metrics, self.global_step, _ = results[0]
        self.rows_per_rank = [rows for _, _, rows in results]
        self._pull_adapters(list(metrics))
        return metrics

    def _pull_adapters(self, names: list[str]) -> None:
        """After a step: rank 0 publishes agents ``names``' adapters for the engines
        (``published_adapters``), and the pipeline's model takes them from the ranks when it
        first reads them (checkpoints, snapshots, the magnet, HAPPO's hold), not every step.
        Until then no train step can pass unseen: each one defers again, and an agent that
        did not train keeps its tensors bitwise on the ranks."""
        refs = self._get([rank.publish_adapters.remote(names) for rank in self.ranks],
                         "adapter export")[0]
        for name, ref in refs.items():
            self._published[name] = (self.global_step, ref)
            self.model.defer_import(name, lambda name=name: self._export([name])[name])

    def _export(self, names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
        """Rank 0's adapters of ``names`` in fp32 (every rank joins: a ZeRO-3 gather)."""
        return self._get([rank.export_adapters.remote(names) for rank in self.ranks],
                         "adapter export")[0]

    def published_adapters(self, version: int) -> dict[str, ray.ObjectRef]:
        """Object references to rank 0's copies, in the engines' dtype, of the agents'
        adapters at ``version`` (= ``global_step``): what engine actors fetch directly
        (``push_adapters``), so the tensors never pass through the pipeline's process."""
        return {name: ref for name, (step, ref) in self._published.items() if step == version}

    def hold(self) -> None:
        """The ranks remember their state; this side, the pipeline model's adapters."""
        self._held = ({name: self.model.export_adapter(name) for name in self.model.agent_names},
                      self.global_step)
        self._get([rank.hold.remote() for rank in self.ranks], "hold")

    def rollback(self) -> None:
        """The pipeline model's adapters put back; the ranks too while they live (a rank that
        refused a step has failed the group, which is then closed)."""
        adapters, self.global_step = self._held
        self._held = None
        self._published.clear()  # the engines take the rolled-back adapters from the store
        for name, tensors in adapters.items():
            self.model.import_adapter(name, tensors)
        if self.ranks:
            self._get([rank.rollback.remote() for rank in self.ranks], "rollback")

    def release(self) -> None:
        self._held = None
        self._get([rank.release.remote() for rank in self.ranks], "release")

    def state_dict(self) -> dict:
        return self._get([rank.state_dict.remote() for rank in self.ranks], "state export")[0]

    def load_state_dict(self, state: dict) -> None:
        self._published.clear()  # resumed adapters reach the engines from the store
        adapters = {name: self.model.export_adapter(name) for name in self.model.agent_names}
        self._get([rank.load.remote(adapters, state) for rank in self.ranks], "resume")
        self.global_step = state["global_step"]

    def resident_elements(self) -> list[dict[str, int | None]]:
        """Each rank's parameter elements at rest (what ZeRO-3 shards) and the most it held at
        once while loading and since (``TrainRank.resident_elements``)."""
        return self._get([rank.resident_elements.remote() for rank in self.ranks], "memory")

    def digests(self) -> list[str]:
        """Each rank's digest of adapters + optimizer states (equal when in step)."""
        return self._get([rank.digest.remote() for rank in self.ranks], "digest")

    def close(self) -> None:
        """Bring the pipeline's model up to date, then kill the ranks and free their placement
        group (idempotent)."""
        if self.ranks:
            self.model.import_deferred()  # rank 0's object store goes with it
        self.actors.close()


class RayCritics:
    """The run's critics when the agents train on Ray ranks (``critic.mode`` != none): their
    values and updates run on the ranks (``RayTrainGroup``), each rank on its share of the
    rows; after each update rank 0's critic tensors are copied into ``local`` (the pipeline's
    ``Critics`` on its own model), which saves checkpoints as in one process. Same interface as
    ``Critics`` where the pipeline calls it."""

    def __init__(self, local: Critics, group: RayTrainGroup) -> None:
        self.local, self.group = local, group
        self._metrics: dict[str, float] | None = None
        if not local.model.holds_base:  # a store's critics are zeros: take rank 0's
            self.local.load_tensors(group.critic_tensors())

    @property
    def names(self) -> list[str]:
        return self.local.names

    def with_values(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        return batch.with_fields(values=self.group.critic_values(batch))

    def backward(self, batch: TrajectoryBatch) -> None:
        self._metrics = self.group.critic_backward(batch)

    def step(self) -> dict[str, float]:
        metrics, self._metrics = self._metrics, None
        self.local.load_tensors(self.group.critic_step())
        return metrics

    def discard(self) -> None:
        self._metrics = None
        self.group.critic_discard()

    def save(self, checkpoint) -> None:
        self.local.save(checkpoint)

    def state_dict(self) -> dict:
        """``Critics.state_dict``'s format, with the ranks' optimizers and schedulers."""
        return {**self.local.state_dict(), "trainer": self.group.critic_state()}

    def load(self, checkpoint, state: dict | None) -> None:
        """Resume: the checkpoint into the pipeline's critics, then theirs to every rank."""
        self.local.load(checkpoint, state)
        self.group.load_critics(self.local.export_tensors(), state["trainer"])
