"""How every benchmark reports: the summary JSON on stdout, and in $OUT/<name> when OUT is set
(the GPU machine's results folder)."""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262}
"""Two-sided 95% quantiles of Student's t by degrees of freedom."""


def emit(summary: dict, name: str) -> str:
    """Print ``summary`` as indented JSON and write it to ``$OUT/<name>``; return the text."""
    text = json.dumps(summary, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["OUT"], name).write_text(text + "\n")
    return text


def read_text(path: Path) -> str:
    """A text file's contents, gunzipped when its name ends in ``.gz`` (the metrics files kept
    under ``results/`` are stored gzipped: every device call carries the working tree)."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode()
    return path.read_text()


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean of ``values`` across runs (t with
    n - 1 degrees of freedom, 1.96 from 11 values on; sample std); one value: (v, v, v)."""
    n = len(values)
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T95.get(n - 1, 1.96) * spread / math.sqrt(n)
    return mean, mean - half, mean + half


def points_over_runs(runs: Sequence[dict[int, float]], key: str = "values") -> list[dict]:
    """At each step every run has (``runs``: one ``{step: value}`` per run): the runs' values
    under ``key``, their mean and its 95% t-interval (``t_interval``), rounded to 4 places."""
    steps = sorted(set.intersection(*(set(run) for run in runs)))
    points = []
    for step in steps:
        values = [run[step] for run in runs]
        mean, low, high = t_interval(values)
        points.append({"step": step, key: [round(v, 4) for v in values],
                       "mean": round(mean, 4), "low": round(low, 4), "high": round(high, 4)})
    return points
