"""Crash-safe files: atomic writes (temporary name, flush, fsync, rename, fsync the folder) and append-only JSONL
files whose last line may have been cut short by a crash.

A reader never sees a half-written file under the final name; a crash leaves the previous version intact.

    with atomic_open("out/val.bin") as f:
        f.write(tokens.tobytes())
    atomic_write_bytes("run/ckpt.pt", data, previous="run/ckpt.prev.pt")  # the old version stays as ckpt.prev.pt
    rows = read_jsonl("out/range.jsonl", repair=True)  # drops (and cuts off) a torn last line before appending
    cfg = read_json_object("run/config.resolved.json")   # a dict, or an error naming the file and what is wrong

Reading policy (every JSON and JSONL file in this project is read by the two readers here): a JSONL file is written
one ``json + "\n"`` per row, so a last line without its newline is a row torn by a crash mid-write; it is dropped
with a :class:`TornLineWarning`. Any other line that is not JSON is an error (:class:`CorruptFileError`) naming the
file and the line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from regulargpt.errors import UserError
from regulargpt.strict_json import DuplicateKeyError, loads_strict

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "read_json_object",
    "CorruptFileError",
    "TornLineWarning",
    "atomic_open",
    "atomic_savefig",
    "atomic_write",
    "atomic_write_text",
    "atomic_write_bytes",
    "fsync_dir",
    "read_jsonl",
    "remove_dead_temporaries",
    "sha256_file",
]


class CorruptFileError(UserError, ValueError):
    """A file whose content cannot be what this code wrote (e.g. a complete JSONL line that is not JSON)."""


class TornLineWarning(UserWarning):
    """A JSONL file's last line has no newline: its writer was killed mid-append; the line is not a row."""


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


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (one that exists but is not ours counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_temporaries(path: str | Path) -> list[Path]:
    """Remove what writers of `path` killed mid-write left beside it → the removed paths.

    A writer names its temporary ``.<name>.<pid>.tmp`` (:func:`atomic_open`) or ``.<name>.<pid>.tmp-<suffix>`` (a
    folder built beside its target); a SIGKILL leaves it behind, possibly gigabytes. Those whose pid no longer runs
    are removed; a running writer's are kept. Example: beside ``runs/a/model.pt``, ``.model.pt.4242.tmp`` goes
    when process 4242 has ended, ``.model.pt.<this pid>.tmp`` and ``.model.pt.tmp`` stay.
    """
    path = Path(path)
    prefix = f".{path.name}."
    removed: list[Path] = []
    if not path.parent.is_dir():
        return removed
    for leftover in sorted(path.parent.iterdir()):
        pid, tmp, rest = leftover.name.removeprefix(prefix).partition(".tmp")
        if (not leftover.name.startswith(prefix) or not tmp or not pid.isdigit() or (rest and rest[0] != "-")
                or _pid_alive(int(pid))):
            continue
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call ``write(handle)`` inside :func:`atomic_open` (e.g. ``lambda f: torch.save(obj, f)``)."""
    with atomic_open(path) as handle:
        write(handle)


def atomic_write_bytes(path: str | Path, data: bytes, previous: str | Path | None = None) -> None:
    with atomic_open(path, previous) as handle:
        handle.write(data)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_savefig(fig: Figure, path: str | Path, **savefig_kwargs: object) -> None:
    """``fig.savefig`` into :func:`atomic_open`, in the format of the suffix (``plot.png`` → PNG), e.g.
    ``atomic_savefig(fig, "out/clusters.png", dpi=110)``: a plot is never seen half-written either."""
    with atomic_open(path) as handle:
        fig.savefig(handle, format=Path(path).suffix.lstrip("."), **savefig_kwargs)


def read_jsonl(path: str | Path, repair: bool = False) -> list[Any]:
    """The rows of an append-only JSONL file ([] if it does not exist).

    Every row is written as one ``json + "\\n"``, so only the last line can be incomplete (a process killed in the
    middle of an append): a last line without its newline is not a row; it is dropped with a
    :class:`TornLineWarning`. With ``repair=True`` it is also cut off the file (truncate + fsync), so that the next
    append starts on a clean line; only the file's single writer may do that. A complete line that is not JSON is a
    real corruption: :class:`CorruptFileError` naming the file and line. Blank lines are skipped.

    Example: ``b'{"a": 1}\\n{"a": 2}\\n{"a"'`` reads as ``[{"a": 1}, {"a": 2}]`` (and warns);
    ``b'{"a": 1}\\n{"a"\\n{"a": 2}\\n'`` raises ``CorruptFileError("...: line 2 is not JSON ...")``.
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
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                reason = err.msg if isinstance(err, json.JSONDecodeError) else "not UTF-8"
                raise CorruptFileError(f"{path}: line {number} is not JSON ({reason}); the file is corrupt") from None
    if keep != len(data):
        warnings.warn(f"{path}: dropped a torn last line ({len(data) - keep} bytes without a newline, left by a "
                      f"crash mid-write){' and cut it off' if repair else ''}", TornLineWarning, stacklevel=2)
        if repair:
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


def read_json_object(path: str | Path, error: type[Exception] = CorruptFileError, hint: str = "",
                     kind: str = "file") -> dict[str, Any]:
    """The JSON object in `path`; anything else raises `error` naming the file, the problem and `hint`.

    Messages: ``<path>: <kind> not found``, ``<path>: malformed JSON at line 2, column 27: Expecting ','``,
    ``<path>: not UTF-8 text (byte 5)``, ``<path>: top level must be a JSON object``, ``<path>: duplicate key
    train.lr (lines 4 and 6); each key may appear once`` (:mod:`regulargpt.strict_json`); each followed by
    ``; <hint>`` when a hint is given (e.g. ``"the checkpoint is corrupt"``).
    """
    path = Path(path)
    tail = f"; {hint}" if hint else ""
    if not path.is_file():
        raise error(f"{path}: {kind} not found{tail}")
    try:
        value = loads_strict(path.read_bytes())
    except DuplicateKeyError as err:
        raise error(f"{path}: {err}{tail}") from None
    except json.JSONDecodeError as err:
        raise error(f"{path}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}{tail}") from None
    except UnicodeDecodeError as err:
        raise error(f"{path}: not UTF-8 text (byte {err.start}){tail}") from None
    if not isinstance(value, dict):
        raise error(f"{path}: top level must be a JSON object{tail}")
    return value
