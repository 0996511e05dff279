"""Can the adapter hold the O seat's answer at all? Supervised learning of the best response.

    python benchmarks/tictactoe_imitation.py --epochs 30 --eval_every 5    # GPU, lines prompt
    python benchmarks/tictactoe_imitation.py --epochs 30 env.renderer=      # the plain board
    python benchmarks/tictactoe_imitation.py --tiny --epochs 1 --max_boards 64     # CPU smoke

The RL recipes leave the O seat at 55-70% wins against random with blocks at chance
(benchmarks/README.md, sessions 52-55). Two causes would look alike: the adapter cannot map
this prompt to the right cell (representation), or the reward reaches it too weakly
(credit). This separates them: agent_0's adapter is trained by plain supervised learning
(the log-probability constrained decoding gives the target answer after the prompt the
rollout shows: its choices among the allowed tokens) on
every board where O is to move (2,097), the target being the exact best response to the random
player (`tictactoe_vs_random`: the move maximising P(win) - w P(loss), w = ``--loss_weight``;
ties: the lowest cell; at w = 1 it wins 93.2% and loses 0.7% as O). Every ``--eval_every``
epochs the adapter's move table is scored exactly as the RL runs are (`tictactoe_policy`: win
/ loss against random as O, sampled at 1.0 and greedy, blocks, wins taken), with its accuracy
(the target's share of the argmax moves, on every board and on those trained) and ``nll``,
the epoch's mean supervised loss. If imitation reaches the goal (>= 85% wins, <= 5% losses) in
a few hundred updates, the RL recipe's credit is what falls short; if it does not, the prompt
/ model / rank is. Prints one JSON line per evaluation, then a summary
(``$OUT/tictactoe_imitation<--tag>.json`` when OUT is set).
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
import tictactoe_policy  # noqa: E402
from imitation import answer_row, fit_epoch, imitation_pipeline, supervised_step  # noqa: E402,F401
from tictactoe_vs_random import best  # noqa: E402

AGENT = "agent_0"


def best_moves(boards: list[str], me: str, loss_weight: float) -> dict[str, int]:
    """board -> the cell of the best response to the random player (ties: the lowest)."""
    other = "O" if me == "X" else "X"
    targets = {}
    for board in boards:
        def gain(cell: int, board=board) -> float:
            win, loss = best(board[:cell] + me + board[cell + 1:], other, me, loss_weight)
            return win - loss_weight * loss
        free = [i for i, c in enumerate(board) if c == "."]
        targets[board] = max(free, key=lambda cell: (gain(cell), -cell))
    return targets


def target_rows(pipeline, targets: dict[str, int]) -> list[tuple[list[int], int, list]]:
    """Per board, as the rollout shows it: ``imitation.answer_row`` of its target cell."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv

    env = OpenSpielEnv("tic_tac_toe", dict(pipeline.cfg.env.params))
    rows = []
    for board, cell in targets.items():
        state = tictactoe_policy.board_state(env.game, board)
        env.set_state(state)
        rows.append(answer_row(pipeline, env, state.current_player(), cell))
    return rows


def evaluate(pipeline, targets: dict[str, int], trained: set[str], seat: int) -> dict:
    """The adapter's exact figures as ``seat`` (tictactoe_policy.figures) over the boards of
    ``targets``, and its accuracy (argmax move == target) on all of them and on the
    ``trained`` ones."""
    boards = list(targets)
    table = tictactoe_policy.agent_policies(pipeline, boards, agents=[AGENT])[AGENT]
    hits = {board: int(np.argmax(table[board])) == cell for board, cell in targets.items()}
    return {**tictactoe_policy.figures(table, seat),
            "accuracy": round(float(np.mean(list(hits.values()))), 4),
            "train_accuracy": round(float(np.mean([hits[board] for board in trained])), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--mark", default="O", choices=["X", "O"], help="the seat imitated")
    parser.add_argument("--loss_weight", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--eval_every", type=int, default=5, help="epochs between scorings")
    parser.add_argument("--batch", type=int, default=64, help="boards per update")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--max_boards", type=int, default=0,
                        help="train on this many boards only (0: all; scoring uses all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tag", default="", help="suffix of the summary's file name")
    parser.add_argument("--skip_untrained", action="store_true",
                        help="do not score the untrained adapter first (its figures are the "
                             "same in every run of one prompt and model)")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value) of "
                        "examples/tictactoe/mixed.yaml (the lines prompt), e.g. "
                        "env.renderer= for the plain board")
    args = parser.parse_args()

    from roll.multi_agent.config import OptimConfig
    from roll.multi_agent.optim import build_optimizer

    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    out = Path(os.environ.get("OUT", "/tmp"))
    pipeline = imitation_pipeline("tictactoe", "mixed", "tiny" if args.tiny else args.model,
                                  args.seed, out, "tictactoe_imitation_run", args.overrides)
    cfg = pipeline.cfg
    model = pipeline.model
    seat = "XO".index(args.mark)
    boards = [b for b in tictactoe_policy.decision_boards()
              if tictactoe_policy.to_move(b) == args.mark]
    targets = best_moves(boards, args.mark, args.loss_weight)
    rows = target_rows(pipeline, targets)
    rng = np.random.default_rng(args.seed)
    train = rng.permutation(len(rows))[:args.max_boards or len(rows)]
    trained = {boards[i] for i in train}
    optimizer = build_optimizer(model.agent_parameters(AGENT), OptimConfig(lr=args.lr))
    pad = pipeline.tokenizer.pad_token_id or 0
    curve, updates, start = [], 0, time.perf_counter()

    def record(epoch: int, nll: float | None) -> None:
        point = {"epoch": epoch, "updates": updates, "nll": nll,
                 "seconds": round(time.perf_counter() - start, 1),
                 **evaluate(pipeline, targets, trained, seat)}
        curve.append(point)
        print(json.dumps(point), flush=True)

    if not args.skip_untrained:
        record(0, None)
    for epoch in range(1, args.epochs + 1):
        updates, nll = fit_epoch(model, rows, rng.permutation(train), args.batch, AGENT, pad,
                                 optimizer, updates)
        if epoch % args.eval_every == 0 or epoch == args.epochs:
            record(epoch, round(nll, 4))
    summary = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "model": "tiny" if args.tiny else args.model, "mark": args.mark,
               "loss_weight": args.loss_weight, "boards": len(boards), "trained_on": len(train),
               "batch": args.batch, "lr": args.lr, "overrides": args.overrides,
               "renderer": cfg.env.renderer, "lora_rank": cfg.team.lora.rank, "curve": curve}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"tictactoe_imitation{args.tag}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
