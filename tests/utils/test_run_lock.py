"""One run per output folder: a second launch into a folder a run is writing is refused in one
line naming the first; the lock goes with its process however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from roll.errors import ConfigError
from roll.pipeline.cli import run_cli
from roll.utils.run_lock import LOCK_FILE, RunLock

ROOT = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time\nfrom roll.utils.run_lock import RunLock\n"
        "with RunLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)\n")


def _holder(folder: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.slow  # another interpreter holds the lock (the quick subset < 3 min)
def test_a_second_run_into_a_busy_output_dir_is_refused_naming_the_first(tmp_path, capsys):
    out = tmp_path / "run"
    holder = _holder(out)
    started = []
    argv = ["--config_path", str(ROOT / "examples" / "kuhn_poker"), "--config_name",
            "quickstart_cpu", f"output_dir={out}"]
    try:
        assert run_cli(started.append, argv, "test") == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"config error: output_dir='{out}': another run is writing "
                              f"there (pid {holder.pid} on ")
        assert err.endswith("wait for it to end, or choose another output_dir")
        assert not started  # refused before main (the model) ran
    finally:
        holder.send_signal(signal.SIGKILL)  # the kernel releases the lock of a killed run
        holder.wait()
    assert (out / LOCK_FILE).exists()  # what a killed run leaves: a file, no lock
    seen = []
    assert run_cli(lambda cfg: seen.append((out / LOCK_FILE).read_text()), argv, "test") == 0
    assert seen[0].startswith(f"pid {os.getpid()} on ")  # taken over
    assert not (out / LOCK_FILE).exists()  # removed as the run ended


def test_a_run_refused_after_taking_the_lock_leaves_no_folder(tmp_path):
    out = tmp_path / "a" / "run"
    with pytest.raises(ConfigError):
        with RunLock(out):
            assert (out / LOCK_FILE).exists()
            raise ConfigError("cluster.address", "bogus", "found once Ray starts")
    assert not out.exists() and not out.parent.exists()  # nothing written: no folders
    with RunLock(out):
        (out / "metrics.jsonl").write_text("{}\n")
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


@pytest.mark.slow
def test_the_lock_is_reentrant_in_a_process_and_released_after(tmp_path):
    folder = tmp_path / "run"
    with RunLock(folder), RunLock(str(folder) + "/"):  # the CLI's, then the pipeline's
        with pytest.raises(subprocess.CalledProcessError):  # still held: another process fails
            subprocess.run([sys.executable, "-c", HOLD.replace("time.sleep(600)", "pass"),
                            str(folder)], cwd=ROOT, check=True, capture_output=True)
    holder = _holder(folder)  # released: another process takes it
    try:
        with pytest.raises(ConfigError, match=f"pid {holder.pid} on "):
            with RunLock(folder):
                pass
    finally:
        holder.kill()
        holder.wait()


def test_a_filesystem_without_locks_runs_unlocked_and_says_so(tmp_path, monkeypatch, capsys):
    """Some network mounts refuse flock (ENOLCK): the run goes on, and says a second run
    there would not be refused, instead of failing at its start. (The refusal is injected:
    no such mount here.)"""
    import errno
    import fcntl

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "run"
    with RunLock(out):
        (out / "metrics.jsonl").write_text("{}\n")
    assert "its filesystem takes no locks (No locks available)" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
