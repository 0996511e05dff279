"""What the pipeline builds from its config before the loop starts: the Ray connection, the
base model's folder, the rollout engine and the env workers."""

from __future__ import annotations

import dataclasses
import signal
import threading
from pathlib import Path

from roll.agentic.rollout.scheduler import RolloutConfig
from roll.distributed.roles import LocalTrainGroup, TrainGroup, TrainSpec
from roll.errors import ConfigError
from roll.inference.base import SamplingParams
from roll.models import load_model, load_shape
from roll.models.aliases import resolve_model_path
from roll.multi_agent.critics import Critics
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.pipeline.cluster_checks import (
    check_ray_resources,
    compile_blocker,
    infer_gpus_per_engine,
    train_gpus_per_rank,
)
from roll.pipeline.config import PipelineConfig


def start_ray(cfg: PipelineConfig) -> None:
    """Join (cluster.address) or start a Ray instance, then check that it has what the
    trainer's ranks ask for (one line naming the key otherwise)."""
    import ray

    if not ray.is_initialized():
        # ray.init replaces the SIGTERM handler with sys.exit; the CLI's stops the run as
        # Ctrl-C does (roles closed, one line naming the last checkpoint): keep that one.
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        try:
            ray.init(address=cfg.cluster.address, num_cpus=cfg.cluster.num_cpus,
                     include_dashboard=False)
        except (ValueError, ConnectionError) as error:  # a malformed address, or no cluster
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError("cluster.address", cfg.cluster.address,
                              f"Ray could not start or join a cluster there: {reason}") from None
        finally:
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
    check_ray_resources(cfg, ray.cluster_resources())


def model_path(cfg: PipelineConfig) -> Path | str:
    """The base model folder: an alias ('tiny', 'smollm2-135m') is built into the cache on
    first use (roll/models/aliases.py); anything else is a folder or hub id."""
    return resolve_model_path(cfg.model.path)


def controller_holds_base(cfg: PipelineConfig) -> bool:
    """Whether the pipeline's own process loads the base's weights: in local mode (every
    pass runs here) and for an in-process hf engine (it decodes on them). Otherwise (Ray
    train ranks with engine actors, or a vLLM engine, which loads its own copy) the pipeline
    holds the base as a shape only and its model is the store of the adapters, each updated
    from the train ranks after their steps."""
    return (cfg.cluster.backend != "ray"
            or (cfg.rollout.engine == "hf" and not cfg.actor_infer.num_engines))


def load_base(cfg: PipelineConfig, path):
    """The base in the pipeline's process: loaded on ``model.device``, or only its shape
    (meta device, no weights) where ``controller_holds_base`` says no forward runs here."""
    if controller_holds_base(cfg):
        return load_model(path, dtype=cfg.model.dtype, device=cfg.model.device,
                          tf32=cfg.model.tf32)
    return load_shape(path, cfg.model.dtype)


def train_spec(cfg: PipelineConfig, path, agents, temperature: float,
               with_critics: bool) -> TrainSpec:
    """What each train rank needs to build the team and its trainer by itself."""
    train = cfg.actor_train
    return TrainSpec(
        model_path=str(path), dtype=cfg.model.dtype, tf32=cfg.model.tf32,
        device="cuda" if cfg.model.device.startswith("cuda") else "cpu",
        agents=tuple(agents), seed=cfg.seed, temperature=temperature,
        trainer=dataclasses.replace(cfg.trainer, compile=trainer_compile(cfg),
                                    share_prefix=trainer_share_prefix(cfg)),
        strategy=train.strategy, zero_stage=train.zero_stage,
        zero3_live_elements=train.zero3_live_elements, zero3_gather=train.zero3_gather,
        zero3_persist_elements=train.zero3_persist_elements,
        critic=cfg.critic if with_critics else None,
    )


