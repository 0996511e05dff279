"""``trainer.compile``: compiled decoder layers, each row routed to its own agent's LoRA.

The compiled path must give every agent exactly what the eager path gives (fp32: 1e-6), for a
mixed batch of uneven agents, in the no-grad passes (policy and reference) and in the
gradients of a training round; and after its warm-up, new numbers of rows and tokens must not
compile again. The backend here is 'aot_eager': the same dynamo graphs, guards and autograd as
the default 'inductor', without generating CPU kernels (75 s against 25 s on this CPU); the GPU
benchmark (benchmarks/train_throughput.py --compile) runs inductor.
"""

from __future__ import annotations

import gc
import re

import pytest
import torch

from roll.multi_agent.compiled import decoder_layers
from roll.multi_agent.config import AgentConfig, LoRAConfig, OptimConfig, TrainerConfig
from roll.multi_agent.logprobs import behaviour_logprobs
from roll.multi_agent.team_factors import agent_gradients
from roll.multi_agent.trainer import METRIC_PARTS, MultiAgentTrainer
from roll.utils.recompiles import compile_count

from .helpers import make_rows, make_team, perturb_critics


@pytest.fixture(autouse=True)
def nothing_left_to_finalise():
    """No object of an earlier test is finalised inside a compile trace (conftest.py says why)."""
    gc.collect()


AGENTS = [AgentConfig("alice"), AgentConfig("bob"), AgentConfig("carol")]


def _team(path, compile_backend: str | None, optim: OptimConfig | None = None):
    model, resolved = make_team(path, AGENTS, optim=optim)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # adapters that differ (B starts at zero: all would be the base)
        for name in model.agent_names:
            for _, tensor in model.named_agent_tensors(name):
                tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
    config = TrainerConfig(micro_batch_size=4, compile=compile_backend is not None,
                           compile_backend=compile_backend or "inductor").validate()
    return model, MultiAgentTrainer(model, resolved, config)


def _passes(model, trainer, batch):
    """No-grad log-probs (policy, reference) and one round's gradients of every agent."""
    positions = batch.response_mask.bool()
    policy = model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id,
                            positions=positions, forward_rows=4)
    reference = model.reference_logprobs(batch.input_ids, batch.attention_mask,
                                         positions=positions, forward_rows=4)
    batch = behaviour_logprobs(model, batch, trainer.temperature,
                               trainer.config.forward_rows, trainer.config.kl_coef > 0)
    minis = {name: (batch.agent_id == i).nonzero().squeeze(-1)
             for i, name in enumerate(model.agent_names)}
    sums = {name: dict.fromkeys(METRIC_PARTS, 0.0) for name in minis}
    trainer._backward(batch, minis, sums)
    # an agent without rows: no gradient (eager) or exact zeros (compiled, the team buffer)
    grads = {name: [torch.zeros(param.shape) if grad is None else grad.clone()
                    for grad, param in zip(agent_gradients(model, name),
                                           model.agent_parameters(name), strict=True)]
             for name in model.agent_names}
    for optimizer in trainer.optimizers.values():
        optimizer.zero_grad(set_to_none=True)
    return policy, reference, grads


