"""A real local Ray cluster for the distributed tests (started once per module that asks)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def ray_cluster():
    import ray  # a broken install fails here, never skips

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def one_thread():
    """Rows' sums independent of which rows share a GEMM (see tests/multi_agent/conftest.py);
    each Ray rank runs on one thread too."""
    threads = torch.get_num_threads()
    torch._C.set_num_threads(1)
    yield
    torch._C.set_num_threads(threads)
