"""Checks of where the roles run (cluster.*, actor_train.*, actor_infer.*, env_workers.*):
values and combinations before anything starts, resources once Ray is up, and the GPU
defaults per role. Part of ``validate_config`` (validation.py); no model loads here."""

from __future__ import annotations

import importlib.util

from roll.distributed.deepspeed_strategy import ZERO3_GATHERS, ZERO_STAGES
from roll.errors import ConfigError, require_int
from roll.pipeline.config import PipelineConfig


def check_cluster(cfg: PipelineConfig) -> None:
    """cluster.*, actor_train.*, actor_infer.* and env_workers.*: values and how they combine
    (before Ray starts; ``check_ray_resources`` once it is up)."""
    cluster, train = cfg.cluster, cfg.actor_train
    if cluster.backend not in ("local", "ray"):
        raise ConfigError("cluster.backend", cluster.backend, "must be 'local' or 'ray'")
    if cluster.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("cluster.backend", "ray", "ray is not installed (pip install "
                          "'roll[ray]')")
    require_int("actor_train.world_size", train.world_size)
    if train.world_size > 1 and cluster.backend != "ray":
        raise ConfigError("actor_train.world_size", train.world_size,
                          "more than one rank needs cluster.backend=ray")
    if train.strategy not in ("torch", "deepspeed"):
        raise ConfigError("actor_train.strategy", train.strategy, "must be 'torch' or "
                          "'deepspeed'")
    if train.strategy == "deepspeed":
        if cluster.backend != "ray":
            raise ConfigError("actor_train.strategy", "deepspeed", "runs in Ray train ranks: "
                              "set cluster.backend=ray")
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("actor_train.strategy", "deepspeed", "deepspeed is not installed "
                              "(pip install 'roll[deepspeed]')")
        if train.zero_stage not in ZERO_STAGES:
            raise ConfigError("actor_train.zero_stage", train.zero_stage, "must be 2 or 3")
        if train.zero_stage == 3 and cfg.trainer.share_prefix is True:
            raise ConfigError("trainer.share_prefix", True, "cannot run under "
                              "actor_train.zero_stage=3 (a layer's partitions are released "
                              "after each forward, before the backward through both): set "
                              "it to false or null")
        for agent in cfg.team.resolved_agents():
            if agent.optim.name != "adamw":
                raise ConfigError("team.optim.name", agent.optim.name,
                                  f"(agent {agent.name!r}): actor_train.strategy=deepspeed "
                                  "steps the adapters with its AdamW only")
    if train.zero3_gather not in ZERO3_GATHERS:
        raise ConfigError("actor_train.zero3_gather", train.zero3_gather,
                          f"must be one of {list(ZERO3_GATHERS)}")
    require_int("actor_train.zero3_persist_elements", train.zero3_persist_elements, 0)
    if train.zero3_live_elements is not None:
        if train.strategy != "deepspeed" or train.zero_stage != 3:
            raise ConfigError("actor_train.zero3_live_elements", train.zero3_live_elements,
                              "needs actor_train.strategy=deepspeed and zero_stage=3")
        require_int("actor_train.zero3_live_elements", train.zero3_live_elements, 1)
    if not train.cpus_per_rank > 0:
        raise ConfigError("actor_train.cpus_per_rank", train.cpus_per_rank, "must be > 0")
    if train.gpus_per_rank is not None and train.gpus_per_rank < 0:
        raise ConfigError("actor_train.gpus_per_rank", train.gpus_per_rank, "must be >= 0")
    if cluster.num_cpus is not None:
        require_int("cluster.num_cpus", cluster.num_cpus)
    infer = cfg.actor_infer
    require_int("actor_infer.num_engines", infer.num_engines, 0)
    if infer.num_engines and cluster.backend != "ray":
        raise ConfigError("actor_infer.num_engines", infer.num_engines,
                          "engines as actors need cluster.backend=ray")
    if not infer.cpus_per_engine > 0:
        raise ConfigError("actor_infer.cpus_per_engine", infer.cpus_per_engine, "must be > 0")
    if infer.gpus_per_engine is not None and infer.gpus_per_engine < 0:
        raise ConfigError("actor_infer.gpus_per_engine", infer.gpus_per_engine, "must be >= 0")
    if infer.colocate:
        if cluster.backend != "ray":
            raise ConfigError("actor_infer.colocate", True, "places Ray actors: set "
                              "cluster.backend=ray")
        if infer.num_engines != train.world_size:
            raise ConfigError("actor_infer.num_engines", infer.num_engines,
                              f"actor_infer.colocate puts one engine beside each train rank: "
                              f"set it to actor_train.world_size={train.world_size}")
        gpus = train_gpus_per_rank(cfg) + infer_gpus_per_engine(cfg)
        if gpus > 1:
            raise ConfigError("actor_infer.gpus_per_engine", infer_gpus_per_engine(cfg),
                              f"a colocated rank and engine share one GPU, but with "
                              f"actor_train.gpus_per_rank={train_gpus_per_rank(cfg):g} they "
                              f"ask for {gpus:g}")
    if cfg.rollout.overlap:
        _check_overlap(cfg)
    workers = cfg.env_workers
    require_int("env_workers.num_workers", workers.num_workers, 0)
    if workers.num_workers and cluster.backend != "ray":
        raise ConfigError("env_workers.num_workers", workers.num_workers,
                          "env workers are Ray actors: set cluster.backend=ray")
    if not workers.cpus_per_worker > 0:
        raise ConfigError("env_workers.cpus_per_worker", workers.cpus_per_worker, "must be > 0")


