"""Admissions' prefills by (rows, width) bucket (roll/inference/hf/prefill_graphs.py): on the
CPU the buckets' padded forward runs eagerly (the path a CUDA graph replays), and it must give
each prompt the plain prefill's logits and keys/values, and every served request the lock-step
path's tokens."""

from __future__ import annotations

import pytest
import torch

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.inference.hf.prefill import prefill
from roll.inference.hf.prefill_graphs import MAX_TOKENS, PrefillGraphs, bucket
from roll.models import load_tokenizer
from roll.pipeline.builders import hf_engine_for

from ..helpers import chat_prompts, perturbed_team


@pytest.fixture(scope="module")
def team(tiny_model_path):
    return perturbed_team(tiny_model_path, 3)


def _bucketed_engine(tiny_model_path, team, lanes: int):
    """An engine of ``lanes`` decode lanes with prefill graphs (on the CPU: the buckets'
    padded forwards, eager), the adapters pushed; the chat prompts, every slot and the base
    model, and two constrained answers (Pass, Bet) ending in EOS."""
    tokenizer = load_tokenizer(tiny_model_path)
    engine = hf_engine_for(team, tokenizer, max_batch_size=lanes, prefill_graphs=True)
    push_adapters(engine, team, version=1)
    moves = [tokenizer.encode(f"<answer>{m}</answer>", add_special_tokens=False)
             + [tokenizer.eos_token_id] for m in ("Pass", "Bet")]
    return engine, chat_prompts(tiny_model_path), [*team.agent_names, None], moves


def test_buckets_by_hand():
    assert bucket(1, 1) == (1, 64)
    assert bucket(3, 444) == (4, 448)
    assert bucket(5, 448) == (8, 448)
    assert bucket(8, 449) == (8, 512)
    assert bucket(2, 64) == (2, 64)
    assert 8 * 512 <= MAX_TOKENS < 16 * 512  # 8 Hanabi prompts fit, 16 do not


def test_a_bucketed_prefill_equals_the_plain_one(tiny_model_path, team):
    """Three prompts of different lengths (mixed adapters and the base) in a bucket of 4 rows
    and a multiple of 64 columns: each prompt's logits and the keys/values of each of its
    tokens equal the plain prefill's; the pad row is there and is not returned."""
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path))
    push_adapters(engine, team, version=1)
    prompts = chat_prompts(tiny_model_path)[:3]
    prompts = [prompts[0], prompts[1] + prompts[2][:7], prompts[2]]
    adapters = [team.agent_names[0], None, team.agent_names[2]]
    graphs = PrefillGraphs(engine, torch.float32, capture=True)  # no CUDA: padded, eager
    assert not graphs.capture
    with torch.no_grad(), engine._generation_mode():
        want_logits, want, _, want_width = prefill(engine, prompts, adapters, False,
                                                   torch.float32)
        logits, capture, shared, width = prefill(engine, prompts, adapters, False,
                                                 torch.float32, graphs)
    rows, bucket_width = bucket(3, max(len(p) for p in prompts))
    assert (shared, width, graphs.replays) == (0, bucket_width, 1)
    assert width % 64 == 0 and width > want_width
    assert logits.shape == want_logits.shape  # the pad row is left out
    torch.testing.assert_close(logits, want_logits, atol=1e-4, rtol=1e-4)
    for layer in (0, len(want.keys) - 1):
        assert capture.keys[layer].shape[0] == rows == 4
        for row, prompt in enumerate(prompts):
            for ours, theirs in ((capture.keys, want.keys), (capture.values, want.values)):
                torch.testing.assert_close(ours[layer][row, :, width - len(prompt):],
                                           theirs[layer][row, :, want_width - len(prompt):],
                                           atol=1e-4, rtol=1e-4)


