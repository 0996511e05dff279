"""benchmarks/rollout_throughput.py --vllm on the tiny model (real vLLM, CPU build): vLLM's rows
are timed in the same rounds as ours (issue 33's side-by-side: interleaved, medians and every
round), their log-probs equal the trainer's, the per-round ratio is each round's own, and the
decode steps are timed apart from the prefill."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~20 s: a vLLM engine starts
ROOT = Path(__file__).resolve().parents[2]


def test_vllm_rows_are_timed_in_the_same_rounds_as_ours(tmp_path):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/rollout_throughput.py"), "--tiny", "--vllm",
         "--skip-stock", "--compiled-only", "--rounds", "3", "--batches", "4"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT), "OUT": str(tmp_path),
                          "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "rollout_throughput.json").read_text())
    assert result["vllm"]["engine_start_s"] > 0
    row = result["results"]["batch_4"]
    for name in ("vllm_mixed", "vllm_no_lora"):
        assert len(row[name]["tok_s_rounds"]) == 3 and row[name]["tok_s"] > 0
    # the same 4 adapters through vLLM: its log-probs are the trainer's (fp32 on CPU)
    assert row["vllm_mixed"]["logprob_vs_trainer"]["max_abs"] < 1e-4
    ratio = row["vllm_mixed_over_no_lora"]
    expected = [a / b for a, b in zip(row["vllm_mixed"]["tok_s_rounds"],
                                      row["vllm_no_lora"]["tok_s_rounds"], strict=True)]
    assert ratio["rounds"] == pytest.approx(expected, abs=2e-3)
    assert ratio["median_of_rounds"] == pytest.approx(sorted(expected)[1], abs=2e-3)
    # the decode steps alone: each round also timed a one-token call (prefill + first token)
    for name in ("vllm_mixed", "vllm_no_lora"):  # (ours is timed in rounds on CUDA only)
        figures = row[name]
        decoded = 4 * (result["new_tokens"] - 1)  # 4 rows, the first token of each excluded
        assert 0 < figures["first_token_s"] < figures["seconds"]
        assert figures["decode_tok_s"] == pytest.approx(
            decoded / (figures["seconds"] - figures["first_token_s"]), rel=1e-9)
