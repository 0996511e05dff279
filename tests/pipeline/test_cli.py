"""Bad configs through the CLI: one clear line naming the key, exit code 2, nothing written."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from roll.pipeline.cli import load_config, run_cli
from roll.utils.hub import PROXY_VARIABLES

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ["--config_path", str(ROOT / "examples" / "tictactoe"),
          "--config_name", "multi_agent_tictactoe"]

BAD = [
    (["env.game=tic_tac_tow"], "env.game"),
    (["env.renderer=tic_tac_toe_board"], ("env.renderer='tic_tac_toe_board'", "registered")),
    (["env.game=kuhn_poker", "env.seat_to_agent=[agent_0,agent_1]",
      "env.renderer=tic_tac_toe_lines"], ("env.renderer='tic_tac_toe_lines'", "for kuhn_poker")),
    (["env.task=math_team", "env.renderer=tic_tac_toe_lines"], ("env.renderer", "games only")),
    (["env.seat_to_agent=[agent_0,agent_9]"], "agent_9"),
    (["model.path=/no/such/model"], "model.path"),
    (["team.optim.lr=-0.001"], "optim.lr"),
    (["max_steps=[1,"], "bad override syntax"),
    (["max_stepz=3"], "max_stepz"),
    (["max_steps=abc"], "max_steps"),
    (["advantage.estimator=ppo9"], "advantage.estimator='ppo9'"),
    (["tracking.backends=[mlflow]"], "tracking.backends"),
    (["env.params.colours=3", "env.game=hanabi"], "env.params.colours"),
    (["env.game=hanabi", "env.params.players=9", "env.seat_to_agent=[agent_0,agent_1]"],
     "players"),
    (["rollout.sampling.top_p=0"], "rollout.sampling.top_p"),
    (["team.lora.target_modules=[q_proj,qkv_proj]"], "lora.target_modules"),
    (["--num_agents", "0"], "num_agents"),
    (["--lora_rank", "-8"], "lora.rank"),
    (["eval.opponent=mcts:x"], "eval.opponent"),
    (["seed=-1"], "seed=-1"),  # numpy's seeds are non-negative: once a traceback after loading
    # NaN passed every "x < 0" check and surfaced mid-run (a NaN loss, a broken sampler)
    (["team.optim.lr=nan"], "team.optim.lr=nan: must be a finite number"),
    (["trainer.kl_coef=nan"], "trainer.kl_coef=nan: must be a finite number"),
    (["rollout.sampling.temperature=inf"], "rollout.sampling.temperature=inf: must be a finite"),
    (["team.optim.betas=[0.9,nan]"], "team.optim.betas[1]=nan: must be a finite number"),
    (["rollout.engine=trt"], "rollout.engine"),
    (["keep_last=0"], "keep_last"),
    (["env.swap_roles_every=-1"], "env.swap_roles_every=-1"),
    (["env.game=hanabi", "env.params.players=3", "env.seat_to_agent=[agent_0,agent_1,agent_0]",
      "env.swap_roles_every=2"], ("env.swap_roles_every=2", "3 seats")),
    # Settings that would only fail (or silently do nothing) after the model loads.
    (["advantage.estimator=gae"], ("critic.mode='none'", "advantage.estimator=gae")),
    (["advantage.estimator=mappo", "critic.mode=per_agent"],
     ("critic.mode='per_agent'", "advantage.estimator=mappo", "'shared'")),
    (["advantage.estimator=ippo", "critic.mode=shared"], ("critic.mode='shared'", "'per_agent'")),
    (["advantage.estimator=happo", "critic.mode=per_agent"],
     ("critic.mode='per_agent'", "advantage.estimator=happo", "'shared'")),
    (["advantage.estimator=vdn", "critic.mode=shared"],
     ("critic.mode='shared'", "advantage.estimator=vdn", "'per_agent'")),
    (["critic.mode=per_agent"], ("critic.mode='per_agent'", "reads no values")),
    (["advantage.estimator=mappo", "critic.mode=shared", "critic.input=world"],
     ("critic.input='world'", "'local', 'global'")),
    (["critic.input=global"], ("critic.input='global'", "no critics")),
    (["critic.mode=both", "advantage.estimator=gae"], "critic.mode='both'"),
    (["advantage.estimator=ippo", "critic.mode=per_agent", "critic.value_clip=0"],
     "critic.value_clip=0"),
    (["advantage.estimator=ippo", "critic.mode=per_agent", "critic.micro_batch_size=0"],
     ("critic.micro_batch_size=0", "or null")),
    (["advantage.estimator=ippo", "critic.mode=per_agent", "critic.lora.target_modules=[qkv]"],
     "critic.lora.target_modules"),
    (["advantage.estimator=ippo", "critic.mode=per_agent", "critic.optim.lr=0"],
     "critic.optim.lr"),
    (["advantage.estimator=mappo", "critic.mode=shared", "cluster.backend=ray",
      "actor_train.strategy=deepspeed"],
     ("critic.mode='shared'", "actor_train.strategy='deepspeed'")),
    (["advantage.gamma=2"], "advantage.gamma=2.0"),
    (["advantage.norm=zscore"], "advantage.norm='zscore'"),
    (["team.num_agents=4"], ("env.seat_to_agent", "'agent_2' sits in no seat", "never train")),
    (["env.seat_to_agent=[[agent_0,random],[random,agent_1]]", "rollout.num_groups=1"],
     "rollout.num_groups=1"),
    (["rollout.group_size=1"], ("rollout.group_size=1", "advantage 0")),
    (["rollout.sampling.temperature=0"], ("rollout.sampling.temperature=0", "identical")),
    (["eval.greedy_too=true", "eval.temperature=0"],
     ("eval.greedy_too=True", "eval.temperature is 0")),
    (["team.agents=[{name:eval_greedy},{name:bob}]", "env.seat_to_agent=[eval_greedy,bob]"],
     ("team.agents[0].name='eval_greedy'", "namespace")),
    (["eval.opponent=agent_1"], ("eval.opponent='agent_1'", "trained agent")),
    (["eval.opponent=snapshot:ghost@3"], ("eval.opponent", "ghost")),
    (["eval.seat_to_agent=[random,random]"], ("eval.seat_to_agent", "no trained agent")),
    (["env.seat_to_agent=[agent_0,snapshot:ghost@latest]"], ("env.seat_to_agent", "ghost")),
    (["team.agents=[{name:team},{name:bob}]", "env.seat_to_agent=[team,bob]"],
     ("team.agents[0].name='team'", "namespace")),
    (["team.agents=[{name:bob},{name:rollout}]", "env.seat_to_agent=[bob,rollout]"],
     "team.agents[1].name='rollout'"),
    (["env.action.fallback=pass"], "env.action.fallback='pass'"),
    (["env.action.answer_pattern='(a)(b)'"], ("env.action.answer_pattern", "capture group")),
    (["team.seed=3"], "team.seed"),  # read by nothing: an unknown key, not a silent no-op
    (["env.task=math_team", "env.params.max_rounds=-1"], "env.params.max_rounds=-1"),
    (["env.task=math_team", "env.params.rounds=2"], ("env.params.rounds", "no such parameter")),
    (["env.task=chess_team"], ("env.task='chess_team'", "unknown task")),
    (["resume=/no/such/checkpoint"], ("resume='/no/such/checkpoint'", "no such folder")),
    (["model.device=cuda:99"], "model.device='cuda:99'"),
    (["rollout.hf.lora_kernels=cuda"], ("rollout.hf.lora_kernels='cuda'", "'triton'")),
    (["rollout.hf.lora_kernels=triton"], ("rollout.hf.lora_kernels='triton'", "model.device")),
    (["rollout.hf.lora_kernels=triton_streams"],
     ("rollout.hf.lora_kernels='triton_streams'", "model.device")),
    (["rollout.hf.attention_kernel=flash"], ("rollout.hf.attention_kernel='flash'", "'triton'")),
    (["rollout.hf.attention_kernel=triton"], ("rollout.hf.attention_kernel='triton'",
                                              "model.device")),
    (["rollout.hf.compile=true"], ("rollout.hf.compile=True", "model.device")),
    (["rollout.hf.prefill_graphs=true"], ("rollout.hf.prefill_graphs=True", "model.device")),
    (["trainer.compile=true", "team.lora.dropout=0.1"],
     ("trainer.compile=True", "dropout 0.1")),
    (["trainer.compile=true", "actor_train.strategy=deepspeed", "cluster.backend=ray"],
     ("trainer.compile=True", "actor_train.strategy=torch only")),
    (["team.optim.name=sgd", "actor_train.strategy=deepspeed", "cluster.backend=ray"],
     ("team.optim.name='sgd'", "AdamW only")),
    (["actor_train.zero3_live_elements=1000", "actor_train.strategy=deepspeed",
      "cluster.backend=ray"], ("actor_train.zero3_live_elements=1000", "zero_stage=3")),
    (["actor_train.zero3_live_elements=0", "actor_train.strategy=deepspeed",
      "actor_train.zero_stage=3", "cluster.backend=ray"],
     ("actor_train.zero3_live_elements=0", ">= 1")),
    (["trainer.share_prefix=true", "actor_train.strategy=deepspeed", "actor_train.zero_stage=3",
      "cluster.backend=ray"], ("trainer.share_prefix=True", "zero_stage=3")),
    (["actor_train.zero3_persist_elements=-1"],
     ("actor_train.zero3_persist_elements=-1", ">= 0")),
    (["actor_train.zero3_gather=block"],
     ("actor_train.zero3_gather='block'", "['layer', 'projection']")),
    (["team.optim.target_kl=0.001"], ("team.optim.target_kl=0.001", "ppo_mini_batch_size")),
    (["team.optim.target_kl=-0.001", "trainer.ppo_epochs=2"], "team.optim.target_kl=-0.001"),
    # Refused before any model loads (they used to fail after it):
    (["trainer.compile_backend=foo"], ("trainer.compile_backend='foo'", "aot_eager")),
    (["team.agents=[{name:critic_bob},{name:bob}]", "env.seat_to_agent=[critic_bob,bob]",
      "advantage.estimator=ippo", "critic.mode=per_agent"],
     ("team.agents[0].name='critic_bob'", "critic")),
    (["team.agents=[{name:critic},{name:bob}]", "env.seat_to_agent=[critic,bob]",
      "advantage.estimator=mappo", "critic.mode=shared"], "team.agents[0].name='critic'"),
]
if importlib.util.find_spec("vllm") is not None:  # without vllm, rollout.engine=vllm is refused
    BAD.append((["rollout.engine=vllm", "rollout.vllm.max_model_len=512"],
                ("rollout.vllm.max_model_len=512", "rollout.max_prompt_tokens")))


@pytest.mark.parametrize("args, names", BAD)
def test_bad_config_is_one_line_naming_the_key(args, names, tmp_path, capsys):
    out = tmp_path / "run"
    flags = [a for a in args if a.startswith("--") or a.lstrip("-").isdigit()]
    overrides = [a for a in args if a not in flags]
    code = run_cli(
        lambda cfg: pytest.fail("the pipeline must not start"),
        CONFIG + flags + overrides + [f"output_dir={out}"],
        "test",
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("config error")
    for name in (names,) if isinstance(names, str) else names:
        assert name in err
    assert not out.exists()


def _refused(args: list[str], capsys) -> str:
    code = run_cli(lambda cfg: pytest.fail("the pipeline must not start"), CONFIG + args, "test")
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize("below", ["", "run"])
def test_output_dir_naming_a_file_is_refused(below, tmp_path, capsys):
    existing = tmp_path / "notes.txt"
    existing.write_text("mine")
    out = existing / below if below else existing
    err = _refused([f"output_dir={out}"], capsys)
    assert err.startswith(f"config error: output_dir='{out}'") and "is a file" in err
    assert existing.read_text() == "mine"


def test_an_output_dir_that_cannot_be_written_is_refused_before_the_model(capsys):
    """/proc takes no new folders, even from root (chmod would not stop root): the first
    checkpoint used to fail there, after the model had loaded, in a traceback."""
    err = _refused(["output_dir=/proc/roll_run/x"], capsys)
    assert err.startswith("config error: output_dir='/proc/roll_run/x': cannot write in /proc")
    assert not any(p.name.startswith(".roll-write-check-") for p in Path("/proc").iterdir())


def _checkpoint(root: Path, step: int, agents=("agent_0", "agent_1"), adapter_config=None):
    """A complete checkpoint at ``step`` of these agents' adapter files, written by hand (the
    checks read names and adapter_config.json, not weights)."""
    from roll.utils.checkpoint import save_checkpoint

    def adapters(folder):
        for name in agents:
            (folder / name).mkdir()
            (folder / name / "adapter_model.safetensors").write_bytes(b"x")
            if adapter_config is not None:
                (folder / name / "adapter_config.json").write_text(adapter_config)

    return save_checkpoint(root, step, {"step": step}, adapters, keep_last=1)


def test_resume_of_a_checkpoint_with_other_agents_is_refused(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "old", 3, agents=("agent_0", "ghost"))
    out = tmp_path / "run"
    err = _refused([f"resume={ckpt}", f"output_dir={out}"], capsys)
    assert err.startswith(f"config error: resume='{ckpt}'")
    assert "['agent_0', 'ghost']" in err and "['agent_0', 'agent_1']" in err
    assert not out.exists()
    # resume=latest looks in output_dir: the same checkpoint found there is refused too.
    err = _refused(["resume=latest", f"output_dir={tmp_path / 'old'}"], capsys)
    assert err.startswith("config error: resume='latest'") and "ghost" in err


def test_resume_of_a_checkpoint_past_max_steps_is_refused(tmp_path, capsys):
    """The loop would not run: it was a silent exit 0 after the model had loaded."""
    ckpt = _checkpoint(tmp_path / "old", 30)
    err = _refused([f"resume={ckpt}", "max_steps=20", f"output_dir={tmp_path / 'run'}"], capsys)
    assert err == (f"config error: max_steps=20: resume='{ckpt}' ({ckpt}) is at step 30, past "
                   "it: raise max_steps to train on")


@pytest.mark.parametrize("override, refused", [
    (None, None),  # the example's LoRA (rank 8, alpha 16, every linear layer): resumes
    ("team.lora.rank=4", "team.lora.rank=4: {ckpt} holds agent_0's adapter with rank 8"),
    ("team.lora.alpha=32", "team.lora.alpha=32.0: {ckpt} holds agent_0's adapter with alpha 16.0"),
    ("team.lora.target_modules=[q_proj,v_proj]",
     "team.lora.target_modules=['q_proj', 'v_proj']: {ckpt} holds agent_0's adapter with "
     "target_modules ['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', "
     "'v_proj']"),
    ("team.lora.dropout=0.1", None),  # a training setting, not what the weights mean
])
def test_resume_with_another_lora_shape_is_refused_before_the_model(override, refused,
                                                                     tmp_path, capsys):
    """A changed rank or target failed once the weights had loaded; a changed alpha ran on,
    every saved update rescaled."""
    ckpt = _checkpoint(tmp_path / "old", 3, adapter_config=(  # the fields PEFT writes
        '{"r": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "target_modules": '
        '["v_proj", "q_proj", "k_proj", "o_proj", "up_proj", "gate_proj", "down_proj"]}'))
    args = [f"resume={ckpt}", f"output_dir={tmp_path / 'run'}"] + ([override] if override else [])
    if refused is None:
        assert run_cli(lambda cfg: None, CONFIG + args, "test") == 0
        return
    err = _refused(args, capsys)
    assert err.startswith("config error: " + refused.format(ckpt=ckpt)), err
    assert err.endswith("resume with the same LoRA, or start a new output_dir")


@pytest.mark.parametrize("critics_saved, override, refused", [
    (True, [], None),
    (True, ["critic.lora.rank=4"],
     "critic.lora.rank=4: {ckpt} holds critic_agent_0's adapter with rank 8"),
    (False, [], "critic.mode='per_agent': {ckpt} holds no critic_agent_0"),  # saved without
])
def test_resume_checks_the_critics_adapters_too(critics_saved, override, refused, tmp_path,
                                                capsys):
    from roll.utils.checkpoint import save_checkpoint

    config = ('{"r": 8, "lora_alpha": 16.0, "target_modules": ["q_proj", "k_proj", "v_proj", '
              '"o_proj", "gate_proj", "up_proj", "down_proj"]}')

    def adapters(folder):
        names = ["agent_0", "agent_1"]
        for name in names + (["critic_agent_0", "critic_agent_1"] if critics_saved else []):
            where = folder / name if name in names else folder.parent / "critics" / name
            where.mkdir(parents=True)
            (where / "adapter_model.safetensors").write_bytes(b"x")
            (where / "adapter_config.json").write_text(config)

    ckpt = save_checkpoint(tmp_path / "old", 3, {"step": 3}, adapters, keep_last=1)
    args = [f"resume={ckpt}", f"output_dir={tmp_path / 'run'}", "advantage.estimator=ippo",
            "critic.mode=per_agent", *override]
    if refused is None:
        assert run_cli(lambda cfg: None, CONFIG + args, "test") == 0
        return
    assert _refused(args, capsys).startswith("config error: " + refused.format(ckpt=ckpt))


def test_good_config_validates_and_flags_become_overrides(capsys):
    code = run_cli(lambda cfg: None, CONFIG + ["--validate_only", "--num_agents", "2",
                                               "--lora_rank", "32", "--lora_alpha", "64",
                                               "max_steps=7"], "test")
    text = capsys.readouterr().out
    assert code == 0
    assert "rank: 32" in text and "alpha: 64.0" in text and "max_steps: 7" in text


def test_rollout_compile_defaults_to_on_where_the_model_is_on_cuda():
    """rollout.hf.compile: null (the default) compiles the decode step on CUDA with continuous
    batching only; an explicit value wins (false on CUDA: the eager step, still captured)."""
    from roll.pipeline.builders import hf_compile

    def resolved(*overrides: str) -> bool:
        return hf_compile(load_config(str(ROOT / "examples" / "tictactoe"),
                                      "multi_agent_tictactoe", list(overrides),
                                      check_paths=False))

    assert resolved() is False  # the example runs on CPU
    assert resolved("model.device=cuda") is True
    assert resolved("model.device=cuda:1") is True
    assert resolved("model.device=cuda", "rollout.hf.compile=false") is False
    # lock-step rounds would compile per batch bucket: eager unless asked
    assert resolved("model.device=cuda", "rollout.continuous=false") is False
    assert resolved("model.device=cuda", "rollout.continuous=false",
                    "rollout.hf.compile=true") is True


def test_prefill_graphs_default_to_on_where_the_decode_step_is_captured():
    """rollout.hf.prefill_graphs: null (the default) replays admissions' prefills as CUDA graphs
    on CUDA where the decode step is captured (continuous batching, cuda_graphs on), eager on
    the CPU. An explicit value wins."""
    from roll.pipeline.builders import hf_prefill_graphs

    def cfg(*overrides: str):
        return load_config(str(ROOT / "examples" / "hanabi"), "multi_agent_hanabi",
                           list(overrides), check_paths=False)

    assert hf_prefill_graphs(cfg()) is False  # the example runs on CPU
    assert hf_prefill_graphs(cfg("model.device=cuda")) is True
    assert hf_prefill_graphs(cfg("model.device=cuda", "rollout.hf.cuda_graphs=false")) is False
    assert hf_prefill_graphs(cfg("model.device=cuda", "rollout.continuous=false")) is False
    assert hf_prefill_graphs(cfg("model.device=cuda", "rollout.hf.prefill_graphs=false")) is False


def test_fuse_projections_default_to_on_where_the_model_is_on_cuda():
    """rollout.hf.fuse_projections: null (the default) fuses q/k/v and gate/up on CUDA, not on
    the CPU; an explicit value wins either way."""
    from roll.pipeline.builders import hf_fuse_projections

    def cfg(*overrides: str):
        return load_config(str(ROOT / "examples" / "hanabi"), "multi_agent_hanabi",
                           list(overrides), check_paths=False)

    assert hf_fuse_projections(cfg()) is False  # the example runs on CPU
    assert hf_fuse_projections(cfg("model.device=cuda")) is True
    off = ("model.device=cuda", "rollout.hf.fuse_projections=false")
    assert hf_fuse_projections(cfg(*off)) is False
    assert hf_fuse_projections(cfg("rollout.hf.fuse_projections=true")) is True


def test_attention_kernel_defaults_to_triton_where_the_model_is_on_cuda():
    """rollout.hf.attention_kernel: null (the default) is the Triton decode attention on CUDA,
    SDPA on the CPU; an explicit value wins either way."""
    from roll.pipeline.builders import hf_attention_kernel

    def cfg(*overrides: str):
        return load_config(str(ROOT / "examples" / "hanabi"), "multi_agent_hanabi",
                           list(overrides), check_paths=False)

    assert hf_attention_kernel(cfg()) == "sdpa"  # the example runs on CPU
    assert hf_attention_kernel(cfg("model.device=cuda")) == "triton"
    chosen = ("model.device=cuda", "rollout.hf.attention_kernel=sdpa")
    assert hf_attention_kernel(cfg(*chosen)) == "sdpa"


def test_trainer_compile_defaults_to_on_where_the_model_is_on_cuda_and_can_compile():
    """trainer.compile: null (the default) compiles the trainer's forwards on CUDA with the
    torch strategy and LoRA dropout 0; eager on CPU, under DeepSpeed or with dropout; an
    explicit value wins. The resolved value is what the train ranks get (TrainSpec)."""
    from roll.pipeline.builders import train_spec, trainer_compile

    def cfg(*overrides: str):
        return load_config(str(ROOT / "examples" / "kuhn_poker"), "nash", list(overrides),
                           check_paths=False)

    assert cfg().trainer.compile is None
    assert trainer_compile(cfg()) is False  # the example runs on CPU
    assert trainer_compile(cfg("model.device=cuda")) is True
    assert trainer_compile(cfg("model.device=cuda:1")) is True
    assert trainer_compile(cfg("model.device=cuda", "trainer.compile=false")) is False
    assert trainer_compile(cfg("model.device=cuda", "team.lora.dropout=0.05")) is False
    assert trainer_compile(cfg("model.device=cuda", "cluster.backend=ray",
                               "actor_train.strategy=deepspeed")) is False
    assert trainer_compile(cfg("trainer.compile=true")) is True
    on_cuda = cfg("model.device=cuda")
    assert train_spec(on_cuda, "m", [], 1.0, False).trainer.compile is True
    assert on_cuda.trainer.compile is None  # the config itself is left as the user wrote it


def test_trainer_share_prefix_defaults_to_on_where_the_model_is_on_the_cpu():
    """trainer.share_prefix: null (the default) shares the prompts' common prefix on the CPU,
    not on CUDA (benchmarks/README.md, "A shared prefix"); an explicit value wins; the train
    ranks get the resolved value."""
    from roll.pipeline.builders import train_spec, trainer_share_prefix

    def cfg(*overrides: str):
        return load_config(str(ROOT / "examples" / "kuhn_poker"), "nash", list(overrides),
                           check_paths=False)

    assert cfg().trainer.share_prefix is None
    assert trainer_share_prefix(cfg()) is True
    assert trainer_share_prefix(cfg("trainer.share_prefix=false")) is False
    assert trainer_share_prefix(cfg("model.device=cuda")) is False
    assert trainer_share_prefix(cfg("model.device=cuda", "trainer.share_prefix=true")) is True
    assert train_spec(cfg(), "m", [], 1.0, False).trainer.share_prefix is True


def test_hf_share_prefix_defaults_to_on_where_the_model_is_on_the_cpu():
    """rollout.hf.share_prefix: null (the default) prefills the admitted prompts' common
    prefix once per adapter on the CPU, not on CUDA; an explicit value wins; a value that is
    not a boolean stops the run naming the key, before any model loads."""
    from roll.pipeline.builders import hf_share_prefix
    from roll.pipeline.cli import CLIError

    def cfg(*overrides: str):
        return load_config(str(ROOT / "examples" / "kuhn_poker"), "nash", list(overrides),
                           check_paths=False)

    assert cfg().rollout.hf.share_prefix is None
    assert hf_share_prefix(cfg()) is True
    assert hf_share_prefix(cfg("rollout.hf.share_prefix=false")) is False
    assert hf_share_prefix(cfg("model.device=cuda")) is False
    assert hf_share_prefix(cfg("model.device=cuda", "rollout.hf.share_prefix=true")) is True
    with pytest.raises(CLIError, match="rollout.hf.share_prefix"):
        cfg("rollout.hf.share_prefix=maybe")


@pytest.mark.slow  # the full CI runs it (quick subset < 3 min)
def test_exit_code_from_a_real_process(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "start_multi_agent_pipeline.py"), *CONFIG,
         "env.seat_to_agent=[agent_0,ghost]", f"output_dir={out}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "env.seat_to_agent" in proc.stderr and "ghost" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_ray_address_that_cannot_be_joined_is_one_line_naming_it(tmp_path, capsys):
    """Found once Ray starts (the pipeline's first act in Ray mode): it was a traceback. (The
    other case, 'auto' with no cluster running, is refused the same way, but here it would join
    the cluster of a Ray test running beside it.)"""
    address = "bogus"
    from roll.pipeline.agentic_pipeline import AgenticPipeline

    out = tmp_path / "run"
    code = run_cli(lambda cfg: AgenticPipeline(cfg).run(), CONFIG + [
        "cluster.backend=ray", f"cluster.address={address}", f"output_dir={out}"], "test")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith(f"config error: cluster.address='{address}': Ray could not start")
    assert not out.exists()


def test_constrained_answers_longer_than_the_token_budget_are_refused_before_the_model(
        tmp_path, capsys):
    """Found with the tokenizer, before the weights load: it was a traceback from the first
    rollout."""
    from roll.pipeline.agentic_pipeline import AgenticPipeline

    out = tmp_path / "run"
    code = run_cli(lambda cfg: AgenticPipeline(cfg).run(), CONFIG + [
        "rollout.constrained_decoding=true", "rollout.sampling.max_new_tokens=2",
        f"output_dir={out}"], "test")
    captured = capsys.readouterr()
    assert code == 2
    (line,) = captured.err.strip().splitlines()
    found = re.fullmatch(r"config error: rollout.sampling.max_new_tokens=2: the constrained "
                         r"answer '.+' of tic_tac_toe needs (\d+) tokens: every such turn would "
                         r"be cut off; raise it", line)
    assert found and int(found.group(1)) > 2, line
    assert "step 1" not in captured.out and not out.exists()


@pytest.mark.parametrize("yaml_path", sorted((ROOT / "examples").glob("*/*.yaml")),
                         ids=lambda p: p.parent.name)
def test_every_example_config_validates_and_names_its_launch_command(yaml_path):
    first = yaml_path.read_text().splitlines()[0]
    assert first.startswith("# Launch: bash examples/")
    script = ROOT / first.split("bash ", 1)[1].strip()
    assert script.is_file() and os.access(script, os.X_OK)
    assert f"--config_name {yaml_path.stem}" in script.read_text()
    cfg = load_config(str(yaml_path.parent), yaml_path.stem, [])
    assert cfg.max_steps >= 1


def test_the_smollm2_quickstart_is_the_nash_recipe_cut_short():
    """The README's real-model quickstart trains as examples/kuhn_poker/nash.yaml does (plain GRPO
    self-play, its recipe until 2026-12-06, collapsed to deterministic play): only the length,
    the evaluation interval, the checkpoints and where it writes differ, and the rate still
    decays to 0 at the quickstart's own last step."""
    from dataclasses import asdict

    folder = str(ROOT / "examples" / "kuhn_poker")
    quick = asdict(load_config(folder, "quickstart_smollm2", []))
    nash = asdict(load_config(folder, "nash", [
        f"max_steps={quick['max_steps']}", f"eval.eval_steps={quick['eval']['eval_steps']}",
        f"save_steps={quick['save_steps']}", f"output_dir={quick['output_dir']}",
        f"tracking.project={quick['tracking']['project']}"]))
    assert quick == nash
    assert quick["max_steps"] < 300 and quick["team"]["optim"]["total_steps"] == quick["max_steps"]
    assert quick["advantage"]["estimator"] == "rae" and quick["trainer"]["action_entropy_coef"] > 0


