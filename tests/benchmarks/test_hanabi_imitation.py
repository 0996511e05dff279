"""benchmarks/hanabi_imitation.py: the rule team's decisions labelled whatever is played, and
the supervised loss equal to minus the log of the probability the exact scorer (constrained
decoding's, computed another way) gives each label."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import hanabi_imitation  # noqa: E402
import imitation  # noqa: E402

THREE_LIVES = {"players": 2, "colors": 2, "ranks": 3, "hand_size": 2,
               "max_information_tokens": 3, "max_life_tokens": 3}


DEALT = 2 * THREE_LIVES["hand_size"]
"""Chance moves before a game's first decision: the two hands dealt."""


def _played_after(decisions):
    """For each decision followed by another of the same game: the first move its game made
    after it (a move, not chance: chance only follows a move), read from the later state's
    history."""
    moves = []
    for (state, _), (later, _) in zip(decisions, decisions[1:], strict=False):
        if len(later.history()) > DEALT:  # not a new game
            moves.append(later.history()[len(state.history())])
    return moves


def test_without_exploring_the_rule_plays_its_own_labels():
    import pyspiel

    game = pyspiel.load_game("hanabi", THREE_LIVES)
    decisions = hanabi_imitation.rule_decisions(game, games=3, explore=0.0, seed=0)
    starts = [i for i, (state, _) in enumerate(decisions) if len(state.history()) == DEALT]
    assert len(starts) == 3  # three games, one after the other
    # the move made after each decision is its label
    labels = [label for i, (_, label) in enumerate(decisions)
              if i + 1 < len(decisions) and i + 1 not in starts]
    assert _played_after(decisions) == labels
    # each state is a snapshot: the first is still at the first decision of its game
    first, label = decisions[0]
    assert not first.is_chance_node() and label in first.legal_actions()
    assert len(first.history()) == DEALT  # the deal only


def test_exploring_plays_random_moves_but_labels_the_rules():
    import pyspiel

    game = pyspiel.load_game("hanabi", THREE_LIVES)
    calm = hanabi_imitation.rule_decisions(game, games=4, explore=0.0, seed=1)
    wild = hanabi_imitation.rule_decisions(game, games=4, explore=1.0, seed=1)
    assert all(label in state.legal_actions() for state, label in wild)
    labels = [label for _, label in wild]
    played = _played_after(wild)
    # at explore 1 every move is random: many differ from the labels
    differ = sum(a != b for a, b in zip(played, labels, strict=False))
    assert differ >= 5
    # random play loses lives the rule never loses: states with fewer lives are labelled too
    assert min(state.observation_string(0).count("Life tokens: 3") for state, _ in wild) == 0
    assert all("Life tokens: 3" in state.observation_string(0) for state, _ in calm)


@pytest.mark.slow  # the tiny model, a few decisions
def test_the_loss_is_minus_the_log_of_the_exact_scorers_probability(tmp_path):
    import torch

    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.pipeline.exploitability import move_probabilities

    cfg = load_config(str(ROOT / "examples/hanabi"), "team", [
        "model.path=tiny", "model.device=cpu", "tracking.backends=[jsonl]", "save_steps=0",
        f"output_dir={tmp_path}", "team.lora.rank=4", "env.params.max_life_tokens=3"])
    pipeline = AgenticPipeline(cfg)
    model = pipeline.model
    env = OpenSpielEnv("hanabi", dict(cfg.env.params))
    decisions = hanabi_imitation.rule_decisions(env.game, games=1, explore=0.5, seed=2)[:5]
    rows = hanabi_imitation.decision_rows(pipeline, env, decisions)
    torch.manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: the untrained one is the base alone
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)
    agent = model.agent_index("agent_0")
    pad = pipeline.tokenizer.pad_token_id or 0
    with torch.no_grad():
        loss = float(imitation.supervised_step(model, rows, agent, pad, "cpu"))
    scored = move_probabilities(env, [state for state, _ in decisions], pipeline.trainer,
                                pipeline.tokenizer, lambda seat: "agent_0", pipeline.render, 1.0)
    expected = -sum(math.log(probs[action_ids.index(label)])
                    for (_, label), (action_ids, probs) in zip(decisions, scored, strict=True))
    assert loss == pytest.approx(expected / len(decisions), rel=1e-4)
    assert hanabi_imitation.accuracy(pipeline, env, decisions) == pytest.approx(
        sum(action_ids[max(range(len(probs)), key=probs.__getitem__)] == label
            for (_, label), (action_ids, probs) in zip(decisions, scored, strict=True)) / 5)


@pytest.mark.slow  # ~30 s: two games' decisions, one epoch, two evaluations of two games
def test_a_tiny_run_prints_its_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [
        "hanabi_imitation.py", "--tiny", "--games", "2", "--heldout_games", "1", "--epochs",
        "1", "--eval_games", "2", "--batch", "16", "--tag", "_t", "model.path=tiny",
        "team.lora.rank=4"])
    hanabi_imitation.main()
    summary = json.loads((tmp_path / "hanabi_imitation_t.json").read_text())
    assert summary["games"] == 2 and summary["params"]["max_life_tokens"] == 3
    start, last = summary["curve"]
    assert start["nll"] is None and start["updates"] == 0
    assert last["epoch"] == 1 and last["updates"] == math.ceil(summary["decisions"] / 16)
    assert last["nll"] > 0 and 0.0 <= last["accuracy"] <= 1.0
    for point in (start, last):
        for play in ("greedy", "sampled"):
            figures = point[play]
            assert figures["low"] <= figures["score"] <= figures["high"]
            assert 0 <= figures["lost_all_lives"] <= 1 and sum(figures["moves"].values()) > 0
