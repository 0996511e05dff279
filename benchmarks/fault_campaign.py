"""kill -9 at random moments of a run with critics and snapshot opponents, resumed each time.

    python benchmarks/fault_campaign.py                 # 12 kills, 30 steps, tiny model, CPU
    python benchmarks/fault_campaign.py --kills 3 --steps 8

The run: the Kuhn poker example on the tiny model, two agents, each with its own critic
(``advantage.estimator=ippo``, ``critic.mode=per_agent``), seated against each other and
against frozen snapshots of each other (``snapshot:<agent>@latest``), a checkpoint after every
step (``save_steps=1``). First it runs once without interruption (every checkpoint kept).
Then the same run is started as a process and killed with SIGKILL at a random moment (every
fourth kill during its start-up, the others during training, uniform over the next few
steps), started again with ``resume=latest``, killed again, ... ``--kills`` times; then it
runs to the end.

Checked, and reported as JSON (``$OUT/fault_campaign.json`` when OUT is set):
- after every kill, the latest checkpoint is complete (the resume that follows loads it);
  a kill never loses a checkpoint that was already there;
- at the end, every checkpoint of the killed-and-resumed run holds exactly (bitwise) the
  agents' adapters, the critics' adapters and the snapshot files of the uninterrupted run's
  checkpoint of the same step: resume is bit-exact however often the run was killed.
Timestamped progress on stdout.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import emit  # noqa: E402

SCRIPT = str(ROOT / "examples" / "start_multi_agent_pipeline.py")
OVERRIDES = [
    "--config_path", str(ROOT / "examples" / "kuhn_poker"),
    "--config_name", "multi_agent_kuhn_poker",
    "env.seat_to_agent=[[agent_0,agent_1],[agent_0,snapshot:agent_1@latest],"
    "[snapshot:agent_0@latest,agent_1]]",
    "advantage.estimator=ippo", "critic.mode=per_agent",
    "rollout.num_groups=3", "rollout.group_size=2", "rollout.sampling.max_new_tokens=12",
    "rollout.constrained_decoding=true", "eval.eval_steps=0", "tracking.backends=[jsonl]",
    "save_steps=1", "keep_last=1000",
]


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def launch(out: Path, steps: int, cache: Path, *extra: str) -> subprocess.Popen:
    """The run as a process; ``proc.training`` is set once it prints its first step line."""
    # this checkout's roll, whatever an editable install elsewhere points to
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, ROLL_CACHE=str(cache), PYTHONPATH=path)
    proc = subprocess.Popen([sys.executable, SCRIPT, *OVERRIDES, f"max_steps={steps}",
                             f"output_dir={out}", *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.training = threading.Event()
    proc.tail = []  # the last lines of stderr, for a failure's message

    def read(stream, on_line) -> None:
        for line in stream:
            on_line(line)

    def on_stdout(line: str) -> None:
        if "] step " in line:
            proc.training.set()

    def on_stderr(line: str) -> None:
        proc.tail = (proc.tail + [line])[-60:]

    for stream, on_line in ((proc.stdout, on_stdout), (proc.stderr, on_stderr)):
        threading.Thread(target=read, args=(stream, on_line), daemon=True).start()
    return proc


def failed(what: str, proc: subprocess.Popen) -> SystemExit:
    time.sleep(0.5)  # let the reader take the last lines
    return SystemExit(f"{what} failed:\n{''.join(proc.tail)}")


def saved_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every safetensors tensor under a folder (a checkpoint's agents and critics, or the
    run's snapshot pool), keyed by file path and tensor name."""
    from safetensors.torch import load_file

    return {f"{path.relative_to(checkpoint)}/{key}": value
            for path in sorted(checkpoint.rglob("*.safetensors"))
            for key, value in load_file(path).items()}


