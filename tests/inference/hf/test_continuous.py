"""Continuous batching (roll/inference/hf/continuous.py): rows join and leave a running batch over a
ring KV cache, and every request gets exactly what the lock-step ``generate`` gives it."""

from __future__ import annotations

import pytest
import torch

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams, serve
from roll.inference.base import RoundsEngine
from roll.models import load_tokenizer
from roll.pipeline.builders import hf_engine_for

from ..helpers import LateFollowUps, chat_prompts, perturbed_team


@pytest.fixture(scope="module")
def team(tiny_model_path):
    return perturbed_team(tiny_model_path, 3)


@pytest.fixture(scope="module")
def engine(tiny_model_path, team):
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path), max_batch_size=3)
    push_adapters(engine, team, version=1)
    return engine


def _requests(team, prompts, tokenizer) -> list[GenerationRequest]:
    """Every slot and the base model; greedy, sampled, top-k/top-p, stop strings, constrained
    answers (with and without EOS), EOS honoured or ignored; lengths 1 to 14 tokens."""
    slots = [*team.agent_names, None]
    moves = ["Pass", "Bet", "x(1,1)"]
    with_eos = [tokenizer.encode(f"<answer>{m}</answer>", add_special_tokens=False)
                + [tokenizer.eos_token_id] for m in moves]
    requests = []
    for i in range(14):
        sampling = SamplingParams(
            temperature=(0.0, 0.8, 1.3)[i % 3], top_k=5 if i % 5 == 1 else 0,
            top_p=0.9 if i % 7 == 2 else 1.0, max_new_tokens=1 + i, seed=1000 + i,
            ignore_eos=i % 4 == 3, stop=["e"] if i % 6 == 5 else [])
        allowed = with_eos if i % 4 == 1 else ([s[:-1] for s in with_eos] if i == 6 else None)
        if allowed is not None:
            sampling = SamplingParams(temperature=sampling.temperature, max_new_tokens=32,
                                      seed=sampling.seed)
        requests.append(GenerationRequest(prompts[i % len(prompts)], slots[i % len(slots)],
                                          sampling, allowed))
    return requests


def _chain(requests, ahead: int):
    """A follow that keeps ``ahead`` requests in flight, submitting the next one each time one
    finishes (as the rollout does with an episode's next turn); returns (first, follow,
    outputs by request index)."""
    order = list(range(ahead))
    outputs = {}

    def follow(key, output):
        outputs[order[key]] = output
        if len(order) < len(requests):
            order.append(len(order))
            return [requests[order[-1]]]
        return []

    return requests[:ahead], follow, outputs


@pytest.mark.parametrize("continuous", [True, False])
@pytest.mark.parametrize("delay", [2, 10**6])
def test_follow_ups_that_arrive_later_are_served_and_equal_lockstep(tiny_model_path, team,
                                                                    engine, continuous, delay):
    """Follow-ups handed over after ``follow`` returned (base.Later, as env workers' steps
    are), continuously or in rounds, ready soon (taken between steps) or only when waited
    for: every request is served once and the outputs are the lock-step path's."""
    tokenizer = load_tokenizer(tiny_model_path)
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer)[:12]
    expected = engine.generate(requests)
    late = LateFollowUps(requests, ahead=3, delay=delay)
    assert serve(engine, late.first(), late.follow, continuous=continuous,
                 later=late) == len(requests)
    assert late.outstanding() == 0 and sorted(late.outputs) == list(range(len(requests)))
    if delay > 100:  # never ready by polling: every follow-up came from a wait
        assert late.polled == 0 and late.waits >= 1
    elif continuous:  # taken between decode steps, without waiting
        assert late.polled > 0
    for index, output in late.outputs.items():
        assert output.token_ids == expected[index].token_ids, index


@pytest.mark.slow  # many requests both ways (~3 s): the quick subset stays under 3 minutes
def test_continuous_equals_lockstep_request_by_request(tiny_model_path, team, engine):
    """3 lanes for 112 requests: rows join as others finish and the ring wraps around
    times. Tokens, log-probs, text and finish reasons must equal the lock-step path's (the
    per-row seeded sampler makes them independent of batching)."""
    tokenizer = load_tokenizer(tiny_model_path)
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer) * 8
    expected = engine.generate(requests)
    first, follow, outputs = _chain(requests, 3)
    assert engine.serve(first, follow) == len(requests)
    stats = engine.last_serve
    assert stats["lanes"] == 3 and stats["served"] == 112
    assert stats["decode_steps"] > stats["capacity"], stats  # the ring wrapped around
    reasons = set()
    for index, want in enumerate(expected):
        got = outputs[index]
        assert got.token_ids == want.token_ids, index
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5), index
        assert (got.text, got.finish_reason) == (want.text, want.finish_reason), index
        assert (got.adapter, got.adapter_version) == (want.adapter, want.adapter_version)
        reasons.add(got.finish_reason)
    assert reasons == {"eos", "length", "stop"}  # every way to finish was exercised


