"""Does an adapter step toward the right column in one Connect Four position take the right
column in others, or only that column? What RL's per-move credit can move, per model and prompt.

    python benchmarks/connect_four_gradients.py --tiny                        # CPU, seconds
    python benchmarks/connect_four_gradients.py --positions 12                # SmolLM2, CPU ok
    python benchmarks/connect_four_gradients.py --positions 12 env.renderer=  # the plain board

``state_gradients.py`` asks this of Kuhn's information states. Here, for the probe's win and
block positions (``connect_four_policy.positions``, seed 1, ``--positions`` of each kind and
seat), the gradients with respect to agent_0's adapter of the log-probability constrained
decoding gives each legal column (minus ``imitation.supervised_step`` of one row), at the start
of a run (the adapter as initialised). The right column is the rule's
(``connect_four_baselines.rule_move``). Adam's first step for position s is ``lr * sign(g_s)``,
``g_s`` the gradient of s's log P(right); per unit of such a step it changes s's own log
P(right) by ``g_s . sign(g_s)`` and position t's log P(c) by ``g_t,c . sign(g_s)``. Measured
against t's mean change over its legal columns (the part normalisation takes back), over pairs
s != t whose right columns differ:

- ``reads``: the change of t's right column (its own reason: a win or a block there),
  relative to s's own change;
- ``column``: the change of t's log P of s's right column (wrong in t), relative: > 0, the
  step teaches "play that column" (a column preference, which other positions cancel);

and ``transfer_same_column``: over pairs with the same right column, t's change of log
P(right) relative to s's own (no centring); ``common_share``: ``|mean g|^2 / mean |g|^2`` of
the right columns' gradients; ``reads_batch``: as ``reads``, for one step taken for half of
the positions together (alternate ones), measured on the other half (``batch_reads``), beside
``decoy_batch``, the same for columns right in other positions of that half but not in t (a
step that only prefers the usual right columns, centre ones, raises both alike).

Measured (benchmarks/README.md, "Connect Four: why the tiny model's RL stands still"): one
position's step is mostly its column (``column`` 0.39-0.65, ``reads`` -0.09 to -0.02) in every
model and prompt, even after imitation has taught the tiny model to read (``reads`` -0.06), so
``reads`` does not tell a reader; ``reads_batch - decoy_batch`` does (the tiny model 0.26 as
initialised, 0.74 after 1,140 imitation updates). Prints one JSON object
(``$OUT/connect_four_gradients<--tag>.json`` when OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import connect_four_policy as policy  # noqa: E402
from connect_four_baselines import _board, rule_move  # noqa: E402
from imitation import answer_row, imitation_pipeline, supervised_step  # noqa: E402

AGENT = "agent_0"


def column_gradient(pipeline, env, seat: int, column: int) -> tuple[torch.Tensor, float]:
    """The gradient (flat, on the CPU) of log P(``column``) for ``seat`` in ``env``'s state
    with respect to agent_0's adapter, and the log-probability."""
    model = pipeline.model
    params = [p for p in model.agent_parameters(AGENT) if p.requires_grad]
    row = answer_row(pipeline, env, seat, column)
    logp = -supervised_step(model, [row], model.agent_index(AGENT),
                            pipeline.tokenizer.pad_token_id or 0, model.tensor_device)
    grad = torch.autograd.grad(logp, params)
    return torch.cat([g.reshape(-1) for g in grad]).float().cpu(), float(logp.detach())


def cases_of(found: dict[int, dict[str, list]], kinds=("win", "block")):
    """``[(seat, kind, state, right column)]`` for the positions of ``kinds`` in ``found``."""
    out = []
    for seat in (0, 1):
        states, start = policy.states_of(found[seat]), 0
        for kind in policy.KINDS:
            count = len(found[seat][kind])
            if kind in kinds:
                for state in states[start:start + count]:
                    legal = state.legal_actions(seat)
                    out.append((seat, kind, state, rule_move(_board(state), seat, legal)))
            start += count
    return out


