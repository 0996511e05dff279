"""Team tasks (roll/agentic/tasks): turn order, shared history, rewards and metrics on
hand-made answers, driven through the same episode code as the games."""

import pytest

from roll.agentic.env.actions import ActionConfig
from roll.agentic.env.seating import build_seating
from roll.agentic.rollout.episode import EpisodeSetup, EpisodeSpec, LocalEpisodes
from roll.agentic.tasks.base import Transcript
from roll.agentic.tasks.math_team import MathTeam, parse_verdict
from roll.agentic.tasks.registry import render_task, task_factory
from roll.agentic.tasks.writing_team import WritingTeam, joint_scores
from roll.errors import ConfigError

ITEMS = [{"question": "Ada has 3 apples and gets 4 more. How many?", "answer": "7",
          "choices": ["6", "7", "8"]},
         {"question": "What is 10 / 4?", "answer": "5/2", "choices": ["2", "5/2", "3"]}]
ROLES = ["gen", "crit", "ref"]


def play(factory, answers, item=0, penalty=0.5, seats=ROLES, critic_view=False):
    """Play one episode with scripted answers through LocalEpisodes; (asks, played, outcome)."""
    host = LocalEpisodes()
    setup = EpisodeSetup(factory, render_task, ActionConfig(format_penalty=penalty), 16,
                         critic_view)
    seating = build_seating(list(seats), len(seats), list(seats))
    ask = host.open(setup, [EpisodeSpec(0, 123, seating, 0, item)])[0]
    asks, played = [], []
    for text in answers:
        assert ask is not None, "the episode ended before the scripted answers did"
        asks.append(ask)
        result, ask = host.play(0, text)
        played.append(result)
    assert ask is None, "the episode goes on after the scripted answers"
    return asks, played, host.outcomes()[0]


def math_factory(**params):
    return task_factory("math_team", params, ITEMS)


def test_math_team_refines_after_a_flag_and_stops_when_the_critic_accepts():
    asks, played, outcome = play(math_factory(max_rounds=2), [
        "3 + 4 = 8. <answer>8</answer>",
        "3 + 4 is 7, not 8. <verdict>Incorrect</verdict>",
        "<think>recount</think>3 + 4 = 7. <answer>7</answer>",
        "Right. <verdict>Correct</verdict>",
    ])
    assert [a.seat for a in asks] == [0, 1, 2, 1]
    assert [a.turn for a in asks] == [0, 1, 2, 3]
    # generator wrong (0), critic right twice (1 + 1), refiner right (1)
    assert outcome.returns == [0.0, 2.0, 1.0]
    assert outcome.turn_rewards == {0: [0.0], 1: [1.0, 1.0], 2: [1.0]}
    assert all(p.format_error is None for p in played)
    assert outcome.metrics == {
        "initial_correct": 0.0, "final_correct": 1.0, "refinements": 1.0,
        "critic_turns": 2.0, "critic_right": 2.0, "critic_flagged": 1.0,
        "critic_flagged_wrong": 1.0, "critic_judged_wrong": 1.0}


def test_every_role_sees_the_whole_conversation_in_order():
    asks, _, _ = play(math_factory(max_rounds=1), [
        "I think it is 8 because 3+4. <answer>8</answer>",
        "Wrong sum. <verdict>Incorrect</verdict>",
        "<answer>7</answer>",
        "<verdict>Correct</verdict>",
    ])
    refiner_prompt = asks[2].prompt.text
    assert refiner_prompt == (
        "Problem: Ada has 3 apples and gets 4 more. How many?\n\n"
        "[generator]\nI think it is 8 because 3+4. <answer>8</answer>\n\n"
        "[critic]\nWrong sum. <verdict>Incorrect</verdict>\n\n"
        "You are the refiner. Using the critique, write a corrected solution, then give only "
        "the final answer as <answer>ANSWER</answer>.")
    assert asks[0].prompt.text.startswith("Problem: Ada has 3 apples")
    assert "[generator]" not in asks[0].prompt.text
    assert asks[0].legal == []  # free text unless closed_answers


