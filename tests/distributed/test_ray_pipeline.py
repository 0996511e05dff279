"""The pipeline with cluster.backend=ray: same result as local, one-line stops, clean resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll.errors import ConfigError, RoleFailed
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import CLIError, load_config
from roll.pipeline.cluster_checks import check_ray_resources
from roll.utils.checkpoint import latest_checkpoint
from tests.pipeline.helpers import moved_iff_gradient

from .helpers import ROOT, checkpoint_adapters, kuhn_config

pytestmark = pytest.mark.slow
SAVE_EACH = ("save_steps=1", "keep_last=5")


def config(out: Path, *extra: str):
    return kuhn_config(out, *SAVE_EACH, *extra)


def test_zero3_ranks_train_what_the_local_run_trains(ray_cluster, tmp_path, one_thread):
    AgenticPipeline(config(tmp_path / "local", "max_steps=2")).run()
    local = checkpoint_adapters(latest_checkpoint(tmp_path / "local"))
    # ZeRO-3 shards the base and the adapters as well as the agents' optimizer (ZeRO-2, which
    # shares its optimizer code, is compared with the local trainer in test_ray_train.py). The
    # torch strategy's pipeline equals the local run in every other test of this module (the
    # snapshot magnet's, the critics', the resumed dead-rank run's).
    out = tmp_path / "zero3"
    ray_pipeline = AgenticPipeline(config(
        out, "max_steps=2", "cluster.backend=ray",
        "actor_train.world_size=2", "actor_train.strategy=deepspeed",
        "actor_train.zero_stage=3"))
    ray_pipeline.run()
    assert len(ray_pipeline.trainer.rows_per_rank) == 2
    remote = checkpoint_adapters(latest_checkpoint(out))
    assert local.keys() == remote.keys()
    gap = max(float((local[key] - remote[key]).abs().max()) for key in local)
    assert gap < 1e-6
    # The checkpoint's trainer state is the torch strategy's format (a local run resumes it).
    state = torch.load(latest_checkpoint(out) / "trainer_state.pt",
                       weights_only=False)["trainer"]
    optimizers = state["optimizers"]
    assert set(optimizers) == {key.split("/")[0] for key in local}
    for optimizer in optimizers.values():
        assert {"step", "exp_avg", "exp_avg_sq"} <= set(optimizer["state"][0])
    start = AgenticPipeline(config(tmp_path / "fresh", "max_steps=1")).model
    moved = max(float((start.export_adapter(key.split("/")[0])[key.split("/", 1)[1]]
                       - local[key]).abs().max()) for key in local)
    assert moved > 1e-4  # the comparison is between trained adapters


def critic_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """``{critic}/{file}/{key}`` -> tensor: each critic's PEFT adapter and value head."""
    from safetensors.torch import load_file

    return {f"{folder.name}/{file.stem}/{key}": value
            for folder in sorted((checkpoint / "critics").iterdir())
            for file in sorted(folder.glob("*.safetensors"))
            for key, value in load_file(file).items()}


@pytest.mark.parametrize("learner", [
    pytest.param(("advantage.estimator=ippo", "critic.mode=per_agent"), id="ippo"),
    pytest.param(("advantage.estimator=mappo", "critic.mode=shared", "critic.input=global"),
                 id="mappo_global")])
