"""Token log-probs without full-vocabulary fp32 copies, at the sampling temperature."""

from __future__ import annotations

import math

import pytest
import torch

import roll.multi_agent.logprobs as logprobs_module
from roll.models import load_model
from roll.multi_agent.config import AgentConfig, LoRAConfig, TrainerConfig
from roll.multi_agent.logprobs import (
    FusedTokenLogProb,
    TokenLogProb,
    response_window,
    sequence_logprobs,
)
from roll.multi_agent.trainer import MultiAgentTrainer

from .helpers import make_rows, make_team


def test_token_logprob_and_entropy_by_hand():
    # Logits (0, ln 2, ln 2) at T = 1: p = (1/5, 2/5, 2/5); log p(token 0) = -ln 5 = -1.6094379.
    # H = -(0.2 ln 0.2 + 2 * 0.4 ln 0.4) = 0.3218876 + 0.7330326 = 1.0549202.
    # At T = 0.5 the logits double: (0, ln 4, ln 4): p = (1/9, 4/9, 4/9);
    # log p(token 1) = ln 4 - ln 9 = -0.8109302;
    # H = -(1/9 ln(1/9) + 8/9 ln(4/9)) = 0.2441361 + 0.7208269 = 0.9649630.
    logits = torch.tensor([[0.0, math.log(2), math.log(2)]])
    logprob, entropy = TokenLogProb.apply(logits, torch.tensor([0]), torch.tensor([0]), 1.0, True)
    assert logprob.item() == pytest.approx(-1.6094379, abs=1e-6)
    assert entropy.item() == pytest.approx(1.0549202, abs=1e-6)
    logprob, entropy = TokenLogProb.apply(logits, torch.tensor([1]), torch.tensor([0]), 0.5, True)
    assert logprob.item() == pytest.approx(-0.8109302, abs=1e-6)
    assert entropy.item() == pytest.approx(0.9649630, abs=1e-6)


def test_fused_token_logprob_by_hand():
    # The same two rows as above, every row scored (the captured trainer's form), through one
    # compiled function each way ('aot_eager' here: the same graph, no kernels generated).
    # Gradient of log p(token 0) + 0.5 H at T = 1, logits (0, ln 2, ln 2), p = (.2, .4, .4),
    # log p = (-1.6094379, -0.9162907, -0.9162907), H = 1.0549202:
    #   d log p(0) / d z = 1[j = 0] - p = (0.8, -0.4, -0.4);
    #   d H / d z = -p (log p + H) = (-0.2 (-0.5545177), -0.4 (0.1386295), same)
    #             = (0.1109035, -0.0554518, -0.0554518);
    #   total (0.8 + 0.0554518, -0.4 - 0.0277259, same) = (0.8554518, -0.4277259, -0.4277259).
    logits = torch.tensor([[0.0, math.log(2), math.log(2)],
                           [0.0, math.log(4), math.log(4)]], requires_grad=True)
    logprob, entropy = FusedTokenLogProb.apply(logits, torch.tensor([0, 1]), 1.0, "aot_eager")
    assert logprob[0].item() == pytest.approx(-1.6094379, abs=1e-6)
    assert entropy[0].item() == pytest.approx(1.0549202, abs=1e-6)
    assert entropy[1].item() == pytest.approx(0.9649630, abs=1e-6)  # (1/9, 4/9, 4/9)
    (logprob[0] + 0.5 * entropy[0]).backward()
    torch.testing.assert_close(logits.grad[0], torch.tensor([0.8554518, -0.4277259, -0.4277259]),
                               rtol=0, atol=1e-6)
    assert torch.equal(logits.grad[1], torch.zeros(3))  # no weight on row 1: no gradient
    # at T = 0.5, against the chunked TokenLogProb over every row, values and gradients
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 40, generator=gen, requires_grad=True)
    targets = torch.randint(0, 40, (5,), generator=gen)
    weights = torch.randn(2, 5, generator=gen)
    fused = FusedTokenLogProb.apply(logits, targets, 0.5, "aot_eager")
    (fused[0] @ weights[0] + fused[1] @ weights[1]).backward()
    fused_grad, logits.grad = logits.grad.clone(), None
    chunked = TokenLogProb.apply(logits, targets, torch.arange(5), 0.5, True)
    (chunked[0] @ weights[0] + chunked[1] @ weights[1]).backward()
    for ours, theirs in zip(fused, chunked, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused_grad, logits.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_values_and_gradients_equal_the_naive_fp32_log_softmax(monkeypatch, temperature):
    # Force several chunks (3 rows of a 50-token vocabulary each) to test the chunking.
    monkeypatch.setattr(logprobs_module, "CHUNK_BYTES", 3 * 4 * 50)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 6, 50, generator=gen, dtype=torch.float64).requires_grad_()
    input_ids = torch.randint(0, 50, (4, 7), generator=gen)
    positions = torch.zeros(4, 7, dtype=torch.bool)
    positions[0, 2:5] = positions[1, 3:7] = positions[3, 1:3] = True  # row 2: nothing
    window = response_window(positions)
    assert window == (1, 7)
    weights_lp = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    weights_h = torch.randn(4, 7, generator=gen, dtype=torch.float64)
    lp, ent = sequence_logprobs(logits, input_ids, positions, window, temperature, True)
    ((lp * weights_lp).sum() + (ent * weights_h).sum()).backward()
    ours = logits.grad.clone()

    logits.grad = None
    logp = torch.log_softmax(logits / temperature, -1)  # (4, 6, 50): position t predicts t+1
    naive_lp = torch.nn.functional.pad(logp.gather(-1, input_ids[:, 1:, None])[..., 0], (1, 0))
    naive_h = torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))
    naive_lp, naive_h = naive_lp * positions, naive_h * positions
    ((naive_lp * weights_lp).sum() + (naive_h * weights_h).sum()).backward()
    torch.testing.assert_close(lp, naive_lp.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, naive_h.float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(ours, logits.grad, rtol=0, atol=1e-6)


def test_only_the_response_window_reaches_the_lm_head(tiny_model_path):
    """Prompt columns get no logits: the LM head sees (rows, window, hidden), not (rows, T)."""
    team, _ = make_team(tiny_model_path, [AgentConfig("alice")])
    rows = make_rows([0, 0, 0], seed=1, length=20)
    mask = rows.response_mask.bool()
    first, stop = response_window(mask)
    seen = []
    handle = team.base_model.lm_head.register_forward_hook(
        lambda module, args, out: seen.append(tuple(args[0].shape))
    )
    try:
        windowed = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                                 positions=mask)
    finally:
        handle.remove()
    assert seen == [(3, stop - first, 64)]
    assert stop - first < rows.input_ids.shape[1] - 1
    full = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    torch.testing.assert_close(windowed, full * mask, rtol=0, atol=1e-6)


