"""Run plumbing: metric tracking (``tracking``), atomic checkpoints (``checkpoint``), and the
learning-curve plot command (``python -m roll.utils.plot RUN_DIR``, needs matplotlib)."""

from roll.utils.checkpoint import (
    CheckpointError,
    agent_dir,
    capture_rng_state,
    latest_checkpoint,
    load_trainer_state,
    read_meta,
    resolve_resume,
    restore_rng_state,
    save_checkpoint,
    verify_checkpoint,
)
from roll.utils.tracking import (
    ProgressLine,
    Tracker,
    TrackingConfig,
    agent_metrics,
    format_console_line,
    split_agent_key,
)

__all__ = [
    "CheckpointError",
    "ProgressLine",
    "Tracker",
    "TrackingConfig",
    "agent_dir",
    "agent_metrics",
    "capture_rng_state",
    "format_console_line",
    "latest_checkpoint",
    "load_trainer_state",
    "read_meta",
    "resolve_resume",
    "restore_rng_state",
    "save_checkpoint",
    "split_agent_key",
    "verify_checkpoint",
]
