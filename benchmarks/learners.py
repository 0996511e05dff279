"""Learners side by side: GRPO, MAGRPO, IPPO, MAPPO, HAPPO, VDN on the same tasks, budget, seeds.

    python benchmarks/learners.py --seeds 0 1 2 --steps 30 --parallel 10   # GPU: SmolLM2-135M
    python benchmarks/learners.py --tasks hanabi --deadline 500              # stop at 500 s
    python benchmarks/learners.py --tiny --steps 2 --seeds 0 --tasks math --learners grpo ippo

Tasks (both with constrained answers, so a 135M model has something to learn):
  math     the math team (generator -> critic -> refiner, one adapter per role; built-in
           arithmetic with answer choices); curve: task/accuracy_final of the training rollouts
  hanabi   the small Hanabi (2 colours, 3 ranks, max score 6), two agents, 4 groups x 4 games
           of at most 24 turns per step; curve: the mean return of the training episodes (the
           team's score)
Learners (roll/algorithms; the critic ones with critic adapters of LoRA r 16, lr 1e-3, and
advantages whitened per agent, as PPO does; the group ones as configured by the examples):
  grpo (each seat's return, group-relative), magrpo (the team's joint return, group-relative),
  ippo (GAE, one critic per agent), mappo (GAE, one shared critic),
  happo (mappo's advantages, agents updated one after another with ratio weights),
  happo_token_mean (happo whose earlier turns' ratios are length-normalised:
  advantage.happo_log_ratio=token_mean),
  mappo_global (mappo whose critic reads every seat's observation: critic.input=global),
  vdn (GAE, one critic per agent, the critics' sum fitted on the joint return).
Every (task, learner, seed) is one run of the real pipeline in its own process (``--parallel``
at once on the one GPU); each run writes metrics.jsonl. Printed and written ($OUT/learners.json):
per task and learner the curve's mean / min / max over seeds per step, and the mean of the last
``--window`` steps per seed; a PNG with one panel per task ($OUT/learners.png). With
``--deadline`` the runs still going at that many seconds are stopped and summarised as far as
they got (their step counts are in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASKS = {
    "math": ("examples/math_team", "multi_agent_math_team", "task/accuracy_final", [
        "env.params.closed_answers=true", "env.params.lenient_answers=true",
        "env.params.max_rounds=1", "rollout.constrained_decoding=true",
        "rollout.sampling.max_new_tokens=48", "team.lora.target_modules=[q_proj,k_proj,v_proj,"
        "o_proj,gate_proj,up_proj,down_proj]", "team.lora.rank=16", "team.lora.alpha=32"]),
    "hanabi": ("examples/hanabi", "multi_agent_hanabi", "team/episode_return", [
        "rollout.constrained_decoding=true", "rollout.sampling.max_new_tokens=32",
        "rollout.max_turns=24", "rollout.num_groups=4", "team.lora.rank=16",
        "team.lora.alpha=32"]),
}
"""task -> (example folder, config name, curve metric, overrides)."""

CRITIC = ["critic.lora.rank=16", "critic.lora.alpha=32", "critic.optim.lr=1e-3",
          "advantage.norm=whiten"]
LEARNERS = {
    "grpo": ["advantage.estimator=grpo"],
    "magrpo": ["advantage.estimator=magrpo"],
    "ippo": ["advantage.estimator=ippo", "critic.mode=per_agent", *CRITIC],
    "mappo": ["advantage.estimator=mappo", "critic.mode=shared", *CRITIC],
    "happo": ["advantage.estimator=happo", "critic.mode=shared", *CRITIC],
    "happo_token_mean": ["advantage.estimator=happo", "critic.mode=shared",
                         "advantage.happo_log_ratio=token_mean", *CRITIC],
    "mappo_global": ["advantage.estimator=mappo", "critic.mode=shared", "critic.input=global",
                     *CRITIC],
    "vdn": ["advantage.estimator=vdn", "critic.mode=per_agent", *CRITIC],
}
COMMON = ["rollout.num_groups=8", "rollout.group_size=4", "rollout.sampling.temperature=1.0",
          "team.optim.lr=2e-4", "trainer.micro_batch_size=8", "eval.eval_steps=0",
          "save_steps=0", "tracking.backends=[jsonl]"]


def overrides(args, task: str, learner: str, seed: int, out: Path) -> list[str]:
    device = "cpu" if args.tiny else "cuda"
    extra = ["rollout.num_groups=2", "rollout.group_size=2"] if args.tiny else []
    return [*COMMON, *TASKS[task][3], *LEARNERS[learner], *extra,
            f"model.path={'tiny' if args.tiny else args.model}", f"model.device={device}",
            "model.dtype=float32", f"seed={seed}", f"max_steps={args.steps}",
            f"output_dir={out}"]


def launch(args, task: str, learner: str, seed: int, runs: Path) -> tuple[subprocess.Popen, Path]:
    folder, name, _, _ = TASKS[task]
    out = runs / f"{task}_{learner}_s{seed}"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(ROOT / "examples" / "start_multi_agent_pipeline.py"),
               "--config_path", str(ROOT / folder), "--config_name", name,
               *overrides(args, task, learner, seed, out)]
    log = (out / "log.txt").open("w")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env), out


def curve_of(out: Path, metric: str) -> list[float]:
    """The run's per-step values of ``metric`` (steps without it are skipped)."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [row[metric] for row in rows if metric in row]


