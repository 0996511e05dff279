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


def test_a_compile_after_the_first_block_of_its_kind_is_counted_and_said(capsys):
    """CompileWatch: the first block of a kind compiles in silence (warm-up), a later block
    that compiles (here a new dtype: a guard fails) says so in one line naming who and where,
    and one that reuses its graphs counts 0 and says nothing."""
    from roll.utils.recompiles import CompileWatch

    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager")
    watch = CompileWatch("train rank 1")
    with watch.watch("train", "train step 1"):
        double(torch.ones(3))
    assert watch.last == 1 and "graph(s)" not in capsys.readouterr().out
    with watch.watch("train", "train step 2"):
        double(torch.ones(3))
    assert watch.last == 0 and "graph(s)" not in capsys.readouterr().out
    with watch.watch("train", "train step 3"):
        double(torch.ones(3, dtype=torch.float64))
    lines = [line for line in capsys.readouterr().out.splitlines() if "graph(s)" in line]
    assert watch.last == 1 and len(lines) == 1
    assert lines[0].split("] ", 1)[1].startswith(
        "train rank 1: torch.compile built 1 new graph(s) in train step 3 ")
    with watch.watch("logprobs", "the log-prob passes of step 3"):  # a new kind: silent
        torch.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    assert watch.last == 1 and "graph(s)" not in capsys.readouterr().out
