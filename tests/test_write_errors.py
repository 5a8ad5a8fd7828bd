"""Every OS error a save can meet, really provoked, becomes one line naming the path, the cause and the fix
(regulargpt/write_errors.py): EFBIG under a file-size limit (RLIMIT_FSIZE in a child, SIGXFSZ ignored), EROFS on a
read-only tmpfs, ENOSPC on a 1 MB tmpfs, EACCES in a folder the writer may not write (as user nobody when the tests
run as root, who ignores permissions). EDQUOT cannot be provoked where the kernel has no quota support
(CONFIG_QUOTA): it is raised as the OSError a quota-limited write gets.

Each case writes through the project's real writers in a child process: a model file (torch.save's zip writer,
which loses the errno), a results.jsonl row (a plain append) and a split file of data preparation.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from helpers import ROOT, run_env

_WRITE = """
import resource, signal, sys
from pathlib import Path
import os
import numpy as np
from regulargpt.cli import run
from regulargpt.model import build_model
from regulargpt.checkpoint import save_model_file
from regulargpt.config import load_config_dict
from regulargpt.evaluation.results_file import ResultsFile
from regulargpt.data.split_writer import SplitWriter
limit, writer, path, user = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
cfg = load_config_dict({"model": {"vocab_size": 8000, "d_model": 64, "n_heads": 2}})
model = build_model(cfg.model)
if user >= 0:  # everything is imported: drop root's privileges (root ignores permissions)
    os.setgid(user)
    os.setuid(user)
def main():
    if writer == "model":
        save_model_file(path, cfg, model)
    elif writer == "row":
        ResultsFile(path).append({"run": "r", "pad": "x" * 2_000_000})
    else:
        writer_ = SplitWriter(path, "uint16")
        one = np.ones(1, np.int64)
        writer_.append(one * 0, one, one, [b"t" * 2_000_000, b"", b""])
        writer_.checkpoint()
run(main)
"""
_WRITERS = ["model", "row", "split"]
_WHAT = {"model": "the model file {p}", "row": "a result row to {p}", "split": "the split file {p}/train.bin"}
_NAME = {"model": "model.pt", "row": "results.jsonl", "split": ""}  # split: the work folder itself


def _write(writer: str, path: Path, limit: int = 0, user: int | None = None) -> str:
    """Run `writer` into `path` in a child → its one error line (exit status 2 and no traceback asserted)."""
    uid = str(-1 if user is None else user)
    proc = subprocess.run([sys.executable, "-c", _WRITE, str(limit), writer, str(path), uid], cwd=ROOT,
                          env=run_env(), capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def _tmpfs(folder: Path, options: str) -> bool:
    folder.mkdir(parents=True, exist_ok=True)
    return os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                                                capture_output=True).returncode == 0


@pytest.mark.parametrize("writer", _WRITERS)
def test_a_file_size_limit_is_named_with_the_limit_not_as_a_full_disk(tmp_path: Path, writer: str) -> None:
    """ulimit -f 200 (200 KiB): before, a checkpoint said 'no space left on /dev/vda …: 82260.0 MB free'."""
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / _NAME[writer]
    line = _write(writer, target, limit=200 * 1024)
    what = _WHAT[writer].format(p=target)
    assert line.startswith(f"error: file too large: {what} exceeds this process's file-size limit of 0.2 MB "
                           f"(ulimit -f 200)"), line
    assert "raise the limit (ulimit -f unlimited" in line and "no space" not in line, line


@pytest.mark.parametrize("writer", _WRITERS)
def test_a_read_only_file_system_is_named_with_its_mount(tmp_path: Path, writer: str) -> None:
    folder = tmp_path / "ro"
    if not _tmpfs(folder, "ro,size=1m"):
        pytest.skip("mounting a read-only tmpfs needs root; not root here")
    try:
        target = folder / _NAME[writer]
        line = _write(writer, target)
        assert line.startswith(f"error: read-only file system tmpfs (mounted at {folder}): cannot write "), line
        assert "choose a folder on a writable file system, or remount it read-write" in line, line
    finally:
        subprocess.run(["umount", str(folder)])


@pytest.mark.parametrize("writer", _WRITERS)
def test_a_full_file_system_is_named_with_the_space_needed_and_free(tmp_path: Path, writer: str) -> None:
    folder = tmp_path / "small"
    if not _tmpfs(folder, "size=1m"):
        pytest.skip("mounting a 1 MB tmpfs needs root; not root here")
    try:
        target = folder / _NAME[writer]
        line = _write(writer, target)
        what = _WHAT[writer].format(p=target)
        assert line.startswith(f"error: no space left on tmpfs (mounted at {folder}) while writing {what}: "), line
        assert line.endswith("MB free; free some space or choose another folder"), line
    finally:
        subprocess.run(["umount", str(folder)])


@pytest.mark.parametrize("writer", _WRITERS)
def test_a_folder_without_write_permission_names_its_owner_and_mode(tmp_path: Path, writer: str) -> None:
    """As root (who ignores permissions) the child drops to user nobody (65534) once it has imported everything,
    and writes into a root-owned 0755 folder; as another user the folder is made 0555."""
    folder = tmp_path / "locked"
    user, modes = None, {}
    if os.geteuid() == 0:
        user = 65534
        # nobody must reach the folder: a folder of its own under the temp dir, not under pytest's 0700 ones, whose
        # modes other xdist workers' runs of this test would restore while this child still walks through them
        base = Path(tempfile.mkdtemp(prefix="write-errors-"))
        base.chmod(0o755)
        folder = base / "locked"
        for parent in base.parents:
            mode = parent.stat().st_mode
            if mode & 0o005 != 0o005:
                modes[parent] = mode
                parent.chmod(mode | 0o005)
    folder.mkdir()
    if user is None:
        folder.chmod(0o555)
    try:
        target = folder / _NAME[writer]
        line = _write(writer, target, user=user)
        uid = 65534 if user else os.geteuid()
        assert line.startswith(f"error: permission denied: cannot write {_WHAT[writer].format(p=target)}"
                               if writer != "split" else "error: permission denied: cannot write "), line
        assert f"{folder} (owner uid {folder.stat().st_uid}, mode " in line and f"not writable by uid {uid}" in line
        assert f"make it writable (chmod u+w {folder}) or choose another folder" in line, line
    finally:
        folder.chmod(0o755)
        for parent, mode in modes.items():
            parent.chmod(mode)
        if user is not None:
            shutil.rmtree(folder.parent)


def test_a_quota_is_named_as_a_quota(tmp_path: Path) -> None:
    """EDQUOT as the kernel returns it (this kernel has no CONFIG_QUOTA to provoke it): a DiskFullError whose line
    says quota and how to see it, not 'no space'."""
    from regulargpt.write_errors import DiskFullError, explain_write_error

    target = tmp_path / "results.jsonl"
    with pytest.raises(DiskFullError) as info:
        with explain_write_error(target, "a result row to", 2_000_000):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    assert str(info.value).startswith("disk quota exceeded on ") and f"while writing a result row to {target}: 2.0 " \
        "MB needed; see your quota (quota -s)" in str(info.value)
