"""Per-agent win rate and mean return of finished episodes (the team score in cooperative
games), with 95% confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from roll.agentic.rollout.results import EpisodeResult

Z95 = 1.959963984540054  # two-sided 95% quantile of the standard normal


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): normal-approximation 95% interval, mean ± z·s/√n (s: sample std)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, mean, mean
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * std / math.sqrt(n)
    return mean, mean - half, mean + half


def wilson_interval(successes: int, n: int) -> tuple[float, float, float]:
    """(rate, low, high): Wilson score 95% interval of a proportion (sane at 0 and n)."""
    if n == 0:
        return math.nan, math.nan, math.nan
    rate = successes / n
    z2 = Z95 * Z95
    centre = (rate + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(rate * (1 - rate) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return rate, max(0.0, centre - half), min(1.0, centre + half)


def summarize_episodes(
    episodes: Sequence[EpisodeResult],
    agent_names: Sequence[str],
    cooperative: bool = False,
    prefix: str = "eval/",
    winners: bool = True,
) -> dict[str, float]:
    """Metrics ``{prefix}<agent>/{win_rate,non_loss_rate,mean_return}{,_low,_high}``,
    ``draw_rate``, ``loss_rate`` and ``episodes`` over the seats each agent plays, and the same
    rates per seat (``{prefix}<agent>/seat<s>/{win_rate,non_loss_rate}{,_low,_high}``); a win,
    draw or loss is ``EpisodeResult.outcome`` (the definition the training metrics use too).
    The non-loss rate (wins + draws) is the figure for games whose perfect play is a draw.

    ``cooperative`` (every seat gets the same return, e.g. Hanabi): no win or draw rate, and
    ``{prefix}team/score{,_low,_high}`` is the shared score over all episodes.
    ``winners=False`` (team tasks: roles are scored, nobody wins): mean returns only.
    """
    metrics: dict[str, float] = {}
    for agent in agent_names:
        seats = [(episode, seat)
                 for episode in episodes for seat in episode.seating.seats_of(agent)]
        if not seats:
            continue
        returns = [episode.returns[seat] for episode, seat in seats]
        outcomes = [episode.outcome(seat) for episode, seat in seats]
        key = f"{prefix}{agent}"
        figures = [(key, "mean_return", mean_interval(returns))]
        if winners and not cooperative:
            figures += _outcome_rates(key, outcomes)
            metrics[f"{key}/draw_rate"] = outcomes.count("draw") / len(seats)
            metrics[f"{key}/loss_rate"] = outcomes.count("loss") / len(seats)
            for seat in sorted({seat for _, seat in seats}):
                figures += _outcome_rates(f"{key}/seat{seat}", [
                    episode.outcome(s) for episode, s in seats if s == seat])
        for where, name, (value, low, high) in figures:
            metrics[f"{where}/{name}"] = value
            metrics[f"{where}/{name}_low"] = low
            metrics[f"{where}/{name}_high"] = high
        metrics[f"{key}/episodes"] = float(len(seats))
    if cooperative and episodes:
        score, low, high = mean_interval([episode.returns[0] for episode in episodes])
        metrics.update({f"{prefix}team/score": score, f"{prefix}team/score_low": low,
                        f"{prefix}team/score_high": high})
    return metrics


def _outcome_rates(where: str, outcomes: list[str]) -> list[tuple[str, str, tuple]]:
    """Win and non-loss rates with Wilson intervals, as (key prefix, name, figures)."""
    wins, draws = outcomes.count("win"), outcomes.count("draw")
    return [(where, "win_rate", wilson_interval(wins, len(outcomes))),
            (where, "non_loss_rate", wilson_interval(wins + draws, len(outcomes)))]


def before_after(
    before: dict[str, float], after: dict[str, float], agents: list[str], step: int
) -> str:
    """The evaluation at step 0 next to the last one, per agent, with 95% intervals (the
    greedy policy's win rate too, where ``eval.greedy_too`` measured it)."""
    lines = [f"evaluation before training (step 0) -> after (step {step}), 95% intervals:"]
    rows = [(agent, f"eval/{agent}/{metric}", metric)
            for agent in agents for metric in ("win_rate", "mean_return")]
    rows += [(agent, f"eval_greedy/{agent}/win_rate", "greedy win")  # eval.greedy_too
             for agent in agents]
    for agent in agents:
        key = f"eval/{agent}/exploitability"
        if key in before and key in after:
            lines.append(f"  {agent:<12} {'exploitability':<12} {before[key]:.4f}  ->  "
                         f"{after[key]:.4f} (exact)")
    rows.append(("team", "eval/team/score", "score"))
    for key in sorted(k for k in after if k.startswith("eval/task/") and k in before):
        lines.append(f"  {'task':<12} {key[len('eval/task/'):]:<12} {before[key]:+.3f}  ->  "
                     f"{after[key]:+.3f}")
    for who, key, metric in rows:
        if key not in before or key not in after:
            continue
        lines.append(
            f"  {who:<12} {metric:<12} {before[key]:+.3f} [{before[key + '_low']:+.3f}, "
            f"{before[key + '_high']:+.3f}]  ->  {after[key]:+.3f} "
            f"[{after[key + '_low']:+.3f}, {after[key + '_high']:+.3f}]"
        )
    return "\n".join(lines)


def policy_divergences(trainer, batch, agent_names: Sequence[str], temperature: float,
                       max_rows: int = 16) -> dict[str, float]:
    """How far apart the agents' policies are: for each pair a < b (config order), the mean
    KL(p_a || p_b) of their next-token distributions over the response tokens of the same
    rows (the first ``max_rows`` rows of ``batch``, whoever answered them), as
    ``eval/task/policy_kl/<a>-<b>``, and their mean as ``eval/task/policy_kl``."""
    if batch is None or len(agent_names) < 2:
        return {}
    rows = batch.select(torch.arange(min(max_rows, len(batch)), device=batch.agent_id.device))
    tokens = float(rows.response_mask.sum())
    metrics = {}
    for i, agent_a in enumerate(agent_names):
        for agent_b in agent_names[i + 1:]:
            sums = trainer.divergence_rows(rows, agent_a, agent_b, temperature)  # (rows,)
            metrics[f"eval/task/policy_kl/{agent_a}-{agent_b}"] = (
                float(sums.sum()) / tokens if tokens else 0.0)
    metrics["eval/task/policy_kl"] = sum(metrics.values()) / len(metrics)
    return metrics


def team_return(episodes: Sequence[EpisodeResult]) -> dict[str, float]:
    """``team/episode_return``: the mean return of the trained agents' seats over
    ``episodes``. Nothing when there are none, nor where it is 0 by arithmetic: every seat of
    every episode trained and each game's returns summing to 0 (zero-sum self-play, e.g.
    Kuhn's ``nash.yaml``), a constant that would read as "nothing learnt"."""
    if not episodes:
        return {}
    if all(spec.is_trained for episode in episodes for spec in episode.seating.seats) and all(
            abs(sum(episode.returns)) < 1e-9 for episode in episodes):
        return {}
    returns = [episode.returns[seat] for episode in episodes
               for seat, spec in enumerate(episode.seating.seats) if spec.is_trained]
    return {"team/episode_return": sum(returns) / max(1, len(returns))}
