"""HAPPO's update (roll/pipeline/happo_update.py) against the algorithm written out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from roll.algorithms.happo_ratios import happo_order
from roll.distributed.roles import LocalTrainGroup
from roll.multi_agent.config import AgentConfig, TrainerConfig
from roll.pipeline.happo_update import happo_update

from ..multi_agent.helpers import make_rows, make_team

AGENTS = [AgentConfig("alice"), AgentConfig("bob")]
SEED, STEP = 3, 1


def _team(path):
    model, resolved = make_team(path, AGENTS)
    return model, LocalTrainGroup(model, resolved, TrainerConfig(micro_batch_size=4))


def _batch(model):
    batch = make_rows([0, 1, 0, 1, 1, 0], seed=4)
    batch = batch.with_fields(env_id=torch.tensor([0, 0, 1, 1, 2, 2]))
    with torch.no_grad():
        old = model.logprobs(batch.input_ids, batch.attention_mask, batch.agent_id,
                             positions=batch.response_mask.bool())
    return batch.with_fields(old_logprobs=old)


@pytest.mark.parametrize("reduce", ["sum", "token_mean"])
def test_happo_update_equals_the_sequential_algorithm_by_hand(tiny_model_path, reduce):
    order = happo_order(["alice", "bob"], SEED, STEP)
    first, second = (["alice", "bob"].index(name) for name in order)

    model, trainer = _team(tiny_model_path)
    batch = _batch(model)
    metrics = happo_update(trainer, batch, SEED, STEP, 1.0, log_ratio_reduce=reduce)
    assert metrics[order[0]]["happo_position"] == 0 and metrics[order[1]]["happo_position"] == 1
    assert metrics[order[0]]["happo_factor"] == 1.0

    # By hand: the first agent trains on its rows as they are ...
    ref_model, ref_trainer = _team(tiny_model_path)
    ref_batch = _batch(ref_model)
    rows_first = [i for i in range(len(ref_batch)) if int(ref_batch.agent_id[i]) == first]
    ref_trainer.train_step(ref_batch.select(torch.tensor(rows_first)))
    with torch.no_grad():
        new = ref_model.logprobs(ref_batch.input_ids, ref_batch.attention_mask,
                                 ref_batch.agent_id, positions=ref_batch.response_mask.bool())
    # ... its ratio over each episode's response tokens, summed in Python (token_mean: each
    # turn's sum divided by its number of response tokens) ...
    log_ratio = {}
    for i in rows_first:
        env = int(ref_batch.env_id[i])
        turn, tokens = 0.0, 0
        for t in range(ref_batch.input_ids.shape[1]):
            if ref_batch.response_mask[i, t]:
                turn += float(new[i, t] - ref_batch.old_logprobs[i, t])
                tokens += 1
        log_ratio[env] = log_ratio.get(env, 0.0) + (turn / tokens if reduce == "token_mean"
                                                    else turn)
    # ... weights the second agent's advantages in the same episode.
    rows_second = [i for i in range(len(ref_batch)) if int(ref_batch.agent_id[i]) == second]
    factors = torch.tensor([math.exp(log_ratio[int(ref_batch.env_id[i])]) for i in rows_second])
    assert (factors - 1).abs().max() > 1e-3  # the first update moved its policy
    own = ref_batch.select(torch.tensor(rows_second))
    ref_trainer.train_step(own.with_fields(advantages=own.advantages * factors[:, None]))

    assert abs(metrics[order[1]]["happo_factor"] - float(factors.mean())) < 1e-5
    for name in ("alice", "bob"):
        got, want = model.export_adapter(name), ref_model.export_adapter(name)
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6)


def test_happo_update_logs_a_factor_within_its_bound(tiny_model_path):
    """With a bound just above 1, the second agent's factors (which the first update moved by
    more than 1e-3, as above) are clipped, and the logged least and largest M respect it."""
    order = happo_order(["alice", "bob"], SEED, STEP)
    model, trainer = _team(tiny_model_path)
    bound = 1.0001
    metrics = happo_update(trainer, _batch(model), SEED, STEP, 1.0, factor_clip=bound)
    second = metrics[order[1]]
    low, mean, high = (second[f"happo_factor{k}"] for k in ("_min", "", "_max"))
    assert 1 / bound - 1e-6 <= low <= mean + 1e-6 and mean <= high + 1e-6 <= bound + 2e-6
    assert min(abs(high - bound), abs(low - 1 / bound)) < 1e-6  # the clip bound
    assert metrics[order[0]]["happo_factor_max"] == 1.0


def test_a_refusal_of_the_second_agent_undoes_the_first_agents_step(tiny_model_path):
    """Invariant 5 across HAPPO's sequence: the first agent has stepped when the second one's
    NaN advantages are refused; afterwards both adapters, both optimizers and the step counter
    are as before the update (the old code left the first agent moved and global_step 1)."""
    from roll.errors import NonFiniteLossError

    order = happo_order(["alice", "bob"], SEED, STEP)
    model, trainer = _team(tiny_model_path)
    batch = _batch(model)
    second = ["alice", "bob"].index(order[1])
    advantages = batch.advantages.clone()
    advantages[batch.agent_id == second] = float("nan")
    before = {name: model.export_adapter(name) for name in ("alice", "bob")}
    with pytest.raises(NonFiniteLossError, match=f"agent '{order[1]}'.*no agent was updated"):
        happo_update(trainer, batch.with_fields(advantages=advantages), SEED, STEP, 1.0)
    for name in ("alice", "bob"):
        for key, value in model.export_adapter(name).items():
            assert torch.equal(value, before[name][key]), (name, key)
        assert trainer.optimizers[name].state_dict()["state"] == {}
        assert trainer.schedulers[name].last_epoch == 0
    assert trainer.global_step == 0
    # The same team then takes a clean step from where it was.
    metrics = happo_update(trainer, batch, SEED, STEP, 1.0)
    assert set(metrics) == {"alice", "bob"} and trainer.global_step == 2