def test_served_requests_equal_lockstep_with_bucketed_prefills(tiny_model_path, team):
    """A chain of 40 requests on 4 lanes (greedy, sampled, top-k, constrained answers, EOS
    honoured or ignored) admitted a few at a time through the buckets: the tokens and
    log-probs of the lock-step path; every admission of at most MAX_TOKENS went through a
    bucket, the first (4 prompts) included."""
    engine, prompts, slots, moves = _bucketed_engine(tiny_model_path, team, lanes=4)
    requests = [GenerationRequest(prompts[i % len(prompts)], slots[i % len(slots)],
                                  SamplingParams(temperature=(0.0, 1.0, 0.7)[i % 3],
                                                 top_k=5 if i % 4 == 1 else 0,
                                                 max_new_tokens=2 + i % 7, seed=300 + i,
                                                 ignore_eos=i % 5 == 0),
                                  moves if i % 6 == 3 else None)
                for i in range(40)]
    expected = engine.generate(requests)
    outputs, pending = {}, list(range(4, len(requests)))

    def follow(key, output):
        outputs[key] = output
        return [requests[pending.pop(0)]] if pending else []

    assert engine.serve(requests[:4], follow) == len(requests)
    stats = engine.last_serve
    assert stats["prefill_replays"] == stats["prefills"] > 4
    # nothing is captured on the CPU
    assert stats["prefill_captures"] == 0 and stats["prefill_capture_s"] == 0.0
    for key, want in enumerate(expected):
        assert outputs[key].token_ids == want.token_ids, key
        assert outputs[key].logprobs == pytest.approx(want.logprobs, abs=1e-5), key
    # the next serve (the same decoder, its graphs kept) counts its own prefills from zero
    decoder = engine._decoder
    engine.serve(requests[:3], lambda key, output: [])
    assert engine._decoder is decoder
    assert engine.last_serve["prefill_replays"] == engine.last_serve["prefills"] == 1


def test_a_failed_capture_is_said_and_prefills_go_on_eagerly(tiny_model_path, team, capsys):
    """A capture that raises (here: CUDA graphs asked for on a machine without CUDA) prints one
    line, is counted, and that prefill and the next run the padded forward eagerly with the
    plain prefill's logits."""
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path))
    push_adapters(engine, team, version=1)
    prompts = chat_prompts(tiny_model_path)[:2]
    adapters = [team.agent_names[1], team.agent_names[0]]
    graphs = PrefillGraphs(engine, torch.float32, capture=False)
    graphs.capture = True  # as on CUDA: the capture is attempted (and fails here)
    with torch.no_grad(), engine._generation_mode():
        want = prefill(engine, prompts, adapters, False, torch.float32)[0]
        first = prefill(engine, prompts, adapters, False, torch.float32, graphs)[0]
        second = prefill(engine, prompts, adapters, False, torch.float32, graphs)[0]
    lines = [line for line in capsys.readouterr().out.splitlines() if "capture" in line]
    assert len(lines) == 1 and "prefilling eagerly" in lines[0]
    assert (graphs.capture_failures, graphs.captures, graphs.capture) == (1, 0, False)
    for logits in (first, second):
        torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)


def test_an_admission_larger_than_a_bucket_is_cut_into_bucket_sized_prefills(
        tiny_model_path, team, monkeypatch):
    """Five requests admitted at once where a bucket holds two prompts: three prefills of
    2, 2 and 1 rows, each through a bucket, in order; every request the lock-step path's
    tokens. Before, the whole admission ran eagerly as one prefill (on a GPU ~100 ms of host
    launches where a replay takes a few), as did the many turns that end at one decode step."""
    import roll.inference.hf.prefill_graphs as prefill_graphs

    engine, prompts, slots, moves = _bucketed_engine(tiny_model_path, team, lanes=5)
    requests = [GenerationRequest(prompts[i % len(prompts)], slots[i % len(slots)],
                                  SamplingParams(temperature=(0.0, 1.0)[i % 2],
                                                 max_new_tokens=3 + i, seed=50 + i),
                                  moves if i == 3 else None)
                for i in range(5)]
    width = bucket(1, max(len(r.prompt_ids) for r in requests))[1]
    monkeypatch.setattr(prefill_graphs, "MAX_TOKENS", 2 * width)  # two prompts a bucket
    expected = engine.generate(requests)
    outputs = {}

    def follow(key, output):
        outputs[key] = output
        return []

    assert engine.serve(requests, follow) == 5
    stats = engine.last_serve
    assert stats["prefills"] == stats["prefill_replays"] == 3  # 2 + 2 + 1 rows
    for key, want in enumerate(expected):
        assert outputs[key].token_ids == want.token_ids, key
        assert outputs[key].logprobs == pytest.approx(want.logprobs, abs=1e-5), key
