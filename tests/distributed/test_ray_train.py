"""Data-parallel training in real Ray actors (gloo) equals one local process (invariant 6)."""

from __future__ import annotations

import copy

import pytest
import ray
import torch

from roll.distributed.roles import (
    TrainSpec,
    choice_logprobs_under,
    response_divergences,
    response_logprobs,
)
from roll.errors import RoleFailed
from roll.multi_agent.config import AgentConfig, OptimConfig, TrainerConfig
from roll.multi_agent.trainer import MultiAgentTrainer
from roll.pipeline.builders import build_train_group
from tests.multi_agent.helpers import make_rows, make_team

pytestmark = pytest.mark.slow

AGENTS = ["a", "b", "idle"]
TRAINER = TrainerConfig(micro_batch_size=2, ppo_mini_batch_size=4, ppo_epochs=2,
                        kl_coef=0.0)


def batches():
    # Uneven rows (5 of a, 3 of b, none of idle): mini-batches of 4 split 3/2 and 2/1 over two
    # ranks, and one rank gets no row of b in the second mini-batch.
    return [make_rows([0, 1, 0, 0, 1, 0, 1, 0], seed=11),
            make_rows([1, 1, 0, 1, 0, 0, 1, 1, 0], seed=12)]


def adapters(model):
    return {name: model.export_adapter(name) for name in model.agent_names}


def max_gap(left, right):
    return max(float((left[name][key] - right[name][key]).abs().max())
               for name in left for key in left[name])


LIVE = 20_000
"""ZeRO-3: the most elements a rank keeps gathered and prefetched (DeepSpeed's defaults, 1e9,
would keep this whole tiny model gathered through a step)."""
PERSIST = 1024
"""ZeRO-3 with tensors of at most this many elements kept whole: every adapter tensor and norm
of the tiny model (LoRA A/B: 128-512 elements), none of its weight matrices (2,048 or more),
as the default (100k) splits a 0.6B-8B base. The per-projection case keeps nothing whole (0), so
that each rank's memory is its half of every tensor."""
# ZeRO-3 gathers per decoder layer (the default) with small tensors kept whole, as the default
# keeps them, and per projection with nothing kept. (A layer gather with nothing kept, its
# peak of ~2 layers beside the rank's half, is measured in tests/benchmarks/
# test_train_data_parallel.py on an 8-layer base.)
STRATEGIES = [pytest.param(("torch", 2), id="torch"),
              pytest.param(("deepspeed", 2), id="zero2"),
              pytest.param(("deepspeed", 3, "projection"), id="zero3"),
              pytest.param(("deepspeed", 3, "layer", PERSIST), id="zero3_persist")]


