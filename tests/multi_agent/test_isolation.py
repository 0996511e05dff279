"""Invariant 1 beyond the basics: any agent name, LoRA dropout on, PPO mini-batches.

Training N agents together must give each adapter what an independent run on its own rows
gives (fp32, 1e-6), whatever the names, with dropout, with several optimizer steps per train
step; an agent's tensors are exactly its own.
"""

from __future__ import annotations

import pytest
import torch
from peft.utils import get_peft_model_state_dict

from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
from roll.multi_agent.logprobs import behaviour_logprobs
from roll.multi_agent.trainer import METRIC_PARTS, MultiAgentTrainer

from .helpers import make_rows, make_team

STEP_AGENT_IDS = [[0, 1, 2, 2, 0, 1, 0, 2, 1, 0], [2, 2, 1, 0, 0, 1, 1, 2]]


def _train(path, agents, steps, trainer_config):
    model, resolved = make_team(path, agents)
    trainer = MultiAgentTrainer(model, resolved, trainer_config)
    for batch in steps:
        trainer.train_step(batch)
    return model, trainer


def _own_rows(batch, index):
    own = batch.select(batch.agent_id == index)
    return own.with_fields(agent_id=torch.zeros_like(own.agent_id))


def _assert_together_equals_alone(path, agents, trainer_config):
    steps = [make_rows(ids, seed=step) for step, ids in enumerate(STEP_AGENT_IDS)]
    team, _ = _train(path, agents, steps, trainer_config)
    for index, agent in enumerate(agents):
        alone, _ = _train(path, [agent], [_own_rows(b, index) for b in steps], trainer_config)
        together = team.export_adapter(agent.name)
        reference = alone.export_adapter(agent.name)
        assert set(together) == set(reference)
        for key, value in reference.items():
            torch.testing.assert_close(together[key], value, rtol=0, atol=1e-6)
        assert any(v.abs().max() > 1e-4 for k, v in together.items() if "lora_B" in k)


# Names that are substrings of PEFT parameter paths: the old substring selection gave agent
# 'model' every agent's tensors.
PATH_NAMES = ["model", "layers", "q_proj"]


def test_agent_tensors_are_disjoint_and_complete_for_path_like_names(tiny_model_path):
    agents = [AgentConfig(name) for name in PATH_NAMES + ["weight", "mlp"]]
    team, _ = make_team(tiny_model_path, agents)
    owned = {name: {id(p) for p in team.agent_parameters(name)} for name in team.agent_names}
    all_lora = {id(p) for n, p in team.peft_model.named_parameters() if "lora_" in n}
    for name, ids in owned.items():
        assert len(ids) == 2 * 7 * 2, name  # A and B of 7 projections in 2 layers
        for other, other_ids in owned.items():
            assert other == name or not ids & other_ids, (name, other)
    assert set().union(*owned.values()) == all_lora


def test_export_matches_peft_own_state_dict_keys_and_values(tiny_model_path):
    team, _ = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    ours = team.export_adapter("bob")
    theirs = get_peft_model_state_dict(team.peft_model, adapter_name="bob")
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value.cpu())


@pytest.mark.parametrize("fused", [True, False])
def test_training_together_equals_alone_for_path_like_names(tiny_model_path, fused):
    agents = [AgentConfig(name) for name in PATH_NAMES]
    _assert_together_equals_alone(
        tiny_model_path, agents, TrainerConfig(micro_batch_size=3, kl_coef=0.05, fused=fused)
    )


def test_idle_path_like_agent_export_does_not_move(tiny_model_path):
    team, resolved = make_team(tiny_model_path, [AgentConfig("model"), AgentConfig("layers")])
    trainer = MultiAgentTrainer(team, resolved, TrainerConfig())
    before = team.export_adapter("layers")
    trainer.train_step(make_rows([0, 0, 0], seed=3))  # only 'model' has rows
    for key, value in team.export_adapter("layers").items():
        assert torch.equal(value, before[key]), key


DROPOUT = LoRAConfig(rank=4, alpha=8, dropout=0.3)


