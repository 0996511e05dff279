"""Checkpoint size and host memory over many saves, with a snapshot-opponent pool (issue 31).

    python benchmarks/checkpoint_growth.py [--steps 100] [--model tiny] [--max_size 8]

A Kuhn run (the quickstart example) whose agents also play frozen snapshots of each other
(``snapshot:agent_1@latest``), saving a checkpoint at EVERY step (``save_steps=1``, keep_last
2): each save adds a snapshot to the pool, so without a bound the pool, the trainer state and
host memory grow with the number of saves. After each save it records the size of
``trainer_state.pt``, of the whole checkpoint folder, of ``<output_dir>/snapshots/`` and the
process's resident memory (VmRSS). Prints one JSON object (and writes it to
$OUT/checkpoint_growth.json when OUT is set): the series, and their first / last values.
Tiny model on CPU by default.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def resident_mb() -> float:
    """This process's resident set (VmRSS), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--max_size", type=int, default=8, help="snapshot_pool.max_size")
    args = parser.parse_args()

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.utils.stages import log_line

    out = Path(tempfile.mkdtemp(prefix="checkpoint_growth_"))
    cfg = load_config(str(ROOT / "examples/kuhn_poker"), "multi_agent_kuhn_poker", [
        f"model.path={args.model}", "model.device=cpu", "model.dtype=float32",
        f"max_steps={args.steps}", "save_steps=1", "keep_last=2", "eval.eval_steps=0",
        "rollout.num_groups=3", "rollout.group_size=2", "rollout.max_turns=4",
        "tracking.backends=[jsonl]", f"output_dir={out}",
        f"snapshot_pool.max_size={args.max_size}",
        "env.seat_to_agent=[[agent_0,agent_1],[agent_0,snapshot:agent_1@latest],"
        "[snapshot:agent_0@latest,agent_1]]",
    ])
    pipeline = AgenticPipeline(cfg)
    series: list[dict] = []
    save = pipeline.save

    def measured_save() -> Path:
        folder = save()
        series.append({
            "step": pipeline.step,
            "trainer_state_bytes": (folder / "trainer_state.pt").stat().st_size,
            "checkpoint_bytes": folder_bytes(folder),
            "snapshots_bytes": folder_bytes(out / "snapshots"),
            "snapshots_in_pool": sum(len(steps) for steps
                                     in pipeline.pool.state_dict()["steps"].values()),
            "rss_mb": round(resident_mb(), 1),
        })
        if pipeline.step % 10 == 0:
            log_line(f"save {pipeline.step}: {series[-1]}")
        return folder

    pipeline.save = measured_save
    start = time.perf_counter()
    pipeline.run()
    keys = [key for key in series[0] if key != "step"]
    result = {
        "model": args.model, "saves": len(series), "snapshot_pool_max_size": args.max_size,
        "seconds": round(time.perf_counter() - start, 1),
        "first": {key: series[0][key] for key in keys},
        "after_max_size_saves": {key: series[min(args.max_size, len(series) - 1)][key]
                                 for key in keys},
        "last": {key: series[-1][key] for key in keys},
        "series": series,
    }
    shutil.rmtree(out, ignore_errors=True)  # the run's checkpoints: measured above
    text = json.dumps(result)
    print(json.dumps({k: v for k, v in result.items() if k != "series"}, indent=2))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], "checkpoint_growth.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
