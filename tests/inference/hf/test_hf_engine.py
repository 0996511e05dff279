"""HFEngine: fused mixed-adapter generation equals stock PEFT alone, row by row (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from roll.distributed.roles import push_adapters
from roll.inference import (
    GenerationRequest,
    HFEngine,
    InferenceEngine,
    SamplingParams,
    load_adapter_folder,
)
from roll.models import load_model, load_tokenizer
from roll.pipeline.builders import hf_engine_for

from ..helpers import (
    chat_prompts,
    perturb,
    perturbed_team,
    sequence_logprobs,
    stock_greedy,
    stock_peft_model,
)

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def _engine(path, team, version: int = 1, **kwargs) -> HFEngine:
    engine = hf_engine_for(team, load_tokenizer(path), **kwargs)
    push_adapters(engine, team, version=version)
    return engine


def _mixed_requests(team, prompts, sampling=GREEDY) -> list[GenerationRequest]:
    """Every agent and the base model on several prompts, interleaved (mixed lengths)."""
    slots = [*team.agent_names, None]
    return [
        GenerationRequest(prompts[(i * 2 + k) % len(prompts)], slots[i], sampling)
        for k in range(2)
        for i in range(len(slots))
    ]


@pytest.mark.parametrize("num_agents", [2, 4])
def test_mixed_batch_equals_each_agent_alone_with_stock_peft(tiny_model_path, tmp_path,
                                                             num_agents):
    team = perturbed_team(tiny_model_path, num_agents)
    engine = _engine(tiny_model_path, team)
    requests = _mixed_requests(team, chat_prompts(tiny_model_path))
    assert len({len(r.prompt_ids) for r in requests}) > 2  # left padding is exercised
    outputs = engine.generate(requests)

    references = {name: stock_peft_model(tiny_model_path, team, name, tmp_path / name)
                  for name in team.agent_names}
    references[None] = load_model(tiny_model_path)
    for request, output in zip(requests, outputs, strict=True):
        expected, expected_logprobs = stock_greedy(
            references[request.adapter], request.prompt_ids, GREEDY.max_new_tokens
        )
        assert output.token_ids == expected, request.adapter
        torch.testing.assert_close(output.logprobs, expected_logprobs, rtol=0, atol=1e-4)
        assert output.finish_reason == ("eos" if expected[-1] in engine.eos_ids else "length")
        assert output.adapter == request.adapter
        assert output.adapter_version == (None if request.adapter is None else 1)

    # The adapters really differ from each other and from the base (the test above can fail).
    prompt = requests[0].prompt_ids
    firsts = {name: sequence_logprobs(references[name], prompt, outputs[0].token_ids)[0]
              for name in references}
    assert len({round(value, 3) for value in firsts.values()}) == len(firsts)


def test_engine_is_an_inference_engine_and_shares_the_base_weights(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team)
    assert isinstance(engine, InferenceEngine)
    assert engine.model is team.base_model
    base = {n: p for n, p in team.peft_model.named_parameters() if "lora_" not in n}
    used = {n: p for n, p in engine.model.named_parameters() if "lora_" not in n}
    assert len(used) == len(base)
    assert {p.data_ptr() for p in used.values()} == {p.data_ptr() for p in base.values()}
    # The engine's own tensors are the stacked LoRA factors only: far smaller than the base.
    base_bytes = sum(p.nbytes for p in base.values())
    assert 0 < engine.fused.nbytes < base_bytes / 4
    with pytest.raises(ValueError, match="never copies"):
        hf_engine_for(team, load_tokenizer(tiny_model_path), device="meta")
    with pytest.raises(TypeError, match="PeftModel"):
        HFEngine(team.peft_model, load_tokenizer(tiny_model_path))


def test_one_model_forward_per_decode_step_whatever_the_number_of_adapters(tiny_model_path):
    team = perturbed_team(tiny_model_path, 4)
    engine = _engine(tiny_model_path, team)
    calls = []
    handle = engine.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    prompts = chat_prompts(tiny_model_path)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)
    try:
        for slots in ([None], ["alice"], ["alice", "bob"], ["alice", "bob", "carol", "dave", None]):
            calls.clear()
            outputs = engine.generate(
                [GenerationRequest(prompts[i], slot, sampling) for i, slot in enumerate(slots)]
            )
            assert all(len(o.token_ids) == 6 for o in outputs)
            assert len(calls) == 6  # one prefill + 5 decode steps, for any mix of adapters
    finally:
        handle.remove()


def test_generation_leaves_the_trainer_model_untouched(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    ids = torch.tensor([chat_prompts(tiny_model_path)[0]] * 2)
    mask, agent_id = torch.ones_like(ids), torch.tensor([0, 1])
    before = team.logprobs(ids, mask, agent_id)
    team.peft_model.train()
    engine = _engine(tiny_model_path, team)
    engine.generate(_mixed_requests(team, chat_prompts(tiny_model_path)))
    assert team.peft_model.training  # mode restored
    assert not any(m._forward_hooks for m in team.peft_model.modules())  # hooks removed
    team.peft_model.eval()
    torch.testing.assert_close(team.logprobs(ids, mask, agent_id), before, rtol=0, atol=0)


def test_adapter_versions_sync_and_stale_weights_are_visible(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team, version=1)
    prompt = chat_prompts(tiny_model_path)[1]
    request = GenerationRequest(prompt, "alice", GREEDY)
    (v1,) = engine.generate([request])

    perturb(team, "alice", seed=7)  # the trainer moves on; the engine still serves version 1
    assert engine.adapter_version("alice") == 1
    (stale,) = engine.generate([request])
    assert stale.token_ids == v1.token_ids and stale.logprobs == v1.logprobs
    assert stale.adapter_version == 1

    push_adapters(engine, team, version=2, agents=["alice"])
    assert engine.adapter_version("alice") == 2 and engine.adapter_version("bob") == 1
    (v2,) = engine.generate([request])
    assert v2.adapter_version == 2
    ids = torch.tensor([prompt + v2.token_ids])
    recomputed = team.logprobs(ids, torch.ones_like(ids), torch.tensor([0]))[0, len(prompt):]
    torch.testing.assert_close(torch.tensor(v2.logprobs), recomputed, rtol=0, atol=1e-4)
    assert (recomputed - torch.tensor(v1.logprobs[: len(recomputed)])).abs().max() > 1e-3

    with pytest.raises(ValueError, match="older version"):
        push_adapters(engine, team, version=1, agents=["alice"])
    engine.remove_adapter("alice")
    assert engine.adapter_version("alice") is None
    with pytest.raises(KeyError, match="not a loaded slot"):
        engine.generate([request])


def test_an_engine_on_the_models_device_takes_the_adapters_without_a_host_copy(
        tiny_model_path, monkeypatch):
    """push_adapters into an engine on the model's device passes the model's own tensors (the
    engine copies them into its stacks; an H200 step with 8 agents spent 1.2 s on the host round
    trip): the same outputs as host copies give, and a later in-place update of the model is
    not seen until the next push."""
    team = perturbed_team(tiny_model_path, 2)
    tokenizer = load_tokenizer(tiny_model_path)
    requests = _mixed_requests(team, chat_prompts(tiny_model_path))
    copied = hf_engine_for(team, tokenizer)
    for name in team.agent_names:
        copied.load_adapter(name, team.export_adapter(name), team.peft_config(name), 1)
    want = copied.generate(requests)

    def no_host_copy(name):
        raise AssertionError(f"host copy of {name!r}")

    monkeypatch.setattr(team, "export_adapter", no_host_copy)
    engine = hf_engine_for(team, tokenizer)
    push_adapters(engine, team, version=1)
    got = engine.generate(requests)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.logprobs for o in got] == [o.logprobs for o in want]
    perturb(team, "alice", seed=3)  # in place, as an optimizer step
    assert [o.token_ids for o in engine.generate(requests)] == [o.token_ids for o in want]


def test_frozen_snapshots_serve_beside_live_agents_and_slots_grow(tiny_model_path, tmp_path):
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team)
    prompts = chat_prompts(tiny_model_path)
    old = engine.generate([GenerationRequest(p, "alice", GREEDY) for p in prompts[:2]])
    engine.load_adapter("alice@step0", team.export_adapter("alice"), team.peft_config("alice"), 0)
    team.save_agent("bob", tmp_path / "bob")
    perturb(team, "alice", seed=9)
    push_adapters(engine, team, version=2)
    # More slots than the engine was sized for, one of a larger rank: the stacks grow.
    load_adapter_folder(engine, "bob@disk", tmp_path / "bob", version=5)
    wide = perturbed_team(tiny_model_path, 3)  # carol: rank 8 > the team's largest rank 4
    engine.load_adapter("carol", wide.export_adapter("carol"), wide.peft_config("carol"), 3)
    assert engine.fused.slot_capacity >= 5 and engine.fused.rank_capacity == 8

    requests = [GenerationRequest(p, slot, GREEDY) for p in prompts[:2]
                for slot in ("alice@step0", "alice", "bob@disk", "bob", "carol")]
    outputs = engine.generate(requests)
    assert [o.token_ids for o in outputs[0::5]] == [o.token_ids for o in old]
    assert [o.adapter_version for o in outputs[:5]] == [0, 2, 5, 2, 3]
    for request, output in zip(requests, outputs, strict=True):
        source, name = (wide, "carol") if request.adapter == "carol" else (team, None)
        name = name or request.adapter.split("@")[0]
        if request.adapter == "alice@step0":
            continue
        ids = torch.tensor([request.prompt_ids + output.token_ids])
        agent = torch.tensor([source.agent_index(name)])
        recomputed = source.logprobs(ids, torch.ones_like(ids), agent)[0, len(request.prompt_ids):]
        torch.testing.assert_close(torch.tensor(output.logprobs), recomputed, rtol=0, atol=1e-4)


def test_static_cache_path_equals_the_dynamic_path(tiny_model_path):
    team = perturbed_team(tiny_model_path, 4)
    requests = _mixed_requests(team, chat_prompts(tiny_model_path))[:7]  # 7 rows → bucket of 8
    dynamic = _engine(tiny_model_path, team).generate(requests)
    static = _engine(tiny_model_path, team, static_cache=True).generate(requests)
    for a, b in zip(dynamic, static, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("static_cache", [False, True])
def test_decode_steps_use_grouped_query_attention(tiny_model_path, monkeypatch, static_cache):
    """Every decode step (not the prefill) runs ``ring_decode_attention`` in every layer:
    transformers' sdpa path would first copy each cached key and value per query head."""
    import roll.inference.hf.ring as ring

    calls = []

    def counted(module, query, *args, **kwargs):
        calls.append(query.shape[2])  # query length: 1 at decode
        return ring_decode_attention(module, query, *args, **kwargs)

    ring_decode_attention = ring.ring_decode_attention
    monkeypatch.setattr(ring, "ring_decode_attention", counted)
    team = perturbed_team(tiny_model_path, 2)
    requests = [GenerationRequest(prompt, team.agent_names[0],
                                  SamplingParams(temperature=0.0, max_new_tokens=5,
                                                 ignore_eos=True))
                for prompt in chat_prompts(tiny_model_path)[:2]]
    outputs = _engine(tiny_model_path, team, static_cache=static_cache).generate(requests)
    assert all(len(output.token_ids) == 5 for output in outputs)
    layers = team.base_model.config.num_hidden_layers
    assert calls == [1] * (4 * layers)  # 5 tokens: the prefill's and 4 decode steps'


