"""Crash-safe file writes: write to a temporary name in the same folder, flush, fsync, rename.

A reader never sees a half-written file under the final name; a crash leaves the previous version intact.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "atomic_write_text", "atomic_write_bytes"]


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> None:
    """Call ``write(fileobj)`` on a temporary file next to `path`, then atomically rename it to `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    atomic_write(path, lambda handle: handle.write(data))


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
