"""CORY's task (roll/agentic/tasks/cory.py) on scripted answers, through the episode code."""

import pytest

from roll.agentic.tasks.registry import task_factory

from .test_team_tasks import ITEMS, play

ROLES = ["pioneer", "observer"]


def cory(**params):
    return task_factory("cory", params, ITEMS)


def test_the_observer_sees_the_pioneers_answer_and_both_get_the_collective_reward():
    asks, played, outcome = play(cory(), ["3 + 4 = 7. <answer>7</answer>",
                                          "The answer above adds up. <answer>8</answer>"],
                                 seats=ROLES)
    assert [a.seat for a in asks] == [0, 1]
    assert "[pioneer]" not in asks[0].prompt.text
    assert asks[1].prompt.text == (
        "Problem: Ada has 3 apples and gets 4 more. How many?\n\n"
        "[pioneer]\n3 + 4 = 7. <answer>7</answer>\n\n"
        "You are the observer. Another model's answer is shown above; it may be wrong. Solve "
        "the problem, then give only the final answer as <answer>ANSWER</answer>.")
    # pioneer right (1), observer wrong (0): both roles get 1 + 0, paid at the end
    assert outcome.returns == [1.0, 1.0]
    assert outcome.turn_rewards == {0: [1.0], 1: [1.0]}
    assert all(p.format_error is None for p in played)
    assert outcome.metrics == {"pioneer_correct": 1.0, "observer_correct": 0.0}


def test_own_rewards_without_collective_and_format_errors():
    _, played, outcome = play(cory(collective=False),
                              ["no idea", "7 it is. <answer>7</answer>"], seats=ROLES,
                              penalty=0.5)
    assert played[0].format_error == "no_answer" and played[1].format_error is None
    # pioneer: 0 - 0.5 penalty; observer: 1
    assert outcome.turn_rewards == {0: [-0.5], 1: [1.0]}
    assert outcome.returns == [0.0, 1.0]  # the task's own returns (no penalty in them)


def test_closed_answers_list_the_choices_and_summarize():
    asks, _, outcome = play(cory(closed_answers=True), ["<answer>7</answer>", "<answer>7</answer>"],
                            seats=ROLES)
    assert asks[0].legal == ["6", "7", "8"] and asks[1].legal == ["6", "7", "8"]
    assert outcome.returns == [2.0, 2.0]
    factory = cory()
    summary = factory().summarize([{"pioneer_correct": 1.0, "observer_correct": 1.0},
                                   {"pioneer_correct": 0.0, "observer_correct": 1.0}])
    assert summary == {"task/accuracy_pioneer": 0.5, "task/accuracy_observer": 1.0,
                       "task/observer_gain": 0.5}


def test_bad_parameters_name_the_key():
    with pytest.raises(ValueError, match=r"env.params.collective='yes'"):
        cory(collective="yes")
    with pytest.raises(ValueError, match="choices"):
        task_factory("cory", {"closed_answers": True}, [{"question": "q", "answer": "1"}])
