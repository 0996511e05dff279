"""Episode loop and scheduler: many envs in flight, one mixed-adapter generate call per turn."""

from roll.agentic.rollout.scheduler import (
    EpisodeResult,
    RolloutConfig,
    RolloutResult,
    RolloutScheduler,
    Turn,
)

__all__ = ["EpisodeResult", "RolloutConfig", "RolloutResult", "RolloutScheduler", "Turn"]
