"""Crash-safe files: atomic writes (temporary name, flush, fsync, rename, fsync the folder) and append-only JSONL
files whose last line may have been cut short by a crash.

A reader never sees a half-written file under the final name; a crash leaves the previous version intact.

    with atomic_open("out/val.bin") as f:
        f.write(tokens.tobytes())
    atomic_write_bytes("run/ckpt.pt", data, previous="run/ckpt.prev.pt")  # the old version stays as ckpt.prev.pt
    rows = read_jsonl("out/range.jsonl", repair=True)  # drops (and cuts off) a torn last line before appending
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from regulargpt.errors import UserError

__all__ = [
    "read_json_object",
    "CorruptFileError",
    "atomic_open",
    "atomic_write",
    "atomic_write_text",
    "atomic_write_bytes",
    "fsync_dir",
    "read_jsonl",
    "sha256_file",
]


class CorruptFileError(UserError, ValueError):
    """A file whose content cannot be what this code wrote (e.g. a complete JSONL line that is not JSON)."""


def fsync_dir(folder: str | Path) -> None:
    """Make renames and creations inside `folder` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_open(path: str | Path, previous: str | Path | None = None) -> Iterator[BinaryIO]:
    """Binary file handle on `.<name>.<pid>.tmp` next to `path`; renamed onto `path` when the block succeeds.

    On any exception the temporary file is removed and an existing `path` is left untouched. With `previous`, an
    existing `path` is first renamed to `previous` (so a crash between the two renames leaves `previous` and no
    `path`; never a partial file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        if previous is not None and path.exists():
            os.replace(path, previous)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(handle)`` inside :func:`atomic_open` (e.g. ``lambda f: torch.save(obj, f)``)."""
    with atomic_open(path) as handle:
        write(handle)


def atomic_write_bytes(path: str | Path, data: bytes, previous: str | Path | None = None) -> None:
    with atomic_open(path, previous) as handle:
        handle.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def read_jsonl(path: str | Path, repair: bool = False) -> list[Any]:
    """The rows of an append-only JSONL file ([] if it does not exist).

    Every row is written as one ``json + "\\n"``, so only the last line can be incomplete (a process killed in the
    middle of an append): a last line without its newline is not a row. With ``repair=True`` it is also cut off the
    file (truncate + fsync), so that the next append starts on a clean line; only the file's single writer may do
    that. A complete line that is not JSON is a real corruption: :class:`CorruptFileError` naming the file and line.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1  # bytes up to the end of the last complete line
    rows = []
    for number, line in enumerate(data[:keep].splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise CorruptFileError(f"{path}: line {number} is not JSON ({err.msg}); the file is corrupt") from None
    if repair and keep != len(data):
        with open(path, "r+b") as handle:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
    return rows


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in chunks (about 1 GB/s on one core)."""
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_json_object(path: Path, error: type[Exception], hint: str) -> dict[str, Any]:
    """Parse `path` as a JSON object; anything else raises `error` naming the file, the problem and `hint`."""
    try:
        value = json.loads(Path(path).read_text())
    except ValueError as err:
        raise error(f"{path}: unreadable ({err}); {hint}") from None
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object; {hint}")
    return value
