"""The standard PEFT adapter folder: the interchange format of every agent (DESIGN.md inv. 4)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from torch import Tensor

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def write_peft_folder(
    directory: str | os.PathLike, tensors: dict[str, Tensor], lora_config
) -> Path:
    """Write ``adapter_model.safetensors`` + ``adapter_config.json`` that stock
    ``peft.PeftModel.from_pretrained`` and vLLM ``--lora-modules`` load unchanged.

    ``tensors`` use PEFT's on-disk key names (no adapter name); ``lora_config`` is a peft
    ``LoraConfig``.
    """
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    weights = {key: value.detach().to("cpu").contiguous() for key, value in tensors.items()}
    save_file(weights, str(directory / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = lora_config.to_dict()
    config["target_modules"] = sorted(config["target_modules"])
    (directory / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, default=list))
    return directory
