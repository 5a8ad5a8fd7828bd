"""A failed write as one line naming the file, the real cause and the fix: every writer of checkpoints, shards,
result rows, reports and exports runs its writes inside :func:`explain_write_error`.

The cause comes from the OSError's errno; torch.save's zip writer loses the errno (``RuntimeError: … unexpected pos
…`` or ``… file write failed``), so for those the cause is found by looking at the folder (read-only file system,
no write permission, no free space or inodes, a file-size limit), in that order. Messages, e.g. for
``RUN/global_step6`` (the checkpoint) with 0.8 MB needed:

=========  ============================================================================================================
errno      message (each on one line)
=========  ============================================================================================================
EFBIG      ``file too large: the checkpoint RUN/global_step6 exceeds this process's file-size limit of 0.2 MB (ulimit
           -f 200): 0.8 MB needed; raise the limit (ulimit -f unlimited, or the job's file-size limit) or …``; without
           a limit: ``… larger than the xfs file system on /dev/sdb (mounted at /data) allows; choose a folder on
           another file system``
EDQUOT     ``disk quota exceeded on /dev/sdb (mounted at /home) while writing …: 0.8 MB needed; see your quota
           (quota -s), delete some of your files there or choose another folder``
EROFS      ``read-only file system tmpfs (mounted at /mnt/ro): cannot write the checkpoint RUN/global_step6; choose a
           folder on a writable file system, or remount it read-write``
ENOSPC     ``no space left on /dev/vda (mounted at /) while writing …: 0.8 MB needed, 0.1 MB free; free some space or
           choose another folder`` (``no free inodes left on …`` when the inodes, not the bytes, ran out)
EACCES     ``permission denied: cannot write the checkpoint RUN/global_step6: RUN (owner uid 0, mode drwxr-xr-x) is not
           writable by uid 65534; make it writable (chmod u+w RUN) or choose another folder``
=========  ============================================================================================================

(EPERM reads as EACCES.) Any other error passes unchanged.
"""

from __future__ import annotations

import errno
import os
import resource
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from regulargpt.errors import UserError

__all__ = ["WriteError", "DiskFullError", "explain_write_error", "write_error_message", "probable_errno"]

_MB = 1e6
_HANDLED = (errno.EFBIG, errno.EDQUOT, errno.EROFS, errno.ENOSPC, errno.EACCES, errno.EPERM)


class WriteError(UserError):
    """A write failed for a cause the user can fix (file-size limit, quota, read-only file system, full disk, no
    permission); the message names the path, the cause and the fix."""


class DiskFullError(WriteError):
    """A write failed because its file system is full or the user's quota on it is used up."""


def _existing(path: Path) -> Path:
    path = path.resolve()
    while not os.path.exists(path):  # False too for what this process may not look into
        path = path.parent
    return path


def _mount(path: Path) -> tuple[str, Path, str]:
    """(device, mount point, file-system type) of the file system holding `path`."""
    mount = _existing(path)
    while not os.path.ismount(mount):
        mount = mount.parent
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        lines = []
    fields = next((line.split() for line in reversed(lines) if line.split()[1:2] == [str(mount)]), [])
    return (fields[0] if fields else str(mount)), mount, (fields[2] if len(fields) > 2 else "unknown")


