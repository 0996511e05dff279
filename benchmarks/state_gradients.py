"""Can one adapter step move one information state's decision without moving the others?

    python benchmarks/state_gradients.py                       # SmolLM2-135M, Kuhn, CPU ok
    python benchmarks/state_gradients.py --tiny --override model.path=tiny-wide
    python benchmarks/state_gradients.py --layout state_last   # the seat's view after the rules
    python benchmarks/state_gradients.py --game leduc_poker --states 60   # Leduc, 60 sampled states

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

``--game leduc_poker`` does the same for Leduc (``examples/leduc_poker/nash.yaml``'s prompt) over
``--states`` information states sampled from its 936, for two log-odds: Call vs Fold (states
facing a bet) and Raise vs Call (states where a raise is legal), one JSON line per pair; the
card figures compare the private card (J/Q/K of either suit).
"""

from __future__ import annotations

import argparse
import itertools
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


PAIRS = {"kuhn_poker": [("Bet", "Pass")], "leduc_poker": [("Call", "Fold"), ("Raise", "Call")]}
"""The log-odds measured per game: log P(first) - log P(second), where both moves are legal."""
CONFIGS = {"kuhn_poker": "examples/kuhn_poker", "leduc_poker": "examples/leduc_poker"}


def state_gradients(pipeline, agent: str, render, pair: tuple[str, str] = ("Bet", "Pass"),
                    limit: int | None = None,
                    seed: int = 0) -> tuple[list[str], torch.Tensor, list[float]]:
    """Information-state strings where both moves of ``pair`` are legal (all of them, or
    ``limit`` sampled with ``seed``), their log-odds gradients (states, parameters), log-odds."""
    import random

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
    states = []
    for state in tabular.states:
        env.set_state(state)
        if all(move in env.legal_actions(state.current_player()) for move in pair):
            states.append(state)
    if limit is not None and len(states) > limit:
        states = random.Random(seed).sample(states, limit)
    for state in states:
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
        # Constrained decoding chooses at the answers' one branching point (Kuhn's and Leduc's
        # moves part at one token); every other answer token is forced (probability 1 under
        # the constrained policy), so the log-odds of two moves is that of their tokens there.
        first, second = moves.index(pair[0]), moves.index(pair[1])
        (branch, _, _), = CompletionTrie(completions).branch_points(completions[first])
        at = len(ids) + branch
        log_odds = logprobs[first, at] - logprobs[second, at]
        grad = torch.autograd.grad(log_odds, params)
        names.append(state.information_state_string(seat))
        grads.append(torch.cat([g.reshape(-1) for g in grad]).float().cpu())
        values.append(round(float(log_odds.detach()), 3))
    return names, torch.stack(grads), values


def private_card(name: str) -> str:
    """The private card of an information-state string: Kuhn's first character; Leduc's
    rank ("[Private: c]", c = 2 * rank + suit)."""
    if name.startswith("[Observer"):
        return str(int(name.split("[Private: ")[1].split("]")[0]) // 2)
    return name[0]


def summary(names: list[str], grads: torch.Tensor) -> dict:
    """The figures the module docstring defines, from per-state gradients."""
    n = len(names)
    cards = [private_card(name) for name in names]
    mean = grads.mean(0)
    common = float(mean.square().sum() / grads.square().sum(1).mean())
    unit = grads / grads.norm(dim=1, keepdim=True)
    cos = unit @ unit.T
    same = [float(cos[i, j]) for i in range(n) for j in range(n)
            if i != j and cards[i] == cards[j]]
    other = [float(cos[i, j]) for i in range(n) for j in range(n) if cards[i] != cards[j]]
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
    parser.add_argument("--game", default="kuhn_poker", choices=list(PAIRS))
    parser.add_argument("--states", type=int, default=None,
                        help="sample this many information states per log-odds (default: all)")
    args = parser.parse_args()

    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    overrides = [f"model.path={'tiny' if args.tiny else 'smollm2-135m'}",
                 f"model.device={device}", "tracking.backends=[jsonl]", "save_steps=0",
                 f"output_dir={tempfile.mkdtemp(prefix='state_gradients_')}",
                 "eval.eval_steps=0", *args.override]
    cfg = load_config(str(ROOT / CONFIGS[args.game]), "nash", overrides)
    pipeline = AgenticPipeline(cfg)
    layouts = args.layout if args.game == "kuhn_poker" else ["recipe"]  # LAYOUTS: Kuhn's lines
    for layout, pair in itertools.product(layouts, PAIRS[args.game]):
        names, grads, values = state_gradients(pipeline, "agent_0", _render(layout), pair,
                                               args.states)
        result = {"model": cfg.model.path, "game": args.game, "layout": layout,
                  "log_odds_of": f"{pair[0]} vs {pair[1]}", "states": len(names),
                  **summary(names, grads)}
        if args.game == "kuhn_poker":
            result["log_odds"] = dict(zip(names, values, strict=True))
        else:
            result["log_odds_mean_abs"] = round(sum(map(abs, values)) / len(values), 3)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
