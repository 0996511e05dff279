"""What the shipped recipes learn, in one figure: the README's picture.

Every panel is drawn from metrics files under ``benchmarks/results/`` that the learning runs of
``benchmarks/README.md`` brought back (nothing is re-run): for each recipe the mean over its seeds
with the 95% t-interval of that mean, each seed as a thin line, and the reference lines its goal
is stated against. Cooperative Hanabi is in it too, where no recipe learns yet.

    python benchmarks/overview.py            # -> benchmarks/results/overview.{png,json}

Units: exploitability is OpenSpiel's (NashConv / 2) of the worse of the two agents; TicTacToe is
each agent's exact greedy win rate against a uniformly random opponent (every game enumerated,
``benchmarks/tictactoe_policy.py``); Hanabi is the team score out of 6 of each training step's
games.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import learning  # noqa: E402
from report import points_over_runs, read_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def worse_exploitability(files: list[Path]) -> list[dict]:
    """``learning.worse_agent``'s curve (the worse agent's exploitability per run at each
    evaluation step all runs share, mean and 95% interval), its per-run values as ``values``."""
    return [{**{k: v for k, v in point.items() if k != "worse_agent"},
             "values": point["worse_agent"]} for point in learning.worse_agent(files)]


def greedy_wins(files: list[Path], seat: str) -> list[dict]:
    """At each step every tactics file has: every agent's exact greedy win rate in ``seat``
    (``X`` or ``O``) against random, pooled over agents and files (one value per agent and
    seed), their mean and 95% t-interval."""
    runs = []
    for file in files:
        per_agent: dict[str, dict[int, float]] = {}
        for line in read_text(file).splitlines():
            row = json.loads(line)
            for agent, seats in row["agents"].items():
                per_agent.setdefault(agent, {})[row["step"]] = seats[seat]["greedy_win"]
        runs.extend(per_agent.values())
    return points_over_runs(runs)


def team_score(file: Path, window: int) -> list[dict]:
    """The training games' team score of each step, and its mean over the last ``window``
    steps (fewer at the start)."""
    rows = {}
    for line in read_text(file).splitlines():
        row = json.loads(line)
        if "team/score" in row:
            rows[row["step"]] = row["team/score"]
    steps = sorted(rows)
    points = []
    for i, step in enumerate(steps):
        recent = [rows[s] for s in steps[max(0, i - window + 1):i + 1]]
        points.append({"step": step, "values": [round(rows[step], 4)],
                       "mean": round(sum(recent) / len(recent), 4)})
    return points


def panels(results: Path) -> list[dict]:
    """The recipes, their files and reference lines (benchmarks/README.md names each run)."""
    def files(pattern: str, seeds) -> list[Path]:
        return [results / pattern.format(s) for s in seeds]

    kuhn_lines = [(1 / 6, "best deterministic (1/6)"), (0.08, "goal 0.08"), (0.458, "uniform")]
    return [
        {"title": "Kuhn, nash.yaml, SmolLM2 (H100, 3 seeds)", "ylabel": "exploitability",
         "points": worse_exploitability(files(
             "learning_kuhn_nash_g256_s{}_smollm2_h100_metrics.jsonl.gz", (0, 1, 2))),
         "lines": kuhn_lines},
        {"title": "Kuhn quickstart (nash, 150 steps), SmolLM2 (H100, 2 seeds)",
         "ylabel": "exploitability",
         "points": worse_exploitability(files(
             "learning_kuhn_quickstart_s{}_smollm2_h100_metrics.jsonl.gz", (0, 1))),
         "lines": kuhn_lines},
        {"title": "Kuhn, nash.yaml, tiny model on 2 CPU cores (4 seeds)",
         "ylabel": "exploitability",
         "points": worse_exploitability(files(
             "learning_kuhn_nash_tiny_wide_1000_compile_s{}_metrics.jsonl.gz", (0, 1, 2, 3))),
         "lines": kuhn_lines},
        {"title": "Leduc, nash.yaml, SmolLM2 (H100, 3 seeds)", "ylabel": "exploitability",
         "points": worse_exploitability([
             results / "learning_leduc_nash_g256_rkl_lr21_130_s0_smollm2_h100_metrics.jsonl.gz",
             results / "learning_leduc_nash_s1_smollm2_h100_metrics.jsonl.gz",
             results / "learning_leduc_nash_s2_smollm2_h100_metrics.jsonl.gz"]),
         "lines": [(2.37, "uniform"), (1.2, "goal 1.2")]},
        {"title": "TicTacToe, mixed.yaml, SmolLM2 (2 seeds x 2 agents)",
         "ylabel": "greedy win rate vs random",
         "series": {seat: greedy_wins(files(
             "learning_tictactoe_mixed_150_bf16_s{}_smollm2_h200x2_tactics.jsonl", (0, 1)), seat)
             for seat in ("X", "O")},
         "lines": [(0.85, "goal 0.85")]},
        {"title": "Hanabi (small, 1 life), GRPO, SmolLM2: no recipe yet",
         "ylabel": "team score of the step's games (of 6)",
         "points": team_score(results / "learning_hanabi_grpo_bonus_s74_h100_metrics.jsonl.gz",
                              window=5),
         "legend": "one run, 5-step running mean",
         "lines": [(3.64, "rule team"), (1.8, "a recipe's bar"), (0.079, "random")]},
    ]


def draw(figure: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    rows = (len(figure) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.6 * rows))
    for ax, panel in zip(axes.flat, figure, strict=False):
        series = panel.get("series") or {"mean": panel["points"]}
        for (label, points), color in zip(series.items(), ("black", "tab:blue"), strict=False):
            steps = [p["step"] for p in points]
            for k in range(len(points[0]["values"])) if len(points[0]["values"]) > 1 else ():
                ax.plot(steps, [p["values"][k] for p in points], color=color, lw=0.6, alpha=0.35)
            if "low" in points[0]:
                ax.fill_between(steps, [p["low"] for p in points], [p["high"] for p in points],
                                color=color, alpha=0.15, lw=0)
            else:  # one run: its per-step values, and their running mean bold
                ax.plot(steps, [p["values"][0] for p in points], color=color, lw=0.6, alpha=0.35)
            ax.plot(steps, [p["mean"] for p in points], color=color, lw=1.8,
                    marker="o" if len(points) < 20 else None, ms=3,
                    label=label if panel.get("series") else panel.get(
                        "legend", "mean over seeds (band: its 95% interval)"))
        for value, label in panel["lines"]:
            ax.axhline(value, ls="--", lw=0.9, color="tab:red" if "goal" in label or "bar" in label
                       else "grey")
            ax.annotate(label, (1.0, value), xycoords=("axes fraction", "data"), ha="right",
                        va="bottom", fontsize=7, color="dimgrey")
        ax.set_title(panel["title"], fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel(panel["ylabel"], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="best")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(figure):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default=str(RESULTS), help="folder of the metrics files")
    parser.add_argument("--out", default=None, help="folder of overview.{png,json} "
                        "(default: $OUT, else --results)")
    args = parser.parse_args()
    figure = panels(Path(args.results))
    out = Path(args.out or os.environ.get("OUT") or args.results)
    draw(figure, out / "overview.png")
    summary = [{"title": p["title"],
                "last": {k: v[-1] for k, v in (p.get("series") or {"mean": p["points"]}).items()}}
               for p in figure]
    (out / "overview.json").write_text(json.dumps(figure, indent=1) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
