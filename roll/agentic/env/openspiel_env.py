"""Any OpenSpiel game behind the ``MultiAgentEnv`` protocol, simultaneous-move games included.

Seats are OpenSpiel players. Chance nodes never reach the caller: after ``reset`` and after every
move the env samples chance outcomes from ``state.chance_outcomes()`` with its own numpy RNG
(``np.random.default_rng(seed)``, one ``rng.choice(len(outcomes), p=probs)`` call per chance
node), so an episode is a pure function of the reset seed and the moves played.

Simultaneous-move games (goofspiel, oshi_zumo, the matrix games, repeated_game, ...) are played
in OpenSpiel's turn-based form (``pyspiel.convert_to_turn_based``, the game
``turn_based_simultaneous_game``), because the rollout asks one seat at a time for one move:
each round seats 0, 1, ... pick in turn (a seat with no legal move is skipped) and the joint move
is applied after the last pick. A seat's observation and information state there are those of
the simultaneous game, which change only when the whole round is applied, so no seat sees what
the others picked in the round it is playing. (``str(state)`` does show those picks, so a game
whose players have no observation or information-state string is refused.) Naming the wrapper
itself, ``turn_based_simultaneous_game`` with ``game_params={"game": "goofspiel(num_cards=4)"}``
or ``{"game": {"name": "goofspiel", "num_cards": 4}}``, loads the same game as ``goofspiel``
with ``{"num_cards": 4}``. Mean-field games are refused.

Actions travel as strings (``state.action_to_string``), stripped; if two legal actions of one
state render to the same string, every member of that group gets its action id appended, e.g.
``"Pass (#3)"``, so the strings of a state are always unique.

Forfeit (an agent's answer could not be used and the fallback policy is ``"forfeit"``): the
episode ends at once and ``returns()`` becomes

- zero-sum / constant-sum games: the forfeiting seat gets ``game.min_utility()``, the others
  share the rest of ``game.utility_sum()`` equally (capped at ``max_utility``) — e.g. (-1, +1) in
  tic-tac-toe;
- identical-utility (cooperative) games such as Hanabi: every seat gets ``min_utility()`` (the
  team failed; Hanabi's score drops to 0, as when the last life token is lost);
- general-sum games: the forfeiting seat gets ``min_utility()``, the others keep their returns.

Step rewards are the change of ``state.returns()`` over the move and the chance nodes it led to
(the forfeit step: the change to the forfeit returns), so they always sum to ``returns()``.
(``state.rewards()`` is not summed: Hanabi's repeats the last move's reward after a chance node.)
In a converted simultaneous game the returns change when a round is applied, so the round's
rewards arrive with its last pick.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyspiel

from roll.agentic.env.base import StepResult

TURN_BASED_WRAPPER = "turn_based_simultaneous_game"
"""OpenSpiel's game that plays a simultaneous-move game one seat at a time."""

_HANABI_RANGES = {"players": (2, 5), "colors": (1, 5), "ranks": (1, 5)}
_HANABI_AT_LEAST_ONE = ("hand_size", "max_information_tokens", "max_life_tokens")


def _hanabi_cards_per_color(ranks: int) -> int:
    """Cards of one colour in the Hanabi deck: three 1s, one of the top rank, two of the others."""
    return sum(3 if rank == 0 else 1 if rank == ranks - 1 else 2 for rank in range(ranks))


def _check_hanabi_params(params: Mapping[str, Any], field: str) -> None:
    """Reject Hanabi parameters that would abort the process inside the C++ library."""
    for key, (low, high) in _HANABI_RANGES.items():
        if key in params and not low <= params[key] <= high:
            raise ValueError(f"{field}.{key} for hanabi must be in [{low}, {high}], "
                             f"got {params[key]!r}")
    for key in _HANABI_AT_LEAST_ONE:
        if key in params and params[key] < 1:
            raise ValueError(f"{field}.{key} for hanabi must be >= 1, got {params[key]!r}")
    players = params.get("players", 2)
    hand_size = params.get("hand_size", 5 if players < 4 else 4)
    deck = _hanabi_cards_per_color(params.get("ranks", 5)) * params.get("colors", 5)
    if hand_size * players > deck:
        raise ValueError(f"{field} for hanabi: hand_size * players = {hand_size * players} "
                         f"exceeds the deck of {deck} cards")


