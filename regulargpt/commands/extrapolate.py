"""Perplexity of trained language models at many evaluation lengths (length extrapolation); see docs/EVALUATION.md.

Examples:
    python eval/extrapolate.py --runs runs/alibi-seed0 runs/regular-seed0 --data data/python-stdlib --split test \\
        --lengths 512,1024,2048,4096,8192,16384 --out results/lm
    python eval/extrapolate.py --runs runs/*/ --data data/python-stdlib --lengths 64,128,256 --out results/lm \\
        --protocol sliding --stride 32
    python eval/extrapolate.py --runs runs/rope-seed0 --lengths 512,2048,8192 --out results/lm \\
        --rope-scaling '{"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 512}'
    torchrun --nproc_per_node 4 eval/extrapolate.py --runs runs/alibi-seed0 --data data/python-stdlib --out results/lm

Without --data each run is scored on the folder it trained on (data.path), and a run trained on a mixture
(data.paths, docs/MIXTURES.md) on each of its corpora separately: rows name the corpus in their dataset column, and
the tables and plots have one section per corpus.

Lengths, protocol, stride, tokens and memory budget default to each run's saved config (its `eval` section: the tiny
configs say 64…2048, configs/base.json 512…16384); a flag overrides that field for every run.

The split is checked against its manifest first (--verify-data: size, blocks or full; docs/DATA.md); a damaged
file is refused with the command that re-prepares it. Writes OUT/results.jsonl (one row per run × length, with the
step and weights sha256 it scored and the split's fingerprint, the manifest's sha256 and token count; rows already
there for the same weights and data are not recomputed, and the sweep says how many; rows of a folder since
rebuilt with other content are rescored, and the tables read only the new ones), then OUT/table.md,
OUT/ppl_vs_length.png and OUT/loss_vs_position.png from every row in the file, and prints the tables. A run
directory whose model.pt is older than the run's newest checkpoint is refused (export it again, or name the
model.pt to score those weights); --depth-policy applies to the RegularGPT runs among --runs, the others are scored
as they are.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import NoReturn

# Before torch loads OpenMP: idle threads sleep instead of spinning (spinning is many times slower on a shared CPU).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch

from regulargpt.checkpoint import CheckpointError
from regulargpt.data.verify import LEVELS
from regulargpt.cli import ROPE_SCALING_HELP, non_negative_int, positive_float, positive_int, positive_ints, \
    rope_scaling_json, run
from regulargpt.evaluation.lm_report import console_tables, load_rows, write_report
from regulargpt.evaluation.length_sweep import distributed_context, sweep_runs
from regulargpt.evaluation.perplexity import EvalError
from regulargpt.evaluation.probe_report import probe_tables
from regulargpt.evaluation.probe_sweep import DEFAULT_DEPTHS, parse_probes, plan_probes, run_probes
from regulargpt.folder_lock import hold_folder
from regulargpt.write_errors import WriteError, explain_write_error


def _device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device(name)


def _fractions(text: str) -> tuple[float, ...]:
    """"0,0.5,1" → (0.0, 0.5, 1.0); each in [0, 1]."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated fractions in [0, 1], e.g. 0,0.5,1")
    if not values or any(not 0.0 <= v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every depth must be in [0, 1], e.g. 0,0.5,1")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True,
                   help="run directories holding model.pt (or model.pt paths), e.g. --runs runs/alibi-seed0 runs/t5-seed0")
    p.add_argument("--data", default=None,
                   help="prepared data folder (data_prep/prepare.py) scored for every run (default: each run's own "
                        "data.path, or each corpus of its data.paths mixture separately), e.g. --data data/python-stdlib")
    p.add_argument("--split", default="test", help="held-out split to score (default test), e.g. --split val")
    p.add_argument("--lengths", type=positive_ints, default=None,
                   help="evaluation lengths (default: the run's eval.lengths), e.g. --lengths 64,128,256")
    p.add_argument("--out", required=True, help="output folder (results.jsonl, table.md, plots), e.g. --out results/lm")
    p.add_argument("--protocol", choices=("nonoverlapping", "sliding"), default=None,
                   help="nonoverlapping: windows of L, every token scored (KERPLE/ALiBi); sliding: windows advance by "
                        "--stride and score only their new tokens (default: the run's eval.protocol)")
    p.add_argument("--stride", type=non_negative_int, default=None,
                   help="sliding stride in tokens, <= every length (0 = L/2 at each length; default: the run's "
                        "eval.stride), e.g. --stride 32")
    p.add_argument("--tokens", type=non_negative_int, default=None,
                   help="tokens scored per length (0 = as many as the split holds, rounded to whole windows of every "
                        "length; default: the run's eval.tokens, 2,097,152 unless its config sets it), "
                        "e.g. --tokens 65536")
    p.add_argument("--memory-gb", type=positive_float, default=None,
                   help="activation memory budget; sets the batch size, and a length whose single window needs more "
                        "gets a skipped row (default: the run's eval.memory_gb), e.g. --memory-gb 16")
    p.add_argument("--depth-policy", choices=("adaptive", "train", "per_position"), default=None,
                   help="score the RegularGPT runs among --runs with this depth policy instead of their own (same "
                        "weights; rows are labelled depth=POLICY; other runs are scored as they are), e.g. "
                        "--depth-policy train")
    p.add_argument("--rope-scaling", type=rope_scaling_json, default=None,
                   help=ROPE_SCALING_HELP + "; every run must use RoPE; rows are keyed and labelled by the scaling")
    p.add_argument("--batch-size", type=non_negative_int, default=0,
                   help="windows per forward, capped by --memory-gb (default 0 = the largest that fits), e.g. --batch-size 1")
    p.add_argument("--verify-data", choices=LEVELS, default="blocks",
                   help="check the split against its manifest before scoring: size, blocks (default: size + 64 "
                        "sampled blocks, at most 4 MiB read) or full (the whole file's sha256, once per file "
                        "version; docs/DATA.md), e.g. --verify-data full")
    p.add_argument("--probe", action="append", default=None,
                   help="also run retrieval probes at the same lengths, into the same results and table: passkey, "
                        "copy (repeat the flag or a comma list), e.g. --probe passkey,copy (docs/EVALUATION.md)")
    p.add_argument("--probe-depths", type=_fractions, default=DEFAULT_DEPTHS,
                   help="where the key / first copy sits, as fractions of the context (default 0,0.25,0.5,0.75,1)")
    p.add_argument("--probe-trials", type=positive_int, default=10,
                   help="random trials per (length, depth) (default 10), e.g. --probe-trials 20")
    p.add_argument("--probe-seed", type=non_negative_int, default=0, help="seed of the probes' keys and spans")
    p.add_argument("--probe-threshold", type=positive_float, default=0.9,
                   help="effective context length: the longest length with probe accuracy >= this there and at "
                        "every shorter length (default 0.9)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default auto: cuda when available)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (the per-row lines are still printed)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    rank, _ = distributed_context()
    with hold_folder(args.out, "evaluation") if rank == 0 else nullcontext():  # one writer per --out
        try:
            overrides = {"lengths": args.lengths, "protocol": args.protocol, "stride": args.stride,
                         "tokens": args.tokens, "memory_gb": args.memory_gb}
            probes = parse_probes(args.probe)
            plan = plan_probes(args.runs, args.data, args.split, overrides, probes, args.depth_policy,
                               args.rope_scaling) if probes else []
            sweep_runs(args.runs, args.data, args.split, args.out, overrides, batch_size=args.batch_size,
                       device=_device(args.device), progress=not args.no_progress, depth_policy=args.depth_policy,
                       verify=args.verify_data, rope_scaling=args.rope_scaling)
            if plan and rank == 0:
                run_probes(plan, probes, args.split, args.out, args.probe_depths, args.probe_trials, args.probe_seed,
                           _device(args.device), args.depth_policy, args.rope_scaling)
        except (EvalError, CheckpointError, WriteError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        if rank == 0:
            rows = load_rows(Path(args.out) / "results.jsonl")
            with explain_write_error(args.out, "the report in"):
                written = write_report(rows, args.out, command, probe_threshold=args.probe_threshold)
            print(f"wrote {args.out}/results.jsonl, {', '.join(written)}\n")
            print(console_tables(rows), flush=True)
            if plan:
                print("\n" + probe_tables(rows, args.probe_threshold), flush=True)
    return 0


def console() -> NoReturn:
    """The ``regulargpt-extrapolate`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