@pytest.mark.slow  # the full CI runs it; seconds of compiling (quick subset < 3 min)
def test_compiled_step_follows_adapter_syncs_and_layout_changes(tiny_model_path, monkeypatch):
    """The torch.compile path, traced with the 'eager' backend so that it runs on CPU.

    Engines on a plain transformers model (no PEFT), sized so that a new slot on new layers
    changes the set of hooked layers but no tensor shape: only the layout key tells the
    compiled step to retrace.
    """
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, backend="eager",
                                                                     dynamic=False))
    team = perturbed_team(tiny_model_path, 3)
    base, tokenizer = load_model(tiny_model_path), load_tokenizer(tiny_model_path)
    plain = HFEngine(base, tokenizer, slot_capacity=4, rank_capacity=8)
    compiled = HFEngine(base, tokenizer, slot_capacity=4, rank_capacity=8, compile=True)
    prompts = chat_prompts(tiny_model_path)

    def assert_same(slots):  # 4 or 6 rows: one batch bucket (8), no shape change
        requests = [GenerationRequest(p, slot, GREEDY) for p in prompts[:2] for slot in slots]
        for a, b in zip(plain.generate(requests), compiled.generate(requests), strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)

    def load(slot, agent, version):
        for engine in (plain, compiled):
            engine.load_adapter(slot, team.export_adapter(agent), team.peft_config(agent), version)

    load("bob", "bob", 1)  # q_proj, up_proj
    assert_same(["bob", None])
    perturb(team, "bob", seed=11)  # new weights, same layout: written in place
    load("bob", "bob", 2)
    assert_same(["bob", None])
    key = compiled.fused.layout_key
    load("carol", "carol", 1)  # v_proj, o_proj, down_proj: new hooked layers, same shapes
    assert compiled.fused.layout_key != key
    assert_same(["carol", "bob", None])
    assert compiled.fused.slot_capacity == 4 and compiled.fused.rank_capacity == 8


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team)
    prompts = chat_prompts(tiny_model_path)
    hot = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=10, seed=1)
    mine = GenerationRequest(prompts[0], "bob", hot)
    others = [GenerationRequest(p, "alice", SamplingParams(max_new_tokens=10, seed=s))
              for s, p in enumerate(prompts[1:4])]
    alone = engine.generate([mine])[0]
    assert engine.generate([mine])[0].token_ids == alone.token_ids
    in_batch = engine.generate([*others[:2], mine, others[2]])[2]
    assert in_batch.token_ids == alone.token_ids
    torch.testing.assert_close(in_batch.logprobs, alone.logprobs, rtol=0, atol=1e-5)
    reseeded = [engine.generate([GenerationRequest(prompts[0], "bob",
                                                   SamplingParams(max_new_tokens=10, seed=s))])[0]
                for s in range(2, 6)]
    assert len({tuple(o.token_ids) for o in reseeded}) > 1  # seeds matter
    # Requests without a seed draw theirs from the engine's seed: reproducible per engine.
    unseeded = [GenerationRequest(p, "alice", SamplingParams(max_new_tokens=8)) for p in prompts]
    first = [o.token_ids for o in _engine(tiny_model_path, team, seed=3).generate(unseeded)]
    again = [o.token_ids for o in _engine(tiny_model_path, team, seed=3).generate(unseeded)]
    assert first == again


