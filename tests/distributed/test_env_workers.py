"""Env workers as Ray actors: the same episodes as in-process play, one-line stops, resume.

Also the infer side of the same promise: an engine actor killed in the middle of a step stops
the run with one line naming it and the last good checkpoint, and resume=latest continues.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roll.agentic.env.actions import ActionConfig
from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.renderers import render_prompt
from roll.agentic.env.seating import build_seating
from roll.agentic.rollout.scheduler import RolloutConfig, RolloutScheduler
from roll.errors import ConfigError, RoleFailed
from roll.inference.base import SamplingParams
from roll.models import load_tokenizer
from roll.multi_agent.config import AgentConfig
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.builders import hf_engine_for
from roll.pipeline.cli import CLIError
from roll.pipeline.cluster_checks import check_ray_resources
from roll.utils.checkpoint import latest_checkpoint

from ..multi_agent.helpers import make_team
from .helpers import ROOT, checkpoint_adapters, kuhn_config

AGENTS = ["alice", "bob"]
pytestmark = pytest.mark.slow


def _scheduler(engine, tokenizer, game: str, seatings, episodes=None,
               max_prompt_tokens: int = 2048) -> RolloutScheduler:
    num_seats = OpenSpielEnv(game).num_seats
    return RolloutScheduler(
        env_factory=lambda: OpenSpielEnv(game), render=render_prompt,
        seatings=[build_seating(s, num_seats, AGENTS) for s in seatings],
        agent_names=AGENTS, engine=engine, tokenizer=tokenizer,
        sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
        # Unconstrained: the tiny model's garbage exercises format errors, penalties and the
        # random fallback (drawn from the episode's own random stream, wherever it lives).
        action=ActionConfig(format_penalty=0.5, fallback="random"),
        config=RolloutConfig(num_groups=3, group_size=2, shared_deals=True, max_turns=64,
                             max_prompt_tokens=max_prompt_tokens,
                             constrained_decoding=False, enable_thinking=False,
                             continuous=True),
        episodes=episodes)


def _turns(result):
    return [(t.env_index, t.seat, t.turn_index, t.slot, t.prompt_ids, t.response_ids,
             t.reward, t.format_error, t.truncated) for t in result.turns]


def test_env_workers_play_the_same_episodes_as_the_rollouts_process(ray_cluster,
                                                                     tiny_model_path):
    from roll.distributed.ray_env import RayEpisodes

    team, _ = make_team(tiny_model_path, [AgentConfig(a) for a in AGENTS])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in team.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    tokenizer = load_tokenizer(tiny_model_path)
    engine = hf_engine_for(team, tokenizer)
    for name in AGENTS:
        engine.load_adapter(name, team.export_adapter(name), team.peft_config(name), 1)
    host = RayEpisodes(num_workers=2, cpus_per_worker=0.5)
    try:
        for game, seatings in (
                # MCTS and random opponents move inside the workers, with their seeded streams.
                ("tic_tac_toe", [["alice", "mcts:8"], ["random", "bob"]]),
                ("kuhn_poker", [AGENTS, ["bob", "alice"]])):
            here = _scheduler(engine, tokenizer, game, seatings).rollout(seed=5)
            there = _scheduler(engine, tokenizer, game, seatings, host).rollout(seed=5)
            assert _turns(here) == _turns(there), game
            assert [e.returns for e in here.episodes] == [e.returns for e in there.episodes]
            assert here.metrics == there.metrics
            assert any(t.format_error for t in there.turns), game  # the penalty path ran
            assert any(t.reward != 0 for t in there.turns), game
            for key in ("input_ids", "response_mask", "rewards", "group_id", "agent_id"):
                assert torch.equal(getattr(here.batch, key), getattr(there.batch, key)), key
            # The episodes lived in the two workers: three each, their returns the rollout's.
            shares = ray_cluster.get([w.outcomes.remote() for w in host.workers])
            assert [len(share) for share in shares] == [3, 3]
            assert [o.returns for o in shares[1]] == [e.returns for e in there.episodes[1::2]]
        # A prompt too long for rollout.max_prompt_tokens cuts its episode in the worker too.
        limit = max(len(t.prompt_ids) for t in here.turns if t.turn_index == 0)
        seatings = [AGENTS, ["bob", "alice"]]
        here = _scheduler(engine, tokenizer, "kuhn_poker", seatings,
                          max_prompt_tokens=limit).rollout(seed=5)
        there = _scheduler(engine, tokenizer, "kuhn_poker", seatings, host,
                           max_prompt_tokens=limit).rollout(seed=5)
        assert _turns(here) == _turns(there)
        cut = [e.truncated for e in there.episodes]
        assert cut == [e.truncated for e in here.episodes] and any(cut)
        assert there.metrics["rollout/prompts_too_long"] == sum(cut)
    finally:
        host.close()
    assert host.workers == []


def _overlaps(log: Path) -> int:
    """Pairs of env steps (from the spans a sleepy env logged) that ran at the same time in
    different processes."""
    spans = [line.split() for line in log.read_text().splitlines()]
    spans = [(pid, float(start), float(end)) for pid, start, end in spans]
    return sum(1 for i, (pid, start, end) in enumerate(spans) for other, a, b in spans[i + 1:]
               if other != pid and start < b and a < end)


def test_env_steps_of_different_workers_run_side_by_side(ray_cluster, tiny_model_path,
                                                         tmp_path):
    """Each answer's env step starts on its worker and the rollout takes it when ready: the
    steps of the two workers overlap in time (they never did when every step was a blocking
    call), and the episodes are the in-process ones. (benchmarks/env_workers.py measures the
    speed-up.)"""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from env_workers import rollout_scheduler, sleepy_env_factory

    from roll.distributed.ray_env import RayEpisodes

    team, _ = make_team(tiny_model_path, [AgentConfig(a) for a in AGENTS])
    tokenizer = load_tokenizer(tiny_model_path)
    engine = hf_engine_for(team, tokenizer)
    for name in AGENTS:
        engine.load_adapter(name, team.export_adapter(name), team.peft_config(name), 1)
    here_log, there_log = tmp_path / "here.txt", tmp_path / "there.txt"
    here = rollout_scheduler(engine, tokenizer, sleepy_env_factory("kuhn_poker", 0.05, here_log),
                             num_groups=4).rollout(seed=3)
    host = RayEpisodes(num_workers=2, cpus_per_worker=0.25)
    try:
        there = rollout_scheduler(engine, tokenizer,
                                  sleepy_env_factory("kuhn_poker", 0.05, there_log),
                                  num_groups=4, episodes=host).rollout(seed=3)
    finally:
        host.close()
    assert _turns(here) == _turns(there)
    steps = len(there_log.read_text().splitlines())
    assert steps == len(here_log.read_text().splitlines()) >= 8
    assert len({line.split()[0] for line in there_log.read_text().splitlines()}) == 2
    assert _overlaps(here_log) == 0  # one process: one step at a time
    assert _overlaps(there_log) >= 2


def _config(out: Path, *extra: str):
    return kuhn_config(out, "save_steps=1", "keep_last=5", *extra)


WORKERS = ("cluster.backend=ray", "env_workers.num_workers=2", "env_workers.cpus_per_worker=0.5")


def test_pipeline_with_env_workers_trains_what_the_local_run_trains(ray_cluster, tmp_path,
                                                                     one_thread, monkeypatch):
    from roll.distributed.ray_env import RayEpisodes, loaded_unused_modules

    # What the workers' processes imported, looked at as the run closes them
    loaded, close = [], RayEpisodes.close

    def looked_at_then_closed(host) -> None:
        if host.workers:
            # a lambda: Ray pickles it by value, so the worker does not import this test
            # module (and with it torch) to run it
            loaded.extend(ray_cluster.get([
                worker.__ray_call__.remote(lambda _: loaded_unused_modules())
                for worker in host.workers]))
        close(host)

    monkeypatch.setattr(RayEpisodes, "close", looked_at_then_closed)
    AgenticPipeline(_config(tmp_path / "local", "max_steps=2")).run()
    pipeline = AgenticPipeline(_config(tmp_path / "ray", "max_steps=2", *WORKERS))
    pipeline.run()
    assert pipeline.env_host.workers == []  # closed at the end of the run
    # The workers played two rollouts with the env side alone: neither torch nor the learning
    # or engine modules in their processes (they imported all of them before: ~330 MB a worker
    # against ~145 MB now, and each start ~1.5 s longer)
    assert loaded == [[], []], loaded
    local = checkpoint_adapters(latest_checkpoint(tmp_path / "local"))
    remote = checkpoint_adapters(latest_checkpoint(tmp_path / "ray"))
    assert local.keys() == remote.keys()
    assert max(float((local[key] - remote[key]).abs().max()) for key in local) < 1e-6


def test_a_team_task_through_env_workers_trains_what_the_local_run_trains(ray_cluster, tmp_path,
                                                                          one_thread):
    """The math team's episodes (dataset items, whole-text answers, task metrics) live in the
    env workers: same adapters and same task metrics as in-process."""
    from roll.pipeline.cli import load_config

    def config(out: Path, *extra: str):
        return load_config(str(ROOT / "examples" / "math_team"), "multi_agent_math_team", [
            "env.params.closed_answers=true", "rollout.constrained_decoding=true",
            "rollout.num_groups=2", "rollout.group_size=2",
            "rollout.sampling.max_new_tokens=12", "team.optim.lr=1e-2", "max_steps=2",
            "eval.eval_steps=0", "tracking.backends=[jsonl]", f"output_dir={out}", *extra])

    local = AgenticPipeline(config(tmp_path / "local")).run()
    remote = AgenticPipeline(config(tmp_path / "ray", *WORKERS)).run()
    assert {k: v for k, v in local.items() if k.startswith("task/")} == {
        k: v for k, v in remote.items() if k.startswith("task/")}
    assert any(v != 0 for k, v in remote.items() if k.startswith("task/accuracy"))
    first = checkpoint_adapters(latest_checkpoint(tmp_path / "local"))
    second = checkpoint_adapters(latest_checkpoint(tmp_path / "ray"))
    assert max(float((first[key] - second[key]).abs().max()) for key in first) < 1e-6


def _kill_during(ray_cluster, obj, method: str, actor, after: int) -> list:
    """Kill ``actor`` (for real) when ``obj.method`` is called for the ``after``-th time,
    i.e. in the middle of a rollout; the calls are counted in the returned list."""
    calls: list = []
    original = getattr(obj, method)

    def wrapped(*args, **kwargs):
        calls.append(args)
        if len(calls) == after:
            ray_cluster.kill(actor)
        return original(*args, **kwargs)

    setattr(obj, method, wrapped)
    return calls


def test_an_env_worker_or_engine_killed_mid_step_stops_with_one_line_and_resume_continues(
        ray_cluster, tmp_path, one_thread):
    """One layout with env workers AND engine actors: an env worker killed in the middle of a
    rollout, then (resumed) an engine actor killed in the middle of one; each stops the run
    with one line naming it and the last good checkpoint, which stays intact; resume=latest
    then trains on. (The runs around the failures are local: the checkpoint is the same, and
    test_ray_pipeline.py resumes Ray ranks.)"""
    out = tmp_path / "run"
    layout = ("cluster.backend=ray", "actor_train.cpus_per_rank=0.5",
              "env_workers.num_workers=2", "env_workers.cpus_per_worker=0.25",
              "actor_infer.num_engines=2", "actor_infer.cpus_per_engine=0.25",
              "rollout.continuous=false")
    AgenticPipeline(_config(out, "max_steps=1")).run()
    before = checkpoint_adapters(latest_checkpoint(out))
    for role, what in (("env worker", "an env step"), ("actor_infer engine", "generate")):
        pipeline = AgenticPipeline(_config(out, "max_steps=3", "resume=latest", *layout))
        if role == "env worker":
            calls = _kill_during(ray_cluster, pipeline.env_host, "start",
                                 pipeline.env_host.workers[1], after=3)
        else:
            calls = _kill_during(ray_cluster, pipeline.engine, "generate",
                                 pipeline.engine.ranks[1], after=2)
        with pytest.raises(RoleFailed) as caught:
            pipeline.run()
        assert len(calls) >= (3 if role == "env worker" else 2)  # in the middle of a rollout
        message = str(caught.value)
        assert "\n" not in message
        assert f"{role} 1 of 2 failed during {what}: ActorDiedError" in message
        assert "last good checkpoint:" in message and "step_00000001" in message
        assert "resume=latest" in message
        assert latest_checkpoint(out).name == "step_00000001"  # nothing lost or half-written
        after = checkpoint_adapters(latest_checkpoint(out))
        assert all(torch.equal(before[key], after[key]) for key in before)
        # Every role's actors were released: the next run gets the whole cluster again.
        assert pipeline.trainer.ranks == [] and pipeline.engine.ranks == []
        assert pipeline.env_host.workers == []
    AgenticPipeline(_config(out, "max_steps=2", "resume=latest")).run()
    assert latest_checkpoint(out).name == "step_00000002"


def test_env_worker_settings_are_checked_before_any_model_loads(tmp_path):
    with pytest.raises(CLIError, match=r"env_workers.num_workers=2: env workers are Ray "
                                       r"actors: set cluster.backend=ray"):
        _config(tmp_path, "env_workers.num_workers=2")
    with pytest.raises(CLIError, match=r"env_workers.num_workers=-1: must be an integer >= 0"):
        _config(tmp_path, "cluster.backend=ray", "env_workers.num_workers=-1")
    with pytest.raises(CLIError, match=r"env_workers.cpus_per_worker=0.0: must be > 0"):
        _config(tmp_path, "cluster.backend=ray", "env_workers.num_workers=1",
                "env_workers.cpus_per_worker=0")
    cfg = _config(tmp_path, "cluster.backend=ray", "env_workers.num_workers=3",
                  "model.device=cpu")
    with pytest.raises(ConfigError,
                       match=r"actor_train.cpus_per_rank=1.0: actor_train.world_size=1 ranks "
                             r"and env_workers.num_workers=3 workers ask for 4 CPUs but the "
                             r"Ray cluster has 2"):
        check_ray_resources(cfg, {"CPU": 2.0})


def test_evaluation_alone_through_env_workers_equals_in_process_and_frees_them(ray_cluster,
                                                                               tmp_path):
    import time

    from roll.pipeline.rollout_pipeline import run_evaluation

    local = run_evaluation(_config(tmp_path / "local", "eval.num_episodes=4"))
    remote = run_evaluation(_config(tmp_path / "ray", "eval.num_episodes=4", *WORKERS))
    timing = {"time/eval"}
    assert {k: v for k, v in local.items() if k not in timing} == {
        k: v for k, v in remote.items() if k not in timing}
    assert any("win_rate" in key for key in remote)
    deadline = time.monotonic() + 30  # every role's actors released: all CPUs free again
    while ray_cluster.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray_cluster.available_resources().get("CPU", 0) == 2
