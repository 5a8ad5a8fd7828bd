"""Sliding-Dilated-Attention: the exact O(T·C) kernel and its dense T×T reference (tests only).

Rule (RegularGPT, depth step l, chunk size C, dilation D = C**l): query position m attends exactly to the keys
m - j·D for j = 0..C-1, with logit

    s[m, j] = q_m · k_{m - j·D} / sqrt(Dh) + r[h, j]

Keys at negative positions read the pad key/value (`pad_k`, `pad_v`); with no pads they are masked out (position m
itself is always visible, so no row is empty).

Worked example (C=2, D=2, T=5): position 4 sees keys 4 and 2; position 1 sees key 1 and the pad (position -1).

Kernels. ``cpp``: the fused C++ CPU operator (`regulargpt.kernels.sliding_dilated_cpp`), one pass forward and one
backward in the projection's (B, T, H, Dh) layout, the default on CPU whenever it builds. The PyTorch band
algorithms, kept as fallbacks and references, fold the dilation away: pad T to a multiple of D at the end and view the sequence as D interleaved
subsequences of length N = ceil(T/D) (subsequence s holds positions s, s+D, s+2D, ...). In the folded sequence the
rule becomes a causal band of width C: folded index n sees n, n-1, ..., n-C+1. Three exact band algorithms:

* ``shift``: for each offset j, score = sum(q * k_shifted_j); softmax over the C scores; out = sum_j p_j v_shifted_j.
  Shifted keys are slices of one left-padded tensor (views, no copies). Memory O(T·C + T·Dh). Best for small C.
* ``blocked``: cut the folded sequence into blocks of C queries; each block attends to its own and the previous
  block of keys with one batched matmul, scores (N/C, C, 2C), band outside masked. Memory O(T·C + T·Dh). Best for
  large C, where the matmuls are efficient.
* ``flex``: FlexAttention over the folded sequence, in `flex_sliding.py` (by name only; slower on an H200).

Folding lives in `dilation.py` (the band kernels use it). `auto` picks per call by (device, C, T, dtype):
`choose_algorithm`, the one place the algorithm is chosen (`flex_sliding` only runs FlexAttention).

None ever allocates a T×T tensor. Gradients reach q, k, v, rel_bias and the pads (shift: a hand-written backward;
blocked: plain torch ops; flex: FlexAttention's backward, CUDA only; cpp: its own backward operator).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from regulargpt.kernels import dispatch_cuda, sliding_dilated_cpp
from regulargpt.model import flex_sliding
from regulargpt.model.cpu_operator import cpu_operator
from regulargpt.model.dilation import fold_dilation, unfold_dilation

__all__ = ["sliding_dilated_attention", "reference_sliding_dilated_attention", "adaptive_depth", "choose_algorithm",
           "choose_band", "fused_algorithm", "autocast_inputs", "algorithms_on"]

Algorithm = Literal["auto", "cpp", "triton", "shift", "blocked", "flex"]
Layout = Literal["bhtd", "bthd"]  # q, k, v and the output: (B, H, T, Dh) or (B, T, H, Dh)


def choose_algorithm(chunk_size: int, dilation: int, length: int, dtype: torch.dtype, device: str) -> str:
    """The algorithm `auto` runs for one call on `device` ("cpu", "cuda"): the device's fused kernel when it is
    available, else `choose_band`'s "shift" or "blocked".

    CPU: "cpp" (the C++ operator, `regulargpt.kernels.sliding_dilated_cpp`) whenever it builds on this machine
    (compiled once, cached on disk); when it cannot be built, one warning says why and `choose_band` decides.
    CUDA: the measured table's choice (`regulargpt.kernels.dispatch_cuda.table_choice`: the nearest cell of
    `dispatch_cuda.json`, made by `eval/bench_kernel_gpu.py --dispatch-table`), else `choose_band`. When the table
    names "triton" but the Triton kernel cannot import or build here, one warning says why and `choose_band` decides.
    """
    if device == "cuda":
        picked = dispatch_cuda.table_choice(chunk_size, dilation, length, dtype)
        if picked == "triton":
            picked = fused_algorithm(device)
        return picked or choose_band(chunk_size, dilation, length, dtype)
    return fused_algorithm(device) or choose_band(chunk_size, dilation, length, dtype)


def fused_algorithm(device: str) -> str | None:
    """The fused kernel of `device` ("cpp" on CPU) if it can run here, else None (and one warning, once per process,
    saying why it cannot)."""
    if device not in _FUSED:
        return None
    name, build_error = _FUSED[device]
    error = build_error()
    if error is None:
        return name
    if name not in _FUSED_WARNED:
        _FUSED_WARNED.add(name)
        warnings.warn(f"sliding_dilated_attention: the fused {name!r} kernel is unavailable, so algorithm='auto' "
                      f"falls back to shift/blocked: {error}", RuntimeWarning, stacklevel=3)
    return None


def autocast_inputs(*xs: Tensor | None) -> tuple[Tensor | None, ...]:
    """Under autocast, the tensors cast to the autocast dtype (None stays None); else unchanged."""
    device = next(x for x in xs if x is not None).device.type
    if not torch.is_autocast_enabled(device) or not xs[0].is_floating_point():
        return xs
    low = torch.get_autocast_dtype(device)
    return tuple(None if x is None else x.to(low) for x in xs)


def choose_band(chunk_size: int, dilation: int, length: int, dtype: torch.dtype) -> str:
    """The PyTorch band algorithm for one call, "shift" or "blocked": `auto`'s choice where no fused kernel runs.

    Rule, from `python eval/bench_dispatch.py` (results/bench_dispatch.md: forward + backward at every depth step
    of T in {512, 4096, 16384}, C in {2, 3, 4, 8, 16, 32}, fp32 and bf16). The shift loop makes ~C passes over
    (T, Dh) tensors; the blocked matmuls do 2× the score work but on the matrix units, where bf16 is several times
    faster than fp32 here, and their advantage grows with T. Shift runs up to this C, blocked above:

    ============  ==========  =========
    dtype         T <= 4096   T > 4096
    ============  ==========  =========
    fp32 / fp64   C <= 8      C <= 4
    bf16 / fp16   C <= 4      C <= 3
    ============  ==========  =========

    and shift whenever the folded length N = ceil(T/D) <= 4 (the last depth steps: blocked pads N up to one block
    of C queries; shift was faster at 7 of the 8 such points with C >= 8, by up to 1.5×).

    Measured: bf16 C = 8 blocked 1.6-2.8× faster; fp32 C = 8 at T = 16384 blocked 1.2-1.5× faster; C >= 16 blocked
    up to 9× faster; C <= 3 shift up to 6× faster (fp32 blocked with C = 2 runs tiny matmuls). Over the whole grid
    (212 points) the rule's total time is 1.035× that of always taking the faster of the two (fp32 1.043×, bf16
    1.012×; docs/PERFORMANCE.md; another machine measures its own with `python eval/bench_dispatch.py`).

    FlexAttention ("flex") runs only when asked for by name. On CPU it has no backward (torch 2.13) and needs a
    compile per shape. On an H200 (torch 2.11, bf16, results/gpu/README.md) it was the slower choice: 21.7 ms for
    forward+backward at T = 4096, H = 12, C = 2 against 2.8 ms for blocked on the same GPU, and the base config
    trained at 24,699 tokens/s with flex against 79,940 with this rule.
    """
    if -(-length // dilation) <= 4:
        return "shift"
    two_byte = dtype.itemsize <= 2
    if length <= 4096:
        max_shift = 4 if two_byte else 8
    else:
        max_shift = 3 if two_byte else 4
    return "shift" if chunk_size <= max_shift else "blocked"


def adaptive_depth(length: int, chunk_size: int) -> int:
    """Depth steps L = max(1, ceil(log_C T)), in exact integer arithmetic.

    The smallest L >= 1 with C**L >= T. Float ``math.log`` is wrong at exact powers (C=5, T=125 gives 4, not 3).

    >>> adaptive_depth(125, 5), adaptive_depth(126, 5), adaptive_depth(1, 2), adaptive_depth(40, 2)
    (3, 4, 1, 6)
    """
    if length < 1:
        raise ValueError(f"adaptive_depth: length must be >= 1, got {length}")
    if chunk_size < 2:
        raise ValueError(f"adaptive_depth: chunk_size must be >= 2, got {chunk_size}")
    depth, reach = 1, chunk_size
    while reach < length:
        depth += 1
        reach *= chunk_size
    return depth


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                  pad_k: Tensor | None, pad_v: Tensor | None, layout: Layout = "bhtd") -> None:
    if layout not in ("bhtd", "bthd"):
        raise ValueError(f"layout must be 'bhtd' (B, H, T, Dh) or 'bthd' (B, T, H, Dh); got {layout!r}")
    named = "(B, H, T, Dh)" if layout == "bhtd" else "(B, T, H, Dh)"
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share the shape {named}; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    heads = q.shape[1 if layout == "bhtd" else 2]
    if rel_bias.dim() != 2 or rel_bias.shape[0] != heads:
        raise ValueError(f"rel_bias must be (H, C) with H={heads}; got {tuple(rel_bias.shape)}")
    if dilation < 1:
        raise ValueError(f"dilation must be >= 1, got {dilation}")
    if (pad_k is None) != (pad_v is None):
        raise ValueError("pad_k and pad_v must both be given or both be None")
    if pad_k is not None and pad_k.shape != (q.shape[0], heads, q.shape[3]):
        raise ValueError(f"pad_k/pad_v must be (B, H, Dh) = {(q.shape[0], heads, q.shape[3])}; got {tuple(pad_k.shape)}")


def _score_dtype(x: Tensor) -> torch.dtype:
    """Scores and softmax run in fp32, or fp64 when the inputs are fp64."""
    return torch.promote_types(x.dtype, torch.float32)


class _ShiftBand(torch.autograd.Function):
    """Width-C causal band by shift-and-accumulate with a hand-written backward.

    Inputs are folded: q (B, H, D, N, Dh); k_ext, v_ext (B, H, D, C−1+N, Dh) with folded key n−j at index n+C−1−j.
    Forward:  S_j = q·k_j·scale + r_j (masked where n−j < 0 in mask mode), P = softmax_j(S), out = Σ_j P_j v_j.
    Backward: dP_j = dout·v_j, dS = P ⊙ (dP − Σ_j P_j dP_j), dq = Σ_j dS_j k_j·scale, dk_j += dS_j q·scale,
    dv_j += P_j dout, dr_j = Σ dS_j. Every step is one fused pass per offset j (vecdot / addcmul_), with no
    per-offset zero-filled gradient buffers as autograd's slice backward would make.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k_ext: Tensor, v_ext: Tensor, bias: Tensor,  # type: ignore[override]
                invisible: Tensor | None, scale: float) -> Tensor:
        c, n = bias.shape[1], q.shape[3]
        scores = torch.empty(*q.shape[:4], c, dtype=bias.dtype, device=q.device)  # (B, H, D, N, C)
        for j in range(c):
            scores[..., j] = torch.linalg.vecdot(q, k_ext[:, :, :, c - 1 - j: c - 1 - j + n])
        scores = scores * scale + bias[None, :, None, None, :]
        if invisible is not None:
            scores.masked_fill_(invisible, float("-inf"))
        probs = scores.softmax(-1)
        probs_v = probs.to(v_ext.dtype)
        out = probs_v[..., 0, None] * v_ext[:, :, :, c - 1:]
        for j in range(1, c):
            out.addcmul_(probs_v[..., j, None], v_ext[:, :, :, c - 1 - j: c - 1 - j + n])
        ctx.save_for_backward(q, k_ext, v_ext, probs)
        ctx.scale = scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, None, None]:  # type: ignore[override]
        q, k_ext, v_ext, probs = ctx.saved_tensors
        c, n = probs.shape[-1], q.shape[3]
        dprobs = torch.empty_like(probs)
        for j in range(c):
            dprobs[..., j] = torch.linalg.vecdot(dout, v_ext[:, :, :, c - 1 - j: c - 1 - j + n])
        dscores = probs * (dprobs - (probs * dprobs).sum(-1, keepdim=True))  # softmax backward, (B, H, D, N, C)
        dbias = dscores.sum(dim=(0, 2, 3))  # (H, C)
        dscaled = (dscores * ctx.scale).to(q.dtype)
        probs_v = probs.to(v_ext.dtype)
        # offset j = 0 covers every non-pad row: write it, zero only the C−1 pad rows, then accumulate j >= 1
        dq = dscaled[..., 0, None] * k_ext[:, :, :, c - 1:]
        dk_ext = torch.cat([k_ext.new_zeros(*k_ext.shape[:3], c - 1, k_ext.shape[4]), dscaled[..., 0, None] * q], dim=3)
        dv_ext = torch.cat([v_ext.new_zeros(*v_ext.shape[:3], c - 1, v_ext.shape[4]), probs_v[..., 0, None] * dout], dim=3)
        for j in range(1, c):
            window = slice(c - 1 - j, c - 1 - j + n)
            dq.addcmul_(dscaled[..., j, None], k_ext[:, :, :, window])
            dk_ext[:, :, :, window].addcmul_(dscaled[..., j, None], q)
            dv_ext[:, :, :, window].addcmul_(probs_v[..., j, None], dout)
        return dq, dk_ext, dv_ext, dbias, None, None


