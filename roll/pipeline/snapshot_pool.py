"""Frozen copies of agents' adapters that opponents seats ('snapshot:<agent>@...') play."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from roll.agentic.env.seating import Seating, SeatSpec
from roll.models.peft_io import ADAPTER_WEIGHTS
from roll.multi_agent.model import MultiAgentLoRAModel
from roll.utils.checkpoint import agent_dir, checkpoints_root, step_dir_name


class SnapshotPool:
    """Frozen copies of agents' adapters (opponent pool), served as extra engine slots.

    A snapshot is taken at step 0 and at every checkpoint. 'snapshot:<agent>@latest' plays the
    newest one; '@N' the one of step N — from memory, or from the run's checkpoint folder of
    step N on disk — and, before step N exists, the newest one before it.

    Bounded: at most ``max_size`` snapshots per agent; the oldest go first, except the ones a
    seating names by step (``pinned``: for '@N', the newest snapshot at or before N). Each
    snapshot is written ONCE as a safetensors file, ``<folder>/<agent>/step_<N>.safetensors``;
    the trainer state holds only the steps (``state_dict``), so checkpoints and host memory stay
    flat in the number of saves. A dropped snapshot's file is deleted by ``flush`` — after the
    checkpoint that no longer lists it is written, so a crash in between leaves the previous
    checkpoint's snapshots on disk.
    """

    def __init__(self, model: MultiAgentLoRAModel, agents: set[str], checkpoints: Path,
                 folder: Path | None = None, max_size: int = 8,
                 pinned: dict[str, set[int]] | None = None) -> None:
        self.model = model
        self.agents = agents
        self.checkpoints = checkpoints
        self.folder = folder if folder is not None else checkpoints.parent / "snapshots"
        self.max_size = max_size
        self.pinned = {agent: set((pinned or {}).get(agent, ())) for agent in agents}
        self.snapshots: dict[str, dict[int, dict[str, torch.Tensor]]] = {a: {} for a in agents}
        self._dropped: list[Path] = []

    def file(self, agent: str, step: int) -> Path:
        return self.folder / agent / f"{step_dir_name(step)}.safetensors"

    def take(self, step: int, persist: bool = True) -> None:
        """Snapshot every pool agent now; ``persist`` also writes the files (not for a
        rollout-only evaluation)."""
        from safetensors.torch import save_file

        for agent in self.agents:
            tensors = self.model.export_adapter(agent)
            self.snapshots[agent][step] = tensors
            path = self.file(agent, step)
            if persist and not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
                os.replace(tmp, path)
            self._prune(agent)

    def _prune(self, agent: str) -> None:
        steps = sorted(self.snapshots[agent])
        keep = {max((s for s in steps if s <= n), default=None) for n in self.pinned[agent]}
        for step in steps:  # oldest first
            if len(self.snapshots[agent]) <= self.max_size:
                break
            if step not in keep:
                del self.snapshots[agent][step]
                self._dropped.append(self.file(agent, step))

    def flush(self) -> None:
        """Delete the files of dropped snapshots (call after the checkpoint is written)."""
        for path in self._dropped:
            path.unlink(missing_ok=True)
        self._dropped = []

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

        for weights in (self.file(agent, step),
                        agent_dir(self.checkpoints / step_dir_name(step), agent) / ADAPTER_WEIGHTS):
            if weights.is_file():
                self.snapshots[agent][step] = load_file(str(weights))
                return

    def state_dict(self) -> dict:
        """The steps of the snapshots held (their tensors are files, not state)."""
        return {"steps": {agent: sorted(steps) for agent, steps in self.snapshots.items()}}

    def load_state_dict(self, state: dict) -> None:
        # The config decides which agents have snapshots; a checkpoint may have more or fewer.
        if "snapshots" in state:  # checkpoints written before the pool was bounded
            saved = state["snapshots"]
            self.snapshots = {agent: dict(saved.get(agent, {})) for agent in self.agents}
            return
        self.snapshots = {agent: {} for agent in self.agents}
        for agent in self.agents:
            listed = {self.file(agent, int(step)) for step in state["steps"].get(agent, ())}
            # A file the state does not list was written after this checkpoint by a run that
            # stopped (a snapshot it dropped before its flush, or one of a later step, which
            # ``take`` would never overwrite): it goes, and the run takes what it needs again.
            for path in sorted((self.folder / agent).glob("step_*.safetensors")):
                if path not in listed:
                    path.unlink()
            for step in map(int, state["steps"].get(agent, ())):
                self._load_from_disk(agent, step)
                if step not in self.snapshots[agent]:
                    print(f"snapshot pool: the snapshot of {agent!r} at step {step} is gone "
                          f"({self.file(agent, step)}); continuing without it", flush=True)


def pool_for_seatings(model: MultiAgentLoRAModel, seatings: list[Seating], output_dir: Path,
                      max_size: int) -> tuple[SnapshotPool, int]:
    """The run's snapshot pool (the agents some seating plays a snapshot of, the steps a
    seating names pinned) and how many distinct snapshot specs the seatings hold (the engine's
    extra slots)."""
    seats = [spec for seating in seatings for spec in seating.seats if spec.kind == "snapshot"]
    pinned: dict[str, set[int]] = {}
    for seat in seats:
        if seat.snapshot_step is not None:
            pinned.setdefault(seat.agent_name, set()).add(seat.snapshot_step)
    pool = SnapshotPool(model, {seat.agent_name for seat in seats},
                        checkpoints_root(output_dir), output_dir / "snapshots", max_size, pinned)
    return pool, len({seat.raw for seat in seats})
