"""The benchmark scripts that run on this CPU at a small size, each run in this process as its
command line runs it (``main()`` with its arguments): what each reports holds together. (The
GPU-only ones, decode_host.py and vs_comlrl.py, and the Ray ones, whose roles the tests of
tests/distributed run, are run on the GPU machine; benchmarks/README.md.)"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

pytestmark = pytest.mark.slow


def run_main(module: str, argv: list[str], monkeypatch, capsys, out: Path) -> str:
    """``python benchmarks/<module>.py argv`` in this process, $OUT set; what it printed."""
    import importlib

    script = importlib.import_module(module)
    monkeypatch.setenv("OUT", str(out))
    monkeypatch.setattr(sys, "argv", [f"{module}.py", *argv])
    capsys.readouterr()
    script.main()
    return capsys.readouterr().out


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "constrained"])
def test_rollout_cpu_reports_the_format_errors_of_each_agent(tmp_path, monkeypatch, capsys,
                                                             constrained):
    run_main("rollout_cpu", ["--games", "2", *(["--constrained"] if constrained else [])],
             monkeypatch, capsys, tmp_path)
    report = json.loads((tmp_path / "rollout_cpu.json").read_text())
    assert report["games"] == 2 and report["constrained_decoding"] is constrained
    assert 0 < report["generated_tokens"] <= report["llm_turns"] * report["max_new_tokens"]
    rates = report["format_error_rate"]
    assert set(rates) == {"agent_0", "agent_1"}
    # free text: the untrained tiny model never writes a legal move (every turn falls back to
    # a random one); constrained decoding only ever writes legal moves. (The report said None
    # for both agents: it asked for "agent_agent_0/format_error_rate".)
    assert all(rate == (0.0 if constrained else 1.0) for rate in rates.values()), rates


def test_checkpoint_growth_stays_flat_once_the_snapshot_pool_is_full(tmp_path, monkeypatch,
                                                                      capsys):
    run_main("checkpoint_growth", ["--steps", "5", "--max_size", "3"], monkeypatch, capsys,
             tmp_path)
    report = json.loads((tmp_path / "checkpoint_growth.json").read_text())
    series = report["series"]
    assert report["saves"] == 5 and [s["step"] for s in series] == [1, 2, 3, 4, 5]
    # each agent's pool: its step-0 snapshot, then one more per save, at most 3 kept
    assert [s["snapshots_in_pool"] for s in series] == [4, 6, 6, 6, 6]
    assert series[0]["snapshots_bytes"] < series[1]["snapshots_bytes"]
    for later in series[2:]:  # flat once full: the oldest snapshot goes as a new one comes
        assert later["snapshots_bytes"] == series[1]["snapshots_bytes"], later
        assert later["trainer_state_bytes"] == series[1]["trainer_state_bytes"], later
    assert report["last"]["snapshots_in_pool"] == report["after_max_size_saves"][
        "snapshots_in_pool"] == 6


def test_logprob_memory_times_the_pass_and_the_step_on_the_responses(tmp_path, monkeypatch,
                                                                      capsys):
    run_main("logprob_memory", ["--tiny"], monkeypatch, capsys, tmp_path)
    report = json.loads((tmp_path / "logprob_memory.json").read_text())
    assert report["api"] == "positions/micro-batched" and report["device"] == "cpu"
    # 16 rows of 64 tokens, prompts of 40 +- 20: 4 to 44 response tokens a row
    assert (report["rows"], report["tokens"]) == (16, 64)
    assert 16 * 4 <= report["response_tokens"] <= 16 * 44
    for phase in ("old_logprob", "train_step"):
        assert report[phase]["seconds"] > 0 and "peak_gb" not in report[phase]  # CUDA only


def test_prefill_cost_times_each_backend_and_captures_no_graph_on_a_cpu(tmp_path, monkeypatch,
                                                                        capsys):
    run_main("prefill_cost", ["--tiny", "--backends", "default", "math", "graphs",
                              "--admissions", "3", "--rounds", "2"], monkeypatch, capsys,
             tmp_path)
    report = json.loads((tmp_path / "prefill_cost.json").read_text())
    assert report["admissions"] == 6 and report["shape"] == "tiny"
    assert set(report["backends"]) == {"default", "math", "graphs"}
    for figures in report["backends"].values():
        assert 0 < figures["host_ms"] <= figures["done_ms"]
    # no CUDA graph on a CPU: the graphs path prefills eagerly, the same logits
    assert report["graphs_captured"] == 0 and report["graphs_max_logit_gap"] == 0.0


def test_policy_step_moves_the_policy_by_what_the_rate_allows(tmp_path, monkeypatch, capsys):
    lines = {}
    for lr in ("1e-2", "1e-12"):
        printed = run_main("policy_step", ["--tiny", "--steps", "1", "--override",
                                           f"team.optim.lr={lr}"], monkeypatch, capsys,
                           tmp_path)
        lines[lr] = [json.loads(line) for line in printed.splitlines() if line.startswith("{")]
    for lr, records in lines.items():
        assert [r["step"] for r in records] == [1]
        for agent in ("agent_0", "agent_1"):
            moved = records[0][agent]
            assert 0 < moved["legal_move_entropy"] <= math.log(2)  # two legal moves
            assert 0 <= moved["mean_log_odds_change"] <= moved["max_log_odds_change"]
            assert moved["grad_norm"] > 0
            if lr == "1e-12":  # a step this small leaves every state's policy where it was
                assert moved["max_log_odds_change"] == 0.0, moved
            else:
                assert moved["mean_log_odds_change"] > 0.01, moved
