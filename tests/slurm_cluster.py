"""A private single-node SLURM for the tests that queue real jobs (test_slurm.py, test_formal_slurm.py): install
Debian's slurm-wlm if missing, start slurmctld + slurmd for one test module (auth/none, own ports and state dirs),
stop them after it. Import the fixture by name: ``from slurm_cluster import slurm, job_info, wait_job``.

Skipped, with the reason, where SLURM is not installed and cannot be (not root, no apt-get, install failed).
Set REGULARGPT_SKIP_SLURM=1 to skip it on purpose. The install takes about 5–25 s, the start a few seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import pytest

__all__ = ["job_info", "slurm", "wait_job"]


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


def job_info(env: dict[str, str], job_id: str) -> dict[str, str]:
    """`scontrol show job -o JOB` as {field: value} (an array task: "ARRAYID_INDEX")."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True).stdout
    return dict(f.split("=", 1) for f in out.split() if "=" in f)


def wait_job(env: dict[str, str], job_id: str, states: set[str], timeout: float = 180) -> dict[str, str]:
    """Poll `scontrol show job` until the job is in one of `states` → its fields; AssertionError after `timeout` s."""
    deadline = time.time() + timeout
    info: dict[str, str] = {}
    while time.time() < deadline:
        info = job_info(env, job_id)
        if info.get("JobState") in states:
            return info
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {info}")
