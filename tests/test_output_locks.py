"""One writer per output folder (regulargpt/folder_lock.py): evaluation, export, data preparation and study folders.

A holder process takes the lock exactly where the job would (its pid, host, command and start time are in the
record); the job started on the same folder is refused at once with one line naming all four and how to proceed,
and leaves the folder as it was. Once the holder is killed with SIGKILL, the next start takes the lock over with a
note and runs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT, run_env

_HOLD = """
import sys, time
from regulargpt.folder_lock import hold_folder, hold_target
kind, path = sys.argv[1], sys.argv[2]
from regulargpt.run_directory.layout import LOCK_FILE
held = {"folder": lambda: hold_folder(path, "holder"), "target": lambda: hold_target(path, "holder"),
        "trainer": lambda: hold_folder(path, "holder", "--run-dir", LOCK_FILE)}[kind]()
with held:
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(kind: str, path: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, kind, str(path)], cwd=ROOT, env=run_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` but the holder's lock file."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.endswith(".lock")}


def _cases(tmp_path: Path) -> list[tuple[str, str, Path, list[str]]]:
    """(job, lock kind, locked path, command): each job pointed at an input it would refuse anyway, so that only the
    lock decides whether it gets further than its first check."""
    out = tmp_path / "out"
    return [
        ("evaluation", "folder", out, [sys.executable, "eval/extrapolate.py", "--runs", str(tmp_path / "no-run"),
                                       "--out", str(out)]),
        ("export", "target", out / "hf", [sys.executable, "launch/export.py", str(tmp_path / "run"), "--format",
                                          "hf", "--out", str(out / "hf")]),
        ("data preparation", "target", out / "data", [sys.executable, "data_prep/prepare.py", "--source",
                                                      str(tmp_path / "no-corpus"), "--out", str(out / "data")]),
        ("study", "folder", out, [sys.executable, "eval/lm_comparison.py", "--demo", "--report-only", "--out",
                                  str(out)]),
        ("formal sweep", "folder", out, [sys.executable, "eval/formal.py", "sweep", "--profile", "quick", "--tasks",
                                         "no_such_task", "--out", str(out)]),
        ("formal training", "trainer", out, [sys.executable, "launch/train_formal.py", "--config",
                                             str(tmp_path / "no-config.json"), "--run-dir", str(out)]),
    ]


@pytest.mark.parametrize("index", range(6), ids=["extrapolate", "export", "prepare", "lm_comparison", "formal_sweep",
                                                 "train_formal"])
def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path: Path,
                                                                                            index: int) -> None:
    job, kind, locked, cmd = _cases(tmp_path)[index]
    (tmp_path / "run").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.jsonl").write_text('{"mine": 1}\n')  # what the user had before
    before = _snapshot(tmp_path / "out")
    holder = _holder(kind, locked)
    try:
        started = time.time()
        proc = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=120)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
        assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        line = errors[0]
        assert re.search(rf"is in use by another holder: pid {holder.pid} on host {socket.gethostname()}, "
                         rf"heartbeat \d+ s ago, started 20\d\d-\d\d-\d\d \d\d:\d\d:\d\d UTC, command `-c {kind} "
                         rf"{locked}`", line), line
        flag = "--run-dir" if kind == "trainer" else "--out"
        assert f"stop it (kill {holder.pid} on {socket.gethostname()}), or use another {flag}" in line, line
        assert time.time() - started < 60 and _snapshot(tmp_path / "out") == before  # at once, nothing written
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)
    assert re.search(rf"note: \S+: took over the {job} lock of pid {holder.pid} .*its process no longer exists on "
                     rf"this host", proc.stderr), proc.stderr[-2000:]
    assert "in use by another" not in proc.stderr
    assert (tmp_path / "out" / "results.jsonl").read_text() == '{"mine": 1}\n'
    assert not list((tmp_path / "out").glob("*.lock")) and not list((tmp_path / "out").glob(".*.lock"))


def test_a_lock_the_job_created_its_folder_for_is_removed_with_the_folder_when_the_job_writes_nothing(
        tmp_path: Path) -> None:
    """Bad input still changes nothing: the refused evaluation leaves no empty --out behind."""
    out = tmp_path / "new" / "out"
    proc = subprocess.run([sys.executable, "eval/extrapolate.py", "--runs", str(tmp_path / "no-run"), "--out",
                           str(out)], cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and not out.exists(), proc.stderr[-2000:]
    assert os.listdir(tmp_path / "new") == []
