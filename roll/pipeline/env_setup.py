"""What the run plays, from ``cfg.env``: an OpenSpiel game or a team task (``env.task``).

``build_env_setup`` is the one place that turns the env config into seats, env factories,
renderers and (for tasks) datasets. Validation calls it before any model loads, so a bad game,
task parameter, dataset path or field is one ConfigError naming the key; the pipeline calls it
again to build the rollouts. ``run_seatings`` turns ``env.seat_to_agent`` /
``env.role_to_agent`` and ``eval.*`` into who sits where, for training and evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from roll.errors import ConfigError
from roll.pipeline.config import PipelineConfig

if TYPE_CHECKING:
    from roll.agentic.env.seating import Seating


@dataclass
class EnvSetup:
    """Everything the rollouts need to know about the game or task."""

    name: str
    num_seats: int
    cooperative: bool
    """Every seat gets the same return (team/score instead of win rates)."""
    train_factory: Callable[[], Any]
    eval_factory: Callable[[], Any]
    render: Callable[[Any, int], Any]
    roles: tuple[str, ...] = ()
    """Team tasks: the role of each seat; () for games."""
    summarize: Callable[[list[dict[str, float]]], dict[str, float]] | None = None
    """Team tasks: episode metrics → ``task/...`` metrics."""
    train_items: int = 0
    """Team tasks: items in the training split (0 for games)."""
    eval_items: int = 0
    """Team tasks: items in the evaluation split."""

    @property
    def is_task(self) -> bool:
        return bool(self.roles)


_LAST: tuple[str, EnvSetup] | None = None
"""The last setup built, by its env config: validation and the pipeline then read a task's
dataset (and check its gold answers) once per run, not twice. (A dataset file edited between
two runs of one process with the same config is not read again.)"""


def build_env_setup(cfg: PipelineConfig) -> EnvSetup:
    """The game of ``env.game`` or the task of ``env.task`` (ConfigError on bad settings)."""
    global _LAST
    key = repr(cfg.env)
    if _LAST is not None and _LAST[0] == key:
        return _LAST[1]
    setup = _task_setup(cfg) if cfg.env.task else _game_setup(cfg)
    _LAST = (key, setup)
    return setup


def _game_setup(cfg: PipelineConfig) -> EnvSetup:
    import pyspiel

    from roll.agentic.env.openspiel_env import OpenSpielEnv, load_game
    from roll.agentic.env.renderers import renderer_named

    game, params = cfg.env.game, dict(cfg.env.params)
    try:
        render = renderer_named(cfg.env.renderer, game)
    except KeyError as error:
        raise ConfigError("env.renderer", cfg.env.renderer, str(error)) from None
    try:
        loaded = load_game(game, params)
    except ValueError as error:
        message = str(error).replace("game_params.", "env.params.")
        field_path = "env.params" if "env.params" in message else "env.game"
        raise ConfigError(field_path, game if field_path == "env.game" else params,
                          message) from None
    cooperative = loaded.get_type().utility == pyspiel.GameType.Utility.IDENTICAL

    def factory() -> OpenSpielEnv:
        return OpenSpielEnv(game, params)

    return EnvSetup(game, loaded.num_players(), cooperative, factory, factory, render)


def _task_setup(cfg: PipelineConfig) -> EnvSetup:
    from roll.agentic.tasks.datasets import load_items
    from roll.agentic.tasks.registry import render_task, task_factory, task_spec

    env, data = cfg.env, cfg.env.data
    spec = task_spec(env.task)  # ConfigError naming env.task
    if env.renderer:
        raise ConfigError("env.renderer", env.renderer,
                          f"games only: the task {env.task!r} renders its own prompts")
    if data.builtin_size < 1:
        raise ConfigError("env.data.builtin_size", data.builtin_size, "must be >= 1")
    splits, factories = {}, {}
    for key, split in (("train_split", data.train_split), ("eval_split", data.eval_split)):
        try:
            splits[key] = load_items(data.source, split, dict(data.fields),
                                     spec.required_fields, data.builtin_size)
            factories[key] = task_factory(env.task, dict(env.params), splits[key])
        except ValueError as error:
            raise _config_error(cfg, error, f"env.data.{key}") from None
    prototype = factories["train_split"]()
    return EnvSetup(env.task, prototype.num_seats, prototype.cooperative,
                    factories["train_split"], factories["eval_split"], render_task,
                    tuple(prototype.roles), prototype.summarize,
                    len(splits["train_split"]), len(splits["eval_split"]))


def _config_error(cfg: PipelineConfig, error: ValueError, default: str) -> ConfigError:
    """``error`` itself when it is a ConfigError (the tasks name their keys), else a
    ConfigError on the key its message starts with (``env.x=1: ...``) or on ``default``."""
    if isinstance(error, ConfigError):
        return error
    message = str(error)
    head, _, rest = message.partition(": ")
    key = head.split("=", 1)[0].strip()
    if key.startswith("env.") and " " not in key and rest:
        return ConfigError(key, _value(cfg, key), rest)
    return ConfigError(default, _value(cfg, default), message)


def _value(cfg: PipelineConfig, field_path: str) -> Any:
    value: Any = cfg
    for part in field_path.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
    return value


def task_seat_to_agent(cfg: PipelineConfig, roles: tuple[str, ...],
                       agents: list[str]) -> list[Any]:
    """``env.role_to_agent`` as a seat list (seat i = roles[i]). Empty: role i → agent i, or
    every role → the one agent when the team has one (parameter sharing)."""
    mapping = dict(cfg.env.role_to_agent)
    if not mapping:
        if len(agents) == 1:
            return [agents[0]] * len(roles)
        return []  # seat i → agent i (seatings_of checks the counts)
    for role in mapping:
        if role not in roles:
            raise ConfigError(f"env.role_to_agent.{role}", mapping[role],
                              f"{cfg.env.task} has no role {role!r}; its roles are "
                              f"{list(roles)}")
    missing = [role for role in roles if role not in mapping]
    if missing:
        raise ConfigError("env.role_to_agent", mapping,
                          f"roles {missing} have no agent; {cfg.env.task} has roles "
                          f"{list(roles)}")
    return [mapping[role] for role in roles]


def run_seatings(cfg: PipelineConfig, setup: EnvSetup, agents: list[str]
                 ) -> tuple[list[Seating], list[Seating]]:
    """The training and evaluation seatings of the run. Team tasks: ``env.role_to_agent``
    for both (every role is an agent; eval.seat_to_agent may still override evaluation)."""
    if setup.is_task:
        if cfg.env.seat_to_agent:
            raise ConfigError("env.seat_to_agent", list(cfg.env.seat_to_agent),
                              f"is for games; team task {cfg.env.task} maps roles with "
                              "env.role_to_agent")
        raw = _shared(cfg, task_seat_to_agent(cfg, setup.roles, agents))
        train = seatings_of(raw, setup.num_seats, agents, "env.role_to_agent")
        if cfg.eval.seat_to_agent:
            return train, eval_seatings(cfg, train, setup.num_seats, agents)
        return train, train
    raw = _shared(cfg, list(cfg.env.seat_to_agent))
    if not raw and cfg.team.shared_adapter:
        raw = [agents[0]] * setup.num_seats
    train = seatings_of(raw, setup.num_seats, agents, "env.seat_to_agent")
    return train, eval_seatings(cfg, train, setup.num_seats, agents)


def _shared(cfg: PipelineConfig, raw: list[Any]) -> list[Any]:
    """Under team.shared_adapter every configured agent's name in a seat list (flat or nested)
    stands for the one shared agent."""
    if not cfg.team.shared_adapter:
        return raw
    declared, shared = set(cfg.team.declared_agent_names), cfg.team.agent_names[0]
    return [_shared(cfg, list(item)) if isinstance(item, list | tuple)
            else (shared if item in declared else item) for item in raw]


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
    eval.opponent in every other seat. Each one seats a trained agent."""
    if cfg.eval.seat_to_agent:
        seatings = seatings_of(cfg.eval.seat_to_agent, num_seats, agents, "eval.seat_to_agent")
        for i, seating in enumerate(seatings):
            if not any(spec.is_trained for spec in seating.seats):
                raise ConfigError("eval.seat_to_agent", list(cfg.eval.seat_to_agent),
                                  f"seating {i} has no trained agent: nothing to evaluate")
        return seatings
    if cfg.eval.opponent in agents:
        raise ConfigError("eval.opponent", cfg.eval.opponent,
                          "is a trained agent; the opponent must be fixed ('random', "
                          "'mcts[:N]', 'cfr[:N]', 'snapshot:<agent>@<step|latest>'); seat agents "
                          "against "
                          "each other with eval.seat_to_agent")
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


