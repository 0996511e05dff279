"""Generation engines behind one interface (base.py): ``hf`` (embedded, fused multi-LoRA)."""

from roll.inference.base import (
    GenerationOutput,
    GenerationRequest,
    InferenceEngine,
    SamplingParams,
    load_adapter_folder,
    serve,
)
from roll.inference.hf.engine import HFEngine

__all__ = [
    "GenerationOutput",
    "GenerationRequest",
    "HFEngine",
    "InferenceEngine",
    "SamplingParams",
    "load_adapter_folder",
    "serve",
]
