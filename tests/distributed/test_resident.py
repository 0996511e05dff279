"""The parameter-elements meter (roll/distributed/resident.py), counted by hand."""

from __future__ import annotations

import torch
from torch import nn

from roll.distributed.resident import ResidentPeak, resident, resident_elements


class Widening(nn.Module):
    """A layer that, during its forward, holds a temporary 10x10 weight as a parameter (as
    ZeRO-3 holds a gathered weight) and drops it before returning."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x):
        self.extra = nn.Parameter(torch.ones(10, 10))
        out = x * self.weight + self.extra.sum()
        inner = nn.Identity()  # a module call while the extra weight is held
        out = inner(out)
        del self.extra
        return out


def test_peak_counts_parameters_built_and_held_during_forwards():
    meter = ResidentPeak()
    with meter.recording():
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # 4*3+3 + 3*2+2 = 23
        assert meter.peak == 23 and meter.census() == 23
        widening = Widening()  # + 3
        assert meter.census() == 26
        widening(torch.zeros(3))
    # the forward held 100 more elements for a moment; they are gone now
    assert meter.peak == 126
    assert meter.census() == 26 == resident_elements(model) + resident_elements(widening)
    # after recording, nothing is sampled any more
    widening(torch.zeros(3))
    assert meter.peak == 126


def test_a_tied_weight_counts_once_and_a_partition_adds_its_shard():
    meter = ResidentPeak()
    with meter.recording():
        embed = nn.Embedding(5, 2)
        head = nn.Linear(2, 5, bias=False)
        head.weight = embed.weight  # registered twice, one tensor
    assert meter.census() == 10
    shard = torch.ones(7)
    embed.weight.ds_tensor = shard  # a ZeRO-3 partition beside the (here still whole) data
    assert resident(embed.weight) == 17
    embed.weight.data = torch.empty(0)  # released: only the partition stays
    assert resident(embed.weight) == 7 and meter.census() == 7
