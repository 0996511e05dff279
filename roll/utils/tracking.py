"""Metrics of a run go to several trackers (console, TensorBoard, WandB, JSON lines) through one
``Tracker``.

Naming convention of metric keys (the plot command and the console line rely on it):

- ``<agent>/<metric>``       one agent's figure, keyed by the agent's name, e.g.
  ``agent_0/policy_loss`` or ``alice/win_rate`` (``agent_metrics`` builds these keys from a
  ``{agent: {metric: value}}`` dict);
- ``team/<metric>``          a figure of the whole team, e.g. ``team/episode_return``;
- ``time/<phase>``           seconds spent in a phase of the step: ``time/rollout``,
  ``time/logprobs``, ``time/train``, ``time/sync``, ``time/eval``, and ``time/wake`` /
  ``time/sleep`` where the engine sleeps between phases (``rollout.vllm.sleep_between_phases``);
- ``rollout/<x>``            rollout statistics, e.g. ``rollout/episodes``;
- ``compile/<x>``            torch.compile's work in the step, ``compile/new_graphs``, and the
  trainer's captured micro-batch graphs (``compile/train_captures``, ``_capture_s``,
  ``_uncaptured``: ``trainer.capture``);
- ``eval/<agent>/<metric>``, ``eval/team/<metric>``  the same for evaluation rollouts;
  ``eval_greedy/...`` the same for the greedy policy's (``eval.greedy_too``).

The first part of a key is an agent's name unless it is one of ``NAMESPACES``; agent names
that would collide with those are refused by the config check.

Values are logged as they are: NaN and inf are not dropped (the JSON lines file writes them as
``NaN`` / ``Infinity``, which Python's ``json`` reads back), and the console line marks them.
Heavy backends (TensorBoard, WandB) are imported only when configured, so the core imports
without them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TextIO

from roll.errors import ConfigError, require_int

BACKENDS = ("console", "tensorboard", "wandb", "jsonl")
WANDB_MODES = ("auto", "offline", "online", "disabled")
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
NAMESPACES = ("team", "time", "rollout", "eval", "eval_greedy", "train", "critic", "compile")
"""Top-level metric namespaces that are not agents (no agent may take one of these names)."""
# Keys a JSON line holds besides the metrics; a metric must not take these names.
RESERVED_KEYS = ("step", "wall_time")
# Phases shown first, in this order, on the console line (other time/* keys follow).
TIME_KEYS = ("time/rollout", "time/logprobs", "time/train", "time/sync")
# Per-agent figures on the console line: one per slot, the first name of the slot present.
# What says whether an agent still learns (invariant 7): its policy's entropy (over legal moves
# where answers are constrained), the share of its rows with a zero advantage, and its gradient
# norm. Not the policy loss nor approx_kl: with one optimizer step per rollout they are ~0 by
# construction (the ratio is 1 and GRPO's advantages are centred), however the agent fares.
CONSOLE_AGENT_SLOTS = (
    ("episode_return", "turn_reward", "reward_mean"),
    ("action_entropy", "entropy"),
    ("zero_adv_fraction",),
    ("grad_norm", "policy_loss", "loss"),
    ("kl_ref",),
)
CONSOLE_TEAM_SHOWN = 3


@dataclass
class TrackingConfig:
    """Where the metrics of a run go (the run's ``tracking``). The run's folder and WandB run id
    are the run's own, so ``Tracker`` takes them as arguments."""

    backends: list[str] = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """Any of 'console', 'tensorboard', 'wandb', 'jsonl'. Keep 'jsonl': the plot command reads
    ``<log_dir>/metrics.jsonl``."""
    project: str = "roll"
    """WandB project."""
    entity: str | None = None
    """WandB entity (user or team); None takes the account's default."""
    run_name: str | None = None
    """Name of the run in WandB; None: a training run takes its output folder's name (a
    ``Tracker`` used alone lets WandB pick one)."""
    wandb_mode: str = "auto"
    """'auto' (online if the WANDB_API_KEY env var is set, else offline), 'offline', 'online'
    or 'disabled'. Offline runs land in ``<log_dir>/wandb/offline-run-*``; upload them later
    with ``wandb sync <that folder>``."""
    tags: list[str] = field(default_factory=list)
    """WandB tags of the run."""
    console_every: int = 1
    """Print the console line every this many steps (>= 1); steps with NaN/inf always print."""

    def validate(self) -> TrackingConfig:
        """Raise ConfigError naming the ``tracking.<field>`` that is wrong."""
        if isinstance(self.backends, str) or not isinstance(self.backends, list | tuple):
            raise ConfigError("tracking.backends", self.backends, f"must be a list of {BACKENDS}")
        unknown = [name for name in self.backends if name not in BACKENDS]
        if unknown:
            raise ConfigError("tracking.backends", list(self.backends),
                              f"unknown backend(s) {unknown}; choose from {BACKENDS}")
        if self.wandb_mode not in WANDB_MODES:
            raise ConfigError("tracking.wandb_mode", self.wandb_mode,
                              f"must be one of {WANDB_MODES}")
        require_int("tracking.console_every", self.console_every)
        return self


def agent_metrics(per_agent: dict[str, dict[str, float]]) -> dict[str, float]:
    """Flatten ``{agent: {metric: value}}`` into ``{f"{agent}/{metric}": value}``."""
    return {
        f"{agent}/{metric}": float(value)
        for agent, metrics in per_agent.items()
        for metric, value in metrics.items()
    }


def split_agent_key(
    key: str, agent_names: Collection[str] | None = None
) -> tuple[str, str] | None:
    """``"alice/policy_loss"`` -> ``("alice", "policy_loss")``; None for other keys.

    With ``agent_names`` the first part must be one of them; without (e.g. reading a
    metrics.jsonl), any first part that is not one of ``NAMESPACES`` is taken as an agent.
    """
    if "/" not in key:
        return None
    agent, metric = key.split("/", 1)
    if not agent or not metric or agent in NAMESPACES:
        return None
    if agent_names is not None and agent not in agent_names:
        return None
    return agent, metric


def resolve_wandb_mode(mode: str) -> str:
    """'auto' -> 'online' when WANDB_API_KEY is set, else 'offline'; other modes unchanged."""
    if mode != "auto":
        return mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class _Backend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def finish(self, exit_code: int) -> None: ...


class JsonlBackend:
    """Appends one JSON line per ``log`` call to ``<log_dir>/metrics.jsonl`` (flushed each line).

    Appending keeps the lines of a resumed run in the same file; a step logged twice (a step
    redone after resume) appears twice, and readers keep the last line of that step.
    """

    def __init__(self, log_dir: Path) -> None:
        self.path = log_dir / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step, "wall_time": time.time(), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def finish(self, exit_code: int) -> None:
        self._file.close()


class TensorBoardBackend:
    """Scalars into ``<log_dir>/tensorboard`` through ``torch.utils.tensorboard``."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir / TENSORBOARD_DIR))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, global_step=step)
        # A step takes seconds to minutes; flushing each one keeps TensorBoard live.
        self.writer.flush()

    def finish(self, exit_code: int) -> None:
        self.writer.close()


class WandbBackend:
    """One WandB run; ``wandb`` is imported here, only when this backend is configured."""

    def __init__(self, config: TrackingConfig, log_dir: Path, run_id: str | None,
                 run_config: dict[str, Any] | None) -> None:
        import wandb

        self.mode = resolve_wandb_mode(config.wandb_mode)
        self.run = wandb.init(
            project=config.project,
            entity=config.entity,
            name=config.run_name,
            dir=str(log_dir),
            mode=self.mode,
            tags=list(config.tags),
            config=run_config or {},
            id=run_id,
            resume="allow" if run_id else None,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def finish(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)


def _format_value(value: float) -> str:
    if not math.isfinite(value):
        return f"!{value}!"  # e.g. "!nan!", "!inf!": a non-finite value stands out
    return f"{value:.3g}"


def _agent_figures(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    agents: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        split = split_agent_key(key)
        if split is not None:
            agents.setdefault(split[0], {})[split[1]] = value
    return agents


def format_console_line(metrics: dict[str, float], step: int) -> str:
    """One compact line: step, phase times, a few figures per agent and team, non-finite keys.

    Example: ``step 12 | rollout 3.2s logprobs 0.41s train 5.1s sync 0.2s |
    alice episode_return=0.5 action_entropy=0.61 zero_adv_fraction=0.25 grad_norm=0.31 |
    bob ... | team episode_return=0.1``.
    Per agent it shows one figure per ``CONSOLE_AGENT_SLOTS`` slot (or, with none of those, the
    first metrics by name); every NaN/inf key is listed at the end, shown or not.
    """
    parts = [f"step {step}"]
    other_times = sorted(k for k in metrics if k.startswith("time/") and k not in TIME_KEYS)
    times = [k for k in (*TIME_KEYS, *other_times) if k in metrics]
    if times:
        parts.append(" ".join(f"{k[len('time/'):]} {_format_value(metrics[k])}s" for k in times))
    for agent, figures in sorted(_agent_figures(metrics).items()):
        slots = (next((k for k in slot if k in figures), None) for slot in CONSOLE_AGENT_SLOTS)
        shown = [k for k in slots if k is not None] or sorted(figures)[: len(CONSOLE_AGENT_SLOTS)]
        parts.append(agent + " " + " ".join(f"{k}={_format_value(figures[k])}" for k in shown))
    team = sorted(k for k in metrics if k.startswith("team/"))[:CONSOLE_TEAM_SHOWN]
    if team:
        parts.append("team " + " ".join(f"{k[5:]}={_format_value(metrics[k])}" for k in team))
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    if bad:
        parts.append(f"NON-FINITE: {', '.join(bad)}")
    return " | ".join(parts)


class ConsoleBackend:
    """Prints ``format_console_line`` every ``every`` steps, and at every step with NaN/inf."""

    def __init__(self, every: int, stream: TextIO | None = None) -> None:
        self.every = every
        self.stream = stream

    def log(self, metrics: dict[str, float], step: int) -> None:
        has_bad = any(not math.isfinite(v) for v in metrics.values())
        if step % self.every == 0 or has_bad:
            print(format_console_line(metrics, step), file=self.stream or sys.stdout, flush=True)

    def finish(self, exit_code: int) -> None:
        return None


class ProgressLine:
    """A throttled progress line for long loops (e.g. a rollout): ``rollout turns 120/512 (23%)``.

    On a terminal the line is redrawn in place (at most every ``tty_interval_s``) and erased when
    ``done >= total``. In a log file a line is printed at most every ``file_interval_s`` seconds,
    so loops shorter than that print nothing; a loop that printed gets a final line too.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        tty_interval_s: float = 0.2,
        file_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.clock = clock
        self.tty_interval_s = tty_interval_s
        self.file_interval_s = file_interval_s
        self._loop_open = False
        self._printed = False  # this loop printed something (in place on a tty)
        self._last_print = 0.0

    def update(self, done: int, total: int, what: str = "") -> None:
        """Report ``done`` of ``total`` units of ``what`` (printed when the throttle allows)."""
        stream = self.stream or sys.stdout
        tty = stream.isatty()
        now = self.clock()
        if not self._loop_open:  # a new loop: a terminal shows it at once, a log file waits
            self._loop_open, self._printed = True, False
            self._last_print = -math.inf if tty else now
        finished = done >= total
        interval = self.tty_interval_s if tty else self.file_interval_s
        percent = f" ({100.0 * done / total:.0f}%)" if total > 0 else ""
        text = f"{what} {done}/{total}{percent}".strip()
        if finished:
            self._loop_open = False
            if tty and self._printed:
                print("\r\x1b[K", end="", file=stream, flush=True)
            elif self._printed:
                print(text, file=stream, flush=True)
            self._printed = False
        elif now - self._last_print >= interval:
            self._last_print, self._printed = now, True
            if tty:
                print(f"\r{text}\x1b[K", end="", file=stream, flush=True)
            else:
                print(text, file=stream, flush=True)

    def close_line(self) -> None:
        """Erase an in-place line left open on a terminal (before another line prints)."""
        stream = self.stream or sys.stdout
        if self._loop_open and self._printed and stream.isatty():
            print("\r\x1b[K", end="", file=stream, flush=True)
        self._loop_open = self._printed = False


class Tracker:
    """Sends each step's metrics to every configured backend.

    Use as ``with Tracker(cfg, log_dir, run_config=...) as tracker: tracker.log(metrics, step)``;
    leaving the block calls ``finish`` (WandB marks the run failed when the block raised).
    """

    def __init__(
        self,
        config: TrackingConfig,
        log_dir: str | Path,
        run_config: dict[str, Any] | None = None,
        stream: TextIO | None = None,
        run_id: str | None = None,
    ) -> None:
        """``log_dir`` is the run's output folder: metrics.jsonl, tensorboard/ and wandb/ go
        there. ``run_config`` is the run's whole config as a plain dict (stored by WandB);
        ``stream`` is where console lines go (default: sys.stdout at the time of printing).
        ``run_id`` is the WandB run id: starting again with the same id continues that WandB
        run (``resume="allow"``: a resumed training run keeps one curve); None lets WandB pick
        a fresh id."""
        config.validate()
        if not log_dir:
            raise ValueError(f"Tracker log_dir={log_dir!r}: must be a path")
        self.config = config
        self.run_id = run_id
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._console = "console" in config.backends
        self._progress = ProgressLine(stream=stream)
        self._finished = False
        self.backends: dict[str, _Backend] = {}
        try:
            for name in dict.fromkeys(config.backends):  # dedupe, keep order
                self.backends[name] = self._make_backend(name, run_config, stream)
        except BaseException:
            self.finish(exit_code=1)  # close the backends already open, then fail
            raise

    def _make_backend(
        self, name: str, run_config: dict[str, Any] | None, stream: TextIO | None
    ) -> _Backend:
        if name == "jsonl":
            return JsonlBackend(self.log_dir)
        if name == "tensorboard":
            return TensorBoardBackend(self.log_dir)
        if name == "wandb":
            return WandbBackend(self.config, self.log_dir, self.run_id, run_config)
        return ConsoleBackend(self.config.console_every, stream)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log one step's ``{key: value}`` (values are cast to float; NaN/inf are kept)."""
        if self._finished:
            raise RuntimeError("Tracker.log after finish()")
        values = _as_floats(metrics)
        self._progress.close_line()
        for backend in self.backends.values():
            backend.log(values, step)

    def progress(self, done: int, total: int, what: str = "") -> None:
        """Throttled progress line (``what done/total (pct%)``), printed if 'console' is on."""
        if self._console:
            self._progress.update(done, total, what)

    def finish(self, exit_code: int = 0) -> None:
        """Flush and close every backend; a second call does nothing."""
        if self._finished:
            return
        self._finished = True
        self._progress.close_line()
        for backend in self.backends.values():
            backend.finish(exit_code)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.finish(exit_code=0 if exc_type is None else 1)


def _as_floats(metrics: dict[str, float]) -> dict[str, float]:
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key or key in RESERVED_KEYS:
            raise ValueError(
                f"metric key {key!r}: must be a non-empty string other than {RESERVED_KEYS}"
            )
        values[key] = float(value)
    return values
