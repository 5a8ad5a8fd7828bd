"""The fused C++ CPU operator as the model calls it: `cpu_operator` runs the registered torch.library operator
``regulargpt::sliding_dilated_cpu`` under torch.compile, and the same C++ forward and backward through a plain
``torch.autograd.Function`` in eager mode.

Why two routes to one kernel: in eager mode a torch.library custom operator with a Python autograd formula pays
for torch.library's Python around every call (binding the arguments against the schema, the generated autograd
function, the redispatch), a fixed cost per call that at the tiny config's T = 64 is larger than the kernel's work:
forward + backward of one call on 4-element inputs took 860 µs of CPU time through the registered operator and
380 µs through this route (the extension's forward alone: 10–17 µs; 2-core VM under load; docs/PERFORMANCE.md,
section "T = 64: what RegularGPT spends that ALiBi does not"). torch.compile traces the registered operator, whose
fake implementations give it shapes; eager mode needs none of that. Both routes call `sliding_dilated_cpp.extension()`'s
`forward` and `backward` with the same arguments, so they compute the same tensors bit for bit
(tests/test_kernel_cpp.py).

Layouts are the operator's: q (B, Tq, H, Dh), k, v (B, T, H, Dh), stride(-1) == 1; out (B, Tq, H, Dh) contiguous.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from regulargpt.kernels import sliding_dilated_cpp

__all__ = ["cpu_operator"]


def _extension_backward(ctx, dout: Tensor, packed: bool) -> tuple:
    """The extension's backward on what the forward saved: dq, dk, dv, dr (rel_bias's dtype), dpad_k, dpad_v (None
    without pads); packed: `backward_packed` (dq, dk, dv chunks of one buffer where q, k, v are a projection's)."""
    q, k, v, rel_bias, pad_k, pad_v, probs = ctx.saved_tensors
    ext = sliding_dilated_cpp.extension()
    dq, dk, dv, dr, dpad_k, dpad_v = (ext.backward_packed if packed else ext.backward)(
        dout, q, k, v, rel_bias, pad_k, pad_v, probs, *ctx.geometry)
    pads = (dpad_k, dpad_v) if pad_k is not None else (None, None)
    return dq, dk, dv, dr.to(rel_bias.dtype), *pads


class _EagerOperator(torch.autograd.Function):
    """The operator's forward and backward (the contract of `regulargpt.kernels.sliding_dilated_cpp`), called on
    the extension directly: forward saves the probabilities P (B, H, Tq, C) and returns out; backward returns
    dq, dk, dv, dr (cast to rel_bias's dtype) and, when pads are given, dpad_k, dpad_v (B, H, Dh)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, pad_k: Tensor | None,  # type: ignore[override]
                pad_v: Tensor | None, dilation: int, query_start: int, query_step: int) -> Tensor:
        out, probs = sliding_dilated_cpp.extension().forward(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start,
                                                             query_step)
        ctx.save_for_backward(q, k, v, rel_bias, pad_k, pad_v, probs)
        ctx.geometry = (dilation, query_start, query_step)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor):  # type: ignore[override]
        return *_extension_backward(ctx, dout, packed=False), None, None, None


class _EagerProjectionOperator(torch.autograd.Function):
    """The same on q, k, v that are the three last-dim chunks of one projection (`projection_of`), which it takes
    too: its backward returns the projection's gradient whole (none for the chunks), dq, dk, dv written by the
    extension into the chunks of one buffer (`backward_packed`, whose check matches `projection_of`'s), where the
    split's backward would concatenate three tensors into a fresh one (at T = 65,536 fp32: 80 ms against the
    operator's 58, docs/KERNELS.md)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor,  # type: ignore[override]
                pad_k: Tensor | None, pad_v: Tensor | None, dilation: int) -> Tensor:
        ctx.projection_shape = qkv.shape
        return _EagerOperator.forward(ctx, q, k, v, rel_bias, pad_k, pad_v, dilation, 0, 1)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout: Tensor):  # type: ignore[override]
        dq, dk, dv, *rest = _extension_backward(ctx, dout, packed=True)
        dqkv = dq._base  # the (B, T, 3·H·Dh) buffer dq, dk, dv are chunks of: q, k, v passed projection_of
        if dqkv is None or dk._base is not dqkv or dv._base is not dqkv:
            raise RuntimeError("sliding_dilated_cpu backward_packed: dq, dk, dv are not chunks of one buffer, though "
                               "q, k, v are chunks of one projection (projection_of and projection_chunks disagree)")
        # the projection's gradient whole, in its own shape; none flows back through the chunks q, k, v
        return dqkv.view(ctx.projection_shape), None, None, None, *rest, None


def projection_of(q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
    """The contiguous tensor, (B, T, 3·H·Dh) as the model's qkv projection (regulargpt/model/layers.py) or
    (B, T, 3, H, Dh), whose last-dim chunks q, k, v (B, T, H, Dh) are; or None: other tensors, strides or offsets."""
    base = q._base
    if base is None or k._base is not base or v._base is not base or not base.is_contiguous():
        return None
    b, t, h, dh = q.shape
    stride = (t * 3 * h * dh, 3 * h * dh, dh, 1)
    if k.shape != q.shape or v.shape != q.shape or base.numel() != b * t * 3 * h * dh or base.shape[:2] != (b, t):
        return None
    if q.stride() != stride or k.stride() != stride or v.stride() != stride:
        return None
    at = [x.data_ptr() - base.data_ptr() for x in (q, k, v)]
    return base if at == [0, h * dh * base.element_size(), 2 * h * dh * base.element_size()] else None


def cpu_operator(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None = None,
                 pad_v: Tensor | None = None, query_start: int = 0, query_step: int = 1) -> Tensor:
    """Sliding-dilated attention by the fused C++ operator: out (B, Tq, H, Dh) for queries at positions
    query_start + i·query_step (module doc for the layouts); the registered operator when torch.compile traces
    this call, the extension otherwise: through `_EagerProjectionOperator` on the projection itself where q, k, v
    are its chunks (every-position queries), else through `_EagerOperator`."""
    if torch.compiler.is_compiling():
        return sliding_dilated_cpp.sliding_dilated_cpu(q, k, v, rel_bias, dilation, pad_k, pad_v, query_start,
                                                       query_step)
    if query_start == 0 and query_step == 1 and torch.is_grad_enabled() and (qkv := projection_of(q, k, v)) is not None:
        return _EagerProjectionOperator.apply(qkv, q, k, v, rel_bias, pad_k, pad_v, dilation)
    return _EagerOperator.apply(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step)
