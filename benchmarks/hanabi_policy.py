"""What a Hanabi team's greedy policy does: how its games end and which moves it makes.

    python benchmarks/hanabi_policy.py --games 24 model.path=smollm2-135m   # untrained, CPU
    python benchmarks/hanabi_policy.py --checkpoint RUN/checkpoints/step_00000060 \
        model.path=smollm2-135m model.device=cuda [key=value overrides]
    python benchmarks/hanabi_policy.py --checkpoint FOLDER model.path=smollm2-135m
        # FOLDER: a checkpoint's agents/ alone (what `device_runs.sh bring RUN adapters`
        # brings back from the GPU machine: the PEFT folders, without the optimizers' state)

A team score of 0 says nothing of why: a team that loses its life and one that never plays a
card both score 0 in the small Hanabi (one life). Here the two agents play ``--games`` games
together (seat 0 agent_0, seat 1 agent_1; deals drawn from ``--seed``), each move the one
greedy decoding answers (``roll/pipeline/exploitability.py``, ``move_probabilities`` at
temperature 0, as ``eval.greedy_too`` plays; the live games' states scored together). Prints
JSON: the mean score, how the games ended (``lost the life`` or ``deck out``: the last round
played), moves per game, the greedy moves by kind (``Play 0``, ``Discard 1``, ``Reveal
color``, ``Reveal rank``) and the mean probability of each kind on a game's first move at the
rollout's temperature (the policy being trained). SmolLM2 on this CPU: ~25 s a game.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hanabi_baselines import lives_left, resolve_chance  # noqa: E402  (one reading each)


def move_kind(move: str) -> str:
    """``"(Play 1)"`` -> ``"Play 1"``; ``"(Reveal player +1 color R)"`` -> ``"Reveal color"``."""
    words = move.strip("()").split()
    return f"Reveal {words[3]}" if words[0] == "Reveal" else " ".join(words[:2])


def load_team(pipeline, folder: Path) -> str:
    """The two agents' adapters from ``folder``: a whole checkpoint (``pipeline.load``), or
    only its ``agents/`` folders (each agent's PEFT folder, as ``bring RUN adapters`` brings
    them; the optimizers' state is not needed to play). Returns which of the two it was."""
    from roll.utils.checkpoint import TRAINER_STATE_FILE, agent_dir

    if (folder / TRAINER_STATE_FILE).is_file():
        pipeline.load(folder)
        return "checkpoint"
    root = agents_root(folder)
    for name in pipeline.agent_names:
        if not (agent_dir(root, name) / "adapter_config.json").is_file():
            raise SystemExit(f"--checkpoint {str(folder)!r}: neither a checkpoint nor an agents "
                             f"folder (no {agent_dir(root, name)}/adapter_config.json)")
    for name in pipeline.agent_names:
        pipeline.model.load_agent(name, agent_dir(root, name))
    return "adapters"


def agents_root(folder: Path) -> Path:
    """The folder holding ``agents/``: ``folder`` itself (a checkpoint, or what ``bring``
    unpacks) or its parent (``folder`` is the agents/ folder)."""
    from roll.utils.checkpoint import AGENTS_DIR

    return folder if (folder / AGENTS_DIR).is_dir() else folder.parent


def lora_overrides(folder: Path) -> list[str]:
    """``team.lora.rank``/``alpha`` as the saved adapters have them (read from agent_0's
    ``adapter_config.json``), so a run trained at another rank than the example YAML's
    (``learning.py`` trains at r 16, the YAML says 8) loads without naming them again."""
    from roll.utils.checkpoint import agent_dir

    config_file = agent_dir(agents_root(folder), "agent_0") / "adapter_config.json"
    if not config_file.is_file():
        return []  # load_team says what is missing
    saved = json.loads(config_file.read_text())
    return [f"team.lora.rank={saved['r']}", f"team.lora.alpha={saved['lora_alpha']}"]


def deal(env, games: int, rng) -> list:
    """``games`` fresh deals of ``env``'s Hanabi, each at its first decision."""
    states = [env.game.new_initial_state() for _ in range(games)]
    for state in states:
        resolve_chance(state, rng)
    return states


def play(pipeline, env, states: list, rng, temperature: float,
         agent_of: Callable[[int], str]) -> tuple[list[int], Counter]:
    """Play ``states`` to their ends, every live game's move scored together each round: the
    answer greedy decoding gives, token by token, at ``temperature`` 0 (eval.greedy_too's), a
    move drawn from constrained decoding's probabilities otherwise; seat s played by agent
    ``agent_of(s)``, chance drawn from ``rng``. Returns the moves per game and the moves made
    by kind."""
    from roll.pipeline.exploitability import move_probabilities

    moves, kinds = [0] * len(states), Counter()
    while live := [g for g, state in enumerate(states) if not state.is_terminal()]:
        scored = move_probabilities(
            env, [states[g] for g in live], pipeline.trainer, pipeline.tokenizer, agent_of,
            pipeline.render, temperature, enable_thinking=pipeline.cfg.model.enable_thinking)
        for g, (action_ids, probs) in zip(live, scored, strict=True):
            state, seat = states[g], states[g].current_player()
            pick = (int(np.argmax(probs)) if temperature == 0
                    else int(rng.choice(len(probs), p=probs / probs.sum())))
            action = action_ids[pick]
            kinds[move_kind(state.action_to_string(seat, action))] += 1
            state.apply_action(action)
            moves[g] += 1
            resolve_chance(state, rng)
    return moves, kinds


def report(pipeline, games: int, seed: int) -> dict:
    """Play ``games`` greedy games of the pipeline's Hanabi with its two agents (see the
    module's docstring)."""
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.pipeline.exploitability import move_probabilities

    cfg = pipeline.cfg
    env = OpenSpielEnv("hanabi", dict(cfg.env.params))
    rng = np.random.default_rng(seed)
    states = deal(env, games, rng)
    agent_of = lambda seat: pipeline.agent_names[seat]  # noqa: E731
    first = Counter()
    openings = move_probabilities(
        env, states, pipeline.trainer, pipeline.tokenizer, agent_of, pipeline.render,
        cfg.rollout.sampling.temperature, enable_thinking=cfg.model.enable_thinking)
    for state, (action_ids, probs) in zip(states, openings, strict=True):
        for action, prob in zip(action_ids, probs, strict=True):  # the policy it trains
            first[move_kind(state.action_to_string(state.current_player(), action))] += prob
    moves, kinds = play(pipeline, env, states, rng, 0.0, agent_of)
    scores = [state.returns()[0] for state in states]
    lost = sum(lives_left(state) == 0 for state in states)
    return {"games": games, "score": round(float(np.mean(scores)), 4),
            "ended": {"lost the life": lost, "deck out": games - lost},
            "moves_per_game": round(float(np.mean(moves)), 2),
            "greedy_moves": dict(sorted(kinds.items())),
            "first_move_probability": {kind: round(float(total) / games, 4)
                                       for kind, total in sorted(first.items())}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config_path", default="examples/hanabi")
    parser.add_argument("--config_name", default="multi_agent_hanabi")
    parser.add_argument("--checkpoint", default=None, help="a run's checkpoint folder "
                        "(none: the untrained adapters)")
    parser.add_argument("--games", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="key=value, as the launcher takes them")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    saved_lora = lora_overrides(Path(args.checkpoint)) if args.checkpoint else []
    overrides = ["rollout.constrained_decoding=true", *saved_lora, *args.overrides]
    cfg = load_config(str(Path(args.config_path).resolve()), args.config_name, overrides)
    if cfg.env.game != "hanabi" or cfg.team.num_agents != 2:
        raise SystemExit(f"env.game={cfg.env.game!r}, team.num_agents={cfg.team.num_agents}: "
                         "this benchmark reads a two-agent Hanabi team")
    pipeline = AgenticPipeline(cfg)
    loaded = load_team(pipeline, Path(args.checkpoint)) if args.checkpoint else None
    print(json.dumps({"checkpoint": args.checkpoint, "loaded": loaded, "seed": args.seed,
                      **report(pipeline, args.games, args.seed)}, indent=1))


if __name__ == "__main__":
    main()
