"""q/k/v and gate/up as one product each (roll/inference/hf/fused_projections.py): the base stays
one copy that the trainer reads unchanged, the engine's forwards launch 3 fewer GEMMs a layer,
and every token and log-prob equals the unfused engine's."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.inference.hf.fused_projections import FusedProjections
from roll.models import load_tokenizer
from roll.pipeline.builders import hf_engine_for

from ..helpers import chat_prompts, perturbed_team


def storages(model: nn.Module) -> dict[int, int]:
    """Each parameter storage's address -> its bytes (one entry per storage)."""
    return {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes()
            for p in model.parameters()}


def attention_and_mlp(model: nn.Module):
    layer = model.model.layers[0]
    return ([getattr(getattr(layer.self_attn, n), "base_layer", getattr(layer.self_attn, n))
             for n in ("q_proj", "k_proj", "v_proj")],
            [getattr(getattr(layer.mlp, n), "base_layer", getattr(layer.mlp, n))
             for n in ("gate_proj", "up_proj")])


def requests_for(path, team) -> list[GenerationRequest]:
    prompts = chat_prompts(path)
    slots = [*team.agent_names, None]
    return [GenerationRequest(prompts[i % len(prompts)], slots[i % len(slots)],
                              SamplingParams(temperature=(0.0, 1.0)[i % 2], max_new_tokens=6,
                                             seed=40 + i, ignore_eos=True))
            for i in range(8)]


def test_one_base_copy_that_the_trainer_reads_unchanged(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    base = team.base_model
    before = storages(base)
    ids = torch.tensor([chat_prompts(tiny_model_path)[0]])
    agent = torch.tensor([1])
    with torch.no_grad():
        want = team.logprobs(ids, torch.ones_like(ids), agent)
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path), fuse_projections=True)
    layers = base.config.num_hidden_layers
    assert engine.projections.gemms_saved == 3 * layers  # (3 - 1) + (2 - 1) a layer
    qkv, gate_up = attention_and_mlp(base)
    for family in (qkv, gate_up):
        # the members' weights are consecutive rows of one buffer, nothing copied
        assert len({w.weight.untyped_storage().data_ptr() for w in family}) == 1
        offsets = [w.weight.storage_offset() for w in family]
        sizes = [w.weight.numel() for w in family]
        assert offsets == [sum(sizes[:i]) for i in range(len(family))]
        assert all(w.weight.is_contiguous() and "forward" not in vars(w) for w in family)
    after = storages(base)
    assert sum(after.values()) == sum(before.values())  # the same bytes, fewer storages
    assert len(after) == len(before) - 3 * layers
    # a second engine on the same model takes the same families: nothing moves again (the
    # first engine's captured graphs keep reading the weights where they are)
    again = hf_engine_for(team, load_tokenizer(tiny_model_path), fuse_projections=True)
    assert again.projections.families == engine.projections.families
    assert storages(base) == after
    with torch.no_grad():
        got = team.logprobs(ids, torch.ones_like(ids), agent)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_tokens_and_logprobs_equal_the_unfused_engine(tiny_model_path):
    """Mixed adapters and the base, greedy and sampled, lock-step ``generate`` and continuous
    ``serve``: the fused engine gives the unfused engine's tokens and log-probs."""
    tokenizer = load_tokenizer(tiny_model_path)
    plain_team = perturbed_team(tiny_model_path, 3)
    fused_team = perturbed_team(tiny_model_path, 3)
    plain = hf_engine_for(plain_team, tokenizer, max_batch_size=4)
    fused = hf_engine_for(fused_team, tokenizer, max_batch_size=4, fuse_projections=True)
    assert plain.projections.gemms_saved == 0 and fused.projections.gemms_saved > 0
    for engine, team in ((plain, plain_team), (fused, fused_team)):
        push_adapters(engine, team, version=1)
    requests = requests_for(tiny_model_path, plain_team)
    expected = plain.generate(requests)
    generated = fused.generate(requests)
    served: dict[int, object] = {}
    fused.serve(requests, lambda key, output: served.__setitem__(key, output) or [])
    for key, want in enumerate(expected):
        for got in (generated[key], served[key]):
            assert got.token_ids == want.token_ids, key
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5), key


def test_a_forward_launches_three_fewer_products_a_layer(tiny_model_path):
    """One prefill under the profiler, no adapter loaded (no LoRA products): 7 linear products
    a layer plus the LM head unfused, 4 a layer plus the LM head fused."""
    tokenizer = load_tokenizer(tiny_model_path)
    ids = torch.tensor([chat_prompts(tiny_model_path)[1]])
    counts = []
    for fuse in (False, True):
        team = perturbed_team(tiny_model_path, 1)
        engine = hf_engine_for(team, tokenizer, fuse_projections=fuse)
        with engine._generation_mode(), torch.profiler.profile() as prof:
            engine.model(input_ids=ids)
        counts.append(sum(e.count for e in prof.key_averages() if e.key == "aten::linear"))
    layers = team.base_model.config.num_hidden_layers
    assert counts == [7 * layers + 1, 4 * layers + 1]


def test_a_member_called_without_its_first_is_refused(tiny_model_path):
    team = perturbed_team(tiny_model_path, 1)
    engine = hf_engine_for(team, load_tokenizer(tiny_model_path), fuse_projections=True)
    (q, k, _), _ = attention_and_mlp(team.base_model)
    x = torch.zeros(1, 2, q.in_features)
    with engine._generation_mode(), pytest.raises(RuntimeError, match="without its first"):
        k(x)
    assert k(x).shape == (1, 2, k.out_features)  # a plain layer again outside the engine


def fake_model(model_type: str, in_features=(8, 8, 8)) -> nn.Module:
    """An nn.Module with one attention-like block (q/k/v) of the given input sizes."""
    model = nn.Module()
    model.config = types.SimpleNamespace(model_type=model_type)
    block = nn.Module()
    for name, size in zip(("q_proj", "k_proj", "v_proj"), in_features, strict=True):
        linear = nn.Linear(size, 4, bias=False)
        linear.weight.requires_grad_(False)
        setattr(block, name, linear)
    model.block = block
    return model


def test_only_models_that_share_inputs_and_layers_that_match_are_fused():
    assert FusedProjections(fake_model("qwen3")).gemms_saved == 2
    assert FusedProjections(fake_model("gpt_neox")).gemms_saved == 0  # not known to share
    assert FusedProjections(fake_model("qwen3", (8, 8, 6))).gemms_saved == 0  # other inputs
    assert FusedProjections(None).gemms_saved == 0