def build_shared_bundles(cfg: PipelineConfig):
    """actor_infer.colocate: one placement group whose bundle i holds train rank i and engine
    i (``SharedBundles``); otherwise None (each role places its own actors)."""
    if not cfg.actor_infer.colocate:
        return None
    from roll.distributed.ray_actors import SharedBundles

    train, infer = cfg.actor_train, cfg.actor_infer
    return SharedBundles(train.world_size, train.cpus_per_rank + infer.cpus_per_engine,
                         train_gpus_per_rank(cfg) + infer_gpus_per_engine(cfg))


def build_engine(
    cfg: PipelineConfig, model: MultiAgentLoRAModel, tokenizer, path, snapshot_slots: int,
    train_spec: TrainSpec, shared=None,
):
    """The rollout engine named by rollout.engine, in this process or as
    actor_infer.num_engines Ray actors (each building its engine from ``train_spec``).

    hf shares the trainer's base weights (an actor builds its own copy); vllm loads its own copy
    of the base from ``path`` and serves the agents (and ``snapshot_slots`` frozen snapshots) as
    LoRA adapters.
    """
    if cfg.rollout.engine == "vllm":
        settings = cfg.rollout.vllm
        options = dict(
            max_loras=len(model.agent_names) + snapshot_slots,
            max_lora_rank=max(_agent_ranks(model)),
            seed=cfg.seed,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            max_model_len=settings.max_model_len,
            dtype=cfg.model.dtype,
            enforce_eager=settings.enforce_eager,
            tempered_logprobs=(cfg.rollout.sampling.temperature or 1.0) != 1.0,
        )
    else:
        # The same decode path in this process and in engine actors (compiled step, CUDA
        # graphs where the config resolves them on).
        options = dict(max_batch_size=cfg.rollout.hf.max_batch_size,
                       lora_kernels=cfg.rollout.hf.lora_kernels,
                       attention_kernel=hf_attention_kernel(cfg), compile=hf_compile(cfg),
                       cuda_graphs=cfg.rollout.hf.cuda_graphs, share_prefix=hf_share_prefix(cfg),
                       prefill_graphs=hf_prefill_graphs(cfg),
                       fuse_projections=hf_fuse_projections(cfg))
    if cfg.actor_infer.num_engines:
        from roll.distributed.ray_infer import EngineSpec, RayInferGroup, forwarded_env

        infer = cfg.actor_infer
        return RayInferGroup(train_spec, infer.num_engines,
                             EngineSpec(cfg.rollout.engine, options, forwarded_env()),
                             infer.cpus_per_engine, infer_gpus_per_engine(cfg), shared)
    if cfg.rollout.engine == "vllm":
        from roll.inference.vllm_engine import VLLMEngine

        return VLLMEngine(str(path), tokenizer, **options)
    return hf_engine_for(model, tokenizer, device=cfg.model.device, seed=cfg.seed, **options)


def hf_engine_for(model: MultiAgentLoRAModel, tokenizer, **options):
    """An ``HFEngine`` on the trainer's base (its weights shared, never copied): PEFT's LoRA
    layers off while it runs (``model.reference``), fused stacks sized for the agents and their
    largest rank. ``options``: the engine's other keyword arguments."""
    from roll.inference.hf.engine import HFEngine

    ranks = _agent_ranks(model)
    return HFEngine(model.base_model, tokenizer, adapters_off=model.reference,
                    **{"slot_capacity": len(ranks), "rank_capacity": max(ranks), **options})


def _agent_ranks(model: MultiAgentLoRAModel) -> list[int]:
    """The LoRA rank of each agent (critics excluded), in ``agent_names`` order."""
    return [int(model.peft_config(name).r) for name in model.agent_names]


