"""Tracker: real JSON lines, real TensorBoard event files, a real offline WandB run."""

from __future__ import annotations

import io
import json
import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from roll.errors import ConfigError
from roll.utils.tracking import (
    ProgressLine,
    Tracker,
    TrackingConfig,
    agent_metrics,
    format_console_line,
    resolve_wandb_mode,
    split_agent_key,
)

STEPS = {
    0: {"alice": {"policy_loss": 0.5, "episode_return": -1.0}, "bob": {"policy_loss": 0.25}},
    1: {"alice": {"policy_loss": 0.375, "episode_return": 0.0}, "bob": {"policy_loss": 0.125}},
    2: {"alice": {"policy_loss": 0.25, "episode_return": 1.0}, "bob": {"policy_loss": math.nan}},
}


def _step_metrics(step: int) -> dict[str, float]:
    return {
        **agent_metrics(STEPS[step]),
        "team/episode_return": float(step),
        "time/rollout": 1.5,
        "time/train": 0.25,
        "rollout/episodes": 8.0,
    }


@pytest.fixture
def wandb_env(tmp_path, monkeypatch):
    """Keep WandB offline, quiet, and inside tmp_path (no writes to ~/.config or ~/.cache)."""
    home = tmp_path / "wandb_home"
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR",
                "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(var, str(home / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)


@pytest.mark.slow  # every tracking backend (~3 s): the quick subset stays under 3 minutes
def test_all_backends_write_the_same_values(tmp_path, wandb_env, capsys):
    run_dir = tmp_path / "run"
    config = TrackingConfig(
        backends=["console", "tensorboard", "wandb", "jsonl"],
        project="roll-test",
        run_name="unit",
        wandb_mode="offline",
        tags=["test"],
    )
    with Tracker(config, str(run_dir),
                 run_config={"lr": 1e-4, "agents": ["alice", "bob"]}) as tracker:
        for step in STEPS:
            tracker.log(_step_metrics(step), step=step)

    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    assert [line["alice/policy_loss"] for line in lines] == [0.5, 0.375, 0.25]
    assert lines[1]["time/rollout"] == 1.5 and lines[2]["team/episode_return"] == 2.0
    assert math.isnan(lines[2]["bob/policy_loss"])  # kept, not dropped

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("alice/policy_loss")
    assert [(s.step, s.value) for s in scalars] == [(0, 0.5), (1, 0.375), (2, 0.25)]
    assert math.isnan(events.Scalars("bob/policy_loss")[2].value)

    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    wandb_files = list(runs[0].glob("*.wandb"))
    assert len(wandb_files) == 1 and wandb_files[0].stat().st_size > 0

    console = capsys.readouterr().out.splitlines()
    step_lines = [line for line in console if line.startswith("step ")]
    assert len(step_lines) == 3
    assert "rollout 1.5s" in step_lines[0] and "train 0.25s" in step_lines[0]
    assert "alice episode_return=-1 policy_loss=0.5" in step_lines[0]
    assert "bob policy_loss=!nan!" in step_lines[2]
    assert step_lines[2].endswith("NON-FINITE: bob/policy_loss")


def test_wandb_run_id_continues_one_run_across_trackers(tmp_path, wandb_env):
    """A resumed training run passes its saved run id: WandB files of both parts carry it."""
    config = TrackingConfig(backends=["wandb"], wandb_mode="offline")
    for step in (1, 2):  # the first part, then the resumed one
        with Tracker(config, str(tmp_path / "run"), run_id="rollrun01") as tracker:
            tracker.log({"team/x": float(step)}, step=step)
    runs = sorted((tmp_path / "run" / "wandb").glob("offline-run-*"))
    # Two parts in one second share a folder name, and WandB adds "-1": read the id from the
    # run file inside each folder.
    assert len(runs) == 2 and all("-rollrun01" in run.name for run in runs), runs
    assert all(list(run.glob("run-rollrun01.wandb")) for run in runs), runs


def test_jsonl_appends_across_trackers(tmp_path):
    config = TrackingConfig(backends=["jsonl"])
    with Tracker(config, str(tmp_path)) as tracker:
        tracker.log({"team/x": 1}, step=1)
    with Tracker(config, str(tmp_path)) as tracker:  # a resumed run writes into the same file
        tracker.log({"team/x": 2}, step=2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["team/x"] for line in lines] == [1.0, 2.0]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("backends", ["console", "tensorbord"], "tracking.backends"),
        ("backends", "console", "tracking.backends"),
        ("wandb_mode", "sometimes", "tracking.wandb_mode"),
        ("console_every", 0, "tracking.console_every"),
    ],
)
def test_bad_config_names_the_field(tmp_path, field, value, needle):
    config = TrackingConfig(**{field: value})
    with pytest.raises(ConfigError, match=needle) as error:
        Tracker(config, str(tmp_path / "never"))
    assert repr(value) in str(error.value) or str(value) in str(error.value)
    assert not (tmp_path / "never").exists()  # failed before touching the disk


def test_wandb_auto_mode_follows_api_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert resolve_wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    assert resolve_wandb_mode("disabled") == "disabled"


