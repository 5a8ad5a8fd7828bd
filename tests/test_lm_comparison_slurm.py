"""`eval/lm_comparison.py --slurm` built from a plan's Stage data: one array per stage with missing trainings, a
scoring job chained after each, the report last; reruns submit only what is missing (--dry-run, no SLURM needed);
an array task's exit status when a signal stops its training (75: the array script requeues it); and (slow, long)
the demo study for real on the single-node SLURM of slurm_cluster.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from slurm_cluster import slurm, wait_job  # noqa: F401 (slurm: the fixture)

import regulargpt.experiments.lm_comparison.slurm as lm_slurm
from regulargpt.commands.lm_comparison import main
from regulargpt.experiments.lm_comparison import STUDIES, Plan, Stage, Variant
from regulargpt.slurm import SubmitError


def _plan(tmp_path: Path) -> Plan:
    """A two-stage study: s1 = a seed 0; s2 = a seed 1, b seeds 0 and 1 (4 trainings)."""
    return Plan(out=tmp_path / "study", datasets=("python-stdlib",),
                models=(Variant("a", "alibi"), Variant("b", "nope")),
                seeds={"python-stdlib": (0, 1)}, steps=5, batch_size=2, multiples=2, eval_tokens=256,
                data_root=tmp_path / "data",
                stages=(Stage("s1", "first", (("a", (0,)),)), Stage("s2", "then", (("a", (1,)), ("b", (0, 1))))))


def _dry_run(capsys: pytest.CaptureFixture, *extra: str) -> list[str]:
    assert main(["--study", "t", "--slurm", "--dry-run", *extra]) == 0
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("sbatch")]


def test_each_stage_is_an_array_scored_after_it_and_the_report_is_last(tmp_path, monkeypatch, capsys) -> None:
    plan = _plan(tmp_path)
    monkeypatch.setitem(STUDIES, "t", plan)
    commands = _dry_run(capsys, "--array-throttle", "2", "--cpus-per-task", "2")
    names = [re.search(r"--job-name=(\S+)", c).group(1) for c in commands]
    assert names == ["lm-study-prepare", "lm-study-s1", "lm-study-score-s1", "lm-study-s2", "lm-study-score-s2",
                     "lm-study-report"]  # prepare: data/python-stdlib has no manifest.json yet
    assert "'--dependency=afterok:<job 1>'" in commands[1] and "--array=0-0%2" in commands[1]
    assert "--array=0-2%2" in commands[3] and "--cpus-per-task=2" in commands[3]
    assert "'--dependency=afterany:<job 2>'" in commands[2]
    assert "'--dependency=afterany:<job 4>:<job 3>'" in commands[4]  # scoring jobs never write results together
    assert "'--dependency=afterany:<job 5>'" in commands[5]
    dry = plan.out / "slurm" / "dry-run"
    assert (dry / "s2.tsv").read_text().splitlines() == ["index\tdataset\tvariant\tseed\trun_dir"] + [
        f"{i}\tpython-stdlib\t{v}\t{s}\t{plan.out}/runs/python-stdlib/{v}-seed{s}"
        for i, (v, s) in enumerate([("a", 1), ("b", 0), ("b", 1)])]
    script = (dry / "s2.sbatch").read_text()
    assert "#SBATCH --requeue" in script and f"export ARRAY_TABLE={plan.out}/slurm/s2.tsv" in script
    assert "set -- eval/lm_comparison.py --study t --stage s2" in script
    assert "eval/lm_comparison.py --study t --job evaluate" in (dry / "score-s2.sbatch").read_text()
    assert "eval/lm_comparison.py --study t --report-only" in (dry / "report.sbatch").read_text()
    assert not (plan.out / "slurm" / "s1.tsv").exists()  # a dry run leaves the tasks' tables alone


def test_a_rerun_submits_only_what_is_missing(tmp_path, monkeypatch, capsys) -> None:
    plan = _plan(tmp_path)
    monkeypatch.setitem(STUDIES, "t", plan)
    (plan.data_root / "python-stdlib").mkdir(parents=True)
    (plan.data_root / "python-stdlib" / "manifest.json").write_text("{}")  # data prepared: no prepare job
    for variant, seed in (("a", 0), ("b", 1)):  # s1 trained; one run of s2 trained
        run = plan.out / "runs" / "python-stdlib" / f"{variant}-seed{seed}"
        run.mkdir(parents=True)
        (run / "model.pt").write_text("")
    commands = _dry_run(capsys)
    assert [re.search(r"--job-name=(\S+)", c).group(1) for c in commands] == [
        "lm-study-s2", "lm-study-score-s2", "lm-study-report"]
    assert "--array=0-1 " in commands[0]
    assert (plan.out / "slurm" / "dry-run" / "s2.tsv").read_text().count("\n") == 3  # header + a-seed1, b-seed0

    for variant, seed in (("a", 1), ("b", 0)):  # everything trained, rows still missing: scoring and report only
        run = plan.out / "runs" / "python-stdlib" / f"{variant}-seed{seed}"
        run.mkdir(parents=True)
        (run / "model.pt").write_text("")
    assert [re.search(r"--job-name=(\S+)", c).group(1) for c in _dry_run(capsys)] == [
        "lm-study-score", "lm-study-report"]
    monkeypatch.setattr(lm_slurm, "missing_rows", lambda *a: [])  # and every row scored: nothing at all
    assert main(["--study", "t", "--slurm", "--dry-run"]) == 0
    assert "nothing to submit" in capsys.readouterr().out


def test_flags_are_checked(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(STUDIES, "t", _plan(tmp_path))
    with pytest.raises(SubmitError, match="--dry-run: only with --slurm"):
        main(["--study", "t", "--dry-run"])
    with pytest.raises(SubmitError, match="--array-task: only with --stage"):
        main(["--study", "t", "--array-task", "0"])
    with pytest.raises(SubmitError, match=r"study/slurm/s9.tsv: no such file"):
        main(["--study", "t", "--stage", "s9", "--array-task", "0"])
    with pytest.raises(SystemExit):
        main(["--study", "t", "--slurm", "--cpus-per-task", "0"])


@pytest.mark.parametrize("signalled, expected", [(True, lm_slurm.STOPPED), (False, 1)])
def test_a_training_stopped_by_a_signal_before_model_pt_asks_for_a_requeue(tmp_path, monkeypatch, signalled,
                                                                           expected) -> None:
    """The task passes SIGTERM on to its training; a training that then exits 0 without model.pt (as
    launch/pretrain.py does after its stop checkpoint) → 75; one that exits 0 without model.pt unasked → 1."""
    import os
    import signal
    import subprocess
    import threading

    plan = _plan(tmp_path)
    (plan.out / "slurm").mkdir(parents=True)
    (plan.out / "slurm" / "s1.tsv").write_text(f"index\tdataset\tvariant\tseed\trun_dir\n0\tpython-stdlib\ta\t0\t"
                                               f"{plan.out}/runs/python-stdlib/a-seed0\n")
    child = [sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
             "print('ready', flush=True); time.sleep(30)"]
    real = subprocess.Popen
    monkeypatch.setattr(lm_slurm.subprocess, "Popen", lambda cmd, cwd: real(child))
    if signalled:
        threading.Timer(3.0, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
    else:
        child[2] = "pass"
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        assert lm_slurm.run_training_task(plan, "s1", 0) == expected
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini): 4 tiny trainings, their scoring and the README on SLURM
def test_the_demo_study_runs_on_slurm_and_a_rerun_submits_nothing(slurm, tmp_path) -> None:
    import json
    import subprocess

    from regulargpt.data import prepare

    data = tmp_path / "data"
    prepare("python-stdlib", data / "python-stdlib", vocab_size=2048, max_bytes=400_000, val_fraction=0.1,
            test_fraction=0.2, num_proc=1)
    out = tmp_path / "demo"
    cmd = [sys.executable, "eval/lm_comparison.py", "--demo", "--out", str(out), "--data-root", str(data),
           "--steps", "3", "--eval-tokens", "1024", "--slurm", "--array-throttle", "2",
           "--sbatch-arg=--export=ALL,OMP_NUM_THREADS=1,WANDB_MODE=disabled"]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(cmd, cwd=root, env=slurm, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert "prepare" not in proc.stdout  # the data is there: no preparation job
    report = words[words.index("report:") + 2]
    info = wait_job(slurm, report, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=900)
    logs = "".join(p.read_text() for p in sorted((out / "slurm").rglob("*.out")))
    assert info["JobState"] == "COMPLETED", logs[-4000:]
    rows = [json.loads(x) for x in (out / "python-stdlib" / "results.jsonl").read_text().splitlines()]
    runs = {f"{m}-seed0" for m in ("regular_gpt", "alibi", "kerple_log", "nope")}
    assert {Path(r["run"]).name for r in rows} == runs and {r["length"] for r in rows} == {64, 128, 256, 512, 1024}
    assert len((out / "trainings.jsonl").read_text().splitlines()) == 4  # each task recorded its timing
    assert (out / "README.md").is_file()
    for name in ("regular_gpt", "alibi", "kerple_log", "nope"):  # each task's log names its run
        assert f"dataset=python-stdlib variant={name} seed=0" in logs

    rerun = subprocess.run(cmd, cwd=root, env=slurm, capture_output=True, text=True, timeout=120)
    assert rerun.returncode == 0 and "nothing to submit" in rerun.stdout, rerun.stdout + rerun.stderr
