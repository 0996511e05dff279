"""seat_to_agent parsing and validation."""

from __future__ import annotations

import pytest

from roll.agentic.env.opponents import MCTSOpponent, RandomOpponent, build_opponent
from roll.agentic.env.seating import DEFAULT_MCTS_SIMULATIONS, SeatSpec, build_seating

AGENTS = ["alice", "bob"]


def test_every_kind_of_seat_parses() -> None:
    seating = build_seating(["alice", "random", "mcts", "mcts:25", "snapshot:bob@120",
                             "snapshot:alice@latest", "alice"], 7, AGENTS)
    assert seating[0] == SeatSpec(raw="alice", kind="agent", agent_name="alice")
    assert seating[1].kind == "random" and not seating[1].uses_llm
    assert seating[2].mcts_simulations == DEFAULT_MCTS_SIMULATIONS
    assert seating[3].mcts_simulations == 25
    assert (seating[4].kind, seating[4].agent_name, seating[4].snapshot_step) == (
        "snapshot", "bob", 120)
    assert seating[5].snapshot_step is None and seating[5].uses_llm
    assert not seating[5].is_trained
    assert seating.seats_of("alice") == [0, 6] and seating.seats_of("bob") == []
    assert len(seating) == 7


def test_mapping_with_yaml_string_keys() -> None:
    seating = build_seating({"1": "random", "0": "bob"}, 2, AGENTS)
    assert [spec.raw for spec in seating.seats] == ["bob", "random"]


@pytest.mark.parametrize(("seat_to_agent", "num_seats", "bad_value"), [
    (["alice", "carol"], 2, "'carol'"),  # unknown agent
    (["alice"], 2, "1 seats given"),  # too few seats
    (["alice", "bob", "random"], 2, "3 seats given"),  # too many seats
    (["alice", "mcts:abc"], 2, "'mcts:abc'"),
    (["alice", "mcts:0"], 2, "'mcts:0'"),
    (["alice", "snapshot:bob"], 2, "'snapshot:bob'"),
    (["alice", "snapshot:bob@-3"], 2, "'snapshot:bob@-3'"),
    (["alice", "snapshot:carol@5"], 2, "'carol'"),
    (["alice", 3], 2, "3 is not a string"),
    ("alice", 1, "'alice'"),
    ({0: "alice", 2: "bob"}, 2, "[0, 2]"),
    ({"first": "alice"}, 1, "'first'"),
])
def test_bad_seat_maps_name_the_field_and_value(seat_to_agent: object, num_seats: int,
                                                bad_value: str) -> None:
    with pytest.raises(ValueError) as error:
        build_seating(seat_to_agent, num_seats, AGENTS)
    assert "seat_to_agent" in str(error.value) and bad_value in str(error.value)


def test_agent_names_may_not_shadow_builtin_specs() -> None:
    with pytest.raises(ValueError, match=r"seat_to_agent: agent name 'random'"):
        build_seating(["random"], 1, ["random"])


def test_builtin_opponents_from_specs() -> None:
    seating = build_seating(["random", "mcts:7", "alice"], 3, AGENTS)
    assert isinstance(build_opponent(seating[0], seed=0), RandomOpponent)
    mcts = build_opponent(seating[1], seed=0)
    assert isinstance(mcts, MCTSOpponent) and mcts.simulations == 7
    with pytest.raises(ValueError, match="seat_to_agent"):
        build_opponent(seating[2], seed=0)
