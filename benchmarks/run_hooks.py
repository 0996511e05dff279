"""Hooks a benchmark run puts on an ``AgenticPipeline`` (benchmarks/learning.py): each wraps
one of its methods and leaves the run as it was otherwise.

- ``tactics_at_evaluations``: a game's tactics after every evaluation (tactics.jsonl);
- ``load_compile_cache`` / ``save_compile_cache_after_step_1``: torch.compile's artifacts
  carried from one GPU machine to the next (``--compile_cache``);
- ``profile_one_step``: one training step under torch.profiler (``--profile_step``);
- ``profile_rollout_of_step``: one step's rollout under torch.profiler, with the serve loop's
  own ranges (``pipeline_step.py --profile_rollout``);
- ``cprofile_rollout_of_step``: one step's rollout under cProfile, function by function: where
  the host's time goes (``--cprofile_rollout``);
- ``sync_sites_of_step``: where one training step makes the host wait for the GPU
  (``--sync_step``);
- ``phase_timeline``: when each phase of each step ran, in wall-clock seconds (``--gpu_busy``
  lines them up with the GPUs' utilization).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch


def tactics_at_evaluations(pipeline, out: Path, report) -> list[dict]:
    """After each of the pipeline's evaluations, ``report(pipeline)``: its agents' tactics
    (``tictactoe_policy.report``: TicTacToe's exact win / loss against random per seat, sampled
    and greedy, takes and blocks; ``connect_four_policy.report``: wins taken and blocks made on
    sampled positions), appended to the returned list and to ``out/tactics.jsonl`` as
    ``{"step", "agents"}``: a run the machine's time limit cuts short keeps its figures up to
    its last evaluation."""
    scored: list[dict] = []
    evaluate = pipeline.evaluate

    def evaluate_and_score(*args, **kwargs):
        metrics = evaluate(*args, **kwargs)
        record = {"step": pipeline.step, "agents": report(pipeline)}
        scored.append(record)
        with open(out / "tactics.jsonl", "a") as file:
            file.write(json.dumps(record) + "\n")
        return metrics

    pipeline.evaluate = evaluate_and_score
    return scored


def load_compile_cache(path: Path) -> dict[str, int]:
    """torch.compile's artifacts of an earlier run (``torch.compiler.load_cache_artifacts``),
    if ``path`` exists: the same graphs on the same kind of GPU and torch then load instead of
    compiling (a fresh GPU machine spent ~3.5 minutes of step 1 compiling, session 54).
    Returns how many artifacts of each kind were loaded."""
    from roll.utils.stages import log_line

    if not path.is_file():
        log_line(f"compile cache: {path} not found; compiling afresh")
        return {}
    info = torch.compiler.load_cache_artifacts(path.read_bytes())
    kinds = {key: len(value) for key, value in (info.artifacts if info else {}).items()}
    log_line(f"compile cache: loaded {path} ({path.stat().st_size / 1e6:.1f} MB): {kinds}")
    return kinds


def save_compile_cache_after_step_1(pipeline, out: Path) -> None:
    """After step 1 (whose forwards and decode step compile everything a run compiles), the
    process's torch.compile artifacts go to ``out/compile_cache.bin`` for ``--compile_cache``."""
    from roll.utils.stages import log_line

    plain = pipeline.train_step

    def train_step(*args, **kwargs):
        metrics = plain(*args, **kwargs)
        if pipeline.step == 1:
            saved = torch.compiler.save_cache_artifacts()
            if saved is not None:
                (out / "compile_cache.bin").write_bytes(saved[0])
                log_line(f"compile cache: {len(saved[0]) / 1e6:.1f} MB -> "
                         f"{out / 'compile_cache.bin'}")
        return metrics

    pipeline.train_step = train_step


def _measure_step(pipeline, step: int, out: Path, name: str, measure,
                  method: str = "train_step") -> None:
    """The first call of ``pipeline.<method>`` in step ``step`` of ``pipeline.run()`` runs
    inside ``measure(run) -> report``; the report, with the phase times the call returned
    (``time/*`` of a train step's metrics, or of a rollout's phases), is printed as
    ``{name: report}`` and written to ``out/<name>.json``. Other calls as usual."""
    plain = getattr(pipeline, method)

    def measured(*args, **kwargs):
        if pipeline.step != step or (out / f"{name}.json").exists():
            return plain(*args, **kwargs)
        returned = []
        report = measure(lambda: returned.append(plain(*args, **kwargs)))
        times = returned[0] if method == "train_step" else returned[0][1]
        report = {"step": step, "time": {key: round(value, 3) for key, value in times.items()
                                         if key.startswith("time/")}, **report}
        (out / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps({name: report}), flush=True)
        return returned[0]

    setattr(pipeline, method, measured)


def profile_one_step(pipeline, step: int, top: int, out: Path) -> None:
    """Step ``step`` under torch.profiler (train_throughput.py's ``profile_step``: kernels
    launched, GPU busy share, the ``top`` operators by GPU and by host time) ->
    ``out/profile.json``."""
    from train_throughput import profile_step

    _measure_step(pipeline, step, out, "profile", lambda run: profile_step(run, top))