def test_unusable_answers_are_format_errors_with_the_penalty_never_a_crash():
    # no final answer, then no verdict (does not accept: the refiner still acts), then an
    # answer math-verify cannot parse
    _, played, outcome = play(math_factory(max_rounds=1), [
        "I am not sure.", "Hmm, maybe.", "<answer>@@@</answer>", "<verdict>Correct</verdict>",
    ], penalty=0.5)
    assert [p.format_error for p in played] == ["no_answer", "no_verdict", "no_answer", None]
    # critic: the wrong (unparseable) solution judged Correct scores 0
    assert outcome.turn_rewards == {0: [-0.5], 1: [-0.5, 0.0], 2: [-0.5]}
    assert outcome.returns == [0.0, 0.0, 0.0]  # env returns carry no penalty


def test_the_critic_accepting_a_correct_first_answer_ends_the_episode_and_stops_at_max_rounds():
    _, _, outcome = play(math_factory(max_rounds=2), [
        "<answer>7</answer>", "<verdict>Correct</verdict>"])
    assert outcome.returns == [1.0, 1.0, 0.0]
    assert outcome.metrics["refinements"] == 0.0
    # an always-flagging critic: generator, critic, then 2 x (refiner, critic)
    asks, _, outcome = play(math_factory(max_rounds=2), [
        "<answer>1</answer>", "<verdict>Incorrect</verdict>", "<answer>2</answer>",
        "<verdict>Incorrect</verdict>", "<answer>3</answer>", "<verdict>Incorrect</verdict>"])
    assert [a.seat for a in asks] == [0, 1, 2, 1, 2, 1]
    assert outcome.returns == [0.0, 3.0, 0.0]


def test_math_answers_are_compared_symbolically_and_the_item_comes_from_the_spec():
    _, _, outcome = play(math_factory(max_rounds=0), [
        r"10/4 = \boxed{\frac{5}{2}}", "<verdict>correct.</verdict>"], item=1)
    assert outcome.returns == [1.0, 1.0, 0.0]


def test_closed_answers_list_the_items_choices_and_the_verdicts():
    asks, _, _ = play(math_factory(max_rounds=0, closed_answers=True), [
        "<answer>6</answer>", "<answer>Incorrect</answer>"])
    assert asks[0].legal == ["6", "7", "8"]
    assert asks[1].legal == ["Correct", "Incorrect"]
    assert parse_verdict("<answer>Incorrect</answer>") == "incorrect"
    assert parse_verdict("<verdict>maybe</verdict>") is None


def test_math_summary_precision_and_recall_of_flagging_wrong_solutions():
    episodes = [
        # flagged a wrong one (tp), then accepted a right one
        {"initial_correct": 0.0, "final_correct": 1.0, "refinements": 1.0, "critic_turns": 2.0,
         "critic_right": 2.0, "critic_flagged": 1.0, "critic_flagged_wrong": 1.0,
         "critic_judged_wrong": 1.0},
        # accepted a wrong one (fn)
        {"initial_correct": 0.0, "final_correct": 0.0, "refinements": 0.0, "critic_turns": 1.0,
         "critic_right": 0.0, "critic_flagged": 0.0, "critic_flagged_wrong": 0.0,
         "critic_judged_wrong": 1.0},
        # flagged a right one (fp), refinement broke it
        {"initial_correct": 1.0, "final_correct": 0.0, "refinements": 1.0, "critic_turns": 2.0,
         "critic_right": 1.0, "critic_flagged": 2.0, "critic_flagged_wrong": 1.0,
         "critic_judged_wrong": 1.0},
    ]
    summary = MathTeam.summarize(episodes)
    assert summary["task/accuracy_initial"] == pytest.approx(1 / 3)
    assert summary["task/accuracy_final"] == pytest.approx(1 / 3)
    assert summary["task/refinement_gain"] == pytest.approx(0.0)
    assert summary["task/critic_accuracy"] == pytest.approx(3 / 5)
    assert summary["task/critic_precision"] == pytest.approx(2 / 3)  # 2 of 3 flags were wrong
    assert summary["task/critic_recall"] == pytest.approx(2 / 3)  # 2 of 3 wrong ones flagged


def test_bad_task_parameters_and_datasets_are_named():
    with pytest.raises(ConfigError, match=r"env.params.max_rounds=-1"):
        math_factory(max_rounds=-1)
    with pytest.raises(ConfigError, match=r"env.params.rounds=2: math_team takes no such"):
        math_factory(rounds=2)
    with pytest.raises(ValueError, match=r"item 0 has no field 'choices'"):
        task_factory("math_team", {"closed_answers": True}, [{"question": "q", "answer": "1"}])
    with pytest.raises(ValueError, match=r"math-verify cannot parse the answer '@@'"):
        task_factory("math_team", {}, [{"question": "q", "answer": "@@"}])
    with pytest.raises(ConfigError, match=r"env.task='chess_team': unknown task"):
        task_factory("chess_team", {}, ITEMS)