def test_top_k_one_is_greedy(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team)
    prompts = chat_prompts(tiny_model_path)
    greedy = engine.generate([GenerationRequest(p, "alice", GREEDY) for p in prompts])
    for seed in range(3):
        top1 = SamplingParams(temperature=1.5, top_k=1, max_new_tokens=12, seed=seed)
        sampled = engine.generate([GenerationRequest(p, "alice", top1) for p in prompts])
        assert [o.token_ids for o in sampled] == [o.token_ids for o in greedy]
    # Same tokens, but their log-probs are taken at the row's temperature (1.5), greedy's at 1.
    for prompt, out in zip(prompts, sampled, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        at = team.logprobs(ids, torch.ones_like(ids), torch.tensor([0]), temperature=1.5)
        torch.testing.assert_close(torch.tensor(out.logprobs), at[0, len(prompt):], rtol=0,
                                   atol=1e-4)


def test_stop_strings_and_max_new_tokens(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team)
    tokenizer = engine.tokenizer
    prompts = chat_prompts(tiny_model_path)
    long = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True)
    free = engine.generate([GenerationRequest(p, "alice", long) for p in prompts])
    # A stop string taken from the middle of a free-running output (plain ASCII characters).
    row, start = next((i, j) for i, o in enumerate(free) for j in range(3, len(o.text) - 2)
                      if o.text[j:j + 2].isascii() and o.text[j:j + 2].isprintable())
    stop = free[row].text[start:start + 2]
    tokens = free[row].token_ids
    cut = next(k for k in range(1, len(tokens) + 1)
               if stop in tokenizer.decode(tokens[:k], skip_special_tokens=True))
    stopping = SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True,
                              stop=["\u2603 never", stop])
    (out,) = engine.generate([GenerationRequest(prompts[row], "alice", stopping)])
    assert out.finish_reason == "stop"
    assert out.token_ids == tokens[:cut]
    assert out.logprobs == pytest.approx(free[row].logprobs[:cut], abs=1e-6)
    assert out.text.endswith(stop) and stop not in out.text[:-1]
    assert free[row].text.startswith(out.text)

    # Per-row max_new_tokens in one batch.
    lengths = [1, 3, 7]
    outs = engine.generate([
        GenerationRequest(prompts[0], "bob", SamplingParams(temperature=0.0, max_new_tokens=n,
                                                            ignore_eos=True))
        for n in lengths
    ])
    assert [len(o.token_ids) for o in outs] == lengths
    assert [len(o.logprobs) for o in outs] == lengths
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[2].token_ids[:3] == outs[1].token_ids


