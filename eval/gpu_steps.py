"""Two Python steps of eval/gpu_campaign.sh: the kernels' correctness and a profile of one training step. Each writes
one markdown file; both run on CPU at tiny sizes too (kernel timing: eval/bench_kernel_gpu.py).

    python eval/gpu_steps.py check --device cuda --algorithms triton --out k.md   # or every algorithm on the device
    python eval/gpu_steps.py profile --config configs/campaign/regular_gpt.json --device cuda --out p.md

Algorithms are asked for by name (``regulargpt.model.sliding_dilated_attention(..., algorithm=NAME)``): a name this
checkout does not know, or one that does not run on the device (``algorithms_on``: "cpp" is CPU-only, "triton" and
"flex" CUDA-only), is reported as "skipped", not an error; ``--algorithms device`` (the default) takes every algorithm
``algorithms_on(device)`` lists. ``check``: the forward and the
gradients of q, k, v, the window scalars and the pads against the fp64 dense reference, fp32 and bf16, error over
max(1, |reference|) under 2e-3 (fp32) and 3e-2 (bf16), the bounds of tests/test_flex_sliding.py; exit 1 on a
mismatch or an error. The default length, 1003, is a multiple of no block size.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from regulargpt.model import reference_sliding_dilated_attention, sliding_dilated_attention  # noqa: E402
from regulargpt.model.sliding_dilated import algorithms_on  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 2e-3, "bf16": 3e-2}
UNKNOWN = "algorithm must be one of"  # the start of sliding_dilated_attention's error for an unknown name


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _write(out: Path, title: str, lines: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join([f"# {title}", "", f"`{' '.join(sys.argv)}` (torch {torch.__version__})", "", *lines, ""])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    print(text)


# ---------------------------------------------------------------------------------------------------- kernels


def _inputs(t: int, c: int, h: int, dh: int, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v (1, H, T, Dh), window scalars (H, C), pad key and value (1, H, Dh): fp64 CPU leaves."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, h, t, dh)] * 3 + [(h, c), (1, h, dh), (1, h, dh)]
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


def _run(algorithm: str, leaves: list[torch.Tensor], dilation: int) -> torch.Tensor:
    q, k, v, r, pk, pv = leaves
    return sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.double().cpu() - want).abs().max().item() / max(1.0, want.abs().max().item())


def _unsupported(algorithm: str, device: str) -> bool:
    """A known algorithm that `algorithms_on` does not list for the device type (an unknown name is not: it is
    reported by the call itself)."""
    known = set(algorithms_on("cpu")) | set(algorithms_on("cuda")) | {"triton"}
    return algorithm in known and algorithm not in algorithms_on(torch.device(device).type)


def _algorithms(arg: str, device: str) -> list[str]:
    """`--algorithms`: "device" → every algorithm that runs on the device; else the comma-separated names."""
    return algorithms_on(torch.device(device).type) if arg == "device" else arg.split(",")


def _reference(dtype: str, t: int, heads: int, c: int, dilation: int) -> tuple[list[torch.Tensor], torch.Tensor,
                                                                            torch.Tensor, tuple[torch.Tensor, ...]]:
    """One case's fp64 CPU reference → (leaves, output, output weights, gradients of (output · weights).sum())."""
    # the reference sees the inputs rounded to `dtype`, so the error is the kernel's, not the inputs' rounding (in
    # bf16 that alone moves the window scalars' gradient, a sum of T·B cancelling terms, by ~2e-2 of its largest entry)
    ref_leaves = [x.detach().to(DTYPES[dtype]).double().requires_grad_() for x in _inputs(t, c, heads, 64)]
    ref = reference_sliding_dilated_attention(*ref_leaves[:4], dilation, *ref_leaves[4:])
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)  # fixed: a rerun is the same case
    return ref_leaves, ref.detach(), w, torch.autograd.grad((ref * w).sum(), ref_leaves)


def _check_one(algorithm: str, device: str, dtype: str, c: int, dilation: int,
               reference: tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]
               ) -> tuple[str, str]:
    """One case against its :func:`_reference` → (table row, "ok" | "FAIL" | "error" | "unknown")."""
    ref_leaves, ref, w, want = reference
    leaves = [x.detach().to(device, DTYPES[dtype]).requires_grad_() for x in ref_leaves]
    head = f"| {algorithm} | {dtype} | {c}, {dilation} |"
    try:
        out = _run(algorithm, leaves, dilation)
        got = torch.autograd.grad((out.double() * w.to(device)).sum(), leaves)
    except ValueError as err:
        if UNKNOWN in str(err):
            return f"| {algorithm} | – | – | – | – | skipped (unknown algorithm in this checkout) |", "unknown"
        return f"{head} – | – | error: ValueError: {str(err)[:120]} |", "error"
    except Exception as err:  # noqa: BLE001 (reported; the other cases still run)
        return f"{head} – | – | error: {type(err).__name__}: {str(err)[:120]} |", "error"
    fwd, grad = _error(out, ref), max(_error(g1, g2) for g1, g2 in zip(got, want))
    verdict = "ok" if max(fwd, grad) < TOLERANCE[dtype] else "FAIL"
    return f"{head} {fwd:.1e} | {grad:.1e} | {verdict} |", verdict


