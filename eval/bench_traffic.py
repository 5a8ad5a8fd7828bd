"""Benchmark: the sliding-dilated kernel against the memory-traffic floor of this machine.

The kernel does ~1 FLOP per byte it must move, so FLOPs are the wrong yardstick. In one process this script
1. measures the memory bandwidth (STREAM-like, arrays far larger than the caches, best of `--reps`):
   copy ``b[:] = a`` moves 2·n·4 bytes, triad ``a = b + s·c`` moves 3·n·4 bytes;
2. counts the bytes a forward+backward must move at least once: q, k, v, out, dout, dq, dk, dv (8 tensors of
   B·H·T·Dh elements), the pads and their gradients (4·B·H·Dh) and the window scalars and theirs (2·H·C fp32);
3. times the kernel forward+backward (``out.backward(dout)``, dout allocated outside the timing), median of `--reps`
   taken in rotation over the algorithms (one repetition of each, then the next),
   eager and under ``torch.compile`` (unless ``--no-compile``), for each of `--algorithms` (auto, cpp, cpp-tiles,
   cpp-rows, shift, blocked; the fused C++ operator "cpp" is auto's choice on CPU; "cpp-tiles" is the same operator
   with its head sweep switched off, i.e. the tiled kernel on every geometry; "cpp-rows" with the sweep's backward on
   rows, its lanes across chains switched off; "cpp-steps" with its one-chain units switched off, so that G follows
   the rings' byte budget everywhere);
4. profiles one forward+backward with ``torch.profiler`` (shapes recorded): the number of leaf ATen ops and the
   bytes their inputs hold (Σ over leaf ops of the elements of every tensor input × the element size of the run's
   dtype, fp32 for the fp32 scores): a lower bound on what the separate ops read, i.e. the passes over memory
   that fusing would remove.

Reported per (T, C, dtype): time ÷ floor, where floor = bytes ÷ the best bandwidth the run measured (and ÷ the triad
measured again just before that configuration's rows: bandwidth drifts on shared machines); time ÷ the compute
floor, 12·B·H·T·C·Dh FLOPs (:func:`kernel_flops`) at the measured fp32 matmul rate (at large C the kernel has more
FLOPs than bytes: the compute floor can exceed a multiple of the memory floor); and the op traffic as a multiple
of the floor's bytes. Worked example (the issue's): T = 65536, H·Dh = 512, fp32: 8 · 65536 · 512 · 4 B =
1.07 GB; at 50 GB/s the floor is 21 ms.

    python eval/bench_traffic.py --out results/bench_traffic.md
    python eval/bench_traffic.py --lengths 16384 --chunks 2 --dtypes fp32 --reps 2      # quick look
    python eval/bench_traffic.py --lengths 16384 --chunks 2,4,8 --dtypes fp32 --algorithms cpp,shift --no-compile
    python eval/bench_traffic.py --lengths 65536 --chunks 2,8,16 --algorithms cpp,cpp-tiles --no-compile --reps 5
    python eval/bench_traffic.py --lengths 65536 --chunks 8,16 --algorithms cpp,cpp-rows --no-compile --reps 7
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import shlex
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs its own checkout's code (worktrees too)

import torch  # noqa: E402

from regulargpt.cli import positive_float, positive_int  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.kernels.sliding_dilated_cpp import chain_lanes, head_sweep, head_sweep_isa, one_chain  # noqa: E402
from regulargpt.model import sliding_dilated_attention  # noqa: E402
from regulargpt.provenance import provenance, stamp_lines  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_CPP_VARIANTS = ("cpp-tiles", "cpp-rows", "cpp-steps")  # the C++ operator with part of its head sweep switched off
ALGORITHMS = ("auto", "cpp", *_CPP_VARIANTS, "shift", "blocked")


def stream_bandwidth(gib: float = 1.0, reps: int = 5) -> dict[str, float]:
    """Best copy and triad bandwidth in GB/s over `reps` passes of fp32 arrays of `gib` GiB each."""
    n = int(gib * 2**30) // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.ones(n)
    best = {"copy": 0.0, "triad": 0.0}
    for _ in range(reps):
        start = time.perf_counter()
        b.copy_(a)
        best["copy"] = max(best["copy"], 2 * n * 4 / (time.perf_counter() - start) / 1e9)
        start = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        best["triad"] = max(best["triad"], 3 * n * 4 / (time.perf_counter() - start) / 1e9)
    return best


def floor_bytes(batch: int, heads: int, t: int, head_dim: int, chunk: int, element: int) -> int:
    """Bytes a forward+backward must move at least once: 8 (B, H, T, Dh) tensors, pads and their gradients,
    window scalars and theirs (fp32). E.g. (1, 8, 65536, 64, 2, 4) → 8·2^25·4 + 4·512·4 + 2·16·4 = 1,073,750,144."""
    return 8 * batch * heads * t * head_dim * element + 4 * batch * heads * head_dim * element + 2 * heads * chunk * 4


def kernel_flops(batch: int, heads: int, t: int, head_dim: int, chunk: int) -> int:
    """Multiply-add FLOPs of one forward+backward, 2 per multiply-add: per (query, head) the forward's C scores and
    C-term output (2 · 2·C·Dh) and the backward's dP, dq, dk, dv (4 · 2·C·Dh) = 12·C·Dh. E.g. (1, 8, 65536, 64, 16)
    → 12 · 8 · 65536 · 16 · 64 = 6,442,450,944."""
    return 12 * batch * heads * t * chunk * head_dim


def matmul_rate(reps: int = 3, size: int = 1536) -> float:
    """Best fp32 GFLOP/s of a (size × size) @ (size × size) matmul at the current thread count: the machine's
    attainable multiply-add rate (the C++ kernel computes in fp32 for bf16 inputs too)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)  # warm-up
    best = 0.0
    for _ in range(reps):
        start = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


