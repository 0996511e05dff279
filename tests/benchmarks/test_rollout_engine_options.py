"""benchmarks/rollout_throughput.py --pipeline-defaults builds our engine as the pipeline would:
its options come from the pipeline's own resolvers, not a copy of their answers."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import rollout_throughput  # noqa: E402


def test_pipeline_defaults_are_the_pipelines_resolved_options():
    """On CUDA the pipeline fuses q/k/v and gate/up and decodes with the Triton attention
    (README: rollout.hf.fuse_projections, rollout.hf.attention_kernel); on the CPU neither."""
    assert rollout_throughput.pipeline_engine_options(torch.device("cuda")) == {
        "fuse_projections": True, "attention_kernel": "triton"}
    assert rollout_throughput.pipeline_engine_options(torch.device("cpu")) == {
        "fuse_projections": False, "attention_kernel": "sdpa"}
