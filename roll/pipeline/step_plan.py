"""Which step of a run does what: the training loop's schedule, worked out from the config
alone (no roles, no model), so that it reads, and is tested, by hand.

- ``saves_after(step)``: a checkpoint is written at the end of every ``save_steps``-th step and
  of the last one;
- ``scheduler_of(step)``: which train scheduler plays the step (``env.swap_roles_every``:
  blocks of that many steps alternate between the seatings and the same seatings with the two
  seats' players swapped);
- ``ahead_steps(step)``: the next steps whose episodes the step may start in its idle lanes
  (``rollout.lookahead``), none past a checkpoint and none played by another scheduler;
- ``overlapped_next(step)``: with ``rollout.overlap``, the next step's scheduler and its own
  ahead steps when the step starts the next rollout while it trains (not a step that saves,
  evaluates or ends the run), else None.
"""

from __future__ import annotations

from dataclasses import dataclass

from roll.pipeline.config import PipelineConfig


@dataclass(frozen=True)
class StepPlan:
    cfg: PipelineConfig

    @property
    def schedulers(self) -> int:
        """Train schedulers of the run: 2 with ``env.swap_roles_every``, else 1."""
        return 2 if self.cfg.env.swap_roles_every else 1

    def block_of(self, step: int) -> int:
        """The step's block of ``env.swap_roles_every`` steps (0-based; one step per block
        without swapping)."""
        return (step - 1) // max(1, self.cfg.env.swap_roles_every)

    def scheduler_of(self, step: int) -> int:
        return self.block_of(step) % self.schedulers

    def saves_after(self, step: int) -> bool:
        save_steps, max_steps = self.cfg.save_steps, self.cfg.max_steps
        return bool(save_steps and step % save_steps == 0) or step == max_steps

    def ahead_steps(self, step: int) -> list[int]:
        """Up to ``rollout.lookahead`` next steps, none past a checkpoint (a resumed run must be
        the run that was not interrupted: nothing is parked when one is written), none played
        by another scheduler."""
        steps: list[int] = []
        for later in range(step + 1, step + self.cfg.rollout.lookahead + 1):
            if self.saves_after(later - 1) or self.scheduler_of(later) != self.scheduler_of(step):
                break
            steps.append(later)
        return steps

    def starts_next(self, step: int) -> bool:
        """rollout.overlap: whether step ``step`` starts the next step's rollout."""
        cfg = self.cfg
        return bool(cfg.rollout.overlap and step < cfg.max_steps and not self.saves_after(step)
                    and not (cfg.eval.eval_steps and step % cfg.eval.eval_steps == 0))

    def overlapped_next(self, step: int) -> tuple[int, list[int]] | None:
        """(the next step's scheduler index, its ahead steps) when step ``step`` starts the next
        rollout (``starts_next``), else None."""
        if not self.starts_next(step):
            return None
        return self.scheduler_of(step + 1), self.ahead_steps(step + 1)
