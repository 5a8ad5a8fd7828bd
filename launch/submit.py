"""Submit a pretraining sweep to SLURM: configs × seeds × datasets, each with a dependent evaluation job.

Examples:
    python launch/submit.py --configs configs/tiny/regular_gpt.json configs/tiny/alibi.json --seeds 0 1 2 \\
        --data data/stdlib --dry-run
    python launch/submit.py --configs configs/base.json configs/baselines/*.json --seeds 1235 \\
        --data data/prose data/code data/latex --nodes 2 --gpus-per-node 8 --cpus-per-task 64 --time 2-00:00:00

For every (config, seed, dataset) this writes two batch scripts under ``<runs-root>/<dataset>/<config>-seed<seed>/
slurm/`` — launch/slurm/pretrain.sbatch and launch/slurm/evaluate.sbatch with the run's arguments filled in — and
submits them: ``sbatch --parsable pretrain`` then ``sbatch --dependency=afterok:<id> evaluate``. The pretraining job
requeues itself on preemption (same job id), so the evaluation waits for the run to really finish. ``--dry-run``
prints both scripts and the sbatch commands for every run and submits nothing. Resubmitting a sweep resumes
unfinished runs from their checkpoints (each run directory resumes automatically).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`

from regulargpt.io import atomic_write_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MARK = "# @SUBMIT_ARGS@"
_PREFIX = {"pretrain": "pt", "evaluate": "ev"}  # job names: pt-<dataset>-<config>-seed<seed>


@dataclass
class Job:
    name: str
    run_dir: Path
    train_args: list[str]
    eval_args: list[str]


def _render(template: Path, args: list[str], env: dict[str, str]) -> str:
    """The template with `set -- ARGS` and exports at the marker line (after the #SBATCH header)."""
    text = template.read_text()
    if MARK not in text:
        raise SystemExit(f"error: {template} has no '{MARK}' line")
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append("set -- " + " ".join(shlex.quote(a) for a in args))
    out = []
    for line in text.splitlines():
        out.extend(lines if line.startswith(MARK) else [line])
    return "\n".join(out) + "\n"


def plan(args: argparse.Namespace) -> list[Job]:
    """One Job per (dataset, config, seed); every path is made absolute (jobs run from the repository root)."""
    jobs = []
    for data in (str(Path(d).resolve()) for d in args.data):
        dataset = Path(data).name
        for config in (str(Path(c).resolve()) for c in args.configs):
            for seed in args.seeds:
                name = f"{Path(config).stem}-seed{seed}"
                run_dir = Path(args.runs_root).resolve() / dataset / name
                train_args = ["--config", config, "--run-dir", str(run_dir),
                              "--set", f"data.path={data}", "--set", f"train.seed={seed}"]
                for item in args.set:
                    train_args += ["--set", item]
                eval_out = Path(args.eval_out).resolve() / dataset / name
                eval_args = ["--runs", str(run_dir), "--data", data, "--out", str(eval_out), *args.eval_arg]
                jobs.append(Job(f"{dataset}-{name}", run_dir, train_args, eval_args))
    return jobs


def _sbatch_options(args: argparse.Namespace, job: Job, kind: str) -> list[str]:
    log = job.run_dir / "slurm" / f"{kind}-%j.out"
    opts = [f"--job-name={_PREFIX[kind]}-{job.name}", f"--output={log}"]
    if args.partition:
        opts.append(f"--partition={args.partition}")
    if args.account:
        opts.append(f"--account={args.account}")
    if kind == "pretrain":
        opts += [f"--nodes={args.nodes}", f"--time={args.time}"]
        if args.gpus_per_node:
            opts.append(f"--gpus-per-node={args.gpus_per_node}")
        if args.cpus_per_task:
            opts.append(f"--cpus-per-task={args.cpus_per_task}")
    else:
        opts.append(f"--time={args.eval_time}")
        if args.gpus_per_node:
            opts.append("--gpus=1")
        if args.cpus_per_task:
            opts.append(f"--cpus-per-task={args.cpus_per_task}")
    return opts + list(args.sbatch_arg)


def _submit(options: list[str], script: str, cwd: Path) -> str:
    proc = subprocess.run(["sbatch", "--parsable", *options], input=script, text=True, capture_output=True, cwd=cwd)
    if proc.returncode != 0:
        raise SystemExit(f"error: sbatch {' '.join(options)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", required=True, help="config files, e.g. --configs configs/tiny/*.json")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="training seeds, e.g. --seeds 0 1 2 (default 0)")
    p.add_argument("--data", nargs="+", required=True, help="prepared data folders, e.g. --data data/stdlib data/prose")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run (repeatable), e.g. --set train.steps=2000")
    p.add_argument("--runs-root", default="runs", help="run directories go to RUNS_ROOT/<dataset>/<config>-seed<seed> "
                                                      "(default runs)")
    p.add_argument("--eval-out", default="results/eval", help="evaluation output root (default results/eval)")
    p.add_argument("--eval-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for eval/extrapolate.py (repeatable), e.g. --eval-arg=--lengths=64,128")
    p.add_argument("--no-eval", action="store_true", help="submit only the pretraining jobs")
    p.add_argument("--nodes", type=int, default=1, help="nodes per pretraining job (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default 0: CPU ranks), e.g. 8")
    p.add_argument("--cpus-per-task", type=int, default=0, help="CPUs per node task, e.g. 64 (default: SLURM's)")
    p.add_argument("--time", default="1-00:00:00", help="pretraining time limit (default 1-00:00:00)")
    p.add_argument("--eval-time", default="04:00:00", help="evaluation time limit (default 04:00:00)")
    p.add_argument("--partition", help="SLURM partition, e.g. --partition gpu")
    p.add_argument("--account", help="SLURM account")
    p.add_argument("--sbatch-arg", action="append", default=[], metavar="OPT",
                   help="extra sbatch option for every job (repeatable), e.g. --sbatch-arg=--qos=low")
    p.add_argument("--python", default=None, help="python of the environment on the nodes "
                                                 "(default: this checkout's .venv/bin/python)")
    p.add_argument("--dry-run", action="store_true", help="print the scripts and sbatch commands; submit nothing")
    args = p.parse_args(argv)

    env = {"REGULARGPT_ROOT": str(ROOT)}
    if args.python:
        env["REGULARGPT_PYTHON"] = args.python
    templates = ROOT / "launch" / "slurm"
    jobs = plan(args)
    for job in jobs:
        train_script = _render(templates / "pretrain.sbatch", job.train_args, env)
        eval_script = _render(templates / "evaluate.sbatch", job.eval_args, env)
        train_opts = _sbatch_options(args, job, "pretrain")
        eval_opts = _sbatch_options(args, job, "evaluate")
        if args.dry_run:
            print(f"# ===== {job.name}: sbatch --parsable {shlex.join(train_opts)} < pretrain.sbatch")
            print(train_script)
            if not args.no_eval:
                print(f"# ===== {job.name}: sbatch --parsable --dependency=afterok:<pretrain id> "
                      f"{shlex.join(eval_opts)} < evaluate.sbatch")
                print(eval_script)
            continue
        folder = job.run_dir / "slurm"
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(folder / "pretrain.sbatch", train_script)
        atomic_write_text(folder / "evaluate.sbatch", eval_script)
        train_id = _submit(train_opts, train_script, ROOT)
        line = f"{job.name}: pretrain {train_id}"
        if not args.no_eval:
            eval_id = _submit([f"--dependency=afterok:{train_id}", *eval_opts], eval_script, ROOT)
            line += f", evaluate {eval_id} (after {train_id})"
        print(line + f"  run dir {job.run_dir}", flush=True)
    if args.dry_run:
        print(f"# {len(jobs)} run(s); nothing submitted (--dry-run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
