"""`eval/formal.py sweep --slurm`: the dry run (scripts, the task → run table, the sbatch commands), validation before
anything is written, and (slow, long) the real thing on the single-node SLURM of slurm_cluster.py: a 4-run array of
the quick profile with tiny steps, one task preempted with SIGUSR1 and requeued, the aggregation job's table, a
second submission refused while the array runs, and a rerun that submits nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_cluster import job_info, slurm, wait_job  # noqa: F401 (slurm: the fixture)

from regulargpt.commands.formal_suite import main as formal_main
from regulargpt.config import ConfigError
from regulargpt.slurm import SubmitError

ROOT = Path(__file__).resolve().parents[1]
# even_pairs x {rnn, lstm} x seeds {0, 1} of the quick profile: seed-major, then the profile's model order
GRID = ["--profile", "quick", "--tasks", "even_pairs", "--models", "rnn", "lstm", "--seeds", "0", "1",
        "--retrain-recorded"]
ROWS = [("even_pairs", "rnn", "0"), ("even_pairs", "lstm", "0"), ("even_pairs", "rnn", "1"),
        ("even_pairs", "lstm", "1")]
TINY = ["train.steps=600", "train.log_every=10", "train.save_every=50", "eval.samples_per_length=8",
        "eval.max_length=60"]


def _sets(items: list[str]) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def test_dry_run_writes_the_array_its_table_and_the_aggregation_and_queues_nothing(tmp_path, capsys) -> None:
    out, tables = tmp_path / "runs", tmp_path / "tables"
    tables.mkdir()
    assert formal_main(["sweep", *GRID, "--out", str(out), "--tables-dir", str(tables), "--slurm", "--dry-run",
                        "--array-throttle", "2", "--gpus-per-task", "1", "--cpus-per-task", "4",
                        "--partition", "gpu", *_sets(["train.steps=7"])]) == 0
    printed = capsys.readouterr().out
    array_cmd, aggregate_cmd = [line for line in printed.splitlines() if line.startswith("sbatch")]
    assert "--array=0-3%2" in array_cmd and "--gpus-per-task=1" in array_cmd and "--cpus-per-task=4" in array_cmd
    assert "--partition=gpu" in array_cmd and f"--output={out}/slurm/logs/%A_%a.out" in array_cmd
    assert "'--dependency=afterany:<job 1>'" in aggregate_cmd and "--partition=gpu" in aggregate_cmd

    dry = out / "slurm" / "dry-run"
    assert sorted(p.name for p in (out / "slurm").iterdir()) == ["dry-run"]  # no jobs.json, no table for tasks
    table = (dry / "array.tsv").read_text().splitlines()
    assert table[0].split("\t") == ["index", "task", "model", "seed", "lr", "run_dir"]
    assert [tuple(r.split("\t")) for r in table[1:]] == [
        (str(i), t, m, s, "0.001", str(out / t / m / f"seed{s}_lr0.001")) for i, (t, m, s) in enumerate(ROWS)]
    array = (dry / "array.sbatch").read_text()
    assert "#SBATCH --requeue" in array and "#SBATCH --signal=B:USR1@120" in array
    assert f"export ARRAY_TABLE={out}/slurm/array.tsv" in array
    assert "--device cuda --threads 4" in array and "--set train.steps=7" in array
    aggregate = (dry / "aggregate.sbatch").read_text()
    assert f"eval/formal.py aggregate --runs {out} --out-dir {tables} --profile quick" in aggregate
    assert "--set train.steps=7" in aggregate  # the table plans the runs as they were trained
    assert (dry / "sbatch.txt").read_text().splitlines() == [array_cmd, aggregate_cmd]


def test_a_sweep_larger_than_max_array_size_is_queued_as_several_arrays(tmp_path, capsys) -> None:
    out = tmp_path / "runs"
    assert formal_main(["sweep", *GRID, "--out", str(out), "--tables-dir", str(tmp_path), "--slurm", "--dry-run",
                        "--max-array-size", "3"]) == 0
    first, second, aggregate = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sbatch")]
    assert "--array=0-2 " in first and "--array=0-0 " in second
    assert "'--dependency=afterany:<job 1>:<job 2>'" in aggregate  # the tables wait for both arrays
    dry = out / "slurm" / "dry-run"
    assert (dry / "array-1.tsv").read_text().splitlines()[1].split("\t")[:4] == ["0", "even_pairs", "lstm", "1"]
    assert f"--array-table {out}/slurm/array-1.tsv" in (dry / "array-1.sbatch").read_text()
    assert f"export ARRAY_TABLE={out}/slurm/array-1.tsv" in (dry / "array-1.sbatch").read_text()


@pytest.mark.parametrize("change, error, message", [
    (["--tasks", "no_such_task"], ConfigError, "unknown task config 'no_such_task'"),
    (["--models", "gpt5"], ConfigError, "unknown model preset 'gpt5'"),
    (["--profile", "nope"], ConfigError, "profiles/nope.json: profile not found"),
    (["--out", "/nonexistent/dir/runs"], SubmitError, "--out /nonexistent/dir/runs: its parent folder"),
    (["--tables-dir", "/nonexistent/tables"], SubmitError, "--tables-dir /nonexistent/tables: no such folder"),
])
def test_a_bad_task_model_profile_or_folder_is_refused_before_anything_is_written(tmp_path, change, error,
                                                                                  message) -> None:
    args = ["sweep", *GRID, "--out", str(tmp_path / "runs"), "--tables-dir", str(tmp_path), "--slurm", "--dry-run"]
    flag = change[0]
    at = args.index(flag)
    args[at + 1:at + 2] = change[1:]
    with pytest.raises(error, match=message):
        formal_main(args)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="--dry-run: only with --slurm"):
        formal_main(["sweep", *GRID, "--out", str(tmp_path / "runs"), "--dry-run"])


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "eval/formal.py", *cmd], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini): about 2 CPU-minutes
def test_a_sweep_array_preempted_once_requeued_then_tabulated_and_a_rerun_submits_nothing(slurm, tmp_path):
    out, tables = tmp_path / "runs", tmp_path / "tables"
    tables.mkdir()
    submit = ["sweep", *GRID, "--out", str(out), "--tables-dir", str(tables), "--slurm", "--array-throttle", "2",
              "--cpus-per-task", "1", "--time", "00:10:00", "--sbatch-arg=--export=ALL,OMP_NUM_THREADS=1",
              *_sets(TINY)]
    proc = _run(submit, slurm)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    array_id, aggregate_id = words[words.index("array") + 2].rstrip(":"), words[words.index("aggregation") + 2]
    assert len(json.loads((out / "slurm" / "jobs.json").read_text())["arrays"]) == 1
    assert job_info(slurm, aggregate_id)["Dependency"].startswith(f"afterany:{array_id}")
    again = _run(submit, slurm)  # its tasks read array.tsv: a second submission must not rewrite it under them
    assert again.returncode == 2 and f"job {array_id}, is still queued or running" in again.stderr, again.stderr

    # Preempt task 0 once, after its first checkpoint: the batch shell gets SIGUSR1 (as with --signal=B:USR1@120).
    run0 = out / "even_pairs" / "rnn" / "seed0_lr0.001"
    deadline = time.time() + 120
    while not (run0 / "ckpt.pt").is_file() and time.time() < deadline:
        time.sleep(0.2)
    assert (run0 / "ckpt.pt").is_file() and not (run0 / "model.pt").exists(), "task 0: no checkpoint within 120 s"
    # scancel may answer "Job can not be altered now, try again later" after delivering the signal, and go on
    # retrying for a minute: stopped once the task's log shows the signal
    sender = subprocess.Popen(["scancel", "--batch", "--signal=USR1", f"{array_id}_0"], env=slurm,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log0 = out / "slurm" / "logs" / f"{array_id}_0.out"
    deadline = time.time() + 60
    while "SIGUSR1 received" not in log0.read_text() and time.time() < deadline:
        time.sleep(0.2)
    sender.kill()
    sender.wait()

    done = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}
    agg = wait_job(slurm, aggregate_id, done, timeout=400)
    logs = {p.name: p.read_text() for p in (out / "slurm" / "logs").glob("*.out")}
    for i, (task, model, seed) in enumerate(ROWS):
        info = job_info(slurm, f"{array_id}_{i}")
        log = logs[f"{array_id}_{i}.out"]
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (log[-3000:], info, agg)
        assert f"task={task} model={model} seed={seed} lr=0.001" in log  # the log names its run
    log0 = logs[f"{array_id}_0.out"]
    assert "requeueing" in log0 and int(job_info(slurm, f"{array_id}_0")["Restarts"]) >= 1, log0[-3000:]
    steps = [json.loads(line)["step"] for line in (run0 / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(10, 601, 10))  # resumed from the stop checkpoint: no gap, no repeat

    agg_log = "".join(p.read_text() for p in (out / "slurm").glob("aggregate-*.out"))
    assert agg["JobState"] == "COMPLETED", agg_log[-3000:]
    table = json.loads((tables / "table1_quick.json").read_text())
    assert (tables / "table1_quick.md").is_file()
    recorded = {(r["task_id"], r["model"], str(r["seed"])) for r in table["runs"]}
    assert recorded == set(ROWS), table["runs"]

    rerun = _run(submit, slurm)
    assert rerun.returncode == 0 and "nothing to submit" in rerun.stdout, rerun.stderr
    assert subprocess.run(["squeue", "-h"], env=slurm, capture_output=True, text=True).stdout.strip() == ""


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_scontrol_requeue_resumes_a_task_and_scancel_ends_it_after_its_checkpoint(slurm, tmp_path):
    """SIGTERM is SLURM's: `scontrol requeue` brings the task back (SLURM requeues it, it resumes), `scancel` ends it
    (the array script does not requeue it; its checkpoint is kept for a rerun of the sweep)."""
    out, tables = tmp_path / "runs", tmp_path / "tables"
    tables.mkdir()
    proc = _run(["sweep", "--profile", "quick", "--tasks", "even_pairs", "--models", "rnn", "--seeds", "2",
                 "--retrain-recorded", "--out", str(out), "--tables-dir", str(tables), "--slurm", "--time", "00:10:00",
                 "--sbatch-arg=--export=ALL,OMP_NUM_THREADS=1", *_sets(TINY)], slurm)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    task = words[words.index("array") + 2].rstrip(":") + "_0"
    log = out / "slurm" / "logs" / f"{task}.out"

    def trained_after(starts: int) -> None:  # the task's python is up (its handlers in place) for the n-th time
        deadline = time.time() + 120
        while time.time() < deadline and (not log.is_file() or log.read_text().count("array task 0:") < starts):
            time.sleep(0.2)
        assert log.read_text().count("array task 0:") >= starts, log.read_text()[-2000:]

    trained_after(1)
    subprocess.run(["scontrol", "requeue", task], env=slurm, check=True)
    trained_after(2)  # SLURM restarted it
    assert "stop requested: checkpoint at step" in log.read_text()
    subprocess.run(["scancel", task], env=slurm, capture_output=True)
    wait_job(slurm, task, {"CANCELLED", "COMPLETED", "FAILED"}, timeout=60)
    time.sleep(15)  # a requeued task would be pending or running again by now (cred_expire=10)
    info, text = job_info(slurm, task), log.read_text()
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "1", (info, text[-2000:])
    assert text.count("not requeued by this script") == 2 and "requeueing" not in text, text[-2000:]
