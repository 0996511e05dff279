"""Built-in (non-learning) opponents: uniform random, OpenSpiel MCTS, and a CFR+ policy.

An opponent answers ``choose(env, seat) -> action string`` for the seat that acts now, so the
rollout treats it like an agent whose answer never has a format error.
"""

from __future__ import annotations

import functools
from typing import Protocol

import numpy as np
from open_spiel.python.algorithms.mcts import MCTSBot, RandomRolloutEvaluator

from roll.agentic.env.actions import random_legal_action
from roll.agentic.env.base import MultiAgentEnv
from roll.agentic.env.openspiel_env import OpenSpielEnv
from roll.agentic.env.seating import SeatSpec


class Opponent(Protocol):
    """A fixed policy for one or more seats."""

    def choose(self, env: OpenSpielEnv, seat: int) -> str:
        """The action string ``seat`` plays now (``seat`` must be the current seat)."""
        ...


class RandomOpponent:
    """Uniformly random legal move: one ``rng.integers(len(legal))`` draw per move.

    Args:
        seed: seeds ``np.random.default_rng``; one instance shared by several seats draws from
            one stream in the order the seats act.
    """

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, env: MultiAgentEnv, seat: int) -> str:
        return random_legal_action(env.legal_actions(seat), self.rng)


class MCTSOpponent:
    """OpenSpiel's ``MCTSBot`` with random-rollout evaluation.

    It searches the true game state, so in imperfect-information games (poker, Hanabi) it sees
    hidden cards: a strong reference opponent, not a fair player. MCTS needs terminal-reward
    games (e.g. not Hanabi); OpenSpiel raises ValueError otherwise.

    Args:
        simulations: MCTS simulations per move.
        seed: seeds the bot's and the evaluator's ``np.random.RandomState``.
        rollouts: random rollouts per leaf evaluation.
        uct_c: UCT exploration constant.
    """

    def __init__(self, simulations: int = 100, seed: int = 0, rollouts: int = 1,
                 uct_c: float = 2.0) -> None:
        if simulations < 1:
            raise ValueError(f"simulations: must be >= 1, got {simulations}")
        self.simulations, self.rollouts, self.uct_c = simulations, rollouts, uct_c
        self.random_state = np.random.RandomState(seed)
        self._bot: MCTSBot | None = None
        self._game_key: str | None = None

    def choose(self, env: OpenSpielEnv, seat: int) -> str:
        if seat != env.current_seat():
            raise ValueError(f"MCTS asked to move for seat {seat}, but seat "
                             f"{env.current_seat()} acts now")
        action_id = self._bot_for(env).step(env.state.clone())
        return env.action_string(action_id)

    def _bot_for(self, env: OpenSpielEnv) -> MCTSBot:
        """The bot for ``env``'s game, built on first use (and rebuilt if the game changes)."""
        game_key = str(env.game)
        if self._bot is None or game_key != self._game_key:
            evaluator = RandomRolloutEvaluator(self.rollouts, self.random_state)
            self._bot = MCTSBot(env.game, self.uct_c, self.simulations, evaluator,
                                random_state=self.random_state, solve=True)
            self._game_key = game_key
        return self._bot


@functools.lru_cache(maxsize=8)
def solved_policy(game_string: str, iterations: int):
    """The average policy of OpenSpiel's CFR+ after ``iterations`` iterations on the game
    ``game_string`` (``str(game)``), solved once per process and game."""
    import pyspiel
    from open_spiel.python.algorithms import cfr

    solver = cfr.CFRPlusSolver(pyspiel.load_game(game_string))
    for _ in range(iterations):
        solver.evaluate_and_update_policy()
    return solver.average_policy()


class CFROpponent:
    """Plays the CFR+ average policy (``solved_policy``): at each information state one
    ``rng.choice`` over the legal moves with the policy's probabilities.

    Args:
        iterations: CFR+ iterations (the policy's exploitability falls roughly as 1/iterations).
        seed: seeds ``np.random.default_rng``.
    """

    def __init__(self, iterations: int, seed: int) -> None:
        if iterations < 1:
            raise ValueError(f"iterations: must be >= 1, got {iterations}")
        self.iterations = iterations
        self.rng = np.random.default_rng(seed)

    def choose(self, env: OpenSpielEnv, seat: int) -> str:
        if seat != env.current_seat():
            raise ValueError(f"CFR asked to move for seat {seat}, but seat "
                             f"{env.current_seat()} acts now")
        policy = solved_policy(str(env.game), self.iterations)
        probabilities = policy.action_probabilities(env.state, seat)
        action_ids = env.legal_action_ids(seat)
        weights = np.array([probabilities.get(a, 0.0) for a in action_ids])
        action_id = action_ids[int(self.rng.choice(len(action_ids), p=weights / weights.sum()))]
        return env.action_string(action_id)


def build_opponent(spec: SeatSpec, seed: int) -> Opponent:
    """The built-in opponent a ``random`` / ``mcts[:N]`` / ``cfr[:N]`` seat spec describes."""
    if spec.kind == "random":
        return RandomOpponent(seed)
    if spec.kind == "mcts":
        return MCTSOpponent(simulations=spec.mcts_simulations, seed=seed)
    if spec.kind == "cfr":
        return CFROpponent(iterations=spec.cfr_iterations, seed=seed)
    raise ValueError(f"seat_to_agent: {spec.raw!r} is not a built-in opponent "
                     "(agents and snapshots are played by the LLM)")
