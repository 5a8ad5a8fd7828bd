"""The one base class of every error a user can fix from its message alone.

``ConfigError`` (bad config file, key, type or value), ``DataError`` (missing or inconsistent data folder),
``CheckpointError`` (missing, corrupt or mismatched model file), ``TrainError`` (training setup or a run that cannot
continue) and ``TaskError`` (unknown task name or option) all derive from :class:`UserError`. Entry points catch it
with :func:`regulargpt.cli.run`, which prints ``error: <message>`` and exits with status 2; anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["TrainError", "UserError"]


class UserError(Exception):
    """An error whose message names the file, key or value at fault and what was expected; no traceback needed."""


class TrainError(UserError, RuntimeError):
    """A training setup problem a user can fix, or a run directory that cannot be resumed (message says what and
    how). Raised by the trainers (regulargpt.train) and by the run-directory component (regulargpt.run_directory)."""
