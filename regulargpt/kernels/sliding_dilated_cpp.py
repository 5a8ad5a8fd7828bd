"""The fused C++ CPU kernel (sliding_dilated_cpu.cpp) as the operator ``regulargpt::sliding_dilated_cpu``.

Operator (the contract of `regulargpt.kernels`), query i at position p_i = query_start + i·query_step:

    out[b, i, h] = Σ_j P[b, i, h, j] · v[b, p_i − j·D, h],   P = softmax_j(q·k[b, p_i − j·D, h] / sqrt(Dh) + r[h, j])

q (B, Tq, H, Dh), k, v (B, T, H, Dh) in the projection's layout, read in place; out (B, Tq, H, Dh) contiguous.
The forward also returns the probabilities P (B, H, Tq, C) (fp32, fp64 for fp64 inputs), saved for the backward
instead of the log-sum-exp; dq, dk, dv come in the layout of q, k, v when that is dense (so autograd keeps them
without a copy), else contiguous. The backward is a second operator, ``regulargpt::sliding_dilated_cpu_backward``;
both have fake (meta) implementations, so torch.compile captures them, and `torch.library.opcheck` passes.

Two implementations behind the one operator: on CPUs with AVX-512 or AVX2 + FMA + F16C the common geometries
(queries at every position, C in {2, 4, 8, 16}, Dh in {16, 32, 64, 128}, fp32 / bf16 / fp16) run the head sweep
(sliding_dilated_cpu_sweep.h, on the vector lanes of sliding_dilated_cpu_lanes.h); the rest (fp64, tree mode's
strided queries, other C or Dh, CPUs without AVX2) the tiled kernel. On AVX2 at D >= 8 the sweep's backward puts
8 chains in the lanes of a vector (sliding_dilated_cpu_chain_lanes.h). `head_sweep_available()` says whether this
build has the sweep, `head_sweep_isa()` on which instructions; `with head_sweep(False):` forces the tiles and
`with chain_lanes(False):` the sweep's row backward, `with step_pairs(False):` its forward and row backward one
query at a time, not a chain's steps u, u + 1 together (benchmarks compare them).

Build: `torch.utils.cpp_extension.load` on first use (g++ and ninja, nothing downloaded), `-O3 -march=native
-fopenmp`, cached under torch's extension directory. The extension's name carries a hash of the source and its header, the flags,
the torch version and this CPU (machine and /proc/cpuinfo flags), so a home directory shared by different CPUs never
loads a binary built for another. `build_error()` says why a build failed (None when it works).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

__all__ = ["sliding_dilated_cpu", "extension", "build_error", "head_sweep_available", "head_sweep_isa", "head_sweep",
           "chain_lanes", "step_pairs"]

_SOURCE = Path(__file__).with_name("sliding_dilated_cpu.cpp")
_HEADERS = tuple(_SOURCE.with_name(f"sliding_dilated_cpu_{part}.h")  # included by the source
                 for part in ("vec", "pool", "lanes", "sweep", "row_backward", "chain_lanes"))
_CFLAGS = ["-O3", "-march=native", "-fopenmp"]
STALE_LOCK_SECONDS = 600.0  # a build lock older than this belongs to a killed process
_state: dict[str, ModuleType | str] = {}  # "module" once built, or "error": why the build failed


def _cpu_signature() -> str:
    """platform.machine() plus the CPU flags line (Linux) or the processor name (elsewhere)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        flags = platform.processor()
    return f"{platform.machine()} {flags}"


def extension() -> ModuleType:
    """The built extension (compiled once per machine and source, then loaded from the on-disk cache)."""
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    if "error" in _state:
        raise RuntimeError(_state["error"])
    from torch.utils.cpp_extension import load

    sources = [path.read_text() if path.exists() else "" for path in (_SOURCE, *_HEADERS)]
    # the source's path too: torch's build files record it, so two checkouts sharing one cache would rebuild (and
    # wait on) each other's extension at every load
    key = "\0".join([*sources, str(_SOURCE.resolve()), *_CFLAGS, torch.__version__, _cpu_signature()])
    name = f"regulargpt_sliding_dilated_{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    try:
        _clear_stale_lock(name)
        _state["module"] = load(name=name, sources=[str(_SOURCE)], extra_cflags=_CFLAGS, extra_ldflags=["-fopenmp"])
    except Exception as exc:  # any build or load failure: the caller falls back and says why
        _state["error"] = f"building {_SOURCE.name} failed: {type(exc).__name__}: {str(exc).strip()[-500:]}"
        raise RuntimeError(_state["error"]) from exc
    return _state["module"]  # type: ignore[return-value]


def _clear_stale_lock(name: str, max_age_s: float = STALE_LOCK_SECONDS) -> None:
    """Remove the build folder's `lock` when it is older than `max_age_s` (a build takes about a minute): torch
    waits forever on a lock left by a process killed while it built or loaded the extension."""
    import time
    import warnings

    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:  # no lock: nothing to clear
        return
    if age > max_age_s:
        warnings.warn(f"{lock}: removing a build lock {age:.0f} s old (a process was killed while building the C++ "
                      f"kernel); building again", stacklevel=3)
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)


@torch.compiler.assume_constant_result  # torch.compile runs it eagerly when tracing, and keeps the answer
def build_error() -> str | None:
    """None when the extension builds and loads, else why not (tried once per process)."""
    try:
        extension()
    except RuntimeError as exc:
        return str(exc)
    return None


