"""benchmarks/fault_campaign.py: a run with critics and snapshot opponents killed with SIGKILL
in its start-up and mid-training, resumed each time, ends with every checkpoint (agents',
critics' adapters) and every snapshot file bitwise equal to an uninterrupted run's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fault_campaign  # noqa: E402

# its kill moments are drawn from the uninterrupted run's step times: run alone (the README's
# test command runs the `serial` tests after the parallel ones), never beside another test
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def test_kills_at_random_moments_lose_nothing_and_resume_bit_exactly(tmp_path):
    summary = fault_campaign.campaign(kill_count=4, steps=10, seed=0, where=str(tmp_path))
    assert summary["kills"] == 4  # every kill came before the run's end
    assert [kill["during"] for kill in summary["kill_moments"]] == ["training"] * 3 + ["start-up"]
    assert summary["checkpoints_lost"] == []
    assert summary["checkpoints_compared"] == 10
    # agents and per-agent critics (two each), every LoRA tensor of them
    assert summary["tensors_per_checkpoint"] > 0
    assert summary["checkpoints_differing"] == []
    assert summary["snapshot_files_bitwise_equal"]
    assert summary["every_checkpoint_bitwise_equal"]
