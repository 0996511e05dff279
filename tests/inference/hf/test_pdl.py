"""roll/inference/hf/pdl.py: programmatic dependent launch is asked for only where it can hold
(``ROLL_TRITON_PDL=1`` and a CUDA device of compute capability 9 or more), never on a CPU."""

from __future__ import annotations

import pytest
import torch

from roll.inference.hf.pdl import launch_options, pdl_on, pdl_wanted


@pytest.mark.parametrize("flag", [None, "0", "1"])
def test_pdl_is_never_asked_for_on_a_cpu(monkeypatch, flag):
    if flag is None:
        monkeypatch.delenv("ROLL_TRITON_PDL", raising=False)
    else:
        monkeypatch.setenv("ROLL_TRITON_PDL", flag)
    assert pdl_on(torch.zeros(1)) is False
    assert launch_options(pdl_on(torch.zeros(1))) == {}


@pytest.mark.parametrize(("flag", "device_type", "major", "want"), [
    ("1", "cuda", 9, True),     # Hopper, asked
    ("1", "cuda", 10, True),    # Blackwell, asked
    (None, "cuda", 9, False),   # unset: off (the default; no gain measured)
    ("", "cuda", 9, False),     # an empty value counts as unset
    ("0", "cuda", 9, False),
    ("1", "cuda", 8, False),    # Ampere has no PDL, even when asked
    ("1", "cpu", None, False),
])
def test_pdl_only_when_asked_and_on_hopper_or_later(flag, device_type, major, want):
    assert pdl_wanted(flag, device_type, major) is want


def test_a_misspelt_flag_is_refused_by_name():
    with pytest.raises(ValueError, match=r"ROLL_TRITON_PDL='yes'"):
        pdl_wanted("yes", "cuda", 9)


def test_the_launch_keyword_is_tritons():
    assert launch_options(True) == {"launch_pdl": True} and launch_options(False) == {}
