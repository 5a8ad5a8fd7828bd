"""Cluster safety (issue 26): one trainer per run directory (the lock), every launch style getting the right ranks,
and resuming on another number of processes.

Lock records are written by hand (a holder whose process is alive, gone, or on another host) and checked against
what RunDirLock does with them; the launch styles start real processes with the launcher's variables set by hand.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, pretrain_args, pretrain_cmd, run_env, wait_for

from regulargpt.errors import TrainError
from regulargpt.run_directory import RunDirLock, lock_holder

# -------------------------------------------------------------------------------------------------------- lock


def _write_holder(run_dir: Path, **fields) -> dict:
    record = {"host": socket.gethostname(), "pid": os.getpid(), "job_id": "", "started": time.time(),
              "heartbeat": time.time(), "token": "theirs", **fields}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trainer.lock").write_text(json.dumps(record))
    return record


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_lock_is_exclusive_heartbeats_and_is_released(tmp_path):
    run_dir = tmp_path / "run"
    lock = RunDirLock(run_dir, heartbeat_s=0.05, stale_s=60)
    assert lock.acquire() is None
    first = lock_holder(run_dir)
    assert first["pid"] == os.getpid() and first["host"] == socket.gethostname()
    time.sleep(0.3)
    assert lock_holder(run_dir)["heartbeat"] > first["heartbeat"]  # the heartbeat thread rewrote it
    assert lock_holder(run_dir)["started"] == first["started"]
    lock.release()
    assert not (run_dir / "trainer.lock").exists() and sorted(p.name for p in run_dir.iterdir()) == []
    lock.release()  # twice is harmless


def test_a_live_holder_is_refused_with_its_name_and_nothing_changes(tmp_path, live_pid):
    run_dir = tmp_path / "run"
    held = _write_holder(run_dir, pid=live_pid, job_id="4242")
    before = (run_dir / "trainer.lock").read_bytes()
    with pytest.raises(TrainError, match=rf"is in use by another trainer: pid {live_pid} on host "
                                         rf"{socket.gethostname()} \(SLURM job 4242\).*scancel 4242"):
        RunDirLock(run_dir).acquire()
    assert (run_dir / "trainer.lock").read_bytes() == before and held["token"] == "theirs"
    assert [p.name for p in run_dir.iterdir()] == ["trainer.lock"]  # no temporary file left


def test_another_hosts_fresh_lock_is_refused_and_a_stale_one_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    _write_holder(run_dir, host="node-elsewhere", pid=1, heartbeat=time.time() - 100)
    with pytest.raises(TrainError, match=r"pid 1 on host node-elsewhere, heartbeat 10\d s ago"):
        RunDirLock(run_dir, heartbeat_s=10, stale_s=200).acquire()
    lock = RunDirLock(run_dir, heartbeat_s=10, stale_s=50)
    note = lock.acquire()
    assert note is not None and "took over the trainer lock of pid 1 on host node-elsewhere" in note
    assert "heartbeat is 10" in note and "more than 50 s" in note
    assert lock_holder(run_dir)["token"] == lock.token
    lock.release()
    assert lock_holder(run_dir) is None


def test_a_dead_pid_on_this_host_is_taken_over_at_once(tmp_path, dead_pid):
    run_dir = tmp_path / "run"
    _write_holder(run_dir, pid=dead_pid)
    lock = RunDirLock(run_dir)
    note = lock.acquire()
    assert note is not None and f"pid {dead_pid}" in note and "no longer exists on this host" in note
    assert lock_holder(run_dir)["pid"] == os.getpid()
    lock.release()


@pytest.mark.slow
def test_a_second_trainer_on_a_running_run_dir_exits_at_once_and_writes_nothing(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    cmd = pretrain_cmd(1) + pretrain_args(data_dir, run_dir, "train.steps=100000", "train.save_every=0",
                                          "train.eval_every=0")
    first = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    try:
        wait_for(first, lambda: (run_dir / "metrics.jsonl").is_file())
        assert first.poll() is None
        config = run_dir / "config.resolved.json"
        stamp = config.stat().st_mtime_ns
        second = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        errors = [line for line in second.stderr.splitlines() if line.startswith("error")]
        assert len(errors) == 1 and "Traceback" not in second.stderr
        assert f"is in use by another trainer: pid {first.pid} on host {socket.gethostname()}" in errors[0]
        assert config.stat().st_mtime_ns == stamp
        assert lock_holder(run_dir)["pid"] == first.pid
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=120)
        assert first.returncode == 0, out[-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert not (run_dir / "trainer.lock").exists()  # released on the way out

