"""A real single-node SLURM: install Debian's slurm-wlm if missing, start slurmctld + slurmd for this test only,
submit a tiny two-process pretraining run, its dependent evaluation job and the sweep's comparison job through
launch/submit.py, preempt the run once with SIGUSR1 and check that it checkpoints, requeues itself, resumes,
completes, and is then evaluated and compared.

Skipped, with the reason, where SLURM is not installed and cannot be (not root, no apt-get, install failed).
Set REGULARGPT_SKIP_SLURM=1 to skip it on purpose. After the install (about 5–25 s) it takes about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import HAS_MATPLOTLIB

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.vocab_size=512", "model.d_model=32", "model.n_heads=2", "model.chunk_size=4", "model.thickness=2",
    "data.seq_len=32", "train.batch_size=4", "train.steps=20", "train.lr=0.003", "train.log_every=1",
    "train.eval_every=10", "train.eval_batches=2", "train.save_every=4", "train.keep_last=2",
    "logging.progress=false",
]


def _ensure_slurm() -> None:
    if os.environ.get("REGULARGPT_SKIP_SLURM") == "1":
        pytest.skip("REGULARGPT_SKIP_SLURM=1")
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("SLURM is not installed and cannot be: installing Debian's slurm-wlm needs root and apt-get")
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300", "slurm-wlm"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:  # stale package lists: refresh once
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=600)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 or not shutil.which("slurmctld"):
        pytest.skip(f"could not install slurm-wlm with apt-get: {proc.stderr.strip()[-500:]}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A private single-node cluster (auth/none, own ports and state dirs); yields the environment to talk to it."""
    _ensure_slurm()
    base = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname().split(".")[0]
    for d in ("state", "spool", "log"):
        (base / d).mkdir()
    cpus = os.cpu_count() or 1
    conf = base / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=regulargpt-test", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/none", "CredType=cred/none",
        "AuthInfo=cred_expire=10",  # a requeued job may start again after 10 s (default 120 s)
        f"StateSaveLocation={base}/state", f"SlurmdSpoolDir={base}/spool",
        f"SlurmctldPidFile={base}/slurmctld.pid", f"SlurmdPidFile={base}/slurmd.pid",
        f"SlurmctldLogFile={base}/log/slurmctld.log", f"SlurmdLogFile={base}/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none", "MpiDefault=none",
        "ReturnToService=2", "SchedulerType=sched/backfill", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core", "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none", "SchedulerParameters=bf_interval=1,sched_interval=2", "MinJobAge=600",
        "KillWait=20",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=4000 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    env = dict(os.environ, SLURM_CONF=str(conf))
    daemons = [subprocess.Popen([d, "-D", *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for d, extra in (("slurmctld", ["-i"]), ("slurmd", []))]
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if out.strip() == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "".join(p.read_text()[-1500:] for p in (base / "log").glob("*.log"))
            pytest.fail(f"SLURM did not come up within 60 s:\n{logs}")
        yield env
    finally:  # cancel what is left, give the step daemons time to end, then stop the cluster
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
        deadline = time.time() + 20
        while time.time() < deadline and subprocess.run(["squeue", "-h"], env=env, capture_output=True,
                                                        text=True).stdout.strip():
            time.sleep(0.5)
        for p in daemons:
            p.send_signal(signal.SIGTERM)
        for p in daemons:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _job(env: dict[str, str], job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def _wait(env, job_id, states, timeout=180) -> dict[str, str]:
    deadline = time.time() + timeout
    info: dict[str, str] = {}
    while time.time() < deadline:
        info = _job(env, job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {info}")


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_sweep_through_submit_py_preempted_once_requeued_and_completed(slurm, tmp_path):
    from regulargpt.data import prepare

    data = tmp_path / "stdlib"
    prepare("python-stdlib", data, vocab_size=512, max_bytes=400_000, val_fraction=0.2, num_proc=1)

    cmd = [sys.executable, "launch/submit.py", "--configs", "configs/tiny/regular_gpt.json", "--seeds", "0",
           "--data", str(data), "--runs-root", str(tmp_path / "runs"), "--eval-out", str(tmp_path / "eval"),
           "--cpus-per-task", str(min(2, os.cpu_count() or 1)), "--time", "00:10:00",
           "--sbatch-arg=--export=ALL,OMP_NUM_THREADS=1,WANDB_MODE=disabled",
           "--eval-arg=--lengths=32,64", "--eval-arg=--tokens=2048", "--eval-arg=--no-progress"]
    for item in TINY:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, cwd=ROOT, env=slurm, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    train_id, eval_id = words[words.index("pretrain") + 1].rstrip(","), words[words.index("evaluate") + 1]
    compare_id = words[words.index("comparison:") + 1]
    run_dir = tmp_path / "runs" / "stdlib" / "regular_gpt-seed0"
    assert _job(slurm, eval_id)["Dependency"].startswith(f"afterok:{train_id}")

    # Preempt once, after the first checkpoint: the batch shell gets SIGUSR1 (as with --signal=B:USR1@120).
    deadline = time.time() + 120
    while not (run_dir / "latest").is_file() and time.time() < deadline:
        time.sleep(0.2)
    assert (run_dir / "latest").is_file(), "no checkpoint within 120 s"
    subprocess.run(["scancel", "--batch", "--signal=USR1", train_id], env=slurm, check=True)

    info = _wait(slurm, train_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, timeout=240)
    logs = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob("pretrain-*.out")))
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", logs[-4000:]
    assert "requeueing job" in logs and int(info.get("Restarts", "0")) >= 1, logs[-4000:]
    assert "2 process(es)" in logs, logs[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 21))  # resumed without gaps or repeats
    assert (run_dir / "model.pt").is_file()

    # The evaluation job starts once pretraining completed (afterok) and scores the exported model.pt.
    ev = _wait(slurm, eval_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=120)
    eval_log = "".join(p.read_text() for p in (run_dir / "slurm").glob("evaluate-*.out"))
    assert ev["JobState"] == "COMPLETED", eval_log[-3000:]
    rows = (tmp_path / "eval" / "stdlib" / "regular_gpt-seed0" / "results.jsonl").read_text().splitlines()
    assert len(rows) == 2

    # Then the sweep's comparison job (afterok on every evaluation) writes the combined table and plots.
    assert _job(slurm, compare_id)["Dependency"] in (f"afterok:{eval_id}(unfulfilled)", "(null)")
    cmp = _wait(slurm, compare_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=120)
    sweep = tmp_path / "eval" / "sweep"
    assert cmp["JobState"] == "COMPLETED", "".join(p.read_text() for p in sweep.glob("compare-*.out"))[-3000:]
    assert (sweep / "comparison" / "table.md").is_file()
    assert (sweep / "comparison" / "ppl_vs_length.png").is_file() or not HAS_MATPLOTLIB
