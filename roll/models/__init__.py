"""Model loading, tokenizer and chat template, and the tiny offline model builder."""

from roll.models.loading import (
    apply_chat_template,
    linear_module_names,
    load_model,
    load_tokenizer,
    resolve_dtype,
)
from roll.models.tiny import TinyModelSpec, build_tiny_model, default_cache_dir

__all__ = [
    "TinyModelSpec",
    "apply_chat_template",
    "build_tiny_model",
    "default_cache_dir",
    "linear_module_names",
    "load_model",
    "load_tokenizer",
    "resolve_dtype",
]
