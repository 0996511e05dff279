"""hf engines as Ray actors (actor_infer.num_engines): same rollouts as the local engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll.distributed.ray_infer import EngineSpec, RayInferGroup, forwarded_env
from roll.distributed.resident import resident_elements
from roll.distributed.roles import TrainSpec, push_adapters
from roll.errors import RoleFailed
from roll.inference import GenerationRequest, SamplingParams
from roll.models import load_tokenizer
from roll.multi_agent.config import AgentConfig, TrainerConfig
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.builders import hf_compile, hf_engine_for
from roll.pipeline.cli import CLIError, load_config
from roll.utils.checkpoint import latest_checkpoint
from tests.inference.helpers import perturb
from tests.multi_agent.helpers import make_team

from .helpers import checkpoint_adapters

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def team_and_group(ray_cluster, tiny_model_path):
    """Two hf engine actors, shared by the module's tests (each start is two processes that
    import torch, transformers and PEFT: ~13 core-seconds): each test pushes the adapters it
    serves under a version of its own first, and the test that kills an engine comes last."""
    model, agents = make_team(tiny_model_path, [AgentConfig("a"), AgentConfig("b")])
    with torch.no_grad():  # adapters that differ from the base and from each other
        gen = torch.Generator().manual_seed(0)
        for name in model.agent_names:
            for param in model.agent_parameters(name):
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    spec = TrainSpec(model_path=str(tiny_model_path), dtype="float32", device="cpu",
                     agents=tuple(agents), trainer=TrainerConfig(), seed=0, temperature=1.0)
    group = RayInferGroup(spec, 2, EngineSpec("hf", {"max_batch_size": 8}), cpus_per_engine=0.5)
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
    local = hf_engine_for(model, load_tokenizer(tiny_model_path), max_batch_size=8)
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


@pytest.mark.serial  # which actor finishes first is timing: under the parallel run's load the
# 60-token row once ended before the chain of short turns (session 87's last CI)
def test_engine_actors_serve_continuously_and_balance_follow_ups(
        tiny_model_path, team_and_group):
    """serve over 2 engine actors: each runs its own continuous loop, so a chain of short
    follow-ups finishes while a long request on the same actor still decodes (no rounds);
    follow-ups go to the actor with the fewest requests in flight; late follow-ups (base.Later,
    env workers' steps) are taken too; every output is the local engine's."""
    from tests.inference.helpers import LateFollowUps

    model, group = team_and_group
    local = hf_engine_for(model, load_tokenizer(tiny_model_path), max_batch_size=8)
    push_adapters(local, model, version=4)
    push_adapters(group, model, version=4)
    tokenizer = load_tokenizer(tiny_model_path)

    def request(i: int, tokens: int) -> GenerationRequest:
        return GenerationRequest(tokenizer.encode(f"play move {i}"), ["a", "b", None][i % 3],
                                 SamplingParams(temperature=1.0, max_new_tokens=tokens,
                                                seed=100 + i, ignore_eos=True))

    first = [request(0, 2), request(1, 2), request(2, 60), request(3, 2)]  # 2: long, actor 0
    made, finished, outputs = list(first), [], {}

    def follow(key, output):
        finished.append(key)
        outputs[key] = output
        if key in (0, 4, 6) :  # a chain of short turns: 0 -> 4 -> 6 -> 8
            made.append(request(len(made), 2))
            return [made[-1]]
        if key == 1:
            made.append(request(len(made), 2))
            return [made[-1]]
        return []

    assert group.serve(first, follow, context_len=256) == len(made) == 8
    assert sorted(finished) == list(range(8))
    assert finished.index(7) < finished.index(2)  # the chain ended while 2 still decoded
    assert group.last_serve["engines"] == 2 and group.last_serve["per_engine"] == 8
    for key, request_made in enumerate(made):
        assert outputs[key].token_ids == local.generate([request_made])[0].token_ids, key
        assert outputs[key].adapter_version == (4 if request_made.adapter else None)

    late_requests = [request(10 + i, 3 + (i % 2) * 5) for i in range(9)]
    late = LateFollowUps(late_requests, ahead=3, delay=2)
    assert group.serve(late.first(), late.follow, later=late) == 9
    assert late.outstanding() == 0 and sorted(late.outputs) == list(range(9))
    for index, output in late.outputs.items():
        assert output.token_ids == local.generate([late_requests[index]])[0].token_ids


def test_engine_actors_play_the_next_rollouts_episodes_ahead(tiny_model_path, team_and_group):
    """rollout lookahead over 2 engine actors' streams: the next rollout's episodes join as
    this one's games end and are parked when it ends; with unchanged adapters both rollouts
    equal the in-process engine's without lookahead."""
    from roll.agentic.env.actions import ActionConfig
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.agentic.env.renderers import render_prompt
    from roll.agentic.env.seating import build_seating
    from roll.agentic.rollout.scheduler import RolloutConfig, RolloutScheduler
    from tests.agentic.test_rollout import lookahead_plays_the_plain_rollouts

    model, group = team_and_group
    tokenizer = load_tokenizer(tiny_model_path)
    local = hf_engine_for(model, tokenizer, max_batch_size=8)
    push_adapters(local, model, version=5)
    push_adapters(group, model, version=5)

    def scheduler(engine):
        return RolloutScheduler(
            env_factory=lambda: OpenSpielEnv("tic_tac_toe"), render=render_prompt,
            seatings=[build_seating(s, 2, ["a", "b"]) for s in (["a", "b"], ["b", "a"])],
            agent_names=["a", "b"], engine=engine, tokenizer=tokenizer,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=16),
            action=ActionConfig(format_penalty=1.0, fallback="random"),
            config=RolloutConfig(num_groups=3, group_size=2, shared_deals=True, max_turns=9,
                                 max_prompt_tokens=2048, constrained_decoding=True,
                                 enable_thinking=False, continuous=True))

    lookahead_plays_the_plain_rollouts(scheduler(local), scheduler(group))


