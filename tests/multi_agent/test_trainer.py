"""Per-agent training (DESIGN.md invariant 1: isolation = independence)."""

from __future__ import annotations

import pytest
import torch

from roll.errors import NonFiniteLossError
from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
from roll.multi_agent.optim import RateFactor
from roll.multi_agent.plan import old_pass_agents, optimizer_steps
from roll.multi_agent.trainer import MultiAgentTrainer

from .helpers import make_rows, make_team

AGENTS = [
    AgentConfig("alice"),
    AgentConfig("bob", lora=LoRAConfig(rank=2, alpha=4, target_modules=["q_proj", "v_proj"])),
    AgentConfig("carol", optim=OptimConfig(lr=5e-3, weight_decay=0.1, max_grad_norm=0.05)),
]
TRAINER = TrainerConfig(micro_batch_size=3, ppo_epochs=2, kl_coef=0.05, entropy_coef=0.01)
STEP_AGENT_IDS = [
    [0, 1, 2, 2, 0, 1, 0, 2],
    [2, 2, 1, 0, 0, 1, 1],
    [1, 0, 2, 0, 2, 1, 0, 2, 1],
]


def _train(path, agents, steps):
    model, resolved = make_team(path, agents)
    trainer = MultiAgentTrainer(model, resolved, TRAINER)
    for batch in steps:
        trainer.train_step(batch)
    return model, trainer


def test_training_together_equals_independent_runs(tiny_model_path):
    steps = [make_rows(ids, seed=step) for step, ids in enumerate(STEP_AGENT_IDS)]
    team, _ = _train(tiny_model_path, AGENTS, steps)
    for index, agent in enumerate(AGENTS):
        own_steps = []
        for batch in steps:
            own = batch.select(batch.agent_id == index)
            own_steps.append(own.with_fields(agent_id=torch.zeros_like(own.agent_id)))
        alone, _ = _train(tiny_model_path, [agent], own_steps)
        together = team.export_adapter(agent.name)
        moved = 0.0
        for key, value in alone.export_adapter(agent.name).items():
            torch.testing.assert_close(together[key], value, rtol=0, atol=1e-6)
            moved = max(moved, float(value.abs().max()))
        # The adapters really trained (LoRA B starts at zero).
        assert moved > 0
        b_keys = [k for k in together if "lora_B" in k]
        assert any(together[k].abs().max() > 1e-4 for k in b_keys)


def test_agent_without_rows_keeps_weights_and_optimizer_state_bitwise(tiny_model_path):
    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    model, resolved = make_team(tiny_model_path, AGENTS[:2] + [AgentConfig("carol")], optim=optim)
    trainer = MultiAgentTrainer(model, resolved, TRAINER)
    trainer.train_step(make_rows([0, 1, 2, 1, 0, 2], seed=1))  # everyone has optimizer state
    weights = {k: v.clone() for k, v in model.export_adapter("bob").items()}
    state = trainer.optimizers["bob"].state_dict()
    saved_state = {
        i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
        for i, s in state["state"].items()
    }
    lr_before = trainer.schedulers["bob"].get_last_lr()
    others = {k: v.clone() for k, v in model.export_adapter("alice").items()}

    metrics = trainer.train_step(make_rows([0, 2, 0, 2, 2], seed=2))  # no row for bob

    assert "bob" not in metrics and set(metrics) == {"alice", "carol"}
    for key, value in model.export_adapter("bob").items():
        assert torch.equal(value, weights[key]), key
    after = trainer.optimizers["bob"].state_dict()["state"]
    for i, entry in saved_state.items():
        for k, v in entry.items():
            assert torch.equal(after[i][k], v) if torch.is_tensor(v) else after[i][k] == v
    assert trainer.schedulers["bob"].get_last_lr() == lr_before
    # Alice did train in that step, so the test can tell a frozen agent from a dead trainer.
    assert any(not torch.equal(v, others[k]) for k, v in model.export_adapter("alice").items())


def test_gradient_accumulation_equals_one_big_batch(tiny_model_path):
    batch = make_rows([0] * 7, seed=5)
    results = []
    for micro in (1, 3, 7):
        model, resolved = make_team(tiny_model_path, [AgentConfig("alice")])
        trainer = MultiAgentTrainer(
            model, resolved, TrainerConfig(micro_batch_size=micro, kl_coef=0.1)
        )
        trainer.train_step(batch)
        results.append(model.export_adapter("alice"))
    for other in results[1:]:
        for key, value in other.items():
            torch.testing.assert_close(value, results[0][key], rtol=0, atol=1e-6)