def test_requests_and_sampling_params_are_validated_with_the_field_named(tiny_model_path):
    for kwargs, field in [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                          ({"top_k": -2}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens"),
                          ({"stop": "</answer>"}, "stop"), ({"stop": [""]}, "stop"),
                          ({"seed": -1}, "seed")]:
        with pytest.raises(ValueError, match=f"SamplingParams.{field}="):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="prompt_ids"):
        GenerationRequest([])
    with pytest.raises(ValueError, match="allowed_completions"):
        GenerationRequest([1], allowed_completions=[[]])
    team = perturbed_team(tiny_model_path, 2)
    engine = _engine(tiny_model_path, team)
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate([GenerationRequest([engine.vocab_size])])
    with pytest.raises(ValueError, match="lora_A"):
        tensors = team.export_adapter("alice")
        engine.load_adapter("x", tensors, team.peft_config("bob"), 0)  # rank 2 config, rank 4
    assert "x" not in engine.slots


def test_logprobs_are_taken_at_each_rows_sampling_temperature(tiny_model_path):
    """Issue 8: the engine's log-probs are those of softmax(z / T) for the row's own T (1 for
    greedy rows), unfiltered, equal to the trainer's forward at that temperature."""
    team = perturbed_team(tiny_model_path, 2)
    prompts = chat_prompts(tiny_model_path)
    temperatures = [0.7, 1.3, 0.0, 0.7]
    requests = [
        GenerationRequest(prompts[i], team.agent_names[i % 2],
                          SamplingParams(temperature=t, top_k=3 if i == 3 else 0,
                                         max_new_tokens=8, seed=i))
        for i, t in enumerate(temperatures)
    ]
    outputs = _engine(tiny_model_path, team).generate(requests)
    for request, output, temperature in zip(requests, outputs, temperatures, strict=True):
        ids = torch.tensor([request.prompt_ids + output.token_ids])
        agent = torch.tensor([team.agent_index(request.adapter)])
        at = temperature or 1.0
        recomputed = team.logprobs(ids, torch.ones_like(ids), agent,
                                   temperature=at)[0, len(request.prompt_ids):]
        torch.testing.assert_close(torch.tensor(output.logprobs), recomputed, rtol=0, atol=1e-4)
        if at != 1.0:  # the temperature really matters for these tokens
            at_one = team.logprobs(ids, torch.ones_like(ids), agent)[0, len(request.prompt_ids):]
            assert (at_one - recomputed).abs().max() > 1e-2
