"""Timestamped stage lines (roll/utils/stages.py) and the pipeline's use of them."""

from __future__ import annotations

import re

import pytest

from roll.utils.stages import stage

LINE = r"\[\d\d:\d\d:\d\d\] "


def test_a_stage_prints_its_start_and_its_end_or_failure(capsys):
    with stage("loading"):
        pass
    with pytest.raises(KeyError), stage("building"):
        raise KeyError("x")
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(LINE + r"loading \.\.\.", lines[0])
    assert re.fullmatch(LINE + r"loading: done in \d+\.\d s", lines[1])
    assert re.fullmatch(LINE + r"building \.\.\.", lines[2])
    assert re.fullmatch(LINE + r"building: failed after \d+\.\d s", lines[3])


def test_a_run_without_the_console_tracker_says_each_stage_and_step(tmp_path, capsys):
    """A run that logs to files only (the benchmarks) still tells a watcher where it is:
    model load, trainer, engine, the evaluation and every step, each with a time."""
    from tests.pipeline.test_critic_pipeline import _config, _pipeline

    cfg = _config(tmp_path, mode="none", estimator="grpo", max_steps=2, save_steps=0)
    cfg = type(cfg)(**{**cfg.__dict__, "eval": type(cfg.eval)(eval_steps=2, num_episodes=1)})
    _pipeline(cfg).run()
    out = capsys.readouterr().out
    for pattern in (r"loading the model \(.*\) \.\.\.", r"loading the model .*: done in",
                    r"building the trainer \(local, 1 rank\(s\)\): done in",
                    r"building the hf engine: done in",
                    r"evaluation before training: done in",
                    r"step 1/2 \.\.\. \(the first compiles what it needs\)",
                    r"step 1/2: done in \d+\.\d s", r"step 2/2 \.\.\.",
                    r"step 2/2: done in", r"evaluation at step 2: done in"):
        assert re.search(LINE + pattern, out), pattern
