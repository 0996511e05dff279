"""What the run plays, from ``cfg.env``: an OpenSpiel game or a team task (``env.task``).

``build_env_setup`` is the one place that turns the env config into seats, env factories,
renderers and (for tasks) datasets. Validation calls it before any model loads, so a bad game,
task parameter, dataset path or field is one ConfigError naming the key; the pipeline calls it
again to build the rollouts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roll.multi_agent.config import ConfigError
from roll.pipeline.config import PipelineConfig


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
    from roll.agentic.env.renderers import render_prompt

    game, params = cfg.env.game, dict(cfg.env.params)
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

    return EnvSetup(game, loaded.num_players(), cooperative, factory, factory, render_prompt)


def _task_setup(cfg: PipelineConfig) -> EnvSetup:
    from roll.agentic.tasks.datasets import load_items
    from roll.agentic.tasks.registry import render_task, task_factory, task_spec

    env, data = cfg.env, cfg.env.data
    try:
        spec = task_spec(env.task)
    except ValueError as error:
        raise ConfigError("env.task", env.task, str(error).split(": ", 1)[1]) from None
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
    """``error`` as a ConfigError on the key its message starts with (``env.params.x=1: ...``
    or ``env.data.fields.y: ...``), else on ``default``."""
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