def test_nan_loss_is_refused_naming_the_agent(tiny_model_path):
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig())
    batch = make_rows([0, 1, 1], seed=3)
    advantages = batch.advantages.clone()
    advantages[1, 5:] = float("nan")
    advantages[1] *= batch.response_mask[1]  # NaN survives the mask multiply only where 1
    advantages[1, 6] = float("nan")
    batch = batch.with_fields(advantages=advantages)
    before = {k: v.clone() for k, v in model.export_adapter("bob").items()}
    with pytest.raises(NonFiniteLossError, match="agent 'bob'.*step 0"):
        trainer.train_step(batch)
    for key, value in model.export_adapter("bob").items():
        assert torch.equal(value, before[key])


def test_metrics_per_agent(tiny_model_path):
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(kl_coef=0.1))
    batch = make_rows([0, 1, 1, 1], seed=4)
    metrics = trainer.train_step(batch)
    assert metrics["alice"]["num_rows"] == 1 and metrics["bob"]["num_rows"] == 3
    assert metrics["bob"]["num_tokens"] == float(batch.response_mask[1:].sum())
    for name in ("policy_loss", "kl_ref", "clip_frac", "grad_norm", "entropy", "lr",
                 "reward_mean", "advantage_mean"):
        assert name in metrics["bob"], name
    # On-policy first step: ratio is 1, nothing clipped, KL to the reference is 0 (B = 0).
    assert metrics["bob"]["clip_frac"] == 0.0
    assert metrics["bob"]["kl_ref"] == pytest.approx(0.0, abs=1e-7)
    assert metrics["bob"]["reward_mean"] == pytest.approx(float(batch.rewards[1:].mean()))


def test_lr_schedules_count_each_agents_own_steps():
    warm_cosine = OptimConfig(lr=1.0, lr_scheduler="cosine", warmup_steps=2, total_steps=6)
    factor = RateFactor(warm_cosine)
    # warm-up 1/2, 2/2; then cosine over 4 steps: 0.5*(1+cos(pi*k/4)), k = 0..4
    expected = [0.5, 1.0, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0, 0.0]
    assert [factor(s) for s in range(8)] == pytest.approx(expected)
    linear = RateFactor(OptimConfig(lr=1.0, lr_scheduler="linear", total_steps=4))
    assert [linear(s) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0])


def _poison(batch, row):
    advantages = batch.advantages.clone()
    advantages[row] = torch.where(batch.response_mask[row] > 0, float("nan"), 0.0)
    return batch.with_fields(advantages=advantages)


def _state(model, trainer, name):
    optimizer = trainer.optimizers[name].state_dict()["state"]
    return (
        {k: v.clone() for k, v in model.export_adapter(name).items()},
        {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.items()},
        trainer.schedulers[name].last_epoch,
    )


def _assert_same_state(before, after):
    weights, optimizer, last_epoch = before
    for key, value in after[0].items():
        assert torch.equal(value, weights[key]), key
    assert after[1].keys() == optimizer.keys()
    for i, entry in optimizer.items():
        for k, v in entry.items():
            assert torch.equal(after[1][i][k], v)
    assert after[2] == last_epoch


def test_nan_in_one_agent_leaves_every_agent_untouched(tiny_model_path):
    """Agents are checked before any of them steps: alice (id 0, fine) is not updated when
    bob (id 1) has a NaN loss in the same step."""
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig())
    trainer.train_step(make_rows([0, 1, 0, 1], seed=1))  # both have optimizer state
    before = {name: _state(model, trainer, name) for name in ("alice", "bob")}
    with pytest.raises(NonFiniteLossError, match="agent 'bob'.*no agent was updated"):
        trainer.train_step(_poison(make_rows([0, 1, 0, 1], seed=2), 3))
    for name in ("alice", "bob"):
        _assert_same_state(before[name], _state(model, trainer, name))
    assert trainer.global_step == 1


def test_nan_in_a_later_mini_batch_restores_the_steps_already_taken(tiny_model_path):
    """With mini-batches, round 1 steps every agent before bob's NaN shows up in round 2: the
    whole train step is rolled back (weights, AdamW moments, schedules)."""
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice"), AgentConfig("bob")])
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(ppo_mini_batch_size=1))
    trainer.train_step(make_rows([0, 1, 0, 1], seed=1))
    before = {name: _state(model, trainer, name) for name in ("alice", "bob")}
    batch = make_rows([0, 1, 0, 1, 1, 0], seed=3)
    bob_rows = (batch.agent_id == 1).nonzero().squeeze(-1)
    second = int(trainer._mini_batches("bob", len(bob_rows))[1])  # bob's round-2 row
    with pytest.raises(NonFiniteLossError, match=r"agent 'bob'.*round 2 of 3"):
        trainer.train_step(_poison(batch, int(bob_rows[second])))
    for name in ("alice", "bob"):
        _assert_same_state(before[name], _state(model, trainer, name))


