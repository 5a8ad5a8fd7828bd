"""Benchmark: sliding-dilated kernel vs the dense T×T reference vs causal SDPA vs FlexAttention, time, memory, FLOPs.

Every (method, H, T) point runs in a fresh subprocess, so its peak memory is its own (CPU: VmHWM above the RSS just
before the call; CUDA: torch.cuda.max_memory_allocated above the allocation before it). Methods, all forward+backward
unless marked:
  kernel C=c      `sliding_dilated_attention` with dilation C (algorithm `auto`)
  reference       the dense T×T reference; above --reference-max-gib it runs one head at a time (same FLOPs, summed
                  time, memory / H), up to --reference-max-length
  SDPA            causal `scaled_dot_product_attention` (the dense baseline a user would otherwise run)
  flex C=c        FlexAttention over the folded sequence (`algorithm="flex"`, compiled); on CPU forward only
                  (torch 2.13 has no CPU flex backward), compared with `kernel fwd C=c`
  flex causal     (CUDA only) dense causal FlexAttention, the fused baseline a GPU user would otherwise run
Attention FLOPs: 4·H·Dh·(keys per query summed over queries) forward, ×3 with the backward; C keys per query for the
kernel, T(T+1)/2 in total for causal SDPA, T² for the reference (what it computes). They are set against the matmul
peak this script measures first (`matmul_peak_gflops`: square matmuls, same threads and dtype, best over 3 s).

    python eval/bench_attention.py --out results/bench_attention.md
    python eval/bench_attention.py --lengths 512,2048 --chunks 2 --heads 8 --no-flex --out /tmp/b.md   # quick look
    python eval/bench_attention.py --device cuda --lengths 4096,16384,65536,131072 --out results/bench_attention_cuda.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs its own checkout's code (worktrees too)

from regulargpt.cli import positive_float, positive_int  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.peak import machine_key, measure_peak, raise_peak  # noqa: E402
from regulargpt.provenance import git_commit, machine, utc_date  # noqa: E402

_WORKER = textwrap.dedent(
    """
    import json, sys, time, torch
    import torch.nn.functional as F
    from regulargpt.model import sliding_dilated_attention, reference_sliding_dilated_attention
    method, device, dtype_name = sys.argv[1:4]
    t, h, dh, c, threads, reps, heads_per_call = map(int, sys.argv[4:11])
    algorithm = sys.argv[11]
    torch.set_num_threads(threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    cuda = device == "cuda"
    backward = method != "kernel_fwd" and not (method.startswith("flex") and not cuda)
    def status_kib(field):
        return int(next(l for l in open("/proc/self/status") if l.startswith(field + ":")).split()[1])
    def memory_mib():
        return torch.cuda.max_memory_allocated() / 2**20 if cuda else status_kib("VmHWM") / 1024
    def make(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=backward)
    q, k, v = (make(1, h, t, dh) for _ in range(3))
    r = torch.randn(h, c, device=device, requires_grad=backward)
    pk, pv = make(1, h, dh), make(1, h, dh)
    causal_flex_state = {}  # the compiled function and one causal BlockMask per length, built outside the timing
    def causal_flex(qs, ks, vs, n):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if not causal_flex_state:
            causal_flex_state["fn"] = torch.compile(flex_attention)
        if n not in causal_flex_state:
            causal_flex_state[n] = create_block_mask(lambda b, h, i, j: i >= j, None, None, n, n, device=device,
                                                     _compile=True)
        return causal_flex_state["fn"](qs, ks, vs, block_mask=causal_flex_state[n])
    def attend(n, hs):
        qs, ks, vs, ps, pw = q[:, hs, :n], k[:, hs, :n], v[:, hs, :n], pk[:, hs], pv[:, hs]
        if method in ("kernel", "kernel_fwd"):
            return sliding_dilated_attention(qs, ks, vs, r[hs], c, ps, pw, algorithm=algorithm)
        if method == "flex":
            return sliding_dilated_attention(qs, ks, vs, r[hs], c, ps, pw, algorithm="flex")
        if method == "reference":
            return reference_sliding_dilated_attention(qs, ks, vs, r[hs], c, ps, pw)
        if method == "flex_causal":
            return causal_flex(qs, ks, vs, n)
        return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    def run(n):
        for first in range(0, h, heads_per_call):
            with torch.set_grad_enabled(backward):
                out = attend(n, slice(first, first + heads_per_call))
                if backward:
                    out.float().sum().backward()
        if cuda:
            torch.cuda.synchronize()
    run(min(t, 64) if not method.startswith("flex") else t)  # warm-up (flex compiles per shape: warm at T)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = memory_mib() if cuda else status_kib("VmRSS") / 1024
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run(t)
        times.append(time.perf_counter() - start)
    print(json.dumps({"seconds": sorted(times)[len(times) // 2], "peak_mib": memory_mib() - base,
                      "backward": backward}))
    """
)



def measure(method: str, t: int, heads: int, head_dim: int, chunk: int, args: argparse.Namespace,
            heads_per_call: int | None = None) -> dict:
    reps = 3 if t <= 4096 else 1
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20), "OMP_NUM_THREADS": str(args.threads)}
    cmd = [sys.executable, "-c", _WORKER, method, args.device, args.dtype,
           *map(str, (t, heads, head_dim, chunk, args.threads, reps, heads_per_call or heads)), args.kernel_algorithm]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"skipped": f"over {args.timeout:.0f} s"}
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"skipped": f"failed: {last[:80]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def matmul_peak_gflops(device: str, dtype: str, threads: int, seconds: float = 3.0) -> float:
    """The machine's practical matmul peak in GFLOP/s, measured now with the meter training uses for MFU
    (:func:`regulargpt.peak.measure_peak`: best square-matmul triple over `seconds`); a new best is recorded in the
    per-machine peak cache too."""
    flops = measure_peak(device, dtype, threads, seconds)
    raise_peak(machine_key(device, dtype, threads), flops, f"eval/bench_attention.py, over {seconds:g} s")
    return flops / 1e9


def attention_flops(method: str, t: int, heads: int, head_dim: int, chunk: int, backward: bool) -> float:
    """4·H·Dh per (query, key) pair scored (QKᵀ and PV, 2 FLOPs per MAC), ×3 with the backward."""
    pairs = {"sdpa": t * (t + 1) / 2, "flex_causal": t * (t + 1) / 2, "reference": t * t}.get(method, t * min(chunk, t))
    return 4 * heads * head_dim * pairs * (3 if backward else 1)


def dense_reference_gib(t: int, heads: int) -> float:
    """The reference holds about 4 fp32 (H, T, T) tensors through its backward."""
    return 4 * heads * t * t * 4 / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384,32768,65536",
                        help="comma-separated T values (default: %(default)s)")
    parser.add_argument("--chunks", default="2,8,32", help="chunk sizes C for the kernel (default: %(default)s)")
    parser.add_argument("--heads", default="8,12", help="comma-separated head counts H (default: %(default)s)")
    parser.add_argument("--head-dim", type=positive_int, default=64)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="q/k/v dtype (default: fp32)")
    parser.add_argument("--kernel-algorithm", default="auto", choices=["auto", "cpp", "shift", "blocked", "flex"],
                        help="algorithm of the 'kernel' columns (default: auto)")
    parser.add_argument("--threads", type=positive_int, default=2, help="torch threads per measurement (default: 2)")
    parser.add_argument("--reference-max-gib", type=positive_float, default=8.0,
                        help="above this estimate the reference runs one head at a time (default: 8)")
    parser.add_argument("--reference-max-length", type=positive_int, default=16384,
                        help="skip the dense reference above this T (default: %(default)s)")
    parser.add_argument("--sdpa-max-length", type=positive_int, default=32768,
                        help="skip causal SDPA above this T (its O(T²) time gets long on CPU) (default: %(default)s)")
    parser.add_argument("--flex-max-length", type=positive_int, default=65536, help="skip FlexAttention above this T")
    parser.add_argument("--no-flex", action="store_true", help="leave out the FlexAttention columns")
    parser.add_argument("--no-reference", action="store_true", help="leave out the dense reference")
    parser.add_argument("--timeout", type=positive_float, default=900.0, help="seconds per measurement (default: 900)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_attention.md"))
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    chunks = [int(x) for x in args.chunks.split(",")]
    heads_list = [int(x) for x in args.heads.split(",")]
    dh = args.head_dim
    c0 = chunks[0]
    peak = matmul_peak_gflops(args.device, args.dtype, args.threads)
    print(f"matmul peak: {peak:.0f} GFLOP/s ({args.dtype}, {args.threads} threads)", flush=True)

    rows = []
    for h in heads_list:
        for t in lengths:
            row: dict = {"H": h, "T": t, "qkvo_mib": 4 * h * t * dh * (2 if args.dtype == "bf16" else 4) / 2**20}
            for c in chunks:
                row[f"kernel_c{c}"] = measure("kernel", t, h, dh, c, args)
            if args.no_reference:
                row["reference"] = {"skipped": "not run"}
            elif t > args.reference_max_length:
                row["reference"] = {"skipped": f"T > {args.reference_max_length}"}
            elif dense_reference_gib(t, h) <= args.reference_max_gib:
                row["reference"] = measure("reference", t, h, dh, c0, args)
            elif dense_reference_gib(t, 1) <= args.reference_max_gib:
                row["reference"] = {**measure("reference", t, h, dh, c0, args, heads_per_call=1), "per_head": True}
            else:
                row["reference"] = {"skipped": f"needs ~{dense_reference_gib(t, 1):.0f} GiB per head"}
            row["sdpa"] = (measure("sdpa", t, h, dh, c0, args) if t <= args.sdpa_max_length
                           else {"skipped": f"T > {args.sdpa_max_length}"})
            if not args.no_flex:
                flex_ok = t <= args.flex_max_length
                row["flex"] = (measure("flex", t, h, dh, c0, args) if flex_ok
                               else {"skipped": f"T > {args.flex_max_length}"})
                if args.device == "cpu":
                    row["kernel_fwd"] = measure("kernel_fwd", t, h, dh, c0, args)
                else:
                    row["flex_causal"] = measure("flex_causal", t, h, dh, c0, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    atomic_write_text(args.out, render(rows, args, chunks, heads_list, peak))
    print(f"wrote {args.out}")


def render(rows: list[dict], args: argparse.Namespace, chunks: list[int], heads_list: list[int], peak: float) -> str:
    """The markdown report: per H, time with ratios, FlexAttention, memory, and FLOP/s against the peak."""
    c0, dh = chunks[0], args.head_dim
    small = [c for c in chunks if c <= 8]

    def cell(m: dict, key: str, fmt: str) -> str:
        text = format(m[key], fmt) if key in m else m.get("skipped", "-")
        return text + (" (head by head)" if m.get("per_head") and key == "seconds" else "")

    def ratio(num: dict, den: dict) -> str:
        return f"{num['seconds'] / den['seconds']:.1f}×" if "seconds" in num and "seconds" in den else "-"

    methods = [f"kernel_c{c}" for c in chunks] + ["reference", "sdpa"]
    names = [f"kernel C={c}" for c in chunks] + [f"dense reference (C={c0})", "causal SDPA"]
    lines = [
        f"# Attention benchmark: forward + backward, {args.dtype}, {args.device}",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Git commit: {git_commit()}  ",
        f"Machine: {machine()}, torch threads {args.threads}  ",
        f"Date: {utc_date()}  ",
        f"Shapes: B=1, Dh={dh}, with pad key/value; kernel dilation = C, algorithm `{args.kernel_algorithm}`. Peak "
        "memory is above the baseline before the call, in a fresh process per point. Median of 3 runs for "
        f"T <= 4096, else 1 run. Measured matmul peak: **{peak:.0f} GFLOP/s** ({args.dtype}).",
    ]
    for h in heads_list:
        hrows = [r for r in rows if r["H"] == h]
        ratio_heads = [f"reference / kernel C={c}" for c in small] + [f"SDPA / kernel C={c}" for c in small]
        lines += ["", f"## H = {h}", "", "### Time (seconds)", "",
                  "| T | " + " | ".join(names + ratio_heads) + " |", "|---|" + "---|" * (len(names) + len(ratio_heads))]
        for r in hrows:
            ratios = [ratio(r["reference"], r[f"kernel_c{c}"]) for c in small]
            ratios += [ratio(r["sdpa"], r[f"kernel_c{c}"]) for c in small]
            lines.append(f"| {r['T']} | " + " | ".join([cell(r[m], "seconds", ".4f") for m in methods] + ratios) + " |")
        if any("flex" in r for r in hrows):
            fwd_only = args.device == "cpu"
            if fwd_only:
                lines += ["", f"### FlexAttention, C={c0} (forward only: no CPU backward in torch 2.13)", "",
                          "| T | flex (s) | kernel forward (s) | flex / kernel |", "|---|---|---|---|"]
                for r in hrows:
                    lines.append(f"| {r['T']} | {cell(r['flex'], 'seconds', '.4f')} | "
                                 f"{cell(r['kernel_fwd'], 'seconds', '.4f')} | {ratio(r['flex'], r['kernel_fwd'])} |")
            else:
                lines += ["", "### FlexAttention (forward + backward)", "",
                          f"| T | sliding-dilated flex C={c0} (s) | causal flex (s) | causal flex / sliding flex |",
                          "|---|---|---|---|"]
                for r in hrows:
                    lines.append(f"| {r['T']} | {cell(r['flex'], 'seconds', '.4f')} | "
                                 f"{cell(r['flex_causal'], 'seconds', '.4f')} | {ratio(r['flex_causal'], r['flex'])} |")
        lines += ["", "### Peak memory above baseline (MiB)", "",
                  "| T | q/k/v/out tensors | " + " | ".join(names) + f" | kernel C={c0} / tensors |",
                  "|---|---|" + "---|" * (len(names) + 1)]
        for r in hrows:
            k0 = r[f"kernel_c{c0}"]
            over = f"{k0['peak_mib'] / r['qkvo_mib']:.2f}×" if "peak_mib" in k0 else "-"
            lines.append(f"| {r['T']} | {r['qkvo_mib']:.0f} | " + " | ".join(cell(r[m], "peak_mib", ".0f") for m in methods)
                         + f" | {over} |")
        lines += ["", f"### Attention GFLOP/s (share of the {peak:.0f} GFLOP/s matmul peak)", "",
                  "| T | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for r in hrows:
            cells = []
            for m, c in zip(methods, chunks + [c0, c0]):
                if "seconds" not in r[m]:
                    cells.append("-")
                    continue
                gflops = attention_flops(m.split("_")[0], r["T"], h, dh, c, True) / r[m]["seconds"] / 1e9
                cells.append(f"{gflops:.1f} ({gflops / peak:.1%})")
            lines.append(f"| {r['T']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
