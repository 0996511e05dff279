"""User prompts for OpenSpiel games: rules, the seat's view, legal moves, answer format.

A renderer is a function ``(env, seat) -> RenderedPrompt``, registered per game short name with
``@register_renderer("name")``; ``render_prompt`` picks it, or ``render_generic`` for any other
game. Prompts are kept short (a tiny model with a small context plays them on CPU); each one lists
every legal move verbatim. ``RenderedPrompt.numbered_moves`` tells ``parse_action`` whether a
move's number is an acceptable answer. Renderers only read what the seat may see:
``env.observation(seat)``, ``env.information_state(seat)`` and the legal moves.

A simultaneous-move game (``env.simultaneous_moves``) is played in turn-based form, so its prompt
says that the seat picks without seeing the others' picks of the round: the observation never
shows them, and a model should not wait for them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: team tasks use RenderedPrompt without OpenSpiel
    from roll.agentic.env.openspiel_env import OpenSpielEnv

THINK_AND_ANSWER = "Think inside <think>...</think> if you like, then reply with one legal move"
ANSWER_NUMBERED = f"{THINK_AND_ANSWER} (its text or number) inside <answer>...</answer>."
ANSWER_VERBATIM = f"{THINK_AND_ANSWER}, exactly as written, inside <answer>...</answer>."
SIMULTANEOUS = ("Moves are simultaneous: each round every player picks a move without seeing "
                "the others' picks of that round; the picks are revealed together.")


@dataclass
class RenderedPrompt:
    """The user prompt for one turn."""

    text: str
    """The prompt text (the chat template is applied later, by the rollout)."""
    numbered_moves: bool
    """True if the moves are listed as "1. move"; pass it to ``parse_action``."""


Renderer = Callable[["OpenSpielEnv", int], RenderedPrompt]
RENDERERS: dict[str, Renderer] = {}
RENDERER_GAMES: dict[str, str] = {}
"""The game each registered renderer draws (its short name)."""


def register_renderer(name: str, game: str | None = None) -> Callable[[Renderer], Renderer]:
    """Decorator registering a renderer under ``name``: an OpenSpiel game's short name (and no
    ``game``) makes it that game's prompt; a variant names its ``game`` and a run picks it
    with ``env.renderer``."""

    def register(renderer: Renderer) -> Renderer:
        RENDERERS[name] = renderer
        RENDERER_GAMES[name] = game or name
        return renderer

    return register


def render_prompt(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    """The prompt for ``seat`` (the seat acting now) in ``env``."""
    return RENDERERS.get(env.name, render_generic)(env, seat)


def renderer_named(name: str, game: str) -> Renderer:
    """The renderer registered as ``name`` (``env.renderer``) for ``game``; '' gives
    ``render_prompt`` (each game its own). KeyError naming the choices for an unknown name or
    one that draws another game."""
    if not name:
        return render_prompt
    choices = sorted(n for n, drawn in RENDERER_GAMES.items() if drawn == game)
    if RENDERER_GAMES.get(name) != game:
        raise KeyError(f"no renderer {name!r} for {game}; registered for it: {choices or 'none'} "
                       "('' = the game's own)")
    return RENDERERS[name]


def _prompt(rules: str, state: str, legal: list[str], numbered: bool) -> RenderedPrompt:
    """Assemble rules, state, the move list and the answer instructions."""
    if numbered:
        moves = "Legal moves:\n" + "\n".join(f"{i}. {move}" for i, move in enumerate(legal, 1))
    else:
        moves = "Legal moves: " + ", ".join(legal)
    answer = ANSWER_NUMBERED if numbered else ANSWER_VERBATIM
    return RenderedPrompt(f"{rules}\n{state}\n{moves}\n{answer}", numbered)


def _card_name(rank: int, num_ranks: int) -> str:
    """J, Q, K (, A) for small poker decks; 1-based numbers for bigger ones."""
    return "JQKA"[rank] if num_ranks <= 4 else str(rank + 1)


def _deck_order(num_ranks: int) -> str:
    return "<".join(_card_name(rank, num_ranks) for rank in range(num_ranks))


def render_generic(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    """Any game: its long name, the seat's view (its information state in a game of imperfect
    information, else its observation) and the moves.

    Moves are numbered unless some move is itself an integer (the number would be ambiguous).
    """
    legal = env.legal_actions(seat)
    numbered = not any(move.lstrip("-").isdigit() for move in legal)
    rules = (f"You are playing {env.game.get_type().long_name} as player {seat} "
             f"({env.num_seats} players).")
    if env.simultaneous_moves:
        rules += f" {SIMULTANEOUS}"
    # Imperfect information: the seat's whole information state (its perfect-recall view,
    # e.g. every betting round), where OpenSpiel's observation may keep only the present.
    perfect = env.game.get_type().information == env.game.get_type().Information.PERFECT_INFORMATION
    view = (None if perfect else env.information_state(seat)) or env.observation(seat)
    return _prompt(rules, f"Your view of the game:\n{view}", legal, numbered)


@register_renderer("goofspiel")
def render_goofspiel(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    num_cards = env.game.get_parameters()["game"]["num_cards"]
    rules = (f"Goofspiel, {env.num_seats} players, each with cards 1-{num_cards}. Each round a "
             "point card is shown and every player bids one card from their hand; the highest "
             "bid wins points equal to the point card (a tie: nobody), and bids are discarded. "
             f"Most points at the end wins. {SIMULTANEOUS} Win sequence: each round's winner "
             "(-3: a tie).")
    view = env.observation(seat).rstrip()
    # A move's number would be confused with the card it bids, so the moves are not numbered.
    return _prompt(rules, f"You are player {seat}.\n{view}", env.legal_actions(seat), False)


@register_renderer("tic_tac_toe")
def render_tic_tac_toe(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    return _prompt(_tic_tac_toe_rules(seat), f"Board:\n{env.observation(seat)}",
                   env.legal_actions(seat), True)


@register_renderer("tic_tac_toe_lines", game="tic_tac_toe")
def render_tic_tac_toe_lines(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    """TicTacToe's prompt with, after each legal move, the other two cells of every line
    through its cell (its row, its column, and the diagonals it is on), marks first: e.g.
    ``o(0,2) lines: xx o. ..``. Nothing the board does not show; it puts next to each move
    what decides whether it wins or blocks, where a small model can see it. (Runs of the
    plain prompt learn a fixed order of cells and block no better than chance:
    benchmarks/README.md, "TicTacToe: what the policy reads".)"""
    board = env.observation(seat).rstrip("\n")
    cells = "".join(board.split())  # (9,) row by row
    listed = []
    for number, move in enumerate(env.legal_actions(seat), 1):
        row, col = map(int, re.findall(r"\d", move))
        through = [[(row, k) for k in range(3)], [(k, col) for k in range(3)]]
        if row == col:
            through.append([(k, k) for k in range(3)])
        if row + col == 2:
            through.append([(k, 2 - k) for k in range(3)])
        others = ["".join(sorted((cells[3 * r + c] for r, c in line if (r, c) != (row, col)),
                                 key="xo.".index)) for line in through]
        listed.append(f"{number}. {move} lines: {' '.join(others)}")
    moves = ("Legal moves (after each, the other two cells of each line through it):\n"
             + "\n".join(listed))
    return RenderedPrompt(f"{_tic_tac_toe_rules(seat)}\nBoard:\n{board}\n{moves}\n"
                          f"{ANSWER_NUMBERED}", True)


def _tic_tac_toe_rules(seat: int) -> str:
    return (f"Tic-tac-toe. You are {'xo'[seat]}. Three in a row, column or diagonal wins. "
            "Cells are (row,col), from 0.")


@register_renderer("connect_four")
def render_connect_four(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    rules = _connect_four_rules(env, seat)
    board = env.observation(seat).rstrip("\n")
    # Numbers would be confused with column indices, so the moves are not numbered.
    return _prompt(rules, f"Board (bottom row last):\n{board}", env.legal_actions(seat), False)


@register_renderer("connect_four_lines", game="connect_four")
def render_connect_four_lines(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    """Connect Four's prompt with, after each legal move, the longest line of x and of o
    through the cell that move fills (horizontal, vertical or diagonal; the cell counted), as
    if each mark were put there: e.g. ``x3: x 2, o 4`` (a 4 for the other mark: it wins
    there next unless blocked). Nothing the board does not show; it puts next to each move
    what decides whether it wins or blocks, where a small model can see it, as
    ``tic_tac_toe_lines`` does for TicTacToe."""
    rules = _connect_four_rules(env, seat)
    board = env.observation(seat).rstrip("\n")
    rows = [list(line) for line in reversed(board.split("\n"))]  # bottom row first
    listed = []
    for move in env.legal_actions(seat):
        column = int(move[1:])
        row = next(r for r in range(len(rows)) if rows[r][column] == ".")
        lengths = ", ".join(f"{m} {longest_line_through(rows, row, column, m)}" for m in "xo")
        listed.append(f"{move}: {lengths}")
    moves = ("Legal moves (after each, the longest line through the cell it fills, for an x and "
             "for an o there):\n" + "\n".join(listed))
    return RenderedPrompt(f"{rules}\nBoard (bottom row last):\n{board}\n{moves}\n"
                          f"{ANSWER_VERBATIM}", False)


def _connect_four_rules(env: OpenSpielEnv, seat: int) -> str:
    params, mark = env.game.get_parameters(), "xo"[seat]
    return (f"Connect Four, {params['columns']} columns x {params['rows']} rows. You are "
            f"{mark}. {mark}N drops your piece into column N (0 = left). "
            f"{params['x_in_row']} in a row in any direction wins.")


def longest_line_through(rows: list[list[str]], row: int, column: int, mark: str) -> int:
    """The longest run of ``mark`` through (row, column) in any of the four directions, the
    cell itself counted as ``mark`` (``rows``: bottom row first)."""
    best = 1
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        run = 1
        for sign in (1, -1):
            r, c = row + sign * dr, column + sign * dc
            while 0 <= r < len(rows) and 0 <= c < len(rows[0]) and rows[r][c] == mark:
                run, r, c = run + 1, r + sign * dr, c + sign * dc
        best = max(best, run)
    return best


@register_renderer("kuhn_poker")
def render_kuhn_poker(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    num_ranks = env.num_seats + 1
    rules = (f"Kuhn poker, {env.num_seats} players, deck {_deck_order(num_ranks)}, one card "
             "each, all ante 1. Bet adds 1 chip (or calls a bet); Pass checks (or folds to a "
             "bet). Highest card still in wins the pot.")
    # Information state: the private card number, then one letter per move so far (p/b).
    parsed = re.fullmatch(r"(\d+)([pb]*)", env.information_state(seat) or "")
    if parsed is None:
        state = f"You are player {seat}. Your view: {env.observation(seat)}"
    else:
        moves = ", ".join({"p": "Pass", "b": "Bet"}[c] for c in parsed.group(2)) or "none"
        card = _card_name(int(parsed.group(1)), num_ranks)
        state = f"You are player {seat}. Your card: {card}. Moves so far: {moves}."
    return _prompt(rules, state, env.legal_actions(seat), True)


def _bracket_fields(text: str) -> dict[str, str]:
    """``"[Round 1][Pot: 2][Round1: 2 1]"`` → ``{"Round": "1", "Pot": "2", "Round1": "2 1"}``."""
    fields = {}
    for item in re.findall(r"\[([^\]]*)\]", text):
        key, _, value = item.partition(":") if ":" in item else item.partition(" ")
        fields[key.strip()] = value.strip()
    return fields


@register_renderer("leduc_poker")
def render_leduc_poker(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    num_ranks = env.num_seats + 1
    rules = (f"Leduc poker, {env.num_seats} players, deck: two suits of {_deck_order(num_ranks)}."
             " All ante 1 and get a private card; betting round 1, then a public card, round 2. "
             "Raise = 2 chips (4 in round 2). Pairing the public card wins, else higher card.")
    fields = _bracket_fields(env.information_state(seat) or env.observation(seat))
    ranks_per_card = 1 if env.game.get_parameters().get("suit_isomorphism") else 2

    def card(key: str) -> str:
        value = fields.get(key, "")
        if not value.lstrip("-").isdigit() or int(value) < 0:
            return "none yet"
        return _card_name(int(value) // ranks_per_card, num_ranks)

    # Both rounds' betting: the round-1 history is part of the information state in round 2
    # (a call-raise-call round 1 and a raise-call one lead to different beliefs).
    bets = {}
    for number in (1, 2):
        codes = fields.get(f"Round{number}", "").split()
        bets[number] = ", ".join({"0": "Fold", "1": "Call", "2": "Raise"}.get(code, code)
                                 for code in codes) or "none"
    betting = f"Bets in round 1: {bets[1]}."
    if fields.get("Round", "1") != "1":
        betting += f" Bets in round 2: {bets[2]}."
    state = (f"You are player {seat}. Your card: {card('Private')}. Public card: "
             f"{card('Public')}. Round {fields.get('Round', '?')}. Pot: {fields.get('Pot', '?')}."
             f" Chips left per player: {fields.get('Money', '?')}. {betting}")
    return _prompt(rules, state, env.legal_actions(seat), True)


@register_renderer("hanabi")
def render_hanabi(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    params = env.game.get_parameters()
    colors, ranks = params.get("colors", 5), params.get("ranks", 5)
    rules = (f"Hanabi, cooperative, {env.num_seats} players, {colors} colors, ranks 1-{ranks}. "
             "Build each color's firework in rank order; a wrong play costs a life. Hands, yours "
             "first; per card: the card (XX: you cannot see your own) || what hints told | what "
             "it can still be. A hint (Reveal) costs an info token, a discard regains one. "
             "'player +k' = k seats after you; cards count from 0. Score = cards played.")
    state = f"You are player {seat}.\n{env.observation(seat).rstrip()}"
    return _prompt(rules, state, env.legal_actions(seat), True)


HANABI_COLORS = {"R": "red", "Y": "yellow", "G": "green", "W": "white", "B": "blue"}


def _hanabi_card(code: str) -> str:
    """``"R2"`` -> ``"red 2"``."""
    return f"{HANABI_COLORS[code[0]]} {code[1]}"


def _hanabi_knowledge(hints: str, possible: str) -> str:
    """What a hand's owner knows of one card, from OpenSpiel's ``hints|possible`` fields
    (``"X1"``, ``"RY1"``: told rank 1, it can be red or yellow, rank 1)."""
    told = [HANABI_COLORS[hints[0]]] if hints[0] != "X" else []
    told += [f"rank {hints[1]}"] if hints[1] != "X" else []
    colors, ranks = _split(possible)
    colors = [HANABI_COLORS[c] for c in colors]
    return (f"hinted {' and '.join(told) if told else 'nothing'}; could be {' or '.join(colors)}, "
            f"rank {' or '.join(ranks)}")


def _split(possible: str) -> tuple[str, str]:
    """``"RY12"`` -> (``"RY"``, ``"12"``): the colors and the ranks a card can still be."""
    return "".join(c for c in possible if c.isalpha()), "".join(c for c in possible if c.isdigit())


def hanabi_view(observation: str) -> tuple[dict[str, str], dict[str, int],
                                           list[list[tuple[str, str, str]]]]:
    """OpenSpiel's Hanabi observation string, read: its ``key: value`` lines, each firework's
    height by color letter, and the hands (the observer's first) as (card, hints, possible)
    per card, e.g. ``("XX", "X1", "RY1")``: not seen, hinted rank 1, red or yellow 1."""
    lines = [line for line in observation.splitlines() if line != "Cur player"]
    fields = dict(line.split(": ", 1) for line in lines if ": " in line)
    built = {code[0]: int(code[1:]) for code in fields["Fireworks"].split()}
    hands: list[list[tuple[str, str, str]]] = [[]]
    for line in lines[lines.index("Hands:") + 1:lines.index(f"Deck size: {fields['Deck size']}")]:
        if line == "-----":
            hands.append([])
        else:  # "Y2 || X1|RY1": the card (XX for one's own), hints, what it can be
            card, knowledge = line.split(" || ")
            hints, possible = knowledge.split("|")
            hands[-1].append((card, hints, possible))
    return fields, built, hands


def hanabi_playable(observation: str) -> list[list[bool]]:
    """Per hand (the observer's first; a hand is short once the deck is out), per card:
    whether the observer can tell it is playable now (its own card: every color and rank it
    can still be is next; another's: by sight). What ``hanabi_words`` marks "playable now"."""
    _, built, hands = hanabi_view(observation)
    return _playable(built, hands)


def _playable(built: dict[str, int], hands: list[list[tuple[str, str, str]]]
              ) -> list[list[bool]]:
    """``hanabi_playable`` of an observation already read by ``hanabi_view``."""

    def playable(card_colors: str, card_ranks: str) -> bool:
        return all(int(r) == built[c] + 1 for c in card_colors for r in card_ranks)

    return ([[playable(*_split(possible)) for _, _, possible in hands[0]]]
            + [[playable(card[0], card[1]) for card, _, _ in hand] for hand in hands[1:]])


@register_renderer("hanabi_words", game="hanabi")
def render_hanabi_words(env: OpenSpielEnv, seat: int) -> RenderedPrompt:
    """Hanabi's observation in words: each card's hints and what it can still be spelt out,
    and a card marked "playable now" where the seat can tell it is (every color and rank it
    can still be is the next card of its firework; a partner's card by sight). The same facts
    as ``render_hanabi``'s copy of OpenSpiel's observation, whose ``XX || X1|RY1`` a small
    model must learn to read first."""
    params = env.game.get_parameters()
    colors, ranks = params.get("colors", 5), params.get("ranks", 5)
    fields, built, hands = hanabi_view(env.observation(seat))
    playable = _playable(built, hands)  # per hand, per card
    color_names = ", ".join(HANABI_COLORS[c] for c in built)
    rules = (f"Hanabi, cooperative, {env.num_seats} players, {colors} colors ({color_names}), "
             f"ranks 1-{ranks}. Each color's firework is built 1, 2, 3... in order; playing a "
             "card that is not next loses a life, and when the last life goes the score is 0. "
             "A hint (Reveal) names all of one player's cards of a color or a rank and costs a "
             "hint token; a discard gives one back. Cards count from 0; 'player +k' is k seats "
             "after you. Score = cards played.")
    state = [f"You are player {seat}. Lives: {fields['Life tokens']}. Hint tokens: "
             f"{fields['Info tokens']}. Cards in the deck: {fields['Deck size']}.",
             "Fireworks: " + ", ".join(f"{HANABI_COLORS[c]} {n}" for c, n in built.items())
             + ". Next: " + ", ".join(f"{HANABI_COLORS[c]} {n + 1}" if n < ranks
                                      else f"{HANABI_COLORS[c]} done" for c, n in built.items())
             + ".", "Your cards (hidden from you):"]
    for index, (_, hints, possible) in enumerate(hands[0]):
        mark = " Playable now." if playable[0][index] else ""
        state.append(f"card {index}: {_hanabi_knowledge(hints, possible)}.{mark}")
    for offset, hand in enumerate(hands[1:], 1):
        state.append(f"Player +{offset}'s cards:")
        for index, (card, hints, possible) in enumerate(hand):
            mark = ", playable now" if playable[offset][index] else ""
            state.append(f"card {index}: {_hanabi_card(card)}{mark} (they know: "
                         f"{_hanabi_knowledge(hints, possible)}).")
    discards = fields.get("Discards", "").split()
    state.append("Discarded: " + (", ".join(_hanabi_card(c) for c in discards) or "none") + ".")
    return _prompt(rules, "\n".join(state), env.legal_actions(seat), True)
