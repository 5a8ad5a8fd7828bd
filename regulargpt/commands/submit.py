"""Submit a pretraining sweep to SLURM: configs × seeds × datasets, each with a dependent evaluation job, and one
comparison job at the end.

Examples:
    python launch/submit.py --configs configs/tiny/regular_gpt.json configs/tiny/alibi.json --seeds 0 1 2 \\
        --data data/stdlib --dry-run
    python launch/submit.py --configs configs/base.json configs/baselines/*.json --seeds 1235 \\
        --data data/prose data/code data/latex --nodes 2 --gpus-per-node 8 --cpus-per-task 64 --time 2-00:00:00

Checked first, here on the login node, for every run: its resolved config (the config file, then data.path,
train.seed and the sweep's --set), its data folder (manifest, tokenizer, model.vocab_size = the data's vocabulary,
splits longer than data.seq_len), DeepSpeed's validation of its deepspeed.* settings, and that an existing run
directory holds the same config. The first problem is one line `error: run NAME: ...`, exit status 2, and nothing is
written or queued. A warning is printed when a GPU node would give each rank fewer than 2 CPUs.

Then, for every (config, seed, dataset): launch/slurm/pretrain.sbatch and launch/slurm/evaluate.sbatch with the
run's arguments filled in, written to ``<runs-root>/<dataset>/<config>-seed<seed>/slurm/`` and submitted:
``sbatch --parsable pretrain`` then ``sbatch --dependency=afterok:<id> evaluate``. The pretraining job requeues itself
on preemption (same job id), so the evaluation waits for the run to really finish. A run whose directory already
holds model.pt is finished: it is not queued again (its evaluation still is; rows already computed are kept).
Last, one comparison job (``--dependency=afterok:<every evaluation id>``) runs eval/compare.py over the evaluations
into ``<sweep-dir>/comparison/`` (table.md and plots); its script and log are in the sweep directory, and
``<sweep-dir>/jobs.json`` lists every job id. ``--no-eval`` submits the pretraining jobs only (no evaluation script,
no comparison). Resubmitting a sweep resumes unfinished runs from their checkpoints.

``--dry-run`` submits nothing: it prints a summary (runs, nodes, GPUs, dependencies) and one example script, and
writes every script plus the sbatch commands in order (``sbatch.txt``) under ``<sweep-dir>/dry-run/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from regulargpt.cli import non_negative_int, positive_int, run
from regulargpt.errors import UserError
from regulargpt.files import atomic_write_text

from regulargpt.slurm import ROOT, TEMPLATES, Queue, SubmitError, render  # noqa: F401 (SubmitError: re-exported)

_PREFIX = {"pretrain": "pt", "evaluate": "ev", "compare": "cmp"}  # job names: pt-<dataset>-<config>-seed<seed>


@dataclass
class Job:
    name: str
    run_dir: Path
    config: str
    overrides: list[str]  # data.path, train.seed, then the sweep's --set
    eval_out: Path
    eval_args: list[str]

    @property
    def train_args(self) -> list[str]:
        args = ["--config", self.config, "--run-dir", str(self.run_dir)]
        for item in self.overrides:
            args += ["--set", item]
        return args

    @property
    def finished(self) -> bool:
        return (self.run_dir / "model.pt").is_file()


def plan(args: argparse.Namespace) -> list[Job]:
    """One Job per (dataset, config, seed); every path is made absolute (jobs run from the repository root)."""
    jobs = []
    for data in (str(Path(d).resolve()) for d in args.data):
        dataset = Path(data).name
        for config in (str(Path(c).resolve()) for c in args.configs):
            for seed in args.seeds:
                name = f"{Path(config).stem}-seed{seed}"
                run_dir = Path(args.runs_root).resolve() / dataset / name
                eval_out = Path(args.eval_out).resolve() / dataset / name
                eval_args = ["--runs", str(run_dir), "--data", data, "--out", str(eval_out), *args.eval_arg]
                jobs.append(Job(f"{dataset}-{name}", run_dir, config,
                                [f"data.path={data}", f"train.seed={seed}", *args.set], eval_out, eval_args))
    return jobs


def validate(jobs: list[Job], world_size: int) -> None:
    """Everything a pretraining job would check at start-up, now: SubmitError naming the run at the first problem."""
    from regulargpt.config import load_config
    from regulargpt import run_directory as rd
    from regulargpt.train.engine import check_deepspeed_config
    from regulargpt.train.lm_data import open_corpora

    if "DS_ACCELERATOR" not in os.environ:
        os.environ["DS_ACCELERATOR"] = "cpu"  # a login node: DeepSpeed's config validation needs no device
    checked: set[tuple[tuple[str, ...], int, int]] = set()
    for job in jobs:
        try:
            cfg = load_config(job.config, job.overrides)
            data_key = (tuple(cfg.data.folders), cfg.model.vocab_size, cfg.data.seq_len)
            if data_key not in checked:
                open_corpora(cfg)
                checked.add(data_key)
            check_deepspeed_config(cfg, world_size)
            rd.check_or_write_config(job.run_dir, cfg, write=False)
        except UserError as err:
            raise SubmitError(f"run {job.name}: {err}") from None


def _sbatch_options(args: argparse.Namespace, name: str, log: Path, kind: str) -> list[str]:
    opts = [f"--job-name={_PREFIX[kind]}-{name}", f"--output={log}"]
    if args.partition:
        opts.append(f"--partition={args.partition}")
    if args.account:
        opts.append(f"--account={args.account}")
    if kind == "pretrain":
        opts += [f"--nodes={args.nodes}", f"--time={args.time}"]
        if args.gpus_per_node:
            opts.append(f"--gpus-per-node={args.gpus_per_node}")
    else:
        opts.append(f"--time={args.eval_time}")
        if args.gpus_per_node and kind == "evaluate":
            opts.append("--gpus=1")
    if args.cpus_per_task:
        opts.append(f"--cpus-per-task={args.cpus_per_task}")
    return opts + list(args.sbatch_arg)


def cpu_warning(args: argparse.Namespace) -> str:
    """'' or a warning when a GPU node's task gives each of its ranks fewer than 2 CPUs."""
    if not args.gpus_per_node:
        return ""
    cpus = args.cpus_per_task or 1  # SLURM's default: one CPU per task, and the node's ranks all share it
    if cpus / args.gpus_per_node >= 2:
        return ""
    given = f"--cpus-per-task {args.cpus_per_task}" if args.cpus_per_task else "no --cpus-per-task (SLURM: 1 CPU)"
    return (f"warning: {given} for --gpus-per-node {args.gpus_per_node} gives each rank "
            f"{cpus / args.gpus_per_node:.2g} CPUs (data loading, the optimizer step and checkpointing run on them); "
            f"ask for at least {2 * args.gpus_per_node}, e.g. --cpus-per-task {8 * args.gpus_per_node}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", required=True, help="config files, e.g. --configs configs/tiny/*.json")
    p.add_argument("--seeds", nargs="+", type=non_negative_int, default=[0], help="training seeds, e.g. --seeds 0 1 2 (default 0)")
    p.add_argument("--data", nargs="+", required=True, help="prepared data folders, e.g. --data data/stdlib data/prose")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run (repeatable), e.g. --set train.steps=2000")
    p.add_argument("--runs-root", default="runs", help="run directories go to RUNS_ROOT/<dataset>/<config>-seed<seed> "
                                                      "(default runs)")
    p.add_argument("--eval-out", default="results/eval", help="evaluation output root (default results/eval)")
    p.add_argument("--sweep-dir", help="comparison job, its table and plots, jobs.json, --dry-run scripts "
                                       "(default EVAL_OUT/sweep), e.g. --sweep-dir results/eval/base-sweep")
    p.add_argument("--eval-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for eval/extrapolate.py (repeatable), e.g. --eval-arg=--lengths=64,128")
    p.add_argument("--no-eval", action="store_true", help="submit only the pretraining jobs (no evaluation, no "
                                                         "comparison)")
    p.add_argument("--nodes", type=positive_int, default=1, help="nodes per pretraining job (default 1)")
    p.add_argument("--gpus-per-node", type=non_negative_int, default=0, help="GPUs per node (default 0: CPU ranks), e.g. 8")
    p.add_argument("--cpus-per-task", type=non_negative_int, default=0,
                   help="CPUs of the one task per node, shared by its ranks (default: SLURM's, 1), e.g. 64 for 8 GPUs")
    p.add_argument("--time", default="1-00:00:00", help="pretraining time limit (default 1-00:00:00)")
    p.add_argument("--eval-time", default="04:00:00", help="evaluation time limit (default 04:00:00)")
    p.add_argument("--partition", help="SLURM partition, e.g. --partition gpu")
    p.add_argument("--account", help="SLURM account")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="OPT",
                   help="extra sbatch option for every job (repeatable), e.g. --sbatch-arg=--qos=low")
    p.add_argument("--python", default=None, help="python of the environment on the nodes "
                                                 "(default: this checkout's .venv/bin/python)")
    p.add_argument("--dry-run", action="store_true", help="check, print a summary and one example script, write all "
                                                         "scripts under SWEEP_DIR/dry-run; submit nothing")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    for flag in ("nodes", "gpus_per_node", "cpus_per_task"):
        if getattr(args, flag) < (1 if flag == "nodes" else 0):
            raise SubmitError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: expected an integer >= "
                              f"{1 if flag == 'nodes' else 0}")
    jobs = plan(args)
    procs = args.gpus_per_node or args.cpus_per_task or 1  # what the sbatch script starts per node
    validate(jobs, args.nodes * procs)
    if warning := cpu_warning(args):
        print(warning, file=sys.stderr)

    sweep_dir = Path(args.sweep_dir or Path(args.eval_out) / "sweep").resolve()
    scripts_root = sweep_dir / "dry-run" if args.dry_run else None
    env = {"REGULARGPT_ROOT": str(ROOT), **({"REGULARGPT_PYTHON": args.python} if args.python else {})}
    queue = Queue(args.dry_run)
    ids: dict[str, dict[str, str]] = {}
    example: list[str] = []

    def place(job_folder: Path, name: str, text: str) -> Path:
        folder = scripts_root / job_folder.relative_to(Path(args.runs_root).resolve()) if scripts_root else job_folder
        atomic_write_text(folder / name, text)
        return folder / name

    for job in jobs:
        slurm = job.run_dir / "slurm"
        entry = ids.setdefault(job.name, {})
        after: list[str] = []
        if job.finished:
            entry["pretrain"] = "finished"
        else:
            script = render(TEMPLATES / "pretrain.sbatch", job.train_args, env)
            path = place(slurm, "pretrain.sbatch", script)
            opts = _sbatch_options(args, f"{job.name}", slurm / "pretrain-%j.out", "pretrain")
            entry["pretrain"] = queue.submit(opts, script, path, [])
            after = [entry["pretrain"]]
            example = example or [queue.commands[-1], script]
        if not args.no_eval:
            script = render(TEMPLATES / "evaluate.sbatch", job.eval_args, env)
            path = place(slurm, "evaluate.sbatch", script)
            opts = _sbatch_options(args, job.name, slurm / "evaluate-%j.out", "evaluate")
            entry["evaluate"] = queue.submit(opts, script, path, after)
        if not args.dry_run:
            print(f"{job.name}: " + ", ".join(f"{k} {v}" for k, v in entry.items()) + f"  run dir {job.run_dir}",
                  flush=True)
    evaluations = [e["evaluate"] for e in ids.values() if "evaluate" in e]
    if evaluations:
        compare_args = ["--results", *(str(job.eval_out) for job in jobs), "--out", str(sweep_dir / "comparison")]
        script = render(TEMPLATES / "compare.sbatch", compare_args, env)
        path = (scripts_root or sweep_dir) / "compare.sbatch"
        atomic_write_text(path, script)
        opts = _sbatch_options(args, sweep_dir.name, sweep_dir / "compare-%j.out", "compare")
        ids["comparison"] = {"compare": queue.submit(opts, script, path, evaluations)}
        if not args.dry_run:
            print(f"comparison: {ids['comparison']['compare']} after {len(evaluations)} evaluation(s) → "
                  f"{sweep_dir / 'comparison'}", flush=True)
    if args.dry_run:
        _summary(args, jobs, queue, example, scripts_root, len(evaluations))
    else:
        atomic_write_text(sweep_dir / "jobs.json", json.dumps(ids, indent=1) + "\n")
    return 0