def measure(pipeline, cases) -> dict:
    """The module docstring's figures over ``cases`` (``cases_of``)."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv

    env = OpenSpielEnv("connect_four", dict(pipeline.cfg.env.params))
    right, logps = [], []
    for seat, _, state, column in cases:  # pass 1: each right column's gradient
        env.set_state(state)
        grad, logp = column_gradient(pipeline, env, seat, column)
        right.append(grad)
        logps.append(logp)
    grads = torch.stack(right)
    halves = [list(range(0, len(cases), 2)), list(range(1, len(cases), 2))]
    # Adam's first step for each position, then for each half of them together
    steps = torch.sign(torch.cat([grads, torch.stack([grads[h].sum(0) for h in halves])]))
    own = (grads * steps[:len(cases)]).sum(1)  # s's own change per unit step
    moved = {}  # t -> {column: (s,) change of t's log P(column) per unit step for s}
    for t, (seat, _, state, column) in enumerate(cases):  # pass 2: the other legal columns
        env.set_state(state)
        moved[t] = {c: (grads[t] if c == column else column_gradient(pipeline, env, seat, c)[0])
                    @ steps.T for c in state.legal_actions(seat)}
    columns = [c for *_, c in cases]
    per_position = {t: {c: v[:len(cases)] for c, v in m.items()} for t, m in moved.items()}
    return summary(columns, grads, own, per_position) | batch_reads(
        columns, grads, steps[len(cases):], halves, moved, len(cases)) | {
        "mean_logp_right": round(sum(logps) / len(logps), 4)}


def batch_reads(columns: list[int], grads: torch.Tensor, half_steps: torch.Tensor,
                halves: list[list[int]], moved: dict[int, dict[int, torch.Tensor]],
                n: int) -> dict:
    """``reads_batch``: one Adam step for half of the positions together (their right columns'
    summed gradient; the column parts of different positions cancel there, what they share
    adds up): the mean change of the other half's log P(right), less each one's mean over its
    columns, relative to the stepped half's own mean change of log P(right); and
    ``own_batch``, that own change per unit step. ``moved[t][c]`` holds t's change of
    log P(c) per unit step for each position, then for each half (``half_steps``)."""
    reads, decoys, owns = [], [], []
    for h, half in enumerate(halves):
        own = float((grads[half] * half_steps[h]).sum(1).mean())
        owns.append(own)
        others = halves[1 - h]
        for t in others:
            change = {c: float(v[n + h]) / own for c, v in moved[t].items()}
            centre = sum(change.values()) / len(change)
            reads.append(change[columns[t]] - centre)
            # the same step on columns that are right elsewhere in that half, not in t: as
            # often right as t's own, so what a preference for the usual columns gives
            decoys += [change[columns[u]] - centre for u in others
                       if columns[u] != columns[t] and columns[u] in change]
    return {"reads_batch": round(sum(reads) / len(reads), 4),
            "decoy_batch": round(sum(decoys) / len(decoys), 4) if decoys else None,
            "own_batch": round(sum(owns) / len(owns), 4)}


def summary(columns: list[int], grads: torch.Tensor, own: torch.Tensor,
            moved: dict[int, dict[int, torch.Tensor]]) -> dict:
    """``reads``, ``column``, ``transfer_same_column`` and ``common_share`` from the right
    columns (per position), their gradients (positions, params), each position's own change
    per unit step (positions,) and ``moved[t][c][s]``, t's change of log P(c) per unit step
    for s."""
    n = len(columns)
    mean = grads.mean(0)
    out = {"common_share": round(float(mean.square().sum() / grads.square().sum(1).mean()), 4)}
    reads, column, same = [], [], []
    for s in range(n):
        for t in range(n):
            if s == t:
                continue
            change = {c: float(v[s]) / float(own[s]) for c, v in moved[t].items()}
            if columns[s] == columns[t]:
                same.append(change[columns[t]])
                continue
            centre = sum(change.values()) / len(change)
            reads.append(change[columns[t]] - centre)
            if columns[s] in change:
                column.append(change[columns[s]] - centre)
    out["transfer_same_column"] = round(sum(same) / len(same), 4) if same else None
    out["reads"] = round(sum(reads) / len(reads), 4) if reads else None
    out["column"] = round(sum(column) / len(column), 4) if column else None
    out["pairs_same_column"], out["pairs_other_column"] = len(same), len(reads)
    return out


def imitate(pipeline, epochs: int, per_kind: int = 200, batch: int = 64, lr: float = 2e-4) -> int:
    """``connect_four_imitation.py``'s training (the rule's moves at ``per_kind`` positions of
    each kind and seat, seed 0) for ``epochs`` epochs; the updates done."""
    import numpy as np
    from connect_four_imitation import target_rows
    from imitation import fit_epoch

    from roll.multi_agent.config import OptimConfig
    from roll.multi_agent.optim import build_optimizer
    from roll.utils.stages import stage

    rows = target_rows(pipeline, policy.positions(per_kind, seed=0))
    optimizer = build_optimizer(pipeline.model.agent_parameters(AGENT), OptimConfig(lr=lr))
    rng, updates = np.random.default_rng(0), 0
    with stage(f"imitation, {epochs} epochs of {len(rows)} positions"):
        for _ in range(epochs):
            updates, _ = fit_epoch(pipeline.model, rows, rng.permutation(len(rows)), batch,
                                   AGENT, pipeline.tokenizer.pad_token_id or 0, optimizer,
                                   updates)
    return updates


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny model (CPU)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--positions", type=int, default=12,
                        help="win and block positions of each seat")
    parser.add_argument("--imitate", type=int, default=0, metavar="EPOCHS",
                        help="first train agent_0 for EPOCHS epochs of imitation of the rule "
                             "on other positions (seed 0, as connect_four_imitation.py): "
                             "does a model that has learnt to read show it here?")
    parser.add_argument("--tag", default="", help="suffix of the output file's name")
    parser.add_argument("overrides", nargs="*", help="config overrides of "
                        "examples/connect_four/mixed.yaml, e.g. env.renderer= (the plain board)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    model = "tiny" if args.tiny else args.model
    pipeline = imitation_pipeline("connect_four", "mixed", model, 0,
                                  tempfile.mkdtemp(prefix="connect_four_gradients_"), "run",
                                  args.overrides)
    updates = imitate(pipeline, args.imitate) if args.imitate else 0
    cases = cases_of(policy.positions(args.positions, seed=1))
    result = {"model": model, "renderer": pipeline.cfg.env.renderer, "positions": len(cases),
              "imitation_updates": updates,
              **measure(pipeline, cases), "seconds": round(time.perf_counter() - start, 1)}
    text = json.dumps(result)
    print(text, flush=True)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / f"connect_four_gradients{args.tag}.json").write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