def _band_shift(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, pad_k: Tensor | None, pad_v: Tensor | None) -> Tensor:
    """Causal band of width C over the last-but-one axis by shift-and-accumulate. q, k, v: (B, H, D, N, Dh)."""
    b, h, d, n, dh = q.shape
    c = rel_bias.shape[1]
    if pad_k is not None:
        fill_k = pad_k[:, :, None, None, :].expand(b, h, d, c - 1, dh)
        fill_v = pad_v[:, :, None, None, :].expand(b, h, d, c - 1, dh)
        invisible = None
    else:
        fill_k = fill_v = q.new_zeros(b, h, d, c - 1, dh)
        idx = torch.arange(n, device=q.device)
        invisible = idx[:, None] < torch.arange(c, device=q.device)[None, :]  # (N, C): key n−j < 0
    k_ext = torch.cat([fill_k, k], dim=3)  # (B, H, D, C−1+N, Dh): folded key n−j sits at n+C−1−j
    v_ext = torch.cat([fill_v, v], dim=3)
    return _ShiftBand.apply(q, k_ext, v_ext, rel_bias.to(_score_dtype(q)), invisible, 1.0 / math.sqrt(dh))


def _band_blocked(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, pad_k: Tensor | None, pad_v: Tensor | None) -> Tensor:
    """Causal band of width C, blocks of C queries against 2C keys. q, k, v: (B, H, D, N, Dh)."""
    b, h, d, n, dh = q.shape
    sdt = _score_dtype(q)
    c = rel_bias.shape[1]
    nb = -(-n // c)
    pad_end = nb * c - n
    scale = 1.0 / math.sqrt(dh)
    if pad_end:
        q, k, v = (F.pad(x, (0, 0, 0, pad_end)) for x in (q, k, v))
    if pad_k is not None:
        first_k = pad_k[:, :, None, None, :].expand(b, h, d, c, dh)
        first_v = pad_v[:, :, None, None, :].expand(b, h, d, c, dh)
    else:
        first_k = first_v = q.new_zeros(b, h, d, c, dh)
    k_ext = torch.cat([first_k, k], dim=3).view(b, h, d, nb + 1, c, dh)  # block 0 = the pad block
    v_ext = torch.cat([first_v, v], dim=3).view(b, h, d, nb + 1, c, dh)
    keys = torch.cat([k_ext[:, :, :, :-1], k_ext[:, :, :, 1:]], dim=4)  # (B, H, D, nb, 2C, Dh): previous + own block
    values = torch.cat([v_ext[:, :, :, :-1], v_ext[:, :, :, 1:]], dim=4)
    qb = q.view(b, h, d, nb, c, dh)
    scores = torch.matmul(qb, keys.transpose(-1, -2)).to(sdt) * scale  # (B, H, D, nb, C, 2C)
    # Query i of a block sees window slot w = C + i - j for offset j = 0..C-1; other slots are outside the band.
    i = torch.arange(c, device=q.device)[:, None]
    w = torch.arange(2 * c, device=q.device)[None, :]
    offset = c + i - w  # (C, 2C): the j each slot corresponds to
    in_band = (offset >= 0) & (offset < c)
    bias = rel_bias.to(sdt)[:, offset.clamp(0, c - 1)]  # (H, C, 2C)
    bias = bias.masked_fill(~in_band, float("-inf"))
    scores = scores + bias[None, :, None, None]
    if pad_k is None:  # block 0's previous block is the pad block: masked in mask mode
        head = scores[:, :, :, :1].clone()
        head[..., :c] = float("-inf")
        scores = torch.cat([head, scores[:, :, :, 1:]], dim=3)
    probs = scores.softmax(-1).to(v.dtype)
    out = torch.matmul(probs, values)  # (B, H, D, nb, C, Dh)
    return out.view(b, h, d, nb * c, dh)[:, :, :, :n]


def sliding_dilated_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                              pad_k: Tensor | None = None, pad_v: Tensor | None = None,
                              algorithm: Algorithm = "auto", layout: Layout = "bhtd") -> Tensor:
    """Exact sliding-dilated attention in O(T·C) time and memory per head.

    Args:
        q, k, v: (B, H, T, Dh), or (B, T, H, Dh) with ``layout="bthd"``.
        rel_bias: (H, C) learnable per-head scalars; r[h, j] is added to the logit of key m - j·dilation.
        dilation: D = C**l at depth step l.
        pad_k, pad_v: (B, H, Dh) key/value read by out-of-range (negative) positions, or None to mask them.
        algorithm: "cpp" (the fused C++ CPU operator), "triton" (the fused Triton kernel, CUDA), "shift", "blocked", "flex" (FlexAttention; CUDA, or CPU
            without gradients) or "auto" (`choose_algorithm`: the device's fused kernel when it builds, else the
            faster of shift and blocked for this C, folded length and dtype).

        layout: "bhtd" or "bthd", of q, k, v and the output. The fused kernels ("cpp", "triton") read and write
            (B, T, H, Dh), the projection's own layout: "bthd" reaches them with no transpose either way (a layer's
            heads are then views of its projection, and its output projection reads the kernel's output as is);
            the PyTorch algorithms run on transpose(1, 2) views.

    Returns:
        (B, H, T, Dh), or (B, T, H, Dh) with ``layout="bthd"``; from "cpp" and "triton" with "bhtd" a transpose(1, 2)
        view of their (B, T, H, Dh) output. Under autocast, q/k/v/pads are
        cast to the autocast dtype first (bf16 matmuls on CPUs with AVX-512 bf16/AMX); scores and softmax run in
        fp32 (fp64 for fp64 inputs) whatever the input dtype.
    """
    _check_inputs(q, k, v, rel_bias, dilation, pad_k, pad_v, layout)
    device = q.device.type
    q, k, v, pad_k, pad_v = autocast_inputs(q, k, v, pad_k, pad_v)
    token_major = layout == "bthd"
    t, c = q.shape[1 if token_major else 2], rel_bias.shape[1]
    chosen = choose_algorithm(c, dilation, t, q.dtype, device) if algorithm == "auto" else algorithm
    if chosen != "flex" and chosen not in _KERNELS:
        raise ValueError(f"algorithm must be one of auto, {', '.join(_KERNELS)}, flex; got {algorithm!r}")
    swap = token_major != (chosen in _TOKEN_MAJOR)  # the kernel reads the other layout: transpose(1, 2) views
    if swap:
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if chosen == "flex":
        out = flex_sliding.flex_sliding_dilated_attention(q, k, v, rel_bias, dilation, pad_k, pad_v)
    else:
        with torch.autocast(device, enabled=False):
            out = _KERNELS[chosen](q, k, v, rel_bias, dilation, pad_k, pad_v)
    return out.transpose(1, 2) if swap else out


