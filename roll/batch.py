"""The one batch type of the pipeline: one row per agent turn.

A row holds one prompt (what the acting agent saw) followed by that agent's response (the
tokens it generated, thinking included), right-padded to a common length ``T``. Rows of one
trajectory — the turns one seat took in one episode — share ``env_id`` and ``seat`` and are
ordered by ``turn``. ``group_id`` ties together episodes that started from the same seed/prompt
(GRPO groups). ``agent_id`` names which adapter produced (and is trained on) the row.

Per-token tensors are aligned with ``input_ids``: position ``t`` of ``logprobs`` is the
log-probability of token ``input_ids[:, t]`` given the tokens before it; position 0 is never a
response token, so it never counts.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from roll.utils.transfer import to_device


@dataclass
class TrajectoryBatch:
    """Rows of agent turns. Shapes: ``B`` rows, ``T`` tokens."""

    input_ids: Tensor
    """(B, T) long. Prompt then response, right-padded."""
    attention_mask: Tensor
    """(B, T) long/bool. 1 on real tokens (prompt and response), 0 on padding."""
    response_mask: Tensor
    """(B, T) float. 1 on the tokens the agent generated (the only tokens any loss counts)."""
    agent_id: Tensor
    """(B,) long. Index of the agent (adapter) that acted in this row."""
    rewards: Tensor | None = None
    """(B,) float. Reward this seat received for this turn (turn-level reward)."""
    env_id: Tensor | None = None
    """(B,) long. Episode the row belongs to (unique per episode within a batch)."""
    seat: Tensor | None = None
    """(B,) long. Seat (player or role index) that acted."""
    group_id: Tensor | None = None
    """(B,) long. Episodes sharing a seed/prompt share a group id (GRPO groups)."""
    turn: Tensor | None = None
    """(B,) long. Index of this turn within its trajectory (0, 1, ...)."""
    truncated: Tensor | None = None
    """(B,) bool. The row's episode was cut before the game ended (``rollout.max_turns``, or a
    prompt longer than ``rollout.max_prompt_tokens``): its returns are not a game's result."""
    engine_logprobs: Tensor | None = None
    """(B, T) float. Log-probs the rollout engine reported for the tokens it sampled (written
    by the rollout; compared with ``old_logprobs`` as a check that the engine served the
    trainer's weights, ``rollout/engine_logprob_gap``)."""
    old_logprobs: Tensor | None = None
    """(B, T) float. Log-probs under the policy that generated the rows (behaviour policy),
    from the trainer's own forward, so PPO ratios start at exactly 1."""
    old_move_logprobs: Tensor | None = None
    """(B, T) float. Under ``trainer.policy_over=moves``: the behaviour policy's log-probs of
    the policy constrained decoding plays (renormalised over the legal tokens at a branching
    point, 0 at a forced token; ``algorithms.choices.move_logprobs``), same forward as
    ``old_logprobs``."""
    ref_logprobs: Tensor | None = None
    """(B, T) float. Log-probs under the reference policy (base model, adapters off)."""
    values: Tensor | None = None
    """(B, T) float. Value estimates per token (for GAE)."""
    advantages: Tensor | None = None
    """(B, T) float. Per-token advantages (zero outside ``response_mask``)."""
    returns: Tensor | None = None
    """(B, T) float. Per-token returns (targets for a value head, when there is one)."""
    critic_input_ids: Tensor | None = None
    """(B, T') long. What a centralised critic reads (``critic.input=global``): the row's
    global view, then the SAME response tokens, right-padded; None: the critic reads
    ``input_ids``. ``values``/``returns`` stay in the (B, T) layout."""
    critic_attention_mask: Tensor | None = None
    """(B, T') long. 1 on the real tokens of ``critic_input_ids``."""
    critic_response_mask: Tensor | None = None
    """(B, T') float. 1 on the response tokens of ``critic_input_ids`` (as many per row as
    ``response_mask`` has)."""
    choice_tokens: Tensor | None = None
    """(B, T, C) long. Constrained rows: at each response position ``t`` where decoding chose
    among two or more legal tokens (a branching point of the legal answers' prefix tree), those
    tokens (``input_ids[:, t]`` is one of them); -1 elsewhere and as padding. The policy over
    legal moves is the product of the renormalised next-token distributions at these points
    (``roll.algorithms.choices``)."""
    choice_leaves: Tensor | None = None
    """(B, T, C) float. How many legal answers lie below each of ``choice_tokens`` (0 on
    padding): the uniform policy over legal moves, as next-token distributions."""
    magnet_logprobs: Tensor | None = None
    """(B, T, C) float. The magnet policy's log-probs of ``choice_tokens`` (renormalised over
    each point's legal tokens; written by the pipeline when ``trainer.magnet_coef`` > 0)."""

    def __post_init__(self) -> None:
        if self.input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (B, T), got shape {tuple(self.input_ids.shape)}")
        rows = self.input_ids.shape[0]
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and value.shape[0] != rows:
                raise ValueError(
                    f"TrajectoryBatch.{f.name} has {value.shape[0]} rows, input_ids has {rows}"
                )

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: Tensor) -> TrajectoryBatch:
        """Rows picked by a long index tensor or a bool mask, as a new batch."""
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            picked[f.name] = None if value is None else value[index]
        return TrajectoryBatch(**picked)

    def with_fields(self, **updates: Tensor | None) -> TrajectoryBatch:
        """A copy with some fields replaced."""
        return replace(self, **updates)

    def to(self, device: torch.device | str) -> TrajectoryBatch:
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            # a host batch goes up through pinned memory: the host does not wait for the GPU
            moved[f.name] = None if value is None else to_device(value, device)
        return TrajectoryBatch(**moved)

    def require(self, *names: str) -> None:
        """Raise a clear error if any of the named fields is missing."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(f"TrajectoryBatch is missing field(s) {missing}")
