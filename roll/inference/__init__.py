"""Generation engines behind one interface (base.py): ``hf`` (embedded, fused multi-LoRA)."""

from roll.inference.base import (
    GenerationOutput,
    GenerationRequest,
    InferenceEngine,
    SamplingParams,
    load_adapter_folder,
    push_adapters,
    serve,
)
from roll.inference.hf_engine import HFEngine

__all__ = [
    "GenerationOutput",
    "GenerationRequest",
    "HFEngine",
    "InferenceEngine",
    "SamplingParams",
    "load_adapter_folder",
    "push_adapters",
    "serve",
]