def trainer_compile(cfg: PipelineConfig) -> bool:
    """``trainer.compile``, its default (None) resolved: compiled forwards where the model is
    on CUDA and the run can compile them (the torch strategy, every agent's LoRA dropout 0);
    eager elsewhere. Measured on an H100 (benchmarks/README.md): the Kuhn recipe's train phase
    1.92 s compiled against 2.28 s eager; 15-85 s of warm-up in the first steps."""
    if cfg.trainer.compile is None:
        return str(cfg.model.device).startswith("cuda") and compile_blocker(cfg) is None
    return bool(cfg.trainer.compile)


def trainer_share_prefix(cfg: PipelineConfig) -> bool:
    """``trainer.share_prefix``, its default (None) resolved: on where the model is on the CPU,
    off on CUDA. Measured (benchmarks/README.md, "A shared prefix"): the tiny Kuhn recipe's step
    on 2 CPU cores 1.31 -> 0.99 s; the Leduc recipe's train phase on an H100 (SmolLM2,
    compiled) 6.1 -> 10.8 s, a second forward per micro-batch costing more there than the
    prompt tokens it saves."""
    return _off_on_cuda(cfg.trainer.share_prefix, cfg)


def hf_share_prefix(cfg: PipelineConfig) -> bool:
    """``rollout.hf.share_prefix``, its default (None) resolved: on where the model is on the
    CPU, where a prefill's cost grows with its tokens (the tiny Kuhn recipe's rollout: measured
    in benchmarks/README.md, "A shared prefix"); off on CUDA, where a second prefill forward
    per admission of a few rows is not measured yet (the trainer's second forward cost more
    there than it saved)."""
    return _off_on_cuda(cfg.rollout.hf.share_prefix, cfg)


def _off_on_cuda(value: bool | None, cfg: PipelineConfig) -> bool:
    """A shared-prefix option resolved: as set, or (None) on unless the model is on CUDA."""
    return not str(cfg.model.device).startswith("cuda") if value is None else bool(value)


def hf_prefill_graphs(cfg: PipelineConfig) -> bool:
    """``rollout.hf.prefill_graphs``, its default (None) resolved: on where the model is on CUDA
    and the decode step replays a CUDA graph (rollout.hf.cuda_graphs, continuous batching)."""
    if cfg.rollout.hf.prefill_graphs is None:
        return (str(cfg.model.device).startswith("cuda") and bool(cfg.rollout.hf.cuda_graphs)
                and bool(cfg.rollout.continuous))
    return bool(cfg.rollout.hf.prefill_graphs)


def hf_fuse_projections(cfg: PipelineConfig) -> bool:
    """``rollout.hf.fuse_projections``, its default (None) resolved: on where the model is on
    CUDA (a decode step of a few rows is bound by how many kernels it launches), off on the
    CPU."""
    if cfg.rollout.hf.fuse_projections is None:
        return str(cfg.model.device).startswith("cuda")
    return bool(cfg.rollout.hf.fuse_projections)


def hf_attention_kernel(cfg: PipelineConfig) -> str:
    """``rollout.hf.attention_kernel``, its default (None) resolved: 'triton' where the model
    is on CUDA (it reads only the cache columns a row sees; on an H200 1.7-2.5x faster than
    'sdpa' per layer at 32-256 rows), 'sdpa' on the CPU (the Triton kernel needs CUDA)."""
    if cfg.rollout.hf.attention_kernel is None:
        return "triton" if str(cfg.model.device).startswith("cuda") else "sdpa"
    return cfg.rollout.hf.attention_kernel


def hf_compile(cfg: PipelineConfig) -> bool:
    """``rollout.hf.compile``, its default (None) resolved: compile where the model is on CUDA
    and turns are batched continuously (one decode shape per run). Lock-step rounds would
    compile once per row and cache-length bucket, about a minute each, so they stay eager."""
    if cfg.rollout.hf.compile is None:
        return str(cfg.model.device).startswith("cuda") and bool(cfg.rollout.continuous)
    return bool(cfg.rollout.hf.compile)


