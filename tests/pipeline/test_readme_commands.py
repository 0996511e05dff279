"""Every launch command the README shows (``bash examples/<task>/run_*.sh overrides...``) makes
a valid config: the script's YAML and flags plus the README's overrides pass the same
validation a launch does (paths and devices aside: the README names a hub model and CUDA)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from roll.pipeline.cli import FLAG_KEYS, load_config

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The README's ``bash examples/...`` commands, continuation lines joined, comments cut."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    return [re.sub(r"\s+#.*$", "", line.strip())
            for line in text.splitlines() if line.strip().startswith("bash examples/")]


def script_call(script: Path) -> tuple[str, str, list[str]]:
    """(config path, config name, the flags as overrides) of a run_*.sh script."""
    call = script.read_text().replace("\\\n", " ").split("start_multi_agent_pipeline.py", 1)[1]
    words = shlex.split(call.split("\n", 1)[0])
    found = dict(zip(words[::2], words[1::2], strict=False))
    flags = [f"{key}={found['--' + flag]}" for flag, key in FLAG_KEYS.items()
             if "--" + flag in found]
    return found["--config_path"], found["--config_name"], flags


def test_the_readme_shows_launch_commands():
    commands = readme_commands()
    assert len(commands) >= 10
    assert any("rollout.overlap=true" in command for command in commands)


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_makes_a_valid_config(command):
    words = shlex.split(command)
    path, name, flags = script_call(ROOT / words[1])
    overrides = [word for word in words[2:] if "=" in word]
    assert len(overrides) == len(words) - 2, command  # nothing but overrides follows
    cfg = load_config(str(ROOT / path), name, flags + overrides, check_paths=False)
    for override in overrides:
        key, value = override.split("=", 1)
        if key.startswith(("rollout.", "actor_", "cluster.")):
            node = cfg
            for part in key.split("."):
                node = getattr(node, part)
            assert str(node).lower() == value.lower(), override
