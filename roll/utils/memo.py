"""A bounded memo: results of a pure function of a hashable key, kept until there are too many."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

Value = TypeVar("Value")


def memoized(memo: dict, key: Hashable, make: Callable[[], Value], limit: int) -> Value:
    """``memo[key]``, made by ``make()`` the first time; the memo starts again (cleared) when
    it holds ``limit`` entries, so it never grows past that. The caller must not change what
    it gets back (hand out copies of mutable values)."""
    value = memo.get(key)
    if value is None:
        value = make()
        if len(memo) >= limit:
            memo.clear()
        memo[key] = value
    return value
