"""Atomic checkpoints of a run: per-agent PEFT adapter folders plus the trainer's state.

Layout::

    <output_dir>/checkpoints/
        step_00000100/
            agents/<agent_name>/   standard PEFT adapter folders (written by the caller)
            trainer_state.pt       torch.save of a dict: optimizers, schedulers, RNG, step, ...
                                   (tensors and plain containers: loads with weights_only=True)
            meta.json              step, time, roll version, every file with size and sha256
        .tmp-...                   a save in progress (or left by a crash; removed next save)

A checkpoint is written into a ``.tmp`` folder, every file is fsynced, then the folder is renamed
into place (atomic on POSIX) and the parent folder fsynced. A checkpoint is *complete* when its
meta.json parses and every file it lists exists with the listed size; ``latest_checkpoint``
considers complete checkpoints only, and ``load_trainer_state`` also checks every sha256.

One process (rank 0) saves; concurrent saves into the same output_dir are not supported.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import re
import shutil
import time
import uuid
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

import roll

CHECKPOINTS_DIR = "checkpoints"
AGENTS_DIR = "agents"
CRITICS_DIR = "critics"
TRAINER_STATE_FILE = "trainer_state.pt"
META_FILE = "meta.json"
TMP_PREFIX = ".tmp"
META_FORMAT = 1
_STEP_DIR = re.compile(r"^step_(\d+)$")
_HASH_CHUNK = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint folder is incomplete or its files do not match meta.json."""


def step_dir_name(step: int) -> str:
    """``step_00000100`` for step 100."""
    return f"step_{step:08d}"


def checkpoints_root(output_dir: str | os.PathLike[str]) -> Path:
    """``<output_dir>/checkpoints``."""
    return Path(output_dir) / CHECKPOINTS_DIR


def agent_dir(ckpt_path: str | os.PathLike[str], agent_name: str) -> Path:
    """The PEFT adapter folder of one agent inside a checkpoint."""
    return Path(ckpt_path) / AGENTS_DIR / agent_name


def critic_dir(ckpt_path: str | os.PathLike[str], critic_name: str) -> Path:
    """The folder of one critic inside a checkpoint (PEFT adapter + value head)."""
    return Path(ckpt_path) / CRITICS_DIR / critic_name


# ---------------------------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------------------------


def save_checkpoint(
    output_dir: str | os.PathLike[str],
    step: int,
    trainer_state: dict[str, Any],
    save_agents: Callable[[Path], None],
    keep_last: int,
) -> Path:
    """Write ``<output_dir>/checkpoints/step_<step:08d>/`` atomically and return its path.

    ``save_agents(folder)`` must write one PEFT adapter folder per agent under ``folder``
    (``folder/<agent_name>/``). ``trainer_state`` is saved with ``torch.save``. Afterwards the
    oldest complete checkpoints beyond ``keep_last`` are deleted; the one just written is always
    kept. An existing checkpoint of the same step is replaced: it is renamed away, the new one
    renamed in, then the old one deleted (a crash between those two renames loses that step's
    checkpoint, but never leaves a half-written folder under a step name).
    """
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"step={step!r}: must be an integer >= 0")
    if not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 1:
        raise ValueError(f"keep_last={keep_last!r}: must be an integer >= 1")
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        root.mkdir(parents=True)
        _fsync_dir(root.parent)
    _remove_stale_tmp(root)

    tmp = root / f"{TMP_PREFIX}-{step_dir_name(step)}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_contents(tmp, step, trainer_state, save_agents)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # best effort; the next save removes leftovers
        raise

    final = root / step_dir_name(step)
    replaced = None
    if final.exists():
        replaced = root / f"{TMP_PREFIX}-replaced-{final.name}-{uuid.uuid4().hex[:8]}"
        os.rename(final, replaced)
    os.rename(tmp, final)
    _fsync_dir(root)
    if replaced is not None:
        shutil.rmtree(replaced)
    _prune(root, keep=final, keep_last=keep_last)
    return final


