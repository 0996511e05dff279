"""Bad team configs fail with one error that names the field and the value."""

from __future__ import annotations

import pytest

from roll.multi_agent.config import (
    AgentConfig,
    ConfigError,
    LoRAConfig,
    MultiAgentConfig,
    OptimConfig,
    TrainerConfig,
)

MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

BAD_CONFIGS = [
    (lambda: MultiAgentConfig(num_agents=0), "num_agents", "0"),
    (lambda: MultiAgentConfig(num_agents=-2), "num_agents", "-2"),
    (lambda: MultiAgentConfig(lora=LoRAConfig(rank=0)), "lora.rank", "0"),
    (lambda: MultiAgentConfig(lora=LoRAConfig(alpha=-1.0)), "lora.alpha", "-1.0"),
    (lambda: MultiAgentConfig(lora=LoRAConfig(dropout=1.5)), "lora.dropout", "1.5"),
    (
        lambda: MultiAgentConfig(lora=LoRAConfig(target_modules=["q_proj", "qkv"])),
        "lora.target_modules",
        "qkv",
    ),
    (
        lambda: MultiAgentConfig(
            num_agents=2, agents=[AgentConfig("alice"), AgentConfig("alice")]
        ),
        "agents[1].name",
        "alice",
    ),
    (
        lambda: MultiAgentConfig(num_agents=3, agents=[AgentConfig("a0"), AgentConfig("a1")]),
        "agents",
        "a1",
    ),
    (
        lambda: MultiAgentConfig(
            num_agents=2,
            agents=[AgentConfig("a0"), AgentConfig("a1", lora=LoRAConfig(rank=-4))],
        ),
        "agents[1].lora.rank",
        "-4",
    ),
    (
        lambda: MultiAgentConfig(
            num_agents=1, agents=[AgentConfig("a0", lora=LoRAConfig(target_modules=["mlp"]))]
        ),
        "agents[0].lora.target_modules",
        "mlp",
    ),
    (lambda: MultiAgentConfig(num_agents=1, agents=[AgentConfig("has space")]), "agents[0].name",
     "has space"),
    (lambda: MultiAgentConfig(num_agents=1, agents=[AgentConfig("default")]), "agents[0].name",
     "default"),
    (lambda: MultiAgentConfig(optim=OptimConfig(lr=-1e-4)), "optim.lr", "-0.0001"),
    (lambda: MultiAgentConfig(optim=OptimConfig(weight_decay=-0.1)), "optim.weight_decay", "-0.1"),
    (
        lambda: MultiAgentConfig(optim=OptimConfig(lr_scheduler="cosine", total_steps=0)),
        "optim.total_steps",
        "0",
    ),
    (lambda: MultiAgentConfig(optim=OptimConfig(lr_scheduler="exp")), "optim.lr_scheduler", "exp"),
]


@pytest.mark.parametrize("make, field_path, value", BAD_CONFIGS)
def test_bad_config_names_field_and_value(make, field_path, value):
    with pytest.raises(ConfigError) as info:
        make().validate(MODULES)
    message = str(info.value)
    assert f"{field_path}=" in message
    assert value in message
    assert info.value.field_path == field_path


BAD_TRAINER = [
    (TrainerConfig(micro_batch_size=0), "trainer.micro_batch_size"),
    (TrainerConfig(ppo_epochs=0), "trainer.ppo_epochs"),
    (TrainerConfig(clip_low=1.5), "trainer.clip_low"),
    (TrainerConfig(dual_clip=0.5), "trainer.dual_clip"),
    (TrainerConfig(kl_estimator="k2"), "trainer.kl_estimator"),
    (TrainerConfig(loss_agg_mode="sum"), "trainer.loss_agg_mode"),
]


@pytest.mark.parametrize("config, field_path", BAD_TRAINER)
def test_bad_trainer_config_names_field(config, field_path):
    with pytest.raises(ConfigError, match=rf"{field_path}="):
        config.validate()


def test_defaults_fill_agents_and_heterogeneous_agents_keep_their_own():
    team = MultiAgentConfig(num_agents=3).validate(MODULES)
    assert team.agent_names == ["agent_0", "agent_1", "agent_2"]
    custom = MultiAgentConfig(
        num_agents=2,
        lora=LoRAConfig(rank=8),
        agents=[AgentConfig("gen"), AgentConfig("critic", lora=LoRAConfig(rank=4, alpha=8))],
    ).validate(MODULES)
    resolved = custom.resolved_agents()
    assert [a.lora.rank for a in resolved] == [8, 4]
    assert resolved[1].lora.alpha == 8
    assert resolved[0].optim is custom.optim