def test_a_finished_row_leaves_at_once_and_the_next_joins(tiny_model_path, team, engine):
    """One 30-token request beside a chain of six 4-token requests on 2 lanes: in lock-step
    rounds that takes 30 + 5 x 4 steps; continuously the short ones run beside the long one."""
    prompts = chat_prompts(tiny_model_path)
    long = GenerationRequest(prompts[0], team.agent_names[0],
                             SamplingParams(temperature=0.0, max_new_tokens=30, ignore_eos=True))
    short = [GenerationRequest(prompts[i % 5], team.agent_names[i % 3],
                               SamplingParams(temperature=0.0, max_new_tokens=4,
                                              ignore_eos=True)) for i in range(6)]
    served = []

    def follow(key, output):
        served.append(key)
        return [short[len(served)]] if key != 0 and len(served) < 6 else []

    engine.serve([long, short[0]], follow)
    # Each token of a row is produced by its prefill or a decode step; 30 tokens of the long row
    # need 29 decode steps, and the six short ones fit beside it (6 x 3 = 18 decode steps).
    assert engine.last_serve["decode_steps"] == 29
    assert served[-1] == 0  # the long row finished last
    assert len(served) == 7


def test_serve_in_rounds_numbers_requests_like_the_engine(tiny_model_path, team, engine):
    """An engine that is not continuous plays rounds; keys and results match."""
    tokenizer = load_tokenizer(tiny_model_path)
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer)[:8]

    class RoundsOnly(RoundsEngine):
        def generate(self, batch):
            return engine.generate(batch)

    first, follow, rounds = _chain(requests, 2)
    assert serve(RoundsOnly(), first, follow) == 8
    first, follow, continuous = _chain(requests, 2)
    assert serve(engine, first, follow) == 8
    for index in range(8):
        assert rounds[index].token_ids == continuous[index].token_ids


def test_a_request_longer_than_the_cache_is_refused(tiny_model_path, team, engine):
    prompt = chat_prompts(tiny_model_path)[0]
    request = GenerationRequest(prompt, None, SamplingParams(max_new_tokens=40))
    with pytest.raises(ValueError, match="exceed context_len"):
        engine.serve([request], lambda key, output: [], context_len=len(prompt) + 10)


def test_the_ring_grows_under_rows_in_flight(tiny_model_path, team):
    """Two short requests size the ring; a long one arrives while the other row is mid-answer:
    the ring is unrolled into a larger one and both rows go on exactly as in lock-step."""
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path))
    push_adapters(engine, team, version=1)
    prompt = chat_prompts(tiny_model_path)[2]
    def request(max_new, seed):
        return GenerationRequest(prompt, team.agent_names[seed % 3], SamplingParams(
            temperature=1.0, max_new_tokens=max_new, ignore_eos=True, seed=seed))
    requests = [request(6, 0), request(20, 1), request(4 * len(prompt), 2)]
    expected = engine.generate(requests)
    outputs = {}

    def follow(key, output):
        outputs[key] = output
        return [requests[2]] if key == 0 else []

    engine.serve(requests[:2], follow)
    assert engine.last_serve["grows"] >= 1
    assert engine.last_serve["capacity"] > len(prompt) + requests[2].sampling.max_new_tokens
    assert engine.last_serve["capacity"] % 16 == 0  # mask rows aligned for fused attention
    for key, want in enumerate(expected):
        assert outputs[key].token_ids == want.token_ids, key
        assert outputs[key].logprobs == pytest.approx(want.logprobs, abs=1e-5), key


