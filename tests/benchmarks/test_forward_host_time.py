"""benchmarks/forward_host_time.py: the agents' and the critics' compiled forwards each compile
without a graph break, and the report holds a time for each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import forward_host_time  # noqa: E402


@pytest.mark.slow  # ~15 s of compiling (quick subset < 3 min)
def test_compiled_forwards_of_agents_and_critics_have_no_graph_break():
    result = forward_host_time.measure(layers=3, backend="aot_eager", rows=4, tokens=12,
                                       repeats=1)
    assert result["graph_breaks"] == 0
    # one graph per group of rows (agents', critics') and per grad mode at most: a break
    # would split each into more
    assert 2 <= result["graphs"] <= 5, result  # + the reference's (no grad, no delta)
    assert result["agents_ms"] > 0 and result["critics_ms"] > 0 and result["reference_ms"] > 0