def test_log_prob_passes_honour_forward_rows(tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    rows = make_rows([0, 1, 0, 0, 1, 0, 0], seed=2)
    seen = []
    handle = team.base_model.lm_head.register_forward_hook(
        lambda module, args, out: seen.append(args[0].shape[0])
    )
    try:
        chunked = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                                forward_rows=2)
        seen_policy = list(seen)
        seen.clear()
        team.reference_logprobs(rows.input_ids, rows.attention_mask, forward_rows=3)
    finally:
        handle.remove()
    assert seen_policy == [2, 2, 2, 1]  # 7 rows (sorted by agent) in forwards of 2
    assert seen == [3, 3, 1]
    whole = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-6)


def _perturbed_trio(tiny_model_path, dropout: float = 0.0):
    agents = [AgentConfig(n, lora=LoRAConfig(rank=4, alpha=8, dropout=dropout))
              for n in ("alice", "bob", "carol")]
    team, _ = make_team(tiny_model_path, agents)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name in team.agent_names:
            for param in team.agent_parameters(name):
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    return team


def _stock_peft_logprobs(team, rows, adapter_names=None):
    """PEFT's own routing (``adapter_names``, or the active adapter), log_softmax by hand."""
    kwargs = {} if adapter_names is None else {"adapter_names": adapter_names}
    logits = team.peft_model(input_ids=rows.input_ids, attention_mask=rows.attention_mask,
                             **kwargs).logits
    logp = torch.log_softmax(logits.float(), -1)[:, :-1]
    picked = logp.gather(-1, rows.input_ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(picked, (1, 0)) * rows.response_mask


def test_log_prob_passes_sort_rows_into_agent_segments_and_equal_peft_routing(
        tiny_model_path):
    """The no-grad pass sorts rows by agent; each agent's contiguous segment gets its own
    LoRA delta (hooks, not PEFT's mixed routing). Every row equals PEFT's own mixed-batch
    forward; a crossed agent shows; the hooks are gone afterwards."""
    team = _perturbed_trio(tiny_model_path)
    rows = make_rows([2, 0, 1, 0, 0, 2, 1, 0], seed=6)
    names = [team.agent_names[i] for i in rows.agent_id.tolist()]
    with torch.no_grad():
        stock = _stock_peft_logprobs(team, rows, names)
    seen = []
    handle = team.base_model.lm_head.register_forward_hook(
        lambda module, args, out: seen.append(args[0].shape[0]))
    try:
        segmented = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                                  positions=rows.response_mask.bool(), forward_rows=3)
    finally:
        handle.remove()
    assert seen == [3, 3, 2]  # sorted rows alice x4, bob x2, carol x2 in forwards of 3
    torch.testing.assert_close(segmented, stock, rtol=0, atol=1e-5)
    whole = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                          positions=rows.response_mask.bool())
    torch.testing.assert_close(whole, stock, rtol=0, atol=1e-5)
    swapped = rows.agent_id.clone()
    swapped[rows.agent_id == 1], swapped[rows.agent_id == 2] = 2, 1
    crossed = team.logprobs(rows.input_ids, rows.attention_mask, swapped,
                            positions=rows.response_mask.bool())
    assert (crossed - stock).abs().max() > 1e-3
    with torch.no_grad():  # no hook left behind: PEFT's own forward is unchanged
        assert torch.equal(_stock_peft_logprobs(team, rows, names), stock)


