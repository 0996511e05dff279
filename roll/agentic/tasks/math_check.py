"""Checking a model's math answer against a gold answer with ``math-verify``.

The final answer is the last ``<answer>…</answer>`` in the text, else the last ``\\boxed{…}``;
with ``lenient=True`` (small models that do not tag their answers) else the last number in the
text (``-3``, ``2.5``, ``7/2``, thousands commas dropped). Both sides are parsed by math-verify
(LaTeX or plain expressions, to sympy) and compared symbolically (``1/2`` equals ``0.5`` and
``\\frac{1}{2}``). Nothing is ever ``eval``'d. A text with no final answer, or one math-verify
cannot parse, is not a crash: it comes back as ``MathCheck(answer=None, correct=False)``, for
the task to penalise as a format error. A gold answer that cannot be parsed is a dataset error
(ValueError naming it).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")
_BOXED = "\\boxed{"


@dataclass(frozen=True)
class MathCheck:
    """The verdict on one answer."""

    answer: str | None
    """The final answer found and parsed (None: none found, or unparseable)."""
    correct: bool
    """It equals the gold answer (False when ``answer`` is None)."""


def tag_contents(text: str, tag: str, ignore_case: bool = False) -> list[str]:
    """What every ``<tag>…</tag>`` of ``text`` holds, left to right — what
    ``re.findall(r"<tag>(.*?)</tag>", text, re.DOTALL)`` gives — in linear time. (That lazy
    pattern rescans the rest of the text from every opening tag never closed: 77 s for a
    garbage output of 20,000 ``<answer>`` tags.)"""
    found, start = [], None
    for match in re.finditer(f"<(/?){re.escape(tag)}>", text,
                             re.IGNORECASE if ignore_case else 0):
        if start is None and not match.group(1):
            start = match.end()  # the first opening tag starts a match; later ones are content
        elif start is not None and match.group(1):
            found.append(text[start:match.start()])
            start = None
    return found


def final_answer(text: str, lenient: bool = False) -> str | None:
    """The last ``<answer>…</answer>``, else the last ``\\boxed{…}`` (braces balanced), else
    (``lenient``) the last number, else None; stripped."""
    tagged = tag_contents(text, "answer")
    if tagged:
        return tagged[-1].strip()
    start = text.rfind(_BOXED)
    if start < 0:
        numbers = _NUMBER.findall(text) if lenient else []
        return numbers[-1].replace(",", "") if numbers else None
    depth, begin = 1, start + len(_BOXED)
    for index in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[begin:index].strip()
    return None  # unbalanced: cut off mid-answer


def _main_thread() -> bool:
    # math-verify's timeouts use SIGALRM, which only the main thread can arm; elsewhere
    # (e.g. a worker thread) they are switched off.
    return threading.current_thread() is threading.main_thread()


def _parse(expression: str) -> list:
    from math_verify import parse

    return parse(expression) if _main_thread() else parse(expression, parsing_timeout=None)


def parseable(expression: str) -> bool:
    """Whether math-verify can parse ``expression`` (e.g. a dataset's gold answer)."""
    return bool(_parse(expression))


def check_gold_answers(items, where: str) -> None:
    """Every item's ``answer`` parses (a dataset error naming the item otherwise)."""
    for index, item in enumerate(items):
        if not parseable(str(item["answer"])):
            raise ValueError(f"{where}: item {index}: math-verify cannot parse the answer "
                             f"{item['answer']!r}")


def _verify(gold: list, answer: list) -> bool:
    from math_verify import verify

    if _main_thread():
        return bool(verify(gold, answer))
    return bool(verify(gold, answer, timeout_seconds=None))


def equivalent(first: str, second: str) -> bool:
    """Whether two final answers are the same value by math-verify (False if either does not
    parse), e.g. for counting votes."""
    parsed_first, parsed_second = _parse(first), _parse(second)
    return bool(parsed_first and parsed_second and _verify(parsed_first, parsed_second))


def check_math_answer(text: str, gold: str, lenient: bool = False) -> MathCheck:
    """Whether ``text``'s final answer equals ``gold`` (module docstring)."""
    gold_parsed = _parse(gold)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r}: math-verify cannot parse it")
    answer = final_answer(text, lenient)
    if not answer:
        return MathCheck(None, False)
    parsed = _parse(answer)
    if not parsed:
        return MathCheck(None, False)
    return MathCheck(answer, _verify(gold_parsed, parsed))
