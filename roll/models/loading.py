"""Load a causal LM and its tokenizer from a local folder or a hub id."""

from __future__ import annotations

import os
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """'float32' / 'bfloat16' / 'float16' (or a torch dtype) → torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _is_local(name_or_path: str | os.PathLike) -> bool:
    return Path(name_or_path).is_dir()


def load_tokenizer(name_or_path: str | os.PathLike):
    """Tokenizer with a pad token and a chat template, padding on the right.

    A tokenizer without a pad token gets its EOS token as pad (the attention mask, not the id,
    decides what counts). A tokenizer without a chat template is refused: every prompt in roll
    goes through the chat template so that instruct models see the format they were tuned on.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        str(name_or_path), local_files_only=_is_local(name_or_path)
    )
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer at {name_or_path} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer at {name_or_path} has no chat template; use an instruct/chat model"
        )
    tokenizer.padding_side = "right"
    return tokenizer


def use_tf32(device: str | torch.device, enabled: bool) -> None:
    """On a CUDA ``device``, set whether this process's float32 matmuls and convolutions may
    use TensorFloat-32; on any other device, change nothing."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def load_model(
    name_or_path: str | os.PathLike,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = "cpu",
    tf32: bool = True,
):
    """A causal LM in eval mode with frozen weights (the shared base of every agent).

    ``device`` None: the weights stay where loading put them (a ZeRO-3 partitioned load
    places each rank's partitions itself: roll/distributed/zero3_load.py).
    ``tf32``: on CUDA, let this process's float32 matmuls and convolutions use TensorFloat-32
    (inputs rounded to a 10-bit mantissa, fp32 accumulation; about 8x the fp32 matmul rate on
    an H100); false keeps full fp32 products. No effect on CPU or on bf16/fp16 weights."""
    from transformers import AutoModelForCausalLM

    if device is not None:
        use_tf32(device, tf32)

    model = AutoModelForCausalLM.from_pretrained(
        str(name_or_path),
        dtype=resolve_dtype(dtype),
        local_files_only=_is_local(name_or_path),
    )
    if device is not None:
        model.to(device)
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def apply_chat_template(
    tokenizer,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
) -> list[int]:
    """Token ids of a chat (list of {'role', 'content'}) ready for generation.

    ``enable_thinking`` goes to chat templates that read it (Qwen3's: False closes the thinking
    block in the prompt, so the model answers at once); templates that do not mention it are
    rendered as they are. None leaves the template's own default (Qwen3: thinking on).
    """
    extra = {}
    if enable_thinking is not None and "enable_thinking" in (tokenizer.chat_template or ""):
        extra["enable_thinking"] = enable_thinking
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, **extra
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def prompt_ids(tokenizer, text: str, system_prompt: str | None = None,
               enable_thinking: bool | None = None) -> list[int]:
    """``text`` as the user message of a chat (after ``system_prompt``, if any), ready for
    generation: how every prompt of a rollout, an exploitability table and a length check is
    formatted."""
    messages = [{"role": "user", "content": text}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return apply_chat_template(tokenizer, messages, enable_thinking=enable_thinking)


def load_shape(name_or_path: str | os.PathLike, dtype: str | torch.dtype = "float32"):
    """The causal LM of ``name_or_path`` built from its config alone, every weight on the meta
    device (no storage, nothing read but the config): its module tree, names and shapes, for a
    process that never runs the base (a Ray controller's adapter store, validation). Frozen and
    in eval mode, as ``load_model``'s."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(name_or_path), local_files_only=_is_local(name_or_path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=resolve_dtype(dtype))
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def linear_module_names(name_or_path: str | os.PathLike) -> set[str]:
    """Short names of the model's nn.Linear modules (e.g. 'q_proj'), read without weights.

    The model is only a shape (``load_shape``), so this is cheap even for an 8B model and is
    used to validate LoRA target modules before anything loads.
    """
    model = load_shape(name_or_path)
    return {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name != "lm_head"
    }
