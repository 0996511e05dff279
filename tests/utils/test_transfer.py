"""roll/utils/transfer.py: copies that do not wait for the device give the values a plain copy
gives (on CPU; on a GPU the difference is only when the host waits)."""

from __future__ import annotations

import torch

from roll.utils.transfer import host_copies, to_device, upload


def test_host_copies_are_equal_independent_and_keep_their_dtypes():
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    b = torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16)
    c = torch.arange(4, dtype=torch.float32)
    copies = host_copies([a, b, c])
    for original, copy in zip((a, b, c), copies, strict=True):
        assert copy.dtype == original.dtype and copy.shape == original.shape
        assert torch.equal(copy, original)
        assert copy.data_ptr() != original.data_ptr()
    # each its own storage (safetensors refuses tensors that share one)
    assert len({copy.untyped_storage().data_ptr() for copy in copies}) == 3
    copies[0][0, 0] = 100.0
    assert a[0, 0] == 0.0 and copies[2][0] == 0.0


def test_upload_and_to_device_give_the_values_on_the_device():
    moved = upload([3, 1, 2], torch.long, torch.device("cpu"))
    assert moved.dtype == torch.long and moved.tolist() == [3, 1, 2]
    x = torch.randn(3, 2)
    assert to_device(x, "cpu") is x  # already there: no copy
