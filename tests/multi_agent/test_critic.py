"""Critics as adapters (roll/multi_agent/critic.py): a critic's values are its own LoRA on the
shared base + its head, at the right positions; its gradients come from its own rows only; it
saves and loads bit-exactly."""

from __future__ import annotations

import pytest
import torch

from roll.models import load_model
from roll.multi_agent.config import AgentConfig, LoRAConfig
from roll.multi_agent.critic import ValueHeads, critic_values, load_critic, save_critic
from roll.multi_agent.model import MultiAgentLoRAModel

from .helpers import make_rows

LORA = LoRAConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


def _critics(path, seed: int = 0, perturb: bool = True):
    agents = [AgentConfig("alice", lora=LORA)]
    critics = [AgentConfig("critic_a", lora=LORA), AgentConfig("critic_b", lora=LORA)]
    model = MultiAgentLoRAModel(load_model(path), agents, seed=0, critics=critics)
    heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size)
    if perturb:  # LoRA B and the heads start at zero: every critic would be the same
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name in model.critic_names:
                for _, tensor in model.named_agent_tensors(name):
                    tensor.add_(0.2 * torch.randn(tensor.shape, generator=generator))
            for param in heads.parameters():
                param.add_(torch.randn(param.shape, generator=generator))
    return model, heads


def test_values_are_each_critics_adapter_and_head_at_the_previous_position(tiny_model_path):
    model, heads = _critics(tiny_model_path)
    batch = make_rows([0, 0, 0, 0], seed=3)
    critic_id = torch.tensor([0, 0, 1, 1])
    values = critic_values(model, heads, batch.input_ids, batch.attention_mask, critic_id)
    assert values.shape == batch.input_ids.shape and values.dtype == torch.float32
    assert torch.all(values[:, 0] == 0)
    for index, name in enumerate(model.critic_names):
        rows = critic_id == index
        # Stock PEFT, this critic's adapter active: hidden states, then the head by hand.
        model.peft_model.set_adapter(name)
        with torch.no_grad():
            hidden = model.base_model.get_decoder()(
                input_ids=batch.input_ids[rows], attention_mask=batch.attention_mask[rows],
                use_cache=False).last_hidden_state
        head = heads.heads[name]
        want = hidden[:, :-1] @ head.weight[0] + head.bias[0]  # V(state before token t)
        torch.testing.assert_close(values[rows, 1:], want, rtol=0, atol=1e-5)
    model.set_active_agent("alice")
    assert not torch.allclose(values[:2], values[2:])  # two different critics
    masked = critic_values(model, heads, batch.input_ids, batch.attention_mask, critic_id,
                           positions=batch.response_mask.bool())
    assert torch.equal(masked, torch.where(batch.response_mask.bool(), values, 0.0))


def test_a_critics_gradients_come_from_its_own_rows_only(tiny_model_path):
    model, heads = _critics(tiny_model_path)
    batch = make_rows([0, 0, 0, 0, 0], seed=4)
    critic_id = torch.tensor([0, 0, 0, 1, 1])
    values = critic_values(model, heads, batch.input_ids, batch.attention_mask, critic_id)
    values[:3].square().sum().backward()  # a loss on critic_a's rows only
    for param in [*model.agent_parameters("critic_a"), *heads.heads["critic_a"].parameters()]:
        assert param.grad is not None
    assert any(p.grad.abs().max() > 0 for p in model.agent_parameters("critic_a"))
    for param in [*model.agent_parameters("critic_b"), *heads.heads["critic_b"].parameters(),
                  *model.agent_parameters("alice")]:
        assert param.grad is None or torch.all(param.grad == 0)


def test_a_critic_saves_and_loads_bit_exactly(tiny_model_path, tmp_path):
    model, heads = _critics(tiny_model_path, seed=1)
    folder = save_critic(model, heads, "critic_b", tmp_path / "critic_b")
    assert (folder / "adapter_config.json").is_file()
    assert (folder / "value_head.safetensors").is_file()
    fresh, fresh_heads = _critics(tiny_model_path, seed=2)
    load_critic(fresh, fresh_heads, "critic_b", folder)
    batch = make_rows([0, 0, 0], seed=5)
    critic_id = torch.ones(3, dtype=torch.long)
    with torch.no_grad():
        want = critic_values(model, heads, batch.input_ids, batch.attention_mask, critic_id)
        got = critic_values(fresh, fresh_heads, batch.input_ids, batch.attention_mask, critic_id)
    assert torch.equal(got, want)
    with pytest.raises(FileNotFoundError, match="value_head.safetensors"):
        load_critic(fresh, fresh_heads, "critic_a", tmp_path)
    with pytest.raises(KeyError, match="unknown critic 'alice'"):
        save_critic(model, heads, "alice", tmp_path / "x")


def test_critic_names_must_differ_from_agent_names(tiny_model_path):
    with pytest.raises(ValueError, match=r"critic names \['alice'\] are also agent names"):
        MultiAgentLoRAModel(load_model(tiny_model_path), [AgentConfig("alice", lora=LORA)],
                            critics=[AgentConfig("alice", lora=LORA)])