@pytest.mark.parametrize("fused", [True, False])
def test_training_together_equals_alone_with_lora_dropout(tiny_model_path, fused):
    agents = [
        AgentConfig("alice", lora=DROPOUT),
        AgentConfig("bob", lora=LoRAConfig(rank=2, alpha=4, dropout=0.5,
                                           target_modules=["q_proj", "v_proj"])),
        AgentConfig("carol", lora=DROPOUT, optim=OptimConfig(lr=5e-3, weight_decay=0.1)),
    ]
    _assert_together_equals_alone(tiny_model_path, agents,
                                  TrainerConfig(micro_batch_size=3, fused=fused))


@pytest.mark.parametrize("fused", [True, False])
def test_training_together_equals_alone_with_mini_batches_and_dropout(tiny_model_path, fused):
    agents = [AgentConfig("alice", lora=DROPOUT), AgentConfig("bob"), AgentConfig("carol")]
    config = TrainerConfig(micro_batch_size=2, ppo_mini_batch_size=2, ppo_epochs=2,
                           kl_coef=0.05, entropy_coef=0.01, fused=fused)
    _assert_together_equals_alone(tiny_model_path, agents, config)


def test_dropout_really_draws_masks_in_training(tiny_model_path):
    """Same rows, same init: dropout 0.5 moves the adapter differently than dropout 0, and
    two runs with dropout agree (seeded masks)."""
    rows = make_rows([0, 0, 0, 0], seed=7)
    exports = []
    for dropout in (0.0, 0.5, 0.5):
        lora = LoRAConfig(rank=4, alpha=8, dropout=dropout)
        model, _ = _train(tiny_model_path, [AgentConfig("alice", lora=lora)], [rows],
                          TrainerConfig())
        exports.append(model.export_adapter("alice"))
    key = next(k for k in exports[0] if "lora_B" in k)  # B moves in step 1 (A's grad is 0)
    assert not torch.equal(exports[0][key], exports[1][key])
    for k, value in exports[1].items():
        assert torch.equal(value, exports[2][k])


def test_dropout_is_off_outside_the_training_forward(tiny_model_path):
    """Rollout, old-log-prob and reference passes never see dropout: right after construction
    (a resumed run's first pass) and after a train step, two passes agree bitwise."""
    agents = [AgentConfig("alice", lora=LoRAConfig(rank=4, alpha=8, dropout=0.5))]
    model, resolved = make_team(tiny_model_path, agents)
    with torch.no_grad():
        for param in model.agent_parameters("alice"):
            param.add_(torch.randn(param.shape) * 0.3)  # non-zero B: dropout would show
    rows = make_rows([0, 0, 0], seed=1)
    first = model.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    assert torch.equal(first, model.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id))
    MultiAgentTrainer(model, resolved, TrainerConfig()).train_step(rows)
    after = model.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id)
    assert torch.equal(after, model.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id))
    assert not model.peft_model.training


@pytest.mark.parametrize("size, epochs, rows, expected_steps", [(2, 2, 5, 6), (None, 3, 5, 3),
                                                                (8, 1, 5, 1)])
def test_each_mini_batch_is_one_optimizer_step(tiny_model_path, size, epochs, rows,
                                               expected_steps):
    # ceil(5 / 2) = 3 mini-batches per epoch x 2 epochs = 6; no size: one per epoch = 3;
    # a size above the row count: one mini-batch.
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice")])
    config = TrainerConfig(ppo_mini_batch_size=size, ppo_epochs=epochs)
    trainer = MultiAgentTrainer(model, resolved, config)
    metrics = trainer.train_step(make_rows([0] * rows, seed=2))
    assert metrics["alice"]["optimizer_steps"] == expected_steps
    assert trainer.optimizers["alice"].state_dict()["state"][0]["step"] == expected_steps
    assert trainer.schedulers["alice"].last_epoch == 1  # the schedule counts train steps


def test_a_linear_schedule_ends_at_total_steps_train_steps_whatever_the_mini_batches(
        tiny_model_path):
    """total_steps 4 at lr 0.01, 3 mini-batches per train step: after train step 1 the rate is
    0.01 x (1 - 1/4) = 0.0075 and after step 4 it is 0 (counted in optimizer steps the decay
    would have ended inside the second train step)."""
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice")],
                                optim=OptimConfig(lr=0.01, lr_scheduler="linear",
                                                  total_steps=4))
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(ppo_mini_batch_size=2))
    rates = []
    for step in range(4):
        metrics = trainer.train_step(make_rows([0] * 5, seed=step))
        assert metrics["alice"]["optimizer_steps"] == 3
        rates.append(metrics["alice"]["lr"])
    assert rates == pytest.approx([0.0075, 0.005, 0.0025, 0.0])


