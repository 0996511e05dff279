"""benchmarks/connect_four_gradients.py: the figures of made-up gradients computed by hand,
the log-probabilities it differentiates against the probe's own, and a tiny run end to end."""

import math
import sys
from pathlib import Path

import pytest
import torch

from tests.benchmarks.helpers import connect_four_after as after

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import connect_four_gradients as cg  # noqa: E402


def test_summary_by_hand():
    # three positions, right columns 2, 2, 5; own changes per unit step 2, 1, 4;
    # moved[t][c][s]: t's change of log P(c) per unit step for s (s == t unused: 9)
    columns = [2, 2, 5]
    grads = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    own = torch.tensor([2.0, 1.0, 4.0])
    moved = {0: {2: torch.tensor([9.0, 0.5, 2.0]), 5: torch.tensor([9.0, 0.2, 1.0]),
                 0: torch.tensor([9.0, -0.1, 0.6])},
             1: {2: torch.tensor([1.0, 9.0, 0.4]), 5: torch.tensor([0.0, 9.0, 0.8]),
                 3: torch.tensor([0.2, 9.0, 0.0])},
             2: {5: torch.tensor([0.6, 0.3, 9.0]), 2: torch.tensor([1.2, 0.5, 9.0]),
                 1: torch.tensor([0.0, -0.2, 9.0])}}
    out = cg.summary(columns, grads, own, moved)
    # same column: (s0, t1) 1.0 / 2 = 0.5; (s1, t0) 0.5 / 1 = 0.5
    assert out["transfer_same_column"] == pytest.approx(0.5)
    # other columns, change relative to own, less t's mean over its columns:
    # (s0, t2): {5: .3, 2: .6, 1: 0} mean .3 -> reads 0, column (2) .3
    # (s1, t2): {5: .3, 2: .5, 1: -.2} mean .2 -> reads .1, column .3
    # (s2, t0): {2: .5, 5: .25, 0: .15} mean .3 -> reads .2, column (5) -.05
    # (s2, t1): {2: .1, 5: .2, 3: 0} mean .1 -> reads 0, column .1
    assert out["reads"] == pytest.approx(0.075)
    assert out["column"] == pytest.approx(0.1625)
    assert out["pairs_same_column"] == 2 and out["pairs_other_column"] == 4
    # mean gradient (2/3, 1/3): |mean|^2 = 5/9, each |g|^2 = 1
    assert out["common_share"] == pytest.approx(5 / 9, abs=1e-4)


def test_batch_reads_by_hand():
    # four positions, right columns 2 5 3 5; halves {0, 2} and {1, 3}
    columns, halves, n = [2, 5, 3, 5], [[0, 2], [1, 3]], 4
    grads = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 2.0]])
    # each half's step: sign of its summed gradient, (2, 1) -> (1, 1) and (0, 3) -> (0, 1);
    # own change: mean of (1, 2) and of (1, 2): 1.5 each
    half_steps = torch.tensor([[1.0, 1.0], [0.0, 1.0]])

    def entry(first_half: float, second_half: float) -> torch.Tensor:
        return torch.tensor([0.0] * n + [first_half, second_half])

    moved = {0: {2: entry(0, 0.75), 5: entry(0, 0.0), 3: entry(0, 0.75)},
             1: {5: entry(0.9, 0), 2: entry(0.6, 0), 0: entry(0.0, 0)},
             2: {3: entry(0, 0.3), 2: entry(0, 0.0), 6: entry(0, 0.0)},
             3: {5: entry(0.3, 0), 2: entry(0.3, 0), 4: entry(0.0, 0)}}
    out = cg.batch_reads(columns, grads, half_steps, halves, moved, n)
    # first half's step on t=1: (.6, .4, 0) less 1/3 -> .2667; t=3: (.2, .2, 0) -> .0667;
    # second half's on t=0: (.5, 0, .5) -> 1/6; t=2: (.2, 0, 0) -> .1333: mean .1583
    assert out["reads_batch"] == pytest.approx(0.1583, abs=1e-4)
    # decoys: t=0's column 3 (right in 2): .5 - 1/3; t=2's column 2 (right in 0): 0 - .0667
    assert out["decoy_batch"] == pytest.approx(0.05, abs=1e-4)
    assert out["own_batch"] == pytest.approx(1.5)


@pytest.fixture(scope="module")
def tiny():
    import tempfile

    from imitation import imitation_pipeline

    return imitation_pipeline("connect_four", "mixed", "tiny", 0, tempfile.mkdtemp(), "run", [])


def test_log_probabilities_are_the_probes(tiny):
    from roll.agentic.env.openspiel_env import OpenSpielEnv
    from roll.pipeline.exploitability import move_probabilities

    state = after(1, 6, 2, 6, 3, 6)  # x to move, wins in 0 or 4
    env = OpenSpielEnv("connect_four")
    env.set_state(state)
    ours = {c: math.exp(cg.column_gradient(tiny, env, 0, c)[1]) for c in state.legal_actions(0)}
    (ids, probs), = move_probabilities(env, [state], tiny.trainer, tiny.tokenizer,
                                       lambda s: "agent_0", tiny.render, 1.0,
                                       enable_thinking=tiny.cfg.model.enable_thinking)
    assert sum(ours.values()) == pytest.approx(1.0, abs=1e-4)
    assert [ours[c] for c in ids] == pytest.approx(list(probs), abs=1e-4)
    grad, _ = cg.column_gradient(tiny, env, 0, 4)
    assert grad.shape == (sum(p.numel() for p in tiny.model.agent_parameters("agent_0")),)
    assert float(grad.abs().sum()) > 0


def test_a_tiny_measure_end_to_end(tiny):
    import connect_four_policy as policy

    cases = cg.cases_of(policy.positions(2, seed=1))
    assert len(cases) == 8  # 2 win + 2 block, each seat
    for seat, kind, state, column in cases:
        assert kind in ("win", "block") and state.current_player() == seat
        assert column in policy.classify(state)[1]  # the rule's column is a right one
    out = cg.measure(tiny, cases)
    assert out["pairs_same_column"] + out["pairs_other_column"] == 8 * 7
    assert -1.0 < out["reads"] < 1.0 and out["column"] is not None
    assert 0.0 < out["common_share"] <= 1.0
    assert out["mean_logp_right"] < 0.0
    assert out["own_batch"] > 0.0 and out["reads_batch"] is not None
