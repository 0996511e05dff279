"""Issue 8 items 1 and 10: every rollout (training and evaluation) is served the trainer's
current adapters, synced inside the engine's awake window; the last step is evaluated; a
resumed run continues its WandB run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "rollout.num_groups=2", "rollout.group_size=2", "rollout.sampling.max_new_tokens=12",
    "team.optim.lr=5e-2", "eval.num_episodes=4", "save_steps=0",
]


class RecordingEngine:
    """The pipeline's own engine, with a log of what was called while it was awake or asleep,
    and which adapter versions each generate call was served."""

    def __init__(self, engine, pipeline: AgenticPipeline):
        self.inner, self.pipeline = engine, pipeline
        self.awake = False
        self.events: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def wake_up(self) -> None:
        self.awake = True
        self.events.append(("wake_up",))

    def sleep(self) -> None:
        self.awake = False
        self.events.append(("sleep",))

    def load_adapter(self, slot, *args, **kwargs):
        self.events.append(("load_adapter", slot, self.awake))
        return self.inner.load_adapter(slot, *args, **kwargs)

    def _record(self, outputs) -> None:
        served = {o.adapter: o.adapter_version for o in outputs if o.adapter is not None}
        self.events.append(("generate", served, self.pipeline.trainer.global_step, self.awake))

    def generate(self, requests):
        outputs = self.inner.generate(requests)
        self._record(outputs)
        return outputs

    def serve(self, first, follow, context_len=None, later=None):
        def recorded(key, output):
            self._record([output])
            return follow(key, output)

        return self.inner.serve(first, recorded, context_len=context_len, later=later)


def _pipeline(out: Path, *extra: str) -> AgenticPipeline:
    cfg = load_config(str(ROOT / "examples" / "kuhn_poker"), "quickstart_cpu",
                      SMALL + [f"output_dir={out}", *extra])
    return AgenticPipeline(cfg)


def test_every_rollout_is_served_the_trainers_adapters_synced_while_awake(tmp_path):
    out = tmp_path / "run"
    pipeline = _pipeline(out, "max_steps=3", "eval.eval_steps=2",
                         "rollout.vllm.sleep_between_phases=true")
    engine = pipeline.engine = RecordingEngine(pipeline.engine, pipeline)
    pipeline.run()

    generates = [e for e in engine.events if e[0] == "generate"]
    assert generates
    for _, served, trainer_version, awake in generates:
        assert awake
        # Evaluation after step N is served version N (it was N - 1 before the fix).
        assert served and all(v == trainer_version for v in served.values()), (served,
                                                                              trainer_version)
    loads = [e for e in engine.events if e[0] == "load_adapter"]
    assert loads and all(awake for _, _, awake in loads)
    # The engine sleeps between phases: it is asleep at the end, and woke for every phase.
    assert engine.events[-1] == ("sleep",)
    assert sum(e == ("wake_up",) for e in engine.events) >= 3 + 3  # 3 rollouts, 3 evaluations
    # Evaluation at step 0, every eval_steps, and at the last step (3 is not a multiple of 2).
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/agent_0/win_rate" in r] == [0, 2, 3]
    versions = {t for _, _, t, _ in generates}
    assert versions == {0, 1, 2, 3}  # the final evaluation saw the last update


@pytest.mark.slow  # two runs with WandB offline (~4 s): the quick subset stays under 3 minutes
def test_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home" / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "run"
    common = ["tracking.backends=[wandb,jsonl]", "tracking.wandb_mode=offline",
              "eval.eval_steps=0"]
    _pipeline(out, *common, "max_steps=1", "save_steps=1").run()
    _pipeline(out, *common, "max_steps=2", "save_steps=1", "resume=latest").run()
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, runs
    ids = {next(run.glob("run-*.wandb")).stem.removeprefix("run-") for run in runs}
    assert len(ids) == 1, ids


def test_before_training_false_skips_only_the_step_0_evaluation(tmp_path):
    out = tmp_path / "run"
    _pipeline(out, "max_steps=2", "eval.eval_steps=1", "eval.before_training=false").run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/agent_0/win_rate" in r] == [1, 2]