@pytest.mark.slow  # the full CI runs it; ~9 s of compiling (quick subset < 3 min)
def test_compiled_passes_equal_the_eager_path_and_do_not_recompile(tiny_model_path, capsys):
    torch._dynamo.reset()
    # alice 5 rows, bob 2, carol 3 (micro 4: forwards of 4, 4 and 2 rows); then other counts;
    # then one row alone (a mini-batch's tail can be one row: a size-1 batch used to get graphs
    # of its own, whose inductor CPU backward corrupted the heap)
    batches = [make_rows([0, 2, 0, 0, 1, 2, 0, 2, 0, 1], seed=11),
               make_rows([1, 1, 2, 0, 2, 0, 1], seed=12, length=11),
               make_rows([2], seed=13, length=12)]
    eager_model, eager_trainer = _team(tiny_model_path, None)
    model, trainer = _team(tiny_model_path, "aot_eager")
    graphs = []
    for batch in batches:
        want = _passes(eager_model, eager_trainer, batch)
        got = _passes(model, trainer, batch)
        for name in ("policy", "reference"):
            index = ("policy", "reference").index(name)
            torch.testing.assert_close(got[index], want[index], rtol=0, atol=1e-6, msg=name)
        assert not torch.equal(want[0], want[1])  # the adapters are not the base
        for index, (name, grads) in enumerate(want[2].items()):
            assert any(g.abs().max() > 1e-4 for g in grads) == bool(
                (batch.agent_id == index).any()), name
            for got_grad, want_grad in zip(got[2][name], grads, strict=True):
                torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-6)
        graphs.append(compile_count())
    # step 1 compiled (no-grad, training); steps 2 and 3, with new row and token counts (one
    # row alone included), did not
    assert graphs[0] > 0 and graphs[1] == graphs[2] == graphs[0], graphs
    # each kind of forward says once, with timestamps, that its first use compiles
    printed = capsys.readouterr().out
    for kind in ("no-grad", "training"):
        assert len(re.findall(rf"\[\d\d:\d\d:\d\d\] trainer: compiling the {kind} forward "
                              r"\(first use; later calls reuse it\)(?: \.\.\.|: done in \d+\.\d s)",
                              printed)) == 2, printed
    # the compiled layers are switched in only around the trainer's forwards
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model.base_model))
    # bob has no rows: his stacked block is masked out, so his weights and optimizer state stay
    # bitwise (the trainer steps only agents with rows); the others train
    before = {key: value.clone() for key, value in model.export_adapter("bob").items()}
    trainer.train_step(make_rows([0, 2, 0, 2, 2, 0], seed=5))
    after = model.export_adapter("bob")
    assert all(torch.equal(after[key], value) for key, value in before.items())
    assert trainer.optimizers["bob"].state == {} and trainer.optimizers["alice"].state != {}


def test_compile_refuses_lora_dropout(tiny_model_path):
    agents = [AgentConfig("alice"),
              AgentConfig("bob", lora=LoRAConfig(rank=4, alpha=8, dropout=0.1))]
    model, resolved = make_team(tiny_model_path, agents)
    with pytest.raises(ValueError, match="trainer.compile=true needs LoRA dropout 0; agent 'bob'"):
        MultiAgentTrainer(model, resolved, TrainerConfig(compile=True))


def test_row_routing_skips_layers_only_critics_adapt(tiny_model_path):
    """Critics may adapt projections no agent does: the row routing hooks only layers with
    an agent (a critic's delta is never added by it), and the compiled forward builds."""
    from roll.models import load_model
    from roll.multi_agent.model import MultiAgentLoRAModel
    from roll.multi_agent.routing import RowRouting

    agent_lora = LoRAConfig(rank=4, alpha=8, target_modules=["q_proj"])
    critic_lora = LoRAConfig(rank=4, alpha=8, target_modules=["q_proj", "down_proj"])
    model = MultiAgentLoRAModel(load_model(tiny_model_path),
                                [AgentConfig("alice", lora=agent_lora)],
                                critics=[AgentConfig("critic", lora=critic_lora)])
    layers = [layer for _, layer in model.lora_layers]
    routing = RowRouting(layers, model.agent_names)
    hooked = {id(base) for base in routing.base_layers}
    for path, layer in model.lora_layers:
        assert (id(layer.base_layer) in hooked) == path.endswith("q_proj"), path


