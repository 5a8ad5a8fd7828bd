"""Benchmark: which exact CPU band algorithm (shift or blocked) is faster, per (C, dilation, T, dtype).

For every depth step l < ceil(log_C T) of every (T, C) (dilation D = C**l, folded length N = ceil(T/D)), times one
forward + backward of `sliding_dilated_attention(..., algorithm=a)` for a in {shift, blocked}, in fp32 and in bf16
(q, k, v in bf16, as under autocast), and reports the winner and the time `auto` loses against the best of the two.
This is the measurement behind `regulargpt.model.sliding_dilated.choose_band`. The raw rows go next to the
report (`<out>.jsonl`); `--rows` re-renders a report from them with the current rule, without measuring again.

    python eval/bench_dispatch.py --out results/bench_dispatch.md
    python eval/bench_dispatch.py --rows results/bench_dispatch.jsonl --out results/bench_dispatch.md
    python eval/bench_dispatch.py --lengths 512 --chunks 2,8 --dtypes bf16 --out /tmp/d.md   # quick look
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regulargpt.cli import positive_int  # noqa: E402
from regulargpt.files import atomic_write_text, read_jsonl  # noqa: E402
from regulargpt.model.sliding_dilated import adaptive_depth, choose_band, sliding_dilated_attention  # noqa: E402
from regulargpt.provenance import git_commit, machine, utc_date  # noqa: E402

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def time_call(algorithm: str, t: int, c: int, dilation: int, heads: int, head_dim: int, batch: int,
              dtype: torch.dtype, reps: int) -> float:
    """Median seconds of one forward + backward with pads (the model's sliding mode)."""
    q, k, v = (torch.randn(batch, heads, t, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
    pk, pv = (torch.randn(batch, heads, head_dim, dtype=dtype, requires_grad=True) for _ in range(2))
    r = torch.randn(heads, c, requires_grad=True)
    times = []
    for rep in range(reps + 1):
        start = time.perf_counter()
        sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm).float().sum().backward()
        if rep:  # the first call is a warm-up
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,4096,16384", help="comma-separated T (default: %(default)s)")
    parser.add_argument("--chunks", default="2,3,4,8,16,32", help="comma-separated C (default: %(default)s)")
    parser.add_argument("--dtypes", default="fp32,bf16", help="fp32 and/or bf16 (default: %(default)s)")
    parser.add_argument("--heads", type=positive_int, default=8)
    parser.add_argument("--head-dim", type=positive_int, default=64)
    parser.add_argument("--batch", type=positive_int, default=1)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--reps", type=positive_int, default=3, help="timed repeats per point, median reported (default: 3)")
    parser.add_argument("--rows", type=Path, help="render from these measured rows (JSON lines) instead of measuring")
    parser.add_argument("--out", type=Path, default=Path("results/bench_dispatch.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.rows and not args.rows.is_file():
        parser.error(f"--rows: no such file {args.rows}")
    rows = read_jsonl(args.rows) if args.rows else measure_grid(args, parser)
    if not args.rows:
        atomic_write_text(args.out.with_suffix(".jsonl"), "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(args.out, render(rows, args))
    print(f"wrote {args.out}")


def measure_grid(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[dict]:
    rows = []
    for name in args.dtypes.split(","):
        if name not in _DTYPES:
            parser.error(f"--dtypes: unknown dtype {name!r}; expected fp32 or bf16")
        for t in (int(x) for x in args.lengths.split(",")):
            for c in (int(x) for x in args.chunks.split(",")):
                for level in range(adaptive_depth(t, c)):
                    d = c**level
                    n = -(-t // d)
                    row = {"dtype": name, "T": t, "C": c, "D": d, "N": n}
                    for algorithm in ("shift", "blocked"):
                        row[algorithm] = time_call(algorithm, t, c, d, args.heads, args.head_dim, args.batch,
                                                   _DTYPES[name], args.reps)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def render(rows: list[dict], args: argparse.Namespace) -> str:
    """The markdown table; `auto` is what the current `choose_band` picks for each measured point."""
    for row in rows:
        row["auto"] = choose_band(row["C"], row["D"], row["T"], _DTYPES[row["dtype"]])
    measured = f"`python {' '.join(sys.argv)}`" if not args.rows else f"rows from `{args.rows}`"
    lines = [
        "# CPU band algorithm per (C, dilation, T, dtype): shift vs blocked, forward + backward",
        "",
        f"Command: `python {' '.join(sys.argv)}` ({measured})  ",
        f"Git commit: {git_commit()}  ",
        f"Machine: {machine()}, torch threads {args.threads}  ",
        f"Date: {utc_date()}  ",
        f"Shapes: B={args.batch}, H={args.heads}, Dh={args.head_dim}, with pads; median of {args.reps} runs. "
        "N = ceil(T/D) is the folded length. `auto` is what `choose_band` picks; 'auto loss' is its time over "
        "the faster of the two.",
        "",
        "| dtype | T | C | D | N | shift (ms) | blocked (ms) | faster | auto | auto loss |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    total_auto = total_best = 0.0
    for row in rows:
        best = min(row["shift"], row["blocked"])
        total_auto += row[row["auto"]]
        total_best += best
        faster = "shift" if row["shift"] <= row["blocked"] else "blocked"
        lines.append(f"| {row['dtype']} | {row['T']} | {row['C']} | {row['D']} | {row['N']} | {row['shift'] * 1e3:.1f} "
                     f"| {row['blocked'] * 1e3:.1f} | {faster} | {row['auto']} | {row[row['auto']] / best:.2f}× |")
    lines += ["", f"Sum over all points: auto {total_auto:.2f} s, best-of-two {total_best:.2f} s "
              f"({total_auto / total_best:.3f}×)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
