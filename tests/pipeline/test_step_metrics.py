"""A step's rollout-phase and log-prob metrics, against numbers computed by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from roll.pipeline.step_metrics import capture_metrics, logprob_metrics, rollout_phase_metrics


def test_rollout_phase_metrics_by_hand():
    served = {"lanes": 8, "decode_steps": 20, "served": 10, "prefills": 3, "shared_tokens": 40,
              "prefill_replays": 3, "prefill_captures": 2, "prefill_capture_s": 0.25}
    out = rollout_phase_metrics({"rollout/decoded_tokens": 100.0}, served, 2.0)
    # 100 tokens in 2 s; 10 of them came from prefills, 90 from 20 decode steps: 4.5 rows each
    assert out == {"rollout/tokens_per_s": 50.0, "rollout/lanes": 8.0,
                   "rollout/decode_steps": 20.0, "rollout/prefills": 3.0,
                   "rollout/shared_tokens": 40.0, "rollout/prefill_replays": 3.0,
                   "rollout/prefill_captures": 2.0,
                   "rollout/prefill_capture_s": 0.25, "rollout/busy_lanes": 4.5}
    # a phase that decoded nothing (its episodes all played ahead) reports no stale serve
    assert rollout_phase_metrics({"rollout/decoded_tokens": 0.0}, served, 0.5) == {
        "rollout/tokens_per_s": 0.0}
    assert rollout_phase_metrics({"rollout/decoded_tokens": 6.0}, {}, 3.0) == {
        "rollout/tokens_per_s": 2.0}


def test_capture_metrics_are_the_steps_share_by_hand():
    # before the update: 2 graphs in 3.5 s, 1 micro-batch past the cap; after: 3 in 4.25 s, 4
    assert capture_metrics((2, 3.5, 1), (3, 4.25, 4)) == {
        "compile/train_captures": 1.0, "compile/train_capture_s": 0.75,
        "compile/train_uncaptured": 3.0}
    assert capture_metrics((3, 4.25, 4), (3, 4.25, 4)) == {
        "compile/train_captures": 0.0, "compile/train_capture_s": 0.0,
        "compile/train_uncaptured": 0.0}


def test_logprob_gaps_split_rows_played_ahead_by_hand():
    # three trained rows (a snapshot turn between them is not a row), responses at columns
    # 1-2; row 1 was played ahead
    mask = torch.tensor([[0.0, 1, 1], [0, 1, 1], [0, 1, 0]])
    old = torch.tensor([[9.0, -1.0, -2.0], [9, -1, -1], [9, -3, 5]])
    engine = torch.tensor([[0.0, -1.5, -2.0], [0, -2, -3], [0, -2, 7]])
    batch = SimpleNamespace(response_mask=mask, old_logprobs=old, engine_logprobs=engine,
                            ref_logprobs=None)
    turns = [SimpleNamespace(ahead=False, trained_agent="a"),
             SimpleNamespace(ahead=False, trained_agent=None),
             SimpleNamespace(ahead=True, trained_agent="b"),
             SimpleNamespace(ahead=False, trained_agent="a")]
    out = logprob_metrics(batch, turns, comparable=True)
    # fresh rows 0 and 2: |.5| + |0| + |1| over 3 tokens; ahead row 1: |1| + |2| over 2
    assert out == pytest.approx({"rollout/engine_logprob_gap": 0.5,
                                 "rollout/ahead_logprob_gap": 1.5})
    assert logprob_metrics(batch, turns, comparable=False) == {}
    none_ahead = [SimpleNamespace(ahead=False, trained_agent="a")] * 3
    assert logprob_metrics(batch, none_ahead, comparable=True) == pytest.approx(
        {"rollout/engine_logprob_gap": (0.5 + 0 + 1 + 2 + 1) / 5})


@pytest.mark.slow  # a compiled 2-step run (~30 s)
def test_each_step_counts_the_graphs_it_compiled_and_a_later_compile_is_said(tmp_path, capsys):
    """compile/new_graphs: step 1 of a compiled trainer builds its graphs, step 2 (inputs of
    kinds already seen) none; a step that must compile again (here: dynamo's caches emptied
    between steps, as a new kind of input would) counts its graphs and prints one line."""
    import json

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.utils.tracking import Tracker, TrackingConfig
    from tests.pipeline.test_action_regularisers import BASE, KUHN

    out = tmp_path / "run"
    cfg = load_config(KUHN, "quickstart_cpu", BASE + [
        f"output_dir={out}", "max_steps=2", "trainer.compile=true",
        "trainer.compile_backend=aot_eager", "trainer.share_prefix=false",  # fewer graphs
        "trainer.capture=true"])  # as on CUDA (here no graph: the same padded step)
    torch._dynamo.reset()
    pipeline = AgenticPipeline(cfg)
    pipeline.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["compile/new_graphs"] > 0 for row in rows] == [True, False]
    # trainer.capture's own counts, each step's share: no graph on a CPU, every micro-batch
    # in a kept bucket
    assert [(row["compile/train_captures"], row["compile/train_uncaptured"])
            for row in rows] == [(0.0, 0.0), (0.0, 0.0)]
    assert len(pipeline.trainer.captured.buckets) >= 1
    assert "new graph(s)" not in capsys.readouterr().out
    torch._dynamo.reset()
    pipeline.step += 1
    scheduler = pipeline.scheduler(pipeline.train_seatings, evaluation=False)
    with Tracker(TrackingConfig(backends=[]), str(tmp_path / "again")) as tracker:
        metrics = pipeline.train_step(scheduler, tracker)
    assert metrics["compile/new_graphs"] > 0
    said = [line for line in capsys.readouterr().out.splitlines() if "new graph(s)" in line]
    assert len(said) == 1 and said[0].split("] ", 1)[1].startswith(
        f"pipeline: torch.compile built {metrics['compile/new_graphs']:.0f} new graph(s) in "
        "step 3 ")


def test_behaviour_passes_give_old_logprobs_to_the_agents_that_need_them(tiny_model_path):
    """alice's 3 rows are one mini-batch of <= 4 (her training forward gives her old
    log-probs: zeros here), bob's 6 are two (the pass, for his rows alone, equal to the pass
    over every row); the engine gap comes from the pass over the probe rows (the first 8 fresh
    ones, 1 played ahead); HAPPO gets the pass for every row."""
    from roll.distributed.roles import LocalTrainGroup
    from roll.multi_agent.config import AgentConfig, TrainerConfig
    from roll.pipeline.policy_update import PROBE_ROWS, behaviour_passes

    from ..multi_agent.helpers import make_rows, make_team

    model, resolved = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    trainer = LocalTrainGroup(model, resolved, TrainerConfig(ppo_mini_batch_size=4))
    ids = [0, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    batch = make_rows(ids, seed=5)
    full = trainer.logprob_passes(batch).old_logprobs
    batch = batch.with_fields(engine_logprobs=full + 0.25 * batch.response_mask)
    turns = [SimpleNamespace(ahead=row == 9, trained_agent="ab"[agent])
             for row, agent in enumerate(ids)]
    grpo = SimpleNamespace(advantage=SimpleNamespace(estimator="grpo"))
    out, metrics = behaviour_passes(grpo, trainer, batch, turns, comparable=True, stale=False)
    bob = torch.tensor(ids) == 1
    torch.testing.assert_close(out.old_logprobs[bob], full[bob], rtol=0, atol=1e-6)
    assert not out.old_logprobs[~bob].any()
    assert PROBE_ROWS == 8  # rows 0-7 fresh, row 9 ahead: every gap is the 0.25 put in
    assert metrics == pytest.approx({"rollout/engine_logprob_gap": 0.25,
                                     "rollout/ahead_logprob_gap": 0.25}, abs=1e-5)
    happo = SimpleNamespace(advantage=SimpleNamespace(estimator="happo"))
    out, _ = behaviour_passes(happo, trainer, batch, turns, comparable=False, stale=False)
    torch.testing.assert_close(out.old_logprobs, full, rtol=0, atol=1e-6)