@pytest.mark.slow  # the full CI runs it; ~7 s of compiling (quick subset < 3 min)
def test_row_routing_with_uneven_ranks_targets_and_interleaved_rows(tiny_model_path):
    """Agents of different ranks and target modules (zero-padded stacked factors), rows of one
    agent in several runs, in no order: log-probs and every agent's
    gradients equal the eager path's (fp32, 1e-6)."""
    agents = [AgentConfig("alice", lora=LoRAConfig(rank=4, alpha=8)),
              AgentConfig("bob", lora=LoRAConfig(rank=8, alpha=4,
                                                 target_modules=["q_proj", "v_proj"])),
              AgentConfig("carol", lora=LoRAConfig(rank=2, alpha=2,
                                                   target_modules=["up_proj", "o_proj"]))]
    batch = make_rows([1, 0, 2, 1, 0, 0, 2, 1], seed=21)
    positions = batch.response_mask.bool()
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        model, _ = make_team(tiny_model_path, agents)
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name in model.agent_names:
                for _, tensor in model.named_agent_tensors(name):
                    tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
        if compiled:
            model.enable_compile("aot_eager")
        with model.training_forward(dict.fromkeys(model.agent_names, 0)):
            logprobs, _ = model(batch.input_ids, batch.attention_mask, batch.agent_id,
                                positions=positions)
        (logprobs * batch.advantages).sum().backward()
        grads = {name: [p.grad.clone() for p in model.agent_parameters(name)]
                 for name in model.agent_names}
        results.append((logprobs.detach(), grads))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for name, grads in want_grads.items():
        assert any(g.abs().max() > 1e-4 for g in grads), name
        for got_grad, want_grad in zip(got_grads[name], grads, strict=True):
            torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=1e-6)


@pytest.mark.slow  # the full CI runs it; seconds of compiling (quick subset < 3 min)
def test_a_second_compiled_team_on_one_base_needs_the_first_disabled(tiny_model_path):
    """Routing hooks live on the base layers while a team is compiled: a second team on the
    same base would run both teams' hooks (a stale team picking its factors with the new
    team's one-hot), so it is refused until the first is disabled."""
    from roll.models import load_model
    from roll.multi_agent.model import MultiAgentLoRAModel

    lora = LoRAConfig(rank=4, alpha=8)
    base = load_model(tiny_model_path)
    first = MultiAgentLoRAModel(base, [AgentConfig("alice", lora=lora)])
    first.enable_compile("aot_eager")
    assert base is first.peft_model.unload()
    second = MultiAgentLoRAModel(base, [AgentConfig("bob", lora=lora),
                                        AgentConfig("carol", lora=lora)])
    with pytest.raises(ValueError, match="already routed by another team"):
        second.enable_compile("aot_eager")
    first.disable_compile()
    assert not any(module._forward_hooks for module in base.modules())
    second.enable_compile("aot_eager")
    rows = make_rows([0, 0, 1], seed=3)
    logprobs, _ = second(rows.input_ids, rows.attention_mask, rows.agent_id)
    assert torch.isfinite(logprobs).all()


