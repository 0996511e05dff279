"""Critics in the pipeline (critic.mode): checkpoint folders, bit-exact resume, refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from roll.agentic.env.renderers import RenderedPrompt
from roll.algorithms.advantages import AdvantageConfig
from roll.errors import ConfigError
from roll.multi_agent.config import (
    CriticConfig,
    LoRAConfig,
    MultiAgentConfig,
    OptimConfig,
    TrainerConfig,
)
from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.config import (
    EnvSchema,
    EvalSchema,
    PipelineConfig,
    RolloutSchema,
    SamplingSchema,
)
from roll.pipeline.validation import validate_config
from roll.utils.checkpoint import critic_dir, load_trainer_state, step_dir_name
from roll.utils.tracking import TrackingConfig

from .test_learning import PROMPT, PickSideEnv


def _config(out, mode="per_agent", estimator="ippo", **overrides) -> PipelineConfig:
    cfg = PipelineConfig(
        team=MultiAgentConfig(num_agents=2, lora=LoRAConfig(rank=4, alpha=8),
                              optim=OptimConfig(lr=1e-2)),
        trainer=TrainerConfig(micro_batch_size=8),
        advantage=AdvantageConfig(estimator=estimator),
        critic=CriticConfig(mode=mode, lora=LoRAConfig(rank=4, alpha=8, dropout=0.1),
                            optim=OptimConfig(lr=1e-2), micro_batch_size=4),
        env=EnvSchema(game="tic_tac_toe", seat_to_agent=["agent_0", "agent_1"]),
        rollout=RolloutSchema(num_groups=2, group_size=3,
                              sampling=SamplingSchema(max_new_tokens=6)),
        eval=EvalSchema(eval_steps=0),
        tracking=TrackingConfig(backends=["jsonl"]),
        output_dir=str(out),
        max_steps=3,
        save_steps=1,
    )
    return validate_config(replace(cfg, **overrides))


def _pipeline(cfg: PipelineConfig) -> AgenticPipeline:
    return AgenticPipeline(cfg, env_factory=PickSideEnv,
                           render=lambda env, seat: RenderedPrompt(PROMPT, False))


def _critic_files(checkpoint) -> dict[str, torch.Tensor]:
    tensors = {}
    for name in ("critic_agent_0", "critic_agent_1"):
        folder = critic_dir(checkpoint, name)
        for file in ("adapter_model.safetensors", "value_head.safetensors"):
            for key, value in load_file(str(folder / file)).items():
                tensors[f"{name}/{file}/{key}"] = value
    return tensors


def _equal_states(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal_states(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_equal_states(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


def test_critics_checkpoint_and_resume_bit_exactly(tmp_path):
    """3 steps straight == 1 step, then a fresh pipeline resumed from its checkpoint for 2 more:
    every critic's adapter, value head, optimizer and schedule bitwise equal (LoRA dropout on
    in the critics, so their dropout streams must resume too)."""
    straight = _pipeline(_config(tmp_path / "straight"))
    metrics = straight.run()
    for name in ("critic_agent_0", "critic_agent_1"):
        assert metrics[f"critic/{name}/num_rows"] > 0
        assert metrics[f"critic/{name}/grad_norm"] > 0
    assert "critic/explained_variance" in metrics and metrics["time/critic"] > 0

    _pipeline(_config(tmp_path / "resumed", max_steps=1)).run()
    first = tmp_path / "resumed" / "checkpoints" / step_dir_name(1)
    _pipeline(_config(tmp_path / "resumed", resume=str(first))).run()

    want = tmp_path / "straight" / "checkpoints" / step_dir_name(3)
    got = tmp_path / "resumed" / "checkpoints" / step_dir_name(3)
    want_tensors, got_tensors = _critic_files(want), _critic_files(got)
    assert want_tensors.keys() == got_tensors.keys()
    assert all(torch.equal(got_tensors[k], v) for k, v in want_tensors.items())
    # the critics moved: step 3 differs from step 1
    moved = _critic_files(first)
    assert any(not torch.equal(moved[k], v) for k, v in want_tensors.items())
    want_state, got_state = load_trainer_state(want), load_trainer_state(got)
    assert want_state["critics"]["names"] == ["critic_agent_0", "critic_agent_1"]
    assert _equal_states(got_state["critics"], want_state["critics"])


def test_resuming_a_checkpoint_without_critics_into_a_critic_run_is_refused(tmp_path):
    _pipeline(_config(tmp_path / "run", mode="none", estimator="grpo", max_steps=1)).run()
    checkpoint = tmp_path / "run" / "checkpoints" / step_dir_name(1)
    # refused by the config's checks, before the model loads (it was once the model had)
    with pytest.raises(ConfigError, match=r"^config error: critic.mode='per_agent': .*"
                                          r"step_00000001 holds no critic_agent_0: "):
        _pipeline(_config(tmp_path / "run", resume=str(checkpoint)))


def test_critics_are_not_synced_to_the_engine(tmp_path):
    """Only agents' adapters are synced to the rollout engine (here at the version of the
    one rollout, 0); the critic lives in the trainer's PEFT model alone."""
    pipeline = _pipeline(_config(tmp_path / "run", mode="shared", estimator="mappo",
                                 max_steps=1))
    metrics = pipeline.run()
    assert pipeline.engine.adapter_version("critic") is None
    assert pipeline.engine.adapter_version("agent_0") == 0
    assert metrics["critic/critic/num_rows"] == metrics["agent_0/num_rows"] + metrics[
        "agent_1/num_rows"]


