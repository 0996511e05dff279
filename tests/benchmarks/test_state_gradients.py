"""benchmarks/state_gradients.py: its figures, by hand, and its gradients' log-odds are the
policy the exploitability code reads."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import state_gradients  # noqa: E402


def test_summary_by_hand():
    # Two states with card 0 share one direction; card 1's state is orthogonal to both.
    grads = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    figures = state_gradients.summary(["0", "0p", "1"], grads)
    # |mean|^2 = (2/3)^2 + (1/3)^2 = 5/9; every |g|^2 is 1.
    assert figures["common_share"] == pytest.approx(5 / 9, abs=1e-3)
    assert figures["cos_same_card"] == pytest.approx(1.0)
    assert figures["cos_other_card"] == pytest.approx(0.0)
    # sign steps: moved[s, t] = g_s . sign(g_t); of the 6 ordered pairs only (0,1), (1,0) move.
    assert figures["adam_transfer"] == pytest.approx(2 / 6, abs=1e-3)


def test_log_odds_are_the_evaluated_policy():
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.pipeline.exploitability import llm_policy

    cfg = load_config(str(ROOT / "examples/kuhn_poker"), "nash", [
        "model.path=tiny", "model.device=cpu", "tracking.backends=[jsonl]", "save_steps=0",
        f"output_dir={tempfile.mkdtemp()}", "eval.eval_steps=0", "team.lora.rank=4"])
    pipeline = AgenticPipeline(cfg)
    render = state_gradients._render("recipe")
    names, grads, values = state_gradients.state_gradients(pipeline, "agent_0", render)
    assert len(names) == 12 and grads.shape[0] == 12 and torch.isfinite(grads).all()
    assert grads.abs().sum(1).min() > 0  # every state's log-odds reach the adapter
    table = llm_policy(cfg.env.game, {}, pipeline.trainer, pipeline.tokenizer,
                       lambda seat: "agent_0", render, cfg.rollout.sampling.temperature)
    for name, value in zip(names, values, strict=True):
        probs = table.policy_for_key(name)  # actions: 0 pass, 1 bet
        assert value == pytest.approx(float(np.log(probs[1] / probs[0])), abs=2e-3)
    # The other layout moves the seat's view (line 1) to the end and keeps every other line.
    from roll.agentic.env.openspiel_env import OpenSpielEnv

    env = OpenSpielEnv("kuhn_poker", {})
    env.set_state(table.states[0])
    recipe = render(env, 0).text.split("\n")
    last = state_gradients._render("state_last")(env, 0).text.split("\n")
    assert last == [recipe[0], *recipe[2:], recipe[1]]
    assert recipe[1].startswith("You are player 0. Your card:")


def test_private_card_of_kuhn_and_leduc_states():
    assert state_gradients.private_card("0pb") == "0"
    # Leduc's card c is 2 * rank + suit: 3 is the second suit's rank 1 (a Queen).
    assert state_gradients.private_card("[Observer: 1][Private: 3][Round 1][Player: 1]") == "1"
    assert state_gradients.private_card("[Observer: 0][Private: 4][Round 2][Player: 0]") == "2"


@pytest.mark.slow  # the whole Leduc policy is read (936 states)
def test_leduc_log_odds_are_the_evaluated_policy():
    """--game leduc_poker: sampled states where Call and Fold are both legal; each state's
    log-odds equals log(P(Call) / P(Fold)) of the policy the exploitability code reads."""
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config
    from roll.pipeline.exploitability import llm_policy

    cfg = load_config(str(ROOT / "examples/leduc_poker"), "nash", [
        "model.path=tiny", "model.device=cpu", "tracking.backends=[jsonl]", "save_steps=0",
        f"output_dir={tempfile.mkdtemp()}", "eval.eval_steps=0", "team.lora.rank=4"])
    pipeline = AgenticPipeline(cfg)
    render = state_gradients._render("recipe")
    names, grads, values = state_gradients.state_gradients(
        pipeline, "agent_0", render, ("Call", "Fold"), limit=5)
    assert len(names) == 5 and grads.shape[0] == 5 and torch.isfinite(grads).all()
    assert all("[Player: 0]" in name or "[Player: 1]" in name for name in names)
    table = llm_policy(cfg.env.game, {}, pipeline.trainer, pipeline.tokenizer,
                       lambda seat: "agent_0", render, cfg.rollout.sampling.temperature)
    for name, value in zip(names, values, strict=True):
        probs = table.policy_for_key(name)  # actions: 0 fold, 1 call, 2 raise
        assert probs[0] > 0 and probs[1] > 0  # both legal here
        assert value == pytest.approx(float(np.log(probs[1] / probs[0])), abs=2e-3)