def aggregate(curves: list[list[float]], window: int) -> dict:
    """Per-step mean / min / max over the seeds' curves (up to the shortest), and each seed's
    mean over the ``window`` steps that end there (the same steps for every seed), with their
    mean and spread; ``first_mean``: the seeds' mean over their first ``window`` steps."""
    curves = [curve for curve in curves if curve]
    if not curves:
        return {"seeds": 0}
    steps = min(map(len, curves))
    columns = [[curve[step] for curve in curves] for step in range(steps)]
    finals = [sum(curve[max(0, steps - window):steps]) / min(window, steps) for curve in curves]
    firsts = [sum(curve[:window]) / len(curve[:window]) for curve in curves]
    return {
        "seeds": len(curves), "steps": steps,
        "mean": [round(sum(c) / len(c), 4) for c in columns],
        "min": [round(min(c), 4) for c in columns],
        "max": [round(max(c), 4) for c in columns],
        "first_mean": round(sum(firsts) / len(firsts), 4),
        "final_per_seed": [round(value, 4) for value in finals],
        "final_mean": round(sum(finals) / len(finals), 4),
        "final_spread": round(max(finals) - min(finals), 4),
    }


def plot(summary: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        summary["plot"] = "matplotlib not installed"
        return
    tasks = list(summary["tasks"])
    figure, axes = plt.subplots(1, len(tasks), figsize=(6 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        for learner, result in summary["tasks"][task].items():
            if not result.get("seeds"):
                continue
            steps = list(range(1, result["steps"] + 1))
            axis.plot(steps, result["mean"], label=f"{learner} ({result['seeds']} seeds)")
            axis.fill_between(steps, result["min"], result["max"], alpha=0.2)
        axis.set(title=f"{task}: {TASKS[task][2]} (min-max over seeds)", xlabel="step")
        axis.legend()
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    summary["plot"] = path.name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--learners", nargs="+", default=list(LEARNERS), choices=LEARNERS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--window", type=int, default=5, help="last steps averaged per seed")
    parser.add_argument("--parallel", type=int, default=1, help="runs at once")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds; then stop every run still going and summarise")
    parser.add_argument("--summarize", default=None, metavar="RUNS",
                        help="launch nothing: summarise the run folders under RUNS (e.g. "
                             "metrics.jsonl files brought back from GPU calls)")
    args = parser.parse_args()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(
        tempfile.mkdtemp(prefix="learners_"))
    if args.summarize:
        runs, done, minutes = Path(args.summarize), {}, None
    else:
        runs = out / "runs"
        done, minutes = run_all(args, runs)
    summarise(args, runs, done, minutes, out)


def run_all(args, runs: Path) -> tuple[dict, float]:
    """Every (task, learner, seed) run, ``--parallel`` at once; each run's exit (or why it
    did not finish) and the minutes taken."""
    from roll.models.aliases import resolve_model_path

    resolve_model_path("tiny" if args.tiny else args.model)  # build the cache once, up front
    jobs = [(task, learner, seed) for seed in args.seeds for task in args.tasks
            for learner in args.learners]
    start, running, done = time.perf_counter(), [], {}
    while jobs or running:
        if args.deadline is not None and time.perf_counter() - start > args.deadline:
            for job, process, folder in running:
                process.kill()
                process.wait()
                done[job] = "stopped at the deadline"
                print(json.dumps({"run": folder.name, "stopped": "deadline"}), flush=True)
            for job in jobs:
                done[job] = "not started before the deadline"
            break
        while jobs and len(running) < args.parallel:
            job = jobs.pop(0)
            running.append((job, *launch(args, *job, runs)))
        time.sleep(0.5)
        for entry in list(running):
            job, process, folder = entry
            if process.poll() is not None:
                running.remove(entry)
                done[job] = process.returncode
                print(json.dumps({"run": folder.name, "returncode": process.returncode,
                                  "minutes": round((time.perf_counter() - start) / 60, 1)}),
                      flush=True)
    return done, round((time.perf_counter() - start) / 60, 1)


def summarise(args, runs: Path, done: dict, minutes: float | None, out: Path) -> None:
    """learners.json and learners.png in ``out`` from the runs' metrics.jsonl files."""
    summary = {"model": "tiny" if args.tiny else args.model, "steps": args.steps,
               "seeds": args.seeds, "minutes": minutes, "window": args.window,
               "failed": {f"{t}_{lr}_s{s}": code for (t, lr, s), code in done.items() if code},
               "tasks": {}}
    for task in args.tasks:
        summary["tasks"][task] = {}
        for learner in args.learners:
            curves = [curve_of(runs / f"{task}_{learner}_s{seed}", TASKS[task][2])[:args.steps]
                      for seed in args.seeds]
            result = aggregate(curves, args.window)
            result["steps_per_seed"] = [len(curve) for curve in curves]
            summary["tasks"][task][learner] = result
    plot(summary, out / "learners.png")
    text = json.dumps(summary, indent=2)
    (out / "learners.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
