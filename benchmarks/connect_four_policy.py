"""What a Connect Four policy reads: does it take a win, block a threat, or drop into one column?

    python benchmarks/connect_four_policy.py --config_path examples/connect_four \
        --config_name mixed --checkpoint RUN/checkpoints/step_00000100 [key=value overrides]

Winning against random says little in Connect Four (a player that always drops into the centre
column wins 0.92 first and 0.88 second: benchmarks/connect_four_baselines.py). This asks the
policy about positions instead. Random-against-random games (seeded) give three sets of
positions of each seat to move, ``--positions`` of each (distinct boards):
- ``win``: the mover can win at once (some column completes four);
- ``block``: it cannot, but the opponent could win at once in some column;
- ``quiet``: neither.
Each agent's probability of each legal column is what constrained decoding gives it from the
prompt the rollout shows, at ``eval.temperature`` (``roll/pipeline/exploitability.py``,
``move_probabilities``; one scoring pass). Per agent and seat (``x`` moves first):
- ``wins_taken`` / ``blocks_made``: the mean probability of a winning / a blocking column over
  the ``win`` / ``block`` positions; ``greedy_wins_taken`` / ``greedy_blocks_made``: the share of
  those positions where the argmax column is one;
- ``quiet_entropy``: over the ``quiet`` positions, the mean entropy (nats) of the policy over
  the legal columns (uniform over 7: 1.95; 0: one column, e.g. the stacker of the baselines,
  which on quiet boards plays as the rule does);
- uniform play's and the rule's (win, else block, else centre) figures on the same positions,
  for scale (the rule: 1.0 on both by construction; uniform play has no argmax, so no greedy
  figures).
Prints JSON (and writes ``$OUT/connect_four_policy.json`` when OUT is set).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from connect_four_baselines import _board, _wins_there, rule_move  # noqa: E402  (one copy of the rules)

KINDS = ("win", "block", "quiet")


def classify(state) -> tuple[str, set[int]]:
    """The kind of the position for the seat to move, and its right columns (the winning ones
    for ``win``, the blocking ones for ``block``, none for ``quiet``)."""
    seat = state.current_player()
    board, legal = _board(state), state.legal_actions(seat)
    wins = {c for c in legal if _wins_there(board, "xo"[seat], c)}
    if wins:
        return "win", wins
    threats = {c for c in legal if _wins_there(board, "xo"[1 - seat], c)}
    return ("block", threats) if threats else ("quiet", set())


def positions(per_kind: int, seed: int, max_games: int = 20000) -> dict[str, dict[int, list]]:
    """``{seat: {kind: [(history, right columns), ...]}}``: up to ``per_kind`` distinct boards of
    each kind and seat to move, from random games (``numpy`` seeded by ``seed``), each with the
    action history that reaches it."""
    import pyspiel

    game = pyspiel.load_game("connect_four")
    rng = np.random.default_rng(seed)
    found = {seat: {kind: [] for kind in KINDS} for seat in (0, 1)}
    seen = set()
    for _ in range(max_games):
        if all(len(found[s][k]) >= per_kind for s in (0, 1) for k in KINDS):
            break
        state = game.new_initial_state()
        while not state.is_terminal():
            seat = state.current_player()
            kind, right = classify(state)
            key = str(state)
            if key not in seen and len(found[seat][kind]) < per_kind:
                seen.add(key)
                found[seat][kind].append((list(state.history()), right))
            state.apply_action(int(rng.choice(state.legal_actions(seat))))
    return found


def figures(probs: list[np.ndarray], found: dict[str, list]) -> dict[str, float]:
    """The module docstring's figures for one seat, ``probs`` (7,) per position in the order
    win, block, quiet of ``found``."""
    out, start = {}, 0
    for kind in KINDS:
        cases = found[kind]
        table = probs[start:start + len(cases)]
        start += len(cases)
        if kind == "quiet":
            entropies = [-float(np.sum(p[p > 0] * np.log(p[p > 0]))) for p in table]
            out["quiet_entropy"] = round(float(np.mean(entropies)), 4) if table else None
            out["quiet_positions"] = len(table)
            continue
        name = {"win": "wins_taken", "block": "blocks_made"}[kind]
        rights = [right for _, right in cases]
        taken = [float(sum(p[c] for c in right)) for p, right in zip(table, rights, strict=True)]
        greedy = [int(np.argmax(p)) in right for p, right in zip(table, rights, strict=True)]
        out[name] = round(float(np.mean(taken)), 4) if taken else None
        out[f"greedy_{name}"] = round(float(np.mean(greedy)), 4) if greedy else None
        out[f"{kind}_positions"] = len(table)
    return out


def states_of(found: dict[str, list]):
    """The OpenSpiel states of ``found``'s positions, in the order win, block, quiet."""
    import pyspiel

    game = pyspiel.load_game("connect_four")
    states = []
    for kind in KINDS:
        for history, _ in found[kind]:
            state = game.new_initial_state()
            for action in history:
                state.apply_action(action)
            states.append(state)
    return states


