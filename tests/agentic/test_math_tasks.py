"""Math answer checking (real math-verify) and the built-in arithmetic problems."""

from __future__ import annotations

import re
import threading

import math_verify  # noqa: F401  (a broken extra fails here, never skips)
import pytest

from roll.agentic.tasks.math_check import MathCheck, check_math_answer, final_answer
from roll.agentic.tasks.problems import arithmetic_problems


@pytest.mark.parametrize("text, gold, expected", [
    ("The sum is <answer>42</answer>", "42", MathCheck("42", True)),
    ("<answer>41</answer>", "42", MathCheck("41", False)),
    # Symbolic, not textual: a fraction, a decimal and LaTeX are the same number.
    ("so x = <answer>\\frac{1}{2}</answer>", "0.5", MathCheck("\\frac{1}{2}", True)),
    ("<answer>1/2</answer>", "\\frac{1}{2}", MathCheck("1/2", True)),
    ("first \\boxed{3}, then \\boxed{\\frac{6}{4}}", "3/2", MathCheck("\\frac{6}{4}", True)),
    # The last <answer> wins over earlier ones and over boxes.
    ("<answer>5</answer> no wait <answer>7</answer> \\boxed{5}", "7", MathCheck("7", True)),
    # Unparseable or missing: no crash, no answer, not correct (the task penalises it).
    ("<answer>banana</answer>", "42", MathCheck(None, False)),
    ("I think it is forty-two.", "42", MathCheck(None, False)),
    ("<answer></answer>", "42", MathCheck(None, False)),
    ("cut off \\boxed{4", "4", MathCheck(None, False)),
    # Never eval'd: code is just an unparseable answer.
    ("<answer>__import__('os').system('true')</answer>", "0", MathCheck(None, False)),
])
def test_hand_made_answers(text, gold, expected):
    assert check_math_answer(text, gold) == expected


def test_a_gold_answer_that_cannot_be_parsed_is_a_dataset_error():
    with pytest.raises(ValueError, match=r"gold answer 'banana': math-verify cannot parse it"):
        check_math_answer("<answer>1</answer>", "banana")


def test_checking_works_off_the_main_thread():
    """Rollouts may score in worker threads, where math-verify's SIGALRM timeouts are off."""
    seen = []
    thread = threading.Thread(target=lambda: seen.append(
        check_math_answer("<answer>\\frac{1}{2}</answer>", "0.5")))
    thread.start()
    thread.join()
    assert seen == [MathCheck("\\frac{1}{2}", True)]


def test_final_answer_balances_braces():
    assert final_answer("\\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert final_answer("nothing here") is None


def test_arithmetic_problems_have_exact_answers_and_a_seeded_order():
    problems = arithmetic_problems(40, seed=3)
    assert problems == arithmetic_problems(40, seed=3)
    assert problems != arithmetic_problems(40, seed=4)
    assert {p.kind for p in problems} == {"add", "sub", "mul", "div"}
    ops = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b,
           "mul": lambda a, b: a * b, "div": lambda a, b: a / b}
    for problem in problems:
        a, b = (int(n) for n in re.findall(r"\d+", problem.question))
        value = ops[problem.kind](a, b)
        assert value == int(value) and value > 0, problem  # exact, positive integers
        assert problem.answer == str(int(value)), problem
        assert check_math_answer(f"<answer>{int(value)}</answer>", problem.answer).correct
        assert not check_math_answer(f"<answer>{int(value) + 1}</answer>",
                                     problem.answer).correct
    with pytest.raises(ValueError, match=r"count=0: must be an integer >= 1"):
        arithmetic_problems(0)


def test_tag_contents_is_what_the_lazy_regex_finds_without_its_quadratic_scan():
    """``tag_contents`` gives re.findall's answer on tag soup (openings inside a match are
    content, stray closings are skipped, case folded when asked), and on 20,000 unclosed
    ``<answer>`` tags (the regex took 77 s there: seen in the garbage-output campaign) nothing."""
    import random

    from roll.agentic.tasks.math_check import tag_contents

    rng = random.Random(3)
    pieces = ["<answer>", "</answer>", "<ANSWER>", "</Answer>", "x", "7", " ", "<answer", ">"]
    for _ in range(2000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(12)))
        assert tag_contents(text, "answer") == re.findall(r"<answer>(.*?)</answer>", text,
                                                          re.DOTALL), text
        assert tag_contents(text, "answer", ignore_case=True) == re.findall(
            r"<answer>(.*?)</answer>", text, re.DOTALL | re.IGNORECASE), text
    assert tag_contents("<answer>" * 20_000 + "x(1,1)", "answer") == []
    assert final_answer("<answer>" * 20_000 + "7</answer>") == "<answer>" * 19_999 + "7"
    assert check_math_answer("<answer>" * 20_000, "7") == MathCheck(None, False)
