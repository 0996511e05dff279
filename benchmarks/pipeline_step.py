"""Real pipeline steps on the GPU: where a step's time goes, and generated tok/s inside it.

    python benchmarks/pipeline_step.py                  # GPU: Qwen3-0.6B shape, random bf16
    python benchmarks/pipeline_step.py --tiny --steps 2 # CPU smoke check
    python benchmarks/pipeline_step.py --model smollm2-135m --settings kuhn:2 hanabi:2
                                                        # a real model: tokenizer, vocabulary

For each setting (the Hanabi and Kuhn poker examples with 2 and 4 agents; with 4 agents two
seatings of two), each rollout mode (continuous turn batching, and lock-step rounds for
comparison) runs ``--steps`` training steps of the real ``AgenticPipeline`` (no evaluation, no
checkpoints) on a Qwen3-0.6B-shaped model with random bf16 weights and the tiny offline
tokenizer (its vocabulary is 1,024 tokens, so the LM head is smaller than Qwen3's), or on the
model ``--model`` names (a path or alias, e.g. SmolLM2-135M-Instruct with its real tokenizer
and 49,152-token vocabulary: real prompts, real answer lengths). Reported per
step: the time split (rollout / logprobs / train / sync), generated tokens and tok/s inside
the rollout, the whole step's tok/s (generated + trained response tokens over the step time),
decode lanes (rows in flight), CUDA graph captures so far; per setting: the peak GPU memory
and, as the engine-only reference at the same concurrency, the same engine serving ``lanes``
requests of the run's prompt length and token budget with nothing else to do, and the same at
``busy_lanes`` requests (the rows decoding per decode step on average, ``rollout/busy_lanes``,
when fewer than the lanes); ``in_pipeline_vs_engine`` is the rollout's tok/s over the
engine-only figure at the run's lanes (issue 33: >= 0.6 on Hanabi), pooled over the later
steps, over the steady ones (``_steady``: neither the first nor the last, which plays nothing
ahead) and step by step (``in_pipeline_vs_engine_by_step``). With
``--override rollout.lookahead=1`` the next step's episodes fill the lanes a rollout's tail
leaves idle; the rollout's tok/s and the step's count the tokens decoded in the phase
(``rollout/decoded_tokens``), whichever step they belong to.
The first step includes warm-up (graph capture); the summary averages the later steps.
Prints JSON lines, then one summary object; writes $OUT/pipeline_step.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from report import emit  # noqa: E402

SHAPE_06B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128)
EXAMPLES = {"hanabi": ("examples/hanabi", "multi_agent_hanabi"),
            "kuhn": ("examples/kuhn_poker", "multi_agent_kuhn_poker"),
            # the learning recipes (constrained answers, the policy over legal moves)
            "kuhn_nash": ("examples/kuhn_poker", "nash"),
            "leduc_nash": ("examples/leduc_poker", "nash"),
            "hanabi_team": ("examples/hanabi", "team")}


def seating(agents: int) -> str:
    """Seats of the 2-player examples: 1 agent plays both seats (self-play), 2 one each, 2k
    agents k pairs (the run's games split among the seatings)."""
    if agents == 1:
        return "env.seat_to_agent=[agent_0,agent_0]"
    if agents % 2:
        raise SystemExit(f"--settings ...:{agents}: 1 or an even number of agents")
    if agents == 2:
        return "env.seat_to_agent=[agent_0,agent_1]"
    pairs = ",".join(f"[agent_{i},agent_{i + 1}]" for i in range(0, agents, 2))
    return f"env.seat_to_agent=[{pairs}]"


def engine_only(pipeline, lanes: int, prompt_len: int, max_new: int) -> dict:
    """The pipeline's own engine serving ``lanes`` fixed-length requests, nothing else."""
    from roll.inference import GenerationRequest, SamplingParams, serve

    agents = pipeline.agent_names
    requests = [GenerationRequest([7 + (i % 50)] * prompt_len, agents[i % len(agents)],
                                  SamplingParams(temperature=1.0, max_new_tokens=max_new,
                                                 ignore_eos=True, seed=i))
                for i in range(lanes)]
    with pipeline.engine_awake():
        pipeline.sync_adapters()
        serve(pipeline.engine, requests, lambda key, output: [],
              context_len=prompt_len + max_new)  # warm-up (capture)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        serve(pipeline.engine, requests, lambda key, output: [],
              context_len=prompt_len + max_new)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return {"lanes": lanes, "prompt_tokens": prompt_len, "new_tokens": max_new,
            "seconds": round(seconds, 3), "tokens_per_s": round(lanes * max_new / seconds)}


