"""One writer per output folder: an exclusive lock file that works on the shared filesystems clusters use.

Every job that writes a folder holds its lock while it runs: the trainer its run directory (``RUN/trainer.lock``,
:class:`regulargpt.run_directory.RunDirLock`), evaluation, export, data preparation and the studies their ``--out``
(``OUT/.writer.lock``, :func:`hold_folder`). The lock file is a JSON record of its holder::

    {"host": "node17", "pid": 48213, "pid_start": 73311, "dir": "/scratch/runs/a", "dir_inode": 5244,
     "job_id": "912345", "role": "evaluation", "command": "python eval/extrapolate.py --runs … --out results/lm",
     "started": 1764617000.0, "heartbeat": 1764617270.5, "token": "5f0c…"}

``pid_start`` is the holder's start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot), so a pid the
system has since given to another process is not mistaken for the holder; ``dir`` and ``dir_inode`` are the folder
it locked, so a lock file copied along with its folder (``cp -r runs/a runs/b``: another path and another inode) is
not taken for the lock of the copy.

Taking it is atomic without ``flock`` (which NFS may ignore): the record is written completely to a private temporary
file, which is then hard-linked to the lock name; ``link`` fails when the name exists, on NFS too, and success is
read from the temporary file's link count (2), so a lost NFS reply cannot fool it. While the job runs, a daemon
thread rewrites the record every ``heartbeat_s`` (atomic replace) with a fresh ``heartbeat`` time.

A lock already there is **taken over**, with a message, when its holder is provably gone:

* it was written for another folder (both the path and the inode differ: a copied folder), or
* its host is this host and its pid no longer exists (a job killed with ``kill -9``, an OOM kill) or now belongs to
  a process started at another time (the pid was reused), or
* its heartbeat is older than ``stale_s`` (:data:`STALE_S` = 300 s by default, ten missed heartbeats: the holder's
  node died or hangs; hosts' clocks are assumed to agree to much better than that).

Otherwise the newcomer gets one line naming the holder (pid, host, job, start time, command) and how to proceed
(the lock's error class, before it has written anything): on this host the pid has been checked (same start time,
same folder) before it is named. A folder that cannot be written (read-only file system, no permission) is one line
as well. Takeover renames the stale file aside (atomic: of two newcomers only one succeeds) and checks that what it
moved is the record it judged stale. The lock is released (its file deleted, if still ours) on every exit path that
runs Python's ``finally`` blocks; after ``kill -9`` or ``os._exit`` the pid rule frees it at the next start on the
same host, the heartbeat rule after ``stale_s`` elsewhere.

Example::

    with hold_folder(Path("results/lm"), "evaluation"):    # prints "note: took over …" for a dead holder's lock
        ...                                                 # write results/lm
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from regulargpt.errors import UserError
from regulargpt.files import atomic_write_text

__all__ = ["HEARTBEAT_S", "STALE_S", "WRITER_LOCK", "FolderLock", "FolderInUseError", "hold_folder", "hold_target",
           "read_holder", "describe_holder", "pid_start_time"]

HEARTBEAT_S = 30.0
STALE_S = 300.0
WRITER_LOCK = ".writer.lock"  # the lock file of an output folder (a run directory's is trainer.lock)


class FolderInUseError(UserError):
    """Another live job holds the folder's lock, or the folder cannot be written (the message says which, and how to
    proceed)."""


def read_holder(path: Path) -> dict[str, Any] | None:
    """The record in the lock file `path`; None when there is none."""
    return _read_record(path)


def _read_record(path: Path) -> dict[str, Any] | None:
    """A lock record; None for a missing file. A file that is not a JSON object (not written by this module) reads
    as a holder with only the file's modification time as its heartbeat."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        record = json.loads(text)
        if isinstance(record, dict):
            return record
    except ValueError:
        pass
    return {"heartbeat": mtime, "unreadable": True}


def describe_holder(holder: dict[str, Any], now: float) -> str:
    """``pid 48213 on host node17 (SLURM job 912345), heartbeat 12 s ago, started 2026-12-06 03:51:00 UTC, command
    `python eval/extrapolate.py …```; the start time and command only when the record has them."""
    if holder.get("unreadable"):
        return f"an unreadable lock file last modified {now - float(holder['heartbeat']):.0f} s ago"
    job = f" (SLURM job {holder['job_id']})" if holder.get("job_id") else ""
    started = holder.get("started")
    when = (time.strftime(", started %Y-%m-%d %H:%M:%S UTC", time.gmtime(float(started)))
            if isinstance(started, (int, float)) else "")
    command = f", command `{holder['command']}`" if holder.get("command") else ""
    return (f"pid {holder.get('pid')} on host {holder.get('host')}{job}, heartbeat "
            f"{now - float(holder.get('heartbeat', 0)):.0f} s ago{when}{command}")


