"""benchmarks/tictactoe_imitation.py: the best-response targets on hand-read boards, and the
supervised loss equal to minus the log of the probability the exact table (constrained
decoding's, computed another way) gives each target."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import tictactoe_imitation  # noqa: E402
import tictactoe_policy  # noqa: E402


def test_the_targets_take_a_win_then_block_by_hand():
    #  X X .      O to move: X threatens cell 2, O has no line: block
    #  . O .
    #  . . .
    #  X X .      O to move: O wins at 5 (and X threatens 2): win first
    #  O O .
    #  X . .
    targets = tictactoe_imitation.best_moves(["XX..O....", "XX.OO.X.."], "O", 1.0)
    assert targets == {"XX..O....": 2, "XX.OO.X..": 5}
    # X's first move against random: a corner or the centre, never an edge
    assert tictactoe_imitation.best_moves(["........."], "X", 1.0)["........."] in {0, 2, 4, 6, 8}


@pytest.mark.slow  # the tiny model, three boards, one update
def test_the_loss_is_minus_the_log_of_the_tables_probability_of_the_target(tmp_path):
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    cfg = load_config(str(ROOT / "examples/tictactoe"), "mixed", [
        "model.path=tiny", "model.device=cpu", "tracking.backends=[jsonl]", "save_steps=0",
        f"output_dir={tmp_path}", "eval.eval_steps=0", "team.lora.rank=4"])
    pipeline = AgenticPipeline(cfg)
    model = pipeline.model
    boards = ["XX..O....", "X...O....", "XOX.O.X.."]
    targets = tictactoe_imitation.best_moves(boards, "O", 1.0)
    rows = tictactoe_imitation.target_rows(pipeline, targets)
    agent = model.agent_index("agent_0")
    pad = pipeline.tokenizer.pad_token_id or 0
    params = model.agent_parameters("agent_0")
    optimizer = torch.optim.SGD(params, lr=1.0)  # one large step: the adapter is no longer 0
    with model.training_forward({"agent_0": 0}):
        tictactoe_imitation.supervised_step(model, rows, agent, pad, "cpu").backward()
    optimizer.step()
    with torch.no_grad():
        loss = float(tictactoe_imitation.supervised_step(model, rows, agent, pad, "cpu"))
    table = tictactoe_policy.agent_policies(pipeline, boards, agents=["agent_0"])["agent_0"]
    expected = -sum(math.log(table[board][cell]) for board, cell in targets.items()) / 3
    assert loss == pytest.approx(expected, rel=1e-4)
    untrained = tictactoe_policy.agent_policies(pipeline, boards, agents=["agent_1"])["agent_1"]
    assert table["XX..O...."][2] != pytest.approx(untrained["XX..O...."][2], rel=1e-3)


@pytest.mark.slow  # ~12 s: one exact scoring of the tiny model's 2,097 O boards
def test_a_tiny_run_prints_its_curve(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [
        "tictactoe_imitation.py", "--tiny", "--epochs", "1", "--max_boards", "16",
        "--batch", "8", "--tag", "_t", "--skip_untrained", "team.lora.rank=4"])
    tictactoe_imitation.main()
    summary = json.loads((tmp_path / "tictactoe_imitation_t.json").read_text())
    assert summary["boards"] == 2097 and summary["trained_on"] == 16
    (last,) = summary["curve"]  # the untrained adapter not scored
    assert last["epoch"] == 1 and last["updates"] == 2
    assert last["nll"] > 0 and 0.0 <= last["accuracy"] <= 1.0
    assert {"win", "loss", "greedy_win", "blocks_made", "train_accuracy"} <= set(last)
