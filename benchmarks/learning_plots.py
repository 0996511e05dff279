"""The curves benchmarks/learning.py draws: a run's evaluations (``plot``), the worse agent
over seeds (``plot_seeds``) and TicTacToe's exact tactics (``plot_tactics``); headless
matplotlib, or a line saying why nothing was drawn."""

from __future__ import annotations

from pathlib import Path


def _pyplot(result: dict, folder: Path):
    """matplotlib's pyplot (headless) with ``folder`` made, or None with ``result["plot"]``
    saying why."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        result["plot"] = "matplotlib not installed"
        return None
    folder.mkdir(parents=True, exist_ok=True)
    return plt


def _save(plt, figure, path: Path, result: dict) -> None:
    """Write ``figure`` to ``path``, close it, and name it in ``result["plot"]``."""
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    result["plot"] = str(path.name)


def plot_seeds(result: dict, folder: Path) -> None:
    plt = _pyplot(result, folder)
    if plt is None:
        return
    figure, axis = plt.subplots(figsize=(6, 4))
    steps = [p["step"] for p in result["curve"]]
    for seed in range(result["seeds"]):
        axis.plot(steps, [p["worse_agent"][seed] for p in result["curve"]], lw=0.8,
                  alpha=0.5, label=f"run {seed}")
    axis.plot(steps, [p["mean"] for p in result["curve"]], color="k", marker="o", label="mean")
    axis.fill_between(steps, [max(p["low"], 0) for p in result["curve"]],
                      [p["high"] for p in result["curve"]], color="k", alpha=0.15,
                      label="95% interval of the mean")
    axis.axhline(1 / 6, color="r", ls="--", lw=0.8, label="best deterministic (1/6)")
    axis.set(title=f"{result['recipe']}\nworse agent's exploitability, {result['seeds']} seeds",
             xlabel="step", ylim=(0, 0.7))
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    _save(plt, figure, folder / f"learning_{result['recipe']}_seeds.png", result)


def plot(result: dict, folder: Path) -> None:
    plt = _pyplot(result, folder)
    if plt is None:
        return
    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    steps = [p["step"] for p in result["curve"]]
    exact = any("agent_0/exploitability" in p for p in result["curve"])
    team = any("team/score" in p for p in result["curve"])
    left = "exploitability" if exact else "mean_return" if team else "non_loss_rate"
    for agent in ("agent_0", "agent_1"):
        _rate(axes[0], steps, result["curve"], agent, left)
        if not team:
            _rate(axes[1], steps, result["curve"], agent, "win_rate")
    if team:  # cooperative: the shared score with its 95% interval
        axes[1].errorbar(steps, [p["team/score"] for p in result["curve"]], yerr=[
            [p["team/score"] - p["team/score_low"] for p in result["curve"]],
            [p["team/score_high"] - p["team/score"] for p in result["curve"]]],
            marker="o", capsize=3, label="agent_0 + agent_1")
        for key, style, label in (("team/greedy/score", ":", "greedy (temperature 0)"),
                                  ("team/train_score", "--", "training games")):
            if any(key in point for point in result["curve"]):
                axes[1].plot(steps, [p.get(key) for p in result["curve"]], ls=style,
                             marker="x", label=label)
        for team, score in result.get("baselines", {}).items():  # reference teams' scores
            axes[1].axhline(score, color="gray", ls="-." if team == "random" else "--",
                            lw=0.8, label=f"{team} team ({score:.2f})")
    title = ("exploitability (exact)" if exact
             else "non-loss rate vs random, both seats [95%]")
    figure.suptitle(result["recipe"])
    axes[0].set(title=title, xlabel="step")
    if team:
        axes[0].set(title="mean return per agent")
        axes[1].set(title="team score [95%]", xlabel="step")
    else:
        axes[1].set(title="win rate vs random [95%]", xlabel="step", ylim=(0, 1))
    for axis in axes:
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
    _save(plt, figure, folder / f"learning_{result['recipe']}.png", result)


def _rate(axis, steps: list[int], curve: list[dict], agent: str, metric: str) -> None:
    """One agent's ``metric`` over the evaluations; where the curve has them, its 95% interval
    shaded and the greedy policy's figure (``eval.greedy_too``) dotted, in the same colour."""
    (line,) = axis.plot(steps, [p.get(f"{agent}/{metric}") for p in curve], marker="o",
                        label=agent)
    if all(f"{agent}/{metric}_low" in p for p in curve):
        axis.fill_between(steps, [p[f"{agent}/{metric}_low"] for p in curve],
                          [p[f"{agent}/{metric}_high"] for p in curve],
                          color=line.get_color(), alpha=0.15, label=f"{agent} 95%")
    if any(f"{agent}/greedy/{metric}" in p for p in curve):
        axis.plot(steps, [p.get(f"{agent}/greedy/{metric}") for p in curve], ls=":",
                  marker="x", color=line.get_color(), label=f"{agent} greedy")


