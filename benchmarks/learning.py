"""Do agents learn what a game theorist cares about? Exploitability curves with a real model.

    python benchmarks/learning.py --recipes kuhn leduc          # GPU: SmolLM2-135M-Instruct
    python benchmarks/learning.py --tiny --recipes kuhn --steps 2   # CPU smoke check
    python benchmarks/learning.py --from_metrics s0/metrics.jsonl s1/metrics.jsonl \
        --seeds_of kuhn_nash                                   # seeds: mean + 95% interval

Each recipe trains two agents (LoRA r 16) by self-play in both seats (seatings
[agent_0, agent_1] and [agent_1, agent_0], so each agent learns each seat), constrained answers,
sampling at temperature 1, and evaluates every ``--eval_every`` steps: for Kuhn and Leduc the
exact exploitability of each agent's policy in every seat at temperature 1
(roll/pipeline/exploitability.py; uniform play is 0.458 in Kuhn) and the win rate against a
random player; for TicTacToe wins / non-losses against random with each agent in both seats,
and against MCTS with ``--vs_mcts`` simulations (OpenSpiel's MCTS bot) before and after training;
for the small Hanabi (2 colours, 3 ranks, max score 6) the team score of the two agents together.
Writes the curves as JSON (``$OUT/learning.json`` when OUT is set, and printed) and a PNG per
recipe when matplotlib is available.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import learning_plots as plots  # noqa: E402
import run_hooks  # noqa: E402
from report import points_over_runs, read_text  # noqa: E402

RECIPES = {
    "kuhn": ("examples/kuhn_poker", "multi_agent_kuhn_poker", ["rollout.max_turns=4"]),
    # Self-play mixed with frozen snapshots of the other agent (refreshed at every checkpoint,
    # every 10 steps): a deterministic policy that self-play stops moving (Kuhn agent_0 froze at
    # exploitability 1/3 in pure self-play) still meets an older opponent that punishes it.
    "kuhn_pool": ("examples/kuhn_poker", "multi_agent_kuhn_poker", [
        "rollout.max_turns=4", "save_steps=10", "keep_last=2", "rollout.num_groups=18",
        "env.seat_to_agent=[[agent_0,agent_1],[agent_1,agent_0],"
        "[agent_0,snapshot:agent_1@latest],[snapshot:agent_1@latest,agent_0],"
        "[agent_1,snapshot:agent_0@latest],[snapshot:agent_0@latest,agent_1]]"]),
    "leduc": ("examples/leduc_poker", "multi_agent_leduc_poker", []),
    # Role-conditioned advantages (SPIRAL): each agent's return in a seat minus its running
    # baseline in that seat, instead of GRPO's group mean (zero once a group's returns agree).
    "kuhn_rae": ("examples/kuhn_poker", "multi_agent_kuhn_poker", [
        "rollout.max_turns=4", "advantage.estimator=rae", "advantage.rae_decay=0.9"]),
    # The shipped recipe (examples/kuhn_poker/nash.yaml): RAE plus an entropy bonus on the
    # distribution over legal moves.
    "kuhn_nash": ("examples/kuhn_poker", "nash", []),
    "leduc_nash": ("examples/leduc_poker", "nash", []),
    # The README's real-model quickstart: nash.yaml cut to 150 steps (its rate decays to 0 there).
    "kuhn_quickstart": ("examples/kuhn_poker", "quickstart_smollm2", []),
    # examples/tictactoe/mixed.yaml: each agent in both seats against the other agent and the
    # random player (its O-against-random seating twice), a critic per agent, the lines prompt,
    # a legal-move entropy bonus of 0.05; evaluated against random (both seats) and, after
    # training, MCTS. Micro-batches of 128 rows (the same update, DESIGN invariant 1): on an H100
    # 10 s a step instead of 16 s at the YAML's 32 (session 55, plain prompt; 12.5 s with lines).
    "tictactoe_mixed": ("examples/tictactoe", "mixed", ["trainer.micro_batch_size=128"]),
    # What mixed.yaml was until session 56 (the runs of sessions 46-53): whole-game GRPO within
    # a seating, no critic, the plain board, 96 games a step, each seating once, rate 1e-4,
    # bonus 0.01. As O it stopped at 0.61-0.67 wins.
    "tictactoe_grpo": ("examples/tictactoe", "mixed", [
        "advantage.estimator=grpo", "critic.mode=none", "env.renderer=", "rollout.num_groups=24",
        "trainer.ppo_mini_batch_size=64", "team.optim.lr=1e-4", "trainer.action_entropy_coef=0.01",
        "env.seat_to_agent=[[agent_0,agent_1],[agent_1,agent_0],[agent_0,random],"
        "[random,agent_0],[agent_1,random],[random,agent_1]]"]),
    "leduc_rae": ("examples/leduc_poker", "multi_agent_leduc_poker", [
        "advantage.estimator=rae", "advantage.rae_decay=0.9"]),
    # Too many information states to enumerate each evaluation: W/D/L against random instead,
    # each agent in both seats.
    "tictactoe": ("examples/tictactoe", "multi_agent_tictactoe", [
        "eval.exploitability=false",
        "eval.seat_to_agent=[[agent_0,random],[random,agent_0],[agent_1,random],"
        "[random,agent_1]]"]),
    # Cooperative: the two agents play together; the team score is the figure (max 6).
    "hanabi": ("examples/hanabi", "multi_agent_hanabi", [
        "eval.exploitability=false", "eval.seat_to_agent=[agent_0,agent_1]",
        "rollout.sampling.max_new_tokens=32", "rollout.max_turns=40"]),
    # The cooperative starting point, examples/hanabi/team.yaml (measured: the team stalls at
    # ~0.3 of 6, benchmarks/README.md, "Hanabi"): GRPO over whole games on independent deals,
    # 128 games a step, the policy gradient of the constrained policy, no entropy bonus, the rate
    # decayed to 0; evaluated in both seatings, sampled and greedy. On the MLP stand-in
    # (benchmarks/hanabi_stand_in.py) the step size decided whether the team left its first
    # "never play" phase (greedy score 0), not the estimator: a centralised critic
    # (--override advantage.estimator=mappo critic.mode=shared critic.input=global) learnt no
    # faster there, at the cost of a second model pass on the LLM.
    "hanabi_team": ("examples/hanabi", "team", []),
    # examples/connect_four/mixed.yaml: TicTacToe's mixed recipe on Connect Four (both seats
    # against the other agent and random, a critic per agent, the legal-move bonus); evaluated
    # against random (both seats, sampled and greedy) and, before and after, MCTS.
    "connect_four_mixed": ("examples/connect_four", "mixed", ["trainer.micro_batch_size=128"]),
}
COOPERATIVE = {"hanabi", "hanabi_team"}
"""Recipes whose curves get the small Hanabi's reference scores (benchmarks/hanabi_baselines.py:
random play and the rule team over the same 2,000 deals)."""
OWN_YAML = {"nash", "mixed", "quickstart_smollm2", "team"}
"""Config names of recipes that train and evaluate as their YAML says: only the tracking
backend is set here (the shared settings below would overwrite their seatings)."""
VERSUS = {"tictactoe": "mcts", "tictactoe_mixed": "mcts", "tictactoe_grpo": "mcts",
          "connect_four_mixed": "mcts"}
"""Recipes also evaluated against ``mcts:<--vs_mcts>`` (each agent, both seats) before and after
training."""
TACTICS = {"tictactoe": "tictactoe_policy", "tictactoe_mixed": "tictactoe_policy",
           "tictactoe_grpo": "tictactoe_policy", "connect_four_mixed": "connect_four_policy"}
"""Recipes ``--tactics`` scores, with the module that scores them: TicTacToe's exact tactics
(benchmarks/tictactoe_policy.py), Connect Four's wins taken and blocks made
(benchmarks/connect_four_policy.py)."""
METRICS = ("exploitability", "win_rate", "win_rate_low", "win_rate_high", "non_loss_rate",
           "non_loss_rate_low", "non_loss_rate_high", "loss_rate", "seat0/win_rate",
           "seat1/win_rate", "mean_return")
COMMON = [
    "env.seat_to_agent=[[agent_0,agent_1],[agent_1,agent_0]]",
    "rollout.constrained_decoding=true", "rollout.sampling.temperature=1.0",
    "rollout.sampling.max_new_tokens=24", "eval.exploitability=true", "eval.temperature=1.0",
    "eval.opponent=random", "eval.num_episodes=64", "save_steps=0",
    "tracking.backends=[jsonl]",
]
"""Every recipe: self-play in both seats, constrained answers, sampling at 1, exact evaluation."""
TRAINING = [
    "rollout.num_groups=16", "rollout.group_size=4", "team.lora.rank=16", "team.lora.alpha=32",
    "team.optim.lr=2e-4", "trainer.micro_batch_size=32",
]
"""The training settings of the recipes that have no YAML of their own for this benchmark (the
recipes in OWN_YAML train as their YAML says)."""


def recipe_config(args, name: str, out: Path):
    """The validated config of recipe ``name`` as ``args`` (tiny, model, steps, eval_every,
    override) ask for it, writing under ``out``."""
    from roll.pipeline.cli import load_config

    folder, config_name, extra = RECIPES[name]
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    own = config_name in OWN_YAML
    overrides = (["tracking.backends=[jsonl]"] if own else COMMON + TRAINING) + extra + [
        f"model.path={'tiny' if args.tiny else args.model}", f"model.device={device}",
        "model.dtype=float32", f"max_steps={args.steps}", f"eval.eval_steps={args.eval_every}",
        f"output_dir={out}",
    ]
    if args.tiny:
        overrides += ["eval.num_episodes=4"] + ([] if own else ["rollout.num_groups=6"])
    if args.greedy_too:
        overrides += ["eval.greedy_too=true"]
    overrides += list(args.override)  # the caller's word is the last
    return load_config(str(ROOT / folder), config_name, overrides)


def run_recipe(args, name: str) -> dict:
    from roll.pipeline.agentic_pipeline import AgenticPipeline

    # Under --run_dir (kept between device calls: add --override resume=latest to continue a
    # run from its last checkpoint), else under $OUT when set, so the metrics of a run cut off
    # by a time limit still come back.
    run = f"run_{name}{args.tag}"
    out = (Path(args.run_dir, run) if args.run_dir
           else Path(os.environ["OUT"], run) if os.environ.get("OUT")
           else Path(tempfile.mkdtemp(prefix=f"learning_{name}_")))
    cfg = recipe_config(args, name, out)
    start = time.perf_counter()
    if args.compile_cache:
        run_hooks.load_compile_cache(Path(args.compile_cache))
    pipeline = AgenticPipeline(cfg)
    if args.compile_cache:
        run_hooks.save_compile_cache_after_step_1(pipeline, out)
    versus = {}
    if name in VERSUS and args.vs_mcts:
        versus["before"] = _versus(pipeline, f"mcts:{args.vs_mcts}", out)
    tactics, scored = {}, []
    if args.tactics and name in TACTICS:  # what the policy reads
        policy = importlib.import_module(TACTICS[name])
        scored = run_hooks.tactics_at_evaluations(pipeline, out, policy.report)
        if not cfg.eval.eval_steps:  # no evaluation at step 0 to score it
            tactics["before"] = policy.report(pipeline)
    if args.profile_step:
        run_hooks.profile_one_step(pipeline, args.profile_step, args.profile_top, out)
    if args.sync_step:
        run_hooks.sync_sites_of_step(pipeline, args.sync_step, args.profile_top, out)
    if args.cprofile_rollout:
        run_hooks.cprofile_rollout_of_step(pipeline, args.cprofile_rollout, args.profile_top, out)
    pipeline.run()
    if versus:
        versus["after"] = _versus(pipeline, f"mcts:{args.vs_mcts}", out)
    if args.tactics and name in TACTICS:
        if scored and scored[0]["step"] == 0:
            tactics["before"] = scored[0]["agents"]
        last_scored = scored and scored[-1]["step"] == pipeline.step
        tactics["after"] = (scored[-1]["agents"] if last_scored
                            else policy.report(pipeline))
        tactics["at_evaluations"] = scored
    if args.greedy_too and args.vs_mcts:  # (against random: the run's own eval.greedy_too)
        versus["greedy_vs_mcts"] = _versus(pipeline, f"mcts:{args.vs_mcts}", out,
                                           temperature=0.0)
    seconds = time.perf_counter() - start
    curve = curve_of(out / "metrics.jsonl")
    for point in curve:
        print(json.dumps({"recipe": name, **point}), flush=True)
    result = {"recipe": name + args.tag, "overrides": list(args.override),
              "model": "tiny" if args.tiny else args.model, "steps": args.steps,
              "seconds": round(seconds, 1), "seconds_per_step": round(seconds / args.steps, 2),
              "curve": curve}
    if versus:
        result[f"vs_mcts{args.vs_mcts}"] = versus
        print(json.dumps({"recipe": name, f"vs_mcts{args.vs_mcts}": versus}), flush=True)
    if tactics:
        result["tactics"] = tactics
        print(json.dumps({"recipe": name, "tactics": tactics}), flush=True)
        if scored:
            result["tactics_plot"] = plots.plot_tactics(
                scored, name + args.tag,
                Path(os.environ.get("OUT", out), f"learning_{name}{args.tag}_tactics.png"))
    if name in COOPERATIVE:
        result["baselines"] = hanabi_reference(dict(cfg.env.params))
    plots.plot(result, Path(os.environ.get("OUT", out)))
    return result


def hanabi_reference(params: dict | None = None, games: int = 2000) -> dict[str, float]:
    """The reference team scores of the small Hanabi (with ``params`` over its defaults: the
    run's ``env.params``, e.g. 3 lives): random play and the rule team
    (benchmarks/hanabi_baselines.py) over the same ``games`` deals."""
    import hanabi_baselines

    scores = hanabi_baselines.baselines({**hanabi_baselines.SMALL_HANABI, **(params or {})},
                                        games)
    return {team: scores[team]["score"] for team in ("random", "rules")}


def curve_of(metrics_file: Path) -> list[dict]:
    """The evaluation points of a run's ``metrics.jsonl`` (or ``metrics.jsonl.gz``; a resumed
    run appends the steps it replays after its checkpoint: the last record of each step
    counts), with each agent's legal-move entropy of the training step beside them."""
    rows = {}
    for line in read_text(metrics_file).splitlines():
        row = json.loads(line)
        rows[row["step"]] = row
    curve = []
    for step in sorted(rows):
        row = rows[step]
        if "time/eval" not in row:  # not an evaluation step
            continue
        point = {"step": step}
        for key in ("team/score", "team/score_low", "team/score_high"):
            if f"eval/{key}" in row:
                point[key] = round(row[f"eval/{key}"], 4)
        if "eval_greedy/team/score" in row:  # eval.greedy_too
            point["team/greedy/score"] = round(row["eval_greedy/team/score"], 4)
        if "team/score" in row:  # the training batch's games of that step
            point["team/train_score"] = round(row["team/score"], 4)
        for agent in ("agent_0", "agent_1"):
            for metric in METRICS:
                key = f"eval/{agent}/{metric}"
                if key in row:
                    point[f"{agent}/{metric}"] = round(row[key], 4)
                greedy = f"eval_greedy/{agent}/{metric}"  # eval.greedy_too
                if greedy in row:
                    point[f"{agent}/greedy/{metric}"] = round(row[greedy], 4)
            if f"{agent}/action_entropy" in row:
                point[f"{agent}/action_entropy"] = round(row[f"{agent}/action_entropy"], 4)
        curve.append(point)
    return curve


