"""Bad team configs fail with one error that names the field and the value."""

from __future__ import annotations

import pytest

from roll.errors import ConfigError
from roll.multi_agent.config import (
    AgentConfig,
    LoRAConfig,
    MultiAgentConfig,
    OptimConfig,
    TrainerConfig,
)

MODULES = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}

BAD_CONFIGS = [
    (lambda: MultiAgentConfig(num_agents=0), "team.num_agents", "0"),
    (lambda: MultiAgentConfig(num_agents=-2), "team.num_agents", "-2"),
    (lambda: MultiAgentConfig(num_agents=10**9), "team.num_agents", "1000000000"),
    (lambda: MultiAgentConfig(lora=LoRAConfig(rank=0)), "team.lora.rank", "0"),
    (lambda: MultiAgentConfig(lora=LoRAConfig(alpha=-1.0)), "team.lora.alpha", "-1.0"),
    (lambda: MultiAgentConfig(lora=LoRAConfig(dropout=1.5)), "team.lora.dropout", "1.5"),
    (
        lambda: MultiAgentConfig(lora=LoRAConfig(target_modules=["q_proj", "qkv"])),
        "team.lora.target_modules",
        "qkv",
    ),
    (
        lambda: MultiAgentConfig(
            num_agents=2, agents=[AgentConfig("alice"), AgentConfig("alice")]
        ),
        "team.agents[1].name",
        "alice",
    ),
    (
        lambda: MultiAgentConfig(num_agents=3, agents=[AgentConfig("a0"), AgentConfig("a1")]),
        "team.agents",
        "a1",
    ),
    (
        lambda: MultiAgentConfig(
            num_agents=2,
            agents=[AgentConfig("a0"), AgentConfig("a1", lora=LoRAConfig(rank=-4))],
        ),
        "team.agents[1].lora.rank",
        "-4",
    ),
    (
        lambda: MultiAgentConfig(
            num_agents=1, agents=[AgentConfig("a0", lora=LoRAConfig(target_modules=["mlp"]))]
        ),
        "team.agents[0].lora.target_modules",
        "mlp",
    ),
    (lambda: MultiAgentConfig(num_agents=1, agents=[AgentConfig("has space")]),
     "team.agents[0].name", "has space"),
    # PEFT keeps adapters in ModuleDicts: a name that is a ModuleDict attribute cannot be held.
    (lambda: MultiAgentConfig(num_agents=1, agents=[AgentConfig("update")]), "team.agents[0].name",
     "update"),
    (lambda: MultiAgentConfig(num_agents=1, agents=[AgentConfig("train")]), "team.agents[0].name",
     "train"),
    (lambda: MultiAgentConfig(optim=OptimConfig(lr=-1e-4)), "team.optim.lr", "-0.0001"),
    (lambda: MultiAgentConfig(optim=OptimConfig(weight_decay=-0.1)), "team.optim.weight_decay",
     "-0.1"),
    (
        lambda: MultiAgentConfig(optim=OptimConfig(lr_scheduler="cosine", total_steps=0)),
        "team.optim.total_steps",
        "0",
    ),
    (lambda: MultiAgentConfig(optim=OptimConfig(lr_scheduler="exp")), "team.optim.lr_scheduler",
     "exp"),
    (lambda: MultiAgentConfig(optim=OptimConfig(name="adam")), "team.optim.name", "adam"),
    (lambda: MultiAgentConfig(optim=OptimConfig(name="sgd", momentum=1.0)),
     "team.optim.momentum", "1.0"),
    # A momentum AdamW would ignore: a setting that does nothing is refused.
    (lambda: MultiAgentConfig(optim=OptimConfig(momentum=0.9)), "team.optim.momentum", "0.9"),
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
    (TrainerConfig(kl_estimator="k4"), "trainer.kl_estimator"),
    (TrainerConfig(kl_coef=0.1, kl_estimator="k1"), "trainer.kl_estimator"),
    (TrainerConfig(ppo_mini_batch_size=0), "trainer.ppo_mini_batch_size"),
    (TrainerConfig(logprob_micro_batch_size=0), "trainer.logprob_micro_batch_size"),
    (TrainerConfig(loss_agg_mode="sum"), "trainer.loss_agg_mode"),
    (TrainerConfig(policy_over="actions"), "trainer.policy_over"),
    (TrainerConfig(old_logprob_pass="never"), "trainer.old_logprob_pass"),
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


def test_k1_as_a_loss_is_refused_with_the_reason():
    with pytest.raises(ConfigError, match="expectation under the policy's own samples is 0"):
        TrainerConfig(kl_coef=0.1, kl_estimator="k1").validate()
    assert TrainerConfig(kl_coef=0.1, kl_estimator="k2").validate().kl_estimator == "k2"


@pytest.mark.parametrize("name", ["model", "layers", "mlp", "weight", "q_proj", "lora", "default",
                                  "lora_A", "base_model"])
def test_names_peft_can_hold_are_accepted(name):
    team = MultiAgentConfig(num_agents=2, agents=[AgentConfig(name), AgentConfig("other")])
    assert team.validate(MODULES).agent_names == [name, "other"]


def test_no_grad_passes_default_to_four_micro_batches():
    assert TrainerConfig(micro_batch_size=3).forward_rows == 12
    assert TrainerConfig(micro_batch_size=3, logprob_micro_batch_size=5).forward_rows == 5