def _size_limit() -> int | None:
    """This process's soft file-size limit in bytes (``ulimit -f`` × 1024), None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    return None if soft == resource.RLIM_INFINITY else soft


def probable_errno(path: str | Path, needed_bytes: int | None = None) -> int | None:
    """The errno a write into `path` most likely met when the writer lost it (torch.save), found by looking at the
    folder: EROFS (read-only mount), EACCES (not writable by this process), ENOSPC (fewer bytes free than needed,
    under 1 MB free, or no free inode), EFBIG (a file-size limit is set); None when none of these holds."""
    folder = _existing(Path(path))
    folder = folder if folder.is_dir() else folder.parent
    fs = os.statvfs(folder)
    free = fs.f_bavail * fs.f_frsize
    if fs.f_flag & os.ST_RDONLY:
        return errno.EROFS
    if not os.access(folder, os.W_OK):
        return errno.EACCES
    if free < max(needed_bytes or 0, _MB) or (fs.f_files and fs.f_favail == 0):
        return errno.ENOSPC
    if _size_limit() is not None:
        return errno.EFBIG
    return None


def write_error_message(code: int, path: str | Path, what: str, needed_bytes: int | None = None) -> str:
    """The one line for errno `code` met while writing `what` (e.g. "the checkpoint") at `path` (module docstring)."""
    path = Path(path)
    device, mount, fstype = _mount(path)
    need = f"{needed_bytes / _MB:.1f} MB needed" if needed_bytes else ""
    if code == errno.EFBIG:
        limit = _size_limit()
        if limit is None:
            return (f"file too large: {what} {path} is larger than the {fstype} file system on {device} (mounted at "
                    f"{mount}) allows{'; ' + need if need else ''}; choose a folder on another file system")
        return (f"file too large: {what} {path} exceeds this process's file-size limit of {limit / _MB:.1f} MB "
                f"(ulimit -f {limit // 1024}){': ' + need if need else ''}; raise the limit (ulimit -f unlimited, or "
                f"the job's file-size limit) or write smaller files")
    if code == errno.EDQUOT:
        return (f"disk quota exceeded on {device} (mounted at {mount}) while writing {what} {path}"
                f"{': ' + need if need else ''}; see your quota (quota -s), delete some of your files there or choose "
                f"another folder")
    if code == errno.EROFS:
        return (f"read-only file system {device} (mounted at {mount}): cannot write {what} {path}; choose a folder on "
                f"a writable file system, or remount it read-write")
    if code in (errno.EACCES, errno.EPERM):
        folder = _existing(path)
        folder = folder if folder.is_dir() else folder.parent
        info = folder.stat()
        return (f"permission denied: cannot write {what} {path}: {folder} (owner uid {info.st_uid}, mode "
                f"{stat.filemode(info.st_mode)}) is not writable by uid {os.geteuid()}; make it writable "
                f"(chmod u+w {folder}) or choose another folder")
    fs = os.statvfs(_existing(path))
    if fs.f_files and fs.f_favail == 0:
        return (f"no free inodes left on {device} (mounted at {mount}) while writing {what} {path}: all {fs.f_files:,} "
                f"files are in use; delete files there or choose another folder")
    free = shutil.disk_usage(mount).free
    return (f"no space left on {device} (mounted at {mount}) while writing {what} {path}: "
            f"{need + ', ' if need else ''}{free / _MB:.1f} MB free; free some space or choose another folder")


def _torch_write_failure(error: BaseException) -> bool:
    """torch.save's zip writer turns a failed write into a RuntimeError without the errno."""
    text = str(error)
    return isinstance(error, RuntimeError) and ("unexpected pos" in text or "file write failed" in text)


@contextmanager
def explain_write_error(path: str | Path, what: str, needed_bytes: int | None = None) -> Iterator[None]:
    """Turn a failed write inside the block into one WriteError line (DiskFullError for ENOSPC and EDQUOT); other
    errors pass unchanged.

    Example:

        with explain_write_error("run/global_step40", "the checkpoint", needed_bytes=12_300_000):
            torch.save(state, "run/global_step40/model.pt")
    """
    try:
        yield
    except WriteError:
        raise
    except OSError as error:
        if error.errno not in _HANDLED:
            raise
        raise _error(error.errno, path, what, needed_bytes) from error
    except RuntimeError as error:
        if not _torch_write_failure(error):
            raise
        code = probable_errno(path, needed_bytes)
        if code is None:
            raise WriteError(f"could not write {what} {path} ({error}); the folder is writable, has free space and "
                             f"no file-size limit applies: check your disk quota (quota -s) and the system log "
                             f"(dmesg)") from error
        raise _error(code, path, what, needed_bytes) from error


def _error(code: int, path: str | Path, what: str, needed_bytes: int | None) -> WriteError:
    kind = DiskFullError if code in (errno.ENOSPC, errno.EDQUOT) else WriteError
    return kind(write_error_message(code, path, what, needed_bytes))
