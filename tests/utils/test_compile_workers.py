"""Inductor compiles in-process once a compiled path is built (roll/utils/compile_workers.py)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, torch
import torch._inductor.config as c
from roll.utils.compile_workers import compile_in_process
before = c.compile_threads
print(compile_in_process(), before, c.compile_threads)
"""


def _run(env_extra: dict) -> list[str]:
    import os

    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env=env, check=True)
    return out.stdout.split()


def test_one_compile_thread_unless_the_user_chose():
    # Fresh processes: the setting is process-wide. On 2+ cores Inductor's default is a pool.
    set_here = _run({})
    assert set_here[0] == "True" and set_here[2] == "1"
    user = _run({"TORCHINDUCTOR_COMPILE_THREADS": "4"})
    assert user == ["False", "4", "4"]


def test_the_compiled_training_forward_sets_it(tiny_model_path, monkeypatch):
    import torch._inductor.config as inductor_config

    # vLLM sets this variable when imported (earlier tests import it): unset, ours decides.
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)

    from roll.models import load_model
    from roll.multi_agent.compiled import CompiledLayers

    saved = inductor_config.compile_threads
    try:
        inductor_config.compile_threads = 7
        CompiledLayers(load_model(tiny_model_path), backend="aot_eager")
        assert inductor_config.compile_threads == 1
    finally:
        inductor_config.compile_threads = saved