@pytest.mark.slow  # the full CI runs it; ~7 s of compiling (quick subset < 3 min)
def test_team_buffer_is_the_agents_own_memory_and_checkpoints_stay_portable(tiny_model_path,
                                                                           tmp_path):
    """Agents of one rank keep their factors in one team buffer (team_factors.py): each
    agent's PEFT tensors are views into its row, the compiled forward reads one leaf per
    projection and each agent's optimizer steps its row. Three train steps (carol idle in one)
    move every agent as the eager path does (fp32); the optimizer state is saved per PEFT
    tensor, as an eager run saves it, and loads back into either; a checkpoint loaded with
    copy_ is what the compiled forward reads next; a tensor whose memory was replaced is
    refused."""
    from roll.multi_agent.team_factors import TeamFactors

    torch._dynamo.reset()
    batches = [make_rows([0, 2, 0, 1, 2, 1, 0], seed=31), make_rows([1, 0, 0, 1], seed=32),
               make_rows([2, 2, 0, 1, 1, 0], seed=33, length=12)]
    # AdamW with a large eps moves each element by about lr * gradient: its first step would
    # move an element whose gradient is ~0 by +-lr, whatever rounding gave that gradient's sign
    optim = OptimConfig(lr=0.1, eps=1.0)
    eager_model, eager_trainer = _team(tiny_model_path, None, optim)
    model, trainer = _team(tiny_model_path, "aot_eager", optim)
    factors = model._compiled.factors
    assert isinstance(factors, TeamFactors)
    base = factors.values.untyped_storage().data_ptr()
    for name in model.agent_names:  # every PEFT tensor of every agent lives in the buffer
        assert all(p.untyped_storage().data_ptr() == base for p in model.agent_parameters(name))
        assert trainer.optimizers[name].param_groups[0]["params"] == [
            factors.flat[model.agent_index(name)]]
    routed = [b for b in model._compiled.routing.base_layers]
    assert routed and all(b.lora_stack is not None for b in routed)
    assert all(b.lora_stack.a.shape[0] == 3 for b in routed)  # one leaf for the 3 agents
    start = {name: model.export_adapter(name) for name in model.agent_names}
    for batch in batches:
        eager_trainer.train_step(batch)
        trainer.train_step(batch)
    for name in model.agent_names:
        got, want = model.export_adapter(name), eager_model.export_adapter(name)
        assert any(not torch.equal(got[key], start[name][key]) for key in got), name
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6, msg=key)
        assert all(grad is None for grad in agent_gradients(model, name))

    # The checkpoint format: one optimizer entry per PEFT tensor, equal to the eager run's.
    saved, want = trainer.state_dict(), eager_trainer.state_dict()
    for name in model.agent_names:
        got_state, want_state = saved["optimizers"][name], want["optimizers"][name]
        assert got_state["param_groups"] == want_state["param_groups"]
        assert got_state["state"].keys() == want_state["state"].keys()
        assert len(got_state["state"]) == len(model.agent_parameters(name))
        for index, entry in want_state["state"].items():
            for key, value in entry.items():
                torch.testing.assert_close(got_state["state"][index][key], value, rtol=0,
                                           atol=1e-6, msg=f"{name} {index} {key}")
    # ... and it loads into a compiled team (native: one flat entry) and an eager one alike
    trainer.load_state_dict(want)
    assert trainer.optimizers["alice"].state_dict()["param_groups"][0]["params"] == [0]
    torch.testing.assert_close(trainer.state_dict()["optimizers"]["alice"]["state"][5]["exp_avg"],
                               want["optimizers"]["alice"]["state"][5]["exp_avg"], rtol=0, atol=0)
    eager_trainer.load_state_dict(saved)

    # Load alice's starting adapter back (a resume): the compiled forward reads it at once.
    eager_model.save_agent("alice", tmp_path / "alice")
    model.load_agent("alice", tmp_path / "alice")
    rows = make_rows([0, 1, 0, 2], seed=34)
    positions = rows.response_mask.bool()
    got = model.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id, positions=positions)
    want = eager_model.logprobs(rows.input_ids, rows.attention_mask, rows.agent_id,
                                positions=positions)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)

    # Memory replaced behind the buffer's back: refused before a training forward reads it.
    param = model.agent_parameters("bob")[0]
    param.data = param.data.clone()
    with pytest.raises(RuntimeError, match="replaced after the compiled forward moved it"):
        trainer.train_step(batches[0])
    # disable_compile gives each agent memory of its own again, values unchanged
    values = {name: model.export_adapter(name) for name in model.agent_names}
    model.disable_compile()
    for name in model.agent_names:
        assert all(torch.equal(model.export_adapter(name)[key], value)
                   for key, value in values[name].items())
    pointers = {p.untyped_storage().data_ptr() for name in ("alice", "carol")
                for p in model.agent_parameters(name)[:1]}
    assert len(pointers) == 2