def test_mini_batches_make_the_ratio_move_so_clipping_binds(tiny_model_path):
    """With several optimizer steps per rollout the later mini-batches see ratio != 1: PPO's
    clip binds and approx_kl > 0 (with one full-batch step both are exactly 0)."""
    rows = make_rows([0] * 8, seed=4)
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice")],
                                optim=OptimConfig(lr=5e-2))
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(ppo_mini_batch_size=2,
                                                               ppo_epochs=2, clip_low=0.05,
                                                               clip_high=0.05))
    metrics = trainer.train_step(rows)["alice"]
    assert metrics["clip_frac"] > 0.0
    assert metrics["approx_kl"] > 0.0
    single, resolved = make_team(tiny_model_path, [AgentConfig("alice")],
                                 optim=OptimConfig(lr=5e-2))
    one_step = MultiAgentTrainer(single, resolved, TrainerConfig()).train_step(rows)["alice"]
    assert one_step["clip_frac"] == 0.0 and one_step["approx_kl"] == pytest.approx(0, abs=1e-9)


def _round_gradients(path, fused, batch):
    """Every agent's gradient after one round (one mini-batch each), before any step."""
    agents = [
        AgentConfig("alice", lora=DROPOUT),
        AgentConfig("bob", lora=LoRAConfig(rank=2, alpha=4, target_modules=["q_proj", "v_proj"])),
        AgentConfig("carol"),
    ]
    model, resolved = make_team(path, agents)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # non-zero B so that A gets a gradient too
        for name in model.agent_names:
            for param in model.agent_parameters(name):
                param.add_(torch.randn(param.shape, generator=gen) * 0.1)
    config = TrainerConfig(micro_batch_size=2, kl_coef=0.05, entropy_coef=0.01, fused=fused)
    trainer = MultiAgentTrainer(model, resolved, config)
    batch = behaviour_logprobs(model, batch, trainer.temperature, config.forward_rows,
                               reference=config.kl_coef > 0)
    minis = {name: (batch.agent_id == i).nonzero().squeeze(-1)
             for i, name in enumerate(model.agent_names)}
    trainer._backward(batch, minis, {name: dict.fromkeys(METRIC_PARTS, 0.0) for name in minis})
    return {name: [p.grad.clone() for p in model.agent_parameters(name)]
            for name in model.agent_names}


def test_fused_gradients_equal_the_sequential_path_with_uneven_rows(tiny_model_path):
    """One mixed forward/backward per micro-batch gives every agent the gradient the
    per-agent reference path gives (alice 5 rows, bob 1, carol 3: uneven micro-batch counts)."""
    batch = make_rows([0, 2, 0, 0, 1, 2, 0, 2, 0], seed=11)
    fused = _round_gradients(tiny_model_path, True, batch)
    sequential = _round_gradients(tiny_model_path, False, batch)
    for name, grads in sequential.items():
        assert any(g.abs().max() > 1e-4 for g in grads), name
        for got, want in zip(fused[name], grads, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_fused_packs_agents_into_forwards_of_at_most_micro_batch_size_rows(tiny_model_path):
    agents = [AgentConfig("alice"), AgentConfig("bob"), AgentConfig("carol")]
    seen = []
    for fused in (True, False):
        model, resolved = make_team(tiny_model_path, agents)
        handle = model.base_model.lm_head.register_forward_hook(
            lambda module, args, out, fused=fused: seen.append(
                (fused, torch.is_grad_enabled(), args[0].shape[0]))
        )
        MultiAgentTrainer(model, resolved, TrainerConfig(micro_batch_size=2, fused=fused)
                          ).train_step(make_rows([0, 1, 2, 0, 1, 0], seed=3))
        handle.remove()
    # alice 3 rows -> micro-batches of 2 and 1, bob 2 -> 2, carol 1 -> 1. Fused packs them in
    # order into forwards of <= 2 rows: [alice 2], [bob 2], [carol 1 + alice 1] = 3 forwards;
    # sequential 4. No forward ever holds more than micro_batch_size rows.
    grad_forwards = [(f, rows) for f, grad, rows in seen if grad]
    assert [rows for f, rows in grad_forwards if f] == [2, 2, 2]
    assert [rows for f, rows in grad_forwards if not f] == [2, 1, 2, 1]