def _run_cpp(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None,
             pad_v: Tensor | None) -> Tensor:
    """The C++ operator on q, k, v (B, T, H, Dh) (stride(-1) 1; views of the projection, no copy) → its contiguous
    (B, T, H, Dh) output (`cpu_operator`: the registered operator under torch.compile, the extension itself in
    eager mode)."""
    return cpu_operator(q, k, v, rel_bias, dilation, pad_k, pad_v)


def _run_triton(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None,
                pad_v: Tensor | None) -> Tensor:
    """The Triton operator (CUDA; CPU tensors only under TRITON_INTERPRET=1) on q, k, v (B, T, H, Dh) → (B, T, H, Dh).
    Imported on first use: triton ships with CUDA builds of torch and is only a dev extra on CPU machines."""
    if q.dtype == torch.float64:
        raise ValueError("algorithm='triton' takes fp32, bf16 or fp16 inputs; fp64 runs on 'cpp', 'shift' or 'blocked'")
    try:
        from regulargpt.kernels.sliding_dilated_triton import triton_sliding_dilated_attention
    except ImportError as exc:
        raise RuntimeError(f"algorithm='triton' needs the triton package ({exc}); install it or use 'auto'") from exc
    return triton_sliding_dilated_attention(q, k, v, rel_bias, dilation, pad_k, pad_v)