def _check_goofspiel_params(params: Mapping[str, Any], field: str) -> None:
    """Reject a deck without cards: it loads, then stops at a chance node with no outcome."""
    if params.get("num_cards", 1) < 1:
        raise ValueError(f"{field}.num_cards for goofspiel must be >= 1, "
                         f"got {params['num_cards']!r}")


# Games whose C++ code aborts the process (not a Python exception), or builds a game that
# cannot be played, on some parameter values.
_PARAM_CHECKS = {"hanabi": _check_hanabi_params, "goofspiel": _check_goofspiel_params}


@functools.cache
def _game_types() -> dict[str, pyspiel.GameType]:
    """Registered games by short name; their parameter specs are read without loading a game
    (some games, like the wrapper, cannot load without parameters)."""
    return {game_type.short_name: game_type for game_type in pyspiel.registered_games()}


def _check_registered(game_name: str, field: str) -> None:
    if game_name not in _game_types():
        raise ValueError(f"{field}: unknown OpenSpiel game {game_name!r}")


def _typed_param(game_name: str, field: str, value: Any, default: Any) -> Any:
    """``value`` with the type OpenSpiel expects for ``field`` (int → float allowed only)."""
    if isinstance(default, bool) or not isinstance(default, int | float):
        ok = type(value) is type(default)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    if not ok:
        raise ValueError(f"{field} for {game_name} must be of type "
                         f"{type(default).__name__}, got {value!r}")
    return value


def _game_valued(value: Any, field: str) -> tuple[str, dict[str, Any]]:
    """(name, params) of a parameter that is itself a game (the wrapper's ``game``,
    repeated_game's ``stage_game``), given as OpenSpiel's game string
    ``"goofspiel(num_cards=4)"`` or as a mapping ``{"name": "goofspiel", "num_cards": 4}``."""
    if isinstance(value, str):
        try:
            value = pyspiel.game_parameters_from_string(value)
        except pyspiel.SpielError as error:
            raise ValueError(f"{field}: cannot parse game string {value!r}: {error}") from None
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise ValueError(f"{field} must be a game, e.g. 'goofspiel(num_cards=4)' or "
                         f"{{name: goofspiel, num_cards: 4}}; got {value!r}")
    params = dict(value)
    return params.pop("name"), params


def _checked_params(game_name: str, game_params: Mapping[str, Any], field: str
                    ) -> dict[str, Any]:
    """``game_params`` typed for OpenSpiel; game-valued parameters are checked recursively.

    ``field`` names the parameters in errors: ``game_params``, ``game_params.game``, ...
    """
    spec = _game_types()[game_name].parameter_specification
    params: dict[str, Any] = {}
    for key, value in dict(game_params).items():
        if key not in spec:
            raise ValueError(f"{field}.{key}: unknown parameter of {game_name}; "
                             f"known: {sorted(spec)}")
        if isinstance(spec[key], dict):  # a game-valued parameter
            inner_name, inner_params = _game_valued(value, f"{field}.{key}")
            _check_registered(inner_name, f"{field}.{key}")
            params[key] = {"name": inner_name,
                           **_checked_params(inner_name, inner_params, f"{field}.{key}")}
        else:
            params[key] = _typed_param(game_name, f"{field}.{key}", value, spec[key])
    if game_name in _PARAM_CHECKS:
        _PARAM_CHECKS[game_name](params, field)
    return params