@pytest.mark.parametrize("task", ["math_team", "debate", "majority_vote", "cory"])
def test_every_math_task_checks_its_flags_and_items_by_name(task):
    """The checks the math tasks share (TranscriptTask.keep_items), each named for its task."""
    with pytest.raises(ConfigError, match=r"env.params.closed_answers='yes': must be true or"):
        task_factory(task, {"closed_answers": "yes"}, ITEMS)
    with pytest.raises(ConfigError, match=r"env.params.lenient_answers=1: must be true or"):
        task_factory(task, {"lenient_answers": 1}, ITEMS)
    with pytest.raises(ValueError, match=rf"^{task}: the dataset has no items"):
        task_factory(task, {}, [])
    with pytest.raises(ValueError, match=rf"^{task} dataset: item 1 has no field 'choices'"):
        task_factory(task, {"closed_answers": True}, [ITEMS[0], {"question": "q", "answer": "1"}])
    env = task_factory(task, {"closed_answers": True, "lenient_answers": True}, ITEMS)()
    assert (env.items, env.closed_answers, env.lenient) == (ITEMS, True, True)
    env.reset(0, item=1)
    assert "5/2" in env.legal_actions(0)


def test_writing_joint_reward_by_hand_and_both_writers_get_it():
    a = "Bees pollinate city parks"          # 4 words
    b = "Place hives on roofs and count bees"  # 7 words, shares 'bees'
    scores = joint_scores([a, b], target_words=4)
    assert scores["length"] == pytest.approx((1.0 + (1 - 3 / 4)) / 2)  # 7 words: 3 over
    assert scores["balance"] == pytest.approx(4 / 7)
    assert scores["diversity"] == pytest.approx(10 / 11)  # 10 distinct of 11 words
    assert scores["distinct"] == pytest.approx(1 - 1 / 10)  # 1 shared of 10 distinct
    joint = (0.625 + 4 / 7 + 10 / 11 + 0.9) / 4
    assert scores["joint"] == pytest.approx(joint)
    factory = task_factory("writing_team", {"target_words": 4},
                           [{"prompt": "Topic: urban bees."}])
    asks, played, outcome = play(factory, [a, b], seats=["w0", "w1"])
    assert outcome.returns == pytest.approx([joint, joint])
    assert outcome.turn_rewards[0] == pytest.approx([joint])
    assert outcome.turn_rewards[1] == pytest.approx([joint])
    assert (outcome.metrics["words_background"], outcome.metrics["words_method"]) == (4, 7)
    assert [p.format_error for p in played] == [None, None]
    # the method writer does not see the background part unless see_partner=true
    assert a not in asks[1].prompt.text
    assert asks[1].prompt.text.startswith("Topic: urban bees.\n\nYou are the method writer.")
    seen = task_factory("writing_team", {"see_partner": True}, [{"prompt": "P"}])
    asks, _, _ = play(seen, [a, b], seats=["w0", "w1"])
    assert f"[background]\n{a}" in asks[1].prompt.text


