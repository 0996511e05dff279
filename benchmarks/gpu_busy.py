"""How busy each GPU is during each phase of a pipeline step (issue 34: "the share of each
GPU's time spent busy per phase"), for ``pipeline_step.py --gpu_busy``.

- ``GpuSampler``: ``nvidia-smi`` sampling the utilization (NVML's: the share of the last
  sample period in which a kernel ran) of every GPU the process sees every ``period_ms``,
  each sample stamped with the driver's own time; nothing (``available`` False) where there
  is no ``nvidia-smi``.
- ``busy_by_phase``: the mean utilization of each GPU over the intervals of each phase (a
  phase's intervals may overlap another's: with ``rollout.overlap`` the next rollout plays
  while this step trains).

Utilization is the GPU's, whoever runs on it: on a shared host (or GPUs shared by colocated
actors) it says whether the GPU was busy, not for whom.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

Sample = tuple[float, int, float]
"""(seconds since the epoch, GPU index, utilization in %)."""


def busy_by_phase(samples: Iterable[Sample], phases: dict[str, list[tuple[float, float]]]
                  ) -> dict[str, dict[int, float]]:
    """``{phase: {gpu: mean utilization (%) of the samples taken inside the phase's
    intervals}}``; a phase with no sample inside is left out (intervals shorter than the
    sample period)."""
    out: dict[str, dict[int, float]] = {}
    samples = list(samples)
    for phase, intervals in phases.items():
        sums: dict[int, list[float]] = defaultdict(list)
        for stamp, gpu, utilization in samples:
            if any(start <= stamp <= end for start, end in intervals):
                sums[gpu].append(utilization)
        if sums:
            out[phase] = {gpu: round(sum(values) / len(values), 1)
                          for gpu, values in sorted(sums.items())}
    return out


class GpuSampler:
    """Every GPU's utilization every ``period_ms`` while inside (``with GpuSampler() as s``);
    ``samples`` after. A thread reads ``nvidia-smi``'s lines as they come."""

    def __init__(self, period_ms: int = 100) -> None:
        self.period_ms = period_ms
        self.samples: list[Sample] = []
        self.available = shutil.which("nvidia-smi") is not None
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        if self.available:
            self._process = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=timestamp,index,utilization.gpu",
                 "--format=csv,noheader,nounits", f"-lms={self.period_ms}",
                 *visible_gpus_option(os.environ.get("CUDA_VISIBLE_DEVICES"))],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            parsed = parse_line(line)
            if parsed is not None:
                self.samples.append(parsed)

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)


def visible_gpus_option(visible: str | None) -> list[str]:
    """nvidia-smi's ``--id`` for the GPUs this process sees (``CUDA_VISIBLE_DEVICES`` as
    indices: runs sharing a host each sample their own), none when it is unset or not
    indices (UUIDs: every GPU is sampled). GPUs are reported by their host index."""
    ids = [part.strip() for part in (visible or "").split(",") if part.strip()]
    return [f"--id={','.join(ids)}"] if ids and all(i.isdigit() for i in ids) else []


def parse_line(line: str) -> Sample | None:
    """One ``timestamp, index, utilization`` line of nvidia-smi (its timestamp in the local
    time zone, as ``time.time()`` reads it: ``2026/11/28 21:10:00.123``); None if it is not
    one (a blank line, "[N/A]")."""
    try:
        stamp, gpu, utilization = (part.strip() for part in line.split(","))
        when = datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
        return when, int(gpu), float(utilization)
    except ValueError:
        return None


__all__ = ["GpuSampler", "Sample", "busy_by_phase", "parse_line", "visible_gpus_option"]
