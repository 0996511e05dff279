"""What Ray actors print reaches the terminal of the run that started them: a train rank's and
an engine actor's lines (their model loads, compile and capture lines on a GPU) would
otherwise leave a long stage silent (benchmarks/README.md, "What a run prints on the GPU")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .helpers import KUHN_SMALL, ROOT

pytestmark = pytest.mark.slow


def test_ray_actors_lines_reach_the_runs_terminal(tmp_path):
    # a process of its own: the pipeline starts Ray itself, as a user's run does
    command = [sys.executable, str(ROOT / "examples" / "start_multi_agent_pipeline.py"),
               "--config_path", str(ROOT / "examples" / "kuhn_poker"),
               "--config_name", "multi_agent_kuhn_poker", *KUHN_SMALL,
               "cluster.backend=ray", "actor_train.cpus_per_rank=0.5",
               "actor_infer.num_engines=1", "actor_infer.cpus_per_engine=0.5",
               "max_steps=1", "save_steps=0", f"output_dir={tmp_path / 'run'}"]
    # this checkout's roll, whatever an editable install elsewhere points to
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, ROLL_CACHE=str(tmp_path / "cache"), RAY_DEDUP_LOGS="0",
               PYTHONPATH=path)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = done.stdout + done.stderr
    # Ray prefixes each forwarded line with the actor's class and process id
    assert "(TrainRank pid=" in printed, printed[-3000:]
    assert "(InferRank pid=" in printed, printed[-3000:]
