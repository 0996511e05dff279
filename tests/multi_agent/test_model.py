"""MultiAgentLoRAModel: one base, N adapters, PEFT interchange (invariants 2 and 4)."""

from __future__ import annotations

import pytest
import torch
from peft import PeftModel

from roll.distributed.resident import resident_elements
from roll.models import load_model, load_shape
from roll.multi_agent.config import AgentConfig, CriticConfig, LoRAConfig
from roll.multi_agent.critics import Critics, critic_agents
from roll.multi_agent.model import MultiAgentLoRAModel

from .helpers import make_rows, make_team


def _perturb(model, name, seed):
    """Give an adapter non-zero B so it changes outputs (fresh LoRA B is zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.agent_parameters(name):
            param.add_(torch.randn(param.shape, generator=gen) * 0.3)


def test_reference_logprobs_equal_a_fresh_base_model(tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    _perturb(team, "alice", 1)
    _perturb(team, "bob", 2)
    rows = make_rows([0, 1, 0])
    ref = team.reference_logprobs(rows.input_ids, rows.attention_mask)
    fresh = load_model(tiny_model_path)
    with torch.no_grad():
        logits = fresh(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits
    expected = torch.log_softmax(logits.float(), -1)[:, :-1].gather(
        -1, rows.input_ids[:, 1:, None]
    )[..., 0]
    mask = rows.attention_mask[:, 1:].bool()
    torch.testing.assert_close(ref[:, 1:][mask], expected[mask], rtol=0, atol=1e-6)
    # ... and the adapters really do change the policy, so the test above can fail.
    policy = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    assert (policy[:, 1:][mask] - expected[mask]).abs().max() > 1e-3


def test_one_copy_of_the_base_weights(tiny_model_path):
    base = load_model(tiny_model_path)
    pointers = {p.data_ptr() for p in base.parameters()}
    team_agents = [AgentConfig(f"agent_{i}", lora=LoRAConfig(rank=4)) for i in range(4)]
    from roll.multi_agent.model import MultiAgentLoRAModel

    team = MultiAgentLoRAModel(base, team_agents)
    base_params = [p for n, p in team.peft_model.named_parameters() if "lora_" not in n]
    assert {p.data_ptr() for p in base_params} == pointers
    assert team.base_model is base
    assert not any(p.requires_grad for p in base_params)


def test_mixed_rows_use_their_own_adapter(tiny_model_path):
    team, _ = make_team(
        tiny_model_path,
        [
            AgentConfig("alice"),
            AgentConfig("bob", lora=LoRAConfig(rank=2, target_modules=["v_proj"])),
        ],
    )
    _perturb(team, "alice", 1)
    _perturb(team, "bob", 2)
    rows = make_rows([1, 0, 1, 0])
    mixed = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    for index in range(2):
        alone = team.logprobs(
            rows.input_ids, rows.attention_mask, torch.full_like(rows.agent_id, index)
        )
        picked = rows.agent_id == index
        torch.testing.assert_close(mixed[picked], alone[picked], rtol=0, atol=1e-6)
    # Rows of different agents differ: the adapters are really distinct.
    a_all = team.logprobs(rows.input_ids, rows.attention_mask, torch.zeros_like(rows.agent_id))
    assert (a_all[rows.agent_id == 1] - mixed[rows.agent_id == 1]).abs().max() > 1e-3


def test_saved_agent_loads_with_stock_peft_and_gives_same_logits(tiny_model_path, tmp_path):
    team, _ = make_team(
        tiny_model_path,
        [AgentConfig("alice"), AgentConfig("bob", lora=LoRAConfig(rank=2, alpha=4,
                                                            target_modules=["q_proj", "up_proj"]))],
    )
    _perturb(team, "alice", 1)
    _perturb(team, "bob", 2)
    rows = make_rows([1, 1, 1])
    ours = team.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    folder = team.save_agent("bob", tmp_path / "bob")
    assert (folder / "adapter_model.safetensors").is_file()
    stock = PeftModel.from_pretrained(load_model(tiny_model_path), folder)
    with torch.no_grad():
        logits = stock(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits
    theirs = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, rows.input_ids[:, 1:, None])
    mask = rows.attention_mask[:, 1:].bool()
    torch.testing.assert_close(ours[:, 1:][mask], theirs[..., 0][mask], rtol=0, atol=1e-6)
    assert stock.peft_config["default"].r == 2


def test_load_agent_and_import_export_round_trip(tiny_model_path, tmp_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    _perturb(team, "alice", 3)
    saved = team.export_adapter("alice")
    team.save_agent("alice", tmp_path / "alice")
    _perturb(team, "alice", 4)
    assert any(not torch.equal(saved[k], v) for k, v in team.export_adapter("alice").items())
    team.load_agent("alice", tmp_path / "alice")
    for key, value in team.export_adapter("alice").items():
        assert torch.equal(value, saved[key])
    # Agent b's tensors are a different shape set only if ranks differ; here a copy works.
    team.import_adapter("bob", saved)
    for key, value in team.export_adapter("bob").items():
        assert torch.equal(value, saved[key])


def test_import_with_wrong_shape_set_is_refused(tiny_model_path):
    team, _ = make_team(
        tiny_model_path,
        [
            AgentConfig("alice"),
            AgentConfig("bob", lora=LoRAConfig(rank=4, target_modules=["q_proj"])),
        ],
    )

    with pytest.raises(ValueError, match="agent 'bob'"):
        team.import_adapter("bob", team.export_adapter("alice"))


def test_adapter_init_depends_on_seed_and_name_only(tiny_model_path):
    team3, _ = make_team(tiny_model_path, [AgentConfig("x"), AgentConfig("y"), AgentConfig("z")])
    alone, _ = make_team(tiny_model_path, [AgentConfig("z")])
    for key, value in alone.export_adapter("z").items():
        assert torch.equal(value, team3.export_adapter("z")[key])
    other_seed, _ = make_team(tiny_model_path, [AgentConfig("z")], seed=1)
    key = next(k for k in alone.export_adapter("z") if "lora_A" in k)
    assert not torch.equal(alone.export_adapter("z")[key], other_seed.export_adapter("z")[key])


def test_a_team_on_the_base_shape_stores_adapters_only(tiny_model_path, tmp_path):
    """A Ray controller's model (roll.models.load_shape): the base holds no storage, the
    adapters (and critics) are CPU tensors, zero until imported; once imported it saves PEFT
    folders byte for byte as the loaded team does."""
    agents = [AgentConfig("alice"), AgentConfig("bob", lora=LoRAConfig(rank=2, alpha=4,
                                                                      target_modules=["q_proj"]))]
    team, resolved = make_team(tiny_model_path, agents)
    _perturb(team, "alice", 5)
    _perturb(team, "bob", 6)
    store = MultiAgentLoRAModel(load_shape(tiny_model_path), resolved, seed=0)
    assert team.holds_base and not store.holds_base
    adapter_elements = sum(t.numel() for name in team.agent_names
                           for t in team.export_adapter(name).values())
    # r 4 on every projection for alice, r 2 on q_proj for bob (tiny: hidden 64, 2 layers)
    assert adapter_elements > 0 and resident_elements(store) == adapter_elements
    assert resident_elements(team) > 5 * adapter_elements
    assert store.tensor_device == torch.device("cpu")
    assert all(float(t.abs().max()) == 0 for t in store.export_adapter("alice").values())
    for name in team.agent_names:
        store.import_adapter(name, team.export_adapter(name))
        theirs, ours = (model.save_agent(name, tmp_path / kind / name)
                        for kind, model in (("team", team), ("store", store)))
        for file in ("adapter_model.safetensors", "adapter_config.json"):
            assert (theirs / file).read_bytes() == (ours / file).read_bytes(), (name, file)
    critic_cfg = CriticConfig(mode="per_agent")
    critics = critic_agents(critic_cfg, store.agent_names)
    with_critics = MultiAgentLoRAModel(load_shape(tiny_model_path), resolved, critics=critics)
    held = Critics(critic_cfg, with_critics, critics)
    tensors = held.export_tensors()
    assert tensors and all(value.device.type == "cpu" for per_critic in tensors.values()
                           for part in per_critic.values() for value in part.values())


def test_a_deferred_adapter_is_imported_at_its_first_read_and_only_then(tiny_model_path,
                                                                        tmp_path):
    """defer_import (a Ray controller's store after each step): the tensors arrive when the
    agent is first read — export, save, parameters — once; an import in between wins."""
    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    before = team.export_adapter("alice")
    newer = {key: value + 1.0 for key, value in before.items()}
    calls = []
    team.defer_import("alice", lambda: calls.append("alice") or newer)
    bob = team.export_adapter("bob")  # another agent's read fetches nothing
    assert calls == []
    folder = team.save_agent("alice", tmp_path / "alice")
    assert calls == ["alice"]
    team.load_agent("bob", team.save_agent("bob", tmp_path / "bob"))
    assert all(torch.equal(value, newer[key])
               for key, value in team.export_adapter("alice").items())
    assert calls == ["alice"]  # once
    stock = PeftModel.from_pretrained(load_model(tiny_model_path), folder)
    saved = {key: value for key, value in stock.state_dict().items() if "lora_" in key}
    assert saved and all(float(value.abs().max()) > 0 for key, value in saved.items()
                         if "lora_B" in key)  # B was zero before: the newer tensors were saved
    team.defer_import("bob", lambda: calls.append("bob") or newer)
    team.import_adapter("bob", bob)  # newer than the deferred ones: they are never fetched
    team.defer_import("alice", lambda: calls.append("alice2") or before)
    team.import_deferred()
    assert calls == ["alice", "alice2"]
    assert all(torch.equal(value, bob[key]) for key, value in team.export_adapter("bob").items())
    assert all(torch.equal(value, before[key])
               for key, value in team.export_adapter("alice").items())


def test_rows_without_a_scored_token_still_run_the_model(tiny_model_path):
    """Under ZeRO-3 every forward is a collective: a rank whose rows hold no response token
    must still run one, or the other ranks wait forever. The log-probs are 0 and carry a
    graph, so a zero loss on them backpropagates like any other (zero gradients)."""
    model, _ = make_team(tiny_model_path, [AgentConfig("a")])
    calls = []
    handle = model.base_model.register_forward_hook(lambda *args: calls.append(1))
    ids = torch.randint(0, 50, (2, 6))
    try:
        logprobs, entropy = model(ids, torch.ones_like(ids), torch.zeros(2, dtype=torch.long),
                                  positions=torch.zeros(2, 6, dtype=torch.bool))
    finally:
        handle.remove()
    assert calls == [1]
    assert torch.equal(logprobs, torch.zeros(2, 6)) and torch.equal(entropy, torch.zeros(2, 6))
    logprobs.sum().backward()
    grads = [p.grad for _, p in model.named_agent_tensors("a")]
    assert grads and all(g is not None and not g.any() for g in grads)


def test_divergence_of_rows_without_a_scored_token_still_runs_the_model(tiny_model_path):
    """The same rule for the policy-distance pass (run on the ranks' shares): a chunk without
    a response token runs both forwards and gives 0."""
    model, _ = make_team(tiny_model_path, [AgentConfig("a"), AgentConfig("b")])
    calls = []
    handle = model.base_model.register_forward_hook(lambda *args: calls.append(1))
    ids = torch.randint(0, 50, (4, 6))
    positions = torch.zeros(4, 6, dtype=torch.bool)
    positions[:2, 3:] = True  # rows 2-3, the second chunk, have none
    try:
        kl = model.divergence_rows(ids, torch.ones_like(ids), "a", "b", positions=positions,
                                   forward_rows=2)
    finally:
        handle.remove()
    assert len(calls) == 4  # two chunks x two agents
    assert torch.equal(kl[2:], torch.zeros(2, dtype=kl.dtype))
