"""benchmarks/decode_attention.py's visible columns (the timing itself needs CUDA graphs: GPU
only, as benchmarks/lora_kernels.py): what each lane sees is what its pattern says."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import decode_attention  # noqa: E402


def test_prefix_lanes_see_the_first_three_quarters():
    seen = decode_attention.visible_columns(3, 256, "prefix", torch.Generator().manual_seed(0))
    assert seen.shape == (3, 256)
    assert seen[:, :192].all() and not seen[:, 192:].any()


def test_ring_lanes_see_one_wrapped_span_each():
    """Each lane's visible columns are one run modulo the capacity (a ring), of 1..C columns;
    over 200 lanes some spans wrap past the last column and some do not."""
    columns = 64
    seen = decode_attention.visible_columns(200, columns, "ring",
                                            torch.Generator().manual_seed(1))
    wrapped = 0
    for row in seen.tolist():
        count = sum(row)
        assert 1 <= count <= columns
        # a run modulo C: exactly one hidden→visible edge around the ring (none if all seen)
        rises = sum(1 for c in range(columns) if row[c] and not row[c - 1])
        assert rises == (0 if count == columns else 1)
        wrapped += row[0] and row[-1] and count < columns
    assert 0 < wrapped < 200