def reference(found: dict[int, dict[str, list]]) -> dict[str, dict[str, dict[str, float]]]:
    """Uniform play's and the rule's figures on the same positions."""
    out = {"uniform": {}, "rule": {}}
    for seat in (0, 1):
        states = states_of(found[seat])
        uniform, rule = [], []
        for state in states:
            legal = state.legal_actions(seat)
            row = np.zeros(7)
            row[legal] = 1 / len(legal)
            uniform.append(row)
            rule.append(np.eye(7)[rule_move(_board(state), seat, legal)])
        out["uniform"]["xo"[seat]] = {key: value for key, value in
                                      figures(uniform, found[seat]).items()
                                      if not key.startswith("greedy_")}
        out["rule"]["xo"[seat]] = figures(rule, found[seat])
    return out


def scores(pipeline, found: dict[int, dict[str, list]],
           agents: list[str] | None = None) -> dict[str, dict[str, dict]]:
    """``{agent: {"x"|"o": figures}}`` of ``agents`` (None: every agent) on ``found``'s
    positions (``positions``), with the pipeline's current adapters."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.pipeline.exploitability import move_probabilities

    cfg = pipeline.cfg
    env = OpenSpielEnv("connect_four", dict(cfg.env.params))
    agents = pipeline.agent_names if agents is None else agents
    result: dict[str, dict[str, dict]] = {agent: {} for agent in agents}
    for seat in (0, 1):
        states = states_of(found[seat])
        for agent in agents:
            scored = move_probabilities(
                env, states, pipeline.trainer, pipeline.tokenizer, lambda s, a=agent: a,
                pipeline.render, cfg.eval.temperature, enable_thinking=cfg.model.enable_thinking)
            probs = []
            for action_ids, p in scored:
                row = np.zeros(7)
                row[action_ids] = p
                probs.append(row)
            result[agent]["xo"[seat]] = figures(probs, found[seat])
    return result


def report(pipeline, per_kind: int = 200, seed: int = 0) -> dict[str, dict[str, dict]]:
    """``scores`` of every agent on ``per_kind`` positions of each kind and seat (``seed``)."""
    from roll.utils.stages import stage

    with stage("connect_four_policy: each agent's columns on win / block / quiet positions"):
        return scores(pipeline, positions(per_kind, seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config_path", default="examples/connect_four")
    parser.add_argument("--config_name", default="mixed")
    parser.add_argument("--checkpoint", default=None, help="a run's checkpoint folder "
                        "(none: the untrained adapters)")
    parser.add_argument("--positions", type=int, default=200, help="positions of each kind "
                        "and seat")
    parser.add_argument("overrides", nargs="*", help="key=value, as the launcher takes them")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    cfg = load_config(str(Path(args.config_path).resolve()), args.config_name, args.overrides)
    if cfg.env.game != "connect_four":
        raise SystemExit(f"env.game={cfg.env.game!r}: this benchmark reads Connect Four policies")
    pipeline = AgenticPipeline(cfg)
    if args.checkpoint:
        pipeline.load(Path(args.checkpoint))
    import report as reports  # benchmarks/report.py, beside this file

    reports.emit({"checkpoint": args.checkpoint, **reference(positions(args.positions, 0)),
                  "agents": report(pipeline, args.positions)}, "connect_four_policy.json")


if __name__ == "__main__":
    main()
