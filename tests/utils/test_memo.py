"""roll/utils/memo.py: a value is made once per key, and the memo never holds more than its
limit."""

from __future__ import annotations

from roll.utils.memo import memoized


def test_made_once_per_key_and_cleared_at_the_limit():
    memo: dict = {}
    made: list[str] = []

    def make(key: str):
        return lambda: made.append(key) or key.upper()

    assert [memoized(memo, k, make(k), limit=2) for k in "aab"] == ["A", "A", "B"]
    assert made == ["a", "b"] and len(memo) == 2
    assert memoized(memo, "c", make("c"), limit=2) == "C"  # full: starts again
    assert memo == {"c": "C"}
    assert memoized(memo, "a", make("a"), limit=2) == "A" and made == ["a", "b", "c", "a"]
