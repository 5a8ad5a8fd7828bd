"""Pretrain a language model (RegularGPT or a baseline) with DeepSpeed; resumes automatically.

Examples:
    python launch/pretrain.py --config configs/tiny/regular_gpt.json --set data.path=data/tiny
    deepspeed launch/pretrain.py --config configs/base.json                       # one process per GPU
    deepspeed --num_gpus 2 launch/pretrain.py --config configs/tiny/alibi.json    # CPU: 2 processes (gloo)
    torchrun --standalone --nproc_per_node 2 launch/pretrain.py --config configs/tiny/regular_gpt.json \\
        --set train.zero_stage=3 --run-dir runs/z3
    python launch/pretrain.py --config configs/tiny/regular_gpt.json --set data.path=data/tiny --extend-to 600
    srun -N2 --ntasks-per-node 8 python launch/pretrain.py --config configs/base.json   # ranks from SLURM_PROCID
    mpirun -n 4 python launch/pretrain.py --config configs/tiny/t5.json                 # ranks from OMPI_COMM_WORLD_*

Run directory (default runs/<config stem>-seed<seed>): config.resolved.json, metrics.jsonl, global_step<N>/ + latest,
model.pt at the end; one trainer at a time (trainer.lock). Rerun the same command to resume, also on another
number of processes (train.grad_accum then keeps the global batch). See docs/TRAINING.md and docs/RELIABILITY.md. Exit status: 0 done, or stopped after a checkpoint
by SIGTERM/SIGUSR1/SIGINT or because its launcher (torchrun, the deepspeed runner) is gone; 2 for a
config/data/checkpoint/setup error (one line `error: ...`, no traceback); 130 for Ctrl-C before training started.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

# Before torch loads OpenMP: idle OpenMP threads sleep instead of spinning. On a shared or oversubscribed CPU,
# spinning threads made a tiny run ~20x slower (14 s vs 0.7 s per step, measured); on an idle machine it costs ~nothing.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
PARENT_AT_START = os.getppid()  # before the slow imports: a launcher killed meanwhile is noticed (train/stopping.py)

from regulargpt.cli import positive_int, run  # noqa: E402
from regulargpt.config import load_config  # noqa: E402


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
    p.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)  # passed by the deepspeed launcher
    args = p.parse_args(argv)
    cfg = load_config(args.config, args.set)
    from regulargpt.train import default_run_dir, train

    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(args.config, cfg.train.seed)
    if args.extend_to is not None:
        from regulargpt.run_directory import extension_config

        cfg = extension_config(run_dir, cfg, args.extend_to)
    summary = train(cfg, run_dir, parent_at_start=PARENT_AT_START)
    if os.environ["RANK"] == "0" and summary["preempted"]:  # RANK: set by train() for every launcher
        print(f"stopped at step {summary['step']} ({summary['stop_reason'] or 'on another rank'}); checkpoint saved "
              f"in {run_dir}; rerun the same command to resume: {summary['resume_command']}", file=sys.stderr)
    return 0


def console() -> NoReturn:
    """The ``regulargpt-pretrain`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
