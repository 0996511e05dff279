"""Shared fixtures: the tiny offline model, built once per test session into a temp cache."""

from __future__ import annotations

import gc
import os
import sys

# This machine's environment sets PYTHONDONTWRITEBYTECODE=1, so every process the suite starts
# (~100 Ray actors, CLI runs, benchmark children) compiled roll's modules from source again
# (~0.3 s each). The suite writes their bytecode once, into the checkout's git-ignored
# __pycache__ folders, for itself and every process it starts.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Under pytest-xdist (the README's `-n 2`: two workers on two cores) idle OpenMP threads sleep
# instead of spinning, so a worker's waiting threads (Ray's and vLLM's own) do not take the
# other worker's core. Read when torch loads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The compiled-path tests compile afresh: no graphs from torch's on-disk caches of earlier runs
# (they persist on this machine between runs of different code).
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
# One torch thread per core: an xdist worker gets the cores divided among the workers (the
# README's `-n 2` on two cores: one each), a single process at most two. Two threads in each of
# two workers made every test ~1.4x slower on two cores (session 76: a critic-learning run
# 33 s against 23 s, two at once) and changed no number (the same adapters, bit for bit).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))

pytest_plugins = ["tests.no_skips"]  # a skipped test fails here


def pytest_report_header(config):
    """Which OpenMP wait policy the torch of this process runs under (xdist workers: PASSIVE)."""
    return f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}"


@pytest.fixture(autouse=True)
def grad_mode_restored():
    """Every test starts with gradients on, whatever a test before it left behind."""
    torch.set_grad_enabled(True)
    yield
    torch.set_grad_enabled(True)


@pytest.fixture(autouse=True, scope="module")
def garbage_collected_after_module():
    """Objects a module leaves behind are finalised when it ends, not at a random moment of a
    later test: vLLM's CPU GEMM handlers call ``.item()`` in ``__del__``, and one finalised in
    the middle of a later ``torch.compile`` trace broke that trace (the compiled forward came
    back without a grad_fn; seen only in the full suite, when GC happened to run there).

    What survives the collection (the imported libraries' ~0.5 M objects, session fixtures,
    caches) is then frozen, so that the next module's collection scans only what came since:
    a full one took 0.3-0.8 s per module, ~90 modules in the quick subset. Cyclic garbage among
    frozen objects is never collected; refcounting still frees the rest."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """Folder of a tiny Qwen3 model + tokenizer (random weights, head_dim 32)."""
    from roll.models import build_tiny_model

    cache = os.environ.get("ROLL_TEST_MODEL_DIR")
    path = cache if cache else tmp_path_factory.mktemp("models") / "tiny-qwen3"
    return build_tiny_model(path)


def pytest_collection_modifyitems(config, items):
    """Longest modules first, so that the README's two xdist workers end together: the Ray
    tests (tests/distributed, 40-60 s each on two cores), then every other module with a `slow`
    test, then the quick modules, whose ~750 short tests fill the gap between the workers at
    the end (in collection order a slow module could be the last one left, one worker idle).
    Each module stays whole and in order (its module-scoped fixtures are built once)."""
    slow_modules = {item.module for item in items if item.get_closest_marker("slow")}

    def weight(item) -> int:
        if item.module not in slow_modules:
            return 2
        return 0 if item.nodeid.startswith("tests/distributed/") else 1

    items.sort(key=weight)  # stable: collection order within each group


def pytest_sessionfinish(session, exitstatus):
    """What ``garbage_collected_after_module`` froze is collectable again at exit (frozen,
    interpreter shutdown left it alone, and triton's bindings reported it as leaked)."""
    gc.unfreeze()