def test_relayout_moves_response_values_between_prompt_layouts():
    from roll.multi_agent.critics import relayout

    source = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 1, 0]])
    target = torch.tensor([[0, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    x = torch.tensor([[9.0, 9.0, 1.0, 2.0, 9.0], [9.0, 3.0, 4.0, 5.0, 9.0]])
    assert relayout(x, source, target).tolist() == [[0, 0, 0, 1, 2, 0], [3, 4, 5, 0, 0, 0]]
    with pytest.raises(ValueError, match="different response lengths"):
        relayout(x, source, torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]]))


@pytest.mark.parametrize(("estimator", "mode", "critic"), [
    ("ippo", "per_agent", "critic_agent_1"), ("happo", "shared", "critic")])
def test_a_critic_refusal_leaves_every_agent_and_critic_as_it_was(tmp_path, estimator, mode,
                                                                 critic):
    """Invariant 5 with critics: a non-finite gradient in one critic (its value head's gradient
    made NaN by a hook) refuses the whole step, naming the critic, and no agent has stepped
    either (the old code stepped the agents first and refused the critic afterwards)."""
    from roll.errors import NonFiniteLossError

    pipeline = _pipeline(_config(tmp_path, mode, estimator, max_steps=1, save_steps=0))
    head = pipeline.critics.heads.heads[critic]
    head.weight.register_hook(lambda grad: grad * float("nan"))
    agents = {name: pipeline.model.export_adapter(name) for name in pipeline.agent_names}
    critics = {name: pipeline.model.export_adapter(name) for name in pipeline.model.critic_names}
    heads = [p.detach().clone() for p in pipeline.critics.heads.parameters()]
    with pytest.raises(NonFiniteLossError, match=f"critic '{critic}'"):
        pipeline.run()
    for names, before in ((pipeline.agent_names, agents), (pipeline.model.critic_names, critics)):
        for name in names:
            for key, value in pipeline.model.export_adapter(name).items():
                assert torch.equal(value, before[name][key]), (name, key)
    assert all(torch.equal(a, b) for a, b in zip(pipeline.critics.heads.parameters(), heads,
                                                 strict=True))
    assert pipeline.trainer.global_step == 0
    assert all(not o.state for o in pipeline.trainer.optimizers.values())
    assert all(not o.state for o in pipeline.critics.trainer.optimizers.values())


def test_a_first_prompt_longer_than_the_limit_is_refused_before_the_model_loads(
        tmp_path, monkeypatch):
    """rollout.max_prompt_tokens below the first prompt's length would cut every episode at its
    first turn: one ConfigError naming the key, raised with the tokenizer only."""
    import roll.pipeline.agentic_pipeline as module
    from roll.errors import ConfigError

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(module, "load_base", no_model)
    cfg = _config(tmp_path, mode="none", estimator="grpo")
    cfg = replace(cfg, rollout=replace(cfg.rollout, max_prompt_tokens=8))
    with pytest.raises(ConfigError, match=r"rollout.max_prompt_tokens=8: the first prompt of an "
                                          r"episode \(tic_tac_toe, seating .*\) is already \d+ "
                                          r"tokens"):
        AgenticPipeline(cfg, env_factory=PickSideEnv,
                        render=lambda env, seat: RenderedPrompt(PROMPT, False))
