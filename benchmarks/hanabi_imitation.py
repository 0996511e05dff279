"""Can an adapter hold a good Hanabi convention at all? Supervised learning of the rule team.

    python benchmarks/hanabi_imitation.py --epochs 6 --lr 5e-4                     # SmolLM2, GPU
    python benchmarks/hanabi_imitation.py --tiny --epochs 3 --lr 1e-3             # tiny-wide, CPU
    python benchmarks/hanabi_imitation.py --tiny --games 8 --epochs 1 --eval_games 4   # smoke

Every Hanabi recipe so far stalls near random play's level (benchmarks/README.md, "Hanabi");
the stand-in (an MLP over the observation tensor, the same update rule) goes on to 2.2-2.7 at
three lives. Two causes would look alike: the adapter cannot map this prompt to a good move
(the prompt, the model, the rank: representation), or the reward reaches it too weakly
(credit). This separates them, as ``tictactoe_imitation.py`` does for TicTacToe: agent_0's
adapter learns by supervised learning the three-line rule team's move
(``hanabi_baselines.rule_move``: 3.64 of 6, it never loses a life) on the decisions of
``--games`` games the rule team plays, a share ``--explore`` of whose moves are random instead
(so that states the rule never reaches, a life lost or a card wasted, are seen and labelled
too). The loss is minus the log-probability constrained decoding gives the rule's move after
the rollout's prompt (``imitation.supervised_step``). Every ``--eval_every`` epochs agent_0
plays ``--eval_games`` deals in both seats, greedy and sampled at the rollout's temperature
(``hanabi_policy.play``), and its accuracy (argmax move == the rule's) is read on the
decisions of ``--heldout_games`` other games. If the clone plays far above random play, the
prompt and the adapter can carry a convention and the RL recipes' credit is what falls short;
if it stays near random play, the policy's input is the gap. One JSON line per evaluation, then
a summary (``$OUT/hanabi_imitation<--tag>.json`` when OUT is set). The game is
``examples/hanabi/team.yaml``'s with three lives unless an override says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import hanabi_policy  # noqa: E402
from hanabi_baselines import lives_left, parse_view, resolve_chance, rule_move  # noqa: E402
from imitation import answer_row, fit_epoch  # noqa: E402

AGENT = "agent_0"


def rule_decisions(game, games: int, explore: float, seed: int) -> list[tuple[object, int]]:
    """The decisions of ``games`` games (deals from ``seed``) as (state, the rule's action id):
    each move played is the rule's, or with probability ``explore`` a random legal one; the
    label is the rule's move either way."""
    rng = np.random.default_rng(seed)
    choices = random.Random(seed + 1)
    decisions = []
    for _ in range(games):
        state = game.new_initial_state()
        resolve_chance(state, rng)
        while not state.is_terminal():
            seat = state.current_player()
            actions = {state.action_to_string(seat, a): a for a in state.legal_actions(seat)}
            target = actions[rule_move(parse_view(state.observation_string(seat)),
                                       list(actions), choices)]
            decisions.append((state.clone(), target))
            played = (choices.choice(list(actions.values())) if choices.random() < explore
                      else target)
            state.apply_action(played)
            resolve_chance(state, rng)
    return decisions


def decision_rows(pipeline, env, decisions) -> list[tuple[list[int], int, list]]:
    """``imitation.answer_row`` of each decision's target."""
    rows = []
    for state, target in decisions:
        env.set_state(state)
        rows.append(answer_row(pipeline, env, state.current_player(), target))
    return rows


def accuracy(pipeline, env, decisions) -> float:
    """The share of ``decisions`` whose most probable move for agent_0 is the rule's."""
    from roll.pipeline.exploitability import move_probabilities

    hits = []
    for first in range(0, len(decisions), 64):
        part = decisions[first:first + 64]
        scored = move_probabilities(
            env, [state for state, _ in part], pipeline.trainer, pipeline.tokenizer,
            lambda seat: AGENT, pipeline.render, 0.0,
            enable_thinking=pipeline.cfg.model.enable_thinking)
        hits += [action_ids[int(np.argmax(probs))] == target
                 for (_, target), (action_ids, probs) in zip(part, scored, strict=True)]
    return float(np.mean(hits))


def team_score(pipeline, env, games: int, seed: int, temperature: float) -> dict:
    """agent_0 in both seats on ``games`` deals: the mean score with its 95% interval, and the
    share of games that lost every life."""
    from roll.pipeline.evaluation import mean_interval

    rng = np.random.default_rng(seed)
    states = hanabi_policy.deal(env, games, rng)
    moves, kinds = hanabi_policy.play(pipeline, env, states, rng, temperature, lambda seat: AGENT)
    mean, low, high = mean_interval([state.returns()[0] for state in states])
    return {"score": round(mean, 3), "low": round(low, 3), "high": round(high, 3),
            "lost_all_lives": round(float(np.mean([lives_left(s) == 0 for s in states])), 3),
            "moves": dict(sorted(kinds.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny-wide on CPU (the model the "
                        "tiny learning runs use; model.path=tiny overrides it)")
    parser.add_argument("--games", type=int, default=600, help="games whose decisions train")
    parser.add_argument("--heldout_games", type=int, default=40)
    parser.add_argument("--explore", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--eval_every", type=int, default=1, help="epochs between scorings")
    parser.add_argument("--eval_games", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64, help="decisions per update")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="", help="suffix of the summary's file name")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) of "
                        "examples/hanabi/team.yaml, e.g. model.path=tiny-wide team.lora.rank=64")
    args = parser.parse_args()

    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.multi_agent.config import OptimConfig
    from roll.multi_agent.optim import build_optimizer
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    out = Path(os.environ.get("OUT", "/tmp"))
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    cfg = load_config(str(ROOT / "examples/hanabi"), "team", [
        *(["model.path=tiny-wide"] if args.tiny else []), f"model.device={device}",
        "env.params.max_life_tokens=3", "trainer.compile=false", f"seed={args.seed}",
        "tracking.backends=[jsonl]", f"output_dir={out / 'hanabi_imitation_run'}",
        *args.overrides])
    pipeline = AgenticPipeline(cfg)
    model = pipeline.model
    env = OpenSpielEnv("hanabi", dict(cfg.env.params))
    start = time.perf_counter()
    train = rule_decisions(env.game, args.games, args.explore, args.seed)
    heldout = rule_decisions(env.game, args.heldout_games, args.explore, args.seed + 10_000)
    rows = decision_rows(pipeline, env, train)
    print(json.dumps({"decisions": len(train), "heldout": len(heldout),
                      "prompt_tokens": round(float(np.mean([n for _, n, _ in rows])), 1),
                      "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    optimizer = build_optimizer(model.agent_parameters(AGENT), OptimConfig(lr=args.lr))
    pad = pipeline.tokenizer.pad_token_id or 0
    rng = np.random.default_rng(args.seed)
    curve, updates = [], 0

    def record(epoch: int, nll: float | None) -> None:
        point = {"epoch": epoch, "updates": updates, "nll": nll,
                 "accuracy": round(accuracy(pipeline, env, heldout), 4),
                 "greedy": team_score(pipeline, env, args.eval_games, args.seed + 1, 0.0),
                 "sampled": team_score(pipeline, env, args.eval_games, args.seed + 2,
                                       cfg.rollout.sampling.temperature),
                 "seconds": round(time.perf_counter() - start, 1)}
        curve.append(point)
        print(json.dumps(point), flush=True)

    record(0, None)
    for epoch in range(1, args.epochs + 1):
        updates, nll = fit_epoch(model, rows, rng.permutation(len(rows)), args.batch, AGENT, pad,
                                 optimizer, updates)
        if epoch % args.eval_every == 0 or epoch == args.epochs:
            record(epoch, round(nll, 4))
    summary = {"device": torch.cuda.get_device_name() if cfg.model.device == "cuda" else "cpu",
               "model": cfg.model.path, "params": dict(cfg.env.params),
               "renderer": cfg.env.renderer, "lora_rank": cfg.team.lora.rank,
               "games": args.games, "decisions": len(train), "explore": args.explore,
               "batch": args.batch, "lr": args.lr, "overrides": args.overrides, "curve": curve}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"hanabi_imitation{args.tag}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
