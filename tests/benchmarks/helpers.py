"""What the benchmark scripts' tests share."""

import pyspiel


def connect_four_after(*columns: int):
    """OpenSpiel's connect_four after x and o drop into ``columns`` in turn (x first)."""
    state = pyspiel.load_game("connect_four").new_initial_state()
    for column in columns:
        state.apply_action(column)
    return state
