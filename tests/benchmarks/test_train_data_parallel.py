"""benchmarks/train_data_parallel.py on the tiny model: a ZeRO-3 rank built partitioned
(zero.Init) trains a step, leaves torch's own ``torch.nn.functional.linear`` in place and never
walks the modules inside a gathered layer.

DeepSpeed's default "memory-efficient linear" replaces that function for the whole process
(a matmul instead of torch's fused linear, the weight gathered again in the backward); our
ZeRO-3 config turns it off (roll/distributed/deepspeed_strategy.py ``deepspeed_config``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def zero3_tiny_step(tmp_path: Path, *extra: str) -> dict:
    """``train_data_parallel.py --tiny`` with one ZeRO-3 rank on this CPU (``extra``: more
    flags); its result entry."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/train_data_parallel.py"), "--tiny",
         "--world_sizes", "1", "--strategy", "deepspeed", "--zero_stage", "3", "--repeats", "1",
         *extra],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT), "OUT": str(tmp_path),
                          "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((tmp_path / "train_data_parallel.json").read_text())["results"][0]


@pytest.mark.parametrize("persist", [None, 0])
def test_a_zero3_rank_trains_and_keeps_torchs_linear(tmp_path, persist):
    """Also: the default keeps the small tensors whole (actor_train.zero3_persist_elements),
    ``--persist 0`` none."""
    entry = zero3_tiny_step(tmp_path, *([] if persist is None else ["--persist", str(persist)]))
    assert entry["zero_stage"] == 3 and entry["seconds"] > 0
    assert entry["functional_linear_is_torch"] is True
    # DeepSpeed's fetch and release of each decoder layer read the listing made at setup: no
    # step walks the PEFT modules inside a layer (before: 4 walks per layer per micro-batch)
    assert entry["leaf_walks_per_step"] == 0
    if persist == 0:
        assert entry["persistent_elements_rank0"] == 0
    else:  # every tensor of the tiny shape is under 100k elements: all kept whole, each
        # beside its own partition (one rank: the whole again)
        assert entry["persistent_elements_rank0"] > 0
        assert 2 * entry["persistent_elements_rank0"] == entry["resident_params_rank0"]


@pytest.mark.parametrize("live", [None, 1000])
def test_a_zero3_step_holds_one_decoder_layer_when_the_base_exceeds_the_live_budget(tmp_path,
                                                                                   live):
    """A base larger than the live budget (``--live``: 1000 elements here) has each layer's
    weights released after its forward and after its backward, in every micro-batch, and a
    release frees them: an 8-layer base with nothing kept whole never has more than ~2 layers
    in memory, counting the released weights' data that autograd still holds. Before, torch's
    linear saved a view of each gathered weight and kept it alive until the backward (9.51
    layers here: an 82.7 B base ran out of an H200's memory), and before that DeepSpeed's
    recorded trace kept every layer gathered. A base within the budget (the default, 1e9
    elements) stays gathered through the step: the fast path."""
    entry = zero3_tiny_step(tmp_path, "--layers", "8", "--persist", "0", "--rows", "4",
                            "--micro", "2", *([] if live is None else ["--live", str(live)]))
    assert entry["layers"] == 8 and entry["rows_per_rank"] == 4
    if live is None:
        assert entry["gathered_peak_layers_rank0"] >= 8, entry
    else:
        assert 1.0 <= entry["gathered_peak_layers_rank0"] <= 2.5, entry