def _blamed_field(message: str, params: Mapping[str, Any], field: str) -> str:
    """``field.<key>`` for the parameter an OpenSpiel error names ("Missing parameter
    num_repetitions"), else for the first given parameter it mentions ("num_turns_ <=
    num_cards_"), else ``field``."""
    named = re.search(r"parameter '?(\w+)", message)
    if named:
        return f"{field}.{named.group(1)}"
    mentioned = sorted((message.find(key), key) for key in params if key in message)
    return f"{field}.{mentioned[0][1]}" if mentioned else field


def load_game(game_name: str, game_params: Mapping[str, Any] | None = None) -> pyspiel.Game:
    """Load an OpenSpiel game from a plain dict of parameters (e.g. from YAML).

    Sequential games load as they are; simultaneous-move games are converted to their
    turn-based form (module docstring), so the result is always a sequential game. Raises
    ValueError naming ``game_name`` / ``game_params.<key>`` (``game_params.game.<key>`` inside a
    game-valued parameter) on an unknown game, unknown parameter, wrong parameter type,
    known-fatal value, a value OpenSpiel rejects, or a mean-field game.
    """
    return _load(game_name, game_params or {}, "game_name", "game_params")


def _load(game_name: str, game_params: Mapping[str, Any], name_field: str, params_field: str
          ) -> pyspiel.Game:
    """``load_game``, naming ``name_field`` / ``params_field`` in errors."""
    _check_registered(game_name, name_field)
    params = _checked_params(game_name, game_params, params_field)
    if game_name == TURN_BASED_WRAPPER:
        # The wrapped game goes through the same path, so the wrapper of goofspiel and
        # goofspiel itself are one game.
        if "game" not in params:
            raise ValueError(f"{params_field}.game: {TURN_BASED_WRAPPER} needs the game to "
                             "convert, e.g. game: 'goofspiel(num_cards=4)'")
        inner_params = dict(params["game"])
        inner_name = inner_params.pop("name")
        game = _load(inner_name, inner_params, f"{params_field}.game", f"{params_field}.game")
        if simultaneous_game_name(game) is None:
            raise ValueError(f"{params_field}.game: {inner_name} is not a simultaneous-move "
                             "game; name it directly")
        return game
    try:
        game = pyspiel.load_game(game_name, params)
        game.new_initial_state()  # some bad values (goofspiel's num_turns) only fail here
    except pyspiel.SpielError as error:
        message = " ".join(str(error).split())
        raise ValueError(f"{_blamed_field(message, params, params_field)} for {game_name}: "
                         f"{message}") from None
    dynamics = game.get_type().dynamics
    if dynamics == pyspiel.GameType.Dynamics.SIMULTANEOUS:
        game = pyspiel.convert_to_turn_based(game)
        game_type = game.get_type()
        if not (game_type.provides_observation_string
                or game_type.provides_information_state_string):
            raise ValueError(f"{name_field}: {game_name} gives its players no observation "
                             "string; the only text left would show the round's earlier picks")
    elif dynamics != pyspiel.GameType.Dynamics.SEQUENTIAL:
        raise ValueError(f"{name_field}: {game_name} has {dynamics} dynamics; only sequential "
                         "and simultaneous-move games are supported")
    return game


def simultaneous_game_name(game: pyspiel.Game) -> str | None:
    """The short name of the simultaneous-move game that turn-based ``game`` converts, or None
    if ``game`` is not a converted one."""
    if game.get_type().short_name != TURN_BASED_WRAPPER:
        return None
    return game.get_parameters()["game"]["name"]


def unique_action_strings(texts: list[str], action_ids: list[int]) -> list[str]:
    """Make the action strings of one state unique, deterministically.

    Strings are stripped; every string shared by several actions (and an empty string) gets its
    action id appended: ``["Pass", "Pass"]`` with ids ``[3, 7]`` → ``["Pass (#3)", "Pass (#7)"]``.
    """
    stripped = [text.strip() for text in texts]
    counts: dict[str, int] = {}
    for text in stripped:
        counts[text] = counts.get(text, 0) + 1
    unique = [
        f"{text} (#{action_id})".strip() if counts[text] > 1 or not text else text
        for text, action_id in zip(stripped, action_ids, strict=True)
    ]
    if len(set(unique)) != len(unique):
        raise RuntimeError(f"could not make action strings unique: {texts}")
    return unique


