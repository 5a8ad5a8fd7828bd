"""The Python steps of eval/gpu_check.sh: the kernels' correctness and speed, random-token data, generation speed,
a profile of one training step. Each writes one markdown file; every one runs on CPU at tiny sizes too.

    python eval/gpu_steps.py data OUT --vocab 8000 --tokens 2000000       # a data folder of random tokens
    python eval/gpu_steps.py check --device cuda --out k.md        # every algorithm that runs on the device
    python eval/gpu_steps.py bench --device cuda --lengths 16384 --algorithms triton,blocked,shift --out b.md
    python eval/gpu_steps.py generate runs/x/model.pt --context 16384 --new-tokens 64 --device cuda --out g.md
    python eval/gpu_steps.py profile --config configs/base.json --device cuda --out p.md

Algorithms are asked for by name (``regulargpt.model.sliding_dilated_attention(..., algorithm=NAME)``): a name this
checkout does not know, or one that does not run on the device (``algorithms_on``: "cpp" is CPU-only, "triton" and
"flex" CUDA-only), is reported as "skipped", not an error; ``--algorithms device`` (the default) takes every algorithm
``algorithms_on(device)`` lists. ``check``: the forward and the
gradients of q, k, v, the window scalars and the pads against the fp64 dense reference, fp32 and bf16, error over
max(1, |reference|) under 2e-3 (fp32) and 3e-2 (bf16), the bounds of tests/test_flex_sliding.py; exit 1 on a
mismatch or an error. ``bench``: forward+backward (B = 1, Dh = 64, C = 8, dilation 8), median of ``--reps``, against
the HBM floor: the 8 tensors of B·H·T·Dh a forward+backward must move at least once (q, k, v, out, dout, dq, dk, dv)
over the datasheet bandwidth (regulargpt.peak.DATASHEET_BANDWIDTH) and over a measured device copy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from regulargpt.model import reference_sliding_dilated_attention, sliding_dilated_attention  # noqa: E402
from regulargpt.model.sliding_dilated import algorithms_on  # noqa: E402
from regulargpt.peak import datasheet_bandwidth  # noqa: E402

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


# ------------------------------------------------------------------------------------------------------ data


def write_random_data(out: Path, vocab: int, tokens: int, seed: int = 0) -> None:
    """A data folder of uniformly random uint16 tokens (train 90 %, val and test 5 % each) with a placeholder
    tokenizer file: enough for training and scoring throughput, not for text."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = b"random tokens: no tokenizer"
    (out / "tokenizer.model").write_bytes(tokenizer)
    sizes = {"train": tokens * 9 // 10, "val": tokens // 20, "test": tokens // 20}
    splits = {}
    for name, n in sizes.items():
        rng.integers(0, vocab, n, dtype=np.uint16).tofile(out / f"{name}.bin")
        splits[name] = {"tokens": n, "documents": 1, "file": f"{name}.bin"}
    manifest = {"format_version": 1, "dtype": "uint16", "vocab_size": vocab, "splits": splits,
                "tokenizer": {"file": "tokenizer.model", "sha256": hashlib.sha256(tokenizer).hexdigest()}}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {out}: {tokens:,} random tokens, vocab {vocab}")


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


def check(device: str, algorithms: list[str], t: int, heads: int) -> tuple[list[str], bool]:
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
        cases = [(dtype, c, dilation) for dtype in DTYPES for c, dilation in ((2, 1), (8, 8), (4, 64))]
        for dtype, c, dilation in cases:
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


def _median_time(fn: Callable[[], None], device: str, reps: int) -> float:
    fn()  # warm-up (and compile)
    times = []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device: str, mib: int) -> float:
    """Bytes/s of a device-to-device copy of `mib` MiB (each byte read once and written once)."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * src.numel() / _median_time(lambda: dst.copy_(src), device, 5)


def _sdpa_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dout: torch.Tensor) -> None:
    if q.is_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)
    else:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)


def bench(device: str, algorithms: list[str], lengths: list[int], heads: int, dtype: str, reps: int,
          copy_mib: int) -> list[str]:
    measured = copy_bandwidth(device, copy_mib)
    sheet = datasheet_bandwidth(device)
    lines = [f"HBM floor: 8 · B·H·T·Dh · {torch.finfo(DTYPES[dtype]).bits // 8} bytes; bandwidth measured by a copy: "
             f"{measured / 1e9:.0f} GB/s" + (f"; datasheet ({sheet[1]}): {sheet[0] / 1e12:.2f} TB/s" if sheet else
                                              "; no datasheet bandwidth for this device"), "",
             "| T | kernel | fwd+bwd (ms) | ÷ floor (measured copy) | ÷ floor (datasheet) |", "|---|---|---|---|---|"]
    for t in lengths:
        q, k, v, r, pk, pv = (x.detach().to(device, DTYPES[dtype]).requires_grad_() for x in _inputs(t, 8, heads, 64))
        dout = torch.randn_like(q)
        floor_bytes = 8 * q.numel() * q.element_size()
        for name in [*algorithms, "sdpa-causal"]:
            if _unsupported(name, device):
                lines.append(f"| {t} | {name} | skipped (does not run on {device}) | – | – |")
                continue
            if name == "sdpa-causal":
                step = lambda: _sdpa_step(q, k, v, dout)  # noqa: E731
            else:
                step = lambda: _run(name, [q, k, v, r, pk, pv], 8).backward(dout)  # noqa: E731
            try:
                seconds = _median_time(step, device, reps)
            except ValueError as err:
                if UNKNOWN not in str(err):
                    raise
                lines.append(f"| {t} | {name} | skipped (unknown algorithm in this checkout) | – | – |")
                continue
            except Exception as err:  # noqa: BLE001 (reported; the next kernel still runs)
                lines.append(f"| {t} | {name} | error: {type(err).__name__}: {str(err)[:100]} | – | – |")
                continue
            over_sheet = f"{seconds / (floor_bytes / sheet[0]):.1f}×" if sheet else "–"
            lines.append(f"| {t} | {name} | {1e3 * seconds:.2f} | {seconds / (floor_bytes / measured):.1f}× | "
                         f"{over_sheet} |")
            for x in (q, k, v, r, pk, pv):
                x.grad = None
    return lines


# ------------------------------------------------------------------------------------ generation and profile


def generation_speed(model_path: Path, context: int, new_tokens: int, device: str) -> list[str]:
    """Decode tokens/s after a prompt of `context` random tokens: time(1 + N new) − time(1 new) over N, greedy."""
    from regulargpt.generation import SamplingConfig, generate
    from regulargpt.generation.loading import load_model

    info = load_model(model_path, device=device, dtype="bf16" if device.startswith("cuda") else "fp32")
    model = info.model
    prompt = torch.randint(0, model.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()

    def run(n: int) -> float:
        _sync(device)
        start = time.perf_counter()
        with torch.no_grad():
            generate(model, prompt, n, SamplingConfig(greedy=True))
        _sync(device)
        return time.perf_counter() - start

    run(2)  # warm-up
    prefill, total = run(1), run(1 + new_tokens)
    return [f"model {model_path} ({model.config.architecture}), context {context:,}, {new_tokens} new tokens, greedy",
            "", f"prefill + first token: {prefill:.2f} s; decode: {new_tokens / max(total - prefill, 1e-9):.1f} tokens/s"]


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
    d = sub.add_parser("data")
    d.add_argument("out", type=Path)
    d.add_argument("--vocab", type=int, default=8000)
    d.add_argument("--tokens", type=int, default=2_000_000)
    for name in ("check", "bench", "generate", "profile"):
        s = sub.add_parser(name)
        s.add_argument("--device", default="cuda")
        s.add_argument("--out", type=Path, required=True)
        if name in ("check", "bench"):
            s.add_argument("--algorithms", default="device")
            s.add_argument("--heads", type=int, default=12)
        if name == "check":
            s.add_argument("--length", type=int, default=1000)
            s.add_argument("--without", default="", help="comma-separated algorithms to leave out, e.g. flex")
        if name == "bench":
            s.add_argument("--lengths", default="4096,16384,65536")
            s.add_argument("--dtype", choices=list(DTYPES), default="bf16")
            s.add_argument("--reps", type=int, default=5)
            s.add_argument("--copy-mib", type=int, default=1024)
        if name == "generate":
            s.add_argument("model", type=Path)
            s.add_argument("--context", type=int, default=16384)
            s.add_argument("--new-tokens", type=int, default=64)
        if name == "profile":
            s.add_argument("--config", default="configs/base.json")
            s.add_argument("--set", action="append", default=[])
            s.add_argument("--batch", type=int, default=32)
    args = p.parse_args(argv)
    if args.command == "data":
        write_random_data(args.out, args.vocab, args.tokens)
        return 0
    names = _algorithms(args.algorithms, args.device) if args.command in ("check", "bench") else []
    if args.command == "check":
        names = [name for name in names if name not in args.without.split(",")]
        rows, ok = check(args.device, names, args.length, args.heads)
        _write(args.out, f"Kernels against the fp64 dense reference on {args.device}", rows)
        return 0 if ok else 1
    if args.command == "bench":
        lengths = [int(x) for x in args.lengths.split(",")]
        lines = bench(args.device, names, lengths, args.heads, args.dtype, args.reps, args.copy_mib)
        _write(args.out, f"Kernel forward+backward on {args.device}, H = {args.heads}, {args.dtype}", lines)
    elif args.command == "generate":
        _write(args.out, f"Generation on {args.device}", generation_speed(args.model, args.context, args.new_tokens,
                                                                            args.device))
    else:
        _write(args.out, f"Profile of one training step on {args.device}", profile_step(args.config, args.set,
                                                                                        args.device, args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
