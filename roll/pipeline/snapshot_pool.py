"""Frozen copies of agents' adapters that opponents seats ('snapshot:<agent>@...') play."""

from __future__ import annotations

from pathlib import Path

import torch

from roll.agentic.env.seating import SeatSpec
from roll.models.peft_io import ADAPTER_WEIGHTS
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.utils.checkpoint import agent_dir, step_dir_name


class SnapshotPool:
    """Frozen copies of agents' adapters (opponent pool), served as extra engine slots.

    A snapshot is taken at step 0 and at every checkpoint, and saved with the trainer state.
    'snapshot:<agent>@latest' plays the newest one; '@N' the one of step N — from memory, or
    from the run's checkpoint folder of step N on disk — and, before step N exists, the
    newest one before it.
    """

    def __init__(self, model: MultiAgentLoRAModel, agents: set[str], checkpoints: Path) -> None:
        self.model = model
        self.agents = agents
        self.checkpoints = checkpoints
        self.snapshots: dict[str, dict[int, dict[str, torch.Tensor]]] = {a: {} for a in agents}

    def take(self, step: int) -> None:
        for agent in self.agents:
            self.snapshots[agent][step] = self.model.export_adapter(agent)

    def choose(self, spec: SeatSpec) -> tuple[str, int]:
        """(agent, step) of the snapshot that plays this seat."""
        agent, wanted = spec.agent_name, spec.snapshot_step
        if wanted is not None and wanted not in self.snapshots[agent]:
            self._load_from_disk(agent, wanted)
        steps = sorted(self.snapshots[agent])
        if wanted is not None:
            steps = [s for s in steps if s <= wanted] or steps[:1]
        if not steps:
            raise ValueError(f"seat_to_agent: {spec.raw!r}: no snapshot of {agent!r} exists")
        return agent, steps[-1]

    def _load_from_disk(self, agent: str, step: int) -> None:
        from safetensors.torch import load_file

        weights = agent_dir(self.checkpoints / step_dir_name(step), agent) / ADAPTER_WEIGHTS
        if weights.is_file():
            self.snapshots[agent][step] = load_file(str(weights))

    def state_dict(self) -> dict:
        return {"snapshots": self.snapshots}

    def load_state_dict(self, state: dict) -> None:
        # The config decides which agents have snapshots; a checkpoint may have more or fewer.
        saved = state["snapshots"]
        self.snapshots = {agent: dict(saved.get(agent, {})) for agent in self.agents}
