"""The matmul peak FLOP/s of this machine: one meter for training MFU and the benchmarks, cached per machine.

    flops, source = cached_peak("cpu", "bf16", threads=2)   # FLOP/s of one process, and how it was obtained
    flops = measure_peak("cpu", "fp32", threads=1)          # measure now, ignoring the cache

:func:`measure_peak` takes the best of back-to-back triples of square products (2048² on CPU, 8192² on CUDA; smaller
where a triple would take over a quarter of the budget) over `seconds` (3 s by default): a time budget, not a count, because the first products run slow (bf16 matrix units
warming up) and a shared machine's speed varies. On this 2-core shared CPU single 0.15 s measurements of the bf16
peak ranged 700–2,150 GFLOP/s; the best over 3 s 2.0–2.15 TFLOP/s (fp32: 295–321 GFLOP/s).

:func:`cached_peak` measures once per (processor, torch version, device, dtype, threads) and keeps the result in
``~/.cache/regulargpt/peak_flops.json`` (``REGULARGPT_PEAK_CACHE`` names another file). ``REGULARGPT_PEAK_FLOPS``
(FLOP/s per process, e.g. ``989e12`` for an H100 in bf16) wins over both. :func:`raise_peak` records a higher value
(a faster measurement, or a training run that went faster than the cached peak), so the cache only ever holds the
best this machine has shown and an MFU against it stays ≤ 100 %.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from regulargpt.files import atomic_write_text
from regulargpt.provenance import cpu_name

__all__ = ["PEAK_ENV", "DATASHEET_PEAKS", "DATASHEET_BANDWIDTH", "datasheet_peak", "datasheet_bandwidth", "cache_path", "machine_key", "measure_peak",
           "cached_peak", "raise_peak"]

PEAK_ENV = "REGULARGPT_PEAK_FLOPS"

# Dense (no sparsity) bf16/fp16 tensor-core peaks from NVIDIA's datasheets, FLOP/s per GPU, matched against
# torch.cuda.get_device_name in order (the first substring found wins): the denominator papers use for MFU.
DATASHEET_PEAKS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("A100", 312e12),
)
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def datasheet_peak(device: str, dtype: str) -> tuple[float, str] | None:
    """→ (datasheet FLOP/s, GPU name) for a CUDA `device` listed in DATASHEET_PEAKS in bf16/fp16; None otherwise
    (a CPU, an unlisted GPU, fp32), e.g. ``datasheet_peak("cuda:0", "bf16") == (989e12, "NVIDIA H200")``."""
    if not device.startswith("cuda") or dtype not in ("bf16", "fp16"):
        return None
    name = _processor(device)
    return next(((flops, name) for key, flops in DATASHEET_PEAKS if key in name), None)


# HBM bandwidth from the same datasheets, bytes/s per GPU (the memory-traffic floor of eval/gpu_steps.py bench).
DATASHEET_BANDWIDTH: tuple[tuple[str, float], ...] = (
    ("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("A100", 2.0e12),
)


def datasheet_bandwidth(device: str) -> tuple[float, str] | None:
    """→ (datasheet HBM bytes/s, GPU name) for a CUDA `device` in DATASHEET_BANDWIDTH; None otherwise."""
    if not device.startswith("cuda"):
        return None
    name = _processor(device)
    return next(((bps, name) for key, bps in DATASHEET_BANDWIDTH if key in name), None)


def cache_path() -> Path:
    return Path(os.environ.get("REGULARGPT_PEAK_CACHE") or Path.home() / ".cache" / "regulargpt" / "peak_flops.json")


def _processor(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


def machine_key(device: str, dtype: str, threads: int) -> str:
    """e.g. ``'AMD EPYC 9R45 | torch 2.13.0 | cpu | bf16 | 2 threads'`` (threads only count on CPU)."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    tail = f" | {threads} threads" if kind == "cpu" else ""
    return f"{_processor(device)} | torch {torch.__version__} | {kind} | {dtype}{tail}"


def _size(device: str) -> int:
    return 8192 if device.startswith("cuda") else 2048


def measure_peak(device: str, dtype: str, threads: int, seconds: float = 3.0,
                 matmul: Callable[[torch.Tensor, torch.Tensor], object] = torch.matmul) -> float:
    """Best FLOP/s of back-to-back triples of square matmuls in `dtype` over about `seconds`, with `threads` CPU
    threads (`matmul`: the product timed; tests pass a slow fake). See :func:`_measure` for the bound."""
    return _measure(device, dtype, threads, seconds, matmul)[0]


