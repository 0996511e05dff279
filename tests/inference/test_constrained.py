"""Constrained decoding: every output is exactly one of the allowed completions."""

from __future__ import annotations

import pytest
import torch

from roll.distributed.roles import push_adapters
from roll.inference import GenerationRequest, SamplingParams
from roll.inference.constrained import CompletionTrie, ConstraintState
from roll.models import load_tokenizer
from roll.pipeline.builders import hf_engine_for

from .helpers import chat_prompts, perturbed_team

MOVES = ["x(0,0)", "x(0,1)", "x(1,1)", "o(2,2)", "Pass", "Bet", "3"]


def _answer_completions(tokenizer, moves=MOVES, with_eos=True) -> list[list[int]]:
    eos = [tokenizer.eos_token_id] if with_eos else []
    return [tokenizer.encode(f"<answer>{m}</answer>", add_special_tokens=False) + eos
            for m in moves]


def test_trie_walks_allowed_sequences_and_refuses_bad_sets():
    trie = CompletionTrie([[5, 6, 7], [5, 8], [9]], vocab_size=10)
    assert sorted(trie.allowed(0)) == [5, 9]
    node = trie.advance(0, 5)
    assert sorted(trie.allowed(node)) == [6, 8] and not trie.is_complete(node)
    assert trie.is_complete(trie.advance(node, 8))
    with pytest.raises(ValueError, match="not allowed"):
        trie.advance(node, 9)
    with pytest.raises(ValueError, match=r"\[5, 6\] is a strict prefix"):
        CompletionTrie([[5, 6], [5, 6, 7]])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        CompletionTrie([[5, 12]], vocab_size=10)
    assert CompletionTrie([[1, 2], [1, 2]]).allowed(0) == [1]  # duplicates are harmless


def test_constraint_mask_keeps_only_allowed_tokens_of_live_rows():
    state = ConstraintState([CompletionTrie([[1, 2], [3]]), None, CompletionTrie([[4]])])
    logits = torch.zeros(3, 6)
    masked = state.mask_logits(logits, finished=[False, False, True])
    assert torch.isfinite(masked[0]).tolist() == [False, True, False, True, False, False]
    assert torch.isfinite(masked[1:]).all()  # unconstrained and finished rows untouched
    assert state.advance([1, 0, 4], finished=[False, False, True]) == []
    assert state.advance([2, 0, 4], finished=[False, False, True]) == [0]


def test_every_constrained_output_is_one_allowed_completion(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    tokenizer = load_tokenizer(tiny_model_path)
    engine = hf_engine_for(team, tokenizer)
    push_adapters(engine, team, version=1)
    allowed = _answer_completions(tokenizer)
    prompts = chat_prompts(tiny_model_path)
    requests = []
    for seed in range(24):
        sampling = SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=32, seed=seed)
        slot = [None, "alice", "bob"][seed % 3]
        requests.append(GenerationRequest(prompts[seed % len(prompts)], slot, sampling, allowed))
    # Unconstrained rows in the same batch are not affected by their neighbours' constraints.
    free = GenerationRequest(prompts[0], "alice", SamplingParams(temperature=0.0,
                                                                max_new_tokens=8))
    outputs = engine.generate([*requests, free])
    for output in outputs[:-1]:
        assert output.token_ids in allowed
        assert output.finish_reason == "eos"
        assert output.text in {f"<answer>{m}</answer>" for m in MOVES}
    assert len({tuple(o.token_ids) for o in outputs[:-1]}) >= 3  # sampling really chooses
    assert outputs[-1].token_ids == engine.generate([free])[0].token_ids

    # Reported log-probs are the model's own (unmasked), as the trainer will recompute them.
    for request, output in zip(requests[1:3], outputs[1:3], strict=True):
        ids = torch.tensor([request.prompt_ids + output.token_ids])
        agent = torch.tensor([team.agent_index(request.adapter)])
        recomputed = team.logprobs(ids, torch.ones_like(ids), agent)[0, len(request.prompt_ids):]
        torch.testing.assert_close(torch.tensor(output.logprobs), recomputed, rtol=0, atol=1e-4)


def test_constrained_greedy_and_completions_without_eos(tiny_model_path):
    team = perturbed_team(tiny_model_path, 2)
    tokenizer = load_tokenizer(tiny_model_path)
    engine = hf_engine_for(team, tokenizer)
    push_adapters(engine, team, version=1)
    allowed = _answer_completions(tokenizer, with_eos=False)
    prompts = chat_prompts(tiny_model_path)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=32)
    outputs = engine.generate([GenerationRequest(p, "bob", greedy, allowed) for p in prompts])
    for output in outputs:
        assert output.token_ids in allowed and output.finish_reason == "stop"
    # Too few tokens to finish any completion: a prefix, flagged as 'length'.
    short = SamplingParams(temperature=0.0, max_new_tokens=2)
    (cut,) = engine.generate([GenerationRequest(prompts[0], "bob", short, allowed)])
    assert cut.finish_reason == "length"
    assert any(seq[:2] == cut.token_ids for seq in allowed)