def _same(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> bool:
    return ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def checkpoints(out: Path) -> dict[str, Path]:
    folder = out / "checkpoints"
    return {p.name: p for p in sorted(folder.glob("step_*"))} if folder.is_dir() else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    parser.add_argument("--root", default=None, help="where the runs go (default: a temp dir)")
    args = parser.parse_args()
    summary = campaign(args.kills, args.steps, args.seed, args.root)
    emit(summary, "fault_campaign.json")


def campaign(kill_count: int, steps: int, seed: int = 0, where: str | None = None) -> dict:
    """The campaign (runs under ``where``, default a temporary folder); returns the summary
    the module docstring describes."""
    import tempfile

    from roll.utils.checkpoint import latest_checkpoint

    root = Path(where or tempfile.mkdtemp(prefix="fault_campaign_"))
    cache = root / "cache"
    rng = random.Random(seed)

    say(f"uninterrupted run: {steps} steps under {root / 'straight'}")
    start = time.perf_counter()
    proc = launch(root / "straight", steps, cache)
    first = trains = None  # seconds until the first checkpoint / the first step line
    while proc.poll() is None:
        if trains is None and proc.training.is_set():
            trains = time.perf_counter() - start
        if first is None and checkpoints(root / "straight"):
            first = time.perf_counter() - start
        time.sleep(0.02)
    if proc.returncode != 0:
        raise failed("the uninterrupted run", proc)
    duration = time.perf_counter() - start
    per_step = (duration - first) / max(steps - 1, 1)
    startup, first_step = trains, first - trains  # step 1 is slower than the others
    say(f"uninterrupted run: {duration:.1f} s (start-up {startup:.1f} s, step 1 "
        f"{first_step:.2f} s, then {per_step:.2f} s a step)")

    crashed = root / "crashed"
    kills, lost = [], []
    while len(kills) < kill_count:
        before = checkpoints(crashed)
        resume = ["resume=latest"] if before else []
        # Every fourth kill lands at a uniform moment of the start-up (model load, resume);
        # the others at a uniform moment of the next 1.5 x remaining steps / kills left once
        # the run trains (after its first step line), so on average the kills spread over the
        # run and come before its end; some land while a checkpoint is written.
        remaining = steps - len(before)
        if remaining == 0:
            say(f"the run reached its end before kill {len(kills) + 1}; the campaign stops here")
            break
        window = 1.5 * remaining / (kill_count - len(kills))  # steps
        during = "start-up" if len(kills) % 4 == 3 else "training"
        delay = rng.uniform(0.0, startup if during == "start-up"
                            else first_step + (window - 1) * per_step)
        proc = launch(crashed, steps, cache, *resume)
        started = time.perf_counter()
        while during == "training" and not proc.training.wait(0.05) and proc.poll() is None:
            pass
        time.sleep(delay)
        if proc.poll() is not None:  # it finished (or failed) before the kill
            if proc.returncode != 0:
                raise failed("a resumed run", proc)
            say(f"the run finished before kill {len(kills) + 1}; the campaign stops here")
            break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        after = checkpoints(crashed)
        gone = sorted(set(before) - set(after))
        lost += gone
        latest = latest_checkpoint(crashed)
        kills.append({"during": during, "after_s": round(time.perf_counter() - started, 2),
                      "checkpoints_before": len(before),
                      "latest_after": latest.name if latest else None, "lost": gone})
        say(f"kill {len(kills)} during {during}, {kills[-1]['after_s']} s after the start: "
            f"latest checkpoint "
            f"{latest.name if latest else None} ({len(after) - len(before)} new)")
    say("last run: resume=latest to the end")
    proc = launch(crashed, steps, cache,
                  *(["resume=latest"] if checkpoints(crashed) else []))
    if proc.wait() != 0:
        raise failed("the last resumed run", proc)

    straight, resumed = checkpoints(root / "straight"), checkpoints(crashed)
    differing = []
    for name, folder in straight.items():
        if name not in resumed or not _same(saved_tensors(resumed[name]), saved_tensors(folder)):
            differing.append(name)
    snapshots_equal = _same(saved_tensors(root / "straight" / "snapshots"),
                            saved_tensors(crashed / "snapshots"))
    tensors = len(saved_tensors(next(iter(straight.values()))))
    summary = {"steps": steps, "kills": len(kills), "uninterrupted_s": round(duration, 1),
               "kill_moments": kills, "checkpoints_lost": lost,
               "checkpoints_compared": len(straight), "tensors_per_checkpoint": tensors,
               "checkpoints_differing": differing, "snapshot_files_bitwise_equal": snapshots_equal,
               "every_checkpoint_bitwise_equal": not differing and len(resumed) == len(straight)}
    say(f"{len(kills)} kills; checkpoints lost: {lost or 'none'}; differing from the "
        f"uninterrupted run: {differing or 'none'} ({len(straight)} compared, "
        f"{tensors} tensors each); snapshot files equal: {snapshots_equal}")
    return summary


if __name__ == "__main__":
    main()
