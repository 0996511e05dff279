"""scripts/device_runs.sh, the GPU machine's run manager, on this machine: what a `watch` or
`collect` call sends back fits the device's return limits (at most 8 files of 16 MiB), and
`unpack` here restores each run's files and the compile cache, byte for byte."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device_runs.sh"
MiB = 1 << 20


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)


def test_collect_sends_few_small_files_and_unpack_restores_them(tmp_path):
    runs, out, keep = tmp_path / "runs", tmp_path / "out", tmp_path / "keep"
    out.mkdir()
    for name in ("run_a_s0", "run_a_s1", "run_b", "run_c"):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.jsonl").write_text(json.dumps({"step": 1, "run": name}) + "\n")
        (runs / name / "tactics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
        (runs / f"{name}.log").write_text("x" * 30_000 + "last line\n")
    (runs / "run_a_s0" / "profile.json").write_text("{}")
    (runs / "out_A").mkdir()  # a launched run's results, written when it ends
    for name in ("learning_s0.json", "learning_tictactoe_s0.png",
                 "learning_tictactoe_s0_tactics.png"):
        (runs / "out_A" / name).write_bytes(b"result " + name.encode())
    cache = os.urandom(38 * MiB)  # the size one run's torch.compile artifacts came to
    (runs / "run_a_s0" / "compile_cache.bin").write_bytes(cache)
    env = {"DEVICE_RUNS": str(runs), "OUT": str(out), "DEVICE_PIECES": str(keep),
           "DEVICE_CARD": "NVIDIA H100 80GB HBM3"}

    assert _run("collect", env=env).returncode == 0
    sent = sorted(path.name for path in out.iterdir())
    assert len(sent) <= 8 and all(path.stat().st_size <= 16 * MiB for path in out.iterdir())
    assert sent == ["compile_cache_h100.bin_aa", "compile_cache_h100.bin_ab",
                    "compile_cache_h100.bin_ac", "progress.tgz"]
    with tarfile.open(out / "progress.tgz") as archive:
        names = {Path(name).name for name in archive.getnames()}
    assert {"run_a_s0_metrics.jsonl", "run_c_tactics.jsonl", "run_a_s0_profile.json",
            "run_b.log", "learning_s0.json", "learning_tictactoe_s0_tactics.png"} <= names

    for piece in out.glob("compile_cache_*.bin_*"):  # the next call sends the cache no more
        piece.unlink()
    assert _run("collect", env=env).returncode == 0
    assert sorted(path.name for path in out.iterdir()) == ["progress.tgz"]

    # another card's cache, unpacked earlier, is kept beside this one's
    other = os.urandom(3 * MiB)
    keep.mkdir()
    (keep / "cc_h200_aa").write_bytes(other[:MiB])
    (keep / "cc_h200_ab").write_bytes(other[MiB:])
    out2 = tmp_path / "out2"
    out2.mkdir()
    (runs / ".compile_cache_sent").unlink()
    assert _run("collect", env={**env, "OUT": str(out2)}).returncode == 0
    done = _run("unpack", str(out2), env=env)
    assert done.returncode == 0, done.stderr
    assert (keep / "compile_cache_h100.bin").read_bytes() == cache
    pieces = sorted(keep.glob("cc_h100_*"))
    assert [piece.name for piece in pieces] == ["cc_h100_aa", "cc_h100_ab", "cc_h100_ac"]
    assert b"".join(piece.read_bytes() for piece in pieces) == cache
    # each fits one call beside a 31 MB piece of SmolLM2 and a 16 MiB working tree
    assert all(piece.stat().st_size <= 14_000_000 for piece in pieces)
    assert (keep / "cc_h200_aa").read_bytes() + (keep / "cc_h200_ab").read_bytes() == other
    progress = keep / "progress"
    assert json.loads((progress / "run_b_metrics.jsonl").read_text())["run"] == "run_b"
    png = (progress / "A" / "learning_tictactoe_s0.png").read_bytes()  # out_A's, in A/
    assert png == b"result learning_tictactoe_s0.png"
    log = (progress / "run_c.log").read_text()
    assert len(log) == 20_000 and log.endswith("last line\n")  # the log's tail


def test_watch_returns_small_and_leaves_the_compile_cache_to_collect(tmp_path):
    """A `watch` that brought 39 MB of compile cache back returned so late that the machine
    went back (30 s idle) before the next call came, runs and all (session 59): `watch` sends
    the metrics only, `collect` (the last call) the cache too."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    (runs / "run_a").mkdir(parents=True)
    (runs / "run_a" / "metrics.jsonl").write_text(json.dumps({"step": 3}) + "\n")
    (runs / "run_a" / "compile_cache.bin").write_bytes(os.urandom(20 * MiB))
    (runs / "A.log").write_text("step 3/80 ...\n")
    env = {"DEVICE_RUNS": str(runs), "OUT": str(out), "DEVICE_CARD": "NVIDIA H200"}
    done = _run("watch", "0", env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in out.iterdir()) == ["progress.tgz"]
    assert (out / "progress.tgz").stat().st_size < MiB
    assert _run("collect", env=env).returncode == 0
    assert sorted(path.name for path in out.iterdir()) == [
        "compile_cache_h200.bin_aa", "compile_cache_h200.bin_ab", "progress.tgz"]


