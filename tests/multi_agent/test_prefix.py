"""The rows' common leading tokens run once per agent (roll/multi_agent/prefix.py,
``trainer.share_prefix``): the same log-probs, entropies and gradients as the plain forward, and
really fewer tokens through the model."""

from __future__ import annotations

import pytest
import torch

from roll.batch import TrajectoryBatch
from roll.multi_agent.config import AgentConfig, LoRAConfig, TrainerConfig
from roll.multi_agent.prefix import MIN_PREFIX, common_prefix
from roll.multi_agent.trainer import MultiAgentTrainer

from .helpers import make_rows, make_team

AGENTS = [AgentConfig("alice"), AgentConfig("bob"), AgentConfig("carol")]
PREFIX = 20  # >= MIN_PREFIX: a "rules" text every row opens with


def prefixed_rows(agent_id: list[int], seed: int = 0, prefix: int = PREFIX) -> TrajectoryBatch:
    """``make_rows`` behind ``prefix`` common tokens (attended, never scored)."""
    rows = make_rows(agent_id, seed=seed)
    count = len(agent_id)
    head = torch.randint(10, 500, (prefix,), generator=torch.Generator().manual_seed(99))
    pad = torch.zeros(count, prefix)
    return rows.with_fields(
        input_ids=torch.cat([head.expand(count, prefix), rows.input_ids], 1),
        attention_mask=torch.cat([torch.ones(count, prefix, dtype=torch.long),
                                  rows.attention_mask], 1),
        response_mask=torch.cat([pad, rows.response_mask], 1),
        advantages=torch.cat([pad, rows.advantages], 1))


def test_common_prefix_by_hand():
    ids = torch.arange(40).repeat(3, 1)  # three equal rows of 40 tokens
    mask = torch.ones_like(ids)
    assert common_prefix(ids, mask, limit=30) == 30  # capped at the first scored position
    ids[2, 25] = 7  # row 2 differs from column 25 on
    assert common_prefix(ids, mask, limit=30) == 25
    mask[1, 18] = 0  # a column some row does not attend to ends the prefix
    assert common_prefix(ids, mask, limit=30) == 18
    ids[0, MIN_PREFIX - 1] = 9  # shorter than MIN_PREFIX: not worth a second call
    assert common_prefix(ids, mask, limit=30) == 0
    assert common_prefix(ids[:1], mask[:1], limit=30) == 0  # one row: nothing to share


def _embedded_shapes(model):
    """The (rows, tokens) of every call of the base model's embeddings, recorded."""
    shapes = []
    handle = model.base_model.get_input_embeddings().register_forward_hook(
        lambda module, args, output: shapes.append(tuple(args[0].shape)))
    return shapes, handle