@pytest.mark.slow  # the full CI runs it; seconds of compiling (quick subset < 3 min)
def test_compiled_continuous_step_equals_the_eager_one(tiny_model_path, team, monkeypatch):
    """With ``compile`` on, continuous decoding runs a torch.compile'd decode step (traced with
    the 'eager' backend so that it runs on CPU; on CUDA it is then captured as a graph). Every
    request gets what the uncompiled engine gives it, a ring growth included."""
    from torch._dynamo.utils import counters

    compile_ = torch.compile
    compiled_functions = []

    def compile_eager(fn, **kwargs):
        compiled_functions.append(fn.__name__)
        return compile_(fn, backend="eager", dynamic=False)

    monkeypatch.setattr(torch, "compile", compile_eager)
    # torch.compile's own limit of compiled variants per function, lowered: the engine's step
    # raises it for its calls (here 1 would run the grown ring's step uncompiled)
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    tokenizer = load_tokenizer(tiny_model_path)
    engines = {mode: hf_engine_for(team, tokenizer, max_batch_size=3, compile=mode == "compiled")
               for mode in ("eager", "compiled")}
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer)
    long = GenerationRequest(requests[0].prompt_ids, team.agent_names[1],
                             SamplingParams(temperature=0.0, max_new_tokens=60, ignore_eos=True))
    outputs = {}
    counters.clear()
    for mode, engine in engines.items():
        push_adapters(engine, team, version=1)
        first, follow, outputs[mode] = _chain([*requests, long], 3)
        assert engine.serve(first, follow) == len(requests) + 1
        assert engine.last_serve["grows"] == 1  # the long request arrived last
    assert compiled_functions == ["_forward_step"]
    assert counters["stats"]["unique_graphs"] == 2  # traced, and again for the grown ring
    for index in range(len(requests) + 1):
        got, want = outputs["compiled"][index], outputs["eager"][index]
        assert got.token_ids == want.token_ids, index
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5), index


def test_the_host_reads_a_step_after_launching_the_next(tiny_model_path, team, engine):
    """One lane, requests one after another. The host reads a decode step's tokens after it
    has launched the next step, so a request that ends at a token the host cannot foresee (a
    stop string here, or EOS) costs one more decode step, run for nothing; one that ends at
    its max_new_tokens does not (the host counts the tokens in flight), and a constrained one
    makes the host read each step before the next (its trie picks the allowed tokens)."""
    tokenizer = load_tokenizer(tiny_model_path)
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer)
    # Unconstrained greedy requests that end at a stop string: the text of their 4th token.
    greedy = [GenerationRequest(r.prompt_ids, r.adapter, SamplingParams(
        temperature=0.0, max_new_tokens=12, ignore_eos=True)) for r in requests[:4]]
    for request, output in zip(greedy, engine.generate(greedy), strict=True):
        stop = tokenizer.decode(output.token_ids[3:4])
        requests.append(GenerationRequest(request.prompt_ids, request.adapter, SamplingParams(
            temperature=0.0, max_new_tokens=12, ignore_eos=True, stop=[stop])))
    steps_at_follow, outputs = [], {}

    def follow(key, output):
        steps_at_follow.append(engine._decoder.decode_steps)
        outputs[key] = output
        return [requests[key + 1]] if key + 1 < len(requests) else []

    engine.serve([requests[0]], follow)
    assert engine.last_serve["lanes"] == 1
    expected, steps, cases = [], 0, set()
    for key, request in enumerate(requests):
        output = outputs[key]
        steps += len(output.token_ids) - 1  # the first token comes from the prefill
        unforeseen = output.finish_reason != "length"
        if unforeseen and request.allowed_completions is None:
            steps += 1  # the step launched before this request's last token was read
        expected.append(steps)
        cases.add((unforeseen, request.allowed_completions is None))
    assert steps_at_follow == expected
    assert cases == {(True, True), (True, False), (False, True)}  # every kind of end above


def test_decode_lanes_keeps_the_current_shape_while_it_fits():
    """Hand-picked cases: the current lanes are kept while they hold every first request and
    at most half start idle; otherwise the next power of two, never above the engine's cap."""
    from roll.inference.hf.continuous import decode_lanes

    assert decode_lanes(32, 256, None) == 32
    assert decode_lanes(24, 256, 32) == 32  # the Hanabi step that began partly played ahead
    assert decode_lanes(17, 256, 32) == 32  # 15 of 32 idle at the start: kept
    assert decode_lanes(16, 256, 32) == 16  # half idle: a smaller shape
    assert decode_lanes(33, 256, 32) == 64  # more than it holds: the next power of two
    assert decode_lanes(100, 96, None) == 96  # capped
    assert decode_lanes(5, 3, 3) == 3
    assert decode_lanes(1, 3, 3) == 1
    # a replayed CUDA graph keeps its lanes while they hold every first request
    assert decode_lanes(9, 256, 32, keep_captured=True) == 32  # session 62's Hanabi step 6
    assert decode_lanes(1, 256, 32, keep_captured=True) == 32
    assert decode_lanes(33, 256, 32, keep_captured=True) == 64  # still grows
    assert decode_lanes(9, 256, None, keep_captured=True) == 16  # the first shape as before
    assert decode_lanes(24, 24, None) == 24  # the cap is a shape of its own
    assert decode_lanes(20, 24, 24) == 24