@pytest.fixture
def spec_and_team(tiny_model_path):
    def build(strategy=("torch", 2)):
        # eps 1e-3: Adam's first steps are ~lr * sign(g), so on a near-zero coordinate the
        # 1e-10 noise of summing in another order (ranks) would flip a whole lr-sized step.
        model, agents = make_team(tiny_model_path, [AgentConfig(name) for name in AGENTS],
                                  optim=OptimConfig(lr=1e-2, eps=1e-3))
        spec = TrainSpec(model_path=str(tiny_model_path), dtype="float32", device="cpu",
                         agents=tuple(agents), trainer=TRAINER, seed=0, temperature=1.0,
                         strategy=strategy[0], zero_stage=strategy[1], measure_resident=True,
                         zero3_live_elements=LIVE if strategy[1] == 3 else None,
                         zero3_gather=strategy[2] if len(strategy) > 2 else "layer",
                         zero3_persist_elements=strategy[3] if len(strategy) > 3 else 0)
        return spec, model, agents
    return build


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_ray_ranks_equal_one_local_process(ray_cluster, spec_and_team, one_thread, strategy):
    spec, local_model, agents = spec_and_team(strategy)
    start = adapters(local_model)
    local = MultiAgentTrainer(local_model, agents, TRAINER)
    local_metrics, local_rows = [], []
    for batch in batches():
        local_metrics.append(local.train_step(batch))
        local_rows.append(local.rows_forwarded)

    _, driver_model, _ = spec_and_team()
    group = build_train_group(spec, driver_model, "ray", world_size=2)
    try:
        ray_metrics, ray_rows = [], []
        for batch in batches():
            ray_metrics.append(group.train_step(batch))
            ray_rows.append(group.rows_per_rank)
        digests = group.digests()
        state = group.state_dict()
        resident = group.resident_elements()
        # The no-grad passes after training, on a batch that has none yet: on the ranks, 5 and
        # 4 of the 9 rows (the second share padded to 5: ZeRO-3 ranks forward in lockstep).
        fresh = batches()[1]
        passed = group.logprob_passes(fresh)
        pass_rows = group.pass_rows_per_rank
        # HAPPO's ratios, the agents' distance and the exploitability tables' legal-move
        # log-probs score on the ranks too, at any temperature
        scored = group.policy_logprobs(fresh, 0.7)
        score_rows = group.pass_rows_per_rank
        divergence = group.divergence_rows(fresh, "a", "b", 0.7)
        # two legal tokens at each response position: the row's own and the next id
        own = torch.where(fresh.response_mask.bool(), fresh.input_ids, -1)  # (B, T)
        legal = torch.stack([own, torch.where(own >= 0, own + 1, -1)], dim=-1)  # (B, T, 2)
        with_choices = fresh.with_fields(choice_tokens=legal)
        chosen = group.choice_logprobs(with_choices, 0.7)
    finally:
        group.close()

    assert pass_rows == score_rows == [5, 4]
    expected_scores = response_logprobs(local_model, fresh, 0.7, None)
    assert float((scored - expected_scores).abs().max()) < 1e-5
    assert float((expected_scores - local.logprob_passes(fresh).old_logprobs).abs().max()) > 1e-3
    expected_chosen = choice_logprobs_under(local, with_choices, None, 0.7)
    assert float(expected_chosen[legal >= 0].exp().min()) > 1e-4  # both tokens have mass
    torch.testing.assert_close(chosen, expected_chosen, rtol=1e-4, atol=1e-5)
    expected_divergence = response_divergences(local_model, fresh, "a", "b", 0.7, None)
    assert (expected_divergence > 1e-6).all()
    torch.testing.assert_close(divergence, expected_divergence, rtol=1e-4, atol=1e-9)
    expected = local.logprob_passes(fresh).old_logprobs
    assert float((passed.old_logprobs - expected).abs().max()) < 1e-5
    assert float(expected.abs().sum()) > 0 and passed.ref_logprobs is None  # kl_coef 0

    whole = sum(param.numel() for param in driver_model.parameters())
    layers = driver_model.base_model.model.layers
    layer = max(sum(param.numel() for param in module.parameters()) for module in layers)
    embedding = driver_model.base_model.get_input_embeddings().weight.numel()
    if strategy == ("deepspeed", 3, "layer", PERSIST):
        # What persistence costs: each kept tensor whole beside its own partition (a gather of
        # the adapters for the sync frees the whole copies; the next forward brings them back
        # and nothing releases them), on top of what the per-layer gather holds.
        kept = sum(param.numel() for param in driver_model.parameters()
                   if param.numel() <= PERSIST)
        assert 0.1 * whole < kept < 0.5 * whole  # a real share of the model
        for held in resident:
            assert 0.45 * whole < held["held"] < 0.55 * whole + kept, (resident, whole, kept)
            assert held["peak"] <= 0.55 * whole + kept + 2 * layer + embedding, resident
    elif strategy[:2] == ("deepspeed", 3):
        # Each rank holds its half of base and adapters at rest. It never held the whole base,
        # neither while loading nor while stepping: at most its half plus one module gathered
        # whole (here the embedding, a third of this tiny model) and what ZeRO keeps live
        # (before, each rank loaded the whole base and partitioned it afterwards).
        largest = max(sum(param.numel() for param in module.parameters(recurse=False))
                      for module in driver_model.modules())
        for held in resident:
            assert 0.45 * whole < held["held"] < 0.55 * whole, (resident, whole)
            assert held["peak"] >= held["load_peak"] >= held["held"], resident
            assert held["load_peak"] <= 0.55 * whole + largest < whole, (resident, largest)
            assert held["peak"] <= 0.55 * whole + largest + LIVE < whole, (resident, largest)
    else:
        for held in resident:  # the meter sees whole models where nothing is partitioned
            assert held["held"] == whole and held["peak"] >= held["load_peak"] >= whole
    assert group.global_step == local.global_step == 2
    # Each rank forwarded its share only; together, the local run's rows.
    for shares, alone in zip(ray_rows, local_rows, strict=True):
        assert sum(shares) == alone and max(shares) < alone
    # The driver's model holds the ranks' result, equal to the local run up to summation order.
    assert max_gap(adapters(driver_model), adapters(local_model)) < 1e-6
    assert max_gap(adapters(driver_model), start) > 1e-3  # and training moved it
    # The idle agent: weights bitwise, no optimizer state on any rank.
    for key, tensor in driver_model.export_adapter("idle").items():
        assert torch.equal(tensor, start["idle"][key])
    assert state["optimizers"]["idle"]["state"] == {}
    assert digests[0] == digests[1]  # replicas in step: adapters and AdamW moments
    for name in ("a", "b"):
        local_state = local.optimizers[name].state_dict()["state"]
        for index, slot in local_state.items():
            for key in ("exp_avg", "exp_avg_sq"):
                gap = (state["optimizers"][name]["state"][index][key] - slot[key]).abs().max()
                assert float(gap) < 1e-6
    for step in range(2):  # metrics over the whole mini-batch, not one rank's share
        for name in ("a", "b"):
            for key in ("loss", "policy_loss", "grad_norm", "num_rows", "num_tokens"):
                assert ray_metrics[step][name][key] == pytest.approx(
                    local_metrics[step][name][key], abs=1e-5)
    assert "idle" not in ray_metrics[0]