def summarize(files: list[str], model: str) -> list[dict]:
    """Curves (JSON + PNG under $OUT or beside each file) of runs cut off before their end,
    from their metrics files: ``--from_metrics runs/x/metrics.jsonl ...``."""
    results = []
    for file in files:
        path = Path(file)
        stem = path.name.removesuffix(".gz").removesuffix(".jsonl")
        name = stem.removesuffix("metrics").removeprefix("metrics").strip("_") or path.parent.name
        name = name.removeprefix("learning_")  # results/learning_X_metrics -> learning_X.png
        curve = curve_of(path)
        result = {"recipe": name, "model": model, "steps": curve[-1]["step"] if curve else 0,
                  "curve": curve}
        if "hanabi" in name and any("team/score" in point for point in curve):
            result["baselines"] = hanabi_reference()
        plots.plot(result, Path(os.environ.get("OUT", path.parent)))
        results.append(result)
    return results


def worse_agent(files: list[str]) -> list[dict]:
    """At each evaluation step all runs share: the WORSE agent's exact exploitability in each
    run (``worse_agent``, the goal holds for both agents), their mean and the 95% t-interval of
    that mean (t with runs - 1 degrees of freedom; 1.96 from 11 runs on)."""
    runs = [{p["step"]: max(p[f"{agent}/exploitability"] for agent in ("agent_0", "agent_1"))
             for p in curve_of(Path(file))} for file in files]
    return points_over_runs(runs, "worse_agent")


