"""benchmarks/gpu_busy.py: each GPU's utilization per phase, by hand; nvidia-smi's lines."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_busy import GpuSampler, busy_by_phase, parse_line, visible_gpus_option  # noqa: E402


def test_busy_by_phase_by_hand():
    # GPU 0 busy 100% in [0, 2], 20% after; GPU 1 0% until 3, 80% after; samples each second
    samples = [(t, 0, 100.0 if t <= 2 else 20.0) for t in range(6)]
    samples += [(t, 1, 0.0 if t < 3 else 80.0) for t in range(6)]
    phases = {
        "rollout": [(0.0, 2.0)],                  # t = 0, 1, 2
        "update": [(2.5, 3.5), (4.5, 5.0)],       # t = 3, 5
        "overlapped": [(1.5, 4.0)],               # t = 2, 3, 4: overlaps both others
        "too short": [(0.2, 0.8)],                # no sample inside: left out
    }
    busy = busy_by_phase(samples, phases)
    assert busy == {
        "rollout": {0: 100.0, 1: 0.0},
        "update": {0: 20.0, 1: 80.0},
        "overlapped": {0: round((100 + 20 + 20) / 3, 1), 1: round((0 + 80 + 80) / 3, 1)},
    }


def test_nvidia_smi_lines():
    stamp = datetime(2026, 11, 28, 21, 10, 0, 123000).timestamp()
    assert parse_line("2026/11/28 21:10:00.123, 3, 57\n") == (stamp, 3, 57.0)
    assert parse_line("\n") is None
    assert parse_line("2026/11/28 21:10:00.123, 3, [N/A]") is None


def test_without_nvidia_smi_the_sampler_says_so(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with GpuSampler() as sampler:
        pass
    assert sampler.available is False and sampler.samples == []


def test_each_run_samples_the_gpus_it_sees():
    assert visible_gpus_option("2,3") == ["--id=2,3"]
    assert visible_gpus_option(" 0 ") == ["--id=0"]
    assert visible_gpus_option(None) == [] and visible_gpus_option("") == []
    assert visible_gpus_option("GPU-1089d517-ed87,GPU-f2f2eb22") == []  # UUIDs: all GPUs
