"""Can the adapter learn to take a win and block a threat from this prompt? Supervised learning of
a three-line rule's Connect Four moves.

    python benchmarks/connect_four_imitation.py --epochs 20 --eval_every 5      # GPU, plain board
    python benchmarks/connect_four_imitation.py --epochs 20 env.renderer=connect_four_lines
    python benchmarks/connect_four_imitation.py --tiny --epochs 2 --positions 16  # CPU smoke

Before an RL run says whether a recipe's credit reaches the moves that matter, this asks whether
the adapter can hold them at all (as ``tictactoe_imitation.py`` does for TicTacToe): agent_0's
adapter is trained by plain supervised learning (minus the log-probability constrained decoding
gives the target answer after the prompt the rollout shows: ``imitation.supervised_step``) on
``--positions`` positions of each kind (win / block / quiet, ``connect_four_policy.positions``)
and seat, from random games of seed 0; the target is the rule's move (win now, else block,
else the centre-most column: ``connect_four_baselines.rule_move``). Every ``--eval_every``
epochs the adapter is probed as the RL runs are (``connect_four_policy``: wins taken, blocks
made, sampled at 1.0 and greedy) on the trained positions and on held-out ones (seed 1, none
of them trained: a fit that holds there reads the board, one that does not remembers boards).
Prints one JSON line per evaluation, then a summary (``$OUT/connect_four_imitation<--tag>.json``
when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import connect_four_policy as policy  # noqa: E402
from connect_four_baselines import _board, rule_move  # noqa: E402
from imitation import answer_row, fit_epoch, imitation_pipeline  # noqa: E402

AGENT = "agent_0"


def target_rows(pipeline, found: dict[int, dict[str, list]]) -> list[tuple[list[int], int, list]]:
    """Every position of ``found`` as the rollout shows it, with the rule's move as its target
    (``imitation.answer_row``)."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv

    env = OpenSpielEnv("connect_four", dict(pipeline.cfg.env.params))
    rows = []
    for seat in (0, 1):
        for state in policy.states_of(found[seat]):
            env.set_state(state)
            move = rule_move(_board(state), seat, state.legal_actions(seat))
            rows.append(answer_row(pipeline, env, seat, move))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--positions", type=int, default=200,
                        help="positions of each kind and seat, trained and held out")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--eval_every", type=int, default=5, help="epochs between probes")
    parser.add_argument("--batch", type=int, default=64, help="positions per update")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="", help="suffix of the summary's file name")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) of "
                        "examples/connect_four/mixed.yaml, e.g. env.renderer=connect_four_lines")
    args = parser.parse_args()

    from roll.multi_agent.config import OptimConfig
    from roll.multi_agent.optim import build_optimizer

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    out = Path(os.environ.get("OUT", "/tmp"))
    pipeline = imitation_pipeline("connect_four", "mixed", "tiny" if args.tiny else args.model,
                                  args.seed, out, "connect_four_imitation_run", args.overrides)
    cfg = pipeline.cfg
    model = pipeline.model
    trained, held_out = policy.positions(args.positions, 0), policy.positions(args.positions, 1)
    rows = target_rows(pipeline, trained)
    rng = np.random.default_rng(args.seed)
    optimizer = build_optimizer(model.agent_parameters(AGENT), OptimConfig(lr=args.lr))
    pad = pipeline.tokenizer.pad_token_id or 0
    curve, updates, start = [], 0, time.perf_counter()

    def record(epoch: int, nll: float | None) -> None:
        point = {"epoch": epoch, "updates": updates, "nll": nll,
                 "seconds": round(time.perf_counter() - start, 1),
                 "trained": policy.scores(pipeline, trained, [AGENT])[AGENT],
                 "held_out": policy.scores(pipeline, held_out, [AGENT])[AGENT]}
        curve.append(point)
        print(json.dumps(point), flush=True)

    record(0, None)
    for epoch in range(1, args.epochs + 1):
        updates, nll = fit_epoch(model, rows, rng.permutation(len(rows)), args.batch, AGENT,
                                 pad, optimizer, updates)
        if epoch % args.eval_every == 0 or epoch == args.epochs:
            record(epoch, round(nll, 4))
    summary = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "model": "tiny" if args.tiny else args.model, "positions": len(rows),
               "batch": args.batch, "lr": args.lr, "overrides": args.overrides,
               "renderer": cfg.env.renderer, "lora_rank": cfg.team.lora.rank,
               "rule_on_held_out": policy.reference(held_out)["rule"], "curve": curve}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"connect_four_imitation{args.tag}.json").write_text(json.dumps(summary, indent=1)
                                                               + "\n")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