@pytest.mark.slow  # the full CI runs it; ~7 s of compiling (quick subset < 3 min)
def test_a_nan_in_one_agents_rows_is_blamed_on_that_agent_alone(tiny_model_path):
    """Compiled routing keeps a NaN in its own agent's gradient: bob's NaN advantages refuse the
    step naming bob, and alice's and carol's gradients stay finite (a one-hot matmul's
    transpose spread 0 x NaN to every agent, and the refusal named alice)."""
    from roll.errors import NonFiniteLossError

    torch._dynamo.reset()
    model, trainer = _team(tiny_model_path, "aot_eager")
    batch = make_rows([0, 1, 2, 0, 1, 2], seed=13)
    advantages = batch.advantages.clone()
    advantages[batch.agent_id == 1] = float("nan")
    batch = batch.with_fields(advantages=advantages)
    with pytest.raises(NonFiniteLossError, match="agent 'bob'"):
        trainer.train_step(batch)
    batch = behaviour_logprobs(model, batch, trainer.temperature, trainer.config.forward_rows,
                               False)
    minis = {name: (batch.agent_id == i).nonzero().squeeze(-1)
             for i, name in enumerate(model.agent_names)}
    trainer._backward(batch, minis, {name: dict.fromkeys(METRIC_PARTS, 0.0) for name in minis})
    finite = {name: all(bool(torch.isfinite(g).all()) for g in agent_gradients(model, name))
              for name in model.agent_names}
    assert finite == {"alice": True, "bob": False, "carol": True}


@pytest.mark.slow  # the full CI runs it; ~7 s of compiling (quick subset < 3 min)
def test_compiled_layers_keep_compiling_past_torchs_recompile_limit(tiny_model_path,
                                                                     monkeypatch):
    # torch's own limit of compiled variants per code object, lowered to 1: the trainer's
    # forwards raise it while they run (RECOMPILE_LIMIT), so the training pass (grad) still
    # compiles after the no-grad pass took the one variant; without the guard it would run
    # eagerly and no new graph would appear.
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 1)
    model, trainer = _team(tiny_model_path, "aot_eager")
    batch = make_rows([0, 1, 2, 0], seed=3)
    model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id,
                   positions=batch.response_mask.bool(), forward_rows=4)
    after_no_grad = compile_count()
    trainer.train_step(batch)
    assert after_no_grad > 0 and compile_count() > after_no_grad
    assert torch._dynamo.config.recompile_limit == 1  # patched for the forwards only


def _critic_pair(path, critic_dropout: float = 0.0):
    """alice and bob, and critics critic_a (rank 4) and critic_b (rank 2, other targets: the
    routing pads ranks and skips layers), their tensors and heads perturbed alike."""
    from roll.models import load_model
    from roll.multi_agent.critics import ValueHeads
    from roll.multi_agent.model import MultiAgentLoRAModel

    lora = LoRAConfig(rank=4, alpha=8, dropout=critic_dropout)
    optim = OptimConfig(lr=1e-2)
    critics = [AgentConfig("critic_a", lora=lora, optim=optim),
               AgentConfig("critic_b", lora=LoRAConfig(rank=2, alpha=4, dropout=critic_dropout,
                                                       target_modules=["q_proj", "down_proj"]),
                           optim=optim)]
    agents = [AgentConfig(name, lora=LoRAConfig(rank=4, alpha=8)) for name in ("alice", "bob")]
    model = MultiAgentLoRAModel(load_model(path), agents, seed=0, critics=critics)
    heads = ValueHeads(model.critic_names, model.base_model.config.hidden_size)
    perturb_critics(model, heads, seed=3)
    return model, heads, critics


