"""The model cache: folders built once (tiny model, converted real models), written atomically."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def cache_root() -> Path:
    """Where built models live: $ROLL_CACHE or ~/.cache/roll."""
    return Path(os.environ.get("ROLL_CACHE", Path.home() / ".cache" / "roll"))


@contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write into; on success it replaces ``path``
    in one rename, on failure it is removed — a crash never leaves a half-written folder
    that a later run would take as complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        yield staging
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``.<name>.lock`` beside ``path`` while building it: processes
    that start together (side-by-side runs on one machine) take turns, and the later ones,
    checking again under the lock, find the folder complete instead of replacing it under a
    reader (seen: one run read a tokenizer another was deleting)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