LAYOUTS = ("heads", "projection")


def _inputs(batch: int, heads: int, t: int, head_dim: int, chunk: int, dtype: torch.dtype,
            layout: str = "heads") -> tuple:
    """q, k, v (B, H, T, Dh): "heads" stores each contiguously (a head's rows adjacent); "projection" makes them
    views of one (B, T, 3·H·Dh) leaf, as the model's qkv projection does (rows 3·H·Dh apart), with dout
    (B, T, H, Dh) seen as (B, H, T, Dh)."""
    torch.manual_seed(0)
    if layout == "projection":
        qkv = torch.randn(batch, t, 3 * heads * head_dim, dtype=dtype, requires_grad=True)
        # as the model splits it (regulargpt/model/layers.py): chunks of the last dim, one cat joins their gradients
        q, k, v = (x.view(batch, t, heads, head_dim).transpose(1, 2) for x in qkv.chunk(3, dim=-1))
    else:
        q, k, v = (torch.randn(batch, heads, t, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
    pad_k, pad_v = (torch.randn(batch, heads, head_dim, dtype=dtype, requires_grad=True) for _ in range(2))
    rel_bias = torch.randn(heads, chunk, requires_grad=True)
    if layout == "projection":
        dout = torch.randn(batch, t, heads, head_dim, dtype=dtype).transpose(1, 2)
    else:
        dout = torch.randn(batch, heads, t, head_dim, dtype=dtype)
    return q, k, v, pad_k, pad_v, rel_bias, dout


def forward_backward(inputs: tuple, chunk: int, attention=sliding_dilated_attention) -> None:
    q, k, v, pad_k, pad_v, rel_bias, dout = inputs
    for x in (q, k, v, pad_k, pad_v, rel_bias):
        (x if x.is_leaf else x._base).grad = None  # a projection's view: its (B, T, 3·H·Dh) leaf
    attention(q, k, v, rel_bias, chunk, pad_k, pad_v).backward(dout)


def _timed(inputs: tuple, chunk: int, reps: int, attention=sliding_dilated_attention) -> float:
    forward_backward(inputs, chunk, attention)  # warm-up (and compilation)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        forward_backward(inputs, chunk, attention)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def op_traffic(inputs: tuple, chunk: int, element: int, attention=sliding_dilated_attention) -> tuple[int, int]:
    """(leaf ATen ops, bytes of their tensor inputs) of one forward+backward, from torch.profiler's shapes; tensors
    of the run's dtype count `element` bytes, and so do fp32 score tensors here (a lower bound for bf16 runs)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        forward_backward(inputs, chunk, attention)
    ops, elements = 0, 0
    for event in prof.events():
        if event.cpu_children or not event.name.startswith("aten::"):
            continue
        ops += 1
        for shape in event.input_shapes or []:
            if isinstance(shape, list) and shape and all(isinstance(s, int) for s in shape):
                size = 1
                for s in shape:
                    size *= s
                elements += size
    return ops, elements * element


def _sweep_setting(algorithm: str):
    """The context an algorithm runs in: "cpp-tiles" is "cpp" with the head sweep off, "cpp-rows" with the sweep's
    backward on rows (its lanes across chains off), "cpp-steps" with its one-chain units off (G by the ring rule)."""
    if algorithm == "cpp-tiles":
        return head_sweep(False)
    if algorithm == "cpp-steps":
        return one_chain(False)
    return chain_lanes(False) if algorithm == "cpp-rows" else contextlib.nullcontext()


def _attention(algorithm: str):
    """sliding_dilated_attention with `algorithm` (the variants "cpp-tiles", "cpp-rows", "cpp-steps": "cpp", run
    inside :func:`_sweep_setting`)."""
    return functools.partial(sliding_dilated_attention, algorithm="cpp" if algorithm in _CPP_VARIANTS else algorithm)


def timed_in_rotation(inputs: tuple, chunk: int, reps: int, algorithms: list[str]) -> dict[str, float]:
    """Median forward+backward seconds per algorithm, repetitions taken in rotation (the 1st of each algorithm, then
    the 2nd, ...): a drift of the machine's speed during the run reaches every algorithm alike, so their ratios hold."""
    calls = {a: _attention(a) for a in algorithms}

    def once(algorithm: str) -> float:
        with _sweep_setting(algorithm):
            start = time.perf_counter()
            forward_backward(inputs, chunk, calls[algorithm])
            return time.perf_counter() - start

    for algorithm in algorithms:  # warm-up
        once(algorithm)
    times: dict[str, list[float]] = {a: [] for a in algorithms}
    for _ in range(reps):
        for algorithm in algorithms:
            times[algorithm].append(once(algorithm))
    return {a: statistics.median(ts) for a, ts in times.items()}


def measure(t: int, chunk: int, dtype: str, heads: int, head_dim: int, reps: int, compiled: bool,
            algorithms: list[str], layout: str = "heads") -> list[dict]:
    """One row per algorithm at one (T, C, dtype), on the same inputs: eager forward+backward time (in rotation,
    :func:`timed_in_rotation`), the floor's bytes, the eager ops' traffic, and with `compiled` the
    ``torch.compile``d time (Inductor's fused C++ loops), its output checked against eager.
    ``"cpp-tiles"``: the C++ operator with its head sweep off (`head_sweep(False)`); ``"cpp-rows"``: with the sweep's
    row backward (`chain_lanes(False)`); ``"cpp-steps"``: G by the ring rule everywhere (`one_chain(False)`)."""
    element = torch.finfo(DTYPES[dtype]).bits // 8
    inputs = _inputs(1, heads, t, head_dim, chunk, DTYPES[dtype], layout)
    seconds = timed_in_rotation(inputs, chunk, reps, algorithms)
    rows = []
    for algorithm in algorithms:
        attention = _attention(algorithm)
        row = {"t": t, "chunk": chunk, "dtype": dtype, "algorithm": algorithm, "seconds": seconds[algorithm],
               "floor_bytes": floor_bytes(1, heads, t, head_dim, chunk, element),
               "flops": kernel_flops(1, heads, t, head_dim, chunk)}
        with _sweep_setting(algorithm):
            row["ops"], row["op_bytes"] = op_traffic(inputs, chunk, element, attention)
            if compiled:
                torch._dynamo.reset()
                fused = torch.compile(attention, dynamic=False)
                q, k, v, pad_k, pad_v, rel_bias, _ = inputs
                with torch.no_grad():
                    gap = (fused(q, k, v, rel_bias, chunk, pad_k, pad_v).float()
                           - sliding_dilated_attention(q, k, v, rel_bias, chunk, pad_k, pad_v).float()).abs().max().item()
                row["compiled_seconds"], row["compiled_max_abs_diff"] = _timed(inputs, chunk, reps, fused), gap
        rows.append(row)
    return rows


def render(rows: list[dict], bandwidth: dict[str, float], args: argparse.Namespace, command: str,
           gflops: float) -> str:
    prov = provenance(command)
    # the floor's bandwidth: the best this run measured, at its start or beside any row (on a shared machine the
    # start can fall in a slow spell, and a floor below the machine's bandwidth would flatter every row)
    best = max([*bandwidth.values(), *(r["bandwidth_now"] for r in rows)])
    lines = ["# Sliding-dilated kernel against the memory-traffic floor", "",
             *stamp_lines(prov), f"- Threads: {torch.get_num_threads()}; H = {args.heads}, Dh = {args.head_dim}, "
             f"B = 1; median of {args.reps} forward+backward passes, taken in rotation over the algorithms",
             f"- Layout: {args.layout} (" + ("q, k, v views of one (B, T, 3·H·Dh) projection" if args.layout ==
                                              "projection" else "q, k, v each (B, H, T, Dh), a head's rows adjacent")
             + ")",
             f"- Head sweep (the `cpp` rows): {head_sweep_isa()} lanes", "",
             f"Measured bandwidth ({args.stream_gib:g} GiB fp32 arrays, best of {max(args.reps, 3)}): "
             f"copy {bandwidth['copy']:.1f} GB/s, triad {bandwidth['triad']:.1f} GB/s; the floor uses the best this "
             f"run measured (there or beside a row), {best:.1f} GB/s. Measured fp32 matmul rate (1536³, best of "
             f"{max(args.reps, 3)}): {gflops:.1f} GFLOP/s, the compute floor's rate.", "",
             "| T | C | dtype | algorithm | fwd+bwd ms | memory floor ms | time ÷ memory floor | triad beside the row GB/s | "
             "time ÷ floor at it | compute floor ms | time ÷ compute floor | max(floors) ÷ memory floor |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        floor_ms, compute_ms = r["floor_bytes"] / best / 1e6, r["flops"] / gflops / 1e6
        now_ms = r["floor_bytes"] / r["bandwidth_now"] / 1e6
        lines.append(f"| {r['t']:,} | {r['chunk']} | {r['dtype']} | {r['algorithm']} | {r['seconds'] * 1e3:.1f} | "
                     f"{floor_ms:.1f} | {r['seconds'] * 1e3 / floor_ms:.1f}× | {r['bandwidth_now']:.1f} | "
                     f"{r['seconds'] * 1e3 / now_ms:.1f}× | {compute_ms:.1f} | "
                     f"{r['seconds'] * 1e3 / compute_ms:.1f}× | {max(floor_ms, compute_ms) / floor_ms:.1f}× |")
    lines += ["", "*triad beside the row*: the triad (best of 2) measured again just before the rows of this (T, C, "
              "dtype), against drift on a shared machine; *time ÷ floor at it* uses it instead of the run's best.",
              "", "*compute floor*: 12·B·H·T·C·Dh FLOPs (forward scores and output, backward dP, dq, dk, dv) at the "
              "measured matmul rate; a kernel cannot beat the larger floor, so where *max(floors) ÷ memory floor* "
              "exceeds a target's multiple of the memory floor, that target is out of reach on this machine.", "",
              "Traffic:", "",
             "| T | C | dtype | algorithm | fwd+bwd ms | floor bytes (MB) | floor ms | time ÷ floor | leaf ops | op input bytes "
             "(MB) | op bytes ÷ floor bytes | op bytes at the bandwidth, ms | compiled ms | compiled ÷ floor | "
             "compiled max abs diff |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        floor_ms = r["floor_bytes"] / best / 1e6
        lines.append(f"| {r['t']:,} | {r['chunk']} | {r['dtype']} | {r['algorithm']} | {r['seconds'] * 1e3:.1f} | "
                     f"{r['floor_bytes'] / 1e6:,.0f} | {floor_ms:.1f} | {r['seconds'] * 1e3 / floor_ms:.1f}× | "
                     f"{r['ops']} | {r['op_bytes'] / 1e6:,.0f} | {r['op_bytes'] / r['floor_bytes']:.1f}× | "
                     f"{r['op_bytes'] / best / 1e6:.1f} | "
                     + (f"{r['compiled_seconds'] * 1e3:.1f} | {r['compiled_seconds'] * 1e3 / floor_ms:.1f}× | "
                        f"{r['compiled_max_abs_diff']:.1e} |" if "compiled_seconds" in r else "— | — | — |"))
    lines += ["", "*floor*: the bytes that must move at least once (q, k, v, out, dout, dq, dk, dv, pads, window "
              "scalars) at the measured bandwidth. *op input bytes*: what the separate ATen ops of one "
              "forward+backward read (profiler shapes; outputs not counted), a lower bound on the traffic they issue: "
              "when it is many times the floor, the time is bounded by passes over memory that a fused kernel would "
              "not make. *compiled*: the same kernel under `torch.compile` (Inductor on CPU fuses elementwise and "
              "reduction ops into C++ loops; compilation excluded from the timing), its forward checked against "
              "eager."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", default="16384,65536", help="sequence lengths T (default: %(default)s)")
    p.add_argument("--chunks", default="2,8", help="chunk sizes C (default: %(default)s)")
    p.add_argument("--dtypes", default="fp32,bf16", help="q/k/v dtypes (default: %(default)s)")
    p.add_argument("--algorithms", default="auto",
                   help=f"comma-separated: {', '.join(ALGORITHMS)} (default: %(default)s)")
    p.add_argument("--heads", type=positive_int, default=8)
    p.add_argument("--head-dim", type=positive_int, default=64)
    p.add_argument("--reps", type=positive_int, default=3)
    p.add_argument("--threads", type=positive_int, default=2, help="torch threads (default 2)")
    p.add_argument("--stream-gib", type=positive_float, default=1.0, help="GiB per bandwidth array (default 1)")
    p.add_argument("--layout", choices=LAYOUTS, default="heads",
                   help="heads: q, k, v each (B, H, T, Dh); projection: views of one (B, T, 3·H·Dh) tensor, as in "
                        "the model (default: %(default)s)")
    p.add_argument("--no-compile", action="store_true", help="leave out the torch.compile columns")
    p.add_argument("--out", type=Path, default=Path("results/bench_traffic.md"))
    args = p.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
        chunks = [int(x) for x in args.chunks.split(",")]
    except ValueError:
        p.error(f"--lengths {args.lengths!r} / --chunks {args.chunks!r}: expected comma-separated integers")
    dtypes = args.dtypes.split(",")
    if bad := [d for d in dtypes if d not in DTYPES]:
        p.error(f"--dtypes: {bad[0]!r} is not one of {', '.join(DTYPES)}")
    algorithms = args.algorithms.split(",")
    if bad := [a for a in algorithms if a not in ALGORITHMS]:
        p.error(f"--algorithms: {bad[0]!r} is not one of {', '.join(ALGORITHMS)}")
    if min(lengths) < 1 or min(chunks) < 2:
        p.error("expected lengths >= 1, chunks >= 2")
    torch.set_num_threads(args.threads)
    command = shlex.join(["python", "eval/bench_traffic.py", *(sys.argv[1:] if argv is None else argv)])
    bandwidth = stream_bandwidth(args.stream_gib, reps=max(args.reps, 3))
    gflops = matmul_rate(reps=max(args.reps, 3))
    print(f"bandwidth: copy {bandwidth['copy']:.1f} GB/s, triad {bandwidth['triad']:.1f} GB/s; fp32 matmul "
          f"{gflops:.1f} GFLOP/s", flush=True)
    rows = []
    for dtype in dtypes:
        for t in lengths:
            for chunk in chunks:
                # the triad again beside each configuration's rows: on a shared VM bandwidth drifts over minutes
                local = max(stream_bandwidth(args.stream_gib, reps=2).values())
                for r in measure(t, chunk, dtype, args.heads, args.head_dim, args.reps, not args.no_compile, algorithms,
                                 args.layout):
                    rows.append({**r, "bandwidth_now": local})
                    print(f"T={t} C={chunk} {dtype} {r['algorithm']}: {r['seconds'] * 1e3:.1f} ms, "
                          f"{r['seconds'] * max(bandwidth.values()) * 1e9 / r['floor_bytes']:.1f}x floor, "
                          f"{r['seconds'] * local * 1e9 / r['floor_bytes']:.1f}x at {local:.1f} GB/s now, {r['ops']} ops",
                          flush=True)
    atomic_write_text(args.out, render(rows, bandwidth, args, command, gflops))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
