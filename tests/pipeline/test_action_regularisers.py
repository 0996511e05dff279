"""The legal-move regularisers in a run (trainer.action_entropy_coef, trainer.magnet_coef):
what the trainer measures equals an independent computation, the loss holds exactly the terms
it should, a snapshot magnet survives resume bit-exactly, and bad settings are refused before
any model loads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from roll.pipeline.agentic_pipeline import AgenticPipeline
from roll.pipeline.cli import CLIError, load_config
from roll.pipeline.policy_update import update_agents

ROOT = Path(__file__).resolve().parents[2]
KUHN = str(ROOT / "examples" / "kuhn_poker")
BASE = ["rollout.num_groups=4", "eval.eval_steps=0", "tracking.backends=[jsonl]"]


def _config(out: Path, *extra: str):
    return load_config(KUHN, "quickstart_cpu", BASE + [f"output_dir={out}", *extra])


def _independent_policy(model, turn, agent: int, temperature: float) -> torch.Tensor:
    """The distribution over the legal moves of one Kuhn turn (float64), from the
    full-vocabulary log-probs of each legal token at the turn's one branching point
    (model.logprobs: log-softmax over the whole vocabulary, then renormalised here by hand)."""
    (offset, legal, _), = turn.choices
    prefix = turn.prompt_ids + turn.response_ids[:offset]
    ids = torch.tensor([prefix + [token] for token in legal])
    positions = torch.zeros(ids.shape, dtype=torch.bool)
    positions[:, -1] = True
    logp = model.logprobs(ids, torch.ones_like(ids), torch.full((len(legal),), agent),
                          positions=positions, temperature=temperature)[:, -1].double()
    return torch.softmax(logp, 0)  # renormalised over the legal tokens


def _independent_entropy(model, turn, agent: int, temperature: float) -> float:
    p = _independent_policy(model, turn, agent, temperature)
    return float(-(p * p.log()).sum())


def test_action_entropy_and_magnet_terms_equal_an_independent_computation(tmp_path):
    cfg = _config(tmp_path / "run", "trainer.action_entropy_coef=0.05",
                  "trainer.magnet_coef=0.1", "max_steps=1")
    pipeline = AgenticPipeline(cfg)
    scheduler = pipeline.scheduler(pipeline.train_seatings, evaluation=False)
    result = pipeline.synced_rollout(scheduler, 123, _Quiet(), "episodes")[0]
    batch = result.batch
    # Each Kuhn row has exactly one branching point, and it holds the token that was played.
    at = (batch.choice_tokens >= 0).sum(-1) >= 2  # (B, T)
    assert at.sum(-1).tolist() == [1] * len(batch)
    played = batch.input_ids[at]
    assert (batch.choice_tokens[at] == played[:, None]).any(-1).all()
    assert batch.choice_leaves[at][:, :2].tolist() == [[1.0, 1.0]] * len(batch)  # Pass, Bet
    expected = {}
    trained = [t for t in result.turns if t.trained_agent is not None]
    for index, name in enumerate(pipeline.agent_names):
        own = [_independent_entropy(pipeline.model, t, index, pipeline.policy_temperature)
               for t in trained if t.trained_agent == name]
        expected[name] = sum(own) / len(own)
    metrics, _ = update_agents(cfg, pipeline.trainer, pipeline.model, batch, 1,
                               pipeline.policy_temperature, None, None)
    for name in pipeline.agent_names:
        m = metrics[name]
        assert m["action_entropy"] == pytest.approx(expected[name], abs=1e-5)
        assert 0.0 < m["action_entropy"] < math.log(2.0)
        # The uniform magnet over Kuhn's two moves: KL = ln 2 - H, exactly.
        assert m["magnet_kl"] == pytest.approx(math.log(2.0) - m["action_entropy"], abs=1e-6)
        # One mini-batch: the loss is the policy loss minus the bonus plus the magnet term.
        assert m["loss"] == pytest.approx(
            m["policy_loss"] - 0.05 * m["action_entropy"] + 0.1 * m["magnet_kl"], abs=1e-6)


@pytest.mark.slow  # a run's rollout and update; the KL itself is tested by hand in test_choices
def test_the_reverse_magnet_kl_equals_an_independent_computation(tmp_path):
    """trainer.magnet_kl=reverse: the logged term is KL(uniform || policy) over Kuhn's two moves,
    ln(1/2) - (ln p + ln(1 - p)) / 2 per decision, from an independent forward; the loss holds
    it with its weight."""
    cfg = _config(tmp_path / "run", "trainer.magnet_coef=0.3", "trainer.magnet_kl=reverse",
                  "max_steps=1")
    pipeline = AgenticPipeline(cfg)
    scheduler = pipeline.scheduler(pipeline.train_seatings, evaluation=False)
    result = pipeline.synced_rollout(scheduler, 123, _Quiet(), "episodes")[0]
    trained = [t for t in result.turns if t.trained_agent is not None]
    expected = {}  # before the update moves the adapters
    for index, name in enumerate(pipeline.agent_names):
        own = [_independent_policy(pipeline.model, t, index, pipeline.policy_temperature)
               for t in trained if t.trained_agent == name]
        expected[name] = sum(float(math.log(0.5) - p.log().sum() / 2) for p in own) / len(own)
    metrics, _ = update_agents(cfg, pipeline.trainer, pipeline.model, result.batch, 1,
                               pipeline.policy_temperature, None, None)
    for name in pipeline.agent_names:
        m = metrics[name]
        assert m["magnet_kl"] == pytest.approx(expected[name], abs=1e-6)
        # Not the forward KL (ln 2 - H): the two differ away from the uniform policy.
        assert m["magnet_kl"] != pytest.approx(math.log(2.0) - m["action_entropy"], abs=1e-5)
        assert m["loss"] == pytest.approx(m["policy_loss"] + 0.3 * m["magnet_kl"], abs=1e-6)


def test_the_bonuses_decay_linearly_with_each_agents_own_steps(tmp_path):
    """trainer.bonus_decay_steps=2: both bonuses weigh 1, 1/2, then 0 of their coefficients
    at an agent's train steps 1, 2, 3 (as a linear rate with total_steps 2); the loss holds
    exactly those terms, and the weight is logged."""
    cfg = _config(tmp_path / "run", "trainer.action_entropy_coef=0.05",
                  "trainer.entropy_coef=0.02", "trainer.bonus_decay_steps=2", "max_steps=3")
    pipeline = AgenticPipeline(cfg)
    scheduler = pipeline.scheduler(pipeline.train_seatings, evaluation=False)
    batch = pipeline.synced_rollout(scheduler, 123, _Quiet(), "episodes")[0].batch
    for step, scale in enumerate((1.0, 0.5, 0.0), start=1):
        metrics, _ = update_agents(cfg, pipeline.trainer, pipeline.model, batch, step,
                                   pipeline.policy_temperature, None, None)
        for name in pipeline.agent_names:
            m = metrics[name]
            assert m["bonus_scale"] == scale
            assert m["action_entropy"] > 0.1 and m["entropy"] > 0.1  # a bonus to weigh
            assert m["loss"] == pytest.approx(
                m["policy_loss"] - scale * (0.05 * m["action_entropy"] + 0.02 * m["entropy"]),
                abs=1e-6)


def test_action_entropy_is_logged_with_every_coefficient_at_zero(tmp_path):
    metrics = AgenticPipeline(_config(tmp_path / "run", "max_steps=1")).run()
    for name in ("agent_0", "agent_1"):
        assert 0.0 < metrics[f"{name}/action_entropy"] <= math.log(2.0) + 1e-6
        assert f"{name}/magnet_kl" not in metrics


@pytest.mark.slow
def test_snapshot_magnet_survives_a_checkpoint_bit_exactly(tmp_path):
    """trainer.magnet=snapshot, refreshed every 2 steps (steps 1 and 3): a run resumed from
    its step-2 checkpoint holds the magnet taken at step 1, not the adapters it resumed with,
    and ends step 3 with the adapters of the run that never stopped, bit for bit."""
    extra = ["trainer.magnet_coef=0.5", "trainer.magnet=snapshot", "trainer.magnet_refresh=2",
             "save_steps=2", "keep_last=5"]

    def run(out: Path, steps: int, *more: str) -> AgenticPipeline:
        pipeline = AgenticPipeline(_config(out, *extra, f"max_steps={steps}", *more))
        pipeline.run()
        return pipeline

    straight = run(tmp_path / "straight", 3)
    stopped = run(tmp_path / "stopped", 2)
    assert stopped.magnet.taken_at == 1
    resumed = AgenticPipeline(_config(tmp_path / "stopped", *extra, "max_steps=3",
                                      "resume=latest"))
    resumed._maybe_resume()
    assert resumed.magnet.taken_at == 1
    for name in resumed.agent_names:
        for key, value in stopped.magnet.tensors[name].items():
            assert torch.equal(resumed.magnet.tensors[name][key], value)
        # The magnet is the step-1 adapter, not the step-2 one the run resumed with.
        now = resumed.model.export_adapter(name)
        assert any(not torch.equal(now[k], v) for k, v in resumed.magnet.tensors[name].items())
    resumed.run()
    assert straight.magnet.taken_at == resumed.magnet.taken_at == 3
    for name in straight.agent_names:
        a, b = straight.model.export_adapter(name), resumed.model.export_adapter(name)
        assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(("override", "key"), [
    ("trainer.action_entropy_coef=-0.1", "trainer.action_entropy_coef"),
    ("trainer.magnet_coef=-1", "trainer.magnet_coef"),
    ("trainer.magnet_refresh=0", "trainer.magnet_refresh"),
    ("trainer.magnet=nash", "trainer.magnet"),
    ("trainer.magnet_kl=backward", "trainer.magnet_kl"),
    ("trainer.bonus_decay_steps=-1", "trainer.bonus_decay_steps"),
    ("trainer.bonus_decay_steps=1.5", "trainer.bonus_decay_steps"),
    ("trainer.bonus_decay_steps=10", "trainer.bonus_decay_steps"),  # no bonus to decay
])
def test_bad_regulariser_settings_are_refused_naming_the_key(tmp_path, override, key):
    # load_config validates: the one-line error, before any model loads.
    with pytest.raises(CLIError, match=key.replace(".", r"\.")):
        _config(tmp_path / "run", override)


def test_legal_move_terms_need_constrained_decoding(tmp_path):
    with pytest.raises(CLIError, match=r"trainer\.action_entropy_coef.*constrained"):
        _config(tmp_path / "run", "trainer.action_entropy_coef=0.05",
                "rollout.constrained_decoding=false")


def test_a_normalisation_that_pools_one_agents_seats_is_refused(tmp_path):
    # One agent in both seats of a zero-sum game: normalising its advantages by agent would
    # centre its seat-0 wins against its seat-1 losses.
    self_play = ["team.num_agents=1", "env.seat_to_agent=[[agent_0,agent_0]]",
                 "advantage.estimator=rae", "advantage.norm=whiten"]
    with pytest.raises(CLIError, match=r"advantage\.norm_by.*seats \[0, 1\]"):
        _config(tmp_path / "a", *self_play)
    with pytest.raises(CLIError, match=r"advantage\.norm_by"):
        _config(tmp_path / "b", *self_play, "advantage.norm_by=agent_group")
    # Per seat, or with no normalisation, the baselines stay apart: accepted.
    assert _config(tmp_path / "c", *self_play, "advantage.norm_by=agent_seat").team.num_agents == 1
    assert _config(tmp_path / "d", *self_play[:-1]).advantage.norm == "none"


class _Quiet:
    """The tracker's progress hook, silent."""

    def progress(self, done: int, total: int, what: str) -> None:
        pass


