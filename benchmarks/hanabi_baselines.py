"""Reference scores for a Hanabi learning curve: what random play and a simple rule get.

    python benchmarks/hanabi_baselines.py                  # the examples' small Hanabi, 5,000 games
    python benchmarks/hanabi_baselines.py --games 20000 --params '{"max_life_tokens": 3}'

A team score alone says little: 0.35 of 6 in the examples' small Hanabi (2 colours, ranks 1-3,
hands of 2, 3 hints, 1 life) is five times random play and a tenth of what a three-line rule
gets. Two teams are played here, over the same deals (game seeds 0..games-1), with OpenSpiel:

- ``random``: each seat picks a legal move uniformly;
- ``rules``: each seat, in this order,
  1. plays its oldest card whose every remaining possibility (the "what it can still be" part of
     the observation, which the hints narrowed) is the next rank of its colour's firework;
  2. with an info token left, hints the next seat's oldest playable card: its rank if the
     holder does not know the rank yet, else its colour if the holder does not know that;
  3. discards its oldest card (when a discard is legal: fewer than all info tokens left);
  4. else gives a random legal hint (never a blind play).

Nothing here is learnt: the rule only reads what the acting seat's observation shows, as the
agents' prompts do (roll/agentic/env/renderers.py: the prompt is that observation). Prints one
JSON object (and writes ``$OUT/hanabi_baselines.json`` when OUT is set): per team the mean
score with its 95% interval (normal approximation), the share of games ended by a lost life,
the mean number of moves, and the histogram of scores.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # roll, from a checkout
import report  # noqa: E402  (benchmarks/report.py, beside this file)

SMALL_HANABI = {"players": 2, "colors": 2, "ranks": 3, "hand_size": 2,
                "max_information_tokens": 3, "max_life_tokens": 1}
"""The game of examples/hanabi/multi_agent_hanabi.yaml (max score 6)."""


@dataclass
class Card:
    """One card of a hand as an observation shows it."""

    card: str
    """"R2" (colour, rank) in another seat's hand; "XX" in one's own."""
    hinted: str
    """What hints told: colour then rank, "X" where unknown, e.g. "X1"."""
    possible: str
    """What it can still be: the colours, then the ranks, e.g. "RY1"."""


@dataclass
class View:
    """The parts of a Hanabi observation string the rule reads."""

    fireworks: dict[str, int]
    """Colour -> the highest rank played (0: none)."""
    info_tokens: int
    hands: list[list[Card]]
    """The acting seat's hand first, then the next seats' in order, oldest card first."""


def parse_view(observation: str) -> View:
    """Read OpenSpiel's Hanabi observation string (``state.observation_string(seat)``)."""
    lines = observation.splitlines()
    fields = {line.split(":")[0]: line.split(":", 1)[1] for line in lines if ":" in line}
    fireworks = {colour: int(rank)
                 for colour, rank in re.findall(r"([A-Z])(\d)", fields["Fireworks"])}
    hands: list[list[Card]] = []
    for line in lines[lines.index("Hands:") + 1:]:
        if line.startswith("Deck size"):
            break
        if line.startswith("Cur player") or line.startswith("-"):
            hands.append([])
        elif "||" in line:
            card, knowledge = (part.strip() for part in line.split("||"))
            hinted, possible = knowledge.split("|")
            hands[-1].append(Card(card, hinted, possible))
    return View(fireworks, int(fields["Info tokens"]), hands)


def known_playable(card: Card, fireworks: dict[str, int]) -> bool:
    """Whether every colour x rank the card can still be is playable now."""
    colours = [c for c in card.possible if c.isalpha()]
    ranks = [int(c) for c in card.possible if c.isdigit()]
    return bool(colours and ranks) and all(fireworks[c] + 1 == r for c in colours for r in ranks)


def rule_move(view: View, legal: list[str], rng: random.Random) -> str:
    """The rule team's move (a legal move string, e.g. ``"(Play 0)"``), as the docstring says."""
    for index, card in enumerate(view.hands[0]):
        if known_playable(card, view.fireworks):
            return f"(Play {index})"
    if view.info_tokens > 0:
        for card in view.hands[1]:
            colour, rank = card.card[0], int(card.card[1])
            if view.fireworks[colour] + 1 != rank:
                continue
            for hint, unknown in ((f"(Reveal player +1 rank {rank})", card.hinted[1] == "X"),
                                  (f"(Reveal player +1 color {colour})", card.hinted[0] == "X")):
                if unknown and hint in legal:
                    return hint
    discards = [move for move in legal if move.startswith("(Discard")]
    if discards:
        return min(discards, key=lambda move: int(move[len("(Discard "):-1]))
    hints = [move for move in legal if move.startswith("(Reveal")]
    return rng.choice(hints or legal)


def random_move(view: View, legal: list[str], rng: random.Random) -> str:
    return rng.choice(legal)


Policy = Callable[[View, list[str], random.Random], str]


def play_game(game, policy: Policy, seed: int) -> tuple[float, bool, int]:
    """One game of ``policy`` in every seat: (score, whether a lost life ended it, moves).
    Chance (the deal and the draws) and the policy's own choices draw from ``seed``."""
    chance, choices = random.Random(seed), random.Random(seed + 1_000_003)
    state, moves = game.new_initial_state(), 0
    while not state.is_terminal():
        if state.is_chance_node():
            outcomes, probs = zip(*state.chance_outcomes(), strict=True)
            state.apply_action(chance.choices(outcomes, probs)[0])
            continue
        seat = state.current_player()
        actions = {state.action_to_string(seat, a): a for a in state.legal_actions(seat)}
        move = policy(parse_view(state.observation_string(seat)), list(actions), choices)
        state.apply_action(actions[move])
        moves += 1
    return state.returns()[0], lives_left(state) == 0, moves


def resolve_chance(state, rng) -> None:
    """Deal the cards (and draws) a state waits for, each outcome drawn from ``rng`` (a numpy
    Generator) with its chance probability."""
    import numpy as np

    while state.is_chance_node():
        outcomes, probs = zip(*state.chance_outcomes(), strict=True)
        state.apply_action(int(rng.choice(outcomes, p=np.array(probs) / sum(probs))))


def lives_left(state) -> int:
    """The life tokens a Hanabi state has left (0: the score went with the last one)."""
    return int(re.search(r"Life tokens: (\d+)", state.observation_string(0)).group(1))


def summarize(results: list[tuple[float, bool, int]]) -> dict:
    from roll.pipeline.evaluation import mean_interval

    scores = [score for score, _, _ in results]
    n = len(scores)
    mean, low, high = mean_interval(scores)
    return {"score": round(mean, 4), "score_low": round(low, 4), "score_high": round(high, 4),
            "lost_all_lives": round(sum(lost for _, lost, _ in results) / n, 4),
            "moves": round(sum(moves for _, _, moves in results) / n, 2),
            "histogram": {str(k): v for k, v in sorted(Counter(scores).items())}}


def baselines(params: dict, games: int) -> dict:
    import pyspiel

    game = pyspiel.load_game("hanabi", params)
    teams = {"random": random_move, "rules": rule_move}
    return {"params": params, "games": games, "max_score": game.max_utility(),
            **{name: summarize([play_game(game, policy, seed) for seed in range(games)])
               for name, policy in teams.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--games", type=int, default=5000)
    parser.add_argument("--params", default="{}",
                        help="JSON: changes to the examples' small Hanabi's parameters")
    args = parser.parse_args()
    report.emit(baselines({**SMALL_HANABI, **json.loads(args.params)}, args.games),
                "hanabi_baselines.json")

if __name__ == "__main__":
    main()