@pytest.mark.slow  # a timed watch (~2 s): the quick subset stays under 3 minutes
def test_watch_never_sleeps_past_its_seconds(tmp_path):
    """`watch 560` with a 60-s period slept to 600 s, the call's limit, and brought nothing back
    (session 61): the last sleep is cut to what is left, then the progress is packed."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    runs.mkdir()
    (runs / "A.log").write_text("step 3/80 ...\n")
    env = {"DEVICE_RUNS": str(runs), "OUT": str(out), "DEVICE_WATCH_EVERY": "60"}
    done = subprocess.run(["bash", str(SCRIPT), "watch", "2"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=40)  # 60 s on the old script
    assert done.returncode == 0, done.stderr
    assert "A.log: step 3/80" in done.stdout
    assert (out / "progress.tgz").exists()


@pytest.mark.slow  # a detached benchmark (~2 s): the quick subset stays under 3 minutes
def test_watch_returns_once_every_launched_benchmark_has_ended(tmp_path):
    """`watch 600` beside a benchmark that ends after a second returns with its last line
    (session 67's watched two finished runs until its SECONDS were spent); while one still
    runs, it watches on."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    env = {"DEVICE_RUNS": str(runs), "OUT": str(out), "DEVICE_WATCH_EVERY": "1"}
    assert _run("bench", "short", 'sleep 1; echo "[12:00:01] short done"', env=env).returncode == 0
    done = subprocess.run(["bash", str(SCRIPT), "watch", "600"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)  # 600 s without the fix
    assert done.returncode == 0, done.stderr
    assert "short.log: [12:00:01] short done" in done.stdout
    assert "every run and benchmark here has ended" in done.stdout
    assert (out / "progress.tgz").exists()
    # a benchmark still running: `watch 2` watches its full 2 s and says nothing has ended
    assert _run("bench", "long", "sleep 30", env=env).returncode == 0
    done = subprocess.run(["bash", str(SCRIPT), "watch", "2"], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "has ended" not in done.stdout
    os.kill(int((runs / "long.pid").read_text()), signal.SIGTERM)


def test_watch_stops_at_once_on_a_machine_without_runs(tmp_path):
    done = _run("watch", "600", env={"DEVICE_RUNS": str(tmp_path / "none"),
                                     "OUT": str(tmp_path)})
    assert done.returncode == 3 and "no runs here" in done.stderr


def test_a_launched_run_writes_its_results_where_watch_collects_them(tmp_path):
    """`launch` points the detached run's $OUT at a folder of its own under the runs (not at
    the launching call's $OUT, which a later call empties); a stand-in python shows it."""
    runs, bin_dir = tmp_path / "runs", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"  # writes what learning.py would, where $OUT says
    fake.write_text('#!/bin/sh\necho "$@" > "$OUT/learning.json"\n')
    fake.chmod(0o755)
    env = {"DEVICE_RUNS": str(runs), "OUT": str(tmp_path / "call_out"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = _run("launch", "A", "--recipes", "kuhn_nash", env=env)
    assert done.returncode == 0, done.stderr
    result = runs / "out_A" / "learning.json"
    for _ in range(100):  # the run is detached: wait for it
        if result.exists() and result.read_text():
            break
        time.sleep(0.05)
    assert "--recipes kuhn_nash" in result.read_text()
    assert not (tmp_path / "call_out").exists()


def test_each_launched_run_gets_its_share_of_the_cores(tmp_path):
    """One run per GPU: OMP_NUM_THREADS = cores / GPUs (at least 1), unless the caller set it."""
    runs, bin_dir = tmp_path / "runs", tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text('#!/bin/sh\necho "$OMP_NUM_THREADS" > "$OUT/threads"\n')
    smi = bin_dir / "nvidia-smi"  # a machine of two GPUs
    smi.write_text('#!/bin/sh\necho "GPU 0: H100 (UUID: a)"\necho "GPU 1: H100 (UUID: b)"\n')
    for path in (fake, smi):
        path.chmod(0o755)
    env = {"DEVICE_RUNS": str(runs), "OUT": str(tmp_path / "call_out"),
           "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("OMP_NUM_THREADS", None)

    def threads_of(name: str, **extra: str) -> str:
        run_env = {key: value for key, value in {**os.environ, **env, **extra}.items()
                   if key != "OMP_NUM_THREADS" or "OMP_NUM_THREADS" in extra}
        done = subprocess.run(["bash", str(SCRIPT), "launch", name, "--recipes", "kuhn_nash"],
                              env=run_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        result = runs / f"out_{name}" / "threads"
        for _ in range(100):  # the run is detached: wait for it
            if result.exists() and result.read_text():
                break
            time.sleep(0.05)
        return result.read_text().strip()

    assert threads_of("A") == str(max(1, len(os.sched_getaffinity(0)) // 2))  # = nproc / 2
    assert threads_of("B", OMP_NUM_THREADS="3") == "3"


@pytest.mark.slow  # a detached chain (~2 s): the quick subset stays under 3 minutes
def test_a_benchmark_runs_detached_and_comes_back_with_the_runs(tmp_path):
    """`bench NAME COMMAND` (a benchmark chain on a second GPU beside a learning run): it
    outlives the call, writes under its own $OUT, and `watch` shows its last line and brings
    its files back in progress.tgz."""
    runs, out = tmp_path / "runs", tmp_path / "call_out"
    out.mkdir()
    env = {"DEVICE_RUNS": str(runs), "OUT": str(out), "DEVICE_CARD": "NVIDIA H200",
           "DEVICE_WATCH_EVERY": "1"}
    command = 'echo "[12:00:00] zero 2 done"; echo \'{"ratio": 1.5}\' > "$OUT/zero.json"'
    done = _run("bench", "Z", command, env=env)
    assert done.returncode == 0, done.stderr
    result = runs / "out_Z" / "zero.json"
    for _ in range(100):  # detached: wait for it
        if result.exists() and result.read_text():
            break
        time.sleep(0.05)
    assert json.loads(result.read_text()) == {"ratio": 1.5}
    assert not list(out.iterdir())  # nothing in the launching call's own $OUT
    done = _run("watch", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert "Z.log: [12:00:00] zero 2 done" in done.stdout
    with tarfile.open(out / "progress.tgz") as tar:
        names = {Path(name).name for name in tar.getnames()}
    assert {"zero.json", "Z.log"} <= names
    # a second chain's file of the same name comes back beside the first, not over it
    assert _run("bench", "Y", 'echo \'{"ratio": 1.2}\' > "$OUT/zero.json"', env=env).returncode == 0
    for _ in range(100):
        if (runs / "out_Y" / "zero.json").exists() and (runs / "out_Y" / "zero.json").read_text():
            break
        time.sleep(0.05)
    assert _run("watch", "1", env=env).returncode == 0
    with tarfile.open(out / "progress.tgz") as tar:
        kept = {Path(name).parent.name: json.loads(tar.extractfile(name).read())
                for name in tar.getnames() if name.endswith("zero.json")}
    assert kept == {"Z": {"ratio": 1.5}, "Y": {"ratio": 1.2}}


def test_engine_wheels_are_cut_into_pieces_that_fit_beside_the_working_tree(tmp_path):
    """`pack_engines` re-cuts the shared packer's 60 MiB pieces (vLLM + Ray, one tar) so that
    each fits one call with the working tree (64 MiB in all); joined they are the tar again."""
    source, keep = tmp_path / "packer", tmp_path / "keep"
    source.mkdir()
    whole = os.urandom(3 * MiB + 12345)
    (source / "piece_00").write_bytes(whole[:2 * MiB])  # the packer's own pieces, in order
    (source / "piece_01").write_bytes(whole[2 * MiB:])
    keep.mkdir()
    (keep / "eng_zz").write_bytes(b"a piece of an older pack")
    env = {"DEVICE_ENGINE_TAR_DIR": str(source), "DEVICE_PIECES": str(keep),
           "DEVICE_PIECE_BYTES": str(MiB)}
    done = _run("pack_engines", env=env)
    assert done.returncode == 0, done.stderr
    pieces = sorted(keep.glob("eng_*"))
    assert [piece.name for piece in pieces] == ["eng_aa", "eng_ab", "eng_ac", "eng_ad"]
    assert all(piece.stat().st_size <= MiB for piece in pieces)
    assert b"".join(piece.read_bytes() for piece in pieces) == whole


def test_smollm2_is_cut_again_into_the_three_call_pieces(tmp_path):
    """`recut` (run by `pack`) cuts SmolLM2's three equal pieces again into a small first one
    (it travels beside .whl), a middle and the rest: joined they are the wheel again, and an
    older cut is replaced, not appended to."""
    keep = tmp_path / "keep"
    keep.mkdir()
    whole = os.urandom(3 * MiB + 777)
    for index, start in enumerate(range(0, len(whole), MiB + 300)):  # `split`'s pieces
        (keep / f"smol_a{'abcd'[index]}").write_bytes(whole[start:start + MiB + 300])
    (keep / "p").mkdir()
    (keep / "p" / "smol_ad").write_bytes(b"a piece of an older cut")
    env = {"DEVICE_PIECES": str(keep), "DEVICE_SMOL_CUTS": f"{MiB // 2} {MiB}"}
    done = _run("recut", env=env)
    assert done.returncode == 0, done.stderr
    pieces = sorted((keep / "p").iterdir())
    assert [piece.name for piece in pieces] == ["smol_aa", "smol_ab", "smol_ac"]
    assert [piece.stat().st_size for piece in pieces] == [MiB // 2, MiB, len(whole) - MiB * 3 // 2]
    assert b"".join(piece.read_bytes() for piece in pieces) == whole


def test_ray_alone_is_packed_under_its_own_prefix(tmp_path):
    """`pack_engines ray` cuts Ray's tar into ray_* pieces and leaves the vLLM pack (eng_*) be."""
    source, keep = tmp_path / "packer", tmp_path / "keep"
    source.mkdir()
    whole = os.urandom(MiB + 777)
    (source / "piece_00").write_bytes(whole)
    keep.mkdir()
    (keep / "eng_aa").write_bytes(b"the vLLM pack")
    env = {"DEVICE_ENGINE_TAR_DIR": str(source), "DEVICE_PIECES": str(keep),
           "DEVICE_PIECE_BYTES": str(MiB)}
    done = _run("pack_engines", "ray", env=env)
    assert done.returncode == 0, done.stderr
    assert sorted(piece.name for piece in keep.iterdir()) == ["eng_aa", "ray_aa", "ray_ab"]
    assert (keep / "eng_aa").read_bytes() == b"the vLLM pack"
    assert (keep / "ray_aa").read_bytes() + (keep / "ray_ab").read_bytes() == whole


def test_a_chain_step_logs_its_run_and_copies_its_json_under_its_name(tmp_path):
    """scripts/chain.sh's ``one`` (every GPU chain's step): the script runs on the GPUs and
    threads given, in an $OUT of its own; its stdout goes to NAME.log, each JSON it wrote to
    the chain's $OUT as NAME_<file>, and its exit status is said; a run that fails keeps
    what it wrote."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "bench.py"
    script.write_text(
        "import json, os, sys\n"
        "env = os.environ\n"
        "print('gpus', env['CUDA_VISIBLE_DEVICES'], 'threads', env['OMP_NUM_THREADS'])\n"
        "open(os.path.join(os.environ['OUT'], 'bench.json'), 'w').write(json.dumps(sys.argv[1:]))\n"
        "sys.exit(int(sys.argv[1]))\n")
    done = subprocess.run(
        ["bash", "-c", f". scripts/chain.sh; one good 0,1 8 {script} 0 x; one bad 1 4 {script} 3"],
        cwd=ROOT, env={**os.environ, "OUT": str(out), "DEVICE_RUNS": str(runs)},
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "end good rc=0" in done.stdout and "end bad rc=3" in done.stdout
    assert (runs / "good.log").read_text().strip() == "gpus 0,1 threads 8"
    assert (runs / "bad.log").read_text().strip() == "gpus 1 threads 4"
    assert json.loads((out / "good_bench.json").read_text()) == ["0", "x"]
    assert json.loads((out / "bad_bench.json").read_text()) == ["3"]


def test_bring_adapters_sends_the_latest_checkpoints_agents_alone(tmp_path):
    """`bring RUN adapters`: one tgz in pieces, the latest checkpoint's agents/ (PEFT folders)
    without its trainer state (the optimizers' moments, twice the adapters' size)."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    for step, payload in (("step_00000020", b"old"), ("step_00000045", b"new")):
        folder = runs / "run_x" / "checkpoints" / step
        for agent in ("agent_0", "agent_1"):
            (folder / "agents" / agent).mkdir(parents=True)
            (folder / "agents" / agent / "adapter_model.safetensors").write_bytes(payload)
        (folder / "trainer_state.pt").write_bytes(b"x" * 1000)
    done = _run("bring", "run_x", "adapters", env={"DEVICE_RUNS": str(runs), "OUT": str(out)})
    assert done.returncode == 0, done.stderr
    (sent,) = out.iterdir()  # (one piece here; see the next test for several)
    assert sent.name == "adapters_run_x_step_00000045.tgz_aa"
    with tarfile.open(sent) as tar:
        names = sorted(tar.getnames())
        assert "trainer_state.pt" not in " ".join(names)
        files = [n for n in names if n.endswith(".safetensors")]
        assert files == ["agents/agent_0/adapter_model.safetensors",
                         "agents/agent_1/adapter_model.safetensors"]
        assert tar.extractfile(files[0]).read() == b"new"


def test_bring_adapters_cuts_pieces_that_come_back(tmp_path):
    """No file over 16 MiB comes back from the machine (session 76: a 36 MB tgz of two
    SmolLM2 adapters was left out): `bring RUN adapters` sends 15 MiB pieces whose
    concatenation, in name order, is the tgz."""
    import io
    import os

    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    folder = runs / "run_x" / "checkpoints" / "step_00000045" / "agents" / "agent_0"
    folder.mkdir(parents=True)
    payload = os.urandom(20 * 2**20)  # incompressible: the tgz stays over 16 MiB
    (folder / "adapter_model.safetensors").write_bytes(payload)
    done = _run("bring", "run_x", "adapters", env={"DEVICE_RUNS": str(runs), "OUT": str(out)})
    assert done.returncode == 0, done.stderr
    pieces = sorted(out.iterdir())
    assert [p.name for p in pieces] == ["adapters_run_x_step_00000045.tgz_aa",
                                        "adapters_run_x_step_00000045.tgz_ab"]
    assert all(p.stat().st_size <= 15 * 2**20 for p in pieces)
    joined = b"".join(p.read_bytes() for p in pieces)
    with tarfile.open(fileobj=io.BytesIO(joined)) as tar:
        member = tar.extractfile("agents/agent_0/adapter_model.safetensors")
        assert member.read() == payload
