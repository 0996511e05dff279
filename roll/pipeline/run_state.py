"""A run's checkpoint: what ``AgenticPipeline`` writes at ``save_steps`` and reads back on
``resume`` — each agent's PEFT adapter folder, the critics' and the magnet's folders, and the
trainer state (optimizers, schedulers, step, RNG, snapshot pool, data position, RAE baselines,
tracking run id; roll/utils/checkpoint.py writes and checks it)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from roll.errors import ConfigError
from roll.utils.checkpoint import (
    agent_dir,
    capture_rng_state,
    checkpoints_root,
    load_trainer_state,
    resolve_resume,
    restore_rng_state,
    save_checkpoint,
)

if TYPE_CHECKING:
    from roll.pipeline.agentic_pipeline import AgenticPipeline


def run_state(p: AgenticPipeline) -> dict:
    """The trainer state of the run now (adapters are saved beside it as PEFT folders)."""
    return {
        "step": p.step,
        "trainer": p.trainer.state_dict(),
        "rng": capture_rng_state(),
        "pool": p.pool.state_dict(),
        "seed": p.cfg.seed,
        "agent_names": p.agent_names,
        "tracking_run_id": p.run_id,
        "data": None if p.items is None else p.items.state_dict(),
        "critics": None if p.critics is None else p.critics.state_dict(),
        "baselines": None if p.baselines is None else p.baselines.state_dict(),
        "magnet": None if p.magnet is None else p.magnet.state_dict(),
    }


def save_run(p: AgenticPipeline) -> Path:
    """Write a checkpoint of the run at its step (the snapshot pool takes one first);
    returns its folder."""
    if p.pool.agents:
        p.pool.take(p.step)

    def save_agents(folder: Path) -> None:
        for name in p.agent_names:
            p.model.save_agent(name, folder / name)
        if p.critics is not None:
            p.critics.save(folder.parent)  # <checkpoint>/critics/<critic>/
        if p.magnet is not None:
            p.magnet.save(folder.parent, p.model)  # <checkpoint>/magnet/<agent>/

    path = save_checkpoint(p.output_dir, p.step, run_state(p), save_agents, p.cfg.keep_last)
    p.pool.flush()  # the dropped snapshots' files, now that no new checkpoint lists them
    return path


def resume_if_asked(p: AgenticPipeline) -> None:
    """Load the checkpoint ``resume`` names, if any (``latest`` with none yet: say so)."""
    path = resolve_resume(p.cfg.resume, p.output_dir)
    if path is not None:
        load_run(p, path)
    elif p.cfg.resume == "latest":
        print(f"resume=latest: no checkpoint in {checkpoints_root(p.output_dir)} yet; "
              "starting fresh", flush=True)


def load_run(p: AgenticPipeline, path: Path) -> None:
    """Put the run back where the checkpoint at ``path`` left it."""
    state = load_trainer_state(path)
    if sorted(state["agent_names"]) != sorted(p.agent_names):
        raise ValueError(
            f"resume={str(path)!r}: checkpoint agents {state['agent_names']} differ from "
            f"the config's {p.agent_names}"
        )
    for name in p.agent_names:
        try:
            p.model.load_agent(name, agent_dir(path, name))
        except ValueError as error:  # saved for another base (its layers or widths differ)
            raise ConfigError("resume", p.cfg.resume, f"{path}: {name}'s adapter does not fit "
                              f"this model ({p.cfg.model.path}): {error}") from None
        if p.engine.adapter_version(name) is not None:
            # The loaded weights may carry a version the engine already holds (or an older
            # one, which vLLM refuses): forget the slot so the next sync pushes them.
            p.engine.remove_adapter(name)
    p.trainer.load_state_dict(state["trainer"])
    if p.critics is not None:
        p.critics.load(path, state.get("critics"))
    if p.baselines is not None and state.get("baselines") is not None:
        p.baselines.load_state_dict(state["baselines"])
    if p.magnet is not None:
        p.magnet.load(path, state.get("magnet"))
    p.pool.load_state_dict(state["pool"])
    if p.items is not None and state.get("data") is not None:
        p.items.load_state_dict(state["data"])
    restore_rng_state(state["rng"])
    p.step = state["step"]
    p.run_id = state.get("tracking_run_id")
    print(f"resumed from {path} at step {p.step}" + (
        f"; max_steps={p.cfg.max_steps}: nothing left to train" if p.step >= p.cfg.max_steps
        else ""), flush=True)