def plot_tactics(records: list[dict], title: str, path: Path) -> str:
    """Each agent's exact figures against random at every scored evaluation (the run's
    tactics.jsonl: ``{"step", "agents": {agent: {"X"|"O": figures}}}``), one panel per seat
    (sampled win and loss, greedy win, the goal's 85% / 5% lines), one of blocks made
    (chance 0.34) and, where the records have it, one of the greedy policy's gap to the best
    player (``greedy_gap``: its total per seat, and as O its first move's share), written to
    ``path``; what was written, or why nothing was."""
    first = next(iter(records[0]["agents"].values()))
    if "win" not in next(iter(first.values())):  # connect_four_policy's figures
        return plot_takes_and_blocks(records, title, path)
    result: dict = {}
    plt = _pyplot(result, path.parent)
    if plt is None:
        return result["plot"]
    steps = [record["step"] for record in records]
    gaps = all("greedy_gap" in figures for record in records
               for seats in record["agents"].values() for figures in seats.values())
    figure, axes = plt.subplots(1, 4 if gaps else 3, figsize=(18 if gaps else 14, 4))
    for agent, color in zip(sorted(records[0]["agents"]), ("C0", "C1", "C2", "C3"),
                            strict=False):
        for axis, mark in zip(axes, "XO", strict=False):
            figures = [record["agents"][agent][mark] for record in records]
            axis.plot(steps, [f["win"] for f in figures], color=color, marker="o",
                      label=f"{agent} win")
            axis.plot(steps, [f["loss"] for f in figures], color=color, ls="--", marker="x",
                      label=f"{agent} loss")
            axis.plot(steps, [f["greedy_win"] for f in figures], color=color, ls=":",
                      label=f"{agent} greedy win")
            axes[2].plot(steps, [f["blocks_made"] for f in figures], color=color,
                         ls="-" if mark == "X" else "--", marker="o",
                         label=f"{agent} as {mark}")
            if gaps:
                axes[3].plot(steps, [f["greedy_gap"]["total"] for f in figures], color=color,
                             ls="-" if mark == "X" else "--", marker="o",
                             label=f"{agent} as {mark}")
                if mark == "O":
                    axes[3].plot(steps, [f["greedy_gap"]["by_move"][0] for f in figures],
                                 color=color, ls=":", label=f"{agent} as O, 1st move")
    for axis, mark in zip(axes, "XO", strict=False):
        axis.axhline(0.85, color="g", lw=0.8, label="goal: win >= 0.85")
        axis.axhline(0.05, color="r", lw=0.8, label="goal: loss <= 0.05")
        axis.set(title=f"as {mark} against random (exact)", xlabel="step", ylim=(0, 1))
    axes[2].axhline(0.34, color="gray", lw=0.8, label="chance (as O)")
    axes[2].set(title="blocks made (where the opponent threatens)", xlabel="step", ylim=(0, 1))
    if gaps:  # tictactoe_policy.gap_by_board
        axes[3].set(title="greedy: return short of the best player's", xlabel="step",
                    ylabel="win - loss, best minus greedy")
    for axis in axes:
        axis.legend(fontsize=6)
        axis.grid(alpha=0.3)
    figure.suptitle(title, fontsize=10)
    _save(plt, figure, path, result)
    return result["plot"]