def forfeit_returns(game: pyspiel.Game, seat: int, current: list[float]) -> list[float]:
    """Final returns when ``seat`` forfeits (rules in the module docstring)."""
    utility = game.get_type().utility
    low, high, n = game.min_utility(), game.max_utility(), game.num_players()
    if utility == pyspiel.GameType.Utility.IDENTICAL:
        return [low] * n
    if utility in (pyspiel.GameType.Utility.ZERO_SUM, pyspiel.GameType.Utility.CONSTANT_SUM):
        share = min(high, (game.utility_sum() - low) / (n - 1))
        return [low if other == seat else share for other in range(n)]
    return [low if other == seat else current[other] for other in range(n)]


class OpenSpielEnv:
    """One OpenSpiel game as a ``MultiAgentEnv`` (a simultaneous-move game in turn-based form).

    Args:
        game_name: OpenSpiel short name, e.g. ``"hanabi"``, ``"tic_tac_toe"``, ``"goofspiel"``.
        game_params: game parameters as a plain dict, e.g. ``{"players": 3, "colors": 2}``.
    """

    def __init__(self, game_name: str, game_params: Mapping[str, Any] | None = None) -> None:
        self.game = load_game(game_name, game_params)
        self.game_params = dict(game_params or {})
        self._state: pyspiel.State | None = None
        self._rng = np.random.default_rng(0)
        self._legal: tuple[list[str], list[int]] | None = None
        self._forfeit: list[float] | None = None
        self.turn = 0
        """Number of moves the seats have made in this episode (chance moves not counted)."""

    # ---- protocol -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The game's short name; for a converted game the simultaneous one's (``goofspiel``)."""
        return simultaneous_game_name(self.game) or self.game.get_type().short_name

    @property
    def num_seats(self) -> int:
        return self.game.num_players()

    @property
    def done(self) -> bool:
        return self._forfeit is not None or self.state.is_terminal()

    def reset(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._state = self.game.new_initial_state()
        self._legal, self._forfeit, self.turn = None, None, 0
        self._resolve_chance()

    def current_seat(self) -> int | None:
        return None if self.done else self.state.current_player()

    def observation(self, seat: int) -> str:
        self._check_seat(seat)
        game_type = self.game.get_type()
        if game_type.provides_observation_string:
            return self.state.observation_string(seat)
        if game_type.provides_information_state_string:
            return self.state.information_state_string(seat)
        return str(self.state)

    def legal_actions(self, seat: int) -> list[str]:
        self._check_acting(seat)
        return list(self._legal_table()[0])

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError(f"{self.name}: step after the episode is done")
        texts, action_ids = self._legal_table()
        if action not in texts:
            raise ValueError(f"illegal action {action!r} for seat {self.current_seat()} in "
                             f"{self.name}; legal: {texts[:20]}")
        return self.apply_action_id(action_ids[texts.index(action)])

    def forfeit(self, seat: int) -> StepResult:
        self._check_acting(seat)
        before = self.returns()
        self._forfeit = forfeit_returns(self.game, seat, before)
        rewards = [after - so_far for after, so_far in zip(self._forfeit, before, strict=True)]
        return StepResult(rewards=rewards, done=True, info={"forfeit_seat": seat})

    def returns(self) -> list[float]:
        return list(self._forfeit) if self._forfeit is not None else list(self.state.returns())

    # ---- OpenSpiel extras (built-in opponents, renderers, tests) ----------------------------

    @property
    def simultaneous_moves(self) -> bool:
        """True if the game is a simultaneous-move game played in turn-based form: the seats of
        a round pick one after the other, each without seeing the others' picks."""
        return simultaneous_game_name(self.game) is not None

    @property
    def state(self) -> pyspiel.State:
        """The live OpenSpiel state; read it, change it only via ``step`` / ``apply_action_id``."""
        if self._state is None:
            raise RuntimeError(f"{self.name}: call reset(seed) before using the env")
        return self._state

    def set_state(self, state: pyspiel.State) -> None:
        """Put the env at a copy of ``state`` (a state of this game), e.g. to render the prompt
        of any decision node when scoring a whole policy (exploitability)."""
        if state.get_game().get_type().short_name != self.game.get_type().short_name:
            raise ValueError(f"{self.name}: state of another game given")
        self._state = state.clone()
        self._legal, self._forfeit = None, None

    def information_state(self, seat: int) -> str | None:
        """``information_state_string(seat)`` if the game provides one (full history view)."""
        self._check_seat(seat)
        if not self.game.get_type().provides_information_state_string:
            return None
        return self.state.information_state_string(seat)

    def legal_action_ids(self, seat: int) -> list[int]:
        """OpenSpiel action ids, in the same order as ``legal_actions(seat)``."""
        self._check_acting(seat)
        return list(self._legal_table()[1])

    def action_string(self, action_id: int) -> str:
        """The (unique) string of a legal action id of the current state."""
        texts, action_ids = self._legal_table()
        if action_id not in action_ids:
            raise ValueError(f"illegal action id {action_id} in {self.name}; legal: {action_ids}")
        return texts[action_ids.index(action_id)]

    def apply_action_id(self, action_id: int) -> StepResult:
        """Play OpenSpiel action ``action_id`` for the current seat, then resolve chance nodes."""
        if self.done:
            raise RuntimeError(f"{self.name}: step after the episode is done")
        texts, action_ids = self._legal_table()
        if action_id not in action_ids:
            raise ValueError(f"illegal action id {action_id} in {self.name}; legal: {action_ids}")
        seat, before = self.state.current_player(), self.state.returns()
        self.state.apply_action(action_id)
        self._legal, self.turn = None, self.turn + 1
        self._resolve_chance()
        # The step's rewards are the change of returns over the move and the chance nodes after
        # it, not a sum of state.rewards(): Hanabi's rewards() after a chance node repeats the
        # reward of the move before it.
        rewards = [after - so_far for after, so_far in zip(self.state.returns(), before,
                                                            strict=True)]
        info = {"seat": seat, "action": texts[action_ids.index(action_id)]}
        return StepResult(rewards=rewards, done=self.done, info=info)

    def history_ids(self) -> list[int]:
        """All action ids applied so far, chance outcomes included (OpenSpiel's history)."""
        return list(self.state.history())

    # ---- internals ---------------------------------------------------------------------------

    def _resolve_chance(self) -> None:
        """Sample chance nodes until a seat must act (or the game ends)."""
        while self.state.is_chance_node():
            outcomes = self.state.chance_outcomes()
            probs = np.array([prob for _, prob in outcomes], dtype=np.float64)
            index = self._rng.choice(len(outcomes), p=probs / probs.sum())
            self.state.apply_action(outcomes[index][0])
        if self.state.is_simultaneous_node():
            raise RuntimeError(f"{self.name}: reached a simultaneous-move node")

    def _legal_table(self) -> tuple[list[str], list[int]]:
        """(unique action strings, action ids) of the current state, cached until it changes."""
        if self._legal is None:
            seat = self.state.current_player()
            action_ids = list(self.state.legal_actions(seat)) if not self.done else []
            texts = [self.state.action_to_string(seat, a) for a in action_ids]
            self._legal = (unique_action_strings(texts, action_ids), action_ids)
        return self._legal

    def _check_seat(self, seat: int) -> None:
        if not 0 <= seat < self.num_seats:
            raise ValueError(f"seat {seat} out of range for {self.name} "
                             f"with {self.num_seats} seats")

    def _check_acting(self, seat: int) -> None:
        self._check_seat(seat)
        if seat != self.current_seat():
            raise ValueError(f"seat {seat} does not act now in {self.name} "
                             f"(current seat: {self.current_seat()})")