def _measure(device: str, dtype: str, threads: int, seconds: float,
             matmul: Callable[[torch.Tensor, torch.Tensor], object]) -> tuple[float, int]:
    """→ (best FLOP/s, the side n it was measured at). Bounded in time whatever the dtype's speed here: starting at
    n = 256 (after one warm-up product), each measured triple predicts the next size's (∝ n³), so the size is the
    largest power of two up to `_size(device)` whose triple is predicted to take at most a quarter of `seconds`,
    and no triple starts that is predicted to end after the deadline. Without the bound, bf16 on a CPU without native
    bf16 (AVX2 only: a few GFLOP/s) spent minutes on the first 2048² triple alone; a machine with fast bf16 still
    measures at 2048²."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def timed(a: torch.Tensor, b: torch.Tensor, reps: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            matmul(a, b)
        sync()
        return time.perf_counter() - start

    try:
        deadline = time.perf_counter() + seconds
        n = _PROBE
        a, b = (torch.randn(n, n, device=device, dtype=_DTYPES[dtype]) for _ in range(2))
        timed(a, b, 1)  # warm-up: the first product pays the library's start-up (cuBLAS handles, kernel choice)
        triple = timed(a, b, 3)
        # Grow n while the next triple, predicted from the one just measured (∝ n³), fits a quarter of the budget.
        # Measuring at every size, not extrapolating one small product: on a GPU a 256² product is all launch
        # overhead, and predicting from it stopped the growth at 256², where an H200 showed 2.8 TFLOP/s of its ~800.
        while (2 * n <= _size(device) and 8 * triple <= seconds / 4
               and time.perf_counter() + 8 * triple * 4 / 3 <= deadline):
            n *= 2
            a, b = (torch.randn(n, n, device=device, dtype=_DTYPES[dtype]) for _ in range(2))
            timed(a, b, 1)
            triple = timed(a, b, 3)
        best = 3 * 2 * n**3 / triple
        while time.perf_counter() + triple <= deadline:
            triple = timed(a, b, 3)
            best = max(best, 3 * 2 * n**3 / triple)
    finally:
        torch.set_num_threads(before)
    return best, n


_PROBE = 256  # the side _measure starts from, doubling while the next size fits its budget
# The measurement's version, kept in each cache entry: an entry of another version is measured again. Version 1
# predicted every size from one cold 256² product and cached 2.8 TFLOP/s for an H200 (an MFU of 92% against it).
_METHOD = 2


def _read_cache() -> dict[str, dict[str, object]]:
    try:
        data = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _current_flops(entry: object) -> float | None:
    """The FLOP/s of a cache entry written by this version of the measurement; None for any other entry."""
    if not isinstance(entry, dict) or entry.get("method") != _METHOD:
        return None
    flops = entry.get("flops")
    return float(flops) if isinstance(flops, (int, float)) and flops > 0 else None


def raise_peak(key: str, flops: float, how: str) -> None:
    """Record `flops` under `key` unless the cache already holds at least that much."""
    data = _read_cache()
    old = _current_flops(data.get(key))
    if old is not None and old >= flops:
        return
    data[key] = {"flops": flops, "how": how, "date": time.strftime("%Y-%m-%d %H:%M:%S"), "method": _METHOD}
    try:
        atomic_write_text(cache_path(), json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError:  # a read-only home: the value is still used for this run
        pass


def cached_peak(device: str, dtype: str, threads: int | None = None, seconds: float = 3.0) -> tuple[float, str]:
    """→ (peak FLOP/s of one process, where it came from): REGULARGPT_PEAK_FLOPS, the cache, or a measurement now
    (`seconds` long, then cached)."""
    env = os.environ.get(PEAK_ENV)
    if env:
        return float(env), PEAK_ENV
    threads = threads or torch.get_num_threads()
    key = machine_key(device, dtype, threads)
    flops = _current_flops(_read_cache().get(key))
    if flops is not None:
        return flops, f"cached in {cache_path()}"
    flops, n = _measure(device, dtype, threads, seconds, torch.matmul)
    raise_peak(key, flops, f"best {n}² matmul triple over {seconds:g} s")
    return flops, f"measured over {seconds:g} s, cached in {cache_path()}"