def gpu_busy_summary(sampler, timeline: dict[str, list[tuple[float, float]]]) -> dict:
    """Each GPU's mean utilization per phase over the steps after the first (whose compiles
    would dominate), and per step (``--gpu_busy``)."""
    from gpu_busy import busy_by_phase

    steps = timeline["step"]
    later = {phase: [(start, end) for start, end in intervals if start >= steps[0][1]]
             for phase, intervals in timeline.items()} if steps else {}
    return {
        "available": sampler.available, "period_ms": sampler.period_ms,
        "samples": len(sampler.samples),
        "by_phase_after_first": busy_by_phase(sampler.samples, later),
        "by_step": busy_by_phase(sampler.samples, {str(i + 1): [interval]
                                                   for i, interval in enumerate(steps)}),
        "phase_seconds_after_first": {phase: round(sum(end - start for start, end in spans), 3)
                                      for phase, spans in later.items()},
    }


def run_setting(args, model_path: Path | str, example: str, agents: int,
                continuous: bool, extra: list[str]) -> dict:
    from roll.pipeline.agentic_pipeline import AgenticPipeline
    from roll.pipeline.cli import load_config

    folder, name = EXAMPLES[example]
    out = Path(tempfile.mkdtemp(prefix=f"pipeline_{example}_{agents}_"))
    device = "cpu" if args.tiny else "cuda"
    overrides = [
        f"model.path={model_path}", f"model.dtype={'float32' if args.tiny else 'bfloat16'}",
        f"model.device={device}", f"team.num_agents={agents}", seating(agents),
        f"max_steps={args.steps}", "save_steps=0", "eval.eval_steps=0",
        "tracking.backends=[jsonl]", f"output_dir={out}", f"rollout.continuous={continuous}",
        "team.lora.rank=32", "team.lora.alpha=32", f"rollout.engine={args.engine}",
    ]
    if args.engine == "vllm":  # colocated with the trainer: vLLM sleeps while it trains
        overrides += ["rollout.vllm.gpu_memory_utilization=0.4",
                      "rollout.vllm.sleep_between_phases=true",
                      f"rollout.vllm.enforce_eager={args.vllm_eager}"]
    if args.tiny:
        overrides += ["rollout.num_groups=2", "rollout.sampling.max_new_tokens=16"]
    overrides += args.override + extra
    cfg = load_config(str(ROOT / folder), name, overrides)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    pipeline = AgenticPipeline(cfg)
    if args.profile_rollout or args.cprofile_rollout:
        import run_hooks

        profile_dir = Path(os.environ.get("OUT") or out)
        if args.profile_rollout:
            run_hooks.profile_rollout_of_step(pipeline, args.profile_rollout, args.profile_top,
                                              profile_dir)
        if args.cprofile_rollout:
            run_hooks.cprofile_rollout_of_step(pipeline, args.cprofile_rollout,
                                               args.profile_top, profile_dir)
    if args.gpu_busy:
        import run_hooks
        from gpu_busy import GpuSampler

        timeline = run_hooks.phase_timeline(pipeline)
        with GpuSampler() as sampler:
            pipeline.run()
    else:
        pipeline.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = []
    for row in rows:
        step = {key: round(value, 3) for key, value in row.items()
                if key.startswith("time/") or key in (
                    "rollout/generated_tokens", "rollout/tokens_per_s", "rollout/lanes",
                    "rollout/decoded_tokens", "rollout/busy_lanes", "rollout/ahead_turns",
                    "rollout/decode_steps", "rollout/graph_captures", "rollout/llm_turns",
                    "rollout/episodes", "rollout/prompt_tokens", "rollout/prefills",
                    "rollout/shared_tokens", "rollout/played_s",
                    "rollout/engine_logprob_gap")
                or key.startswith(("rollout/serve_", "rollout/prefill_"))}
        step["step"] = row["step"]
        # Whole-step throughput: tokens generated plus response tokens trained (each agent's
        # num_tokens: the tokens its loss covers), over the step's time (rollout, passes,
        # train, sync).
        step["trained_tokens"] = sum(value for key, value in row.items()
                                     if key.endswith("/num_tokens"))
        if row.get("time/step"):
            step["step_tokens_per_s"] = round(
                (row.get("rollout/decoded_tokens", 0.0) + step["trained_tokens"])
                / row["time/step"], 1)
        steps.append(step)
        print(json.dumps({"example": example, "agents": agents, "continuous": continuous,
                          **step}), flush=True)
    later = steps[1:] or steps
    summary = {
        "example": example, "agents": agents, "continuous": continuous, "steps": steps,
        "engine": args.engine, "overrides": args.override + extra,
        "mean_after_first": {key: round(statistics.mean(s[key] for s in later if key in s), 3)
                             for key in dict.fromkeys(k for s in later for k in s)
                             if key != "step"},
    }
    # Whole-step throughput of the later steps together (issue 34's figure): what they decoded
    # and trained over their time. Pooled, not a mean of per-step ratios: with
    # rollout.lookahead a step may decode little of its own (its games were played ahead in
    # the step before) and much of the next step's.
    summary["step_tokens_per_s_after_first"] = round(
        sum(s.get("rollout/decoded_tokens", 0.0) + s["trained_tokens"] for s in later)
        / max(sum(s.get("time/step", 0.0) for s in later), 1e-9))
    # Steady state: the steps between the first (compiles) and the last (plays nothing ahead),
    # each counted by what it trained: its batch's generated tokens plus the tokens trained,
    # over its time. With rollout.lookahead or rollout.overlap a step's batch was partly or
    # wholly decoded in the step before, so the pooled decoded figure above credits a window
    # with work done in another (overlap: the second step's whole rollout, played during the
    # first); this one does not. Equal to it in steady state without either.
    steady = steps[1:-1] or later
    summary["step_tokens_per_s_steady"] = round(
        sum(s.get("rollout/generated_tokens", 0.0) + s["trained_tokens"] for s in steady)
        / max(sum(s.get("time/step", 0.0) for s in steady), 1e-9))
    # the rollout phases of the later steps together: what they decoded over their time (with
    # rollout.overlap the time they played, not the shorter wait their step saw)
    summary["rollout_tokens_per_s"] = round(
        sum(s.get("rollout/decoded_tokens", 0.0) for s in later)
        / max(sum(s.get("rollout/played_s", s.get("time/rollout", 0.0)) for s in later), 1e-9))
    # the train phase alone over the steady steps: response tokens trained per second of
    # time/train (issue 33: 8 agents against 1 inside a step), and the trainer's captured
    # micro-batch graphs (trainer.capture) with the micro-batches that ran without one
    summary["train_tokens_per_s_steady"] = round(
        sum(s["trained_tokens"] for s in steady)
        / max(sum(s.get("time/train", 0.0) for s in steady), 1e-9))
    captured = getattr(pipeline.trainer, "captured", None)
    if captured is not None:
        graphs, seconds, uncaptured = captured.counts()
        summary["trainer_capture"] = {"graphs": graphs, "capture_s": round(seconds, 2),
                                      "uncaptured_micro_batches": uncaptured}
    if args.gpu_busy:
        summary["gpu_busy"] = gpu_busy_summary(sampler, timeline)
    if torch.cuda.is_available():
        summary["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    if continuous and not cfg.actor_infer.num_engines:  # engine actors end with the run
        # a step whose games were all played ahead (rollout.lookahead) served nothing
        lanes = int(max(s.get("rollout/lanes", 0) for s in later))
        if lanes:
            # the run's own mean prompt length (the tokenizer decides it: the tiny one's
            # bytes or a real model's words)
            prompt_len = round(statistics.mean(s["rollout/prompt_tokens"] for s in later))
            max_new = cfg.rollout.sampling.max_new_tokens
            summary["engine_only"] = engine_only(pipeline, lanes, prompt_len, max_new)
            # Rows actually decoding per step on average (sequential episodes leave lanes
            # idle): the engine serving that many rows is the reference at equal concurrency.
            per_step = [s["rollout/busy_lanes"] for s in later if "rollout/busy_lanes" in s]
            busy = round(statistics.mean(per_step)) if per_step else 0
            # the rollout phase against the engine alone on all the lanes (issue 33's 60%)
            summary["in_pipeline_vs_engine"] = round(
                summary["rollout_tokens_per_s"] / summary["engine_only"]["tokens_per_s"], 3)
            # the same over the steady steps (between the first, which compiles, and the last,
            # which has no next step to play ahead: with rollout.lookahead its lanes empty)
            summary["in_pipeline_vs_engine_steady"] = round(
                sum(s.get("rollout/decoded_tokens", 0.0) for s in steady)
                / max(sum(s.get("rollout/played_s", s.get("time/rollout", 0.0))
                          for s in steady), 1e-9)
                / summary["engine_only"]["tokens_per_s"], 3)
            # Step by step as well: a later step that compiles a new decode shape (lanes or
            # ring capacity) carries that compile in its rollout time and so in the pooled
            # figure (a lookahead step on an H200 did: 0.091 pooled, 0.56 for the clean step).
            summary["in_pipeline_vs_engine_by_step"] = {
                s["step"]: round(s["rollout/tokens_per_s"]
                                 / summary["engine_only"]["tokens_per_s"], 3)
                for s in later if s.get("rollout/tokens_per_s")}
            if 0 < busy < lanes:
                summary["busy_lanes"] = busy
                summary["engine_only_busy"] = engine_only(pipeline, busy, prompt_len, max_new)
    close = getattr(pipeline.engine, "close", None)
    if close:
        close()
    del pipeline
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=["hanabi:2", "hanabi:4", "kuhn:2",
                                                          "kuhn:4"])
    parser.add_argument("--modes", nargs="+", default=["continuous", "rounds"],
                        choices=["continuous", "rounds"])
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"],
                        help="rollout.engine (vllm: vLLM's own scheduling; --modes is moot)")
    parser.add_argument("--vllm_eager", action="store_true",
                        help="rollout.vllm.enforce_eager=true (no CUDA graphs / compile)")
    parser.add_argument("--model", default=None,
                        help="a model path or alias (smollm2-135m) instead of the random-weight "
                             "Qwen3-0.6B shape (--tiny: the tiny model)")
    parser.add_argument("--vocab_rows", type=int, default=None,
                        help="rows of the random-weight shape's embedding and LM head (default: "
                             "the tiny tokenizer's ~600 tokens); 151936 is Qwen3's. vLLM 0.26 "
                             "needs at least the hidden size (1,024) to capture its CUDA graphs "
                             "with LoRA")
    parser.add_argument("--profile_rollout", type=int, default=0, metavar="STEP",
                        help="run step STEP's rollout under torch.profiler: kernels, GPU busy "
                             "share, top operators and the serve loop's ranges (admit, "
                             "decode_step, wait, follow) -> $OUT/profile_rollout.json (first "
                             "setting only)")
    parser.add_argument("--cprofile_rollout", type=int, default=0, metavar="STEP",
                        help="run step STEP's rollout under cProfile: the host's time "
                             "function by function -> $OUT/cprofile_rollout.json (first "
                             "setting only; not with --profile_rollout at the same step)")
    parser.add_argument("--profile_top", type=int, default=25,
                        help="operators listed by --profile_rollout, functions by "
                             "--cprofile_rollout")
    parser.add_argument("--gpu_busy", action="store_true",
                        help="sample every GPU's utilization (nvidia-smi, every 100 ms) and "
                             "report it per phase of the steps after the first and per step "
                             "(gpu_busy in the JSON; 'available': false without nvidia-smi)")
    parser.add_argument("--groups", type=int, nargs="*", default=[],
                        help="rollout.num_groups values: every setting runs at each, in one "
                             "process (tok/s against episodes per step: 4 x groups for 4 agents "
                             "in the examples' seatings)")
    parser.add_argument("--override", nargs="*", default=[],
                        help="more Hydra overrides for every setting, e.g. cluster.backend=ray "
                             "actor_train.world_size=1 (a colocated Ray run)")
    args = parser.parse_args()
    from roll.models.tiny import TinyModelSpec, build_tiny_model, default_cache_dir

    if args.model:
        model_path = args.model  # resolved by the pipeline (roll/models/aliases.py)
    else:
        spec = TinyModelSpec() if args.tiny else TinyModelSpec(**SHAPE_06B)
        folder = "tiny-qwen3" if args.tiny else "qwen3-0.6b-shape"
        if args.vocab_rows:
            spec = replace(spec, embedding_rows=args.vocab_rows)
            folder += f"-v{args.vocab_rows}"
        model_path = build_tiny_model(default_cache_dir().parent / folder, spec)
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    summary = {"device": name, "torch": torch.__version__, "steps": args.steps,
               "model": args.model or ("tiny" if args.tiny else "qwen3-0.6b-shape"),
               "vocab_rows": args.vocab_rows, "complete": False, "results": []}
    for groups in args.groups or [None]:  # one process: the compiled graphs are reused
        extra = [] if groups is None else [f"rollout.num_groups={groups}"]
        for setting in args.settings:
            example, agents = setting.split(":")
            for mode in args.modes:
                summary["results"].append(run_setting(args, model_path, example, int(agents),
                                                      mode == "continuous", extra))
                if os.environ.get("OUT"):  # each result kept as it ends: a run cut off later
                    Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)  # keeps it
                    Path(os.environ["OUT"], "pipeline_step.json").write_text(
                        json.dumps(summary, indent=2) + "\n")
    summary["complete"] = True
    emit(summary, "pipeline_step.json")


if __name__ == "__main__":
    main()
