"""Writing and queueing SLURM batch scripts: the templates of launch/slurm/ with a job's arguments filled in, and
``sbatch`` (or, for a dry run, numbered placeholders), every command kept in order. Shared by launch/submit.py
(pretraining sweeps), ``eval/formal.py sweep --slurm`` and ``eval/lm_comparison.py --slurm``.

A template has one marker line ``# @SUBMIT_ARGS@`` after its ``#SBATCH`` header; :func:`render` replaces it with
``export NAME=VALUE`` lines and ``set -- ARGS``, e.g. ``render(TEMPLATES / "job.sbatch", ["eval/formal.py",
"aggregate"], {"REGULARGPT_ROOT": "/repo"})`` gives ``export REGULARGPT_ROOT=/repo`` then
``set -- eval/formal.py aggregate`` in its place.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from pathlib import Path

from regulargpt.cli import non_negative_int, positive_int
from regulargpt.errors import UserError

__all__ = ["MARK", "ROOT", "TEMPLATES", "Queue", "SubmitError", "active_jobs", "add_array_arguments", "array_options",
           "job_env", "queue_options", "render"]

ROOT = Path(__file__).resolve().parents[1]  # the checkout: launch/slurm/ holds the templates
TEMPLATES = ROOT / "launch" / "slurm"
MARK = "# @SUBMIT_ARGS@"


class SubmitError(UserError):
    """A sweep that cannot be submitted as asked (the message names the run or option)."""


def render(template: Path, args: list[str], env: dict[str, str]) -> str:
    """The template with `set -- ARGS` and exports at the marker line (after the #SBATCH header)."""
    text = template.read_text()
    if MARK not in text:
        raise SubmitError(f"{template} has no '{MARK}' line")
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    lines.append("set -- " + " ".join(shlex.quote(a) for a in args))
    out = []
    for line in text.splitlines():
        out.extend(lines if line.startswith(MARK) else [line])
    return "\n".join(out) + "\n"


class Queue:
    """sbatch, or (dry run) numbered placeholders; every command is also kept in order for sbatch.txt."""

    def __init__(self, dry_run: bool) -> None:
        self.dry_run, self.commands, self.count = dry_run, [], 0

    def submit(self, options: list[str], script: str, script_path: Path, after: list[str],
               dependency: str = "afterok") -> str:
        """Queue `script` (also written at `script_path`, named in the command) → its job id; `after`: the job ids
        it waits for, with `dependency` (afterok: their success; afterany: their end, whatever the outcome)."""
        if after:
            options = [f"--dependency={dependency}:{':'.join(after)}", *options]
        self.commands.append(f"sbatch --parsable {shlex.join(options)} {shlex.quote(str(script_path))}")
        self.count += 1
        if self.dry_run:
            return f"<job {self.count}>"
        try:
            proc = subprocess.run(["sbatch", "--parsable", *options], input=script, text=True, capture_output=True,
                                  cwd=ROOT)
        except FileNotFoundError:
            raise SubmitError("sbatch not found: run this on a SLURM login node, or use --dry-run") from None
        if proc.returncode != 0:
            raise SubmitError(f"sbatch {' '.join(options)} failed: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]


def active_jobs(job_ids: list[str]) -> list[str]:
    """The jobs of `job_ids` still queued or running (``squeue``); [] where squeue is not installed. An array's
    tasks are listed under their array job id, e.g. '41' for tasks 41_0 … 41_3."""
    if not job_ids or not shutil.which("squeue"):
        return []
    proc = subprocess.run(["squeue", "-h", "-o", "%F", "-j", ",".join(job_ids)], capture_output=True, text=True)
    alive = {line.strip() for line in proc.stdout.splitlines()}  # %F: an array's job id; a plain job's own id
    return [job for job in job_ids if job in alive]


def add_array_arguments(g: argparse._ArgumentGroup, what: str) -> None:
    """The flags of a job-array submission (``eval/formal.py sweep --slurm``, ``eval/lm_comparison.py --slurm``):
    --slurm, --dry-run, the array's throttle and per-task resources, and where it is queued. `what` names what
    --slurm queues, for its help."""
    g.add_argument("--slurm", action="store_true", help=f"queue {what} on SLURM instead of running it here")
    g.add_argument("--dry-run", action="store_true", help="with --slurm: write the scripts under OUT/slurm/dry-run "
                                                          "and print the sbatch commands; queue nothing")
    g.add_argument("--array-throttle", type=non_negative_int, default=0,
                   help="at most N tasks of an array running at a time (--array=…%%N; default 0: no limit)")
    g.add_argument("--gpus-per-task", type=non_negative_int, default=0, help="GPUs per array task (default 0)")
    g.add_argument("--cpus-per-task", type=positive_int, default=1, help="CPU cores per array task (default 1)")
    g.add_argument("--time", default="1-00:00:00", help="time limit per array task; a task still training at it "
                                                        "checkpoints and is requeued (default 1-00:00:00)")
    g.add_argument("--partition", help="SLURM partition, e.g. --partition gpu")
    g.add_argument("--account", help="SLURM account")
    g.add_argument("--sbatch-arg", action="append", default=[], metavar="OPT",
                   help="extra sbatch option for every job (repeatable), e.g. --sbatch-arg=--qos=low")
    g.add_argument("--python", help="python of the environment on the nodes (default: the checkout's .venv)")


def queue_options(args: argparse.Namespace) -> list[str]:
    """--partition, --account and the --sbatch-arg options of `args`, for every job of a submission."""
    return [*([f"--partition={args.partition}"] if args.partition else []),
            *([f"--account={args.account}"] if args.account else []), *args.sbatch_arg]


def array_options(args: argparse.Namespace, name: str, tasks: int, logs: Path) -> list[str]:
    """sbatch options of a job array of `tasks` tasks named `name`, its logs ``LOGS/<array id>_<task>.out``:
    e.g. 4 tasks, --array-throttle 2 → ``--array=0-3%2``."""
    span = f"0-{tasks - 1}" + (f"%{args.array_throttle}" if args.array_throttle else "")
    return [f"--job-name={name}", f"--array={span}", f"--time={args.time}", f"--cpus-per-task={args.cpus_per_task}",
            f"--output={logs / '%A_%a.out'}",
            *([f"--gpus-per-task={args.gpus_per_task}"] if args.gpus_per_task else []), *queue_options(args)]


def job_env(args: argparse.Namespace) -> dict[str, str]:
    """The exports every script gets: the checkout (REGULARGPT_ROOT) and, with --python, REGULARGPT_PYTHON."""
    return {"REGULARGPT_ROOT": str(ROOT), **({"REGULARGPT_PYTHON": args.python} if args.python else {})}
