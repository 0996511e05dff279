"""Critics as adapters (roll/multi_agent/critics.py): a critic's values are its own LoRA on the
shared base + its head, at the right positions; its gradients come from its own rows only; it
saves and loads bit-exactly."""

from __future__ import annotations

import copy

import pytest
import torch

from roll.models import load_model
from roll.multi_agent.config import AgentConfig, LoRAConfig
from roll.multi_agent.critics import ValueHeads, critic_values, load_critic, save_critic
from roll.multi_agent.model import MultiAgentLoRAModel

from .helpers import make_rows, perturb_critics

LORA = LoRAConfig(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


def _critics(path, seed: int = 0, perturb: bool = True):
    agents = [AgentConfig("alice", lora=LORA)]
    critics = [AgentConfig("critic_a", lora=LORA), AgentConfig("critic_b", lora=LORA)]
    model = MultiAgentLoRAModel(load_model(path), agents, seed=0, critics=critics)
    heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size)
    if perturb:
        perturb_critics(model, heads, seed)
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


def test_the_value_forward_switches_no_adapter_off_and_on(tiny_model_path, monkeypatch):
    """PEFT's disable_adapter (and with it every adapter made trainable again) costs ~70 ms of
    host time a call on SmolLM2, once per critic forward before: the values come from PEFT's
    "__base__" rows plus the segment deltas instead, and every adapter stays trainable."""
    model, heads = _critics(tiny_model_path)
    batch = make_rows([0, 0, 0, 0], seed=3)

    def refused():
        raise AssertionError("disable_adapter called")

    monkeypatch.setattr(model.peft_model, "disable_adapter", refused)
    values = critic_values(model, heads, batch.input_ids, batch.attention_mask,
                           torch.tensor([0, 0, 1, 1]))
    values.sum().backward()
    for name in model.critic_names:
        grads = [p.grad for p in model.agent_parameters(name) if p.requires_grad]
        assert len(grads) == len(model.agent_parameters(name))
        assert any(g is not None and g.abs().sum() > 0 for g in grads)


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


# --- the critic trainer -------------------------------------------------------------------------


def _critic_team(path, names):
    from roll.multi_agent.config import OptimConfig

    critics = [AgentConfig(name, lora=LORA, optim=OptimConfig(lr=1e-2)) for name in names]
    model = MultiAgentLoRAModel(load_model(path), [AgentConfig("alice", lora=LORA)], seed=0,
                                critics=critics)
    heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size)
    return model, heads, critics


def _targets(batch, critic_id, trainer, row_target=None):
    """Old values from the critics themselves; returns ``row_target`` (B,) on each row's
    response (default +1 on critic 0's rows, -2 on the others')."""
    values = trainer.values(batch, critic_id)
    if row_target is None:
        row_target = torch.where(critic_id == 0, 1.0, -2.0)
    return batch.with_fields(values=values, returns=row_target[:, None] * batch.response_mask)


