"""Per-agent win rate and mean score of finished episodes, with 95% confidence intervals."""

from __future__ import annotations

import math
from collections.abc import Sequence

from roll.agentic.rollout.scheduler import EpisodeResult

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
    episodes: Sequence[EpisodeResult], agent_names: Sequence[str], prefix: str = "eval/"
) -> dict[str, float]:
    """Metrics ``{prefix}agent_<name>/{win_rate,mean_return}{,_low,_high}`` over the seats each
    agent plays. A win is a return above every other seat's; a draw is neither win nor loss."""
    metrics: dict[str, float] = {}
    for agent in agent_names:
        returns, wins, draws = [], 0, 0
        for episode in episodes:
            for seat in episode.seating.seats_of(agent):
                mine = episode.returns[seat]
                others = [r for s, r in enumerate(episode.returns) if s != seat]
                returns.append(mine)
                wins += bool(others) and mine > max(others)
                draws += bool(others) and mine == max(others)
        if not returns:
            continue
        key = f"{prefix}agent_{agent}"
        for name, (value, low, high) in (
            ("win_rate", wilson_interval(wins, len(returns))),
            ("mean_return", mean_interval(returns)),
        ):
            metrics[f"{key}/{name}"] = value
            metrics[f"{key}/{name}_low"] = low
            metrics[f"{key}/{name}_high"] = high
        metrics[f"{key}/draw_rate"] = draws / len(returns)
        metrics[f"{key}/episodes"] = float(len(returns))
    return metrics
