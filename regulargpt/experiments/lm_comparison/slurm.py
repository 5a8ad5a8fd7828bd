"""A language-model study on SLURM (``eval/lm_comparison.py --study v3 --slurm``): each stage's missing trainings as
one job array, the scoring as dependent jobs, the README as the last job. Built from the :class:`Plan` /
:class:`Stage` data alone, so every study of ``STUDIES`` (and the plans it names in ``then``) is submitted the same
way; a plan without stages is one stage, ``trainings``.

Jobs, for each plan in turn (``OUT`` its output folder)::

    prepare   only when a dataset folder lacks manifest.json: data_prep/prepare.py for the plan's datasets
    <stage>   --array=0-(n-1)[%N] over the stage's trainings not done (no model.pt and rows missing from
              OUT/<dataset>/results.jsonl, :func:`~.stages.done`), rows in OUT/slurm/<stage>.tsv; afterok:prepare.
              Task i runs launch/pretrain.py for row i (its log OUT/slurm/logs/<array>_<i>.out names dataset,
              variant and seed), records its timing in OUT/trainings.jsonl, and exits 75 when a signal stopped
              it before model.pt (requeued as in eval/formal.py sweep --slurm: after SIGUSR1 by
              launch/slurm/array.sbatch, after SIGTERM by SLURM when preempted); it resumes from its checkpoint
    score     after each array: eval/extrapolate.py over the plan's finished runs (rows already scored are skipped),
              afterany:<array>:<the previous score job>, so only one job writes a results file at a time
    report    last, afterany:<the last score job>: every plan's README (``--report-only``)

Reruns submit only what is missing: a stage whose trainings are all done gets no array; a plan with nothing to
train or score gets no job; nothing missing anywhere → nothing is submitted. Worked example: v3 with stage
``1x-core-seed0`` done and the other six stages untouched → 6 arrays (3 + 6 + 3 + 4 + 6 + 3 tasks), 6 score jobs
chained behind them, then v2-t256's 2 trainings (1 array, 1 score job) and the report: 14 jobs.
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from regulargpt.cli import non_negative_int
from regulargpt.experiments.lm_comparison.plans import STUDIES, Plan, Variant, rel_path, train_overrides
from regulargpt.experiments.lm_comparison.stages import _record_training, done, missing_rows
from regulargpt.files import atomic_write_text
from regulargpt.slurm import (
    ROOT,
    TEMPLATES,
    Queue,
    SubmitError,
    add_array_arguments,
    array_options,
    job_env,
    queue_options,
    render,
)

__all__ = ["STOPPED", "add_slurm_arguments", "check_flags", "run_training_task", "stage_trainings", "study_args",
           "submit_study"]

STOPPED = 75  # the array task stopped before model.pt: launch/slurm/array.sbatch requeues it
_COLUMNS = ("index", "dataset", "variant", "seed", "run_dir")


def stage_trainings(plan: Plan) -> Iterator[tuple[str, list[tuple[str, Variant, int]]]]:
    """(stage name, its (dataset, variant, seed) trainings) in stage order; an unstaged plan is one stage,
    ``trainings``, holding :meth:`Plan.trainings`."""
    if not plan.stages:
        yield "trainings", plan.trainings()
        return
    by_name = {m.name: m for m in plan.models}
    for stage in plan.stages:
        yield stage.name, [(d, by_name[v], s) for d in plan.datasets for v, seeds in stage.runs for s in seeds]


def study_args(plan: Plan, args: argparse.Namespace, first: bool) -> list[str]:
    """The eval/lm_comparison.py flags that rebuild `plan` in a job: its study key (or --demo), and the sweep-wide
    --out (first plan only, as in the command), --data-root, --steps and --eval-tokens."""
    key = next((k for k, p in STUDIES.items() if p is plan), None)
    words = ["--study", key] if key is not None else ["--demo"]
    if first and args.out:
        words += ["--out", str(plan.out)]
    if args.data_root:
        words += ["--data-root", str(plan.data_root)]
    if args.steps:
        words += ["--steps", str(args.steps)]
    if args.eval_tokens:
        words += ["--eval-tokens", str(args.eval_tokens)]
    return words


def _needs_scoring(plan: Plan) -> bool:
    return any((plan.run_dir(d, v, s) / "model.pt").is_file() and missing_rows(plan, d, v, s)
               for d, v, s in plan.trainings())


def submit_study(plans: list[Plan], args: argparse.Namespace) -> int:
    """Queue every plan's missing trainings, scoring and the report (module docstring); --dry-run writes the
    scripts under OUT/slurm/dry-run and prints the commands instead. → the exit status."""
    queue = Queue(args.dry_run)
    env, shared = job_env(args), queue_options(args)
    last_score: list[str] = []
    written: list[Path] = []
    for i, plan in enumerate(plans):
        flags = study_args(plan, args, i == 0)
        # a dry run writes everything under the first plan's folder (a follow-up plan's in a subfolder of its name)
        folder = (plans[0].out / "slurm" / "dry-run" / (plan.out.name if i else "") if args.dry_run
                  else plan.out / "slurm")

        def job(name: str, words: list[str], after: list[str], dependency: str, options: list[str]) -> str:
            script = render(TEMPLATES / "job.sbatch", ["eval/lm_comparison.py", *flags, *words], env)
            atomic_write_text(folder / f"{name}.sbatch", script)
            written.append(folder / f"{name}.sbatch")
            return queue.submit([f"--job-name=lm-{plan.out.name}-{name}", *options, *shared], script,
                                folder / f"{name}.sbatch", after, dependency)

        prepare: list[str] = []
        todo = [(name, [t for t in runs if not done(plan, *t)]) for name, runs in stage_trainings(plan)]
        if any(runs for _, runs in todo) and not all((plan.data_root / d / "manifest.json").is_file()
                                                     for d in plan.datasets):
            prepare = [job("prepare", ["--job", "prepare"], [], "afterok",
                           [f"--output={plan.out / 'slurm' / 'prepare-%j.out'}", "--time=04:00:00"])]
        for name, runs in todo:
            if not runs:
                continue
            table = folder / f"{name}.tsv"
            rows = ["\t".join(_COLUMNS)] + ["\t".join([str(k), d, v.name, str(s), str(plan.run_dir(d, v, s))])
                                            for k, (d, v, s) in enumerate(runs)]
            atomic_write_text(table, "\n".join(rows) + "\n")
            task_args = ["eval/lm_comparison.py", *flags, "--stage", name]
            script = render(TEMPLATES / "array.sbatch", task_args,
                            {**env, "ARRAY_TABLE": str(plan.out / "slurm" / f"{name}.tsv")})
            atomic_write_text(folder / f"{name}.sbatch", script)
            written.append(folder / f"{name}.sbatch")
            options = array_options(args, f"lm-{plan.out.name}-{name}", len(runs), plan.out / "slurm" / "logs")
            if not args.dry_run:
                (plan.out / "slurm" / "logs").mkdir(parents=True, exist_ok=True)
            array = queue.submit(options, script, folder / f"{name}.sbatch", prepare)
            last_score = [job(f"score-{name}", ["--job", "evaluate"], [array, *last_score], "afterany",
                              [f"--output={plan.out / 'slurm' / 'score-%j.out'}", f"--time={args.eval_time}"])]
            print(f"{rel_path(plan.out)} stage {name}: array {array} of {len(runs)} training(s), scoring "
                  f"{last_score[0]}", flush=True)
        if not any(runs for _, runs in todo) and _needs_scoring(plan):
            last_score = [job("score", ["--job", "evaluate"], last_score, "afterany",
                              [f"--output={plan.out / 'slurm' / 'score-%j.out'}", f"--time={args.eval_time}"])]
            print(f"{rel_path(plan.out)}: nothing to train; scoring {last_score[0]}", flush=True)
    if queue.count == 0:
        print("nothing to submit: every training of " + ", ".join(rel_path(p.out) for p in plans)
              + " is done and scored (`--report-only` rewrites the READMEs)")
        return 0
    first = plans[0]
    folder = first.out / "slurm" / ("dry-run" if args.dry_run else "")
    script = render(TEMPLATES / "job.sbatch", ["eval/lm_comparison.py", *study_args(first, args, True),
                                               "--report-only"], env)
    atomic_write_text(folder / "report.sbatch", script)
    report = queue.submit([f"--job-name=lm-{first.out.name}-report",
                           f"--output={first.out / 'slurm' / 'report-%j.out'}", f"--time={args.eval_time}", *shared],
                          script, folder / "report.sbatch", last_score,
                          "afterany")
    if args.dry_run:
        atomic_write_text(folder / "sbatch.txt", "\n".join(queue.commands) + "\n")
        print("\n".join([*queue.commands, f"# {queue.count} job(s); scripts and task tables in "
                         + ", ".join(sorted({str(p.parent) for p in written} | {str(folder)}))
                         + "; nothing submitted (--dry-run)"]))
    else:
        print(f"report: job {report} after the last scoring job", flush=True)
    return 0


def _row(plan: Plan, stage: str, index: int) -> tuple[str, Variant, int]:
    path = plan.out / "slurm" / f"{stage}.tsv"
    if not path.is_file():
        raise SubmitError(f"{path}: no such file; `eval/lm_comparison.py --slurm` writes it")
    with path.open(newline="") as handle:
        row = next((r for r in csv.DictReader(handle, delimiter="\t") if r["index"] == str(index)), None)
    variants = {m.name: m for m in plan.models}
    if row is None or row["variant"] not in variants:
        raise SubmitError(f"{path}: no row for array task {index} of a variant of this study")
    return row["dataset"], variants[row["variant"]], int(row["seed"])


def run_training_task(plan: Plan, stage: str, index: int) -> int:
    """Array task `index` of `stage`: launch/pretrain.py for its row (as the local study runs it), SIGTERM/SIGUSR1
    passed on to it; → 0 with model.pt (its timing appended to OUT/trainings.jsonl under a lock), :data:`STOPPED`
    when a signal stopped it first, else the training's exit status (1 if it exited 0 without model.pt)."""
    dataset, variant, seed = _row(plan, stage, index)
    run_dir = plan.run_dir(dataset, variant, seed)
    if (run_dir / "model.pt").is_file():
        print(f"{dataset}/{variant.name}-seed{seed}: model.pt exists; nothing to train", flush=True)
        return 0
    cmd = [sys.executable, "launch/pretrain.py", "--config", f"configs/tiny/{variant.config}.json",
           "--run-dir", rel_path(run_dir)]
    for item in train_overrides(plan, dataset, seed, variant):
        cmd += ["--set", item]
    print("$ " + " ".join(cmd), flush=True)
    started, started_unix = time.perf_counter(), time.time()
    child = subprocess.Popen(cmd, cwd=ROOT)
    signalled: list[int] = []

    def forward(signum: int, frame: object) -> None:
        signalled.append(signum)
        child.send_signal(signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(sig, forward)
    _, status, usage = os.wait4(child.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    if (run_dir / "model.pt").is_file():
        with (plan.out / "trainings.jsonl.lock").open("w") as lock:  # array tasks may finish together
            fcntl.flock(lock, fcntl.LOCK_EX)
            _record_training(plan, run_dir, time.perf_counter() - started, usage.ru_utime + usage.ru_stime, cmd,
                             started_unix)
        return 0
    if signalled:
        print(f"{dataset}/{variant.name}-seed{seed}: stopped by signal {signalled[0]} before the end (checkpoint kept)",
              flush=True)
        return STOPPED
    return rc or 1


def add_slurm_arguments(p: argparse.ArgumentParser) -> None:
    """The study's --slurm flags, and the hidden ones its jobs pass (--stage/--array-task, --job)."""
    g = p.add_argument_group("SLURM (--slurm: each stage's trainings as a job array, scoring and report as "
                             "dependent jobs)")
    add_array_arguments(g, "the missing trainings (one array per stage), their scoring and the README")
    g.add_argument("--eval-time", default="1-00:00:00", help="time limit of a scoring or report job")
    g.add_argument("--stage", help=argparse.SUPPRESS)
    g.add_argument("--array-task", type=non_negative_int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--job", choices=("prepare", "evaluate"), help=argparse.SUPPRESS)


def check_flags(args: argparse.Namespace) -> None:
    """--dry-run needs --slurm; --array-task needs --stage (the array script passes both)."""
    if args.dry_run and not args.slurm:
        raise SubmitError("--dry-run: only with --slurm (a local study has nothing to submit; --estimate shows it)")
    if args.array_task is not None and not args.stage:
        raise SubmitError("--array-task: only with --stage (launch/slurm/array.sbatch passes both)")