def test_a_dead_engine_stops_the_call_with_one_line(tiny_model_path, team_and_group,
                                                    ray_cluster):
    model, group = team_and_group
    push_adapters(group, model, version=6)
    ray_cluster.kill(group.ranks[1])
    with pytest.raises(RoleFailed, match=r"^actor_infer engine 1 of 2 failed during generate: "
                                         r"ActorDiedError"):
        group.generate(requests(tiny_model_path))
    assert group.ranks == []


def _config(out: Path, *extra: str):
    return load_config(str(ROOT / "examples" / "kuhn_poker"), "multi_agent_kuhn_poker", [
        "rollout.num_groups=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=12",
        "rollout.constrained_decoding=true", "rollout.continuous=false", "team.optim.lr=1e-2",
        "team.optim.eps=1e-3", "eval.eval_steps=0", "tracking.backends=[jsonl]", "max_steps=2",
        f"output_dir={out}", *extra])


def test_colocated_ranks_and_engines_share_bundles_and_train_what_the_local_run_trains(
        ray_cluster, tmp_path, one_thread):
    """actor_infer.colocate: train rank i and engine i in bundle i of ONE placement group
    (on GPUs: one rank and one engine per GPU), same adapters as the local run."""
    AgenticPipeline(_config(tmp_path / "local")).run()
    pipeline = AgenticPipeline(_config(
        tmp_path / "ray", "cluster.backend=ray", "actor_train.world_size=2",
        "actor_train.cpus_per_rank=0.5", "actor_infer.num_engines=2",
        "actor_infer.cpus_per_engine=0.5", "actor_infer.colocate=true"))
    shared = pipeline.shared_bundles
    assert pipeline.trainer.actors.group is shared.group
    assert pipeline.engine.actors.group is shared.group
    table = ray_cluster.util.placement_group_table(shared.group)
    assert list(table["bundles"].values()) == [{"CPU": 1.0}, {"CPU": 1.0}]  # rank + engine
    # Every forward runs on the ranks and engines: this process holds the base as a shape,
    # and of tensors only the agents' adapters (what it syncs and checkpoints).
    assert not pipeline.model.holds_base
    # the actors decode as the in-process engine would (compiled step, CUDA graphs as resolved)
    assert {key: pipeline.engine.engine_spec.options[key] for key in ("compile", "cuda_graphs")
            } == {"compile": hf_compile(pipeline.cfg), "cuda_graphs": True}
    assert resident_elements(pipeline.model) == sum(
        tensor.numel() for name in pipeline.agent_names
        for tensor in pipeline.model.export_adapter(name).values())
    pipeline.run()
    assert shared.removed and pipeline.engine.ranks == [] and pipeline.trainer.ranks == []
    local = checkpoint_adapters(latest_checkpoint(tmp_path / "local"))
    remote = checkpoint_adapters(latest_checkpoint(tmp_path / "ray"))
    assert max(float((local[key] - remote[key]).abs().max()) for key in local) < 1e-6


def test_engine_actor_settings_are_checked(tmp_path):
    with pytest.raises(CLIError, match=r"actor_infer.num_engines=2: engines as actors need "
                                       r"cluster.backend=ray"):
        _config(tmp_path, "actor_infer.num_engines=2")
    with pytest.raises(CLIError, match=r"actor_infer.num_engines=-1: must be an integer >= 0"):
        _config(tmp_path, "cluster.backend=ray", "actor_infer.num_engines=-1")


