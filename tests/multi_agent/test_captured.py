"""trainer.capture (roll/multi_agent/captured.py): the padded, per-row step a CUDA graph records
gives the compiled trainer's updates and metrics; what it cannot capture is refused or left
uncaptured. On this CPU there is no graph: the same static-shape step runs eagerly."""

from __future__ import annotations

import gc

import pytest
import torch

import roll.multi_agent.captured as captured_module
from roll.batch import TrajectoryBatch
from roll.errors import ConfigError
from roll.multi_agent.captured import BUCKET, START_BUCKET, grid
from roll.multi_agent.config import AgentConfig, OptimConfig, TrainerConfig
from roll.multi_agent.trainer import MultiAgentTrainer

from .helpers import make_rows, make_team


@pytest.fixture(autouse=True)
def nothing_left_to_finalise():
    """No object of an earlier test is finalised inside a compile trace (conftest.py says why)."""
    gc.collect()


AGENTS = [AgentConfig("alice"), AgentConfig("bob"), AgentConfig("carol")]


def _trainer(path, capture: bool | None, **options):
    # SGD at rate 1: an update is the (clipped) gradient itself, so comparing adapters compares
    # gradients (AdamW's first step divides each gradient by its own size: float noise on a
    # near-zero gradient would move its weight by up to the whole rate). Float order (padded
    # columns in the attention's sums) leaves ~2e-7 after one step, ~4e-6 after three.
    model, resolved = make_team(path, AGENTS, optim=OptimConfig(name="sgd", lr=1.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters that differ (B starts at zero: all would be the base)
        for name in model.agent_names:
            for _, tensor in model.named_agent_tensors(name):
                tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
    config = TrainerConfig(micro_batch_size=4, compile=True, compile_backend="aot_eager",
                           capture=capture, **options).validate()
    return model, MultiAgentTrainer(model, resolved, config)


def _long_prompts(agent_id: list[int], seed: int, length: int = 150) -> TrajectoryBatch:
    """Rows whose responses start after column 70: the window starts past the first bucket."""
    gen = torch.Generator().manual_seed(seed)
    batch = make_rows(agent_id, seed=seed, length=length)
    response_mask = torch.zeros_like(batch.response_mask)
    attention_mask = torch.zeros_like(batch.attention_mask)
    for row in range(len(agent_id)):
        prompt = int(torch.randint(70, 90, (1,), generator=gen))
        total = int(torch.randint(prompt + 2, length + 1, (1,), generator=gen))
        attention_mask[row, :total] = 1
        response_mask[row, prompt:total] = 1
    return batch.with_fields(attention_mask=attention_mask, response_mask=response_mask,
                             advantages=batch.advantages.abs() * response_mask
                             * torch.where(torch.arange(length) % 3 == 0, -1.0, 1.0))


@pytest.mark.slow  # the full CI runs it (~20 s of tiny compiled steps)
def test_captured_steps_give_the_compiled_trainers_updates_and_metrics(tiny_model_path):
    torch._dynamo.reset()
    # kl, an entropy bonus that decays, dual clip, two mini-batches a step (two rounds)
    options = dict(kl_coef=0.05, entropy_coef=0.01, bonus_decay_steps=4, dual_clip=3.0,
                   ppo_mini_batch_size=3)
    plain_model, plain = _trainer(tiny_model_path, False, **options)
    model, captured = _trainer(tiny_model_path, True, **options)
    assert plain.captured is None and captured.captured is not None
    # alice 5 rows, carol 3, bob none (his adapter and optimizer must stay untouched);
    # micro-batches of fewer rows than 4 (padding rows), then long prompts (a later window)
    batches = [make_rows([0, 2, 0, 0, 2, 0, 2, 0], seed=3),
               _long_prompts([2, 0, 2, 2, 0], seed=4),
               make_rows([0, 0, 2, 2, 2, 0, 0], seed=5, length=11)]
    bob = {key: value.clone() for key, value in model.export_adapter("bob").items()}
    for index, batch in enumerate(batches):
        want = plain.train_step(batch)
        got = captured.train_step(batch)
        assert set(got) == set(want) == {"alice", "carol"}, index
        for name in want:
            for key, value in want[name].items():
                assert got[name][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (
                    index, name, key)
            assert want[name]["entropy"] > 0 and want[name]["kl_ref"] > 0
        for name in ("alice", "carol"):
            for key, value in plain_model.export_adapter(name).items():
                torch.testing.assert_close(model.export_adapter(name)[key], value,
                                           rtol=0, atol=1e-5, msg=f"{index} {name} {key}")
    after = model.export_adapter("bob")
    assert all(torch.equal(after[key], value) for key, value in bob.items())
    assert captured.optimizers["bob"].state == {}
    # buckets: widths multiples of BUCKET, window starts of START_BUCKET (0 is column 1);
    # the long prompts' responses start at columns 70-89
    keys = set(captured.captured.buckets)
    assert {legal for _, _, legal in keys} == {0}, keys  # no constrained answers
    assert {width for width, _, _ in keys} == {BUCKET, 3 * BUCKET}, keys
    assert {start for width, start, _ in keys if width == BUCKET} == {1}, keys
    assert {start for width, start, _ in keys if width > BUCKET} <= {
        70 // START_BUCKET * START_BUCKET, 89 // START_BUCKET * START_BUCKET}, keys
    assert all(bucket.graph is None for bucket in captured.captured.buckets.values())


def _with_choices(batch: TrajectoryBatch, seed: int, width: int = 3) -> TrajectoryBatch:
    """Constrained answers: in each row, two response positions choose among ``width`` legal
    tokens (the played one among them) and one is forced (a single legal token)."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.full((*batch.input_ids.shape, width), -1)
    leaves = torch.zeros(*batch.input_ids.shape, width)
    for row in range(len(batch)):
        columns = batch.response_mask[row].nonzero().squeeze(-1)
        picks = columns[torch.randperm(len(columns), generator=gen)[:3]].tolist()
        for index, column in enumerate(picks):
            played = int(batch.input_ids[row, column])
            legal = [played] if index == 2 else [played, *torch.randint(
                10, 500, (width - 1,), generator=gen).tolist()]
            tokens[row, column, :len(legal)] = torch.tensor(legal)
            leaves[row, column, :len(legal)] = 1.0
    return batch.with_fields(choice_tokens=tokens, choice_leaves=leaves)


@pytest.mark.slow  # the full CI runs it (~15 s of tiny compiled steps each)
@pytest.mark.parametrize("policy_over", ["tokens", "moves"])
def test_captured_legal_move_terms_equal_the_compiled_trainers(tiny_model_path, policy_over,
                                                               monkeypatch):
    torch._dynamo.reset()
    # over tokens, no bucket is kept (MAX_GRAPHS 0): every micro-batch runs past the cap, on a
    # bucket built for it alone and dropped (what a run with more shapes than graphs does)
    cap = 0 if policy_over == "tokens" else captured_module.MAX_GRAPHS
    monkeypatch.setattr(captured_module, "MAX_GRAPHS", cap)
    # the legal-move entropy bonus and the reverse KL toward uniform legal moves (Leduc's
    # recipe's terms), with a token entropy bonus; three legal tokens pad to four; the policy
    # gradient of the tokens, or of the moves constrained decoding plays (the nash recipes')
    options = dict(action_entropy_coef=0.2, magnet_coef=0.3, magnet_kl="reverse",
                   entropy_coef=0.01, ppo_mini_batch_size=4, policy_over=policy_over)
    plain_model, plain = _trainer(tiny_model_path, False, **options)
    model, captured = _trainer(tiny_model_path, True, **options)
    for index, batch in enumerate([_with_choices(make_rows([0, 1, 0, 1, 1, 0], seed=7), 7),
                                   _with_choices(make_rows([1, 1, 0, 2], seed=8), 8)]):
        want = plain.train_step(batch)
        got = captured.train_step(batch)
        for name in want:
            assert want[name]["action_entropy"] > 0 and want[name]["magnet_kl"] > 0
            assert want[name]["policy_loss"] != 0
            for key, value in want[name].items():
                assert got[name][key] == pytest.approx(value, rel=1e-4, abs=1e-6), (
                    index, name, key)
        for name in want:
            for key, value in plain_model.export_adapter(name).items():
                torch.testing.assert_close(model.export_adapter(name)[key], value,
                                           rtol=0, atol=1e-5, msg=f"{index} {name} {key}")
    if cap:
        assert {legal for _, _, legal in captured.captured.buckets} == {4}
        assert captured.captured.uncaptured == 0
    else:  # fused micro-batches of <= 4 rows: alice's 3 and bob's 3 rows apart (3 + 3 > 4),
        # then alice 1 + bob 2 + carol 1 in one: 3 micro-batches, each past the cap
        assert captured.captured.buckets == {} and captured.captured.uncaptured == 3


def test_bucket_grid_by_hand():
    # steps of 64 (32 for starts) up to 512 columns, then an eighth of the power of two below
    assert [grid(c, 64, up=True) for c in (14, 64, 150, 512, 700, 1100, 2049)] == [
        64, 64, 192, 512, 704, 1152, 2304]
    assert [grid(c, 32, up=False) for c in (1, 31, 70, 236, 600, 1100)] == [
        0, 0, 64, 224, 576, 1024]


def test_capture_is_refused_where_it_cannot_hold(tiny_model_path):
    for options, words in (
            (dict(capture="yes"), "must be true, false or null"),
            (dict(capture=True, compile=False), "needs trainer.compile"),
            (dict(capture=True, loss_agg_mode="seq-mean-token-mean"), "loss_agg_mode")):
        with pytest.raises(ConfigError, match="trainer.capture") as error:
            TrainerConfig(**options).validate()
        assert words in str(error.value), options
    # what only the model tells: a shared prefix reads the rows on the host
    model, resolved = make_team(tiny_model_path, AGENTS)
    config = TrainerConfig(compile=True, compile_backend="aot_eager", capture=True,
                           share_prefix=True).validate()
    with pytest.raises(ConfigError, match="trainer.capture.*share_prefix"):
        MultiAgentTrainer(model, resolved, config)
    model.disable_compile()
    # unset: on only where the compiled trainer runs on CUDA (not on this CPU), never eager
    for compile_on in (True, False):
        model, resolved = make_team(tiny_model_path, AGENTS)
        trainer = MultiAgentTrainer(model, resolved, TrainerConfig(
            compile=compile_on, compile_backend="aot_eager").validate())
        assert trainer.captured is None
        if compile_on:
            model.disable_compile()
