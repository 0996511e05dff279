"""hf engines as Ray actors (actor_infer.num_engines): same rollouts as the local engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from roll.distributed import RoleFailed
from roll.distributed.infer_group import RayInferGroup
from roll.distributed.train_group import TrainSpec
from roll.inference import GenerationRequest, HFEngine, SamplingParams, push_adapters
from roll.models import load_tokenizer
from roll.multi_agent.config import AgentConfig, TrainerConfig
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import CLIError, load_config
from roll.utils.checkpoint import latest_checkpoint
from tests.multi_agent.helpers import make_team

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def team_and_group(ray_cluster, tiny_model_path):
    model, agents = make_team(tiny_model_path, [AgentConfig("a"), AgentConfig("b")])
    with torch.no_grad():  # adapters that differ from the base and from each other
        gen = torch.Generator().manual_seed(0)
        for name in model.agent_names:
            for param in model.agent_parameters(name):
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    spec = TrainSpec(model_path=str(tiny_model_path), dtype="float32", device="cpu",
                     agents=tuple(agents), trainer=TrainerConfig(), seed=0, temperature=1.0)
    group = RayInferGroup(spec, 2, max_batch_size=8, cpus_per_engine=0.5)
    yield model, group
    group.close()


def requests(tiny_model_path, n=5):
    tokenizer = load_tokenizer(tiny_model_path)
    return [GenerationRequest(tokenizer.encode(f"play move {i}"), ["a", "b", None][i % 3],
                              SamplingParams(temperature=1.0, max_new_tokens=6, seed=100 + i))
            for i in range(n)]


def test_engines_as_actors_generate_what_the_local_engine_does(
        tiny_model_path, team_and_group):
    model, group = team_and_group
    local = HFEngine(model, load_tokenizer(tiny_model_path), max_batch_size=8)
    push_adapters(local, model, version=3)
    push_adapters(group, model, version=3)
    assert group.adapter_version("a") == 3 and group.slots == ["a", "b"]
    assert all(versions == {"a": 3, "b": 3} for versions in group.rank_versions())
    batch = requests(tiny_model_path)
    remote, alone = group.generate(batch), local.generate(batch)
    for mine, theirs, request in zip(remote, alone, batch, strict=True):
        assert mine.token_ids == theirs.token_ids  # per-request seeds: batching-independent
        assert mine.adapter == request.adapter
        assert mine.adapter_version == (3 if request.adapter else None)
    group.remove_adapter("b")
    assert group.slots == ["a"] and all("b" not in v for v in group.rank_versions())
    with pytest.raises(KeyError, match="slot 'b' is not loaded"):
        group.remove_adapter("b")


def test_a_dead_engine_stops_the_call_with_one_line(tiny_model_path, team_and_group,
                                                    ray_cluster):
    model, group = team_and_group
    push_adapters(group, model, version=1)
    ray_cluster.kill(group.ranks[1])
    with pytest.raises(RoleFailed, match=r"^actor_infer engine 1 of 2 failed during generate: "
                                         r"ActorDiedError"):
        group.generate(requests(tiny_model_path))
    assert group.ranks == []


def _adapters(checkpoint: Path) -> dict[str, torch.Tensor]:
    return {f"{agent.name}/{key}": value
            for agent in sorted((checkpoint / "agents").iterdir())
            for key, value in load_file(agent / "adapter_model.safetensors").items()}


def _config(out: Path, *extra: str):
    return load_config(str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker", [
        "rollout.num_groups=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=12",
        "rollout.constrained_decoding=true", "rollout.continuous=false", "team.optim.lr=1e-2",
        "team.optim.eps=1e-3", "eval.eval_steps=0", "tracking.backends=[jsonl]", "max_steps=2",
        f"output_dir={out}", *extra])


def test_pipeline_with_engine_actors_trains_what_the_local_run_trains(ray_cluster, tmp_path):
    AgenticPipeline(_config(tmp_path / "local")).run()
    pipeline = AgenticPipeline(_config(
        tmp_path / "ray", "cluster.backend=ray", "actor_infer.num_engines=2",
        "actor_infer.cpus_per_engine=0.5"))
    assert isinstance(pipeline.engine, RayInferGroup)
    try:
        pipeline.run()
    finally:
        pipeline.engine.close()
    local = _adapters(latest_checkpoint(tmp_path / "local"))
    remote = _adapters(latest_checkpoint(tmp_path / "ray"))
    assert max(float((local[key] - remote[key]).abs().max()) for key in local) < 1e-6


def test_engine_actor_settings_are_checked(tmp_path):
    with pytest.raises(CLIError, match=r"actor_infer.num_engines=2: engines as actors need "
                                       r"cluster.backend=ray"):
        _config(tmp_path, "actor_infer.num_engines=2")
    with pytest.raises(CLIError, match=r"actor_infer.num_engines=-1: must be an integer >= 0"):
        _config(tmp_path, "cluster.backend=ray", "actor_infer.num_engines=-1")
