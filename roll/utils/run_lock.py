"""One run at a time in an output folder: ``<output_dir>/.roll.lock``, held (``flock``) while
a run trains. Two runs launched into one folder (the example's default ``runs/<game>``, twice)
would interleave their metrics and prune each other's checkpoints; the second is refused with
one line naming the first. The kernel drops the lock when its process ends, however it ends, so
a killed run leaves nothing to clean up (a stale file at most, taken over by the next run); a
run that ends removes the file, and the folders it made if nothing was written there.
Re-entrant within a process (the CLI takes it before the model loads, the pipeline's ``run``
again for callers of the Python API)."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path
from typing import IO

from roll.errors import ConfigError
from roll.utils.stages import log_line

LOCK_FILE = ".roll.lock"
_held: dict[Path, tuple[IO[str] | None, int, list[Path]]] = {}
"""resolved folder -> (its locked file, how many holders in this process, the folders the first
made, deepest first)"""


class RunLock:
    """``with RunLock(output_dir):`` — ConfigError naming ``output_dir`` if another process
    holds it. Creates the folder while held (the run would)."""

    def __init__(self, output_dir: str | os.PathLike[str]) -> None:
        self.output_dir = str(output_dir)
        self.folder = Path(os.path.expanduser(self.output_dir)).resolve()

    def __enter__(self) -> RunLock:
        if self.folder in _held:
            handle, depth, made = _held[self.folder]
            _held[self.folder] = (handle, depth + 1, made)
            return self
        made = [folder for folder in (self.folder, *self.folder.parents) if not folder.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK_FILE
        while True:
            handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "a process"
                handle.close()
                raise ConfigError("output_dir", self.output_dir,
                                  f"another run is writing there ({holder}): wait for it to "
                                  "end, or choose another output_dir") from None
            except OSError as error:  # a filesystem without locks (some network mounts)
                handle.close()
                path.unlink(missing_ok=True)
                log_line(f"output_dir={self.output_dir!r}: its filesystem takes no locks "
                         f"({error.strerror or error}): a second run launched into it would "
                         "not be refused")
                _held[self.folder] = (None, 1, made)
                return self
            try:  # the holder before us removes the file as it lets go: lock the one there now
                if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            handle.close()
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        _held[self.folder] = (handle, 1, made)
        return self

    def __exit__(self, *exc) -> None:
        handle, depth, made = _held[self.folder]
        if depth > 1:
            _held[self.folder] = (handle, depth - 1, made)
            return
        del _held[self.folder]
        if handle is not None:  # None: the filesystem took no lock
            (self.folder / LOCK_FILE).unlink(missing_ok=True)  # still held: no one else's
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        for folder in made:  # a run refused before it wrote anything leaves no folder behind
            try:
                folder.rmdir()
            except OSError:  # not empty: the run wrote there
                break
