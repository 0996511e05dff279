"""A base model loaded straight into ZeRO-3 partitions: no rank ever holds it whole.

Why: a base larger than one GPU cannot be loaded whole on each rank and partitioned afterwards
(the peak per GPU would be the whole base, and host memory would hold k copies). Here each
module is partitioned over the ranks as soon as it is built (DeepSpeed's ``zero.Init``, entered
by transformers' ``from_pretrained`` while an ``HfDeepSpeedConfig`` of stage 3 is alive), and
the checkpoint is copied in one module at a time: that module's weights gathered, rank 0 copies
the checkpoint's values into them, and they are partitioned again on exit (transformers'
ZeRO-3 loading). A rank's peak is then its partition of the base plus one module gathered.

The adapters are injected after this, as before (the LoRA tensors are built whole, on every
rank from the same seed), and ``deepspeed.initialize`` partitions them beside the base
(roll/distributed/deepspeed_strategy.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from roll.models.loading import load_model, resolve_dtype, use_tf32


@contextmanager
def partitioned_construction(dtype: str, device: str) -> Iterator[None]:
    """While inside, every transformers model built (``from_pretrained`` or ``from_config``)
    is partitioned over the ranks of the (already initialised) torch.distributed group module
    by module as it is built, in ``dtype``, on this rank's ``device``; a ``from_config``
    model keeps its random initialisation (benchmarks of shapes without a checkpoint)."""
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("LOCAL_RANK", "0")  # each rank sees one device (cuda:0 in Ray)
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    from roll.distributed.deepspeed_strategy import deepspeed_config

    deepspeed.init_distributed(dist_backend="gloo" if device == "cpu" else "nccl")
    config = deepspeed_config(3)
    # zero.Init builds the weights in the precision its config names (fp32 unless bf16/fp16
    # is enabled there): the base's own dtype, so nothing is upcast while it loads.
    precision = resolve_dtype(dtype)
    config["bf16"] = {"enabled": precision == torch.bfloat16}
    config["fp16"] = {"enabled": precision == torch.float16}
    # transformers reads this through a weak reference: it must stay alive while loading.
    zero3 = HfDeepSpeedConfig(config)
    try:
        yield
    finally:
        del zero3


def load_partitioned(path: str, dtype: str, device: str, tf32: bool = True) -> nn.Module:
    """The frozen base of ``path`` in eval mode, each parameter partitioned over the ranks of
    the (already initialised) torch.distributed group, on this rank's ``device``."""
    use_tf32(device, tf32)
    with partitioned_construction(dtype, device):
        return load_model(path, dtype=dtype, device=None)


__all__ = ["load_partitioned", "partitioned_construction"]