@pytest.mark.parametrize("agents", [[0, 0, 2, 2, 2, 1], None], ids=["mixed", "reference"])
def test_shared_prefix_equals_the_plain_forward(tiny_model_path, agents):
    model, _ = make_team(tiny_model_path, AGENTS)
    with torch.no_grad():  # adapters away from their zero start, so each agent differs
        for name in model.agent_names:
            for _, tensor in model.named_agent_tensors(name):
                tensor.normal_(0.0, 0.2)
    batch = prefixed_rows(agents or [0] * 6)
    agent_id = None if agents is None else batch.agent_id
    params = [p for name in model.agent_names for _, p in model.named_agent_tensors(name)]
    results = {}
    for share in (False, True):
        model.share_prefix = share
        for param in params:
            param.grad = None
        shapes, handle = _embedded_shapes(model)
        logprobs, entropy = model(batch.input_ids, batch.attention_mask, agent_id,
                                  positions=batch.response_mask.bool(), with_entropy=True)
        handle.remove()
        if agents is not None:
            (logprobs.sum() + entropy.sum()).backward()
        results[share] = (logprobs.detach(), entropy.detach(),
                          [None if p.grad is None else p.grad.clone() for p in params], shapes)
    rows, tokens = batch.input_ids.shape
    # runs of one agent: [0, 0], [2, 2, 2], [1]; a lone segment runs as two rows (prefix.py)
    segments = 2 if agents is None else 3
    assert results[False][3] == [(rows, tokens)]
    assert results[True][3] == [(segments, PREFIX), (rows, tokens - PREFIX)]
    torch.testing.assert_close(results[True][0], results[False][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(results[True][1], results[False][1], rtol=0, atol=1e-5)
    if agents is not None:
        moved = 0
        for shared, plain in zip(results[True][2], results[False][2], strict=True):
            # float order only: within 1e-4 of the tensor's largest entry
            torch.testing.assert_close(shared, plain, rtol=0,
                                       atol=1e-4 * float(plain.abs().max()))
            moved += int(plain.abs().max() > 0)
        assert moved == len(params)  # every agent of the mix got a gradient


def test_lora_dropout_in_training_keeps_the_plain_forward(tiny_model_path):
    """A shared prefix would give an agent's rows one dropout mask: with dropout active the
    forward is the plain one."""
    model, _ = make_team(tiny_model_path, [AgentConfig("alice", lora=LoRAConfig(
        rank=4, alpha=8, dropout=0.1))])
    model.share_prefix = True
    batch = prefixed_rows([0] * 4)
    shapes, handle = _embedded_shapes(model)
    with model.training_forward({"alice": 0}):
        model(batch.input_ids, batch.attention_mask, batch.agent_id,
              positions=batch.response_mask.bool())
    model(batch.input_ids, batch.attention_mask, batch.agent_id,  # no-grad passes: dropout off
          positions=batch.response_mask.bool())
    handle.remove()
    assert shapes == [(4, batch.input_ids.shape[1]), (2, PREFIX),
                      (4, batch.input_ids.shape[1] - PREFIX)]


def test_training_with_shared_prefixes_equals_the_plain_step_and_independent_runs(
        tiny_model_path):
    """Two train steps with the prefix shared equal the plain ones; and isolation holds with
    it: each agent alone (where its micro-batches hold only its rows) gets the same adapter."""
    config = TrainerConfig(micro_batch_size=3, ppo_epochs=2, entropy_coef=0.01)
    steps = [prefixed_rows(ids, seed=step) for step, ids in
             enumerate([[0, 1, 2, 2, 0, 1, 0, 2], [2, 2, 1, 0, 0, 1, 1]])]

    def train(agents, batches, share):
        model, resolved = make_team(tiny_model_path, agents)
        trainer = MultiAgentTrainer(model, resolved, TrainerConfig(**{
            **config.__dict__, "share_prefix": share}))
        for batch in batches:
            trainer.train_step(batch)
        return model

    shared, plain = train(AGENTS, steps, True), train(AGENTS, steps, False)
    for index, agent in enumerate(AGENTS):
        own = [b.select(b.agent_id == index) for b in steps]
        alone = train([agent], [b.with_fields(agent_id=torch.zeros_like(b.agent_id))
                                for b in own], True)
        expected = plain.export_adapter(agent.name)
        assert any(v.abs().max() > 1e-4 for k, v in expected.items() if "lora_B" in k)
        together = shared.export_adapter(agent.name)
        for key, value in alone.export_adapter(agent.name).items():
            torch.testing.assert_close(together[key], value, rtol=0, atol=1e-6)  # invariant 1
            # against the plain step: float order only, which AdamW's first steps magnify
            torch.testing.assert_close(together[key], expected[key], rtol=0, atol=1e-5)


@pytest.mark.slow  # 16 s of compiling
def test_compiled_shared_prefix_equals_eager_and_compiles_once_per_kind(tiny_model_path,
                                                                        capsys):
    """``trainer.compile`` with the prefix shared: the eager numbers; after the first batch,
    new row counts and agent mixes (one agent alone: a lone segment) compile nothing; and
    one graph serves every decoder layer (``LayerKV`` leaves the layer index unread)."""
    from roll.multi_agent.compiled import decoder_layers
    from roll.utils.recompiles import compile_count

    from .test_compiled import _passes, _team

    torch._dynamo.reset()
    batches = [prefixed_rows([0, 2, 0, 0, 1, 2, 0, 2, 0, 1], seed=11),
               prefixed_rows([1, 1, 2, 0, 2, 0, 1], seed=12),
               prefixed_rows([2, 2, 2], seed=13)]
    eager_model, eager_trainer = _team(tiny_model_path, None)
    model, trainer = _team(tiny_model_path, "aot_eager")
    eager_model.share_prefix = model.share_prefix = True  # a trainer's default is off
    shapes, handle = _embedded_shapes(model)
    graphs, start = [], compile_count()  # a process-wide count
    for batch in batches:
        want, got = _passes(eager_model, eager_trainer, batch), _passes(model, trainer, batch)
        for index in (0, 1):  # policy, reference
            torch.testing.assert_close(got[index], want[index], rtol=0, atol=1e-5)
        for name, grads in want[2].items():
            for got_grad, want_grad in zip(got[2][name], grads, strict=True):
                torch.testing.assert_close(got_grad, want_grad, rtol=0,
                                           atol=1e-4 * float(want_grad.abs().max()) + 1e-9)
        graphs.append(compile_count() - start)
    handle.remove()
    assert (2, PREFIX) in shapes and (3, PREFIX) in shapes  # the prefix really ran apart
    assert graphs[1] == graphs[2] == graphs[0], graphs
    # head and tail of the policy, reference and training forwards: 6 graphs; a graph per
    # decoder layer (a cache indexed by the layer) would make 12 on these 2 layers
    assert len(decoder_layers(model.base_model)) == 2 and graphs[0] <= 6, graphs
    printed = capsys.readouterr().out
    for kind in ("no-grad shared-prefix head", "no-grad shared-prefix tail",
                 "training shared-prefix head", "training shared-prefix tail"):
        assert f"trainer: compiling the {kind} forward" in printed, printed