def test_critics_trained_together_equal_each_alone_and_fit_their_returns(tiny_model_path):
    from roll.multi_agent.config import CriticConfig
    from roll.multi_agent.critics import CriticTrainer

    batch = make_rows([0] * 7, seed=6)
    critic_id = torch.tensor([0, 1, 1, 0, 0, 1, 0])
    model, heads, critics = _critic_team(tiny_model_path, ["critic_a", "critic_b"])
    trainer = CriticTrainer(model, heads, critics, CriticConfig(micro_batch_size=3))
    errors = []
    for _ in range(25):
        step_batch = _targets(batch, critic_id, trainer)
        metrics = trainer.train_step(step_batch, critic_id)
        errors.append({name: m["value_error"] for name, m in metrics.items()})
    # Each critic fits its own rows' returns (+1 and -2): the squared error falls tenfold.
    for name in ("critic_a", "critic_b"):
        assert errors[-1][name] < 0.1 * errors[0][name], errors
    final = trainer.values(batch, critic_id)
    mask = batch.response_mask.bool()
    assert final[critic_id == 0][mask[critic_id == 0]].mean() > 0.5
    assert final[critic_id == 1][mask[critic_id == 1]].mean() < -1.0
    # Alone: one critic, its own rows only, the same number of steps.
    for index, name in enumerate(["critic_a", "critic_b"]):
        alone, alone_heads, alone_critics = _critic_team(tiny_model_path, [name])
        solo = CriticTrainer(alone, alone_heads, alone_critics,
                             CriticConfig(micro_batch_size=3))
        own = batch.select(critic_id == index)
        zeros = torch.zeros(len(own), dtype=torch.long)
        target = torch.full((len(own),), 1.0 if index == 0 else -2.0)
        for _ in range(25):
            solo.train_step(_targets(own, zeros, solo, target), zeros)
        for key, value in alone.export_adapter(name).items():
            torch.testing.assert_close(model.export_adapter(name)[key], value, rtol=0, atol=1e-6)
        for got, want in zip(heads.heads[name].parameters(),
                             alone_heads.heads[name].parameters(), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_an_idle_critic_keeps_its_weights_and_state_and_resume_is_bit_exact(tiny_model_path):
    from roll.multi_agent.config import CriticConfig
    from roll.multi_agent.critics import CriticTrainer

    batch = make_rows([0] * 5, seed=7)
    only_a = torch.zeros(5, dtype=torch.long)
    model, heads, critics = _critic_team(tiny_model_path, ["critic_a", "critic_b"])
    trainer = CriticTrainer(model, heads, critics, CriticConfig())
    before = {key: value.clone() for key, value in model.export_adapter("critic_b").items()}
    steps = [_targets(batch, only_a, trainer)]
    trainer.train_step(steps[0], only_a)
    assert trainer.optimizers["critic_b"].state == {}
    assert all(torch.equal(model.export_adapter("critic_b")[k], v) for k, v in before.items())
    # Save after step 1, then step 2 in the original and in a resumed copy: bitwise equal.
    state = copy.deepcopy(trainer.state_dict())  # as a checkpoint on disk holds it
    saved = {name: (model.export_adapter(name), {k: v.clone() for k, v in
                                                 heads.heads[name].state_dict().items()})
             for name in model.critic_names}
    step2 = _targets(batch, only_a, trainer)
    trainer.train_step(step2, only_a)
    resumed, resumed_heads, _ = _critic_team(tiny_model_path, ["critic_a", "critic_b"])
    for name, (adapter, head) in saved.items():
        resumed.import_adapter(name, adapter)
        resumed_heads.heads[name].load_state_dict(head)
    again = CriticTrainer(resumed, resumed_heads, critics, CriticConfig())
    again.load_state_dict(state)
    again.train_step(step2, only_a)
    for key, value in model.export_adapter("critic_a").items():
        assert torch.equal(resumed.export_adapter("critic_a")[key], value), key
    assert all(torch.equal(a, b) for a, b in zip(heads.parameters(), resumed_heads.parameters(),
                                                 strict=True))


def test_a_non_finite_critic_loss_refuses_the_whole_step(tiny_model_path):
    from roll.errors import NonFiniteLossError
    from roll.multi_agent.config import CriticConfig
    from roll.multi_agent.critics import CriticTrainer

    batch = make_rows([0] * 4, seed=8)
    critic_id = torch.tensor([0, 1, 0, 1])
    model, heads, critics = _critic_team(tiny_model_path, ["critic_a", "critic_b"])
    trainer = CriticTrainer(model, heads, critics, CriticConfig())
    step = _targets(batch, critic_id, trainer)
    returns = step.returns.clone()
    returns[1, batch.response_mask[1].bool()] = float("inf")  # a row of critic_b
    before = [p.clone() for p in heads.parameters()]
    with pytest.raises(NonFiniteLossError, match="critic 'critic_b'"):
        trainer.train_step(step.with_fields(returns=returns), critic_id)
    assert all(torch.equal(a, b) for a, b in zip(heads.parameters(), before, strict=True))
    assert trainer.optimizers["critic_a"].state == {}


def test_critics_take_the_trainers_sizes_and_the_value_pass_runs_in_its_chunks(tiny_model_path):
    """critic.micro_batch_size null -> the trainer's micro-batch; the no-grad value pass runs
    in forwards of the trainer's logprob_micro_batch_size rows of one critic (before: 8-row
    forwards, 60 of them a step on the TicTacToe recipe), with the same values as row by row."""
    import roll.multi_agent.critics as critics_module
    from roll.multi_agent.config import CriticConfig, TrainerConfig
    from roll.multi_agent.critics import Critics

    model, _, critics = _critic_team(tiny_model_path, ["critic_a", "critic_b"])
    trainer = TrainerConfig(micro_batch_size=5, logprob_micro_batch_size=4)
    held = Critics(CriticConfig(mode="per_agent"), model, critics, trainer=trainer)
    assert (held.trainer.micro_batch_size, held.trainer.forward_rows) == (5, 4)
    own = Critics(CriticConfig(mode="per_agent", micro_batch_size=3), model, critics,
                  trainer=trainer)
    assert (own.trainer.micro_batch_size, own.trainer.forward_rows) == (3, 4)
    alone = Critics(CriticConfig(mode="per_agent", micro_batch_size=3), model, critics)
    assert (alone.trainer.micro_batch_size, alone.trainer.forward_rows) == (3, 32)  # 4 x 8
    default = Critics(CriticConfig(mode="per_agent"), model, critics)  # TrainerConfig()'s
    assert (default.trainer.micro_batch_size, default.trainer.forward_rows) == (8, 32)

    with torch.no_grad():  # the heads start at 0: give the critics different values
        for param in held.heads.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(7)))
    batch = make_rows([0] * 11, seed=8)
    critic_id = torch.tensor([0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1])  # 7 rows of a, 4 of b
    sizes = []
    real = critics_module.critic_values

    def counted(model_, heads_, input_ids, *args, **kwargs):
        sizes.append(input_ids.shape[0])
        return real(model_, heads_, input_ids, *args, **kwargs)

    critics_module.critic_values = counted
    try:
        chunked = held.trainer.values(batch, critic_id)
        assert sizes == [4, 3, 4]  # critic_a's 7 rows in 4 + 3, critic_b's 4 in one
        held.trainer.forward_rows = 1
        row_by_row = held.trainer.values(batch, critic_id)
    finally:
        critics_module.critic_values = real
    assert len(sizes) == 3 + 11
    torch.testing.assert_close(chunked, row_by_row, rtol=0, atol=1e-5)
    assert chunked[batch.response_mask.bool()].abs().min() > 0
