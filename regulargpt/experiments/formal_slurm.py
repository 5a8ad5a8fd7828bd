"""A formal sweep as one SLURM job array (``eval/formal.py sweep … --slurm``): one array task per run not yet
finished, then one aggregation job that writes the tables once every task has ended.

What is queued, for a sweep whose pending runs are R_0 … R_{n-1}::

    OUT/slurm/array.tsv        index, task, model, seed, lr, run_dir of R_0 … R_{n-1}: array task i runs row i
                               (over --max-array-size runs, 1000: several arrays, array-1.tsv, array-2.tsv, …)
    sbatch --array=0-(n-1)[%N] launch/slurm/array.sbatch eval/formal.py sweep --profile P --out OUT … --device D
                               each task: --array-task i → the run of row i, trained (resumed from its checkpoint)
                               and range-evaluated; its log OUT/slurm/logs/<array>_<i>.out starts with its row
    sbatch --dependency=afterany:<array> launch/slurm/job.sbatch eval/formal.py aggregate --runs OUT --profile P …
                               the Table 1 / Table 2 files in --tables-dir, whatever the tasks' outcome

A task stopped by SLURM (SIGUSR1 120 s before its time limit; SIGTERM on preemption, ``scontrol requeue`` or
``scancel``) checkpoints at the end of its current training step (or before its next evaluation file) and exits with
status :data:`STOPPED`. After SIGUSR1 the array script requeues it (same job id, so the aggregation still waits);
after SIGTERM SLURM decides: a preempted (PreemptMode=REQUEUE) or requeued task comes back, a cancelled one does not.
A requeued task resumes from the checkpoint. A rerun of
the same command queues only the runs still unfinished: none → nothing is submitted. While the array of an earlier
submission (OUT/slurm/jobs.json) is still queued or running, submitting again is refused (its tasks read
array.tsv, which a new submission would rewrite).

Checked before anything is written or queued (here, on the login node): the profile, tasks, models and configs
(:func:`~regulargpt.experiments.formal_sweep.plan_runs`), that --out's parent folder and --tables-dir exist, and
the numeric flags. Worked example: ``--profile quick --tasks even_pairs --models rnn lstm --seeds 0 1`` with none
finished → 4 rows, ``--array=0-3``; with ``--array-throttle 2`` → ``--array=0-3%2`` (two tasks at a time).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
from pathlib import Path

import torch

from regulargpt.cli import non_negative_int, positive_int
from regulargpt.experiments.formal_sweep import (
    Profile,
    RunSpec,
    execute_run,
    is_finished,
    plan_runs,
    set_aside_stale,
    stale_recipe,
)
from regulargpt.files import atomic_write_text
from regulargpt.slurm import (
    TEMPLATES,
    Queue,
    SubmitError,
    active_jobs,
    add_array_arguments,
    array_options,
    job_env,
    queue_options,
    render,
)
from regulargpt.train.stopping import StopRequest

__all__ = ["ARRAY_TABLE", "STOPPED", "add_slurm_arguments", "array_row", "pending", "run_array_task", "submit_sweep"]

ARRAY_TABLE = Path("slurm") / "array.tsv"  # under the sweep's --out
STOPPED = 75  # exit status of an array task stopped before its end (EX_TEMPFAIL): launch/slurm/array.sbatch requeues
_COLUMNS = ("index", "task", "model", "seed", "lr", "run_dir")


def add_slurm_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's --slurm flags (and --array-task, which the array script passes to each task)."""
    g = p.add_argument_group("SLURM (--slurm: one job array over the unfinished runs, then the tables)")
    add_array_arguments(g, "the unfinished runs as one job array (GPUs: --device cuda) and a dependent aggregation job")
    g.add_argument("--tables-dir", default="results/formal", help="where the aggregation job writes "
                                                                  "table{1,2}_<profile> (default results/formal)")
    g.add_argument("--max-array-size", type=positive_int, default=1000,
                   help="tasks per job array at most (SLURM's MaxArraySize - 1; default 1000): a larger sweep is "
                        "queued as several arrays, the aggregation after all of them")
    g.add_argument("--array-task", type=non_negative_int, default=None, help=argparse.SUPPRESS)
    g.add_argument("--array-table", help=argparse.SUPPRESS)


