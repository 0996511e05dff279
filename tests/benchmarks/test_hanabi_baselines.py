"""benchmarks/hanabi_baselines.py: the observation as the rule reads it, the rule's moves on
dealt hands worked out by hand, and the two teams' scores."""

import random
import sys
from pathlib import Path

import pyspiel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import hanabi_baselines as hb  # noqa: E402


def dealt(*cards: str):
    """The small Hanabi with the first cards dealt as named (seat 0's hand, then seat 1's)."""
    state = pyspiel.load_game("hanabi", hb.SMALL_HANABI).new_initial_state()
    for card in cards:
        outcomes = {state.action_to_string(a): a for a, _ in state.chance_outcomes()}
        state.apply_action(outcomes[f"(Deal {card})"])
    assert not state.is_chance_node()
    return state


def move(state, rng=None) -> str:
    seat = state.current_player()
    legal = [state.action_to_string(seat, a) for a in state.legal_actions(seat)]
    return hb.rule_move(hb.parse_view(state.observation_string(seat)), legal,
                        rng or random.Random(0))


def play(state, text: str) -> None:
    seat = state.current_player()
    state.apply_action({state.action_to_string(seat, a): a
                        for a in state.legal_actions(seat)}[text])


def test_the_view_reads_the_hands_the_fireworks_and_the_tokens():
    state = dealt("R1", "R2", "Y2", "Y1")  # seat 0: R1 R2, seat 1: Y2 Y1
    view = hb.parse_view(state.observation_string(0))
    assert view.fireworks == {"R": 0, "Y": 0} and view.info_tokens == 3
    assert [c.card for c in view.hands[0]] == ["XX", "XX"]  # one's own cards are hidden
    assert [c.card for c in view.hands[1]] == ["Y2", "Y1"]
    assert all(c.hinted == "XX" and c.possible == "RY123" for hand in view.hands for c in hand)


def test_the_rule_hints_a_playable_card_then_its_holder_plays_it():
    state = dealt("R2", "R3", "Y2", "Y1")
    # Seat 0 knows nothing of its own cards; seat 1's second card, Y1, is playable and seat 1
    # does not know its rank: hint rank 1.
    assert move(state) == "(Reveal player +1 rank 1)"
    play(state, "(Reveal player +1 rank 1)")
    view = hb.parse_view(state.observation_string(1))
    assert view.hands[0][1].hinted == "X1" and view.hands[0][1].possible == "RY1"
    # Seat 1: its card 1 can only be a 1, and every firework stands at 0: play it.
    assert move(state) == "(Play 1)"
    play(state, "(Play 1)")
    assert state.returns() == [1.0, 1.0]


def test_a_card_that_may_still_be_unplayable_is_not_played():
    fireworks = {"R": 1, "Y": 0}
    assert hb.known_playable(hb.Card("XX", "R2", "R2"), fireworks)
    assert not hb.known_playable(hb.Card("XX", "X2", "RY2"), fireworks)  # Y2 would fail
    assert hb.known_playable(hb.Card("XX", "X1", "Y1"), fireworks)
    assert not hb.known_playable(hb.Card("XX", "XX", "RY123"), fireworks)


def test_without_info_tokens_or_a_playable_card_the_rule_discards_its_oldest_card():
    state = dealt("R2", "R3", "Y2", "Y3")  # nothing playable anywhere
    for _ in range(3):  # spend the 3 info tokens on hints the rule would not give
        seat = state.current_player()
        hints = sorted(state.action_to_string(seat, a) for a in state.legal_actions(seat)
                       if "Reveal" in state.action_to_string(seat, a))
        play(state, hints[0])
    assert hb.parse_view(state.observation_string(state.current_player())).info_tokens == 0
    assert move(state) == "(Discard 0)"


def test_the_rule_team_never_loses_its_life_and_outscores_random_play():
    result = hb.baselines(hb.SMALL_HANABI, 300)
    assert result["max_score"] == 6.0
    assert result["rules"]["lost_all_lives"] == 0.0  # it plays only cards it knows
    assert result["rules"]["score_low"] > 3.0 > 0.5 > result["random"]["score_high"]
    assert sum(result["random"]["histogram"].values()) == 300


def test_learning_curves_take_the_references_of_the_runs_own_game():
    """A three-life run's plot drew the one-life random team (0.07) under its curve; random
    play scores ~1.14 at three lives (5,000 deals), the rule team the same 3.63 (it never
    loses a life)."""
    from learning import hanabi_reference

    one, three = hanabi_reference(games=400), hanabi_reference({"max_life_tokens": 3}, 400)
    assert one["random"] < 0.2 < 0.9 < three["random"] < 1.4
    assert one["rules"] == three["rules"] > 3.4