# ZeRO-3 (ZeRO-2 loads its state by the same code; the torch strategy's resume runs in
# test_ray_pipeline.py's dead-rank test)
@pytest.mark.parametrize("strategy", [STRATEGIES[2]])
def test_resume_pushes_the_drivers_adapters_and_state_to_every_rank(
        ray_cluster, spec_and_team, one_thread, strategy):
    spec, local_model, agents = spec_and_team(strategy)
    local = MultiAgentTrainer(local_model, agents, TRAINER)
    first, second = batches()
    local.train_step(first)
    # deepcopy: an optimizer's state_dict holds its live tensors
    saved_adapters, saved_state = adapters(local_model), copy.deepcopy(local.state_dict())
    local.train_step(second)

    _, driver_model, _ = spec_and_team()
    for name, tensors in saved_adapters.items():
        driver_model.import_adapter(name, tensors)
    group = build_train_group(spec, driver_model, "ray", world_size=2)
    try:
        group.load_state_dict(saved_state)
        group.train_step(second)
        digests = group.digests()
    finally:
        group.close()
    assert digests[0] == digests[1]
    assert max_gap(adapters(driver_model), adapters(local_model)) < 1e-6


def test_a_dead_rank_stops_the_step_with_one_line_naming_it(ray_cluster, spec_and_team):
    spec, driver_model, _ = spec_and_team()
    group = build_train_group(spec, driver_model, "ray", world_size=2)
    # The ranks rendezvoused on rank 0's own node (the driver's may hold no rank).
    rank0_node = ray_cluster.get(group.ranks[0].__ray_call__.remote(
        lambda rank: ray_cluster.util.get_node_ip_address()))
    host, port = group.address.rsplit(":", 1)
    assert host == rank0_node and int(port) > 0
    before = adapters(driver_model)
    ray_cluster.kill(group.ranks[1])
    with pytest.raises(RuntimeError, match=r"actor_train rank 1 of 2 failed during train step 1"):
        group.train_step(batches()[0])
    assert group.ranks == []  # torn down, the survivor is not left waiting
    assert max_gap(adapters(driver_model), before) == 0.0  # nothing half-applied


