"""Can one adapter step move one information state's decision without moving the others?

    python benchmarks/state_gradients.py                       # SmolLM2-135M, Kuhn, CPU ok
    python benchmarks/state_gradients.py --tiny --override model.path=tiny-wide
    python benchmarks/state_gradients.py --layout state_last   # the seat's view after the rules

Kuhn poker needs a different move in different information states (bet K, fold J to a bet, ...).
A table moves each state's logit alone; an adapter moves them through shared weights. For each of
the 12 information states of Kuhn (each played by agent_0), this script takes the gradient, with
respect to agent_0's adapter, of the state's log-odds of betting/calling (log P(Bet) - log
P(Pass) under constrained decoding) and prints, as JSON:
- ``common_share``: |mean gradient|^2 / mean |gradient|^2, the share of the gradients' energy
  that moves every state the same way (1: a step can only move all states together; 1/12 if
  the 12 gradients were orthogonal);
- ``cos_same_card`` / ``cos_other_card``: mean cosine between states with the same private card
  (other histories) / with other cards;
- ``adam_transfer``: Adam's first step is ``lr * sign(gradient)``; the mean over pairs of the
  change it makes in another state's log-odds relative to the change in its own state (1: a
  step taken for one state moves every other state as much);
- ``log_odds``: each state's present log-odds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = {
    "recipe": None,                       # rules, state, moves, answer format (as shipped)
    "state_last": (0, 2, 3, 1),           # rules, moves, answer format, state
    "format_first": (0, 3, 1, 2),         # rules, answer format, state, moves
    "repeat_state": (0, 1, 2, 3, 1),      # the state again at the end
    "no_rules": (1, 2, 3),
}
"""Prompt layouts: the order of the recipe prompt's parts (0 rules, 1 the seat's view, 2 legal
moves, 3 answer format)."""


def _render(layout: str):
    from roll.agentic.env.renderers import RenderedPrompt, render_prompt

    def render(env, seat):
        prompt = render_prompt(env, seat)
        order = LAYOUTS[layout]
        if order is None:
            return prompt
        lines = prompt.text.split("\n")  # rules, state, "Legal moves:", moves..., answer format
        parts = [lines[0], lines[1], "\n".join(lines[2:-1]), lines[-1]]
        return RenderedPrompt("\n".join(parts[i] for i in order), prompt.numbered_moves)
    return render


def state_gradients(pipeline, agent: str, render) -> tuple[list[str], torch.Tensor, list[float]]:
    """Kuhn information-state strings, their log-odds gradients (states, parameters), log-odds."""
    from open_spiel.python import policy as policy_lib

    from roll.agentic.env.actions import answer_token_ids
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.inference.constrained import CompletionTrie
    from roll.models.loading import prompt_ids

    cfg, model, tokenizer = pipeline.cfg, pipeline.model, pipeline.tokenizer
    env = OpenSpielEnv(cfg.env.game, dict(cfg.env.params))
    tabular = policy_lib.TabularPolicy(env.game)
    params = [p for p in model.agent_parameters(agent) if p.requires_grad]
    device = params[0].device
    names, grads, values = [], [], []
    for state in tabular.states:
        seat = state.current_player()
        env.set_state(state)
        ids = prompt_ids(tokenizer, render(env, seat).text, None, cfg.model.enable_thinking)
        moves = env.legal_actions(seat)
        completions = answer_token_ids(tokenizer, moves)
        rows = [ids + c for c in completions]
        width = max(map(len, rows))
        input_ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        positions = torch.zeros_like(input_ids, dtype=torch.bool)
        for r, row in enumerate(rows):
            input_ids[r, :len(row)] = torch.tensor(row)
            attention[r, :len(row)] = 1
            positions[r, len(ids):len(row)] = True
        agent_id = torch.full((len(rows),), model.agent_index(agent))
        logprobs, _ = model(input_ids.to(device), attention.to(device), agent_id.to(device),
                            positions=positions.to(device),
                            temperature=cfg.rollout.sampling.temperature)
        # Constrained decoding chooses at Kuhn's one branching point; every other answer token
        # is forced (probability 1 under the constrained policy).
        bet = moves.index("Bet")
        (branch, _, _), = CompletionTrie(completions).branch_points(completions[bet])
        at = len(ids) + branch
        log_odds = logprobs[bet, at] - logprobs[1 - bet, at]
        grad = torch.autograd.grad(log_odds, params)
        names.append(state.information_state_string(seat))
        grads.append(torch.cat([g.reshape(-1) for g in grad]).float().cpu())
        values.append(round(float(log_odds.detach()), 3))
    return names, torch.stack(grads), values


def summary(names: list[str], grads: torch.Tensor) -> dict:
    """The figures the module docstring defines, from per-state gradients."""
    n = len(names)
    mean = grads.mean(0)
    common = float(mean.square().sum() / grads.square().sum(1).mean())
    unit = grads / grads.norm(dim=1, keepdim=True)
    cos = unit @ unit.T
    same = [float(cos[i, j]) for i in range(n) for j in range(n)
            if i != j and names[i][0] == names[j][0]]
    other = [float(cos[i, j]) for i in range(n) for j in range(n) if names[i][0] != names[j][0]]
    moved = grads @ torch.sign(grads).T  # [s, t]: change of s's log-odds per unit Adam step for t
    own = moved.diagonal()
    transfer = [float(moved[s, t] / own[s]) for s in range(n) for t in range(n) if s != t]
    return {"common_share": round(common, 3),
            "cos_same_card": round(sum(same) / len(same), 3),
            "cos_other_card": round(sum(other) / len(other), 3),
            "adam_transfer": round(sum(transfer) / len(transfer), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny random model")
    parser.add_argument("--layout", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    parser.add_argument("--override", nargs="*", default=[])
    args = parser.parse_args()

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    overrides = [f"model.path={'tiny' if args.tiny else 'smollm2-135m'}",
                 f"model.device={device}", "tracking.backends=[jsonl]", "save_steps=0",
                 f"output_dir={tempfile.mkdtemp(prefix='state_gradients_')}",
                 "eval.eval_steps=0", *args.override]
    cfg = load_config(str(ROOT / "examples/kuhn_poker"), "nash", overrides)
    pipeline = AgenticPipeline(cfg)
    for layout in args.layout:
        names, grads, values = state_gradients(pipeline, "agent_0", _render(layout))
        print(json.dumps({"model": cfg.model.path, "layout": layout, **summary(names, grads),
                          "log_odds": dict(zip(names, values, strict=True))}), flush=True)


if __name__ == "__main__":
    main()