def engine_reports_policy_logprobs(cfg: PipelineConfig) -> bool:
    """Whether the engine's log-probs are the trainer's (the engine/trainer gap metric):
    a vLLM engine at temperature != 1 reports filtered ones under top-k/top-p or a
    constraint (vllm_engine.py); the hf engine always reports the policy's."""
    sampling = cfg.rollout.sampling
    return (cfg.rollout.engine == "hf" or (sampling.temperature or 1.0) == 1.0
            or (sampling.top_k == 0 and sampling.top_p == 1.0
                and not cfg.rollout.constrained_decoding))


def build_env_host(cfg: PipelineConfig):
    """Env worker actors (env_workers.num_workers > 0) that hold the rollouts' episodes, or
    None: the episodes stay in the pipeline's process."""
    if not cfg.env_workers.num_workers:
        return None
    from roll.distributed.ray_env import RayEpisodes

    return RayEpisodes(cfg.env_workers.num_workers, cfg.env_workers.cpus_per_worker)


def build_train_group(spec: TrainSpec, model: MultiAgentLoRAModel, backend: str,
                      world_size: int = 1, cpus_per_rank: float = 1.0,
                      gpus_per_rank: float = 0.0, shared=None) -> TrainGroup:
    """The trainer for ``cluster.backend``: local (``world_size`` 1) or Ray actors (in the
    bundles ``shared`` with the engines when colocated)."""
    if backend == "local":
        if world_size != 1:
            raise ValueError(f"actor_train.world_size={world_size}: the local backend runs "
                             f"one rank; use cluster.backend=ray")
        return LocalTrainGroup(model, list(spec.agents), spec.trainer, spec.temperature)
    if backend == "ray":
        from roll.distributed.ray_train import RayTrainGroup

        return RayTrainGroup(spec, model, world_size, cpus_per_rank, gpus_per_rank, shared)
    raise ValueError(f"cluster.backend={backend!r}: must be 'local' or 'ray'")


def critics_where_trained(cfg: PipelineConfig, critics: Critics | None, trainer: TrainGroup):
    """The run's critics where its agents train: ``critics`` itself (local), or on the Ray
    ranks (``RayCritics``: values and updates there, their tensors copied back into
    ``critics`` for checkpoints)."""
    if critics is None or cfg.cluster.backend != "ray":
        return critics
    from roll.distributed.ray_train import RayCritics

    return RayCritics(critics, trainer)


def rollout_settings(cfg: PipelineConfig, seatings: int, evaluation: bool,
                     temperature: float | None = None) -> tuple[SamplingParams, RolloutConfig]:
    """The sampling and the sizes of a scheduler that plays ``seatings`` seatings for training
    or evaluation; ``temperature`` (evaluation only) instead of ``eval.temperature``, e.g. 0
    for the greedy policy."""
    sampling = cfg.rollout.sampling
    if not evaluation:
        if temperature is not None:
            raise ValueError("a temperature of its own is for evaluation only: training "
                             "samples at rollout.sampling.temperature, its log-probs too")
        temperature = sampling.temperature
    elif temperature is None:
        temperature = cfg.eval.temperature
    params = SamplingParams(
        temperature=temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        max_new_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop),
    )
    rollout = RolloutConfig(
        # Evaluation: num_episodes per seating; groups cycle through the seatings.
        num_groups=(
            cfg.eval.num_episodes * seatings if evaluation else cfg.rollout.num_groups
        ),
        group_size=1 if evaluation else cfg.rollout.group_size,
        shared_deals=cfg.rollout.shared_deals,
        max_turns=cfg.rollout.max_turns,
        max_prompt_tokens=cfg.rollout.max_prompt_tokens,
        constrained_decoding=cfg.rollout.constrained_decoding,
        enable_thinking=cfg.model.enable_thinking,
        continuous=cfg.rollout.continuous,
        critic_view=cfg.critic.input == "global" and not evaluation,
    )
    return params, rollout
