"""A team on a base that is only a shape: its weights on the meta device, no storage.

``roll.models.load_shape`` builds such a base from the config alone. PEFT puts every LoRA tensor
it injects beside its base weight, on the meta device too; ``adapters_on_cpu`` gives them CPU
storage (zeros until real tensors are imported), so the team can export, import, save and load
its adapters while every forward runs elsewhere (a Ray controller's store: the train ranks and
engine actors hold the weights).
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def adapters_on_cpu(lora_layers: list[tuple[str, nn.Module]]) -> None:
    """Every adapter tensor of these PEFT LoRA layers (path, layer) on CPU, zero."""
    for _, layer in lora_layers:
        for container_name in layer.adapter_layer_names:
            container = getattr(layer, container_name, None)
            if container is None:
                continue
            for name in list(container):
                entry = container[name]
                if isinstance(entry, nn.Parameter):
                    container[name] = nn.Parameter(torch.zeros(entry.shape, dtype=entry.dtype),
                                                   requires_grad=entry.requires_grad)
                else:
                    entry.to_empty(device="cpu")
                    for param in entry.parameters():
                        param.zero_()
