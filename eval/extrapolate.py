"""Perplexity of trained language models at many evaluation lengths (length extrapolation); see docs/EVALUATION.md.

Examples:
    python eval/extrapolate.py --runs runs/alibi-seed0 runs/regular-seed0 --data data/python-stdlib --split test \\
        --lengths 512,1024,2048,4096,8192,16384 --out results/lm
    python eval/extrapolate.py --runs runs/*/ --data data/python-stdlib --lengths 64,128,256 --out results/lm \\
        --protocol sliding --stride 32
    torchrun --nproc_per_node 4 eval/extrapolate.py --runs runs/alibi-seed0 --data data/python-stdlib --out results/lm

Writes OUT/results.jsonl (one row per run × length; rows already there are not recomputed), then OUT/table.md,
OUT/ppl_vs_length.png and OUT/loss_vs_position.png from every row in the file.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`
# Before torch loads OpenMP: idle threads sleep instead of spinning (spinning is many times slower on a shared CPU).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from regulargpt.checkpoint import CheckpointError
from regulargpt.cli import run
from regulargpt.evaluation.lm_report import load_rows, write_report
from regulargpt.evaluation.length_sweep import distributed_context, sweep
from regulargpt.evaluation.perplexity import EvalError


def _lengths(text: str) -> list[int]:
    try:
        lengths = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 512,1024,2048") from None
    if not lengths or min(lengths) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: lengths must be integers >= 1")
    return sorted(set(lengths))


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True,
                   help="run directories holding model.pt (or model.pt paths), e.g. --runs runs/alibi-seed0 runs/t5-seed0")
    p.add_argument("--data", required=True, help="prepared data folder (data_prep/prepare.py), e.g. --data data/python-stdlib")
    p.add_argument("--split", default="test", help="held-out split to score (default test), e.g. --split val")
    p.add_argument("--lengths", type=_lengths, default=_lengths("512,1024,2048,4096,8192,16384"),
                   help="evaluation lengths (default 512,1024,2048,4096,8192,16384), e.g. --lengths 64,128,256")
    p.add_argument("--out", required=True, help="output folder (results.jsonl, table.md, plots), e.g. --out results/lm")
    p.add_argument("--protocol", choices=("nonoverlapping", "sliding"), default="nonoverlapping",
                   help="nonoverlapping: windows of L, every token scored (KERPLE/ALiBi); sliding: windows advance by "
                        "--stride and score only their new tokens (default nonoverlapping)")
    p.add_argument("--stride", type=int, default=0,
                   help="sliding stride in tokens, <= every length (default 0 = L/2 at each length), e.g. --stride 32")
    p.add_argument("--tokens", type=int, default=0,
                   help="tokens scored per length (default 0 = as many as the split holds, rounded to whole windows "
                        "of every length), e.g. --tokens 65536")
    p.add_argument("--memory-gb", type=float, default=4.0,
                   help="activation memory budget; sets the batch size, and a length whose single window needs more "
                        "gets a skipped row (default 4), e.g. --memory-gb 16")
    p.add_argument("--batch-size", type=int, default=0,
                   help="windows per forward, capped by --memory-gb (default 0 = the largest that fits), e.g. --batch-size 1")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the per-row lines are still printed)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.stride < 0 or args.tokens < 0 or args.batch_size < 0 or args.memory_gb <= 0:
        print("error: --stride, --tokens and --batch-size must be >= 0 and --memory-gb > 0", file=sys.stderr)
        return 2
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    try:
        rank, _ = distributed_context()
        sweep(args.runs, args.data, args.split, args.lengths, args.out, protocol=args.protocol, stride=args.stride,
              tokens=args.tokens, memory_gb=args.memory_gb, batch_size=args.batch_size, device=_device(args.device),
              progress=not args.no_progress)
    except (EvalError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if rank == 0:
        write_report(load_rows(Path(args.out) / "results.jsonl"), args.out, command)
        print(f"wrote {args.out}/results.jsonl, table.md, ppl_vs_length.png, loss_vs_position.png")
    return 0


if __name__ == "__main__":
    run(main)
