"""Cluster safety (issue 26): one trainer per run directory (the lock), every launch style getting the right ranks,
and resuming on another number of processes.

Lock records are written by hand (a holder whose process is alive, gone, or on another host) and checked against
what RunDirLock does with them; the launch styles start real processes with the launcher's variables set by hand.
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
from helpers import ZERO3, ROOT, free_port, pretrain, pretrain_args, pretrain_cmd, read_metrics, run_env, wait_for

from regulargpt.checkpoint import CheckpointError, save_model_file
from regulargpt.config import load_config_dict
from regulargpt.errors import TrainError
from regulargpt.model import build_model
from regulargpt.run_directory import RunDirLock, lock_holder
from regulargpt.write_errors import WriteError
from regulargpt.run_directory.lock import pid_start_time

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


def test_a_reused_pid_is_not_named_as_the_trainer_and_its_lock_is_taken_over(tmp_path, live_pid):
    """The record's pid is alive but was started at another time than the record says: the trainer is gone and
    its pid now belongs to another process, which is never named (before: 'stop it (kill <pid>)')."""
    run_dir = tmp_path / "run"
    start = pid_start_time(live_pid)
    assert start is not None and start == int(Path(f"/proc/{live_pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    _write_holder(run_dir, pid=live_pid, pid_start=start - 1)
    lock = RunDirLock(run_dir)
    note = lock.acquire()
    assert note is not None and f"pid {live_pid} now belongs to another process" in note
    lock.release()
    _write_holder(run_dir, pid=live_pid, pid_start=start)  # the same process: still refused, by name
    with pytest.raises(TrainError, match=rf"in use by another trainer: pid {live_pid} "):
        RunDirLock(run_dir).acquire()


def test_a_lock_copied_along_with_its_run_directory_is_not_the_copys(tmp_path, live_pid):
    """`cp -r runs/a runs/b` while a's trainer runs: b's lock names a's directory (path and inode differ), so b is
    free; a itself stays locked."""
    original = tmp_path / "a"
    original.mkdir()
    _write_holder(original, pid=live_pid, pid_start=pid_start_time(live_pid), dir=str(original.resolve()),
                  dir_inode=original.stat().st_ino)
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    lock = RunDirLock(copy)
    note = lock.acquire()
    assert note is not None and f"it was written for {original.resolve()} (this directory is a copy" in note
    assert lock_holder(copy)["dir"] == str(copy.resolve())
    lock.release()
    with pytest.raises(TrainError, match=rf"pid {live_pid}"):
        RunDirLock(original).acquire()
    moved = tmp_path / "a-renamed"  # a renamed directory keeps its inode: still the same trainer's
    original.rename(moved)
    with pytest.raises(TrainError, match=rf"pid {live_pid}"):
        RunDirLock(moved).acquire()


def test_a_read_only_run_directory_is_one_line(tmp_path):
    """A run directory on a read-only file system (a read-only tmpfs when this process may mount one, else a
    folder without write permission): TrainError naming it, no OSError traceback."""
    run_dir = tmp_path / "ro"
    run_dir.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(run_dir)], capture_output=True).returncode == 0
    if not mounted:
        if os.geteuid() == 0:
            pytest.skip("root ignores permissions and cannot mount a read-only tmpfs here")
        run_dir.chmod(0o555)
    try:
        for where in (run_dir, run_dir / "run"):  # an existing run directory, and one to be created
            with pytest.raises(TrainError, match=rf"^{where}: cannot write in the run directory \((Read-only file "
                                                 rf"system|Permission denied)\).*choose another --run-dir$"):
                RunDirLock(where).acquire()
        cfg = load_config_dict({"model": {"vocab_size": 64, "d_model": 16, "n_heads": 2}})
        with pytest.raises(WriteError, match=rf"^(read-only file system tmpfs \(mounted at {run_dir}\): cannot write "
                                             rf"the model file {run_dir}/model.pt; choose a folder on a writable|"
                                             rf"permission denied: cannot write the model file {run_dir}/model.pt)"):
            save_model_file(run_dir / "model.pt", cfg, build_model(cfg.model))  # export's write
    finally:
        subprocess.run(["umount", str(run_dir)]) if mounted else run_dir.chmod(0o755)


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


# ------------------------------------------------------------------------------------------ launch styles

_LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _launcher_env(rank: int, world: int, style: str, job_id: int = 77) -> dict[str, str]:
    """What `srun -N1 -n<world>` or a one-node `mpirun -n <world>` give rank `rank` (and nothing of torchrun's)."""
    if style == "srun":
        return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": str(world), "SLURM_STEP_NUM_TASKS": str(world),
                "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": str(world),
                "SLURM_STEP_NODELIST": "localhost", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": str(job_id)}
    return {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(world),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": str(world)}


@pytest.fixture
def clean_env(monkeypatch):
    """No launcher variables; OMP_NUM_THREADS set so that prepare_process_env leaves torch's threads alone. The
    whole environment is restored afterwards: prepare_process_env sets RANK, MASTER_ADDR, … itself, and a leftover
    RANK would make every later training subprocess of the session a rank of a run that never forms."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key in _LAUNCH_KEYS or key.startswith(("SLURM_", "OMPI_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("given,expected", [
    ({**_launcher_env(1, 2, "srun"), "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
      "SLURM_LOCALID": "0", "SLURM_NODEID": "1"},
     {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "gpu07",
      "MASTER_PORT": "15077"}),
    ({**_launcher_env(0, 1, "srun"), "SLURM_STEP_NUM_TASKS": "1"},  # srun -n1, or a one-task batch script
     {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}),
    ({**_launcher_env(3, 4, "mpirun"), "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},  # mpirun inside a SLURM job
     {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1",
      "MASTER_PORT": "29500"}),
    ({**_launcher_env(0, 2, "srun"), "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"},  # set by hand: kept
     {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6000"}),
])
def test_each_launcher_style_gets_its_ranks(clean_env, given, expected):
    from regulargpt.train.process_env import prepare_process_env

    for key, value in given.items():
        clean_env.setenv(key, value)
    info = prepare_process_env()
    assert {k: os.environ.get(k) for k in expected} == expected
    assert info["rank"] == int(expected["RANK"]) and info["world_size"] == int(expected["WORLD_SIZE"])


@pytest.mark.parametrize("given,message", [
    ({"WORLD_SIZE": "2"}, r"WORLD_SIZE=2 but RANK is unset \(and no SLURM_PROCID or OMPI_COMM_WORLD_RANK\)"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "5"},
     r"SLURM_NTASKS=4 but this process is not a task of an srun step .*srun python launch/pretrain.py"),
    ({k: v for k, v in _launcher_env(0, 2, "srun").items() if k != "SLURM_LOCALID"},
     r"SLURM_PROCID=0 and SLURM_STEP_NUM_TASKS=2 are set but SLURM_LOCALID is not"),
    ({**_launcher_env(0, 4, "mpirun"), "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     r"mpirun started 4 ranks over several nodes \(2 on this one\) but MASTER_ADDR and MASTER_PORT are not both"),
    ({**_launcher_env(0, 2, "srun"), "WORLD_SIZE": "8"}, r"WORLD_SIZE=8 contradicts srun's 2 processes"),
    ({**_launcher_env(0, 2, "srun"), "SLURM_STEP_TASKS_PER_NODE": "2(y3)"},
     r"SLURM_STEP_TASKS_PER_NODE='2\(y3\)': cannot read"),
])
def test_a_launch_that_cannot_give_distinct_ranks_is_refused(clean_env, given, message):
    from regulargpt.train.process_env import prepare_process_env

    for key, value in given.items():
        clean_env.setenv(key, value)
    with pytest.raises(TrainError, match=message):
        prepare_process_env()
    assert "RANK" not in os.environ


@pytest.mark.parametrize("nodelist,first", [("node5", "node5"), ("gpu[07-08,11],cpu1", "gpu07"),
                                            ("a[1-2]b[3-4]", "a1b3"), ("x-[009,010]", "x-009")])
def test_first_host_of_a_slurm_host_list(nodelist, first):
    from regulargpt.train.process_env import first_host

    assert first_host(nodelist) == first


def test_tasks_on_node_expands_slurm_repeats():
    from regulargpt.train.process_env import tasks_on_node

    assert [tasks_on_node("2(x3),1", n) for n in range(4)] == [2, 2, 2, 1]


def _srun_job_id() -> int:
    """A job id whose srun port (15000 + id mod 5000) is free now."""
    import random

    for port in random.sample(range(15000, 20000), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return 100_000 + port - 15000
    raise AssertionError("no free port in 15000-19999")


def _start_ranks(world: int, style: str, args: list[str]) -> list[subprocess.CompletedProcess]:
    """`world` plain `python launch/pretrain.py` processes, each given only its launcher's variables (mpirun: and a
    free MASTER_PORT, where `mpirun -x MASTER_PORT` would pass one; its default 29500 may be taken here)."""
    extra = {"MASTER_PORT": str(free_port())} if style == "mpirun" else {}
    job_id = _srun_job_id()
    procs = [subprocess.Popen(pretrain_cmd(1) + args, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE,
                              env={**run_env(), **_launcher_env(r, world, style, job_id), **extra})
             for r in range(world)]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.slow
def test_two_ranks_started_by_srun_train_as_one_run(zero3_run, data_dir, tmp_path):
    """Two processes with only srun's variables train the same run as torchrun's two ranks do: the same losses and
    validation losses, bit for bit (zero3_run: torchrun, ZeRO-3, bf16). Before issue 26 each was "rank 0 of 1".
    (mpirun's variables passed the same comparison once, in 183 s; their mapping is a fast test above.)"""
    run_dir = tmp_path / "run"
    procs = _start_ranks(2, "srun", pretrain_args(data_dir, run_dir, *ZERO3))
    for p in procs:
        assert p.returncode == 0, p.stderr[-3000:]
    assert "2 process(es)" in procs[0].stderr
    assert read_metrics(run_dir) and [{k: r.get(k) for k in ("step", "loss", "val_loss", "tokens")}
                                      for r in read_metrics(run_dir)] == \
        [{k: r.get(k) for k in ("step", "loss", "val_loss", "tokens")} for r in read_metrics(zero3_run)]


# ------------------------------------------------------------------------------------------------- sbatch


@pytest.mark.parametrize("cpus_per_task,expected_srun", [
    ("8", ["--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpus-per-task=8"]),
    (None, ["--ntasks-per-node=1", "--kill-on-bad-exit=1"]),  # not asked for: SLURM's default
])
def test_sbatch_passes_cpus_per_task_to_the_job_step_and_prints_the_topology(tmp_path, cpus_per_task,
                                                                             expected_srun):
    """The batch script under bash with `srun` and `scontrol` on PATH replaced by recorders (a 2-node allocation of
    8 CPUs per task, 2 ranks per node): srun must get --cpus-per-task, and the threads per rank follow from it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/srun.args\n')
    (bin_dir / "scontrol").write_text('#!/bin/sh\ncase "$2" in hostnames) printf "n1\\nn2\\n" ;; '
                                      'config) echo "KillWait = 120 sec" ;; esac\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "OMP_NUM_THREADS"}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", SLURM_JOB_ID="4321", SLURM_JOB_NODELIST="n[1-2]",
               SLURM_JOB_NUM_NODES="2", SLURM_CPUS_ON_NODE="32", NPROC_PER_NODE="2",
               REGULARGPT_ROOT=str(ROOT), REGULARGPT_PYTHON="python")
    if cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = cpus_per_task
    proc = subprocess.run(["bash", str(ROOT / "launch/slurm/pretrain.sbatch"), "--run-dir", "runs/x"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    threads = int(cpus_per_task or 32) // 2
    assert (f"topology: 2 node(s) x 2 rank(s) per node = 4 rank(s), {threads} thread(s) per rank "
            f"({cpus_per_task or 32} CPU(s) per node)") in proc.stdout
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[:len(expected_srun)] == expected_srun and args[len(expected_srun)] == "python"
    assert args[args.index("--nproc_per_node") + 1] == "2"


# ------------------------------------------------------------------------------------ another world size


def _expected_first_loss(data_dir: Path, checkpoint_model: Path, world: int, accum: int, step: int,
                         bf16: bool) -> float:
    """The loss the resumed run must log for step `step` + 1, computed here from the checkpoint's consolidated
    weights (launch/export.py: DeepSpeed's zero_to_fp32, not the universal conversion) on the batches the new world
    draws: the mean over ranks of each rank's mean over its `accum` micro-batches."""
    import torch
    import torch.nn.functional as F

    from regulargpt.checkpoint import load_model_file
    from regulargpt.data import WindowSampler, open_split

    cfg, model, _ = load_model_file(checkpoint_model)
    model = model.to(torch.bfloat16) if bf16 else model
    split = open_split(data_dir, "train")
    total = 0.0
    with torch.no_grad():
        for rank in range(world):
            sampler = WindowSampler(split, cfg.data.seq_len, cfg.train.batch_size, cfg.train.seed, rank, world)
            for micro in range(accum):
                batch = sampler.batch(step, micro)  # (B, T + 1)
                logits = model(batch[:, :-1]).float()  # (B, T, V)
                total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()
    return total / (world * accum)


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
@pytest.mark.parametrize("before,after,sets", [
    (2, 1, ["train.zero_stage=1"]),
    (1, 2, [*ZERO3, "train.grad_accum=2"]),
], ids=["2to1-zero1", "1to2-zero3-bf16"])
def test_resume_on_another_world_size_keeps_the_global_batch_and_the_state(data_dir, tmp_path, before, after, sets):
    """A run checkpointed at step 4 by `before` processes resumes on `after`: grad_accum changes so that the global
    batch (and tokens per step) stay, step 5's loss is the loss of the checkpoint's weights on the new world's
    batches, the Adam state continues (its step count reaches 8, not 4), and the losses continue the curve."""
    import torch

    sets = [*sets, "train.steps=8", "train.save_every=4", "train.eval_every=4"]
    reference = tmp_path / "reference"
    pretrain(data_dir, reference, *sets, nproc=before)
    run_dir = tmp_path / "resumed"  # the reference as a run preempted right after its step-4 checkpoint
    shutil.copytree(reference, run_dir)
    shutil.rmtree(run_dir / "global_step8")
    (run_dir / "model.pt").unlink()
    (run_dir / "latest").write_text("global_step4")
    exported = tmp_path / "step4.pt"
    subprocess.run([sys.executable, str(ROOT / "launch/export.py"), str(run_dir), "--step", "4", "--out",
                    str(exported)], cwd=ROOT, env=run_env(), check=True, capture_output=True, timeout=120)

    proc = pretrain(data_dir, run_dir, *sets, nproc=after)
    accum_before = 2 if "train.grad_accum=2" in sets else 1
    accum_after = accum_before * before // after
    assert (f"train.grad_accum {accum_before} → {accum_after} to keep the run's global batch of 8 sequences "
            f"(4 per micro-batch × {accum_after} × {after} process(es); global_step4 was written by {before})"
            in proc.stderr)
    assert "resuming at step 4/8" in proc.stderr
    ours, theirs = read_metrics(run_dir), read_metrics(reference)
    assert [r["step"] for r in ours] == list(range(1, 9)) and ours[:4] == theirs[:4]
    assert [r["tokens"] for r in ours] == [r["tokens"] for r in theirs]  # the same global batch at every step
    expected = _expected_first_loss(data_dir, exported, after, accum_after, 4, bf16="train.precision=bf16" in sets)
    assert ours[4]["loss"] == pytest.approx(expected, abs=2e-3 if "train.precision=bf16" in sets else 1e-5)
    assert ours[4]["loss"] != pytest.approx(theirs[4]["loss"], abs=1e-6)  # other batches than the reference's
    assert abs(sum(r["loss"] for r in ours[4:]) - sum(r["loss"] for r in theirs[4:])) / 4 < 0.05
    state = json.loads((run_dir / "global_step8" / "trainer_state.json").read_text())
    assert state["world_size"] == after and state["global_batch"] == 8 and state["grad_accum"] == accum_after
    for path in (run_dir / "global_step8").glob("*optim_states.pt"):
        saved = torch.load(path, weights_only=False)["optimizer_state_dict"]
        adam = saved.get("base_optimizer_state") or saved["optimizer_state_dict"]
        assert [float(s["step"]) for s in adam["state"].values()] == [8.0]  # 4 loaded + 4 trained
    assert not (run_dir / "universal").exists()  # the conversion is dropped once a new checkpoint is sealed


def _run_with_checkpoint(tmp_path: Path, world: int, grad_accum: int, batch_size: int = 4, legacy: bool = False):
    """A run directory as far as the batch plan reads it: the saved config and global_step4's trainer state."""
    from regulargpt.config import load_config, save_config

    cfg = load_config(ROOT / "configs/tiny/regular_gpt.json", [f"train.batch_size={batch_size}",
                                                               f"train.grad_accum={grad_accum}"])
    run_dir = tmp_path / "run"
    (run_dir / "global_step4").mkdir(parents=True)
    save_config(cfg, run_dir / "config.resolved.json")
    state = {"step": 4, "world_size": world}
    if not legacy:
        state.update(grad_accum=grad_accum, global_batch=batch_size * grad_accum * world)
    (run_dir / "global_step4" / "trainer_state.json").write_text(json.dumps(state))
    (run_dir / "latest").write_text("global_step4")
    return run_dir, cfg


@pytest.mark.parametrize("world,grad_accum,new_world,expected", [
    (2, 1, 1, 2), (1, 4, 2, 2), (4, 3, 2, 6), (2, 2, 4, 1), (2, 1, 2, 1)])
@pytest.mark.parametrize("legacy", [False, True], ids=["recorded", "from-config"])
def test_grad_accum_keeps_the_global_batch(tmp_path, world, grad_accum, new_world, expected, legacy):
    from regulargpt.run_directory import grad_accum_for

    run_dir, cfg = _run_with_checkpoint(tmp_path, world, grad_accum, legacy=legacy)
    accum, note = grad_accum_for(run_dir, cfg, new_world)
    assert accum == expected and 4 * accum * new_world == 4 * grad_accum * world
    assert (note is None) == (accum == grad_accum)


@pytest.mark.parametrize("world,grad_accum,new_world,needed,divisors", [
    (1, 1, 2, "0.5", "1"), (2, 1, 3, "0.667", "1, 2"), (3, 2, 4, "1.5", "1, 2, 3, 6")])
def test_a_world_size_that_cannot_keep_the_global_batch_is_refused_with_the_numbers(tmp_path, world, grad_accum,
                                                                                   new_world, needed, divisors):
    from regulargpt.run_directory import grad_accum_for

    run_dir, cfg = _run_with_checkpoint(tmp_path, world, grad_accum)
    total = 4 * grad_accum * world
    with pytest.raises(TrainError) as err:
        grad_accum_for(run_dir, cfg, new_world)
    assert (f"the run's global batch is {total} sequences per step (global_step4 was written by {world} "
            f"process(es)); {new_world} processes with train.batch_size 4 would need train.grad_accum = {total} / "
            f"(4 × {new_world}) = {needed}, not a whole number ≥ 1. Resume with a number of processes that divides "
            f"{total // 4} ({divisors})") in str(err.value)


@pytest.mark.slow
def test_a_resume_that_cannot_keep_the_global_batch_is_refused_before_anything_is_written(data_dir, tmp_path):
    """Two real ranks on a run whose checkpoint has a global batch of 4 sequences (1 process × 4 × 1): refused by
    every rank, and no byte of the run directory changes."""
    from helpers import TINY, snapshot

    from regulargpt.config import load_config, save_config

    run_dir = tmp_path / "run"
    (run_dir / "global_step3").mkdir(parents=True)
    save_config(load_config(ROOT / "configs/tiny/regular_gpt.json", [f"data.path={data_dir}", *TINY]),
                run_dir / "config.resolved.json")
    (run_dir / "global_step3" / "trainer_state.json").write_text(json.dumps(
        {"step": 3, "world_size": 1, "grad_accum": 1, "global_batch": 4}))
    (run_dir / "latest").write_text("global_step3")
    before = snapshot(run_dir)
    proc = subprocess.run(pretrain_cmd(2) + pretrain_args(data_dir, run_dir), cwd=ROOT, env=run_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1  # torchrun's status when a rank exits 2 (it prints its own summary and traceback)
    assert ("error: " + str(run_dir) + ": the run's global batch is 4 sequences per step (global_step3 was written "
            "by 1 process(es)); 2 processes with train.batch_size 4 would need train.grad_accum = 4 / (4 × 2) = 0.5, "
            "not a whole number ≥ 1") in proc.stderr
    assert snapshot(run_dir) == before