@pytest.mark.slow  # a real process (~7 s)
def test_the_smollm2_quickstart_script_runs_its_recipe_and_warns_without_a_gpu():
    """The README's real-model launch line with --validate_only: the script picks the device
    (CPU in CI), says on stderr that CPU takes minutes a step when there is no GPU, and
    resolves to the quickstart's recipe."""
    import torch

    proc = subprocess.run(
        ["bash", str(ROOT / "examples" / "kuhn_poker" / "run_quickstart_smollm2.sh"),
         "--validate_only"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if torch.cuda.is_available():
        assert "no GPU" not in proc.stderr and "device: cuda" in proc.stdout
    else:
        assert "no GPU" in proc.stderr and "minutes a step" in proc.stderr
        assert "device: cpu" in proc.stdout
    assert "max_steps: 150" in proc.stdout
    assert "estimator: rae" in proc.stdout


def test_the_zero3_persistence_default_is_the_strategys():
    """actor_train.zero3_persist_elements and the DeepSpeed strategy share one default (the
    schema holds a literal so the config loads without the trainer's imports)."""
    import inspect

    from roll.distributed.deepspeed_strategy import PERSIST_ELEMENTS, DeepSpeedStrategy
    from roll.distributed.roles import TrainSpec
    from roll.pipeline.config import ActorTrainSchema

    strategy_default = inspect.signature(DeepSpeedStrategy).parameters["persist_elements"].default
    spec_default = TrainSpec.__dataclass_fields__["zero3_persist_elements"].default
    assert ActorTrainSchema().zero3_persist_elements == PERSIST_ELEMENTS
    assert strategy_default == spec_default == PERSIST_ELEMENTS


def test_a_vllm_that_cannot_capture_the_models_lora_is_refused_from_its_config(tmp_path):
    """vLLM 0.26 fails inside its start on a model whose vocabulary is narrower than its hidden
    size (roll/inference/vllm_checks.py): validation reads config.json (no weights) and names
    the key that avoids it; eager vLLM, a vLLM that shapes it right and the aliases pass."""
    from transformers import Qwen3Config

    from roll.errors import ConfigError
    from roll.pipeline.config import RolloutSchema
    from roll.pipeline.validation import check_vllm_lora_widths

    Qwen3Config(vocab_size=611, hidden_size=1024, num_hidden_layers=1, num_attention_heads=8,
                num_key_value_heads=8, head_dim=128, intermediate_size=64).save_pretrained(tmp_path)
    rollout = RolloutSchema()
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.enforce_eager.*\(611\).*\(1024\)"):
        check_vllm_lora_widths(rollout, str(tmp_path), "0.26.0")
    check_vllm_lora_widths(rollout, str(tmp_path), "0.32.0")
    check_vllm_lora_widths(rollout, "tiny", "0.26.0")
    rollout.vllm.enforce_eager = True
    check_vllm_lora_widths(rollout, str(tmp_path), "0.26.0")


def test_a_hub_id_that_cannot_be_downloaded_is_refused_before_the_model(tmp_path, monkeypatch,
                                                                        capsys):
    """No cache and no network: refused in a line naming model.path, not after the Hub
    client's retries (~25 s here) ended in the same message from inside the loader."""
    with __import__("socket").socket() as probe:  # a local port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    for name in ("HF_HUB_OFFLINE", *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "run"
    err = _refused(["model.path=someorg/no-such-model", f"output_dir={out}"], capsys)
    assert err.startswith("config error: model.path='someorg/no-such-model': is not a local "
                          "folder, the Hugging Face cache does not hold it")
    assert f"127.0.0.1:{port} cannot be reached" in err
    assert not out.exists()
