"""A real single-node SLURM (tests/slurm_cluster.py: slurmctld + slurmd started for this module only):
submit a tiny two-process pretraining run, its dependent evaluation job and the sweep's comparison job through
launch/submit.py, preempt the run once with SIGUSR1 and check that it checkpoints, requeues itself, resumes,
completes, and is then evaluated and compared.

Skipped where SLURM is not installed and cannot be (slurm_cluster.py says why). After the install it takes about a
minute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import HAS_MATPLOTLIB
from slurm_cluster import job_info, slurm, wait_job  # noqa: F401 (slurm: the fixture)

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.vocab_size=512", "model.d_model=32", "model.n_heads=2", "model.chunk_size=4", "model.thickness=2",
    "data.seq_len=32", "train.batch_size=4", "train.steps=20", "train.lr=0.003", "train.log_every=1",
    "train.eval_every=10", "train.eval_batches=2", "train.save_every=4", "train.keep_last=2",
    "logging.progress=false",
]


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
    assert job_info(slurm, eval_id)["Dependency"].startswith(f"afterok:{train_id}")

    # Preempt once, after the first checkpoint: the batch shell gets SIGUSR1 (as with --signal=B:USR1@120).
    deadline = time.time() + 120
    while not (run_dir / "latest").is_file() and time.time() < deadline:
        time.sleep(0.2)
    assert (run_dir / "latest").is_file(), "no checkpoint within 120 s"
    subprocess.run(["scancel", "--batch", "--signal=USR1", train_id], env=slurm, check=True)

    info = wait_job(slurm, train_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, timeout=240)
    logs = "".join(p.read_text() for p in sorted((run_dir / "slurm").glob("pretrain-*.out")))
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", logs[-4000:]
    assert "requeueing job" in logs and int(info.get("Restarts", "0")) >= 1, logs[-4000:]
    assert "2 process(es)" in logs, logs[-2000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 21))  # resumed without gaps or repeats
    assert (run_dir / "model.pt").is_file()

    # The evaluation job starts once pretraining completed (afterok) and scores the exported model.pt.
    ev = wait_job(slurm, eval_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=120)
    eval_log = "".join(p.read_text() for p in (run_dir / "slurm").glob("evaluate-*.out"))
    assert ev["JobState"] == "COMPLETED", eval_log[-3000:]
    rows = (tmp_path / "eval" / "stdlib" / "regular_gpt-seed0" / "results.jsonl").read_text().splitlines()
    assert len(rows) == 2

    # Then the sweep's comparison job (afterok on every evaluation) writes the combined table and plots.
    assert job_info(slurm, compare_id)["Dependency"] in (f"afterok:{eval_id}(unfulfilled)", "(null)")
    cmp = wait_job(slurm, compare_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=120)
    sweep = tmp_path / "eval" / "sweep"
    assert cmp["JobState"] == "COMPLETED", "".join(p.read_text() for p in sweep.glob("compare-*.out"))[-3000:]
    assert (sweep / "comparison" / "table.md").is_file()
    assert (sweep / "comparison" / "ppl_vs_length.png").is_file() or not HAS_MATPLOTLIB
