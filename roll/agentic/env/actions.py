"""Turn a model's text into a legal action, and what to do when it cannot be done.

What ``parse_action`` accepts, in order:

1. Thinking is removed first: every ``<think>…</think>`` block (nested ones too); an unclosed
   ``<think>`` drops everything after it; a ``</think>`` with no opening tag (chat templates that
   open the think block in the prompt) drops everything before it. Tags are case-insensitive.
2. The answer is the capture group of the LAST match of ``ActionConfig.answer_pattern`` (default
   ``<answer>…</answer>``, innermost when nested; matched with IGNORECASE and DOTALL). No match →
   ``no_answer``; a blank answer → ``empty_answer``.
3. The answer is matched against the legal action strings:
   a. exactly, after stripping surrounding whitespace;
   b. normalised: case-insensitive, all whitespace removed, surrounding quotes / backticks /
      asterisks, one trailing period and one pair of enclosing parentheses ignored — accepted
      only if exactly one legal action matches (else ``ambiguous_action``);
   c. only if the prompt listed numbered moves (``numbered_moves=True``): the 1-based number of
      a listed move (``"3"``, ``"#3"``, ``"3."``), or the number followed by that same move's text
      (``"3. x(1,0)"``). Exact text matches win over numbers.
   Anything else → ``illegal_action``. With no legal action strings (free-form seat, e.g. a team
   role) the stripped answer itself is the action.

On a format error the caller subtracts ``ActionConfig.format_penalty`` from that seat's turn
reward and ``apply_parsed_action`` plays the fallback: ``"random"`` (a uniformly random legal
move from the caller's seeded RNG) or ``"forfeit"`` (``env.forfeit(seat)``: the episode ends and
the seat gets the worst outcome; see the env's docstring). A free-form seat has no move to draw
at random, so it forfeits under either policy. ``FormatCounters`` counts turns, errors and
fallbacks per agent for the metrics.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from roll.agentic.env.base import MultiAgentEnv, StepResult
from roll.errors import ConfigError

DEFAULT_ANSWER_PATTERN = r"<answer>((?:(?!<answer>).)*?)</answer>"
FALLBACK_POLICIES = ("random", "forfeit")

_THINK_TAG = re.compile(r"<(/?)think\s*>", re.IGNORECASE)
_NUMBERED = re.compile(r"(?:move\s*)?#?(\d{1,6})\s*(?:[.):]\s*(.*))?", re.IGNORECASE | re.DOTALL)
_WRAPPERS = "\"'`*"


class FormatError(StrEnum):
    """Why a model's answer could not be used as an action."""

    NO_ANSWER = "no_answer"
    EMPTY_ANSWER = "empty_answer"
    ILLEGAL_ACTION = "illegal_action"
    AMBIGUOUS_ACTION = "ambiguous_action"


