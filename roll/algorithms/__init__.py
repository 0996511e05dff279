"""Pure functions of RL for LLM agents: advantage estimators, normalisation, losses.

No model code lives here. Where is "the advantage for agent 2's tokens" computed?
``compute_advantages`` (advantages.py) runs the estimator named in ``AdvantageConfig`` over the
whole batch, then normalises per agent (normalize.py); losses.py turns advantages into losses.
"""

from roll.algorithms.advantages import (
    AdvantageConfig,
    AdvantageFn,
    RunningBaselines,
    compute_advantages,
    gae,
    get_advantage_estimator,
    grpo,
    happo,
    ippo,
    magrpo,
    mappo,
    rae,
    register_advantage,
    reinforce,
    vdn,
)
from roll.algorithms.happo_ratios import episode_log_ratio, happo_factors, happo_order
from roll.algorithms.losses import (
    aggregate,
    entropy_from_logits,
    entropy_loss,
    kl_loss,
    kl_penalized_rewards,
    kl_per_token,
    ppo_policy_loss,
    value_loss,
)
from roll.algorithms.normalize import normalization_keys, normalize_advantages

__all__ = [
    "AdvantageConfig",
    "AdvantageFn",
    "RunningBaselines",
    "aggregate",
    "compute_advantages",
    "entropy_from_logits",
    "entropy_loss",
    "episode_log_ratio",
    "gae",
    "get_advantage_estimator",
    "grpo",
    "happo",
    "happo_factors",
    "happo_order",
    "ippo",
    "magrpo",
    "rae",
    "mappo",
    "kl_loss",
    "kl_penalized_rewards",
    "kl_per_token",
    "normalization_keys",
    "normalize_advantages",
    "ppo_policy_loss",
    "register_advantage",
    "reinforce",
    "value_loss",
    "vdn",
]
