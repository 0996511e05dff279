"""The snapshot pool is bounded and stored once as adapter files: checkpoints and host memory
stay flat in the number of saves (issue 31, item 2)."""

from __future__ import annotations

from pathlib import Path

import torch

from roll.multi_agent.config import AgentConfig
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config
from roll.pipeline.snapshot_pool import SnapshotPool
from roll.utils.checkpoint import latest_checkpoint, load_trainer_state

from ..multi_agent.helpers import make_team

ROOT = Path(__file__).resolve().parents[2]


def _nudge(team, name: str) -> None:
    with torch.no_grad():
        for _, param in team.named_agent_tensors(name):
            param.add_(0.01)


def test_oldest_snapshots_go_first_except_pinned_ones_and_files_follow(tmp_path,
                                                                        tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice")])
    pool = SnapshotPool(team, {"alice"}, tmp_path / "checkpoints", tmp_path / "snapshots",
                        max_size=3, pinned={"alice": {2}})
    taken = {}
    for step in range(7):
        pool.take(step)
        taken[step] = team.export_adapter("alice")
        _nudge(team, "alice")
    # 7 taken, at most 3 kept: step 2 is pinned ('snapshot:alice@2'); 0, 1, 3, 4 went first.
    assert sorted(pool.snapshots["alice"]) == [2, 5, 6]
    files = sorted(p.name for p in (tmp_path / "snapshots" / "alice").iterdir())
    assert len(files) == 7  # nothing deleted before the checkpoint that drops them is written
    pool.flush()
    files = sorted(p.name for p in (tmp_path / "snapshots" / "alice").iterdir())
    assert files == ["step_00000002.safetensors", "step_00000005.safetensors",
                     "step_00000006.safetensors"]
    # The state is the steps only; a new pool reads the same tensors back from the files.
    state = pool.state_dict()
    assert state == {"steps": {"alice": [2, 5, 6]}}
    again = SnapshotPool(team, {"alice"}, tmp_path / "checkpoints", tmp_path / "snapshots",
                         max_size=3)
    again.load_state_dict(state)
    for step in (2, 5, 6):
        for key, value in taken[step].items():
            assert torch.equal(again.snapshots["alice"][step][key], value)


def test_a_run_saving_every_step_keeps_its_checkpoints_flat(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker", [
        "team.num_agents=1", "env.seat_to_agent=[agent_0,snapshot:agent_0@latest]",
        "rollout.constrained_decoding=true", "rollout.num_groups=2", "rollout.group_size=2",
        "rollout.sampling.max_new_tokens=12", "eval.eval_steps=0", "tracking.backends=[jsonl]",
        "save_steps=1", "keep_last=2", "max_steps=5", "snapshot_pool.max_size=2",
        f"output_dir={out}"])
    pipeline = AgenticPipeline(cfg)
    pipeline.run()
    assert sorted(pipeline.pool.snapshots["agent_0"]) == [4, 5]
    assert sorted(p.name for p in (out / "snapshots" / "agent_0").iterdir()) == [
        "step_00000004.safetensors", "step_00000005.safetensors"]
    state = load_trainer_state(latest_checkpoint(out))
    assert state["pool"] == {"steps": {"agent_0": [4, 5]}}  # no tensors in the trainer state
    resumed = AgenticPipeline(load_config(str(ROOT / "examples" / "kuhn_poker"),
                                          "multi_agent_kuhn_poker", [
        "team.num_agents=1", "env.seat_to_agent=[agent_0,snapshot:agent_0@latest]",
        "rollout.constrained_decoding=true", "eval.eval_steps=0", "tracking.backends=[jsonl]",
        "snapshot_pool.max_size=2", "resume=latest", f"output_dir={out}"]))
    resumed._maybe_resume()
    for step in (4, 5):
        for key, value in pipeline.pool.snapshots["agent_0"][step].items():
            assert torch.equal(resumed.pool.snapshots["agent_0"][step][key], value)


def test_resuming_deletes_the_snapshot_files_its_checkpoint_does_not_list(tmp_path,
                                                                          tiny_model_path):
    """A run killed after writing a checkpoint but before deleting the snapshot it dropped, or
    after taking a later snapshot, leaves files its checkpoint does not list: the resumed run
    deletes them, and takes the later one again from its own adapters, never keeping a file of
    the branch that died (``take`` does not overwrite a file)."""
    team, _ = make_team(tiny_model_path, [AgentConfig("alice")])
    folder = tmp_path / "snapshots" / "alice"
    pool = SnapshotPool(team, {"alice"}, tmp_path / "checkpoints", tmp_path / "snapshots",
                        max_size=2)
    for step in range(3):
        pool.take(step)
        _nudge(team, "alice")
    state = pool.state_dict()  # the checkpoint of step 2, written; then the kill: no flush
    assert state == {"steps": {"alice": [1, 2]}}
    pool.take(3)  # and the dying run went on to take step 3's
    assert len(list(folder.iterdir())) == 4

    resumed_team, _ = make_team(tiny_model_path, [AgentConfig("alice")])  # other adapters
    resumed = SnapshotPool(resumed_team, {"alice"}, tmp_path / "checkpoints",
                           tmp_path / "snapshots", max_size=2)
    resumed.load_state_dict(state)
    assert sorted(p.name for p in folder.iterdir()) == ["step_00000001.safetensors",
                                                        "step_00000002.safetensors"]
    resumed.take(3)
    from safetensors.torch import load_file

    written = load_file(str(folder / "step_00000003.safetensors"))
    for key, value in resumed_team.export_adapter("alice").items():
        assert torch.equal(written[key], value)
