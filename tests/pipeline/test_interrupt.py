"""How a run stops. Ctrl-C or SIGTERM (a scheduler's preemption): one line naming the step and
the last good checkpoint, exit code 130, the files it wrote whole; ``resume=latest`` goes on.
Before, Ctrl-C printed a traceback from wherever the step was, and SIGTERM ended the process
with no line at all. A diverged adapter: an error naming it and the checkpoints."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from roll.pipeline.cli import INTERRUPTED, run_cli

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = [sys.executable, str(ROOT / "examples" / "start_multi_agent_pipeline.py"),
          "--config_path", str(ROOT / "examples" / "kuhn_poker"), "--config_name",
          "quickstart_cpu", "save_steps=2", "eval.eval_steps=0"]
LINE = re.compile(r"^interrupted during step (\d+) of 100000 -- last good checkpoint: (\S+) "
                  r"\(continue with resume=latest\)$")


def _wait_for(path: Path, process: subprocess.Popen, seconds: float = 240.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_run_naming_the_last_checkpoint(signum, tmp_path):
    out = tmp_path / "run"
    process = subprocess.Popen(LAUNCH + ["max_steps=100000", f"output_dir={out}"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(out / "checkpoints" / "step_00000004", process)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == INTERRUPTED == 130, stderr
    assert "Traceback" not in stderr, stderr
    match = LINE.match(stderr.strip().splitlines()[-1])
    assert match, stderr
    step, named = int(match.group(1)), Path(match.group(2))
    saved = sorted((out / "checkpoints").glob("step_*"))
    assert named == saved[-1]  # save_steps=2: the step before, or the one before that (or
    # this one, when the signal came between its save and the next step)
    assert int(named.name.removeprefix("step_")) in (step - 2, step - 1, step)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, len(lines) + 1))
    assert len(lines) in (step - 1, step)  # the interrupted step is logged only if it ended

    resumed = subprocess.run(LAUNCH + [f"max_steps={step + 1}", f"output_dir={out}",
                                       "resume=latest"],
                             cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {named} at step {named.name.removeprefix('step_').lstrip('0')}" \
        in resumed.stdout + resumed.stderr
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == step + 1


def test_an_interrupt_before_the_loop_is_one_line_and_sigterm_is_restored(tmp_path, capsys):
    def interrupted(cfg):
        assert signal.getsignal(signal.SIGTERM) is not before  # SIGTERM interrupts, here
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGTERM)
    code = run_cli(interrupted, ["--config_path", str(ROOT / "examples" / "kuhn_poker"),
                                 "--config_name", "quickstart_cpu",
                                 f"output_dir={tmp_path / 'run'}"], "test")
    assert code == 130
    assert capsys.readouterr().err.strip() == ("interrupted before the training loop started: "
                                               "this run saved nothing")
    assert signal.getsignal(signal.SIGTERM) is before  # put back once the run is over


def test_a_diverged_adapter_stops_the_run_naming_it_and_the_checkpoints(tmp_path):
    """A rate so high that step 1's update overflows every later forward: the next rollout's
    constrained sampling met NaN logits and failed with 'token 0 is not allowed here'."""
    from roll.errors import NonFiniteLossError
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    out = tmp_path / "run"
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu", [
        f"output_dir={out}", "save_steps=1", "max_steps=4", "eval.eval_steps=0",
        "team.optim.lr=1e30"])
    with pytest.raises(NonFiniteLossError) as caught:
        AgenticPipeline(cfg).run()
    message = str(caught.value)
    assert re.match(r"adapter 'agent_[01]' decodes non-finite logits \(token \d+, log-prob nan\)",
                    message), message
    assert f"latest checkpoint: {out / 'checkpoints' / 'step_00000001'} (its weights may be" \
        in message and "with a lower learning rate" in message


@pytest.mark.parametrize("error", [
    "engine 1 of 2 failed during generate: ActorDiedError: the actor died unexpectedly",
    "adapter 'agent_0' decodes non-finite logits (token 3, log-prob nan)"])
def test_a_failed_role_or_diverged_adapter_is_one_line_and_its_traceback_is_kept(
        error, tmp_path, capsys):
    """Before, a RoleFailed or NonFiniteLossError ended the program with Python's traceback:
    the line naming the role and the last checkpoint came last, under screens of frames."""
    from roll.errors import NonFiniteLossError, RoleFailed
    from roll.pipeline.cli import ERROR_LOG, FAILED

    kind = RoleFailed if error.startswith("engine") else NonFiniteLossError

    def failing(cfg):
        try:
            raise ValueError("the role's own exception")
        except ValueError as cause:
            raise kind(f"{error} -- last good checkpoint: none") from cause

    out = tmp_path / "run"
    argv = ["--config_path", str(ROOT / "examples" / "kuhn_poker"), "--config_name",
            "quickstart_cpu", f"output_dir={out}"]
    for attempt in (1, 2):
        assert run_cli(failing, argv, "test") == FAILED == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == [f"{error} -- last good checkpoint: none (traceback: {out / ERROR_LOG})"]
        log = (out / ERROR_LOG).read_text()
        assert log.count("Traceback (most recent call last)") == 2 * attempt  # cause + error
        assert log.count("ValueError: the role's own exception") == attempt  # appended
        assert log.count(f"{kind.__name__}: {error}") == attempt
    assert not (out / ".roll.lock").exists()  # the lock let go
