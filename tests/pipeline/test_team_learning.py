"""Team tasks learn on the tiny offline model, each role through its own agent.

Closed answers (each problem lists three choices, constrained decoding) make the task learnable
by a random-weight model: the generator (agent_0) is paid for the gold choice, the critic
(agent_1) for a right verdict, the refiner (agent_2) for a right correction. After training, the
generator's adapter must put more probability on the gold choice of the generator's prompt than
the base did. Give the generator's rows the critic's reward, route its turns to another
adapter, or train another adapter on its rows, and that probability does not rise.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from roll.models import apply_chat_template
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import load_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def p_gold(pipeline: AgenticPipeline, agent: str, seat: int = 0) -> float:
    """Mean over the training items of the probability, among the item's choices, that
    ``agent`` answers the gold choice on the first prompt of ``seat``."""
    env = pipeline.env_setup.train_factory()
    tokenizer = pipeline.tokenizer
    index = pipeline.agent_names.index(agent)
    probabilities = []
    for item in range(pipeline.env_setup.train_items):
        env.reset(0, item=item)
        prompt = apply_chat_template(tokenizer, [{"role": "user", "content":
                                                  env.observation(seat)}])
        choices = env.legal_actions(seat)
        rows = [prompt + tokenizer.encode(f"<answer>{choice}</answer>",
                                          add_special_tokens=False) for choice in choices]
        width = max(map(len, rows))
        ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        logp = pipeline.model.logprobs(ids, mask, torch.full((len(rows),), index))
        answer = torch.zeros_like(logp)
        answer[:, len(prompt):] = 1
        total = (logp * answer * mask).sum(-1)  # log p of each whole choice
        gold = choices.index(str(env.item["answer"]))
        probabilities.append(float(torch.softmax(total, -1)[gold]))
    return sum(probabilities) / len(probabilities)


def test_the_generator_learns_the_gold_answers_through_its_own_adapter(tmp_path):
    cfg = load_config(str(ROOT / "examples" / "math_team"), "multi_agent_math_team", [
        "env.params.closed_answers=true", "env.params.max_rounds=1",
        "rollout.constrained_decoding=true", "env.data.builtin_size=2",
        "rollout.num_groups=4", "rollout.group_size=4", "rollout.sampling.max_new_tokens=12",
        "team.optim.lr=1e-2", "team.lora.rank=8", "team.lora.alpha=16",
        "team.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "trainer.micro_batch_size=64", "eval.eval_steps=50", "eval.num_episodes=2",
        "max_steps=40", "save_steps=0",
        "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    pipeline = AgenticPipeline(cfg)
    before = {agent: p_gold(pipeline, agent) for agent in pipeline.agent_names}
    # LoRA B starts at zero: every agent starts as the base model.
    assert before["agent_0"] == pytest.approx(before["agent_1"])
    metrics = pipeline.run()
    after = {agent: p_gold(pipeline, agent) for agent in pipeline.agent_names}
    assert after["agent_0"] > before["agent_0"] + 0.2, (before, after)
    assert after["agent_0"] > 0.6, (before, after)
    # the critic's adapter learned verdicts, not the generator's answers
    assert after["agent_1"] < after["agent_0"] - 0.15, (before, after)
    assert metrics["agent_1/num_rows"] >= 16 and metrics["agent_0/num_rows"] == 16
    # the agents' policies moved apart (mean next-token KL over the evaluation's rows)
    assert metrics["eval/task/policy_kl/agent_0-agent_1"] > 1e-3


def test_each_debater_learns_from_its_own_correctness_only(tmp_path):
    """Two debaters over two rounds, paid only for their own answers (team_weight 0): each
    adapter learns the gold answers from its own rows. Swap the two seats' rewards and neither
    learns (each would be paid for the other's sample). (majority_vote is this task with one
    round: the same class, the same rewards.)"""
    cfg = load_config(str(ROOT / "examples" / "debate"), "multi_agent_debate", [
        "team.num_agents=2", "env.params.debaters=2", "env.params.rounds=2",
        "env.params.team_weight=0.0",
        "env.params.closed_answers=true", "env.role_to_agent={}",
        "rollout.constrained_decoding=true", "env.data.builtin_size=2",
        "rollout.num_groups=4", "rollout.group_size=4", "rollout.sampling.max_new_tokens=12",
        "team.optim.lr=1e-2", "team.lora.rank=8", "team.lora.alpha=16",
        "team.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "trainer.micro_batch_size=64", "eval.eval_steps=0", "max_steps=40", "save_steps=0",
        "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    pipeline = AgenticPipeline(cfg)
    before = [p_gold(pipeline, f"agent_{seat}", seat) for seat in (0, 1)]
    pipeline.run()
    after = [p_gold(pipeline, f"agent_{seat}", seat) for seat in (0, 1)]
    for seat in (0, 1):
        assert after[seat] > before[seat] + 0.2, (before, after)


def test_each_writer_learns_its_own_part_length_from_the_joint_reward(tmp_path):
    """MAGRPO on the writing team, the joint reward = the length score only, with a short
    background (1 word) and a long method (4 words, the token budget): both writers get the
    same joint reward, yet each adapter must learn ITS part's length. Sampling from the top 4
    tokens makes the random-weight model's choices few enough to learn in a few dozen steps
    (from all 611 tokens it does not move in 60). Train an adapter on the other writer's rows,
    or route a part's turns to the other adapter, and the two parts cannot move apart."""
    cfg = load_config(str(ROOT / "examples" / "writing_magrpo"), "multi_agent_writing_magrpo", [
        "env.params.target_words=[1,4]", "env.params.scores=[length]",
        "env.data.builtin_size=2", "rollout.num_groups=4", "rollout.group_size=8",
        "rollout.sampling.max_new_tokens=4", "rollout.sampling.temperature=1.0",
        "rollout.sampling.top_p=1.0", "rollout.sampling.top_k=4",
        "team.optim.lr=1e-2", "team.lora.rank=8", "team.lora.alpha=16",
        "team.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        "trainer.micro_batch_size=64", "eval.eval_steps=30", "eval.num_episodes=4",
        "max_steps=30", "save_steps=0", "tracking.backends=[jsonl]", f"output_dir={tmp_path}"])
    metrics = AgenticPipeline(cfg).run()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first = next(row for row in rows if row.get("step") == 1)
    before = next(row for row in rows if row.get("step") == 0)
    # at first the method is far from its 4 words (and the base's greedy parts have none)
    assert first["task/words_method"] < 2.0 and first["task/joint"] < 0.5, first
    assert before["eval/task/joint"] < 0.5, before
    # greedy evaluation after training: each part at its own target
    assert metrics["eval/task/words_background"] == pytest.approx(1.0), metrics
    assert metrics["eval/task/words_method"] == pytest.approx(4.0), metrics
    assert metrics["eval/task/joint"] == pytest.approx(1.0), metrics
