"""Crash-safe file writes: write to a temporary name in the same folder, flush, fsync, rename, fsync the folder.

A reader never sees a half-written file under the final name; a crash leaves the previous version intact.

    with atomic_open("out/val.bin") as f:
        f.write(tokens.tobytes())
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = ["atomic_open", "atomic_write", "atomic_write_text", "atomic_write_bytes"]


@contextmanager
def atomic_open(path: str | Path) -> Iterator[BinaryIO]:
    """Binary file handle on `.<name>.<pid>.tmp` next to `path`; renamed onto `path` when the block succeeds.

    On any exception the temporary file is removed and an existing `path` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename itself durable
    finally:
        os.close(fd)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(handle)`` inside :func:`atomic_open` (e.g. ``lambda f: torch.save(obj, f)``)."""
    with atomic_open(path) as handle:
        write(handle)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_open(path) as handle:
        handle.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