def pending(specs: list[RunSpec]) -> list[RunSpec]:
    """The runs an array must train: not finished, or trained with another recipe (the task sets the folder aside
    and trains it again); nothing is renamed here."""
    return [s for s in specs if stale_recipe(s) is not None or not is_finished(s)]


def _write_table(path: Path, specs: list[RunSpec]) -> None:
    rows = ["\t".join(_COLUMNS)]
    rows += ["\t".join([str(i), s.task_id, s.model, str(s.seed), repr(s.lr), str(s.run_dir.resolve())])
             for i, s in enumerate(specs)]
    atomic_write_text(path, "\n".join(rows) + "\n")


def array_row(table: str | Path, index: int) -> dict[str, str]:
    """Row `index` of an array's task table (OUT/slurm/array.tsv) as {column: value}; a SubmitError naming the file
    when it is missing or lacks the row."""
    path = Path(table)
    if not path.is_file():
        raise SubmitError(f"{path}: no such file; `eval/formal.py sweep … --slurm` writes it")
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle, delimiter="\t"):
            if row["index"] == str(index):
                return row
    raise SubmitError(f"{path}: no row for array task {index}")


def _check_folders(args: argparse.Namespace) -> None:
    parent = Path(args.out).resolve().parent
    if not parent.is_dir():
        raise SubmitError(f"--out {args.out}: its parent folder {parent} does not exist; create it or fix the path")
    if not Path(args.tables_dir).is_dir():
        raise SubmitError(f"--tables-dir {args.tables_dir}: no such folder; create it or fix the path")


def submit_sweep(args: argparse.Namespace, profile_name: str, specs: list[RunSpec]) -> int:
    """Queue the array over :func:`pending` `specs` and the aggregation job (module docstring); --dry-run writes
    the scripts and prints the commands instead. → the exit status."""
    _check_folders(args)
    out = Path(args.out).resolve()
    todo = pending(specs)
    print(f"sweep {profile_name}: {len(specs)} runs planned, {len(specs) - len(todo)} finished, {len(todo)} to "
          f"queue under {out}", flush=True)
    if not todo:
        print("nothing to submit: every run is finished (`eval/formal.py aggregate` rewrites the tables)")
        return 0
    jobs_file = out / "slurm" / "jobs.json"
    if not args.dry_run and jobs_file.is_file():
        earlier = json.loads(jobs_file.read_text())
        alive = active_jobs([str(job) for job in earlier.get("arrays", [])])
        if alive:
            raise SubmitError(f"{jobs_file}: the array of an earlier submission, job {alive[0]}, is still queued or "
                              f"running; wait for it (squeue -j {alive[0]}) or cancel it (scancel {alive[0]})")
    folder = out / "slurm" / ("dry-run" if args.dry_run else "")
    device = "cuda" if args.gpus_per_task else "cpu"
    profile = str(Path(args.profile).resolve()) if Path(args.profile).suffix else args.profile
    common = ["--profile", profile, "--configs", str(Path(args.configs).resolve())]
    for item in args.set:
        common += ["--set", item]
    env = job_env(args)
    tables = str(Path(args.tables_dir).resolve())
    aggregate_script = render(TEMPLATES / "job.sbatch", ["eval/formal.py", "aggregate", "--runs", str(out),
                                                         "--out-dir", tables, *common], env)
    atomic_write_text(folder / "aggregate.sbatch", aggregate_script)
    if not args.dry_run:
        (out / "slurm" / "logs").mkdir(parents=True, exist_ok=True)
    queue = Queue(args.dry_run)
    arrays: list[str] = []
    size = args.max_array_size
    for k, start in enumerate(range(0, len(todo), size)):  # SLURM's MaxArraySize: 1001 by default
        chunk, name = todo[start:start + size], ARRAY_TABLE.stem + (f"-{k}" if k else "")
        table = str(out / "slurm" / f"{name}.tsv")  # where the tasks read it (a dry run writes it under dry-run/)
        _write_table(folder / f"{name}.tsv", chunk)
        task_args = ["eval/formal.py", "sweep", "--out", str(out), *common, "--device", device,
                     "--threads", str(args.cpus_per_task), "--array-table", table]
        script = render(TEMPLATES / "array.sbatch", task_args, {**env, "ARRAY_TABLE": table})
        atomic_write_text(folder / f"{name}.sbatch", script)
        options = array_options(args, f"formal-{profile_name}", len(chunk), out / "slurm" / "logs")
        arrays.append(queue.submit(options, script, folder / f"{name}.sbatch", []))
        if not args.dry_run:
            print(f"array job {arrays[-1]}: {len(chunk)} task(s) ({device}), their runs in {table}, logs "
                  f"{out / 'slurm' / 'logs'}", flush=True)
    aggregate_opts = [f"--job-name=formal-{profile_name}-tables", f"--output={out / 'slurm' / 'aggregate-%j.out'}",
                      *queue_options(args)]
    aggregate_id = queue.submit(aggregate_opts, aggregate_script, folder / "aggregate.sbatch", arrays,
                                dependency="afterany")
    if args.dry_run:
        atomic_write_text(folder / "sbatch.txt", "\n".join(queue.commands) + "\n")
        print("\n".join([*queue.commands, f"# {len(todo)} array task(s) ({device}) in {len(arrays)} array(s), their "
                         f"runs in {folder}/array*.tsv; the tables into {tables}; scripts in {folder}; nothing "
                         f"submitted (--dry-run)"]))
        return 0
    atomic_write_text(jobs_file, json.dumps({"arrays": arrays, "aggregate": aggregate_id, "tasks": len(todo)},
                                            indent=1) + "\n")
    print(f"aggregation job {aggregate_id} (afterany:{':'.join(arrays)}) → {tables}", flush=True)
    print("$ " + shlex.join(["squeue", "-j", ",".join([*arrays, aggregate_id])]))
    return 0