def _folded(band: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """A band algorithm on the folded view (B, H, D, N, Dh), wrapped to take and return (B, H, T, Dh)."""
    def run(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None,
            pad_v: Tensor | None) -> Tensor:
        qf, kf, vf = (fold_dilation(x, dilation) for x in (q, k, v))  # (B, H, D, N, Dh)
        return unfold_dilation(band(qf, kf, vf, rel_bias, pad_k, pad_v), q.shape[2])
    return run


# Every algorithm by name; "flex" runs outside (it keeps autocast). A device's fused kernel joins _FUSED too:
# device → (its name, a function returning why it cannot run here, or None).
_KERNELS: dict[str, Callable[..., Tensor]] = {"cpp": _run_cpp, "triton": _run_triton,
                                              "shift": _folded(_band_shift), "blocked": _folded(_band_blocked)}
_TOKEN_MAJOR = ("cpp", "triton")  # the kernels that read and write (B, T, H, Dh); the others (B, H, T, Dh)
_FUSED: dict[str, tuple[str, Callable[[], str | None]]] = {"cpu": ("cpp", sliding_dilated_cpp.build_error),
                                                           "cuda": ("triton", dispatch_cuda.triton_build_error)}
_FUSED_WARNED: set[str] = set()
# algorithm → the device types where it runs forward and backward (None: every device). Triton's kernel also runs
# CPU tensors under TRITON_INTERPRET=1 (tests); flex has no CPU backward.
_DEVICES: dict[str, tuple[str, ...] | None] = {"cpp": ("cpu",), "triton": ("cuda",), "shift": None, "blocked": None,
                                               "flex": ("cuda",)}


def algorithms_on(device: str) -> list[str]:
    """The algorithms with a forward and a backward on `device` ("cpu", "cuda", …), in registry order, e.g.
    algorithms_on("cuda") == ["triton", "shift", "blocked", "flex"], algorithms_on("cpu") == ["cpp", "shift",
    "blocked"] ("triton" too under TRITON_INTERPRET=1). Whether a listed one builds here is its own error to report."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return [name for name, devices in _DEVICES.items()
            if devices is None or device in devices or (name == "triton" and device == "cpu" and interpreted)]


def reference_sliding_dilated_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                                        pad_k: Tensor | None = None, pad_v: Tensor | None = None) -> Tensor:
    """Dense reference built from the full T×T mask of the rule above (plus one pad column). Tests only."""
    _check_inputs(q, k, v, rel_bias, dilation, pad_k, pad_v)
    b, h, t, dh = q.shape
    c = rel_bias.shape[1]
    dev = q.device
    m = torch.arange(t, device=dev)[:, None]
    n = torch.arange(t, device=dev)[None, :]
    diff = m - n
    j = torch.div(diff, dilation, rounding_mode="floor")
    visible = (diff >= 0) & (diff % dilation == 0) & (j < c)  # (T, T)
    bias = torch.full((h, t, t), float("-inf"), dtype=q.dtype, device=dev)
    bias[:, visible] = rel_bias[:, j[visible]].to(q.dtype)
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh) + bias  # (B, H, T, T)
    if pad_k is None:
        return torch.matmul(scores.softmax(-1), v)
    # Pad slots: query m has one pad key per j with m - j·D < 0. All pad keys are identical, so they are one column
    # whose weight is the sum over those j of exp(q·pad_k/sqrt(Dh) + r[h, j]) = exp(q·pad_k/sqrt(Dh) + logsumexp r).
    jj = torch.arange(c, device=dev)
    pad_j = (m - jj[None, :] * dilation) < 0  # (T, C)
    pad_bias = torch.where(pad_j[None], rel_bias[:, None, :].to(q.dtype), torch.tensor(float("-inf"), dtype=q.dtype, device=dev))
    pad_bias = torch.logsumexp(pad_bias, dim=-1)  # (H, T), -inf where no pad is visible
    pad_scores = (q * pad_k[:, :, None, :]).sum(-1) / math.sqrt(dh) + pad_bias  # (B, H, T)
    probs = torch.cat([scores, pad_scores[..., None]], dim=-1).softmax(-1)  # (B, H, T, T+1)
    return torch.matmul(probs[..., :t], v) + probs[..., t:] * pad_v[:, :, None, :]
