"""A data folder is rebuilt beside itself and replaced in one step: a kill at any moment leaves the old folder or
the new one, never token files without their manifest.

Preparation writes everything (split files, tokenizer, manifest) into `OUT/.work-<fingerprint>/`, which also holds
`owner.json` (pid and start time of the preparing process) and, for resuming, its progress. When done:

1. the work folder moves to `PARENT/.<name>.new-<fingerprint>` (one rename; OUT is untouched);
2. the user's own files in OUT (anything preparation does not write) are hard-linked into it, folders moved;
3. `renameat2(RENAME_EXCHANGE)` swaps it with OUT atomically (where the file system cannot, two renames with a
   moment in between where OUT is missing, never mixed);
4. the old folder, now at the `.new-` name, is deleted.

At the next start, `claim_work_folder` removes `.work-*` folders and `.*.<pid>.tmp` files whose owner is dead
(keeping this fingerprint's work folder, which resumes), and the `.<name>.new-*` siblings of a kill during 1–4.
A `.work-*` folder whose owner still runs means another preparation is writing OUT: refused with its pid.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
from pathlib import Path

from regulargpt.data.sources import DataError
from regulargpt.files import atomic_write_text, fsync_dir

OWNER = "owner.json"
_RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100


def process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (/proc/PID/stat field 22), None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(owner: dict) -> bool:
    pid = owner.get("pid")
    return isinstance(pid, int) and process_start(pid) == owner.get("start")


def _owner_of(folder: Path) -> dict:
    try:
        value = json.loads((folder / OWNER).read_text())
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def claim_work_folder(out: Path, name: str) -> Path:
    """`out/name` (created if needed) marked as this process's; stale leftovers of killed runs removed first.

    DataError if any `.work-*` folder in `out` belongs to a running process (another preparation into `out`)."""
    for folder in sorted(out.glob(".work-*")):
        owner = _owner_of(folder)
        if _alive(owner) and owner.get("pid") != os.getpid():
            raise DataError(f"{out} is being prepared by another process (pid {owner['pid']}, work folder "
                            f"{folder.name}); wait for it to finish, or stop it (kill {owner['pid']}) and rerun")
        if folder.name != name:
            shutil.rmtree(folder, ignore_errors=True)
    _remove_dead_temporaries(out)
    for leftover in [*out.parent.glob(f".{out.name}.new-*"), *out.parent.glob(f".{out.name}.old-*")]:
        shutil.rmtree(leftover, ignore_errors=True)
    work = out / name
    work.mkdir(exist_ok=True)
    _remove_dead_temporaries(work)  # a resumed work folder becomes `out`: a killed run's must not go along
    atomic_write_text(work / OWNER, json.dumps({"pid": os.getpid(), "start": process_start(os.getpid())}))
    return work


def _remove_dead_temporaries(folder: Path) -> None:
    """Delete atomic_open's `.<name>.<pid>.tmp` files in `folder` whose writer no longer runs (killed mid-write)."""
    for tmp in folder.glob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if not (pid.isdigit() and process_start(int(pid)) is not None):
            tmp.unlink(missing_ok=True)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths on one file system; False where renameat2/RENAME_EXCHANGE is unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, f"renameat2({a}, {b}, RENAME_EXCHANGE): {os.strerror(err)}")


def replace_folder(work: Path, out: Path, written: set[str]) -> None:
    """Make the finished `work` folder (inside `out`) become `out` (steps 1–4 of the module docstring). Entries of
    `out` not in `written` (and not `.work-*`/`.*.tmp`) are carried over: the user's files stay."""
    out = out.resolve()
    (work / OWNER).unlink(missing_ok=True)
    staged = out.parent / f".{out.name}.new-{work.name.removeprefix('.work-')}"  # `work` is out/.work-*
    shutil.rmtree(staged, ignore_errors=True)
    os.rename(work, staged)
    for entry in out.iterdir():
        if entry.name in written or entry.name.startswith(".work-") or entry.name.endswith(".tmp"):
            continue
        target = staged / entry.name
        if entry.is_dir() and not entry.is_symlink():
            os.rename(entry, target)
        else:
            try:
                os.link(entry, target, follow_symlinks=False)
            except OSError:
                shutil.copy2(entry, target, follow_symlinks=False)
    fsync_dir(staged)
    if not _exchange(staged, out):
        old = out.parent / f".{out.name}.old-{staged.name.rsplit('-', 1)[-1]}"
        os.rename(out, old)
        os.rename(staged, out)
        staged = old
    fsync_dir(out.parent)
    shutil.rmtree(staged, ignore_errors=True)