def _move_loss_by_hand(model, turns, advantages: dict, agent_names, temperature: float):
    """-(1/D_agent) sum over an agent's decisions of A * log pi(move), pi the model's
    next-token distribution renormalised over the legal tokens at the turn's one branching
    point (Kuhn), summed over agents; with its graph (model.forward, not the no-grad pass)."""
    total = 0.0
    for index, name in enumerate(agent_names):
        own = [t for t in turns if t.trained_agent == name]
        for turn in own:
            (offset, legal, _), = turn.choices
            prefix = turn.prompt_ids + turn.response_ids[:offset]
            ids = torch.tensor([prefix + [token] for token in legal])
            positions = torch.zeros(ids.shape, dtype=torch.bool)
            positions[:, -1] = True
            logp, _ = model(ids, torch.ones_like(ids), torch.full((len(legal),), index),
                            positions=positions, temperature=temperature)
            move = torch.log_softmax(logp[:, -1], 0)[legal.index(turn.response_ids[offset])]
            total = total - advantages[id(turn)] * move / len(own)
    return total


@pytest.mark.parametrize("policy_over", ["moves", "tokens"])
def test_policy_over_moves_steps_along_the_constrained_policys_gradient(tmp_path, policy_over):
    """trainer.policy_over=moves: one SGD step (lr 1, no clipping) moves every adapter by
    exactly minus the gradient of -mean_decisions A * log pi(move), pi the policy constrained
    decoding plays; forced tokens add nothing. The token-level loss ('tokens') does not."""
    cfg = _config(tmp_path / "run", "max_steps=1", f"trainer.policy_over={policy_over}",
                  "team.optim.name=sgd", "team.optim.lr=1.0", "team.optim.max_grad_norm=0")
    pipeline = AgenticPipeline(cfg)
    scheduler = pipeline.scheduler(pipeline.train_seatings, evaluation=False)
    result = pipeline.synced_rollout(scheduler, 7, _Quiet(), "episodes")[0]
    batch = result.batch
    trained = [t for t in result.turns if t.trained_agent is not None]
    assert len(trained) == len(batch)  # one row per trained turn, in order
    per_row = torch.tensor([1.0 if i % 3 else -2.0 for i in range(len(batch))])
    advantages = {id(t): float(a) for t, a in zip(trained, per_row, strict=True)}
    batch = batch.with_fields(advantages=per_row[:, None] * batch.response_mask.float())
    model, names = pipeline.model, pipeline.agent_names
    before = {name: model.export_adapter(name) for name in names}
    params = {name: dict(model.named_agent_tensors(name)) for name in names}
    for name in names:
        for p in params[name].values():
            p.grad = None
    _move_loss_by_hand(model, trained, advantages, names, pipeline.policy_temperature).backward()
    expected = {name: {k: before[name][k] - p.grad.detach().cpu() for k, p in
                       params[name].items()} for name in names}
    for name in names:
        for p in params[name].values():
            p.grad = None
    pipeline.trainer.train_step(batch)
    moved = [(name, key) for name in names for key, value in model.export_adapter(name).items()
             if not torch.equal(value, before[name][key])]
    assert moved  # the step did something
    gap = max(float((model.export_adapter(name)[k] - expected[name][k]).abs().max())
              for name in names for k in before[name])
    if policy_over == "moves":
        assert gap < 1e-5
    else:
        assert gap > 1e-3  # the token-level loss is another function of the weights


def test_policy_over_moves_needs_constrained_decoding_and_token_happo(tmp_path):
    with pytest.raises(CLIError, match=r"trainer\.policy_over.*constrained"):
        _config(tmp_path / "a", "trainer.policy_over=moves", "rollout.constrained_decoding=false")
    with pytest.raises(CLIError, match=r"trainer\.policy_over.*HAPPO"):
        _config(tmp_path / "b", "trainer.policy_over=moves", "advantage.estimator=happo",
                "critic.mode=shared")
    with pytest.raises(CLIError, match=r"trainer\.policy_over='move'"):
        _config(tmp_path / "c", "trainer.policy_over=move")