CASES = ((2, 1), (8, 8), (4, 64))  # (C, dilation): a band, a dilated step, a dilation past most of a short input


def check(device: str, algorithms: list[str], t: int, heads: int,
          cases: tuple[tuple[int, int], ...] = CASES) -> tuple[list[str], bool]:
    """Rows of the correctness table and whether every known algorithm matched in every case. Each row is printed
    as it is done, with its seconds (a Triton or FlexAttention build per case), so a step cut short by its time cap
    still shows the cases it finished; each case's reference is computed once for all algorithms."""
    rows = ["| algorithm | dtype | C, dilation | forward error | worst gradient error | verdict |",
            "|---|---|---|---|---|---|"]
    references: dict[tuple[str, int, int], tuple] = {}
    ok = True
    for algorithm in algorithms:
        if _unsupported(algorithm, device):
            rows.append(f"| {algorithm} | – | – | – | – | skipped (does not run on {device}) |")
            continue
        for dtype, c, dilation in [(dtype, c, dilation) for dtype in DTYPES for c, dilation in cases]:
            start = time.perf_counter()
            if (dtype, c, dilation) not in references:
                references[dtype, c, dilation] = _reference(dtype, t, heads, c, dilation)
            row, status = _check_one(algorithm, device, dtype, c, dilation, references[dtype, c, dilation])
            rows.append(row)
            print(f"{row} {time.perf_counter() - start:.1f} s", flush=True)
            ok &= status in ("ok", "unknown")
            if status == "unknown":
                break
    return rows, ok


# ---------------------------------------------------------------------------------------------------- profile


def device_self_ms(events: list) -> float:
    """Milliseconds the device spent in kernels: the self time of the device's own events, as the profiler's table
    sums it. An operator (a CPU event) carries the device time of the kernels it launched as well, so summing every
    event counted each kernel twice (79.7 ms against the table's 39.9 ms on an H200)."""
    from torch.autograd import DeviceType

    return sum(e.self_device_time_total for e in events
               if e.device_type != DeviceType.CPU and not getattr(e, "is_user_annotation", False)) / 1e3


def profile_step(config: str, sets: list[str], device: str, batch: int) -> list[str]:
    """torch.profiler over one forward+backward of the config's model (bf16 weights on CUDA), after a warm-up step."""
    from torch.profiler import ProfilerActivity, profile

    from regulargpt.config import load_config
    from regulargpt.model import build_model

    cfg = load_config(config, sets)
    model = build_model(cfg.model).to(device, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    tokens = torch.randint(0, cfg.model.vocab_size, (batch, cfg.data.seq_len + 1), device=device)

    def step() -> None:
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

    step()
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    with profile(activities=activities) as prof:
        step()
        _sync(device)
    key = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    events = prof.key_averages()
    cpu_ms = sum(e.self_cpu_time_total for e in events) / 1e3
    gpu_ms = device_self_ms(events)
    return [f"{cfg.model.architecture}, batch {batch}, T = {cfg.data.seq_len}: {len(events)} distinct ops; "
            f"CPU self time {cpu_ms:.1f} ms, device self time {gpu_ms:.1f} ms", "", "```",
            events.table(sort_by=key, row_limit=15, max_name_column_width=60), "```"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("check")
    s.add_argument("--device", default="cuda")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--algorithms", default="device")
    s.add_argument("--heads", type=int, default=12)
    s.add_argument("--length", type=int, default=1003)
    s.add_argument("--without", default="", help="comma-separated algorithms to leave out, e.g. flex")
    s.add_argument("--cases", default=",".join(f"{c}:{d}" for c, d in CASES),
                   help="C:dilation pairs, e.g. 2:1,16:16,8:64")
    s = sub.add_parser("profile")
    s.add_argument("--device", default="cuda")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--config", default="configs/base.json")
    s.add_argument("--set", action="append", default=[])
    s.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)
    if args.command == "check":
        names = [name for name in _algorithms(args.algorithms, args.device) if name not in args.without.split(",")]
        try:
            cases = tuple((int(c), int(d)) for c, d in (pair.split(":") for pair in args.cases.split(",")))
        except ValueError:
            p.error(f"--cases {args.cases!r}: expected C:dilation pairs separated by commas, e.g. 2:1,16:16")
        rows, ok = check(args.device, names, args.length, args.heads, cases)
        _write(args.out, f"Kernels against the fp64 dense reference on {args.device}", rows)
        return 0 if ok else 1
    _write(args.out, f"Profile of one training step on {args.device}", profile_step(args.config, args.set,
                                                                                    args.device, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