def plot_takes_and_blocks(records: list[dict], title: str, path: Path) -> str:
    """Connect Four's tactics at every scored evaluation (``connect_four_policy.report`` records:
    ``{"step", "agents": {agent: {"x"|"o": figures}}}``): one panel of wins taken and one of
    blocks made, each agent in each seat, sampled (solid) and greedy (dotted), with uniform
    play's level, written to ``path``; what was written, or why nothing was."""
    result: dict = {}
    plt = _pyplot(result, path.parent)
    if plt is None:
        return result["plot"]
    steps = [record["step"] for record in records]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for agent, color in zip(sorted(records[0]["agents"]), ("C0", "C1", "C2", "C3"),
                            strict=False):
        for mark, marker in (("x", "o"), ("o", "s")):
            figures = [record["agents"][agent][mark] for record in records]
            for axis, key in zip(axes, ("wins_taken", "blocks_made"), strict=True):
                axis.plot(steps, [f[key] for f in figures], color=color, marker=marker,
                          label=f"{agent} as {mark}")
                axis.plot(steps, [f[f"greedy_{key}"] for f in figures], color=color, ls=":",
                          marker=marker, label=f"{agent} as {mark}, greedy")
    for axis, what in zip(axes, ("wins taken (a column wins now)",
                                 "blocks made (the opponent wins next in a column)"),
                          strict=True):
        # uniform play on connect_four_policy's positions: 0.19 (its ``reference``)
        axis.axhline(0.19, color="gray", lw=0.8, label="uniform play (0.19)")
        axis.set(title=what, xlabel="step", ylim=(0, 1))
        axis.legend(fontsize=6)
        axis.grid(alpha=0.3)
    figure.suptitle(title, fontsize=10)
    _save(plt, figure, path, result)
    return result["plot"]


def greedy_o_by_run(runs: dict[str, list[dict]]) -> dict[str, dict[int, dict]]:
    """Per run (label -> its tactics.jsonl records), per scored step: the greedy O seat's win
    and loss rates, lowest and mean over the run's agents (the goal needs every agent)."""
    summary = {}
    for label, records in runs.items():
        summary[label] = {}
        for record in records:
            figures = [seats["O"] for seats in record["agents"].values()]
            wins = [f["greedy_win"] for f in figures]
            losses = [f["greedy_loss"] for f in figures]
            summary[label][record["step"]] = {
                "win_min": min(wins), "win_mean": sum(wins) / len(wins),
                "loss_max": max(losses)}
    return summary


def plot_greedy_o_runs(runs: dict[str, list[dict]], title: str, path: Path) -> dict:
    """The greedy O seat against random over several runs' scored evaluations (the seat the
    TicTacToe goal turns on): each run's worst agent's win rate (line) and its agents' mean
    (dotted), its worst agent's loss rate (second panel), the goal's lines; written to
    ``path``. Returns ``{"runs": greedy_o_by_run's summary, "plot": what was written, or why
    nothing was}``."""
    result: dict = {"runs": greedy_o_by_run(runs)}
    plt = _pyplot(result, path.parent)
    if plt is None:
        return result
    figure, (wins, losses) = plt.subplots(1, 2, figsize=(12, 4))
    for index, (label, by_step) in enumerate(result["runs"].items()):
        steps = sorted(by_step)
        color = f"C{index % 10}"
        wins.plot(steps, [by_step[s]["win_min"] for s in steps], color=color, marker="o",
                  label=f"{label}: worst agent")
        wins.plot(steps, [by_step[s]["win_mean"] for s in steps], color=color, ls=":")
        losses.plot(steps, [by_step[s]["loss_max"] for s in steps], color=color, marker="x",
                    label=label)
    wins.axhline(0.85, color="g", lw=0.8, label="goal: win >= 0.85")
    losses.axhline(0.05, color="r", lw=0.8, label="goal: loss <= 0.05")
    wins.set(title="greedy O: win rate vs random (exact; dotted: agents' mean)",
             xlabel="step", ylim=(0.6, 1))
    losses.set(title="greedy O: loss rate vs random, worst agent", xlabel="step",
               ylim=(0, 0.15))
    for axis in (wins, losses):
        axis.legend(fontsize=6)
        axis.grid(alpha=0.3)
    figure.suptitle(title, fontsize=10)
    _save(plt, figure, path, result)
    return result


def main() -> None:
    """python benchmarks/learning_plots.py --greedy_o LABEL=TACTICS.jsonl ... --out FILE.png"""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--greedy_o", nargs="+", required=True, metavar="LABEL=FILE")
    parser.add_argument("--title", default="TicTacToe, greedy O seat")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = {}
    for item in args.greedy_o:
        label, _, name = item.partition("=")
        if not name:
            parser.error(f"--greedy_o {item!r}: expected LABEL=FILE")
        runs[label] = [json.loads(line) for line in Path(name).read_text().splitlines()
                       if line.strip()]
    print(json.dumps(plot_greedy_o_runs(runs, args.title, args.out), indent=1))


if __name__ == "__main__":
    main()