def run_array_task(args: argparse.Namespace, profile: Profile) -> int:
    """One array task: row ``args.array_task`` of OUT/slurm/array.tsv planned again with the sweep's flags, its
    folder set aside if stale, then trained and evaluated until done (0), failed (1) or stopped by a signal
    (:data:`STOPPED`, after its checkpoint)."""
    row = array_row(args.array_table or Path(args.out) / ARRAY_TABLE, args.array_task)
    specs = plan_runs(profile, args.out, configs_dir=args.configs, tasks=[row["task"]], models=[row["model"]],
                      seeds=[int(row["seed"])], lrs=[float(row["lr"])], sets=args.set)
    spec = specs[0]
    if str(spec.run_dir.resolve()) != row["run_dir"]:
        raise SubmitError(f"{args.array_table}: row {args.array_task} names {row['run_dir']}, but the "
                          f"sweep's flags plan {spec.run_dir.resolve()}; submit the sweep again")
    stop = StopRequest()
    stop.install()
    torch.set_num_threads(args.threads)
    aside = set_aside_stale(spec)
    if aside is not None:
        print(f"{spec.name}: trained with another recipe; set aside as {aside.name}, training it again", flush=True)
    print(f"array task {args.array_task}: {spec.name} in {spec.run_dir} on {args.device}", flush=True)
    result = execute_run(spec, args.device, lambda: stop.requested)
    if result["stopped"]:
        print(f"{spec.name}: stopped ({stop.reason}) after its checkpoint; exit status {STOPPED}", flush=True)
        return STOPPED
    if result["error"]:
        print(f"{spec.name}: FAILED {result['error']} (traceback in {spec.run_dir / 'error.txt'})", flush=True)
        return 1
    print(f"{spec.name}: score={result['score']:.4f} ({result['seconds']:.0f}s)", flush=True)
    return 0
