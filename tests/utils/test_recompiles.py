"""A hit of torch.compile's recompile limit inside our guarded code prints our own line and is
counted; outside the block torch's own limit is back and nothing of ours listens."""

from __future__ import annotations

import logging
import re

import torch

from roll.utils import recompiles


def _scaled(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_a_recompile_past_the_limit_is_reported_with_the_function(monkeypatch, capsys):
    torch._dynamo.reset()
    monkeypatch.setattr(recompiles, "RECOMPILE_LIMIT", 2)
    compiled = torch.compile(_scaled, backend="eager", dynamic=False)
    before = recompiles.limit_hits
    with recompiles.recompile_guard("trainer"):
        for size in (2, 3):  # two variants: within the limit
            assert torch.equal(compiled(torch.ones(size)), torch.full((size,), 3.0))
        assert recompiles.limit_hits == before
        assert "recompile limit" not in capsys.readouterr().out
        out = compiled(torch.ones(4))  # a third shape: past the limit, runs uncompiled
    assert torch.equal(out, torch.full((4,), 3.0))  # same numbers
    assert recompiles.limit_hits == before + 1
    printed = capsys.readouterr().out
    assert re.search(r"\[\d\d:\d\d:\d\d\] trainer: torch.compile hit its recompile limit for "
                     r"'_scaled' \(.*test_recompiles.py:\d+\); new kinds of input to it now run "
                     r"uncompiled", printed), printed
    # the guard is gone after the block: torch's own limit, no handler of ours
    assert torch._dynamo.config.recompile_limit == 8
    assert not any(isinstance(h, recompiles._LimitReport)
                   for h in logging.getLogger("torch._dynamo").handlers)
    torch._dynamo.reset()
