"""A prefill's common leading tokens run once per adapter (roll/inference/hf/prefill.py): the
logits, the captured keys/values and every served request equal the plain prefill's."""

from __future__ import annotations

import os

import pytest
import torch

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.inference.hf.prefill import HeadCapture, prefill, shared_length
from roll.models import apply_chat_template, load_tokenizer
from roll.pipeline.builders import hf_engine_for

from ..helpers import PROMPTS, perturbed_team

RULES = ("You are playing a card game. Each player antes one chip and is dealt one card; "
         "the higher card wins the pot. Answer with exactly one legal move.\n")


@pytest.fixture(scope="module")
def team(tiny_model_path):
    return perturbed_team(tiny_model_path, 3)


def _engine(path, team, share: bool, lanes: int = 8):
    engine = hf_engine_for(team, load_tokenizer(path), max_batch_size=lanes, share_prefix=share)
    push_adapters(engine, team, version=1)
    return engine


def _prompts(path) -> list[list[int]]:
    """Chat prompts that open with the same rules (as a game's turns do)."""
    tokenizer = load_tokenizer(path)
    return [apply_chat_template(tokenizer, [{"role": "user", "content": RULES + p}])
            for p in PROMPTS]


def test_shared_length_by_hand():
    common = list(range(100, 120))  # 20 tokens
    assert shared_length([common + [1, 2], common + [3]], ["a", "a"]) == 20
    assert shared_length([common + [1, 2], common + [3]], ["a", "b"]) == 0  # nothing saved
    assert shared_length([common[:15] + [1], common[:15] + [2]], ["a", "a"]) == 0  # < 16
    # a prompt that is all prefix keeps its last token for the tail
    assert shared_length([common, common + [5, 6], common + [7]], ["a", None, "a"]) == 19
    assert shared_length([common + [1]], ["a"]) == 0  # one row


def test_prefill_with_a_shared_head_equals_the_plain_one(tiny_model_path, team):
    """Six rows over three adapters and the base: logits at each prompt's last token and the
    captured keys/values of every prompt token equal the plain prefill's."""
    engine = _engine(tiny_model_path, team, share=True)
    prompts = _prompts(tiny_model_path)
    prompts = prompts + prompts[:2]
    adapters = [team.agent_names[0], team.agent_names[1], None, team.agent_names[2],
                team.agent_names[0], team.agent_names[1], team.agent_names[0]][:len(prompts)]
    dtype = torch.float32
    with torch.no_grad(), engine._generation_mode():
        plain_logits, plain, none, plain_width = prefill(engine, prompts, adapters, False, dtype)
        logits, capture, shared, width = prefill(engine, prompts, adapters, True, dtype)
    assert none == 0 and isinstance(capture, HeadCapture)
    assert shared >= 20  # the rules' tokens
    assert shared == len(os.path.commonprefix(prompts))
    # fp32 in other batch shapes, so another reduction order: 4e-5 apart on an AVX-512 CPU
    torch.testing.assert_close(logits, plain_logits, atol=1e-4, rtol=1e-4)
    for row, prompt in enumerate(prompts):
        for layer in (0, len(plain.keys) - 1):
            for ours, theirs in ((capture.keys, plain.keys), (capture.values, plain.values)):
                # token t: column t of the head when t < P, else its place from the right
                want = theirs[layer][row, :, plain_width - len(prompt):]  # (H, L, D)
                got = torch.cat([ours[layer][row, :, :shared],
                                 ours[layer][row, :, width - len(prompt) + shared:]], 1)
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_served_requests_equal_with_and_without_sharing(tiny_model_path, team):
    """Twenty requests on 8 lanes (mixed adapters, greedy and sampled, follow-ups admitted a
    few at a time): the same tokens and log-probs either way, and the first admission saved
    exactly P x (rows - adapters) prompt tokens."""
    prompts = _prompts(tiny_model_path)
    slots = [*team.agent_names, None]
    requests = [GenerationRequest(prompts[i % len(prompts)], slots[i % len(slots)],
                                  SamplingParams(temperature=(0.0, 1.0)[i % 2],
                                                 max_new_tokens=3 + i % 5, seed=50 + i))
                for i in range(20)]
    results = {}
    for share in (False, True):
        engine = _engine(tiny_model_path, team, share)
        outputs, pending = {}, list(range(8, len(requests)))

        def follow(key, output, outputs=outputs, pending=pending):
            outputs[key] = output
            return [requests[pending.pop(0)]] if pending else []

        engine.serve(requests[:8], follow)
        results[share] = (outputs, dict(engine.last_serve))
    (plain, plain_stats), (shared, stats) = results[False], results[True]
    assert len(plain) == len(shared) == len(requests)
    for key in plain:
        assert shared[key].token_ids == plain[key].token_ids, key
        assert shared[key].logprobs == pytest.approx(plain[key].logprobs, abs=1e-5), key
    common = len(os.path.commonprefix(prompts))
    assert plain_stats["shared_tokens"] == 0
    # the first admission: 8 rows over 4 slots (3 agents and the base) share the rules
    assert stats["shared_tokens"] >= common * (8 - 4)
