"""roll: multi-agent LoRA RL for LLMs (one frozen base model, one LoRA adapter per agent)."""

__version__ = "0.1.0"
