"""roll/inference/hf/pdl.py: programmatic dependent launch is asked for only where it can hold
(``ROLL_TRITON_PDL=1`` and a CUDA device of compute capability 9 or more), never on a CPU."""

from __future__ import annotations

import pytest
import torch

from roll.inference.hf.pdl import launch_options, pdl_on


@pytest.mark.parametrize("flag", [None, "0", "1"])
def test_pdl_is_never_asked_for_on_a_cpu(monkeypatch, flag):
    if flag is None:
        monkeypatch.delenv("ROLL_TRITON_PDL", raising=False)
    else:
        monkeypatch.setenv("ROLL_TRITON_PDL", flag)
    assert pdl_on(torch.zeros(1)) is False
    assert launch_options(pdl_on(torch.zeros(1))) == {}


def test_the_launch_keyword_is_tritons():
    assert launch_options(True) == {"launch_pdl": True} and launch_options(False) == {}
