"""What vLLM cannot run, found without importing vLLM (config validation calls these before any
model loads; ``VLLMEngine`` calls them again for engines built directly)."""

from __future__ import annotations


def lora_warmup_error(vocab_size: int, hidden_size: int, vllm_version: str,
                      cuda_graphs: bool) -> str | None:
    """Why vLLM cannot start this model with LoRA, or None. vLLM 0.26 captures its CUDA graphs
    with a dummy adapter whose LM-head part it shapes (hidden, rank) where (vocab, rank)
    belongs; a model whose vocabulary is narrower than its hidden size then fails inside the
    engine's start ("The size of tensor a (611) must match the size of tensor b (1024)", a
    random-weight 0.6B shape with the tiny tokenizer on an H200). vLLM 0.32 (the CPU build
    here) shapes it right; real models' vocabularies are far wider than their hidden size."""
    major, minor = (int(part) for part in vllm_version.split(".")[:2])
    if cuda_graphs and (major, minor) < (0, 32) and vocab_size < hidden_size:
        return (f"vLLM {vllm_version} cannot capture CUDA graphs with LoRA for a model whose "
                f"vocabulary ({vocab_size}) is narrower than its hidden size ({hidden_size}): "
                f"pad the embedding (vocab_size >= hidden_size) or set "
                f"rollout.vllm.enforce_eager=true")
    return None


def model_lora_warmup_error(model_path: str, vllm_version: str, cuda_graphs: bool) -> str | None:
    """``lora_warmup_error`` for the model folder or hub id ``model_path`` (its config.json
    read, no weights)."""
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(str(model_path)).get_text_config()
    return lora_warmup_error(text.vocab_size, text.hidden_size, vllm_version, cuda_graphs)