def test_four_writers_share_one_joint_reward_over_four_parts():
    parts = ["a b c d", "e f g h", "a e i j", "k l m n"]
    # length: each part 4 words, target 8 -> 0.5; balance 1; diversity 14 distinct / 16;
    # distinct: pairwise Jaccard, only (0,2) share 'a' (1/7) and (1,2) share 'e' (1/7):
    # mean over 6 pairs = (2/7)/6 -> distinct = 1 - 1/21
    scores = joint_scores(parts, target_words=8)
    assert scores["length"] == pytest.approx(0.5)
    assert scores["balance"] == pytest.approx(1.0)
    assert scores["diversity"] == pytest.approx(14 / 16)
    assert scores["distinct"] == pytest.approx(1 - 1 / 21)
    factory = task_factory("writing_team", {"target_words": 8, "parts": [
        "background", "method", "results", "discussion"]}, [{"prompt": "P"}])
    asks, _, outcome = play(factory, parts, seats=["w0", "w1", "w2", "w3"])
    assert outcome.returns == pytest.approx([scores["joint"]] * 4)
    assert asks[2].prompt.text == ("P\n\nYou are the results writer. Write only the results "
                                   "section for this topic; do not repeat what the other "
                                   "sections say.")
    # one target per part, and a joint reward of the length score alone: 4 words against
    # targets 4, 2, 8, 4 -> 1, 0, 0.5, 1
    only_length = joint_scores(parts, target_words=[4, 2, 8, 4], scores=["length"])
    assert only_length["length"] == only_length["joint"] == pytest.approx(2.5 / 4)
    with pytest.raises(ValueError, match=r"env.params.target_words=\[4, 2\]: must be an "
                                         r"integer >= 1, or a list of one per part \(4\)"):
        task_factory("writing_team", {"target_words": [4, 2], "parts": ["a", "b", "c", "d"]},
                     [{"prompt": "P"}])
    with pytest.raises(ValueError, match=r"env.params.scores=\['style'\]: must name one"):
        task_factory("writing_team", {"scores": ["style"]}, [{"prompt": "P"}])
    with pytest.raises(ValueError, match=r"env.params.parts=\['a', 'a'\]: must name two"):
        task_factory("writing_team", {"parts": ["a", "a"]}, [{"prompt": "P"}])
    with pytest.raises(ValueError, match=r"env.params.parts=\[0\]: must name two"):
        task_factory("writing_team", {"parts": 0}, [{"prompt": "P"}])  # was a TypeError


def test_an_empty_writing_part_zeroes_the_joint_reward():
    factory = task_factory("writing_team", {}, [{"prompt": "P"}])
    _, played, outcome = play(factory, ["Some background here.", "   "], seats=["w0", "w1"],
                              penalty=0.25)
    assert played[1].format_error == "empty_answer"
    assert outcome.returns == [0.0, 0.0]
    assert outcome.turn_rewards == {0: [0.0], 1: [-0.25]}
    assert WritingTeam.summarize([outcome.metrics])["task/joint"] == 0.0


def test_transcript_renders_only_the_roles_asked_for():
    transcript = Transcript("Q")
    transcript.add("a", " one ")
    transcript.add("b", "two")
    assert transcript.render("Go.") == "Q\n\n[a]\none\n\n[b]\ntwo\n\nGo."
    assert transcript.render("Go.", roles=["b"]) == "Q\n\n[b]\ntwo\n\nGo."
    assert transcript.last("a") == "one" and transcript.last("c") is None


def test_debate_rounds_show_the_last_rounds_answers_and_the_majority_decides():
    factory = task_factory("debate", {"debaters": 3, "rounds": 2, "team_weight": 2.0}, ITEMS)
    asks, played, outcome = play(factory, [
        "<answer>8</answer>", "<answer>7</answer>", "I am lost.",      # round 1
        "<answer>7</answer>", "<answer>14/2</answer>", "<answer>8</answer>",  # round 2
    ], seats=["d0", "d1", "d2"])
    assert [a.seat for a in asks] == [0, 1, 2, 0, 1, 2]
    # round 1: only the problem; round 2: last round's answers, own marked
    assert asks[1].prompt.text.startswith("Problem: Ada has 3 apples")
    assert "<answer>8</answer>" not in asks[1].prompt.text  # not the same round's answers
    assert asks[5].prompt.text == (
        "Problem: Ada has 3 apples and gets 4 more. How many?\n\n"
        "[debater_0]\n<answer>8</answer>\n\n[debater_1]\n<answer>7</answer>\n\n"
        "[debater_2 (you)]\nI am lost.\n\n"
        "You are debater_2. Above are your answer and the other debaters' answers from the last "
        "round. Weigh them, solve the problem again, then give only the final answer as "
        "<answer>ANSWER</answer>.")
    assert [p.format_error for p in played] == [None, None, "no_answer", None, None, None]
    # 7 and 14/2 are one vote (math-verify): the team answers 7, correct (+2 each last turn)
    assert outcome.turn_rewards == {0: [0.0, 3.0], 1: [1.0, 3.0], 2: [-0.5, 2.0]}
    assert outcome.returns == [3.0, 4.0, 2.0]
    assert outcome.metrics == pytest.approx({
        "team_correct": 1.0, "first_round_accuracy": 1 / 3, "last_round_accuracy": 2 / 3,
        "agreement": 2 / 3})


