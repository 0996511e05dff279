"""The frozen base projections under ZeRO-3 save their weights, not views of them
(roll/distributed/zero3_memory.py), so that a released weight's memory is freed; numbers by
hand. The whole ZeRO-3 step with it: tests/benchmarks/test_train_data_parallel.py."""

from __future__ import annotations

import torch
from torch import nn

from roll.distributed.zero3_memory import (
    DEEPSPEED_MAX_LIVE,
    FrozenWeightLinear,
    base_stays_gathered,
    save_weights_not_views,
)


def _saved(fn) -> list[torch.Tensor]:
    """The tensors autograd saves for the backward while ``fn()`` runs; ``fn()``'s result."""
    saved: list[torch.Tensor] = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn()
    return saved, out


def test_the_output_and_the_input_gradient_by_hand():
    # x = [1, 2], W = [[1, 0], [2, 3]], b = [0.5, -1]: y = x W^T + b = [1.5, 7];
    # dy = [1, 1]: dx = dy W = [3, 3]
    x = torch.tensor([[1.0, 2.0]], requires_grad=True)
    weight = nn.Parameter(torch.tensor([[1.0, 0.0], [2.0, 3.0]]), requires_grad=False)
    bias = nn.Parameter(torch.tensor([0.5, -1.0]), requires_grad=False)
    y = FrozenWeightLinear.apply(x, weight, bias)
    assert torch.equal(y, torch.tensor([[1.5, 7.0]]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.tensor([[3.0, 3.0]]))


def test_only_the_parameter_is_saved_so_a_release_frees_its_data():
    """torch's linear saves ``W.t()``, a view that keeps W's data alive after ZeRO-3 points W
    at an empty tensor; ours saves W itself, and nothing of the input."""
    x = torch.randn(3, 4, 8, requires_grad=True)
    weight = nn.Parameter(torch.randn(16, 8), requires_grad=False)
    data = weight.data.untyped_storage().data_ptr()
    saved, _ = _saved(lambda: torch.nn.functional.linear(x, weight))
    assert [t is weight for t in saved] == [False]  # torch's: a view sharing the data
    assert saved[0].untyped_storage().data_ptr() == data
    saved, y = _saved(lambda: FrozenWeightLinear.apply(x, weight, None))
    assert len(saved) == 1 and saved[0] is weight
    expected = torch.autograd.grad(torch.nn.functional.linear(x, weight).square().sum(), x)[0]
    (ours,) = torch.autograd.grad(y.square().sum(), x, retain_graph=True)
    torch.testing.assert_close(ours, expected)
    weight.data = torch.empty(0)  # what a ZeRO-3 release does: the saved tensor follows
    assert saved[0].numel() == 0


def test_only_frozen_linears_are_switched_and_no_grad_passes_stay_torchs():
    frozen, trained = nn.Linear(4, 4), nn.Linear(4, 2)
    frozen.requires_grad_(False)
    model = nn.Sequential(frozen, nn.ReLU(), trained)
    assert save_weights_not_views(model) == 1
    assert "forward" in vars(frozen) and "forward" not in vars(trained)
    x = torch.randn(2, 4, requires_grad=True)
    saved, out = _saved(lambda: model(x))
    assert any(t is frozen.weight for t in saved)
    with torch.no_grad():
        torch.testing.assert_close(model(x), out.detach())
    plain = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    plain.load_state_dict(model.state_dict())
    torch.testing.assert_close(plain(x), out)


def test_a_base_stays_gathered_only_within_the_live_budget():
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))  # 220 elements
    model[0].requires_grad_(False)  # the frozen "base": 110 elements
    assert base_stays_gathered(model, None)  # DeepSpeed's default budget, 1e9
    assert DEEPSPEED_MAX_LIVE == 1_000_000_000
    assert base_stays_gathered(model, 110) and not base_stays_gathered(model, 109)