def test_segment_forward_gradients_equal_stock_peft_per_agent_with_dropout(tiny_model_path,
                                                                          one_thread):
    """The training forward of a mixed batch (agents' rows contiguous) gives every agent's
    A/B the gradient of a stock PEFT forward of that agent's rows alone, dropout on (each
    agent's masks from its own generator, as alone)."""
    team = _perturbed_trio(tiny_model_path, dropout=0.3)
    rows = make_rows([0, 0, 0, 1, 1, 2, 2, 2], seed=7)
    steps = {name: 0 for name in team.agent_names}

    def grads():
        return {name: [p.grad.clone() for p in team.agent_parameters(name)]
                for name in team.agent_names}

    team.zero_grad(set_to_none=True)
    with team.training_forward(steps):
        logprobs, _ = team(rows.input_ids, rows.attention_mask, rows.agent_id,
                           positions=rows.response_mask.bool())
        (logprobs * rows.advantages).sum().backward()
    fused = grads()
    team.zero_grad(set_to_none=True)
    with team.training_forward(steps):
        for index, name in enumerate(team.agent_names):
            mine = rows.select(torch.nonzero(rows.agent_id == index).flatten())
            team.peft_model.set_adapter(name)
            team._all_trainable()
            alone = _stock_peft_logprobs(team, mine)
            (alone * mine.advantages).sum().backward()
    # Not bitwise: the stock side takes log_softmax over the full vocabulary, ours the
    # windowed chunked path (fp32 agreement ~3e-6 relative seen); a wrong agent, mask or
    # missing delta is off by far more.
    for name in team.agent_names:
        for got, want in zip(fused[name], grads()[name], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(g.abs().sum() > 0 for g in fused["bob"])


def _plain_peft_logprobs(team, rows, temperature):
    """An independent path: a stock forward of the PEFT model, log_softmax(logits / T)."""
    team.set_active_agent("alice")
    with torch.no_grad():
        logits = team.peft_model(input_ids=rows.input_ids,
                                 attention_mask=rows.attention_mask).logits
    logp = torch.log_softmax(logits.float() / temperature, -1)[:, :-1]
    picked = logp.gather(-1, rows.input_ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(picked, (1, 0)) * rows.response_mask


def test_trainer_takes_log_probs_at_the_sampling_temperature(tiny_model_path):
    """Rows sampled at T = 0.7 carry engine log-probs at 0.7: a trainer at 0.7 sees ratio 1
    on its first mini-batch (approx_kl 0, nothing clipped); at T = 1 it would not."""
    team, resolved = make_team(tiny_model_path, [AgentConfig("alice")])
    with torch.no_grad():
        for param in team.agent_parameters("alice"):
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(3)) * 0.3)
    rows = make_rows([0, 0, 0, 0], seed=5)
    behaviour = _plain_peft_logprobs(team, rows, 0.7)
    own = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                        positions=rows.response_mask.bool(), temperature=0.7)
    torch.testing.assert_close(own, behaviour, rtol=0, atol=1e-5)
    assert (behaviour - _plain_peft_logprobs(team, rows, 1.0)).abs().max() > 1e-2
    config = TrainerConfig(clip_low=0.01, clip_high=0.01)
    trainer = MultiAgentTrainer(team, resolved, config, temperature=0.7)
    metrics = trainer.train_step(rows.with_fields(old_logprobs=behaviour))["alice"]
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-9)
    assert metrics["clip_frac"] == 0.0