def _write_contents(
    folder: Path, step: int, trainer_state: dict[str, Any], save_agents: Callable[[Path], None]
) -> None:
    """Fill a fresh folder: agents/, trainer_state.pt, then meta.json (all fsynced)."""
    agents = folder / AGENTS_DIR
    agents.mkdir()
    save_agents(agents)
    torch.save(trainer_state, folder / TRAINER_STATE_FILE)
    files = [_describe_and_fsync(folder, path) for path in _files_under(folder)]
    meta = {
        "format": META_FORMAT,
        "step": step,
        "time": time.time(),
        "time_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "roll_version": roll.__version__,
        "files": files,
    }
    meta_path = folder / META_FILE
    with meta_path.open("w", encoding="utf-8") as handle:
        json.dump(meta, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    for sub in sorted([p for p in folder.rglob("*") if p.is_dir()], reverse=True) + [folder]:
        _fsync_dir(sub)


def _files_under(folder: Path) -> list[Path]:
    """Every regular file under ``folder`` except meta.json, in a stable order."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / META_FILE)


def _describe_and_fsync(folder: Path, path: Path) -> dict[str, Any]:
    """fsync one file and return its meta.json entry: relative path, size, sha256."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
        os.fsync(handle.fileno())
    return {
        "path": path.relative_to(folder).as_posix(),
        "size": path.stat().st_size,
        "sha256": digest.hexdigest(),
    }


def _fsync_dir(path: Path) -> None:
    """Persist a folder's entries (new names, renames) on POSIX."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_stale_tmp(root: Path) -> None:
    """Delete ``.tmp*`` leftovers of crashed saves (only one process saves at a time)."""
    for entry in root.iterdir():
        if not entry.name.startswith(TMP_PREFIX):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _prune(root: Path, keep: Path, keep_last: int) -> None:
    """Delete the oldest complete checkpoints so ``keep_last`` remain, ``keep`` among them."""
    others = [path for _, path in _complete_checkpoints(root, warn=False) if path != keep]
    for path in others[: max(0, len(others) - (keep_last - 1))]:
        shutil.rmtree(path)
    _fsync_dir(root)


# ---------------------------------------------------------------------------------------------
# Finding and verifying
# ---------------------------------------------------------------------------------------------


def read_meta(ckpt_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed meta.json of a checkpoint; CheckpointError if missing or malformed."""
    meta_path = Path(ckpt_path) / META_FILE
    if not meta_path.is_file():
        raise CheckpointError(f"{ckpt_path}: no {META_FILE} (incomplete or not a checkpoint)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{meta_path}: unreadable ({error})") from error
    if not isinstance(meta, dict) or not isinstance(meta.get("step"), int):
        raise CheckpointError(f"{meta_path}: has no integer 'step'")
    files = meta.get("files")
    entry_keys = {"path", "size", "sha256"}
    if not isinstance(files, list) or not all(
        isinstance(f, dict) and entry_keys <= f.keys() for f in files
    ):
        raise CheckpointError(f"{meta_path}: 'files' must list {{path, size, sha256}} entries")
    return meta


def verify_checkpoint(ckpt_path: str | os.PathLike[str], deep: bool = False) -> dict[str, Any]:
    """Check a checkpoint against its meta.json and return the meta.

    Shallow (default): meta.json is valid and every listed file exists with the listed size,
    including trainer_state.pt. ``deep=True`` also recomputes every sha256. Raises
    CheckpointError naming the first file that does not match.
    """
    folder = Path(ckpt_path)
    meta = read_meta(folder)
    name_match = _STEP_DIR.match(folder.name)
    if name_match is not None and int(name_match.group(1)) != meta["step"]:
        raise CheckpointError(f"{folder}: {META_FILE} says step {meta['step']}")
    listed = {entry["path"] for entry in meta["files"]}
    if TRAINER_STATE_FILE not in listed:
        raise CheckpointError(f"{folder}: {META_FILE} does not list {TRAINER_STATE_FILE}")
    for entry in meta["files"]:
        path = folder / entry["path"]
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in {META_FILE} but missing")
        size = path.stat().st_size
        if size != entry["size"]:
            raise CheckpointError(
                f"{path}: size {size} bytes, {META_FILE} says {entry['size']} (truncated?)"
            )
        if deep and _sha256(path) != entry["sha256"]:
            raise CheckpointError(
                f"{path}: sha256 does not match {META_FILE} (file corrupted or changed after "
                "the checkpoint was written)"
            )
    return meta


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _complete_checkpoints(root: Path, warn: bool) -> list[tuple[int, Path]]:
    """(step, path) of the complete ``step_*`` folders under ``root``, by step ascending.

    Incomplete ones are skipped (with a warning when ``warn``), never deleted: they are
    evidence of what went wrong.
    """
    found: list[tuple[int, Path]] = []
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match is None or not entry.is_dir():
            continue
        try:
            verify_checkpoint(entry)
        except CheckpointError as error:
            if warn:
                warnings.warn(f"skipping incomplete checkpoint: {error}", stacklevel=3)
            continue
        found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_checkpoint(output_dir: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step under ``<output_dir>/checkpoints``, or None.

    ``.tmp*`` folders are ignored; incomplete ``step_*`` folders are skipped with a warning.
    """
    found = _complete_checkpoints(checkpoints_root(output_dir), warn=True)
    return found[-1][1] if found else None


def resolve_resume(
    resume: str | os.PathLike[str] | None, output_dir: str | os.PathLike[str]
) -> Path | None:
    """Turn the ``resume`` setting into a checkpoint folder, or None to start fresh.

    None -> None; ``"latest"`` -> ``latest_checkpoint(output_dir)`` (None when there is none
    yet, so a restarted job resumes if it can); anything else is a path that must be a complete
    checkpoint folder, else ValueError naming ``resume``.
    """
    if resume is None:
        return None
    if str(resume) == "latest":
        return latest_checkpoint(output_dir)
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"config error: resume={str(resume)!r}: no such folder (give a "
            f"{CHECKPOINTS_DIR}/step_XXXXXXXX folder, 'latest', or null)"
        )
    try:
        verify_checkpoint(path)
    except CheckpointError as error:
        raise ValueError(
            f"config error: resume={str(resume)!r}: not a complete checkpoint: {error}"
        ) from error
    return path


def load_trainer_state(ckpt_path: str | os.PathLike[str]) -> dict[str, Any]:
    """Verify every file of the checkpoint against meta.json (sizes and sha256), then load
    trainer_state.pt. Raises CheckpointError naming the file that does not match."""
    folder = Path(ckpt_path)
    verify_checkpoint(folder, deep=True)
    # weights_only=True: tensors and plain Python containers only, so a crafted file cannot run
    # code (the sha256 in meta.json detects a corrupted or cut file, not a forged one: whoever
    # can write the file can write meta.json). numpy's array reconstruction is allowed for
    # checkpoints of before 2026-11-26, which held numpy's RNG state as an array.
    file = folder / TRAINER_STATE_FILE
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAYS):
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        lines = str(error).strip().splitlines() or [""]
        reason = next((line.strip() for line in lines if "Unsupported" in line), lines[-1])
        raise CheckpointError(f"{file}: holds objects other than tensors and plain containers; "
                              f"refused, as loading it could run code ({reason})") from error


_NUMPY_ARRAYS = [getattr(np, "_core", getattr(np, "core", None)).multiarray._reconstruct,
                 np.ndarray, np.dtype, type(np.dtype(np.uint32))]


# ---------------------------------------------------------------------------------------------
# RNG state
# ---------------------------------------------------------------------------------------------


def capture_rng_state() -> dict[str, Any]:
    """State of every global RNG: python ``random``, numpy, torch CPU, torch CUDA (if any)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def _numpy_state() -> tuple:
    """numpy's global RNG state with its key array as a tensor (loads with weights_only)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return (kind, torch.from_numpy(keys.astype(np.int64)), int(position), int(has_gauss),
            float(cached))


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back a ``capture_rng_state`` dict, so the following random draws repeat."""
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    cuda_states = state.get("torch_cuda")
    if cuda_states is None:
        return
    if not torch.cuda.is_available():
        warnings.warn(
            "checkpoint holds CUDA RNG states but CUDA is not available; not restored",
            stacklevel=2,
        )
        return
    devices = torch.cuda.device_count()
    if len(cuda_states) != devices:
        warnings.warn(
            f"checkpoint holds CUDA RNG states of {len(cuda_states)} devices, this process sees "
            f"{devices}; restoring the first {min(devices, len(cuda_states))}",
            stacklevel=2,
        )
    for index, cuda_state in enumerate(cuda_states[:devices]):
        torch.cuda.set_rng_state(cuda_state, device=index)
