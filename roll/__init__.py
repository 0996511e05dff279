"""roll: multi-agent LoRA reinforcement learning for LLMs (one frozen base, one adapter per agent)."""

__version__ = "0.1.0"