@pytest.mark.parametrize("fused", [True, False])
def test_every_agent_trains_after_peft_switched_adapters(tiny_model_path, fused):
    """PEFT's own set_adapter / disable_adapter (the engine sharing the model turns adapters off
    to generate) leave only the active adapter trainable; every agent must still get its
    gradient (seen: one of two agents never learned in the pipeline)."""
    model, resolved = make_team(tiny_model_path, AGENTS)
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(micro_batch_size=8, fused=fused))
    model.set_active_agent("alice")
    with model.peft_model.disable_adapter():
        pass
    model.peft_model.set_adapter("carol")
    before = {agent.name: model.export_adapter(agent.name) for agent in AGENTS}
    metrics = trainer.train_step(make_rows([0, 1, 2, 0, 1, 2], seed=3))
    for agent in AGENTS:
        assert metrics[agent.name]["grad_norm"] > 0, agent.name
        after = model.export_adapter(agent.name)
        assert any(not torch.equal(after[k], v) for k, v in before[agent.name].items()), agent.name


def test_entropy_is_measured_without_an_entropy_bonus(tiny_model_path):
    """``<agent>/entropy`` is the policy's token-mean entropy at the sampling temperature even
    when entropy_coef = 0 (it read 0.0 before, which a dashboard shows as collapse); computed
    here by hand from the full logits. LoRA B starts at 0, so the policy is the base model."""
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice")])
    batch = make_rows([0, 0, 0], seed=4)
    temperature = 0.7
    with torch.no_grad(), model.reference():
        logits = model.base_model(input_ids=batch.input_ids,
                                  attention_mask=batch.attention_mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)  # predicts tokens 1..T-1
    entropy = -(logp.exp() * logp).sum(-1)  # (B, T-1)
    mask = batch.response_mask[:, 1:]
    by_hand = float((entropy * mask).sum() / mask.sum())
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(micro_batch_size=2), temperature)
    assert trainer.config.entropy_coef == 0
    metrics = trainer.train_step(batch)["alice"]
    assert by_hand > 1.0  # far from 0: the check below can fail
    assert metrics["entropy"] == pytest.approx(by_hand, rel=1e-5)


def test_sgd_steps_by_hand():
    """team.optim.name=sgd: p <- p - lr * (g + momentum buffer); two steps at momentum 0.5,
    weight decay 0.1 (added to the gradient, torch's SGD), worked out by hand."""
    from roll.multi_agent.optim import build_optimizer

    param = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = build_optimizer([param], OptimConfig(name="sgd", lr=0.1, momentum=0.5,
                                                     weight_decay=0.1))
    assert isinstance(optimizer, torch.optim.SGD)
    for grad in ([1.0, 1.0], [0.0, 2.0]):
        param.grad = torch.tensor(grad)
        optimizer.step()
    # step 1: g = (1 + 0.1, 1 - 0.2) = (1.1, 0.8); buffer = g; p = (0.89, -2.08)
    # step 2: g = (0.089, 2 - 0.208) = (0.089, 1.792); buffer = 0.5 * (1.1, 0.8) + g
    #         = (0.639, 2.192); p = (0.89 - 0.0639, -2.08 - 0.2192)
    assert param.tolist() == pytest.approx([0.8261, -2.2992])


def test_policy_over_moves_with_no_decision_in_the_batch_moves_nothing(tiny_model_path):
    """trainer.policy_over=moves on rows without a branching point (every legal answer forced,
    so the batch carries no choice_tokens): nothing to learn, the step runs and no adapter
    moves (it used to fail on the missing choice logits)."""
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice")])
    batch = make_rows([0, 0, 0], seed=5)
    assert batch.choice_tokens is None
    before = model.export_adapter("alice")
    trainer = MultiAgentTrainer(model, resolved, TrainerConfig(micro_batch_size=2,
                                                               policy_over="moves"))
    metrics = trainer.train_step(batch)["alice"]
    assert metrics["policy_loss"] == 0.0
    after = model.export_adapter("alice")
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_mini_batches_are_balanced_and_cover_every_row_once_per_epoch(tiny_model_path):
    """10 rows at most 4 per optimizer step: 3 mini-batches of 4, 3, 3 rows (not 4, 4, 2: a
    two-row step would be as large an Adam step on far noisier gradients)."""
    model, resolved = make_team(tiny_model_path, [AgentConfig("alice")])
    trainer = MultiAgentTrainer(model, resolved,
                                TrainerConfig(ppo_mini_batch_size=4, ppo_epochs=2))
    minis = trainer._mini_batches("alice", 10)
    assert [len(m) for m in minis] == [4, 3, 3, 4, 3, 3]
    for epoch in (minis[:3], minis[3:]):
        assert sorted(torch.cat(epoch).tolist()) == list(range(10))
    assert [len(m) for m in trainer._mini_batches("alice", 8)] == [4, 4, 4, 4]


