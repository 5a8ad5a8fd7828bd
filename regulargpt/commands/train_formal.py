"""Train one formal-language classifier (Adam, clipping, constant LR, one length per batch); resumes automatically.

Example::

    python launch/train_formal.py --config configs/formal/parity_check.json \\
        --set train.steps=2000 --set train.lr=1e-3 --run-dir runs/parity-c2

Writes DIR/config.resolved.json, DIR/metrics.jsonl, DIR/ckpt.pt and finally DIR/model.pt (see
regulargpt/train/formal_trainer.py); with --time-to-solve, DIR/time_to_solve.jsonl, and the solve step and seconds
(or the best check score when it did not solve) are printed at the end. Evaluate with ``python eval/formal.py range
--run DIR --out DIR/range.jsonl``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

import torch

from regulargpt.cli import non_negative_int, positive_int, run
from regulargpt.config import ConfigError, FormalConfig, load_config
from regulargpt.files import read_jsonl
from regulargpt.folder_lock import hold_folder
from regulargpt.run_directory.layout import LOCK_FILE, SOLVE_FILE
from regulargpt.train.formal_trainer import SolveCheck, check_lengths_option, formal_task, train_formal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="task config, e.g. configs/formal/parity_check.json")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set model.chunk_size=3 (repeatable)")
    parser.add_argument("--run-dir", required=True, help="run directory; an existing run in it is resumed")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="torch CPU threads (0 = torch's default), e.g. 1")
    parser.add_argument("--time-to-solve", type=positive_int, nargs="?", const=100, default=0, metavar="EVERY",
                        help="every EVERY steps (default 100) log the held-out score on lengths 41, 92, …, 500 (64 "
                             "strings each) to DIR/time_to_solve.jsonl; training is unchanged. e.g. --time-to-solve")
    parser.add_argument("--check-lengths", metavar="SPEC",
                        help="lengths of the --time-to-solve check instead of 41, 92, …, 500 (N, A-B or A-B:STEP, "
                             "comma-separated, clipped to the longer of eval.max_length and data.max_length); the "
                             "training lengths, e.g. 1-40, make it a fit check for choosing step counts "
                             "(eval/formal.py pilot-steps --criterion check)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with hold_folder(args.run_dir, "formal training", "--run-dir", LOCK_FILE):  # one trainer per run directory
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set, FormalConfig)
    try:
        formal_task(cfg)  # the task name, its options and the model's vocabulary/classes, before anything is written
    except ConfigError as err:
        raise ConfigError(f"{args.config}: {err}") from None
    check = SolveCheck(every=args.time_to_solve, lengths=check_lengths_option(args.check_lengths, cfg)) \
        if args.time_to_solve else None
    path = train_formal(cfg, args.run_dir, solve_check=check)
    print(f"model: {path}")
    if check is not None:
        print(solve_line(read_jsonl(Path(args.run_dir) / SOLVE_FILE), check), flush=True)
    return 0


def solve_line(rows: list[dict], check: SolveCheck) -> str:
    """The time to solve from a run's check rows: the first at or above the threshold, or the best one, e.g.
    ``time to solve: step 400, 10.7 s of training (10.6 CPU s), check score 0.995 >= 0.99 on lengths 41..500``."""
    span = f"lengths {check.span[0]}..{check.span[1]}"
    solved = next((r for r in rows if r["score"] >= check.threshold), None)
    if solved is not None:
        return (f"time to solve: step {solved['step']}, {solved['seconds']:.1f} s of training "
                f"({solved.get('cpu_seconds', float('nan')):.1f} CPU s), check score {solved['score']:.3f} >= "
                f"{check.threshold:g} on {span}")
    if not rows:
        return f"time to solve: no check ran (every {check.every} steps)"
    best = max(rows, key=lambda r: r["score"])
    return (f"not solved: best check score {best['score']:.3f} at step {best['step']} (< {check.threshold:g} on "
            f"{span}; {len(rows)} checks)")


def console() -> NoReturn:
    """The ``regulargpt-train-formal`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