def check_first_prompts(cfg: PipelineConfig, setup: EnvSetup, seatings: list[Seating],
                        tokenizer: Any, env_factory: Callable[[], Any] | None = None,
                        render: Callable[[Any, int], Any] | None = None) -> None:
    """ConfigError naming ``rollout.max_prompt_tokens`` when the first LLM prompt of an
    episode (one per training seating, seed ``cfg.seed``, a task's first item), chat-formatted
    as the rollout formats it, is already longer: every episode would be cut at its first
    turn; and one naming ``rollout.sampling.max_new_tokens`` when, with constrained answers, a
    legal move's answer at that turn takes more tokens (the scheduler checks later turns as
    they come). Needs the tokenizer only, so it runs before the model loads."""
    from roll.agentic.env.actions import budgeted_answer_ids
    from roll.agentic.rollout.episode import EpisodeSetup, EpisodeSpec, LocalEpisodes
    from roll.models.loading import prompt_ids

    episode_setup = EpisodeSetup(env_factory or setup.train_factory, render or setup.render,
                                 cfg.env.action, cfg.rollout.max_turns)
    item = 0 if setup.is_task else None
    specs = [EpisodeSpec(0, cfg.seed, seating, cfg.seed, item) for seating in seatings]
    for ask, seating in zip(LocalEpisodes().open(episode_setup, specs), seatings, strict=True):
        if ask is None:
            continue
        tokens = len(prompt_ids(tokenizer, ask.prompt.text,
                                enable_thinking=cfg.model.enable_thinking))
        if tokens > cfg.rollout.max_prompt_tokens:
            seats = [seat.raw for seat in seating.seats]
            raise ConfigError("rollout.max_prompt_tokens", cfg.rollout.max_prompt_tokens,
                              f"the first prompt of an episode ({setup.name}, seating {seats}) "
                              f"is already {tokens} tokens: every episode would end there; "
                              "raise it")
        if cfg.rollout.constrained_decoding and ask.legal:
            budgeted_answer_ids(tokenizer, ask.legal, cfg.rollout.sampling.max_new_tokens,
                                ask.env_name)