def test_critics_on_ray_ranks_train_and_resume_as_in_one_process(
        ray_cluster, tmp_path, one_thread, learner):
    # critic.optim.eps 1e-3 for the reason KUHN_SMALL gives the agents'
    args = (*learner, "critic.optim.eps=1e-3", "critic.optim.lr=1e-2")
    AgenticPipeline(config(tmp_path / "local", "max_steps=2", *args)).run()
    ray_args = ("cluster.backend=ray", "actor_train.world_size=2", *args)
    first = AgenticPipeline(config(tmp_path / "ray", "max_steps=1", *ray_args))
    first.run()
    # the second step on fresh ranks, from the checkpoint: critics' adapters, heads, AdamW;
    # with an engine actor, so that this process holds no base, only the adapters and critics
    # it checkpoints (resumed into, then sent to the ranks)
    resumed = AgenticPipeline(config(
        tmp_path / "ray", "max_steps=2", "resume=latest", "actor_train.cpus_per_rank=0.5",
        "actor_infer.num_engines=1", "actor_infer.cpus_per_engine=0.5", *ray_args))
    assert first.model.holds_base and not resumed.model.holds_base
    resumed.run()
    # the critics' values and update ran on the ranks, each on its share of the rows
    values_rows, update_rows = (resumed.trainer.pass_rows_per_rank,
                                resumed.trainer.critic_rows_per_rank)
    assert len(values_rows) == len(update_rows) == 2
    assert min(update_rows) > 0 and abs(update_rows[0] - update_rows[1]) <= len(
        resumed.critics.names)
    assert sum(values_rows) == sum(update_rows)  # every row has a critic, each counted once
    local_ckpt = latest_checkpoint(tmp_path / "local")
    ray_ckpt = latest_checkpoint(tmp_path / "ray")
    assert ray_ckpt.name == local_ckpt.name == "step_00000002"
    for read in (checkpoint_adapters, critic_tensors):
        local, remote = read(local_ckpt), read(ray_ckpt)
        assert local.keys() == remote.keys() and local
        gap = max(float((local[key] - remote[key]).abs().max()) for key in local)
        assert gap < 1e-6, read.__name__
    heads = {key: value for key, value in critic_tensors(ray_ckpt).items() if "value_head" in key}
    assert heads and max(float(value.abs().max()) for value in heads.values()) > 1e-4  # trained
    states = [torch.load(path / "trainer_state.pt", weights_only=False)["critics"]
              for path in (local_ckpt, ray_ckpt)]
    assert states[0]["names"] == states[1]["names"]
    for name in states[0]["names"]:
        moments = [state["trainer"]["optimizers"][name]["state"] for state in states]
        assert moments[0].keys() == moments[1].keys() and moments[0]
        for index in moments[0]:
            gap = (moments[0][index]["exp_avg"] - moments[1][index]["exp_avg"]).abs().max()
            assert float(gap) < 1e-6


def test_the_snapshot_magnet_scores_on_the_ranks_as_in_one_process(ray_cluster, tmp_path,
                                                                    one_thread):
    """trainer.magnet=snapshot on 2 Ray ranks: the magnet's legal-move log-probs are computed
    on the ranks (each on its share, the magnet's tensors swapped in and back there; the
    pipeline no longer forwards any model for it), and 3 steps (magnet taken at step 1, used
    at step 2 after the agents moved, retaken at step 3) end with the local run's adapters."""
    args = ("max_steps=3", "trainer.magnet_coef=0.5", "trainer.magnet=snapshot",
            "trainer.magnet_refresh=2")
    AgenticPipeline(config(tmp_path / "local", *args)).run()
    AgenticPipeline(config(tmp_path / "nomagnet", "max_steps=3")).run()
    ray = AgenticPipeline(config(tmp_path / "ray", *args, "cluster.backend=ray",
                                 "actor_train.world_size=2"))
    ray.run()
    assert ray.magnet.taken_at == 3
    local, remote, plain = (checkpoint_adapters(latest_checkpoint(tmp_path / name))
                            for name in ("local", "ray", "nomagnet"))
    assert local.keys() == remote.keys()
    assert max(float((local[key] - remote[key]).abs().max()) for key in local) < 1e-6
    assert max(float((local[key] - plain[key]).abs().max()) for key in local) > 1e-5  # it acts


def test_a_dead_rank_stops_with_the_last_checkpoint_and_resume_continues(
        ray_cluster, tmp_path, one_thread):
    out = tmp_path / "run"
    ray_args = ("cluster.backend=ray", "actor_train.world_size=2")
    # step 1 in this process (its checkpoint is the Ray run's format; a Ray run's own
    # checkpoint resumes on fresh ranks in the critics' test above): two rank starts fewer
    AgenticPipeline(config(out, "max_steps=1")).run()
    before = checkpoint_adapters(latest_checkpoint(out))
    pipeline = AgenticPipeline(config(out, "max_steps=2", "resume=latest", *ray_args))
    ray_cluster.kill(pipeline.trainer.ranks[1])
    with pytest.raises(RoleFailed) as caught:
        pipeline.run()
    message = str(caught.value)
    assert "\n" not in message
    assert "actor_train rank 1 of 2 failed during resume: ActorDiedError" in message
    assert "last good checkpoint:" in message and "step_00000001" in message
    assert latest_checkpoint(out).name == "step_00000001"  # nothing lost or half-written
    after = checkpoint_adapters(latest_checkpoint(out))
    assert all(torch.equal(before[key], after[key]) for key in before)
    # resume=latest trains on (in this process: fresh ranks resume a Ray run's checkpoint in
    # the critics' test above, and the checkpoint is the same)
    AgenticPipeline(config(out, "max_steps=2", "resume=latest")).run()
    assert latest_checkpoint(out).name == "step_00000002"