def test_vllm_engine_actors_serve_what_the_in_process_hf_engine_serves(ray_cluster,
                                                                        tiny_model_path,
                                                                        monkeypatch):
    """rollout.engine=vllm in a Ray actor: a real vLLM (CPU build) engine; greedy mixed-agent
    batches give the hf engine's tokens (as one in-process vLLM engine does,
    tests/inference/test_vllm_engine.py), each output names the version the actor served, and
    sleep/wake reach it. (One actor: the group splits rows over its actors whatever their
    engine, as the hf engine actors of this module show with two; each vLLM start costs ~10 s
    here.)"""
    import vllm  # noqa: F401  (a broken build fails, never skips)

    from tests.inference.helpers import chat_prompts, perturb

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # forwarded to the actors
    team, agents = make_team(tiny_model_path, [AgentConfig("a"), AgentConfig("b")])
    for index, name in enumerate(team.agent_names):
        perturb(team, name, seed=100 + index)
    spec = TrainSpec(model_path=str(tiny_model_path), dtype="float32", device="cpu",
                     agents=tuple(agents), trainer=TrainerConfig(), seed=0, temperature=1.0)
    options = dict(max_loras=2, max_lora_rank=4, dtype="float32", enforce_eager=True,
                   max_model_len=512, gpu_memory_utilization=0.05)
    group = RayInferGroup(spec, 1, EngineSpec("vllm", options, forwarded_env()),
                          cpus_per_engine=1)
    try:
        hf = hf_engine_for(team, load_tokenizer(tiny_model_path))
        for engine in (group, hf):
            push_adapters(engine, team, version=3)
        prompts = chat_prompts(tiny_model_path)
        greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
        slots = [*team.agent_names, None]
        batch = [GenerationRequest(prompts[i % len(prompts)], slots[i % 3], greedy)
                 for i in range(7)]
        group.sleep()  # a no-op on the CPU build, said once; generation goes on after wake-up
        group.wake_up()
        outputs, expected = group.generate(batch), hf.generate(batch)
        for request, out, ref in zip(batch, outputs, expected, strict=True):
            assert out.token_ids == ref.token_ids, request.adapter
            assert out.adapter_version == (None if request.adapter is None else 3)
        assert len({tuple(o.token_ids) for o in outputs[:3]}) == 3  # the agents differ
        assert group.rank_versions() == [{name: 3 for name in team.agent_names}]
    finally:
        group.close()


def test_pipeline_with_a_vllm_engine_actor_serves_each_new_adapter(ray_cluster, tmp_path,
                                                                   monkeypatch):
    """rollout.engine=vllm in a Ray actor: every step's engine log-probs equal the trainer's
    recomputation with the new adapters (a stale actor would leave a gap the size of an
    update), a snapshot seat is loaded and swapped in the actor, evaluation runs there."""
    import json

    import vllm  # noqa: F401  (a broken build fails, never skips)

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    out = tmp_path / "run"
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu", [
        "rollout.engine=vllm", "rollout.vllm.enforce_eager=true", "rollout.num_groups=4",
        "rollout.vllm.max_model_len=1280", "rollout.vllm.gpu_memory_utilization=0.05",
        "rollout.vllm.sleep_between_phases=true", "cluster.backend=ray",
        "actor_infer.num_engines=1", "team.optim.lr=5e-2", "max_steps=3", "save_steps=2",
        "eval.eval_steps=3", "eval.num_episodes=4", "tracking.backends=[jsonl]",
        f"output_dir={out}", "team.num_agents=1",
        "env.seat_to_agent=[[agent_0,random],[random,snapshot:agent_0@latest]]",
    ])
    pipeline = AgenticPipeline(cfg)
    assert isinstance(pipeline.engine, RayInferGroup) and pipeline.engine.kind == "vllm"
    served: list[set] = []  # the slots loaded at each rollout (continuous: one serve each)
    serve = pipeline.engine.serve
    monkeypatch.setattr(pipeline.engine, "serve", lambda *args, **kwargs: (
        served.append(set(pipeline.engine.slots)), serve(*args, **kwargs))[1])
    pipeline.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/engine_logprob_gap" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for row in steps:
        assert row["rollout/engine_logprob_gap"] < 1e-4, row
    assert any(r["agent_0/grad_norm"] > 0 for r in steps)
    assert "eval/agent_0/win_rate" in rows[-1]
    # Step 3 played the step-2 snapshot; the step-0 one was unloaded from the actor first.
    assert {"agent_0", "agent_0@step0"} in served and served[-1] == {"agent_0", "agent_0@step2"}
    assert pipeline.engine.ranks == []  # the run released its engine actor


