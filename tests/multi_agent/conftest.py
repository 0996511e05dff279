"""Fixtures of the multi-agent tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Multi-threaded CPU BLAS splits a GEMM by its row count, so a row's sums depend on which
    rows share its GEMM — exactly what the fused path changes. On one thread they do not, so
    the invariant-1 comparisons here test the logic at 1e-6 rather than BLAS blocking (AdamW turns
    a 1e-10 gradient difference on a near-zero gradient into a visible weight difference)."""
    # torch._C's function, not torch.set_num_threads: an in-process vLLM CPU engine (another
    # test of this session) replaces the latter with a no-op that only warns.
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    yield
    torch._C.set_num_threads(threads)