def test_bad_backend_and_world_size_are_refused(spec_and_team):
    spec, model, _ = spec_and_team()
    with pytest.raises(ValueError, match="cluster.backend='slurm'"):
        build_train_group(spec, model, "slurm")
    with pytest.raises(ValueError, match="actor_train.world_size=2"):
        build_train_group(spec, model, "local", world_size=2)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_refusal_in_a_later_round_restores_adapters_masters_and_moments(
        ray_cluster, spec_and_team, one_thread, stage):
    """A NaN first met in mini-batch round 2 of 4: round 1 had stepped; the refusal puts back the
    model's adapters, ZeRO's fp32 masters and moments, and the next step equals a run that never
    saw the bad batch. (One rank in a Ray worker: DeepSpeed needs torch.distributed.)"""
    spec, local_model, agents = spec_and_team(("deepspeed", stage))
    good = batches()[0]
    local = MultiAgentTrainer(local_model, agents, TRAINER)
    local.train_step(good)
    rows_a = (good.agent_id == 0).nonzero().squeeze(-1)
    minis = local._mini_batches("a", len(rows_a))  # step 2's plan, as the rank will make it
    later = [int(rows_a[position]) for position in minis[1] if position not in minis[0]]
    advantages = good.advantages.clone()
    advantages[later[0]] = float("nan")
    bad = good.with_fields(advantages=advantages)

    @ray.remote(num_cpus=1, max_calls=1)  # a fresh process: one torch.distributed group each
    def deepspeed_rank(spec, bad, good, stage):
        import torch

        from roll.distributed.data_parallel import TorchDistributedSync, free_port, init_ranks
        from roll.distributed.deepspeed_strategy import DeepSpeedStrategy
        from roll.errors import NonFiniteLossError
        from roll.models import load_model
        from roll.multi_agent.model import MultiAgentLoRAModel

        torch.set_num_threads(1)
        init_ranks(0, 1, f"127.0.0.1:{free_port()}", "cpu")
        model = MultiAgentLoRAModel(load_model(spec.model_path), list(spec.agents), seed=0)
        trainer = MultiAgentTrainer(model, list(spec.agents), spec.trainer, 1.0,
                                    strategy=DeepSpeedStrategy(stage, TorchDistributedSync()))
        trainer.train_step(good)  # every agent has moments and masters to lose
        before = (trainer.export_adapters(model.agent_names), trainer.state_dict())
        refused = ""
        try:
            trainer.train_step(bad)
        except NonFiniteLossError as error:
            refused = str(error)
        after = (trainer.export_adapters(model.agent_names), trainer.state_dict())
        trainer.train_step(good)
        return refused, before, after, trainer.export_adapters(model.agent_names)

    refused, before, after, final = ray.get(deepspeed_rank.remote(spec, bad, good, stage))
    assert "agent 'a': loss is nan" in refused and "round 2 of 4" in refused
    for name in AGENTS:
        for key, tensor in before[0][name].items():
            assert torch.equal(tensor, after[0][name][key])
        for index, slot in before[1]["optimizers"][name]["state"].items():
            for key, value in slot.items():
                assert torch.equal(value, after[1]["optimizers"][name]["state"][index][key])
    assert after[1]["global_step"] == before[1]["global_step"] == 1
    local.train_step(good)
    assert max_gap(final, adapters(local_model)) < 1e-6


def test_happo_over_ray_ranks_undoes_the_first_agent_when_the_second_is_refused(
        ray_cluster, spec_and_team):
    """Invariant 5 in Ray mode: HAPPO's first agent has stepped on the ranks and in the
    driver's model when a rank refuses the second agent's NaN step, in one line naming the rank,
    the step and the agent; the group fails (its ranks are closed) and the driver's model is
    put back, step counter included."""
    from roll.algorithms.happo_ratios import happo_order
    from roll.pipeline.happo_update import happo_update

    spec, driver_model, _ = spec_and_team()
    group = build_train_group(spec, driver_model, "ray", world_size=2)
    batch = batches()[0].with_fields(env_id=torch.tensor([0, 0, 1, 1, 2, 2, 3, 3]))
    with torch.no_grad():
        batch = batch.with_fields(old_logprobs=driver_model.logprobs(
            batch.input_ids, batch.attention_mask, batch.agent_id,
            positions=batch.response_mask.bool()))
    second = AGENTS.index([n for n in happo_order(AGENTS, 0, 1) if n != "idle"][1])
    advantages = batch.advantages.clone()
    advantages[batch.agent_id == second] = float("nan")
    before = adapters(driver_model)
    try:
        with pytest.raises(RoleFailed, match=(
                r"^actor_train rank [01] of 2 failed during train step 2: NonFiniteLossError: "
                f"agent '{AGENTS[second]}': loss is nan")):
            happo_update(group, batch.with_fields(advantages=advantages), 0, 1, 1.0)
    finally:
        group.close()
    assert max_gap(adapters(driver_model), before) == 0.0
    assert group.global_step == 0