def test_reference_log_probs_at_temperature_equal_a_fresh_base(tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice")])
    rows = make_rows([0, 0], seed=6)
    ref = team.reference_logprobs(rows.input_ids, rows.attention_mask,
                                  positions=rows.response_mask.bool(), temperature=0.7)
    with torch.no_grad():
        logits = load_model(tiny_model_path)(input_ids=rows.input_ids,
                                             attention_mask=rows.attention_mask).logits
    logp = torch.log_softmax(logits.float() / 0.7, -1)[:, :-1]
    expected = torch.nn.functional.pad(logp.gather(-1, rows.input_ids[:, 1:, None])[..., 0],
                                       (1, 0)) * rows.response_mask
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-5)


def test_policy_divergence_is_the_kl_of_each_agents_own_peft_forward(tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    rows = make_rows([0, 1, 0], seed=3)
    mask = rows.response_mask.bool()
    # LoRA B starts at zero: both agents are the base, KL 0 exactly.
    assert not team.divergence_rows(rows.input_ids, rows.attention_mask, "alice", "bob",
                                    positions=mask).any()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, tensor in team.named_agent_tensors("bob"):
            tensor.add_(0.3 * torch.randn(tensor.shape, generator=gen))
    temperature = 0.7
    ours = team.divergence_rows(rows.input_ids, rows.attention_mask, "alice", "bob",
                                positions=mask, temperature=temperature, forward_rows=2)
    # The same by hand: each agent's stock PEFT forward (set_adapter), full log_softmax, KL at
    # every scored token (the logits of position t - 1 predict token t).
    logp = {}
    with torch.no_grad():
        for name in ("alice", "bob"):
            team.set_active_agent(name)
            logits = team.peft_model(input_ids=rows.input_ids,
                                     attention_mask=rows.attention_mask).logits
            logp[name] = torch.log_softmax(logits.double() / temperature, -1)[:, :-1]
    kl = (logp["alice"].exp() * (logp["alice"] - logp["bob"])).sum(-1)  # (B, T - 1)
    scored = mask[:, 1:]
    expected = (kl * scored).sum(-1)  # (B,): each row's sum over its scored tokens
    assert (expected > 1e-4).all()
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=0)


def test_a_window_with_nothing_selected_is_one_column_so_the_model_still_runs():
    """Under ZeRO-3 every forward is a collective: a chunk with no scored token gets the
    one-column window (1, 2) rather than no forward (by hand: column 1 predicts token 1)."""
    assert response_window(torch.zeros(3, 5, dtype=torch.bool)) == (1, 2)
    with pytest.raises(ValueError, match="1 column"):
        response_window(torch.zeros(2, 1, dtype=torch.bool))


def test_the_reference_pass_switches_peft_off_and_leaves_every_flag_as_it_was(tiny_model_path):
    """Trained adapters (B not zero): the reference pass equals a fresh base, every agent's
    forward still differs from it, and PEFT's flags and ``requires_grad`` come back as they
    were — also when a frozen tensor was frozen on purpose, and when the pass raises."""
    from roll.multi_agent.routing import base_layers_only

    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    with torch.no_grad():
        for param in team.agent_parameters("alice") + team.agent_parameters("bob"):
            param.add_(0.05 * torch.randn_like(param))
    frozen = team.agent_parameters("bob")[0]
    frozen.requires_grad_(False)
    grads_before = [p.requires_grad for _, p in team.peft_model.named_parameters()]
    rows = make_rows([0, 1], seed=6)
    positions = rows.response_mask.bool()
    ref = team.reference_logprobs(rows.input_ids, rows.attention_mask, positions=positions)
    with torch.no_grad():
        logits = load_model(tiny_model_path)(input_ids=rows.input_ids,
                                             attention_mask=rows.attention_mask).logits
    logp = torch.log_softmax(logits.float(), -1)[:, :-1]
    expected = torch.nn.functional.pad(logp.gather(-1, rows.input_ids[:, 1:, None])[..., 0],
                                       (1, 0)) * rows.response_mask
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        own = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                            positions=positions)
    assert float((own - expected).abs().max()) > 1e-3  # the adapters are really on again
    assert [p.requires_grad for _, p in team.peft_model.named_parameters()] == grads_before
    assert not any(layer.disable_adapters for _, layer in team.lora_layers)
    with pytest.raises(RuntimeError, match="inside"):
        with base_layers_only(layer for _, layer in team.lora_layers):
            assert all(layer.disable_adapters for _, layer in team.lora_layers)
            raise RuntimeError("inside")
    assert not any(layer.disable_adapters for _, layer in team.lora_layers)
