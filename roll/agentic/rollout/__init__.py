"""Episode loop and scheduler: many envs in flight, turns batched continuously across agents."""

from roll.agentic.rollout.results import EpisodeResult, RolloutResult, Turn
from roll.agentic.rollout.scheduler import RolloutConfig, RolloutScheduler

__all__ = ["EpisodeResult", "RolloutConfig", "RolloutResult", "RolloutScheduler", "Turn"]
