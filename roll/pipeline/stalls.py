"""A line when an agent has nothing to learn, and the likeliest reason.

An agent whose rows all have advantage 0 (``<agent>/zero_adv_fraction`` 1) gets no gradient:
its adapter stands still while the run goes on. On a dashboard that is one flat curve among
many; on the console ``StallWatch`` says it once, after ``STALL_STEPS`` such steps in a row,
with the reason the same step's metrics point to:

- no answer parsed (``format_error_rate`` 1): the model cannot answer the prompt in free
  text, e.g. the tiny model on a free-text game;
- (near) deterministic play (entropy under ``DETERMINISTIC_NATS``): every game of a group
  plays alike, the collapse of issue 30;
- otherwise the returns of each group were equal (a reward that does not separate them).
"""

from __future__ import annotations

from collections.abc import Sequence

STALL_STEPS = 3
"""Steps in a row with every row of an agent at advantage 0 before the line is printed."""
DETERMINISTIC_NATS = 0.05
"""Entropy (legal-move entropy where answers are constrained, else per token) under which an
agent's play counts as deterministic."""


def stall_reason(agent: str, metrics: dict[str, float]) -> str:
    """Why ``agent``'s rows had advantage 0, read off one step's metrics, and what to try."""
    format_errors = metrics.get(f"{agent}/format_error_rate")
    if format_errors is not None and format_errors >= 0.99:
        return (f"no answer parsed (format_error_rate {format_errors:.2f}): constrain the answers "
                "(rollout.constrained_decoding=true) or use a model that can answer this prompt")
    for name in ("action_entropy", "entropy"):
        entropy = metrics.get(f"{agent}/{name}")
        if entropy is not None:
            break
    if entropy is not None and entropy < DETERMINISTIC_NATS:
        return (f"its play is deterministic ({name} {entropy:.3f} nats), so the games of a "
                "group end alike: an entropy bonus (trainer.action_entropy_coef, "
                "trainer.entropy_coef) or a magnet (trainer.magnet_coef)")
    return ("the episodes of every group ended with equal returns: independent deals "
            "(rollout.shared_deals=false), larger groups (rollout.group_size) or a running "
            "baseline (advantage.estimator=rae)")


class StallWatch:
    """Counts, per agent, the steps in a row in which every row had advantage 0; ``observe``
    returns the lines to print (one per agent per run, when its count reaches ``steps``). A
    step in which an agent had no rows (no ``zero_adv_fraction``) neither counts nor resets."""

    def __init__(self, agent_names: Sequence[str], steps: int = STALL_STEPS) -> None:
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self.steps = steps
        self.in_a_row = dict.fromkeys(agent_names, 0)
        self.said: set[str] = set()

    def observe(self, metrics: dict[str, float], step: int) -> list[str]:
        lines = []
        for agent in self.in_a_row:
            share = metrics.get(f"{agent}/zero_adv_fraction")
            if share is None:
                continue
            self.in_a_row[agent] = self.in_a_row[agent] + 1 if share >= 1.0 else 0
            if self.in_a_row[agent] >= self.steps and agent not in self.said:
                self.said.add(agent)
                lines.append(
                    f"{agent} has nothing to learn: every one of its rows had advantage 0 in "
                    f"the {self.steps} steps to step {step} (no gradient); "
                    f"{stall_reason(agent, metrics)} (said once; "
                    f"{agent}/zero_adv_fraction on the dashboard)")
        return lines


__all__ = ["DETERMINISTIC_NATS", "STALL_STEPS", "StallWatch", "stall_reason"]
