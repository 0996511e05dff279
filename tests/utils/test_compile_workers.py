"""Inductor compiles in-process once a compiled path is built (roll/utils/compile_workers.py)."""

from __future__ import annotations

import pytest
import torch._inductor.config as inductor_config

from roll.utils.compile_workers import compile_in_process


@pytest.fixture
def threads(monkeypatch):
    """Inductor's compile-thread setting, put back after the test; the user's variable unset
    (vLLM sets it to 1 when imported, and earlier tests import vLLM)."""
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    saved = inductor_config.compile_threads
    inductor_config.compile_threads = 7  # a pool, as on a machine with many cores
    yield
    inductor_config.compile_threads = saved


def test_one_compile_thread_unless_the_user_chose(threads, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "4")
    assert compile_in_process() is False and inductor_config.compile_threads == 7
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS")
    assert compile_in_process() is True and inductor_config.compile_threads == 1


def test_the_compiled_training_forward_sets_it(threads, tiny_model_path):
    from roll.models import load_model
    from roll.multi_agent.compiled import CompiledLayers

    CompiledLayers(load_model(tiny_model_path), backend="aot_eager")
    assert inductor_config.compile_threads == 1