def test_cluster_settings_are_checked_before_any_model_loads(tmp_path):
    with pytest.raises(CLIError, match=r"actor_train.world_size=2: more than one rank needs "
                                          r"cluster.backend=ray"):
        config(tmp_path, "actor_train.world_size=2")
    with pytest.raises(CLIError, match=r"cluster.backend='slurm'"):
        config(tmp_path, "cluster.backend=slurm")
    with pytest.raises(CLIError, match=r"actor_train.strategy='deepspeed': runs in Ray train "
                                          r"ranks: set cluster.backend=ray"):
        config(tmp_path, "actor_train.strategy=deepspeed")
    with pytest.raises(CLIError, match=r"actor_train.strategy='fsdp': must be 'torch' or "
                                          r"'deepspeed'"):
        config(tmp_path, "actor_train.strategy=fsdp")
    with pytest.raises(CLIError, match=r"actor_train.zero_stage=1: must be 2 or 3"):
        config(tmp_path, "cluster.backend=ray", "actor_train.strategy=deepspeed",
               "actor_train.zero_stage=1")
    cfg = config(tmp_path, "cluster.backend=ray", "actor_train.world_size=4",
                 "model.device=cpu")
    with pytest.raises(ConfigError, match=r"actor_train.cpus_per_rank=1.0: actor_train."
                                          r"world_size=4 ranks ask for 4 CPUs but the Ray "
                                          r"cluster has 2"):
        check_ray_resources(cfg, {"CPU": 2.0})
    cfg.actor_train.gpus_per_rank = 1.0
    with pytest.raises(ConfigError, match=r"ask for 4 GPUs but the Ray cluster has 0"):
        check_ray_resources(cfg, {"CPU": 8.0})


# One of the five game examples here (suite time): the Ray ranks see a game only through its
# rows. Hanabi is a cooperative game whose tiny-model returns are all tied; the zero-sum Kuhn
# example, whose graded returns move an agent, trains on two Ray ranks in every other test of
# this module (and equals the local run there); TicTacToe, Connect Four and Leduc run the same
# step in one process in tests/pipeline/test_game_examples.py.
GAMES = {"hanabi": "multi_agent_hanabi"}
# One of the four team examples (suite time): the Ray ranks see a task only through its rows,
# and the advantage estimator (grpo, magrpo) runs in the pipeline's process whatever the
# backend; writing_magrpo's graded joint reward moves its agents (the tiny model answers no
# math_team question right: all-tied rows, as Hanabi's above). All four run in-process in
# tests/pipeline/test_team_pipeline.py.
TEAMS = {"writing_magrpo": "multi_agent_writing_magrpo"}


@pytest.mark.parametrize("example", sorted(GAMES) + sorted(TEAMS))
def test_every_example_trains_with_two_ray_ranks(ray_cluster, tmp_path, example):
    own = (["rollout.constrained_decoding=true", "rollout.sampling.max_new_tokens=40"]
           if example in GAMES else ["rollout.sampling.max_new_tokens=12", "team.optim.lr=1e-2"])
    cfg = load_config(str(ROOT / "examples" / example), {**GAMES, **TEAMS}[example], [
        "cluster.backend=ray", "actor_train.world_size=2", "max_steps=1",
        "rollout.num_groups=2", "rollout.group_size=4", *own, "eval.eval_steps=0",
        "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    pipeline = AgenticPipeline(cfg)
    start = {name: pipeline.model.export_adapter(name) for name in pipeline.agent_names}
    metrics = pipeline.run()
    assert pipeline.trainer.global_step == 1 and len(pipeline.trainer.rows_per_rank) == 2
    # The driver's model holds what the ranks trained: an agent moved iff it had a gradient
    # (all-tied group rewards give zero advantages; the tiny model scores 0 in every Hanabi
    # game, so there no agent learns; in the writing task, whose rewards are graded, some
    # agent does).
    moved = moved_iff_gradient(pipeline, start, metrics)
    if example != "hanabi":
        assert any(moved.values())
    assert latest_checkpoint(tmp_path).name == "step_00000001"


def test_starting_ray_keeps_the_clis_sigterm_handler(tmp_path):
    """ray.init sets SIGTERM to sys.exit; the CLI's handler (stop as Ctrl-C does: roles
    closed, one line naming the last checkpoint) must survive it. A fresh interpreter: Ray
    must really start there (here another test's cluster may be up)."""
    import subprocess
    import sys

    code = f"""
import signal
from roll.pipeline.builders import start_ray
from tests.distributed.helpers import kuhn_config
def mine(signum, frame):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, mine)
start_ray(kuhn_config({str(tmp_path / 'run')!r}, 'cluster.backend=ray', 'cluster.num_cpus=1'))
import ray
print('kept' if signal.getsignal(signal.SIGTERM) is mine else 'replaced')
ray.shutdown()
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "kept"