def profile_rollout_of_step(pipeline, step: int, top: int, out: Path) -> None:
    """The rollout of training step ``step`` (wake, adapter sync, episodes) under
    torch.profiler (``--profile_rollout``): kernels, GPU busy share, the top operators, and the
    serve loop's own ranges (``roll.admit``: prefill and admission; ``roll.decode_step``;
    ``roll.wait``: the host waiting for a step's tokens; ``roll.follow``: the caller's env
    step and next prompt) -> ``out/profile_rollout.json``, printed as
    ``{"profile_rollout": ...}``."""
    from train_throughput import profile_step

    _measure_step(pipeline, step, out, "profile_rollout", lambda run: profile_step(run, top),
                  method="synced_rollout")


def cprofile_rollout_of_step(pipeline, step: int, top: int, out: Path) -> None:
    """The rollout of training step ``step`` under cProfile (``--cprofile_rollout``): Python's
    own profiler, function by function, so the host's share of the serve loop (admissions,
    trie walks, env steps, prompts) shows where it goes; the GPU's work appears only as the
    host time that launches it or waits for it. The ``top`` functions by own time and by
    cumulative time -> ``out/cprofile_rollout.json``, printed as ``{"cprofile_rollout": ...}``.
    cProfile slows Python calls (~1.5-2x here): compare the shares, not the seconds, with
    unprofiled steps."""
    import cProfile
    import pstats

    def measure(run) -> dict:
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        try:
            run()
        finally:
            profiler.disable()
        total = time.perf_counter() - start
        roots = ("roll", "benchmarks", "site-packages")
        rows = [{"function": f"{_short_path(file, roots)}:{line} ({name})", "calls": calls,
                 "own_s": round(own, 4), "cumulative_s": round(cumulative, 4)}
                for (file, line, name), (_, calls, own, cumulative, _)
                in pstats.Stats(profiler).stats.items()]
        return {"profiled_s": round(total, 3),
                "by_own": sorted(rows, key=lambda row: -row["own_s"])[:top],
                "by_cumulative": sorted(rows, key=lambda row: -row["cumulative_s"])[:top]}

    _measure_step(pipeline, step, out, "cprofile_rollout", measure, method="synced_rollout")


def _short_path(path: str, roots: tuple[str, ...] = ("roll", "benchmarks")) -> str:
    """A source path from the first of ``roots`` it passes through on (roll/...,
    benchmarks/...); the whole path where it passes through none."""
    path = path.replace("\\", "/")
    for root in roots:
        if f"/{root}/" in path:
            return f"{root}/" + path.split(f"/{root}/", 1)[1]
    return path


def site_of(frames: list) -> str:
    """``file:line (function)`` of the line that asked for a synchronising operation: the
    innermost frame of this project (roll/, benchmarks/), else the innermost outside torch
    and the standard library's warnings."""
    def short(frame) -> str:
        return f"{_short_path(frame.filename)}:{frame.lineno} ({frame.name})"

    ours = [f for f in frames if "/roll/" in f.filename or "/benchmarks/" in f.filename]
    if ours:
        return short(ours[-1])
    theirs = [f for f in frames if "/torch/" not in f.filename
              and not f.filename.endswith("warnings.py")]
    return short(theirs[-1]) if theirs else "?"


def count_sync_sites(run, top: int = 30) -> dict:
    """Run ``run()`` with CUDA's synchronisation debug mode on: every operation that makes the
    host wait for the device (``.item()``, ``.tolist()``, a blocking copy, a shape that depends
    on values) warns, and is counted at the line of this project that asked for it
    (``site_of``). ``{"syncs": total, "sites": [{"site", "count"}, ...]}``, most first. A
    machine without CUDA counts nothing (``"cuda": false``)."""
    import traceback
    import warnings
    from collections import Counter

    if not torch.cuda.is_available():
        run()
        return {"cuda": False, "syncs": 0, "sites": []}
    counts: Counter = Counter()
    shown = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            counts[site_of(traceback.extract_stack()[:-1])] += 1
        else:
            shown(message, category, filename, lineno, file, line)

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return {"cuda": True, "syncs": sum(counts.values()),
            "sites": [{"site": site, "count": n} for site, n in counts.most_common(top)]}


def sync_sites_of_step(pipeline, step: int, top: int, out: Path) -> None:
    """Step ``step`` under ``count_sync_sites`` (its ``top`` sites) -> ``out/sync_sites.json``."""
    _measure_step(pipeline, step, out, "sync_sites", lambda run: count_sync_sites(run, top))


def phase_timeline(pipeline) -> dict[str, list[tuple[float, float]]]:
    """Every interval (``time.time()`` at start and end) of each phase of the run to come:
    ``step`` (a training step), ``rollout`` (a rollout on the step's own path, with its
    adapter sync), ``rollout_overlapped`` (a next step's sync and rollout played in the
    background, rollout.overlap), ``passes`` (the old and reference log-probs), ``update``
    (the agents' update). Filled in as the run goes."""
    timeline: dict[str, list[tuple[float, float]]] = {
        phase: [] for phase in ("step", "rollout", "rollout_overlapped", "passes", "update")}

    def timed(phase: str, call):
        def wrapped(*args, **kwargs):
            start = time.time()
            try:
                return call(*args, **kwargs)
            finally:
                timeline[phase].append((start, time.time()))
        return wrapped

    pipeline.train_step = timed("step", pipeline.train_step)
    pipeline.synced_rollout = timed("rollout", pipeline.synced_rollout)
    pipeline.trainer.logprob_passes = timed("passes", pipeline.trainer.logprob_passes)
    pipeline.trainer.train_step = timed("update", pipeline.trainer.train_step)
    start = pipeline.next_rollout.start
    pipeline.next_rollout.start = lambda step, play: start(
        step, timed("rollout_overlapped", play))
    return timeline