def pid_start_time(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat); None when there is
    no such process or no /proc. The command name (field 2) may hold spaces and parentheses: fields are counted
    after its last ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()  # field 3 onwards
    return int(fields[22 - 3]) if len(fields) > 22 - 3 else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class FolderLock:
    """The exclusive lock of `folder` held by one `role` (``"trainer"``, ``"evaluation"``, …; see the module
    docstring): file `lock_file` in it, refusals raised as `error`, naming `flag` as the way to another folder;
    `heartbeat_s` and `stale_s` in seconds."""

    _kind, _contents = "output folder", "its lock and outputs"  # what the unwritable-folder line calls them

    def __init__(self, folder: Path, role: str = "writer", flag: str = "--out", lock_file: str = WRITER_LOCK,
                 error: type[UserError] = FolderInUseError, heartbeat_s: float = HEARTBEAT_S,
                 stale_s: float = STALE_S) -> None:
        if not 0 < heartbeat_s < stale_s:
            raise ValueError(f"{type(self).__name__}: need 0 < heartbeat_s ({heartbeat_s}) < stale_s ({stale_s})")
        self.run_dir, self.path = folder, folder / lock_file
        self.role, self.flag, self.error = role, flag, error
        self.command = " ".join(sys.argv)
        self.heartbeat_s, self.stale_s = heartbeat_s, stale_s
        self.host, self.pid, self.pid_start = socket.gethostname(), os.getpid(), pid_start_time(os.getpid())
        self.token = uuid.uuid4().hex
        self.lost: str | None = None  # set by the heartbeat when another process has taken the lock
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------------- public

    def acquire(self) -> str | None:
        """Take the lock (creating the folder if needed) and start the heartbeat → None, or a one-line note when a
        dead holder's lock was taken over. `error` naming the holder when a live one holds it."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise self.error(self._unwritable(err)) from None
        note = None
        for _ in range(3):  # a holder that releases, or a takeover by another newcomer, between our steps
            if self._link():
                break
            holder = read_holder(self.path)
            if holder is None:
                continue  # released just now
            now = time.time()
            why = self._stale(holder, now)
            if why is None:
                raise self.error(self._refusal(holder, now))
            if self._set_aside(holder):
                note = f"{self.run_dir}: took over the {self.role} lock of {describe_holder(holder, now)}: {why}"
        else:
            raise self.error(f"{self.path}: could not take the {self.role} lock (another {self.role} is starting in "
                             f"{self.run_dir} at the same moment); rerun once it has started or stopped")
        self._held = True
        self._thread = threading.Thread(target=self._beat, name="folder-lock-heartbeat", daemon=True)
        self._thread.start()
        return note

    def release(self) -> None:
        """Stop the heartbeat and delete the lock file if it is still ours; safe to call twice or unacquired."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._held and self._mine():
            self.path.unlink(missing_ok=True)
        self._held = False

    # ------------------------------------------------------------------------------------------------ private

    def _record(self, started: float | None = None) -> str:
        now = time.time()
        return json.dumps({"host": self.host, "pid": self.pid, "pid_start": self.pid_start, **self._dir_identity(),
                           "job_id": os.environ.get("SLURM_JOB_ID", ""), "role": self.role, "command": self.command,
                           "started": now if started is None else started, "heartbeat": now,
                           "token": self.token}) + "\n"

    def _link(self) -> bool:
        """Create the lock file atomically with its full record → True when it is ours."""
        tmp = self.run_dir / f".{self.path.name}.{self.host}.{self.pid}.{self.token[:8]}.tmp"
        try:
            tmp.write_text(self._record())
        except OSError as err:
            raise self.error(self._unwritable(err)) from None
        try:
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            return os.stat(tmp).st_nlink == 2  # the link count, not link()'s reply, says whether it worked (NFS)
        finally:
            tmp.unlink(missing_ok=True)

    def _unwritable(self, err: OSError) -> str:
        """The line for a folder this process cannot write (read-only file system, no permission, full)."""
        return (f"{self.run_dir}: cannot write in the {self._kind} ({err.strerror or err}); the {self.role} writes "
                f"{self._contents} there: make it writable or choose another {self.flag}")

    def _dir_identity(self) -> dict[str, Any]:
        """{"dir": the run directory's resolved path, "dir_inode": its inode} (the inode stays when the directory is
        renamed or seen from another node's mount; a copy has a new one)."""
        return {"dir": str(self.run_dir.resolve()), "dir_inode": self.run_dir.stat().st_ino}

    def _stale(self, holder: dict[str, Any], now: float) -> str | None:
        """Why `holder` is gone (the message's reason), or None when it may be alive."""
        age = now - float(holder.get("heartbeat", 0))
        mine = self._dir_identity()
        if "dir" in holder and holder["dir"] != mine["dir"] and holder.get("dir_inode") != mine["dir_inode"]:
            return f"it was written for {holder['dir']} (this directory is a copy of that one)"
        if holder.get("host") == self.host and isinstance(holder.get("pid"), int):
            if holder["pid"] == self.pid or not _pid_alive(holder["pid"]):
                return "its process no longer exists on this host"
            start = holder.get("pid_start")
            if isinstance(start, int) and pid_start_time(holder["pid"]) != start:
                return f"pid {holder['pid']} now belongs to another process (started at another time)"
        if age > self.stale_s:
            return f"its heartbeat is {age:.0f} s old (more than {self.stale_s:.0f} s)"
        return None

    def _set_aside(self, judged: dict[str, Any]) -> bool:
        """Move the stale lock out of the way → True when the file moved was the `judged` record (then the next
        :meth:`_link` can succeed); a record that changed in between is put back when its name is still free."""
        aside = self.run_dir / f".{self.path.name}.stale.{self.token[:8]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        moved = _read_record(aside) or {}
        if moved.get("token") == judged.get("token") and moved.get("heartbeat") == judged.get("heartbeat"):
            aside.unlink(missing_ok=True)
            return True
        try:  # we moved a fresh lock that replaced the stale one meanwhile: give it back
            os.link(aside, self.path)
        except FileExistsError:
            pass
        aside.unlink(missing_ok=True)
        return False

    def _mine(self) -> bool:
        holder = read_holder(self.path)
        return holder is not None and holder.get("token") == self.token

    def _refusal(self, holder: dict[str, Any], now: float) -> str:
        stop = (f"scancel {holder['job_id']}" if holder.get("job_id") else f"kill {holder.get('pid')} on "
                f"{holder.get('host')}")
        return (f"{self.run_dir} is in use by another {holder.get('role', self.role)}: {describe_holder(holder, now)} "
                f"({self.path}); "
                f"wait for it to finish or stop it ({stop}), or use another {self.flag}; a lock whose holder died is "
                f"taken over at the next start (at once on the same host, after {self.stale_s:.0f} s without heartbeat "
                f"elsewhere)")

    def _beat(self) -> None:
        started = time.time()
        while not self._stop.wait(self.heartbeat_s):
            holder = read_holder(self.path)
            if holder is None or holder.get("token") != self.token:
                if self.lost is None:
                    self.lost = describe_holder(holder, time.time()) if holder else "nobody (the file was deleted)"
                    print(f"warning: {self.path}: this {self.role} no longer holds its lock (now held by "
                          f"{self.lost}); another {self.role} may be writing {self.run_dir}", file=sys.stderr,
                          flush=True)
                return
            started = float(holder.get("started", started))
            try:
                atomic_write_text(self.path, self._record(started))
            except OSError as err:  # a full or flaky filesystem: keep training, the next beat tries again
                print(f"warning: {self.path}: heartbeat not written ({err})", file=sys.stderr, flush=True)



@contextmanager
def hold_folder(folder: str | Path, role: str, flag: str = "--out",
                lock_file: str = WRITER_LOCK) -> Iterator[FolderLock]:
    """Hold `folder`'s writer lock for the block (released on the way out); a takeover of a dead holder's lock is
    one ``note:`` line on stderr; a folder the lock created and the job left empty (it refused its input) is removed
    again. Example: ``with hold_folder(args.out, "evaluation"): sweep(...)``."""
    folder = Path(folder)
    created = not folder.exists()
    lock = FolderLock(folder, role, flag, lock_file)
    note = lock.acquire()
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    try:
        yield lock
    finally:
        lock.release()
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def hold_target(path: str | Path, role: str, flag: str = "--out") -> AbstractContextManager[FolderLock]:
    """Hold the lock of one output that is replaced whole by a rename (an export's file or folder, a prepared data
    folder): ``.<name>.lock`` beside it, e.g. ``exports/.rgpt.lock`` for ``--out exports/rgpt``."""
    path = Path(path)
    return hold_folder(path.parent, role, flag, f".{path.name}.lock")
