"""Learning curves of a run from its ``metrics.jsonl``: ``python -m roll.utils.plot RUN_DIR``.

Writes ``curves_<agent>.png`` per agent (one subplot per ``<agent>/<metric>`` and per
``eval/<agent>/<metric>`` or ``eval_greedy/<agent>/<metric>``) and ``curves_team.png`` (every
other key: ``team/``, ``rollout/``, ``time/``, ``eval/team/``, ...) into ``--out`` (default
``RUN_DIR/plots``), x = step. Draws with matplotlib's Agg canvas directly (no pyplot, so no
global backend is switched and no display is needed).

A step logged twice (a run resumed from an earlier checkpoint) is drawn with its last value.
An evaluation's ``X_low``/``X_high`` (its 95% interval) is drawn as a band around ``X``.
NaN/inf points are left out of a curve and counted in its subplot title.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from roll.utils.tracking import METRICS_FILE, RESERVED_KEYS, split_agent_key

Series = dict[int, float]  # step -> value
TEAM_FIGURE = "team"  # no agent takes this name (it is one of NAMESPACES)
EVAL_PREFIXES = ("eval/", "eval_greedy/")  # the sampled policy's evaluation, the greedy one's
_COLUMNS = 3


def read_metrics(path: Path) -> dict[str, Series]:
    """``{key: {step: value}}`` from a metrics.jsonl; a later line of the same step wins.

    Lines that do not parse (e.g. the last line of a run killed mid-write) are skipped and
    counted on stderr.
    """
    series: dict[str, Series] = {}
    bad_lines = 0
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                bad_lines += 1
                continue
            for key, value in record.items():
                if key not in RESERVED_KEYS and isinstance(value, int | float):
                    series.setdefault(key, {})[step] = float(value)
    if bad_lines:
        print(f"warning: {path}: skipped {bad_lines} unreadable line(s)", file=sys.stderr)
    return series


def group_series(series: dict[str, Series]) -> dict[str, dict[str, Series]]:
    """``{figure: {subplot title: series}}``: one figure per agent (named after it) holding its
    training and evaluation metrics, the rest under ``team``."""
    figures: dict[str, dict[str, Series]] = {}
    for key in sorted(series):
        prefix = next((p for p in EVAL_PREFIXES if key.startswith(p)), "")
        split = split_agent_key(key[len(prefix):])
        if split is None:
            figure, title = TEAM_FIGURE, key
        else:
            figure, title = split[0], prefix + split[1]
        figures.setdefault(figure, {})[title] = series[key]
    return figures


def fold_intervals(curves: dict[str, Series]) -> tuple[dict[str, Series],
                                                     dict[str, tuple[Series, Series]]]:
    """``X_low`` and ``X_high`` beside ``X`` (the evaluations' 95% intervals) become X's band
    instead of two subplots of their own: (the curves left, ``{X: (low, high)}``). A bound
    without its curve or its other bound stays a curve."""
    bands = {title: (curves[f"{title}_low"], curves[f"{title}_high"]) for title in curves
             if f"{title}_low" in curves and f"{title}_high" in curves}
    folded = {f"{title}{suffix}" for title in bands for suffix in ("_low", "_high")}
    return {t: points for t, points in curves.items() if t not in folded}, bands


def draw_figure(curves: dict[str, Series], title: str, path: Path,
                bands: dict[str, tuple[Series, Series]] | None = None) -> None:
    """One PNG with a grid of subplots, one curve each, x = step; a curve with a band (its
    95% interval) has it shaded."""
    bands = bands or {}
    columns = min(_COLUMNS, len(curves))
    rows = math.ceil(len(curves) / columns)
    figure = Figure(figsize=(4.8 * columns, 3.2 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    for index, (name, points) in enumerate(curves.items()):
        axes = figure.add_subplot(rows, columns, index + 1)
        steps = sorted(points)
        finite = [(s, points[s]) for s in steps if math.isfinite(points[s])]
        non_finite = len(steps) - len(finite)
        if finite:
            xs, ys = zip(*finite, strict=True)
            axes.plot(xs, ys, marker="." if len(finite) <= 50 else None, linewidth=1.2)
        low, high = bands.get(name, ({}, {}))
        shaded = [(s, low[s], high[s]) for s in sorted(set(low) & set(high))
                  if math.isfinite(low[s]) and math.isfinite(high[s])]
        if shaded:
            xs, lows, highs = zip(*shaded, strict=True)
            axes.fill_between(xs, lows, highs, alpha=0.25, linewidth=0)
        axes.set_title(name + ("  (band: 95% interval)" if shaded else "")
                       + (f"  ({non_finite} non-finite)" if non_finite else ""), fontsize=9)
        axes.set_xlabel("step", fontsize=8)
        axes.tick_params(labelsize=7)
        axes.grid(alpha=0.3)
    figure.savefig(path, dpi=100)


def _file_stem(figure_name: str) -> str:
    return "curves_" + re.sub(r"[^A-Za-z0-9_\-]", "_", figure_name)


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw every figure of a run; return the PNG paths written."""
    run_dir = Path(run_dir)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise FileNotFoundError(
            f"{metrics_path}: not found; is {run_dir} a run folder (output_dir) with the "
            "'jsonl' tracking backend on?"
        )
    figures = group_series(read_metrics(metrics_path))
    if not figures:
        raise ValueError(f"{metrics_path}: holds no metrics")
    out = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, curves in figures.items():
        path = out / f"{_file_stem(name)}.png"
        kept, bands = fold_intervals(curves)
        draw_figure(kept, f"{run_dir.name}: {name}", path, bands=bands)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m roll.utils.plot", description="Plot the learning curves of a roll run."
    )
    parser.add_argument("run_dir", type=Path, help="the run folder holding metrics.jsonl")
    parser.add_argument("--out", type=Path, default=None, help="output folder (RUN_DIR/plots)")
    args = parser.parse_args(argv)
    try:
        written = plot_run(args.run_dir, args.out)
    except (FileNotFoundError, ValueError) as error:
        parser.exit(2, f"error: {error}\n")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
