"""One trainer per run directory: the folder lock (:mod:`regulargpt.folder_lock`) as ``RUN/trainer.lock``, its
refusals a :class:`TrainError` that names ``--run-dir``.

Example::

    lock = RunDirLock(Path("runs/a"))
    note = lock.acquire()        # None, or "took over …" when a dead holder's lock was replaced
    try:
        ...                      # train
    finally:
        lock.release()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regulargpt.errors import TrainError
from regulargpt.folder_lock import HEARTBEAT_S, STALE_S, FolderLock, describe_holder, pid_start_time, read_holder
from regulargpt.run_directory.layout import LOCK_FILE

__all__ = ["HEARTBEAT_S", "STALE_S", "RunDirLock", "lock_holder", "describe_holder", "pid_start_time"]


def lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """The record in ``run_dir/trainer.lock``; None when there is none."""
    return read_holder(run_dir / LOCK_FILE)


class RunDirLock(FolderLock):
    """The exclusive trainer lock of `run_dir`; `heartbeat_s` and `stale_s` in seconds."""

    _kind, _contents = "run directory", "its lock, checkpoints and metrics"

    def __init__(self, run_dir: Path, heartbeat_s: float = HEARTBEAT_S, stale_s: float = STALE_S) -> None:
        super().__init__(run_dir, "trainer", "--run-dir", LOCK_FILE, TrainError, heartbeat_s, stale_s)