@pytest.mark.slow  # the full CI runs it; ~10 s of compiling (quick subset < 3 min)
def test_critics_forwards_through_the_compiled_layers_equal_the_eager_path(tiny_model_path,
                                                                           capsys):
    """Under trainer.compile the critics' values and gradients come through the compiled
    layers (each row routed to its own critic's factors) and equal the eager path's (fp32:
    values to 1e-5, gradients to 1e-4 relative); new row and token counts compile nothing more;
    no agent gets a gradient. A critic with LoRA dropout keeps every critic eager."""
    from roll.multi_agent.config import CriticConfig
    from roll.multi_agent.critics import CriticTrainer, critic_values

    torch._dynamo.reset()
    eager, eager_heads, critics = _critic_pair(tiny_model_path)
    model, heads, _ = _critic_pair(tiny_model_path)
    model.enable_compile("aot_eager")
    graphs = []
    for rows, seed, length in (([0, 0, 0, 1, 1], 21, 14), ([1, 1, 0], 22, 11), ([0], 23, 9)):
        batch = make_rows(rows, seed=seed, length=length)
        critic_id, positions = torch.tensor(rows), batch.response_mask.bool()
        with torch.no_grad():
            want = critic_values(eager, eager_heads, batch.input_ids, batch.attention_mask,
                                 critic_id, positions)
            got = critic_values(model, heads, batch.input_ids, batch.attention_mask,
                                critic_id, positions)
        # fp32, another reduction order: 5.7e-6 apart on an AVX-512 CPU (2026-11-28), where a
        # row routed to the other critic's factors is ~30 off (values up to ~17)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        for team, team_heads in ((eager, eager_heads), (model, heads)):
            values = critic_values(team, team_heads, batch.input_ids, batch.attention_mask,
                                   critic_id, positions)
            values.square().mean().backward()
        for name in model.critic_names:
            params = [*model.agent_parameters(name), *heads.heads[name].parameters()]
            wanted = [*eager.agent_parameters(name), *eager_heads.heads[name].parameters()]
            for got_param, want_param in zip(params, wanted, strict=True):
                if want_param.grad is None:  # a critic without rows in this batch
                    assert got_param.grad is None or not got_param.grad.any(), name
                    continue
                # fp32, other reduction orders (batched products, per-row gathers): a wrong
                # routing is off by the size of the gradient itself
                torch.testing.assert_close(got_param.grad, want_param.grad, rtol=1e-4,
                                           atol=1e-5)
                got_param.grad = want_param.grad = None
        for name in model.agent_names:
            assert all(p.grad is None or not p.grad.any() for p in model.agent_parameters(name))
        graphs.append(compile_count())
    assert {"critics' no-grad", "critics' training"} <= model._compiled.warmed
    assert graphs[0] > 0 and graphs[1] == graphs[2] == graphs[0], graphs
    # each layer one graph: output_hidden_states=True broke every layer's graph at
    # transformers' recording hook (three graphs, Python in every layer of every forward)
    assert not torch._dynamo.utils.counters["graph_break"], dict(
        torch._dynamo.utils.counters["graph_break"])
    assert "trainer: compiling the critics' training forward" in capsys.readouterr().out
    # one update of both critics (value loss over micro-batches of 2, AdamW): equal adapters
    batch = make_rows([0, 1, 1, 0, 1], seed=24)
    critic_id = torch.tensor([0, 1, 1, 0, 1])
    for team, team_heads in ((eager, eager_heads), (model, heads)):
        trainer = CriticTrainer(team, team_heads, critics, CriticConfig(micro_batch_size=2))
        targets = batch.with_fields(values=trainer.values(batch, critic_id),
                                    returns=torch.ones(batch.input_ids.shape))
        trainer.train_step(targets, critic_id)
    for name in model.critic_names:
        for key, value in eager.export_adapter(name).items():
            torch.testing.assert_close(model.export_adapter(name)[key], value, rtol=0, atol=1e-6)
    assert compile_count() == graphs[0]
    with_dropout, _, _ = _critic_pair(tiny_model_path, critic_dropout=0.1)
    with_dropout.enable_compile("aot_eager")
    assert not with_dropout._compiled.routes_critics
