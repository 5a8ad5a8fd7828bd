"""Pretrain a language model (RegularGPT or a baseline) with DeepSpeed; resumes automatically.

Examples:
    python launch/pretrain.py --config configs/tiny/regular_gpt.json --set data.path=data/tiny
    deepspeed launch/pretrain.py --config configs/base.json                       # one process per GPU
    deepspeed --num_gpus 2 launch/pretrain.py --config configs/tiny/alibi.json    # CPU: 2 processes (gloo)
    torchrun --standalone --nproc_per_node 2 launch/pretrain.py --config configs/tiny/regular_gpt.json \\
        --set train.zero_stage=3 --run-dir runs/z3
    python launch/pretrain.py --config configs/tiny/regular_gpt.json --run-dir runs/x --extend-to 600
    python launch/pretrain.py --config configs/tiny/regular_gpt.json --run-dir runs/x \\
        --set train.lr=3e-4 --allow-changed train.lr          # resume a diverged run at a lower rate
    srun -N2 --ntasks-per-node 8 python launch/pretrain.py --config configs/base.json   # ranks from SLURM_PROCID
    mpirun -n 4 python launch/pretrain.py --config configs/tiny/t5.json                 # ranks from OMPI_COMM_WORLD_*

Resuming and extending train on the run's own data.path (its config.resolved.json) unless --set data.path=… is
given, so the data folder need not be repeated. Rerun the same command to resume, also on another number of
processes (train.grad_accum then keeps the global batch).

Run directory (default runs/<config stem>-seed<seed>): config.resolved.json, metrics.jsonl, global_step<N>/ +
latest, model.pt at the end; one trainer at a time (trainer.lock). Ends with a summary (steps, tokens, wall time,
tokens/s, final train and val loss, where the checkpoint and model are) and the next commands (evaluate, generate;
export for a stopped run). See docs/TRAINING.md and docs/RELIABILITY.md. Exit status: 0 done, or stopped after a
checkpoint by SIGTERM/SIGUSR1/SIGINT or because its launcher (torchrun, the deepspeed runner) is gone; 2 for a
config/data/checkpoint/setup error, a step that cannot fit in memory, a full disk, or a run that diverged (one line
`error: ...`, no traceback; a divergence names the last good checkpoint and the command that continues at a lower
rate with --allow-changed train.lr); 130 for Ctrl-C before training started.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Any, NoReturn

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. On a shared or oversubscribed CPU,
# spinning threads made a tiny run ~20x slower (14 s vs 0.7 s per step, measured); on an idle machine it costs ~nothing.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
PARENT_AT_START = os.getppid()  # before the slow imports: a launcher killed meanwhile is noticed (train/stopping.py)

from regulargpt.cli import positive_int, run  # noqa: E402
from regulargpt.config import Config, load_config  # noqa: E402
from regulargpt.data.verify import LEVELS  # noqa: E402


def summary_lines(summary: dict[str, Any], cfg: Config, run_dir: Path) -> list[str]:
    """What a finished (or stopped) training invocation did and what to run next, e.g.::

        runs/x: steps 0 → 300 of 300 in 92.1 s (307,200 tokens, 3,336 tokens/s); last train loss 4.1234, val …
        checkpoint runs/x/global_step300, model runs/x/model.pt
        next: python eval/extrapolate.py --runs runs/x --data data/stdlib-2k --out results/lm
              python launch/generate.py runs/x --prompt "def " --max-new-tokens 100

    Paths in the commands are shell-quoted (``--runs 'runs/my run'``), so each line runs as printed.
    """
    start, step, seconds = summary["start_step"], summary["step"], summary["seconds"]
    tokens = (step - start) * summary["tokens_per_step"]
    losses = ", ".join(f"{name} {summary[key]:.4f}" for key, name in (("loss", "last train loss"),
                                                                        ("val_loss", "val loss"))
                       if summary.get(key) is not None)
    done = (f"{run_dir}: steps {start} → {step} of {cfg.train.steps} in {seconds:.1f} s ({tokens:,} tokens, "
            f"{tokens / max(seconds, 1e-9):,.0f} tokens/s)" + (f"; {losses}" if losses else "")
            if step > start else f"{run_dir}: nothing to train (at step {step} of {cfg.train.steps})")
    model = run_dir / "model.pt"
    lines = [done, f"checkpoint {run_dir / f'global_step{step}'}" + (f", model {model}" if model.is_file() else "")]
    if summary["preempted"]:
        return lines
    run, data = shlex.quote(str(run_dir)), f" --data {shlex.quote(cfg.data.path)}" if cfg.data.path else ""
    nexts = [f"python eval/extrapolate.py --runs {run}{data} --out results/lm",
             f'python launch/generate.py {run} --prompt "def " --max-new-tokens 100']
    if not model.is_file():
        nexts.insert(0, f"python launch/export.py {run}")
    return lines + ["next: " + nexts[0], *("      " + n for n in nexts[1:])]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="JSON config, e.g. --config configs/tiny/regular_gpt.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable), e.g. --set train.zero_stage=2 --set data.path=data/tiny")
    p.add_argument("--run-dir", help="run directory (default runs/<config stem>-seed<seed>), e.g. --run-dir runs/a")
    p.add_argument("--extend-to", type=positive_int, metavar="N",
                   help="continue the finished run in the run directory to N optimizer steps, the LR schedule "
                        "re-planned from its last step (docs/TRAINING.md); rerun with the same flag to resume, "
                        "e.g. --extend-to 20000")
    p.add_argument("--verify-data", choices=LEVELS,
                   help="check the data splits against their manifest at start: size, blocks (default: size + 64 "
                        "sampled blocks, at most 4 MiB read) or full (the whole file's sha256, once per file "
                        "version); the same as --set data.verify=LEVEL (docs/DATA.md), e.g. --verify-data full")
    p.add_argument("--allow-changed", action="append", default=[], metavar="KEY",
                   help="resume with this optimizer setting changed (repeatable), recorded in the run's "
                        "changes.jsonl, e.g. --set train.lr=3e-4 --allow-changed train.lr after a divergence")
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    args = p.parse_args(argv)
    if args.verify_data:
        args.set.append(f"data.verify={args.verify_data}")
    cfg = load_config(args.config, args.set)
    from regulargpt.train import default_run_dir, train

    from regulargpt.run_directory import check_allow_changed, extension_config, with_saved_data_path

    allow = check_allow_changed(args.allow_changed)

    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args.config, cfg.train.seed)
    cfg, note = with_saved_data_path(run_dir, cfg, args.set)
    # before train() sets RANK for srun/mpirun launches, their own variables say which process this is
    launch_rank = next((os.environ[k] for k in ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID") if k in os.environ),
                       "0")
    if note and launch_rank == "0":
        print(note, file=sys.stderr, flush=True)
    if args.extend_to is not None:
        cfg = extension_config(run_dir, cfg, args.extend_to)
    summary = train(cfg, run_dir, parent_at_start=PARENT_AT_START, allow_changed=allow)
    rank = int(os.environ["RANK"])  # set by train() for every launcher (torchrun, deepspeed, srun, mpirun)
    if rank == 0:
        print("\n".join(summary_lines(summary, cfg, run_dir)), file=sys.stderr, flush=True)
    if rank == 0 and summary["preempted"]:
        print(f"stopped at step {summary['step']} ({summary['stop_reason'] or 'on another rank'}); checkpoint saved "
              f"in {run_dir}; rerun the same command to resume: {summary['resume_command']}", file=sys.stderr)
    return 0


def console() -> NoReturn:
    """The ``regulargpt-pretrain`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