def _summary(args: argparse.Namespace, jobs: list[Job], queue: Queue, example: list[str], scripts_root: Path,
             evaluations: int) -> None:
    """--dry-run: what would be queued, one example script, and where the rest went."""
    atomic_write_text(scripts_root / "sbatch.txt", "\n".join(queue.commands) + "\n")
    finished = sum(job.finished for job in jobs)
    per_node = f"{args.gpus_per_node} GPU(s)" if args.gpus_per_node else f"{args.cpus_per_task or 1} CPU rank(s)"
    lines = [f"# {len(jobs)} run(s): {len(args.configs)} config(s) x {len(args.seeds)} seed(s) x {len(args.data)} "
             f"dataset(s); {finished} already finished (not queued again)",
             f"# pretraining: {len(jobs) - finished} job(s) x {args.nodes} node(s) x {per_node}"
             + (f", {args.cpus_per_task} CPUs per node task" if args.cpus_per_task else ""),
             f"# evaluation: {evaluations} job(s), each --dependency=afterok:<pretrain id> of its run"
             if evaluations else "# evaluation: none (--no-eval)",
             "# comparison: 1 job, --dependency=afterok:<every evaluation id>" if evaluations else ""]
    if example:
        lines += [f"# example: {example[0]}", example[1].rstrip("\n")]
    lines += [f"# all {queue.count} scripts and the sbatch commands in order: {scripts_root} (sbatch.txt)",
              f"# {len(jobs)} run(s); nothing submitted (--dry-run)"]
    print("\n".join(line for line in lines if line))


def console() -> NoReturn:
    """The ``regulargpt-submit`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