def head_sweep_available() -> bool:
    """Whether the built extension has the head sweep (AVX-512 F/BW/DQ/VL, or AVX2 + FMA + F16C; False without)."""
    return bool(extension().sweep_available())


def head_sweep_isa() -> str:
    """The instruction set the head sweep runs on in this build: "AVX-512", "AVX2" (two 256-bit registers per 16
    lanes) or "none" (every call takes the tiles)."""
    return {512: "AVX-512", 256: "AVX2"}.get(int(extension().sweep_lanes()), "none")


@contextlib.contextmanager
def head_sweep(enabled: bool):
    """Within the block the operator uses the head sweep where it applies (True, the default outside) or the tiled
    kernel everywhere (False). Process-wide: not for use while other threads call the operator."""
    ext = extension()
    ext.set_sweep(enabled)
    try:
        yield
    finally:
        ext.set_sweep(True)


@contextlib.contextmanager
def chain_lanes(enabled: bool):
    """Within the block the head sweep's backward puts 8 chains in the lanes of a vector where it applies (True, the
    default outside: AVX2 builds, D >= 8; sliding_dilated_cpu_chain_lanes.h) or runs its row backward everywhere
    (False). Process-wide, like :func:`head_sweep`."""
    ext = extension()
    ext.set_chain_lanes(enabled)
    try:
        yield
    finally:
        ext.set_chain_lanes(True)


@contextlib.contextmanager
def step_pairs(enabled: bool):
    """Within the block the head sweep's forward and row backward take a chain's queries at steps u and u + 1
    together, reading their C - 1 shared key and value rows (and, backward, q and dout rows) once (True, the default
    outside; sliding_dilated_cpu_sweep.h's scores_pair, combine_pair), or every query alone (False). The same bits
    either way. Process-wide, like :func:`head_sweep`."""
    ext = extension()
    ext.set_step_pairs(enabled)
    try:
        yield
    finally:
        ext.set_step_pairs(True)


@contextlib.contextmanager
def one_chain(enabled: bool):
    """Within the block the head sweep's units walk one dilation chain where that was measured faster on AVX-512
    (True, the default outside: the forward at C = 16; at C = 2, 4, 8 both directions unless a head's rows are
    adjacent, and the backward at C = 4, 8 with adjacent fp32 rows too; sliding_dilated_cpu_sweep.h's kOneChain),
    or take G chains by the rings' byte budget everywhere (False). Outputs and dq, dk, dv have the same bits either
    way; dr and the pads' gradients are sums over units, so their order, and last bits, can change. Process-wide,
    like :func:`head_sweep`."""
    ext = extension()
    ext.set_one_chain(enabled)
    try:
        yield
    finally:
        ext.set_one_chain(True)


@torch.library.custom_op("regulargpt::sliding_dilated_cpu", mutates_args=(), device_types="cpu")
def _forward(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, pad_k: Tensor | None, pad_v: Tensor | None,
             dilation: int, query_start: int, query_step: int) -> tuple[Tensor, Tensor]:
    out, probs = extension().forward(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step)
    return out, probs


@torch.library.custom_op("regulargpt::sliding_dilated_cpu_backward", mutates_args=(), device_types="cpu")
def _backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, pad_k: Tensor | None,
              pad_v: Tensor | None, probs: Tensor, dilation: int, query_start: int,
              query_step: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    grads = extension().backward(dout, q, k, v, rel_bias, pad_k, pad_v, probs, dilation, query_start, query_step)
    return tuple(grads)  # type: ignore[return-value]


def _acc_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


@_forward.register_fake
def _forward_fake(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step):
    b, tq, h, dh = q.shape
    return q.new_empty(b, tq, h, dh), q.new_empty(b, h, tq, rel_bias.shape[1], dtype=_acc_dtype(q))


@_backward.register_fake
def _backward_fake(dout, q, k, v, rel_bias, pad_k, pad_v, probs, dilation, query_start, query_step):
    pad_shape = (k.shape[0], k.shape[2], k.shape[3]) if pad_k is not None else (0,)
    dq, dk, dv = (torch.empty_like(x if x.stride(-1) == 1 else x.contiguous()) for x in (q, k, v))  # their layout
    return dq, dk, dv, q.new_empty(rel_bias.shape, dtype=_acc_dtype(q)), q.new_empty(pad_shape), q.new_empty(pad_shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step = inputs
    ctx.save_for_backward(q, k, v, rel_bias, pad_k, pad_v, output[1])
    ctx.geometry = (dilation, query_start, query_step)


def _autograd_backward(ctx, dout: Tensor, _dprobs: Tensor | None):
    q, k, v, rel_bias, pad_k, pad_v, probs = ctx.saved_tensors
    dq, dk, dv, dr, dpad_k, dpad_v = _backward(dout, q, k, v, rel_bias, pad_k, pad_v, probs, *ctx.geometry)
    pads = (dpad_k, dpad_v) if pad_k is not None else (None, None)
    return dq, dk, dv, dr.to(rel_bias.dtype), *pads, None, None, None


_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def sliding_dilated_cpu(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                        pad_k: Tensor | None = None, pad_v: Tensor | None = None, query_start: int = 0,
                        query_step: int = 1) -> Tensor:
    """The operator's output (B, Tq, H, Dh); q (B, Tq, H, Dh), k, v (B, T, H, Dh) with stride(-1) == 1."""
    return torch.ops.regulargpt.sliding_dilated_cpu(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start,
                                                    query_step)[0]