def test_majority_vote_is_one_round_and_a_tie_goes_to_the_first_answer():
    factory = task_factory("majority_vote", {"voters": 2}, ITEMS)
    asks, _, outcome = play(factory, ["<answer>8</answer>", "<answer>7</answer>"],
                            seats=["v0", "v1"])
    assert [a.seat for a in asks] == [0, 1]
    assert asks[0].prompt.text.endswith("You are voter_0. Solve the problem step by step, "
                                        "then give only the final answer as "
                                        "<answer>ANSWER</answer>.")
    # tie 8 vs 7: the first answer (8, wrong) is the team's; voter_1 still earns its own 1
    assert outcome.returns == [0.0, 1.0]
    assert outcome.metrics["team_correct"] == 0.0
    from roll.agentic.tasks.debate import Debate

    summary = Debate.summarize([outcome.metrics, {"team_correct": 1.0,
                                                  "first_round_accuracy": 1.0,
                                                  "last_round_accuracy": 1.0,
                                                  "agreement": 1.0}])
    assert summary == pytest.approx({
        "task/team_accuracy": 0.5, "task/accuracy_first_round": 0.75,
        "task/accuracy_last_round": 0.75, "task/debate_gain": 0.0, "task/agreement": 0.75})
    with pytest.raises(ValueError, match=r"env.params.voters=1: must be an integer >= 2"):
        task_factory("majority_vote", {"voters": 1}, ITEMS)
    with pytest.raises(ValueError, match=r"env.params.rounds=2: majority_vote takes no such"):
        task_factory("majority_vote", {"rounds": 2}, ITEMS)


def test_lenient_answers_read_the_last_number_and_a_bare_verdict_word():
    from roll.agentic.tasks.math_check import final_answer

    assert final_answer("So 3 + 4 = 7.") is None
    assert final_answer("So 3 + 4 = 7.", lenient=True) == "7"
    assert final_answer("a total of 1,250 coins, or -2.5 each", lenient=True) == "-2.5"
    assert final_answer("ratio 7/2 then <answer>8</answer> and 9", lenient=True) == "8"
    assert parse_verdict("This is incorrect, the sum is 7.", lenient=True) == "incorrect"
    assert parse_verdict("This is incorrect, the sum is 7.") is None
    _, played, outcome = play(math_factory(max_rounds=1, lenient_answers=True), [
        "Ada has 3 and gets 4, so she has 8 apples.", "That is incorrect.",
        "3 plus 4 makes 7 apples.", "Correct now."])
    assert [p.format_error for p in played] == [None, None, None, None]
    assert outcome.returns == [0.0, 2.0, 1.0]
    voters = task_factory("majority_vote", {"voters": 2, "lenient_answers": True}, ITEMS)
    _, _, outcome = play(voters, ["It is 7.", "I get 7 too"], seats=["v0", "v1"])
    assert outcome.returns == [2.0, 2.0]


def test_a_centralised_critic_reads_the_prompt_then_the_history_once():
    """critic.input=global on a task: the acting role's prompt, then the whole history (the
    task's global_observation), not every role's copy of it."""
    asks, _, _ = play(math_factory(max_rounds=1), [
        "It is 8. <answer>8</answer>", "<verdict>Incorrect</verdict>", "<answer>7</answer>",
        "<verdict>Correct</verdict>"], critic_view=True)
    history = ("Problem: Ada has 3 apples and gets 4 more. How many?\n\n"
               "[generator]\nIt is 8. <answer>8</answer>\n\n"
               "[critic]\n<verdict>Incorrect</verdict>")
    assert asks[2].critic_prompt == (
        f"{asks[2].prompt.text}\n\n[The whole table; seat 2 acts now]\n{history}")
    assert asks[0].critic_prompt.endswith(
        "acts now]\nProblem: Ada has 3 apples and gets 4 more. How many?")


def test_a_debates_global_state_holds_every_round_so_far():
    factory = task_factory("debate", {"debaters": 2, "rounds": 2}, ITEMS)
    asks, _, _ = play(factory, ["<answer>8</answer>", "<answer>7</answer>",
                                "<answer>7</answer>", "<answer>7</answer>"],
                      seats=["d0", "d1"], critic_view=True)
    assert asks[3].critic_prompt.endswith(
        "acts now]\nProblem: Ada has 3 apples and gets 4 more. How many?\n\n"
        "[debater_0, round 1]\n<answer>8</answer>\n\n[debater_1, round 1]\n<answer>7</answer>"
        "\n\n[debater_0, round 2]\n<answer>7</answer>")
