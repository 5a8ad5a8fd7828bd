"""Benchmark: sliding-dilated kernel vs the dense T×T reference vs causal SDPA, forward+backward time and peak memory.

Every (method, T) point runs in a fresh subprocess, so its peak memory (VmHWM above the RSS just before the call)
is its own. Writes a markdown report with the command, git commit, machine and date.

    python eval/bench_attention.py --out results/bench_attention.md
    python eval/bench_attention.py --lengths 512,2048,8192 --chunks 2 --out /tmp/b.md   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from regulargpt.io import atomic_write_text

_WORKER = textwrap.dedent(
    """
    import json, sys, time, torch
    import torch.nn.functional as F
    from regulargpt.model import sliding_dilated_attention, reference_sliding_dilated_attention
    method, t, h, dh, c, threads, reps = sys.argv[1], *map(int, sys.argv[2:8])
    torch.set_num_threads(threads)
    def status_kib(field):
        return int(next(l for l in open("/proc/self/status") if l.startswith(field + ":")).split()[1])
    q, k, v = (torch.randn(1, h, t, dh, requires_grad=True) for _ in range(3))
    r = torch.randn(h, c, requires_grad=True)
    pk, pv = (torch.randn(1, h, dh, requires_grad=True) for _ in range(2))
    def run(n):
        if method == "kernel":
            out = sliding_dilated_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], r, c, pk, pv)
        elif method == "reference":
            out = reference_sliding_dilated_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], r, c, pk, pv)
        else:
            out = F.scaled_dot_product_attention(q[:, :, :n], k[:, :, :n], v[:, :, :n], is_causal=True)
        out.sum().backward()
    run(min(t, 64))  # warm-up of kernels and autograd on a short input
    base = status_kib("VmRSS")
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run(t)
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": sorted(times)[len(times) // 2], "peak_mib": (status_kib("VmHWM") - base) / 1024}))
    """
)


def measure(method: str, t: int, heads: int, head_dim: int, chunk: int, threads: int, timeout: float) -> dict:
    reps = 3 if t <= 4096 else 1
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20), "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, "-c", _WORKER, method, str(t), str(heads), str(head_dim), str(chunk), str(threads), str(reps)]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over {timeout:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"skipped": f"failed: {last[:80]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dense_reference_gib(t: int, heads: int) -> float:
    """The reference holds about 4 fp32 (H, T, T) tensors through its backward."""
    return 4 * heads * t * t * 4 / 2**30


def machine() -> str:
    cpu = "unknown CPU"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384,32768,65536",
                        help="comma-separated T values (default: %(default)s)")
    parser.add_argument("--chunks", default="2,8", help="chunk sizes C for the kernel (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per measurement (default: 2)")
    parser.add_argument("--reference-max-gib", type=float, default=8.0,
                        help="skip the dense reference when its T×T tensors would exceed this (default: 8)")
    parser.add_argument("--sdpa-max-length", type=int, default=32768,
                        help="skip causal SDPA above this T (its O(T²) time gets long on CPU) (default: 32768)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per measurement (default: 600)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_attention.md"))
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    h, dh = args.heads, args.head_dim

    rows = []
    for t in lengths:
        row: dict = {"T": t, "qkvo_mib": 4 * h * t * dh * 4 / 2**20}
        for c in chunks:
            row[f"kernel_c{c}"] = measure("kernel", t, h, dh, c, args.threads, args.timeout)
        if dense_reference_gib(t, h) <= args.reference_max_gib:
            row["reference"] = measure("reference", t, h, dh, chunks[0], args.threads, args.timeout)
        else:
            row["reference"] = {"skipped": f"needs ~{dense_reference_gib(t, h):.0f} GiB"}
        row["sdpa"] = (measure("sdpa", t, h, dh, 2, args.threads, args.timeout) if t <= args.sdpa_max_length
                       else {"skipped": f"T > {args.sdpa_max_length}"})
        rows.append(row)
        print(json.dumps(row), flush=True)

    def cell(m: dict, key: str, fmt: str) -> str:
        return format(m[key], fmt) if key in m else m.get("skipped", "-")

    methods = [f"kernel_c{c}" for c in chunks] + ["reference", "sdpa"]
    names = [f"kernel C={c}" for c in chunks] + ["dense reference", "causal SDPA"]
    lines = [
        "# Attention benchmark: forward + backward, fp32",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Git commit: {git_commit()}  ",
        f"Machine: {machine()}, torch threads {args.threads}  ",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  ",
        f"Shapes: B=1, H={h}, Dh={dh}; kernel dilation = C; reference at C={chunks[0]}. Peak memory is VmHWM above "
        "the RSS before the call, in a fresh process per point. Median of 3 runs for T <= 4096, else 1 run.",
        "",
        "## Time (seconds)",
        "",
        "| T | " + " | ".join(names) + f" | reference / kernel C={chunks[0]} | SDPA / kernel C={chunks[0]} |",
        "|---|" + "---|" * (len(names) + 2),
    ]
    for row in rows:
        k0 = row[f"kernel_c{chunks[0]}"]
        ratios = [f"{row[m]['seconds'] / k0['seconds']:.1f}×" if "seconds" in row[m] and "seconds" in k0 else "-"
                  for m in ("reference", "sdpa")]
        lines.append(f"| {row['T']} | " + " | ".join(cell(row[m], "seconds", ".4f") for m in methods)
                     + " | " + " | ".join(ratios) + " |")
    lines += ["", "## Peak memory above baseline (MiB)", "",
              "| T | q/k/v/out tensors | " + " | ".join(names) + f" | kernel C={chunks[0]} / tensors |",
              "|---|---|" + "---|" * (len(names) + 1)]
    for row in rows:
        k0 = row[f"kernel_c{chunks[0]}"]
        ratio = f"{k0['peak_mib'] / row['qkvo_mib']:.2f}×" if "peak_mib" in k0 else "-"
        lines.append(f"| {row['T']} | {row['qkvo_mib']:.0f} | " + " | ".join(cell(row[m], "peak_mib", ".0f") for m in methods)
                     + f" | {ratio} |")
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