@dataclass
class ActionConfig:
    """How answers are parsed and what an unusable answer costs (the run's ``env.action``).
    Checked on construction; errors name the key ``env.action.<field>``."""

    answer_pattern: str = DEFAULT_ANSWER_PATTERN
    """Regex finding the answer; its single capture group (or the whole match if it has no
    group) is the answer. Compiled with IGNORECASE and DOTALL; the last match counts."""
    format_penalty: float = 1.0
    """Non-negative amount subtracted from the turn reward of a seat whose answer had a format
    error."""
    fallback: str = "random"
    """Move played for an unusable answer: "random" (uniform legal move) or "forfeit"."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> ActionConfig:
        try:
            regex = _compile_answer_pattern(self.answer_pattern)
        except re.error as error:
            raise ConfigError("env.action.answer_pattern", self.answer_pattern,
                              f"invalid regex: {error}") from None
        if regex.groups > 1:
            raise ConfigError("env.action.answer_pattern", self.answer_pattern,
                              f"needs at most one capture group, got {regex.groups}")
        if self.fallback not in FALLBACK_POLICIES:
            raise ConfigError("env.action.fallback", self.fallback,
                              f"must be one of {FALLBACK_POLICIES}")
        if not self.format_penalty >= 0:
            raise ConfigError("env.action.format_penalty", self.format_penalty,
                              "must be >= 0 (it is subtracted)")
        return self

    @property
    def answer_regex(self) -> re.Pattern[str]:
        """``answer_pattern`` compiled (once per pattern: not a field, so the class stays a
        plain OmegaConf schema node)."""
        return _compile_answer_pattern(self.answer_pattern)


@functools.lru_cache(maxsize=64)
def _compile_answer_pattern(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.DOTALL)


@dataclass
class ParsedAction:
    """Result of parsing one model output against the legal actions of one turn."""

    action: str | None
    """The legal action string chosen (or the free-form answer); None on a format error."""
    answer: str | None
    """The extracted answer text before matching; None when no answer was found."""
    format_error: FormatError | None = None
    """Why ``action`` is None."""
    matched_by: str | None = None
    """How the answer matched: "exact", "normalized", "index" or "free_form"."""


def strip_thinking(text: str) -> str:
    """``text`` without its thinking (rules in the module docstring). Linear time."""
    kept: list[str] = []
    depth, last = 0, 0
    for tag in _THINK_TAG.finditer(text):
        if depth == 0:
            kept.append(text[last:tag.start()])
        is_closing = bool(tag.group(1))
        if is_closing and depth == 0:
            kept = []  # a stray </think>: the think block was opened by the prompt
        else:
            depth += -1 if is_closing else 1
        last = tag.end()
    if depth == 0:
        kept.append(text[last:])
    return "".join(kept)


def extract_answer(text: str, answer_regex: re.Pattern[str]) -> str | None:
    """The answer inside the last match of ``answer_regex`` in ``text``, or None."""
    last = None
    for match in answer_regex.finditer(text):
        last = match
    if last is None:
        return None
    return last.group(1) if answer_regex.groups else last.group(0)


def _normalize(text: str) -> str:
    text = text.strip().removesuffix(".").strip().strip(_WRAPPERS).strip().removesuffix(".")
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    return "".join(text.casefold().split())


def _match_numbered(answer: str, legal_actions: Sequence[str]) -> str | None:
    numbered = _NUMBERED.fullmatch(answer)
    if numbered is None or not 1 <= int(numbered.group(1)) <= len(legal_actions):
        return None
    action = legal_actions[int(numbered.group(1)) - 1]
    rest = numbered.group(2)
    if rest and _normalize(rest) != _normalize(action):
        return None
    return action


def match_action(answer: str, legal_actions: Sequence[str],
                 numbered_moves: bool = False) -> ParsedAction:
    """Match an extracted answer to one of ``legal_actions`` (rules 3a–3c of the module doc)."""
    cleaned = answer.strip()
    if not cleaned:
        return ParsedAction(None, answer, FormatError.EMPTY_ANSWER)
    if not legal_actions:
        return ParsedAction(cleaned, answer, matched_by="free_form")
    if cleaned in legal_actions:
        return ParsedAction(cleaned, answer, matched_by="exact")
    key = _normalize(cleaned)
    candidates = [action for action in legal_actions if _normalize(action) == key]
    if len(candidates) == 1:
        return ParsedAction(candidates[0], answer, matched_by="normalized")
    if len(candidates) > 1:
        return ParsedAction(None, answer, FormatError.AMBIGUOUS_ACTION)
    if numbered_moves and (action := _match_numbered(cleaned, legal_actions)) is not None:
        return ParsedAction(action, answer, matched_by="index")
    return ParsedAction(None, answer, FormatError.ILLEGAL_ACTION)


def parse_action(text: str, legal_actions: Sequence[str], config: ActionConfig,
                 numbered_moves: bool = False) -> ParsedAction:
    """Parse a model output into a legal action; never raises on any string.

    Args:
        text: the decoded model output (thinking included).
        legal_actions: the acting seat's legal action strings (empty = free-form).
        config: answer pattern (the penalty and fallback are used by ``apply_parsed_action``).
        numbered_moves: whether the prompt numbered the moves (``RenderedPrompt.numbered_moves``).
    """
    answer = extract_answer(strip_thinking(text), config.answer_regex)
    if answer is None:
        return ParsedAction(None, None, FormatError.NO_ANSWER)
    return match_action(answer, legal_actions, numbered_moves)


def random_legal_action(legal_actions: Sequence[str], rng: np.random.Generator) -> str:
    """A uniformly random legal action: one ``rng.integers(len(legal_actions))`` draw."""
    if not legal_actions:
        raise ValueError("no legal action to draw from (free-form seat)")
    return legal_actions[int(rng.integers(len(legal_actions)))]


@dataclass
class FormatCounters:
    """Per-agent counts of turns, format errors (by kind) and fallbacks (by policy)."""

    turns: Counter[str] = field(default_factory=Counter)
    """Turns parsed per agent."""
    errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(agent, format error kind) → count."""
    fallbacks: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(agent, "random" | "forfeit") → count."""

    def record(self, agent_id: str, format_error: FormatError | None,
               fallback: str | None) -> None:
        """Count one turn of ``agent_id``."""
        self.turns[agent_id] += 1
        if format_error is not None:
            self.errors[agent_id, str(format_error)] += 1
        if fallback is not None:
            self.fallbacks[agent_id, fallback] += 1

    def metrics(self) -> dict[str, float]:
        """Flat metrics: ``{agent}/format/<kind>`` (counts) and
        ``{agent}/format/fallback_<policy>`` (counts). The error rate is the rollout's
        ``{agent}/format_error_rate`` (scheduler.py), computed from the turns themselves."""
        out: dict[str, float] = {}
        for (agent_id, kind), count in self.errors.items():
            out[f"{agent_id}/format/{kind}"] = float(count)
        for (agent_id, policy), count in self.fallbacks.items():
            out[f"{agent_id}/format/fallback_{policy}"] = float(count)
        return out

    def reset(self) -> None:
        """Forget all counts (e.g. after logging a step)."""
        self.turns.clear()
        self.errors.clear()
        self.fallbacks.clear()


@dataclass
class TurnOutcome:
    """What happened when a parsed answer was played."""

    step: StepResult
    """The env step actually taken (the answer's move, the random fallback, or the forfeit)."""
    action: str | None
    """Action played; None when the seat forfeited."""
    format_error: FormatError | None
    """The answer's format error, if any."""
    fallback: str | None
    """"random" or "forfeit" when the answer was unusable, else None."""
    penalty: float
    """Amount to subtract from the seat's turn reward (``format_penalty`` on error, else 0)."""


def apply_parsed_action(env: MultiAgentEnv, seat: int, parsed: ParsedAction,
                        config: ActionConfig, rng: np.random.Generator,
                        counters: FormatCounters | None = None,
                        agent_id: str | None = None) -> TurnOutcome:
    """Play ``parsed`` for ``seat`` (the current seat) in ``env``, or the fallback on error.

    ``rng`` draws the random fallback move; ``counters`` (if given) counts the turn under
    ``agent_id`` (defaults to ``"seat<seat>"``).
    """
    fallback = None
    if parsed.format_error is None:
        action = parsed.action
        step = env.step(action)
    elif config.fallback == "random" and (legal := env.legal_actions(seat)):
        fallback, action = "random", random_legal_action(legal, rng)
        step = env.step(action)
    else:
        fallback, action = "forfeit", None
        step = env.forfeit(seat)
    if counters is not None:
        counters.record(agent_id or f"seat{seat}", parsed.format_error, fallback)
    penalty = config.format_penalty if parsed.format_error is not None else 0.0
    return TurnOutcome(step, action, parsed.format_error, fallback, penalty)


def answer_token_ids(tokenizer, moves: list[str]) -> list[list[int]]:
    """Token ids of ``<answer>MOVE</answer>`` + EOS for each move: the answers constrained
    decoding allows (and that exploitability scores)."""
    eos = tokenizer.eos_token_id
    return [tokenizer.encode(f"<answer>{move}</answer>", add_special_tokens=False) + [eos]
            for move in moves]


def budgeted_answer_ids(tokenizer, moves: list[str], max_new_tokens: int,
                        game: str) -> list[list[int]]:
    """``answer_token_ids``, refused (ConfigError naming ``rollout.sampling.max_new_tokens``)
    when the longest answer is cut off by the token budget: it could never be parsed, so every
    such turn would be a format error."""
    answers = answer_token_ids(tokenizer, moves)
    longest = max(answers, key=len)
    if len(longest) > max_new_tokens:
        raise ConfigError("rollout.sampling.max_new_tokens", max_new_tokens,
                          f"the constrained answer {tokenizer.decode(longest)!r} of {game} "
                          f"needs {len(longest)} tokens: every such turn would be cut off; "
                          "raise it")
    return answers