def across_seeds(files: list[str], name: str) -> dict:
    """Runs of one recipe that differ only in their seed (``--seeds_of NAME`` with
    ``--from_metrics``): ``worse_agent``'s curve, drawn."""
    result = {"recipe": name, "seeds": len(files), "metric": "exploitability of the worse "
              "agent (OpenSpiel's NashConv / 2)", "curve": worse_agent(files)}
    plots.plot_seeds(result, Path(os.environ.get("OUT", Path(files[0]).parent)))
    return result


def _versus(pipeline, opponent: str, out: Path, temperature: float | None = None) -> dict:
    """Each agent in both seats against ``opponent``, with the pipeline's current adapters, at
    ``eval.temperature`` or ``temperature`` (0: the greedy policy):
    ``{agent: {win_rate, non_loss_rate, loss_rate (+ _low/_high), seat0/.., seat1/..}}``."""
    from roll.pipeline.env_setup import seatings_of
    from roll.utils.tracking import Tracker, TrackingConfig

    names = pipeline.agent_names
    raw = [seat for agent in names for seat in ([agent, opponent], [opponent, agent])]
    seatings = seatings_of(raw, 2, names, f"versus {opponent}")
    scheduler = pipeline.scheduler(seatings, evaluation=True, temperature=temperature)
    with Tracker(TrackingConfig(backends=["console"]), str(out)) as tracker:
        metrics = pipeline.evaluate(scheduler, tracker)
    keep = ("win_rate", "non_loss_rate", "loss_rate", "seat0/non_loss_rate",
            "seat1/non_loss_rate")
    return {agent: {f"{key}{end}": round(metrics[f"eval/{agent}/{key}{end}"], 4)
                    for key in keep for end in ("", "_low", "_high")
                    if f"eval/{agent}/{key}{end}" in metrics}
            for agent in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke check)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--recipes", nargs="+", default=list(RECIPES),
                        choices=RECIPES)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--override", nargs="*", default=[],
                        help="extra Hydra overrides for every recipe (key=value)")
    parser.add_argument("--eval_every", type=int, default=20)
    parser.add_argument("--run_dir", default=None,
                        help="folder of the runs, kept between calls (resume=latest continues)")
    parser.add_argument("--tag", default="", help="suffix of the run's name (variants)")
    parser.add_argument("--vs_mcts", type=int, default=100,
                        help="MCTS simulations of the opponent evaluated before/after (0: off)")
    parser.add_argument("--greedy_too", action="store_true",
                        help="also evaluate each agent's greedy policy (temperature 0) in "
                             "both seats: against random at every evaluation (eval.greedy_too) "
                             "and, after training, against MCTS with --vs_mcts; for games "
                             "where winning, not mixing, is the goal")
    parser.add_argument("--tactics", action="store_true",
                        help="TicTacToe and Connect Four recipes: at every evaluation (and "
                             "before and after training), how often each agent takes a win or "
                             "blocks a threat, sampled and greedy (TicTacToe: exact, with its "
                             "win / loss against random per seat, benchmarks/tictactoe_policy.py;"
                             " Connect Four: on sampled positions, "
                             "benchmarks/connect_four_policy.py; the run's tactics.jsonl)")
    parser.add_argument("--profile_step", type=int, default=0, metavar="STEP",
                        help="run training step STEP under torch.profiler (after step 1's "
                             "compiles): kernels, GPU busy share, top operators -> the run's "
                             "profile.json")
    parser.add_argument("--sync_step", type=int, default=0, metavar="STEP",
                        help="run step STEP with CUDA's synchronisation debug mode: where the "
                             "host waits for the GPU, counted by the line that asked "
                             "(run_hooks.count_sync_sites) -> the run's sync_sites.json")
    parser.add_argument("--cprofile_rollout", type=int, default=0, metavar="STEP",
                        help="run the rollout of step STEP under cProfile: the host's time "
                             "function by function (admissions, tries, env steps) -> the "
                             "run's cprofile_rollout.json")
    parser.add_argument("--profile_top", type=int, default=25, metavar="TOP",
                        help="operators listed by --profile_step, functions by --cprofile_rollout")
    parser.add_argument("--compile_cache", default=None, metavar="FILE",
                        help="load torch.compile's artifacts from FILE when it exists (an "
                             "earlier run's compile_cache.bin), and save this run's after its "
                             "step 1 to its folder's compile_cache.bin")
    parser.add_argument("--from_tactics", nargs="+", default=None, metavar="FILE",
                        help="no training: a PNG of each run's tactics.jsonl beside it")
    parser.add_argument("--from_metrics", nargs="+", default=None,
                        help="no training: curves and plots of these metrics.jsonl files")
    parser.add_argument("--seeds_of", default=None, metavar="NAME",
                        help="with --from_metrics: the files are seeds of one recipe NAME; "
                        "their mean curve with a 95%% interval")
    args = parser.parse_args()
    if args.from_tactics:
        for file in map(Path, args.from_tactics):
            records = [json.loads(line) for line in file.read_text().splitlines()]
            stem = file.name.removesuffix(".jsonl")
            print(plots.plot_tactics(records, stem, file.with_name(stem + ".png")))
        return
    if args.from_metrics and args.seeds_of:
        print(json.dumps(across_seeds(args.from_metrics, args.seeds_of), indent=2))
        return
    if args.from_metrics:
        print(json.dumps(summarize(args.from_metrics, args.model), indent=2))
        return
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    summary = {"device": device, "torch": torch.__version__, "results": []}
    for name in args.recipes:  # written after each recipe, so a cut-off run keeps the rest
        summary["results"].append(run_recipe(args, name))
        text = json.dumps(summary, indent=2)
        if os.environ.get("OUT"):
            Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
            Path(os.environ["OUT"], f"learning{args.tag}.json").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
