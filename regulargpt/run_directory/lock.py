"""One trainer per run directory: an exclusive lock file that works on the shared filesystems clusters use.

``RUN/trainer.lock`` is a JSON record of its holder, written by rank 0 before anything else in the run directory::

    {"host": "node17", "pid": 48213, "pid_start": 73311, "dir": "/scratch/runs/a", "dir_inode": 5244,
     "job_id": "912345", "started": 1764617000.0, "heartbeat": 1764617270.5, "token": "5f0c…"}

``pid_start`` is the holder's start time (field 22 of ``/proc/<pid>/stat``, clock ticks since boot), so a pid the
system has since given to another process is not mistaken for the trainer; ``dir`` and ``dir_inode`` are the run
directory it locked, so a lock file copied along with a run directory (``cp -r runs/a runs/b``: another path and
another inode) is not taken for the lock of the copy.

Taking it is atomic without ``flock`` (which NFS may ignore): the record is written completely to a private temporary
file, which is then hard-linked to ``trainer.lock``; ``link`` fails when the name exists, on NFS too, and success
is read from the temporary file's link count (2), so a lost NFS reply cannot fool it. While the trainer runs, a
daemon thread rewrites the record every ``heartbeat_s`` (atomic replace) with a fresh ``heartbeat`` time.

A lock already there is **taken over**, with a message, when its holder is provably gone:

* it was written for another directory (both the path and the inode differ: a copied run directory), or
* its host is this host and its pid no longer exists (a run killed with ``kill -9``, an OOM kill) or now belongs to
  a process started at another time (the pid was reused), or
* its heartbeat is older than ``stale_s`` (:data:`STALE_S` = 300 s by default, ten missed heartbeats: the holder's
  node died or hangs; hosts' clocks are assumed to agree to much better than that).

Otherwise the newcomer gets one line naming the holder and how to proceed (:class:`TrainError`, before it has
written anything): on this host the pid has been checked (same start time, same directory) before it is named.
A run directory that cannot be written (read-only file system, no permission) is one TrainError line as well. Takeover renames the stale file aside (atomic: of two newcomers only one succeeds) and checks
that what it moved is the record it judged stale. The lock is released (its file deleted, if still ours) on every
exit path that runs Python's ``finally`` blocks; after ``kill -9`` or ``os._exit`` the pid rule frees it at the
next start on the same host, the heartbeat rule after ``stale_s`` elsewhere.

Evaluation and export only read a run directory and take no lock.

Example::

    lock = RunDirLock(Path("runs/a"))
    note = lock.acquire()        # None, or "took over …" when a dead holder's lock was replaced
    try:
        ...                      # train
    finally:
        lock.release()
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from regulargpt.errors import TrainError
from regulargpt.files import atomic_write_text
from regulargpt.run_directory.layout import LOCK_FILE

__all__ = ["HEARTBEAT_S", "STALE_S", "RunDirLock", "lock_holder", "describe_holder", "pid_start_time"]

HEARTBEAT_S = 30.0
STALE_S = 300.0


def lock_holder(run_dir: Path) -> dict[str, Any] | None:
    """The record in ``run_dir/trainer.lock``; None when there is none."""
    return _read_record(run_dir / LOCK_FILE)


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
    """``pid 48213 on host node17 (SLURM job 912345), heartbeat 12 s ago``."""
    if holder.get("unreadable"):
        return f"an unreadable lock file last modified {now - float(holder['heartbeat']):.0f} s ago"
    job = f" (SLURM job {holder['job_id']})" if holder.get("job_id") else ""
    return (f"pid {holder.get('pid')} on host {holder.get('host')}{job}, heartbeat "
            f"{now - float(holder.get('heartbeat', 0)):.0f} s ago")


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


class RunDirLock:
    """The exclusive trainer lock of `run_dir` (see the module docstring); `heartbeat_s` and `stale_s` in seconds."""

    def __init__(self, run_dir: Path, heartbeat_s: float = HEARTBEAT_S, stale_s: float = STALE_S) -> None:
        if not 0 < heartbeat_s < stale_s:
            raise ValueError(f"RunDirLock: need 0 < heartbeat_s ({heartbeat_s}) < stale_s ({stale_s})")
        self.run_dir, self.path = run_dir, run_dir / LOCK_FILE
        self.heartbeat_s, self.stale_s = heartbeat_s, stale_s
        self.host, self.pid, self.pid_start = socket.gethostname(), os.getpid(), pid_start_time(os.getpid())
        self.token = uuid.uuid4().hex
        self.lost: str | None = None  # set by the heartbeat when another process has taken the lock
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------------------------- public

    def acquire(self) -> str | None:
        """Take the lock (creating `run_dir` if needed) and start the heartbeat → None, or a one-line note when a
        dead holder's lock was taken over. TrainError naming the holder when a live trainer holds it."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TrainError(self._unwritable(err)) from None
        note = None
        for _ in range(3):  # a holder that releases, or a takeover by another newcomer, between our steps
            if self._link():
                break
            holder = lock_holder(self.run_dir)
            if holder is None:
                continue  # released just now
            now = time.time()
            why = self._stale(holder, now)
            if why is None:
                raise TrainError(self._refusal(holder, now))
            if self._set_aside(holder):
                note = (f"{self.run_dir}: took over the trainer lock of {describe_holder(holder, now)}: {why}")
        else:
            raise TrainError(f"{self.path}: could not take the trainer lock (another trainer is starting in "
                             f"{self.run_dir} at the same moment); rerun once it has started or stopped")
        self._held = True
        self._thread = threading.Thread(target=self._beat, name="run-dir-lock-heartbeat", daemon=True)
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
                           "job_id": os.environ.get("SLURM_JOB_ID", ""),
                           "started": now if started is None else started, "heartbeat": now,
                           "token": self.token}) + "\n"

    def _link(self) -> bool:
        """Create the lock file atomically with its full record → True when it is ours."""
        tmp = self.run_dir / f".{LOCK_FILE}.{self.host}.{self.pid}.{self.token[:8]}.tmp"
        try:
            tmp.write_text(self._record())
        except OSError as err:
            raise TrainError(self._unwritable(err)) from None
        try:
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            return os.stat(tmp).st_nlink == 2  # the link count, not link()'s reply, says whether it worked (NFS)
        finally:
            tmp.unlink(missing_ok=True)

    def _unwritable(self, err: OSError) -> str:
        """The line for a run directory this process cannot write (read-only file system, no permission, full)."""
        return (f"{self.run_dir}: cannot write in the run directory ({err.strerror or err}); the trainer writes its "
                f"lock, checkpoints and metrics there: make it writable or choose another --run-dir")

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
        aside = self.run_dir / f".{LOCK_FILE}.stale.{self.token[:8]}"
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
        holder = lock_holder(self.run_dir)
        return holder is not None and holder.get("token") == self.token

    def _refusal(self, holder: dict[str, Any], now: float) -> str:
        stop = (f"scancel {holder['job_id']}" if holder.get("job_id") else f"kill {holder.get('pid')} on "
                f"{holder.get('host')}")
        return (f"{self.run_dir} is in use by another trainer: {describe_holder(holder, now)} ({self.path}); wait "
                f"for it to finish or stop it ({stop}), or use another --run-dir; a lock whose holder died is taken "
                f"over at the next start (at once on the same host, after {self.stale_s:.0f} s without heartbeat "
                f"elsewhere)")

    def _beat(self) -> None:
        started = time.time()
        while not self._stop.wait(self.heartbeat_s):
            holder = lock_holder(self.run_dir)
            if holder is None or holder.get("token") != self.token:
                if self.lost is None:
                    self.lost = describe_holder(holder, time.time()) if holder else "nobody (the file was deleted)"
                    print(f"warning: {self.path}: this trainer no longer holds the run-directory lock (now held by "
                          f"{self.lost}); another trainer may be writing {self.run_dir}", file=sys.stderr, flush=True)
                return
            started = float(holder.get("started", started))
            try:
                atomic_write_text(self.path, self._record(started))
            except OSError as err:  # a full or flaky filesystem: keep training, the next beat tries again
                print(f"warning: {self.path}: heartbeat not written ({err})", file=sys.stderr, flush=True)

