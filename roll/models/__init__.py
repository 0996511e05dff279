"""Model loading, tokenizer and chat template, and the tiny offline model builder."""

from roll.models.aliases import MODEL_ALIASES, is_alias, resolve_model_path
from roll.models.loading import (
    apply_chat_template,
    linear_module_names,
    load_model,
    load_shape,
    load_tokenizer,
    resolve_dtype,
)
from roll.models.tiny import TinyModelSpec, build_tiny_model, default_cache_dir

__all__ = [
    "MODEL_ALIASES",
    "TinyModelSpec",
    "apply_chat_template",
    "build_tiny_model",
    "default_cache_dir",
    "is_alias",
    "linear_module_names",
    "load_model",
    "load_shape",
    "load_tokenizer",
    "resolve_dtype",
    "resolve_model_path",
]