def test_a_serve_with_fewer_first_requests_reuses_the_decoder(tiny_model_path, team):
    """A serve whose first requests are fewer than the decoder's lanes (a rollout that began
    with part of its episodes played ahead) runs on the same decoder, its extra lanes idle
    or taking follow-ups, and every request still gets the lock-step path's tokens."""
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path), max_batch_size=8)
    push_adapters(engine, team, version=1)
    tokenizer = load_tokenizer(tiny_model_path)
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer)
    expected = engine.generate(requests)
    first, follow, outputs = _chain(requests, 8)
    engine.serve(first, follow)
    decoder = engine._decoder
    assert engine.last_serve["lanes"] == 8
    first, follow, outputs = _chain(requests, 5)
    assert engine.serve(first, follow) == len(requests)
    assert engine._decoder is decoder and engine.last_serve["lanes"] == 8
    for index, want in enumerate(expected):
        assert outputs[index].token_ids == want.token_ids, index
    first, follow, outputs = _chain(requests[:3], 3)
    engine.serve(first, follow)  # 3 of 8: more than half idle, a 4-lane decoder
    assert engine._decoder is not decoder and engine.last_serve["lanes"] == 4
    assert [outputs[i].token_ids for i in range(3)] == [e.token_ids for e in expected[:3]]



def test_the_serve_loops_host_time_is_split_by_part(tiny_model_path, team, engine):
    """``last_serve`` says where the loop's host time went: the caller's follow (here it
    sleeps 20 ms a call, 12 calls: at least 0.24 s), admissions, decode launches, waits and
    reads; the parts add up to no more than the serve's wall time."""
    import time

    tokenizer = load_tokenizer(tiny_model_path)
    requests = _requests(team, chat_prompts(tiny_model_path), tokenizer)[:12]
    first, chained, _ = _chain(requests, 3)

    def follow(key, output):
        time.sleep(0.02)
        return chained(key, output)

    start = time.perf_counter()
    engine.serve(first, follow)
    wall = time.perf_counter() - start
    parts = {part: engine.last_serve[f"{part}_s"]
             for part in ("admit", "launch", "wait", "finish", "follow")}
    assert all(seconds >= 0 for seconds in parts.values()), parts
    assert parts["follow"] >= 12 * 0.02
    assert parts["admit"] > 0 and parts["launch"] > 0
    assert sum(parts.values()) <= wall


def test_constrained_follow_ups_come_after_the_next_step_is_launched(tiny_model_path, team,
                                                                     engine):
    """Constrained lanes are read before each step; the caller's follow of a request that
    ended there runs after the next step of the other lanes is launched, so that the env step
    and the next prompt overlap it (before, the device idled through them). The outputs stay
    the lock-step path's."""
    tokenizer = load_tokenizer(tiny_model_path)
    prompts = chat_prompts(tiny_model_path)

    def only(answer: str) -> list[list[int]]:  # one allowed completion: its length is known
        return [tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]]

    short, long = only("<answer>Pass</answer>"), only("<answer>x(1,1) then x(2,2)</answer>")
    assert len(short[0]) + 2 < len(long[0])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=32)
    requests = [GenerationRequest(prompts[0], "alice", greedy, short),
                GenerationRequest(prompts[1], "bob", greedy, long)]
    steps_at_follow = {}

    def follow(key, output):
        steps_at_follow[key] = engine._decoder.decode_steps
        assert output.token_ids == (short if key == 0 else long)[0]
        return []

    engine.serve(requests, follow)
    # The first token comes from the prefill: len - 1 decode steps each. The short one ends
    # while the long one runs: its follow comes after the long one's next step is launched.
    assert steps_at_follow == {0: len(short[0]), 1: len(long[0]) - 1}
    assert [o.token_ids for o in engine.generate(requests)] == [short[0], long[0]]
