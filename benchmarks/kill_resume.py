"""Kill a train rank, an engine actor and an env worker in the middle of a run, then resume.

    python benchmarks/kill_resume.py         # GPU: the Kuhn example, Qwen3-0.6B shape (random
                                             # bf16), 4 agents; 2 train ranks + 2 hf engine actors
                                             # colocated (one of each per GPU), 2 env workers
    python benchmarks/kill_resume.py --tiny  # CPU smoke check (tiny model, 2 CPUs in all)

A first run trains ``--steps`` steps with a checkpoint after each. Then, for each role, a run
resumes (``resume=latest``) to train one step more, and one of the role's actors is killed
(``ray.kill``: its process ends at once, as with kill -9) in the middle of that step: a train
rank when the train phase starts, an engine actor ``--delay`` seconds into the rollout's
decoding, an env worker ``--delay`` seconds after its first env step of the rollout. Each run
must stop with one line naming the role and the last good checkpoint, leave that checkpoint
as it was (every adapter tensor bitwise equal), and a last run resumes and finishes. Reported
per role: the line, seconds from the kill to the error, whether the checkpoint is intact; for
the last run, its seconds and the checkpoint it ends at. Timestamped progress on stdout; the
summary JSON at the end ($OUT/kill_resume.json when OUT is set).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fault_campaign import saved_tensors  # noqa: E402
from pipeline_step import SHAPE_06B, seating  # noqa: E402
from report import emit  # noqa: E402


def say(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


def kill_when_called(obj, method: str, actor, delay: float, killed: dict) -> None:
    """The first call of ``obj.method`` starts a timer that kills ``actor`` ``delay`` s later
    (so the role is killed while it works, not between steps); ``killed['at']`` is when."""
    import ray

    original = getattr(obj, method)

    def kill() -> None:
        killed["at"] = time.perf_counter()
        ray.kill(actor)

    def wrapped(*args, **kwargs):
        if "timer" not in killed:
            killed["timer"] = threading.Timer(delay, kill)
            killed["timer"].start()
        return original(*args, **kwargs)

    setattr(obj, method, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--steps", type=int, default=2, help="steps before the first kill")
    parser.add_argument("--delay", type=float, default=None,
                        help="seconds between a role's first call of the step and its kill "
                             "(default 0.5 on the GPU, 0 with --tiny, whose rollout is short)")
    parser.add_argument("--roles", nargs="+", default=["train", "engine", "env"],
                        choices=["train", "engine", "env"])
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()
    if args.delay is None:
        args.delay = 0.0 if args.tiny else 0.5
    from roll.errors import RoleFailed
    from roll.models.tiny import TinyModelSpec, build_tiny_model, default_cache_dir
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.utils.checkpoint import latest_checkpoint

    spec = TinyModelSpec() if args.tiny else TinyModelSpec(**SHAPE_06B)
    model = build_tiny_model(
        default_cache_dir().parent / ("tiny-qwen3" if args.tiny else "qwen3-0.6b-shape"), spec)
    out = Path(tempfile.mkdtemp(prefix="kill_resume_"))
    per_actor = "0.25" if args.tiny else "1"
    layout = ["cluster.backend=ray", "actor_train.world_size=2", "actor_infer.num_engines=2",
              "actor_infer.colocate=true", "env_workers.num_workers=2",
              f"actor_train.cpus_per_rank={2 * float(per_actor)}",
              f"actor_infer.cpus_per_engine={per_actor}",
              "env_workers.cpus_per_worker=0.25"]
    base = [f"model.path={model}", f"model.dtype={'float32' if args.tiny else 'bfloat16'}",
            f"model.device={'cpu' if args.tiny else 'cuda'}", "team.num_agents=4", seating(4),
            "save_steps=1", "eval.eval_steps=0", "tracking.backends=[jsonl]", f"output_dir={out}",
            "team.lora.rank=32", "team.lora.alpha=32"]
    if args.tiny:
        base += ["rollout.num_groups=4", "rollout.sampling.max_new_tokens=16"]

    def step_of(checkpoint: Path) -> int:
        return int(checkpoint.name.split("_")[-1])

    def pipeline(steps: int, resume: bool) -> AgenticPipeline:
        overrides = base + layout + [f"max_steps={steps}"] + (["resume=latest"] if resume else [])
        return AgenticPipeline(load_config(str(ROOT / "examples/kuhn_poker"),
                                           "multi_agent_kuhn_poker", overrides + args.override))

    say(f"first run: {args.steps} steps, a checkpoint after each, under {out}")
    start = time.perf_counter()
    pipeline(args.steps, resume=False).run()
    say(f"first run done in {time.perf_counter() - start:.1f} s; "
        f"checkpoint {latest_checkpoint(out).name}")
    kills = []
    for role in args.roles:
        before_dir = latest_checkpoint(out)
        before = saved_tensors(before_dir)
        run = pipeline(step_of(before_dir) + 1, resume=True)
        killed: dict = {}
        if role == "train":  # the train phase starts: rows sent to the ranks, rank 1 dies
            kill_when_called(run.trainer, "train_step", run.trainer.ranks[1], 0.0, killed)
        elif role == "engine":
            kill_when_called(run.engine, "serve", run.engine.ranks[1], args.delay, killed)
        else:
            kill_when_called(run.env_host, "start", run.env_host.workers[1], args.delay, killed)
        say(f"{role}: resumed from {before_dir.name}; killing actor 1 of the role mid-step")
        line, seconds = None, None
        try:
            run.run()
        except RoleFailed as error:
            seconds = time.perf_counter() - killed["at"] if "at" in killed else None
            line = str(error)
        after_dir = latest_checkpoint(out)
        after = saved_tensors(after_dir)
        intact = after_dir == before_dir and all(torch.equal(before[k], after[k]) for k in before)
        say(f"{role}: {line!r}" if line else f"{role}: the run did NOT stop (kill came too late?)")
        kills.append({"role": role, "line": line, "one_line": bool(line) and "\n" not in line,
                      "kill_to_error_s": None if seconds is None else round(seconds, 2),
                      "checkpoint": after_dir.name, "checkpoint_intact": intact})
        say(f"{role}: checkpoint {after_dir.name}, intact: {intact}")
    start = time.perf_counter()
    say("last run: resume=latest, one step more")
    pipeline(step_of(latest_checkpoint(out)) + 1, resume=True).run()
    finished = {"seconds": round(time.perf_counter() - start, 1),
                "checkpoint": latest_checkpoint(out).name}
    say(f"last run done: {finished}")
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    emit({"device": name, "gpus": torch.cuda.device_count(), "tiny": args.tiny,
          "steps": args.steps, "delay_s": args.delay, "kills": kills, "resume": finished,
          "overrides": args.override}, "kill_resume.json")


if __name__ == "__main__":
    main()
