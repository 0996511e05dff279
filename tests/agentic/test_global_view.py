"""The global view a centralised critic reads (critic.input=global; env/base.py)."""

from __future__ import annotations

from roll.agentic.env.base import global_view
from roll.agentic.env.openspiel_env import OpenSpielEnv


def test_kuhn_global_view_holds_both_private_cards_after_the_prompt():
    env = OpenSpielEnv("kuhn_poker")
    env.reset(3)
    mine, theirs = env.observation(0), env.observation(1)
    assert mine != theirs  # each seat sees only its own card
    text = global_view(env, 0, "PROMPT")
    assert text == ("PROMPT\n\n[The whole table; seat 0 acts now]\n"
                    f"Seat 0 sees:\n{mine}\n\nSeat 1 sees:\n{theirs}")


class SameViewEnv:
    num_seats = 3

    def observation(self, seat: int) -> str:
        return "shared transcript" if seat < 2 else "a private note"


class OwnStateEnv(SameViewEnv):
    def global_observation(self) -> str:
        return "the full state"


def test_identical_views_are_shown_once_and_an_envs_own_global_state_wins():
    assert global_view(SameViewEnv(), 2, "P") == (
        "P\n\n[The whole table; seat 2 acts now]\n"
        "Seat 0 sees:\nshared transcript\n\nSeat 2 sees:\na private note")
    assert global_view(OwnStateEnv(), 1, "P") == (
        "P\n\n[The whole table; seat 1 acts now]\nthe full state")
