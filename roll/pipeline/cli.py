"""Command line: YAML (Hydra compose) + our flags + Hydra overrides → a validated PipelineConfig.

    python examples/start_multi_agent_pipeline.py --config_path examples/tictactoe \
        --config_name multi_agent_tictactoe --num_agents 2 --lora_rank 32 max_steps=200

The YAML is merged onto the dataclass schema (unknown keys and wrong types fail there), then
each override, parsed with Hydra's own grammar, is applied in struct mode (an override naming a
key the schema lacks fails). Every failure ends the program with one line naming the key and
exit code 2 before any model loads or anything is written.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from roll.errors import ConfigError, NonFiniteLossError, RoleFailed, RunInterrupted
from roll.pipeline.config import PipelineConfig
from roll.pipeline.validation import validate_config
from roll.utils.run_lock import RunLock

# Short flags users know from launch scripts, and the config key each one sets.
FLAG_KEYS = {
    "num_agents": "team.num_agents",
    "lora_rank": "team.lora.rank",
    "lora_alpha": "team.lora.alpha",
}


FREE_FORM = ("env.params", "env.role_to_agent", "env.data.fields")
"""Config mappings with user-chosen keys: an override may add a key."""
REPLACED = ("env.role_to_agent", "env.data.fields")
"""Mappings that an override given whole replaces (a role map is meant as a whole); others
merge into the YAML's (``env.params={players: 3}`` keeps the other game parameters)."""


class CLIError(Exception):
    """A problem with the command line or the config, reported as one line."""


def parse_args(argv: list[str], description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config_path", required=True, help="folder holding the YAML")
    parser.add_argument("--config_name", required=True, help="YAML file name without .yaml")
    parser.add_argument("--num_agents", type=int, help="sets team.num_agents")
    parser.add_argument("--lora_rank", type=int, help="sets team.lora.rank (default of agents)")
    parser.add_argument("--lora_alpha", type=float, help="sets team.lora.alpha")
    parser.add_argument("--validate_only", action="store_true",
                        help="check the config, print it, and exit without loading a model")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. max_steps=200")
    return parser.parse_args(argv)


def _one_line(error: Exception) -> str:
    """OmegaConf/Hydra errors span lines; keep the message and the key."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    message = lines[0] if lines else type(error).__name__
    key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")),
               None)
    return f"{message} (key: {key})" if key and key not in message else message


def load_config(
    config_path: str, config_name: str, overrides: list[str], check_paths: bool = True
) -> PipelineConfig:
    """Compose, merge onto the schema, apply overrides, validate. Raises CLIError."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    folder = Path(config_path).resolve()
    if not (folder / f"{config_name}.yaml").is_file():
        raise CLIError(f"config error: --config_name={config_name!r}: no {config_name}.yaml in "
                       f"{folder}")
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as error:  # Hydra raises OverrideParseException with a multi-line text
        raise CLIError(f"config error: bad override syntax: {_one_line(error)}") from None
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(folder), version_base=None):
            raw = compose(config_name=config_name)
        merged = OmegaConf.merge(OmegaConf.structured(PipelineConfig), raw)
        OmegaConf.set_struct(merged, True)
        for override in parsed:
            key = override.key_or_group
            if override.is_delete() or override.is_add() or override.is_force_add():
                raise CLIError(f"config error: override {override.input_line!r}: only plain "
                               "key=value overrides of schema keys are supported")
            # Mappings whose keys the user chooses (game/task parameters, roles, dataset
            # fields) take new keys; every other key is schema.
            mapping = key in FREE_FORM or key.startswith(
                tuple(f"{prefix}." for prefix in FREE_FORM))
            OmegaConf.update(merged, key, override.value(), merge=key not in REPLACED,
                             force_add=mapping)
        # Composed configs that check themselves when built (AdvantageConfig, ActionConfig)
        # raise ConfigError here, naming the key.
        cfg = OmegaConf.to_object(merged)
    except CLIError:
        raise
    except ConfigError as error:
        raise CLIError(str(error)) from None
    except OmegaConfBaseException as error:
        raise CLIError(f"config error: {_one_line(error)}") from None
    except Exception as error:  # Hydra compose errors (YAML syntax, missing defaults)
        raise CLIError(f"config error: {_one_line(error)}") from None
    finally:
        GlobalHydra.instance().clear()
    try:
        return validate_config(cfg, check_paths=check_paths)
    except ValueError as error:
        line = _one_line(error)
        raise CLIError(
            line if line.startswith("config error") else f"config error: {line}"
        ) from None


def run_cli(main, argv: list[str] | None, description: str) -> int:
    """Parse, then ``main(cfg)``; config problems print one line and return 2.

    The flags become overrides ahead of the user's own, so an explicit override wins.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv, description)
    flags = [f"{key}={getattr(args, flag)}" for flag, key in FLAG_KEYS.items()
             if getattr(args, flag) is not None]
    try:
        cfg = load_config(args.config_path, args.config_name, flags + list(args.overrides))
    except CLIError as error:
        print(str(error), file=sys.stderr)
        return 2
    if args.validate_only:
        from dataclasses import asdict

        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.create(asdict(cfg))), end="")
        return 0
    previous = _sigterm_interrupts()
    try:
        with RunLock(cfg.output_dir):  # one run per output_dir, taken before the model loads
            try:
                main(cfg)
            except (RoleFailed, NonFiniteLossError) as error:  # a role died, an adapter diverged
                # One line (it names the role or adapter and the last good checkpoint); the
                # traceback goes to a file in the folder, written while the lock is held.
                kept = _keep_traceback(cfg.output_dir, error)
                print(f"{error} (traceback: {kept})", file=sys.stderr)
                return FAILED
    except ConfigError as error:  # found once the cluster is up (e.g. too few GPUs in Ray)
        print(str(error), file=sys.stderr)
        return 2
    except RunInterrupted as error:  # the pipeline names the step and the last checkpoint
        print(str(error), file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:  # before the training loop (loading, building the roles)
        print("interrupted before the training loop started: this run saved nothing",
              file=sys.stderr)
        return INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0


INTERRUPTED = 128 + signal.SIGINT
"""The exit code of a run stopped by Ctrl-C or SIGTERM, as a shell reports Ctrl-C."""
FAILED = 1
"""The exit code of a run stopped by a failed role or a diverged adapter."""
ERROR_LOG = "errors.log"
"""The file in output_dir that keeps the traceback of each failure the terminal saw as one line."""


def _keep_traceback(output_dir: str, error: BaseException) -> str:
    """Append ``error``'s whole traceback (its causes included: a role's own exception) to
    output_dir/errors.log under a timestamp; earlier runs' entries stay. Returns where it went
    (or why it could not: the one line still names the failure)."""
    path = Path(output_dir).expanduser() / ERROR_LOG
    text = "".join(traceback.format_exception(error))
    try:
        with path.open("a", encoding="utf-8") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}\n{text}")
    except OSError as failed:
        return f"not kept, {path}: {failed.strerror or failed}"
    return str(path)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _sigterm_interrupts():
    """SIGTERM (what a cluster scheduler sends before it kills a job) stops the run as Ctrl-C
    does: roles closed, the tracker's files flushed, one line naming the last checkpoint.
    Python's default would end the process at once. The handler it replaces, or None where
    signals cannot be set (not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)