def test_agent_metric_names_are_prefixed_by_the_agent_name():
    flat = agent_metrics({"alice": {"policy_loss": 1, "kl/ref": 2.5}, "agent_0": {"reward": -1}})
    assert flat == {"alice/policy_loss": 1.0, "alice/kl/ref": 2.5, "agent_0/reward": -1.0}
    assert split_agent_key("alice/kl/ref") == ("alice", "kl/ref")
    assert split_agent_key("agent_0/reward") == ("agent_0", "reward")
    for key in ("team/reward", "time/rollout", "rollout/episodes", "eval/alice/win_rate",
                "train/x", "compile/new_graphs", "alice"):
        assert split_agent_key(key) is None, key
    # Knowing the agents, only their keys count.
    assert split_agent_key("alice/reward", ["alice", "bob"]) == ("alice", "reward")
    assert split_agent_key("carol/reward", ["alice", "bob"]) is None


def test_console_every_still_prints_non_finite_steps(tmp_path):
    stream = io.StringIO()
    config = TrackingConfig(backends=["console"], console_every=2)
    with Tracker(config, str(tmp_path), stream=stream) as tracker:
        for step in range(5):
            tracker.log({"team/x": math.inf if step == 3 else 1.0}, step)
    printed = [line.split(" | ")[0] for line in stream.getvalue().splitlines()]
    assert printed == ["step 0", "step 2", "step 3", "step 4"]
    assert "team x=!inf!" in stream.getvalue()


def test_console_line_shows_whether_each_agent_still_learns():
    """An agent's line holds its return, entropy (over legal moves where there is one), share
    of zero-advantage rows and gradient norm: not the policy loss and approx_kl, which one
    optimizer step per rollout leaves at ~0 whatever the agent does (invariant 7)."""
    from roll.multi_agent.trainer import METRIC_PARTS

    trainer_parts = dict.fromkeys(METRIC_PARTS, 0.0)  # what a train step logs per agent
    trainer_parts.pop("kl_ref")  # off with kl_coef 0, the default
    alice = {**trainer_parts, "episode_return": 0.5, "entropy": 6.4, "action_entropy": 0.61,
             "zero_adv_fraction": 0.25, "grad_norm": 0.31, "policy_loss": 1e-9}
    bob = {**alice, "action_entropy": 0.0, "zero_adv_fraction": 1.0, "grad_norm": 0.0}
    line = format_console_line(agent_metrics({"alice": alice, "bob": bob}), step=3)
    assert line == ("step 3 | alice episode_return=0.5 action_entropy=0.61 "
                    "zero_adv_fraction=0.25 grad_norm=0.31 | bob episode_return=0.5 "
                    "action_entropy=0 zero_adv_fraction=1 grad_norm=0")
    # free-text answers: the token entropy; a reference KL when one is paid
    carol = {"episode_return": 1.0, "entropy": 2.5, "kl_ref": 0.002, "policy_loss": 0.1}
    assert format_console_line(agent_metrics({"carol": carol}), step=4) == (
        "step 4 | carol episode_return=1 entropy=2.5 policy_loss=0.1 kl_ref=0.002")


def test_console_line_falls_back_to_any_agent_metrics():
    line = format_console_line({"carol/zeta": 3.0, "carol/alpha": 2.0}, step=7)
    assert line == "step 7 | carol alpha=2 zeta=3"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _progress(stream: io.StringIO, times: list[float]) -> ProgressLine:
    ticks = iter(times)
    return ProgressLine(stream=stream, tty_interval_s=1.0, file_interval_s=10.0,
                        clock=lambda: next(ticks))


def test_progress_line_throttles_in_log_files():
    stream = io.StringIO()  # not a terminal: whole lines, at most one per file_interval_s
    progress = _progress(stream, [0, 5, 11, 12, 25, 26, 100, 101, 102])
    for done in (0, 1, 2, 3, 4, 10):  # a long loop: lines at t=11 and t=25, then the final one
        progress.update(done, 10, "rollout turns")
    for done in (0, 1, 2):  # a short loop prints nothing
        progress.update(done, 2, "rollout turns")
    assert stream.getvalue().splitlines() == [
        "rollout turns 2/10 (20%)", "rollout turns 4/10 (40%)", "rollout turns 10/10 (100%)"
    ]


def test_progress_line_redraws_in_place_on_a_terminal():
    stream = _Terminal()
    progress = _progress(stream, [0, 0.5, 1.5, 2.0])
    for done in (0, 1, 2, 4):
        progress.update(done, 4, "turns")
    assert stream.getvalue() == (
        "\rturns 0/4 (0%)\x1b[K" "\rturns 2/4 (50%)\x1b[K" "\r\x1b[K"  # erased when done
    )


def test_log_rejects_reserved_keys_and_use_after_finish(tmp_path):
    tracker = Tracker(TrackingConfig(backends=["jsonl"]), str(tmp_path))
    with pytest.raises(ValueError, match="'step'"):
        tracker.log({"step": 1.0}, step=1)
    tracker.finish()
    tracker.finish()  # idempotent
    with pytest.raises(RuntimeError, match="after finish"):
        tracker.log({"team/x": 1.0}, step=2)