def test_colocation_settings_are_checked(tmp_path):
    with pytest.raises(CLIError, match=r"actor_infer.colocate=True: places Ray actors: set "
                                       r"cluster.backend=ray"):
        _config(tmp_path, "actor_infer.colocate=true")
    with pytest.raises(CLIError, match=r"actor_infer.num_engines=1: actor_infer.colocate puts "
                                       r"one engine beside each train rank: set it to "
                                       r"actor_train.world_size=2"):
        _config(tmp_path, "cluster.backend=ray", "actor_infer.colocate=true",
                "actor_infer.num_engines=1", "actor_train.world_size=2")
    with pytest.raises(CLIError, match=r"actor_infer.gpus_per_engine=1.0: a colocated rank and "
                                       r"engine share one GPU, but with actor_train."
                                       r"gpus_per_rank=0.5 they ask for 1.5"):
        _config(tmp_path, "cluster.backend=ray", "actor_infer.colocate=true",
                "actor_infer.num_engines=1", "actor_infer.gpus_per_engine=1",
                "actor_train.gpus_per_rank=0.5")
    # On CUDA the defaults split each GPU in half (checked without a GPU: no model loads).
    from roll.pipeline.cluster_checks import infer_gpus_per_engine, train_gpus_per_rank

    cfg = _config(tmp_path, "cluster.backend=ray", "actor_infer.colocate=true",
                  "actor_infer.num_engines=1")
    cfg.model.device = "cuda"
    assert (train_gpus_per_rank(cfg), infer_gpus_per_engine(cfg)) == (0.5, 0.5)
    cfg.actor_infer.colocate = False
    assert (train_gpus_per_rank(cfg), infer_gpus_per_engine(cfg)) == (1.0, 1.0)


def test_engine_actors_fetch_rank_zeros_adapters_in_the_base_dtype(ray_cluster, tiny_model_path,
                                                                    monkeypatch):
    """After a step rank 0 publishes each agent's adapter twice: fp32 for the pipeline's copy
    (checkpoints) and in the base's dtype (bf16 here) for the engines, which fetch it by
    reference; the actors then serve what an in-process engine given the fp32 copy serves
    (the engine casts to the base's dtype either way)."""
    from roll.distributed.ray_train import RayTrainGroup
    from roll.models import load_model, load_shape
    from roll.multi_agent.model import MultiAgentLoRAModel

    team, agents = make_team(tiny_model_path, [AgentConfig("a"), AgentConfig("b")])
    for index, name in enumerate(team.agent_names):
        perturb(team, name, seed=200 + index)
    trained = {name: team.export_adapter(name) for name in team.agent_names}
    spec = TrainSpec(model_path=str(tiny_model_path), dtype="bfloat16", device="cpu",
                     agents=tuple(agents), trainer=TrainerConfig(), seed=0, temperature=1.0)
    store = MultiAgentLoRAModel(load_shape(tiny_model_path, "bfloat16"), agents, seed=0)
    group = RayTrainGroup(spec, store, 1, cpus_per_rank=0.5)
    engines = RayInferGroup(spec, 1, EngineSpec("hf", {"max_batch_size": 8}), cpus_per_engine=0.5)
    try:
        group._get([rank.load.remote(trained, None) for rank in group.ranks], "load")
        group._pull_adapters(team.agent_names)  # what a train step ends with
        published = group.published_adapters(group.global_step)
        assert sorted(published) == ["a", "b"] and group.published_adapters(7) == {}
        for name in team.agent_names:
            assert all(torch.equal(store.export_adapter(name)[key], value)  # fp32, exact
                       for key, value in trained[name].items())
            sent = ray_cluster.get(published[name])
            assert all(sent[key].dtype == torch.bfloat16 and torch.equal(
                sent[key], value.to(torch.bfloat16)) for key, value in trained[name].items())
        received = []
        load = engines.load_adapter
        monkeypatch.setattr(engines, "load_adapter", lambda slot, tensors, *rest: (
            received.append(type(tensors).__name__), load(slot, tensors, *rest))[1])
        push_adapters(engines, store, 1, published=group.published_adapters(0))
        assert received == ["ObjectRef", "ObjectRef"]  # never through this process
        local_team = MultiAgentLoRAModel(load_model(tiny_model_path, dtype="bfloat16"), agents)
        for name in team.agent_names:
            local_team.import_adapter(name, trained[name])
        local = hf_engine_for(local_team, load_tokenizer(tiny_model_path), max_batch_size=8)
        push_adapters(local, local_team, version=1)
        batch = requests(tiny_model_path, 6)
        remote, alone = engines.generate(batch), local.generate(batch)
        assert [o.token_ids for o in remote] == [o.token_ids for o in alone]
        assert len({tuple(o.token_ids) for o in remote[:3]}) == 3  # a, b and the base differ
    finally:
        engines.close()
        group.close()
