"""Sliding-dilated attention forward + backward, timed around the kernels alone, against the memory floors.

For each T × C × dilation (the dilations the depth steps use: 1, C, C², … below T) and each algorithm: inputs made
once (B, H, T, Dh leaves, pads), gradients reset with ``.grad = None`` between repetitions, a warm-up, then
``--reps`` timed forward + backward calls. CUDA: device time from CUDA events recorded around each call; CPU: wall
clock (marked ``wall``). Printed: median and p10/p90 in ms, the two floors

    floor_8  = 8  · B·T·H·Dh · itemsize / bandwidth   (q, k, v, dO read; o, dq, dk, dv written, once each)
    floor_11 = 11 · B·T·H·Dh · itemsize / bandwidth   (forward q, k, v read, o written; backward q, k, v, dO read,
                                                       dq, dk, dv written: the unfused minimum)

with the datasheet bandwidth (regulargpt/peak.py; none on CPU), the ratio median ÷ floor_11, whether output and
gradients matched the fp32 ``shift`` result on the same inputs, and for triton on CUDA the registers and spills
of each compiled kernel. An error in one row is that row. ``sdpa`` is a causal scaled_dot_product_attention
yardstick (dense causal, one row per T).

    python eval/bench_kernel_gpu.py --device cuda --lengths 16384,65536 --chunks 8,16 --dtype bf16 --reps 20 \\
        --out X.md --jsonl X.jsonl
    python eval/bench_kernel_gpu.py --device cuda --dispatch-table regulargpt/kernels/dispatch_cuda.json
    python eval/bench_kernel_gpu.py --device cpu --lengths 1024 --chunks 4 --dtype fp32 --reps 3 --out X.md
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.peak import datasheet_bandwidth  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ALGORITHMS = ("triton", "blocked", "shift", "sdpa")
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}  # max error ÷ max(1, |shift fp32|)


def depth_dilations(length: int, chunk: int) -> list[int]:
    """1, C, C², … below T: the dilation of every depth step of adaptive depth at length T.

    >>> depth_dilations(16384, 8), depth_dilations(1024, 4)
    ([1, 8, 64, 512, 4096], [1, 4, 16, 64, 256])
    """
    out, d = [], 1
    while d < length:
        out.append(d)
        d *= chunk
    return out or [1]


def _inputs(length: int, chunk: int, heads: int, head_dim: int, dtype: torch.dtype, device: str) -> list:
    gen = torch.Generator().manual_seed(0)
    shapes = [(1, heads, length, head_dim)] * 3 + [(heads, chunk), (1, heads, head_dim), (1, heads, head_dim)]
    return [(torch.randn(*s, generator=gen) * (0.02 if len(s) == 2 else 1)).to(device, dtype).requires_grad_()
            for s in shapes]


def _step(algorithm: str, leaves: list, dilation: int, dout: torch.Tensor) -> Callable[[], None]:
    from regulargpt.model.sliding_dilated import sliding_dilated_attention

    q, k, v, r, pk, pv = leaves
    if algorithm == "sdpa":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
    return lambda: sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm).backward(dout)


def _times(step: Callable[[], None], leaves: list, device: str, reps: int) -> list[float]:
    """Seconds per forward + backward: CUDA events on CUDA, wall clock elsewhere; grads reset before each call."""
    def reset() -> None:
        for x in leaves:
            x.grad = None

    for _ in range(2):  # warm-up: kernel builds, allocator
        reset()
        step()
    out = []
    for _ in range(reps):
        reset()
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            step()
            out.append(time.perf_counter() - begin)
    return out


def _error(algorithm: str, leaves: list, dilation: int, dout: torch.Tensor, want: list) -> float:
    """Worst of output and gradient errors ÷ max(1, |want|) against the fp32 shift result."""
    from regulargpt.model.sliding_dilated import sliding_dilated_attention

    for x in leaves:
        x.grad = None
    out = sliding_dilated_attention(*leaves[:4], dilation, *leaves[4:], algorithm=algorithm)
    out.backward(dout)
    got = [out.detach()] + [x.grad for x in leaves]
    return max(float((a.float() - b).abs().max()) / max(1.0, float(b.abs().max())) for a, b in zip(got, want))


def _shift_fp32(leaves: list, dilation: int, dout: torch.Tensor) -> list:
    from regulargpt.model.sliding_dilated import sliding_dilated_attention

    up = [x.detach().float().requires_grad_() for x in leaves]
    out = sliding_dilated_attention(*up[:4], dilation, *up[4:], algorithm="shift")
    out.backward(dout.float())
    return [out.detach()] + [x.grad for x in up]


def triton_resources() -> str:
    """'kernel regs/spills, …' of the compiled Triton kernels in this process (CUDA), or why it is unknown."""
    try:
        from regulargpt.kernels import sliding_dilated_triton as kernels

        parts = []
        for name in ("_forward_kernel", "_query_backward_kernel", "_key_backward_kernel"):
            fn = getattr(kernels, name, None)
            while fn is not None and not hasattr(fn, "device_caches"):
                fn = getattr(fn, "fn", None)  # through an Autotuner
            found = set()
            for entry in (fn.device_caches.values() if fn is not None else []):
                cache = entry[0] if isinstance(entry, tuple) else entry
                for compiled in cache.values():
                    if hasattr(compiled, "_init_handles"):
                        compiled._init_handles()
                    found.add((compiled.n_regs, compiled.n_spills))
            parts.append(f"{name.strip('_')} " + ", ".join(f"{r} regs/{s} spills" for r, s in sorted(found)))
        return "; ".join(parts)
    except Exception as exc:  # noqa: BLE001 (a Triton release without these attributes: said, not fatal)
        return f"unknown ({type(exc).__name__}: {exc})"


def measure(device: str, lengths: list[int], chunks: list[int], dtype: torch.dtype, reps: int,
            algorithms: list[str], heads: int, head_dim: int, log: Callable[[dict], None]) -> list[dict]:
    """One row per (T, C, D, algorithm) (sdpa: per T), each a dict; errors become rows with "error"."""
    from regulargpt.model.sliding_dilated import algorithms_on

    runnable = algorithms_on(device.split(":")[0]) + ["sdpa"]
    sheet = datasheet_bandwidth(device)
    rows = []
    for t in lengths:
        for c in chunks:
            for d in depth_dilations(t, c):
                leaves = _inputs(t, c, heads, head_dim, dtype, device)
                dout = torch.randn_like(leaves[0])
                want = None
                tensor_bytes = leaves[0].numel() * leaves[0].element_size()
                for name in algorithms:
                    if name == "sdpa" and (c, d) != (chunks[0], 1):
                        continue  # one yardstick row per T
                    row = {"device": device, "T": t, "C": c, "D": d, "algorithm": name, "dtype": str(dtype),
                           "clock": "cuda events" if device.startswith("cuda") else "wall"}
                    if sheet:
                        row["floor8_ms"], row["floor11_ms"] = (n * tensor_bytes / sheet[0] * 1e3 for n in (8, 11))
                    if name not in runnable:
                        row["error"] = f"skipped: does not run on {device}"
                    else:
                        try:
                            seconds = _times(_step(name, leaves, d, dout), leaves, device, reps)
                            q = statistics.quantiles(seconds, n=10) if len(seconds) > 1 else seconds * 9
                            row.update(median_ms=statistics.median(seconds) * 1e3, p10_ms=q[0] * 1e3,
                                       p90_ms=q[-1] * 1e3)
                            if name != "sdpa":
                                want = want if want is not None else _shift_fp32(leaves, d, dout)
                                row["error_rel"] = _error(name, leaves, d, dout, want)
                                row["correct"] = row["error_rel"] <= TOLERANCE[dtype]
                            if name == "triton" and device.startswith("cuda"):
                                row["resources"] = triton_resources()
                        except Exception as exc:  # noqa: BLE001 (one row's failure is that row)
                            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                    if "floor11_ms" in row and "median_ms" in row:
                        row["ratio11"] = row["median_ms"] / row["floor11_ms"]
                    rows.append(row)
                    log(row)
                del leaves, dout, want
                if device.startswith("cuda"):
                    torch.cuda.empty_cache()
    return rows


def dispatch_table(rows: list[dict], dtype: torch.dtype, command: str) -> dict:
    """The dispatch_cuda.json format (regulargpt/kernels/dispatch_cuda.py) from measured rows: per cell the fastest
    algorithm whose result was correct."""
    cells = []
    for key in sorted({(r["T"], r["C"], r["D"]) for r in rows if r["algorithm"] != "sdpa"}):
        ok = {r["algorithm"]: round(r["median_ms"], 4) for r in rows if (r["T"], r["C"], r["D"]) == key
              and r["algorithm"] != "sdpa" and r.get("correct")}
        if ok:
            cells.append({"length": key[0], "chunk": key[1], "dilation": key[2], "dtype_bytes": dtype.itemsize,
                          "fastest": min(ok, key=ok.get), "ms": ok})
    return {"reach_log2": 1, "source": command, "cells": cells}


def table_from_check(markdown: Path) -> dict:
    """The table from an `eval/gpu_steps.py bench` report (its fixed shape: C = 8, dilation 8, B 1, Dh 64), e.g.
    results/gpu/check/kernels.md: one cell per T, its fastest algorithm among triton/blocked/shift. Read, not
    typed: the cell's milliseconds are the report's."""
    text = markdown.read_text()
    dtype_bytes = 2 if re.search(r"\bbf16\b|\bfp16\b", text.splitlines()[0]) else 4
    times: dict[int, dict[str, float]] = {}
    for t, name, ms in re.findall(r"^\| (\d+) \| (triton|blocked|shift) \| ([\d.]+) \|", text, re.M):
        times.setdefault(int(t), {})[name] = float(ms)
    cells = [{"length": t, "chunk": 8, "dilation": 8, "dtype_bytes": dtype_bytes, "fastest": min(ms, key=ms.get),
              "ms": ms} for t, ms in sorted(times.items())]
    return {"reach_log2": 3, "source": f"{markdown} (eval/gpu_steps.py bench: C 8, dilation 8; correctness of every "
            "algorithm: results/gpu/check/correctness.md)", "cells": cells}


def _markdown(rows: list[dict], command: str, device: str) -> str:
    sheet = datasheet_bandwidth(device)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"
    lines = ["# Sliding-dilated attention, forward + backward, against the memory floors", "",
             f"`{command}`  ", f"commit {commit.strip()}, torch {torch.__version__}, {name}; " +
             (f"datasheet bandwidth {sheet[0] / 1e12:.2f} TB/s ({sheet[1]})" if sheet else "no datasheet bandwidth "
              "(no floors)") + "; times are " + ("CUDA-event device time" if device.startswith("cuda") else
                                                   "wall clock (CPU)"), "",
             "| T | C | D | algorithm | median ms | p10 ms | p90 ms | floor 8 ms | floor 11 ms | ÷ floor 11 | "
             "correct (err) | registers / spills |", "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]
    fmt = lambda x: "–" if x is None else f"{x:.3f}"  # noqa: E731
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['T']} | {r['C']} | {r['D']} | {r['algorithm']} | {r['error']} |||||||")
            continue
        ok = "–" if "correct" not in r else f"{'yes' if r['correct'] else 'NO'} ({r['error_rel']:.1e})"
        ratio = f"{r['ratio11']:.1f}×" if "ratio11" in r else "–"
        lines.append(f"| {r['T']} | {r['C']} | {r['D']} | {r['algorithm']} | {fmt(r['median_ms'])} | "
                     f"{fmt(r['p10_ms'])} | {fmt(r['p90_ms'])} | {fmt(r.get('floor8_ms'))} | "
                     f"{fmt(r.get('floor11_ms'))} | {ratio} | {ok} | {r.get('resources', '–')} |")
    return "\n".join(lines) + "\n"


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cuda, cuda:1, cpu")
    parser.add_argument("--lengths", type=_ints, default=[16384, 65536], help="e.g. 16384,65536")
    parser.add_argument("--chunks", type=_ints, default=[8, 16], help="e.g. 8,16")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions after 2 warm-up calls (default 20)")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS), help=f"subset of {','.join(ALGORITHMS)}")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--out", type=Path, help="markdown report")
    parser.add_argument("--jsonl", type=Path, help="one JSON object per row")
    parser.add_argument("--dispatch-table", type=Path, metavar="OUT.json",
                        help="measure the dispatch grid (T 512,4096,16384,65536 × C 2,4,8,16 unless --lengths/"
                        "--chunks are given) and write `auto`'s CUDA table")
    parser.add_argument("--table-from-check", type=Path, metavar="KERNELS.md",
                        help="write the table (to --dispatch-table) from an eval/gpu_steps.py bench report; no timing")
    args = parser.parse_args(argv)
    algorithms = [a for a in args.algorithms.split(",") if a]
    if bad := [a for a in algorithms if a not in ALGORITHMS]:
        parser.error(f"--algorithms: unknown {bad}; choose from {', '.join(ALGORITHMS)}")
    if args.reps < 1:
        parser.error(f"--reps must be >= 1; got {args.reps}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: no CUDA device here; use --device cpu")
    command = "python eval/bench_kernel_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.table_from_check:
        if not args.dispatch_table:
            parser.error("--table-from-check needs --dispatch-table OUT.json")
        atomic_write_text(args.dispatch_table, json.dumps(table_from_check(args.table_from_check), indent=1) + "\n")
        print(args.dispatch_table.read_text())
        return 0
    if args.dispatch_table and "--lengths" not in command:
        args.lengths = [512, 4096, 16384, 65536]
    if args.dispatch_table and "--chunks" not in command:
        args.chunks = [2, 4, 8, 16]
    if args.jsonl:
        args.jsonl.parent.mkdir(parents=True, exist_ok=True)
        args.jsonl.write_text("")

    def log(row: dict) -> None:
        print(json.dumps(row), flush=True)
        if args.jsonl:
            with args.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")

    rows = measure(args.device, args.lengths, args.chunks, DTYPES[args.dtype], args.reps, algorithms, args.heads,
                   args.head_dim, log)
    text = _markdown(rows, command, args.device)
    print(text)
    if args.out:
        atomic_write_text(args.out, text)
    if args.dispatch_table:
        table = dispatch_table(rows, DTYPES[args.dtype], command)
        atomic_write_text(args.dispatch_table, json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