def _check_overlap(cfg: PipelineConfig) -> None:
    """rollout.overlap plays a rollout in a thread while this process drives the update: the
    engines must be actors of their own (an engine in this process shares its adapter tensors
    and its GPU stream with the update) and stay awake through the update."""
    if not cfg.actor_infer.num_engines:
        raise ConfigError("rollout.overlap", True, "plays the next rollout while the ranks "
                          "train, on engine actors: set cluster.backend=ray and "
                          "actor_infer.num_engines >= 1")
    if cfg.rollout.vllm.sleep_between_phases:
        raise ConfigError("rollout.vllm.sleep_between_phases", True, "rollout.overlap keeps "
                          "the engines rolling out while the ranks train: they cannot sleep")


def check_ray_resources(cfg: PipelineConfig, available: dict[str, float]) -> None:
    """More CPUs or GPUs asked for the trainer's ranks, the inference engines and the env
    workers than the Ray cluster has: one line (called once Ray is up, before any model
    loads)."""
    train, infer, workers = cfg.actor_train, cfg.actor_infer, cfg.env_workers
    infer_gpus = infer_gpus_per_engine(cfg)
    for kind, per_rank, per_engine, per_worker, key in (
            ("CPU", train.cpus_per_rank, infer.cpus_per_engine, workers.cpus_per_worker,
             "actor_train.cpus_per_rank"),
            ("GPU", train_gpus_per_rank(cfg), infer_gpus, 0.0, "actor_train.gpus_per_rank")):
        asked = (per_rank * train.world_size + per_engine * infer.num_engines
                 + per_worker * workers.num_workers)
        if asked > available.get(kind, 0.0):
            engines = (f" and actor_infer.num_engines={infer.num_engines} engines"
                       if infer.num_engines else "")
            if workers.num_workers and kind == "CPU":
                engines += f" and env_workers.num_workers={workers.num_workers} workers"
            raise ConfigError(key, per_rank, f"actor_train.world_size={train.world_size} "
                              f"ranks{engines} ask for {asked:g} {kind}s but the Ray cluster "
                              f"has {available.get(kind, 0.0):g}")


def train_gpus_per_rank(cfg: PipelineConfig) -> float:
    """actor_train.gpus_per_rank, defaulting to 1 on CUDA (0.5 colocated) and 0 on CPU."""
    return _gpus_or_default(cfg, cfg.actor_train.gpus_per_rank)


def infer_gpus_per_engine(cfg: PipelineConfig) -> float:
    """actor_infer.gpus_per_engine, defaulting to 1 on CUDA (0.5 colocated) and 0 on CPU."""
    return _gpus_or_default(cfg, cfg.actor_infer.gpus_per_engine)


def _gpus_or_default(cfg: PipelineConfig, gpus: float | None) -> float:
    if gpus is not None:
        return gpus
    if not cfg.model.device.startswith("cuda"):
        return 0.0
    return 0.5 if cfg.actor_infer.colocate else 1.0


def compile_blocker(cfg: PipelineConfig) -> str | None:
    """Why this run cannot compile the trainer's forwards (roll/multi_agent/compiled.py), or
    None: validation refuses ``trainer.compile=true`` with it, and the default (None) resolves
    to off on it (builders.trainer_compile)."""
    if cfg.actor_train.strategy != "torch":
        return f"runs with actor_train.strategy=torch only (got {cfg.actor_train.strategy!r})"
    for agent in cfg.team.resolved_agents():
        if agent.lora.dropout > 0:
            return (f"needs LoRA dropout 0 (agent {agent.name!r} has dropout "
                    f"{agent.lora.dropout}): each agent's dropout masks come from its own "
                    "generator, eager only")
    return None