def test_old_pass_agents_by_hand():
    # mini-batches of 4: 10 rows -> ceil(10 / 4) = 3 a pass; no size -> one; 0 rows -> none
    assert optimizer_steps(10, 4, 1) == 3 and optimizer_steps(10, None, 2) == 2
    assert optimizer_steps(4, 4, 3) == 3 and optimizer_steps(0, 4, 1) == 0
    rows = {"alice": 3, "bob": 6, "carol": 0}
    no_dropout = {"alice": 0.0, "bob": 0.0, "carol": 0.0}
    one_step = TrainerConfig(ppo_mini_batch_size=8)
    assert old_pass_agents(one_step, rows, no_dropout) == set()
    assert old_pass_agents(TrainerConfig(ppo_mini_batch_size=4), rows, no_dropout) == {"bob"}
    assert old_pass_agents(TrainerConfig(ppo_epochs=2), rows, no_dropout) == {"alice", "bob"}
    # dropout: the no-grad pass runs without it, the training forward with it
    assert old_pass_agents(one_step, rows, {**no_dropout, "alice": 0.1}) == {"alice"}
    always = TrainerConfig(ppo_mini_batch_size=8, old_logprob_pass="always")
    assert old_pass_agents(always, rows, no_dropout) == {"alice", "bob"}  # carol: no rows


def test_an_agent_taking_one_optimizer_step_reads_its_forwards_own_old_logprobs(
        tiny_model_path):
    """``old_logprob_pass='auto'``: alice (3 rows, one mini-batch of <= 4) skips the no-grad
    pass, bob (6 rows: two) gets it for his rows alone; the update equals the one with the
    pass for every row (SGD at rate 1: the adapters' change is the gradient), and alice's is
    what she gets training alone."""
    agents = [AgentConfig("alice"), AgentConfig("bob")]
    batch = make_rows([0, 1, 1, 0, 1, 1, 0, 1, 1], seed=11)
    sgd = OptimConfig(name="sgd", lr=1.0)
    adapters, passes = {}, {}
    for mode, ids in (("always", None), ("auto", None), ("alone", [0, 3, 6])):
        model, resolved = make_team(tiny_model_path, agents, optim=sgd)
        config = TrainerConfig(micro_batch_size=4, ppo_mini_batch_size=4, kl_coef=0.0,
                               old_logprob_pass="always" if mode == "always" else "auto")
        trainer = MultiAgentTrainer(model, resolved, config)
        passed: list[int] = []

        def counted(input_ids, *args, _forward=model.logprobs, _passed=passed, **kwargs):
            _passed.append(len(input_ids))  # rows through the no-grad old-log-prob pass
            return _forward(input_ids, *args, **kwargs)

        model.logprobs = counted
        rows = batch if ids is None else batch.select(torch.tensor(ids))
        trainer.train_step(rows)
        passes[mode] = (sum(passed), trainer.own_old)
        adapters[mode] = {name: model.export_adapter(name) for name in model.agent_names}
    assert passes["always"] == (9, set())  # every row through the no-grad pass
    assert passes["auto"] == (6, {"alice"})  # bob's rows alone
    assert passes["alone"] == (0, {"alice"})
    for name in ("alice", "bob"):
        for key, value in adapters["always"][name].items():
            torch.testing.assert_close(adapters["auto"][name][key], value, rtol=0, atol=1e-6)
    for key, value in adapters["auto"]["alice"].items():
        torch.testing.assert_close(adapters["alone"]["alice"][key], value, rtol=0, atol=1e-6)
    assert any(float((adapters["auto"]["alice"][key] - value).abs().max()) > 1e-3
               for key, value in make_team(tiny_model_path, agents, optim=sgd)[0]
               .export_adapter("alice").items())  # alice did move
