"""The three refusals of invariant 5 (DESIGN.md: nothing silent), one home for each, and the
one way a run stops on request.

- ``ConfigError``: a bad setting, raised before any model loads, naming the field and value.
- ``NonFiniteLossError``: a NaN/inf loss or gradient norm; the whole step is refused.
- ``RoleFailed``: a role's actor (train rank, engine, env worker) died or raised.
- ``RunInterrupted``: Ctrl-C or SIGTERM (a scheduler's preemption) stopped the run; the message
  names the step and the last good checkpoint.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the field and the value."""

    def __init__(self, field_path: str, value: object, reason: str) -> None:
        self.field_path = field_path
        self.value = value
        super().__init__(f"config error: {field_path}={value!r}: {reason}")


def require_int(field_path: str, value: object, minimum: int = 1) -> None:
    """ConfigError unless ``value`` is an int (not a bool) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(field_path, value, f"must be an integer >= {minimum}")


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient norm was NaN/inf: the step is refused, never masked."""


class RoleFailed(RuntimeError):
    """A role's actor died or raised; the message is one line naming the role and rank."""


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped (Ctrl-C, SIGTERM); one line naming the step it was in and the last
    good checkpoint to continue from. A KeyboardInterrupt, so whatever catches those still
    does."""
