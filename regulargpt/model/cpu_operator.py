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
        q, k, v, rel_bias, pad_k, pad_v, probs = ctx.saved_tensors
        dq, dk, dv, dr, dpad_k, dpad_v = sliding_dilated_cpp.extension().backward(
            dout, q, k, v, rel_bias, pad_k, pad_v, probs, *ctx.geometry)
        pads = (dpad_k, dpad_v) if pad_k is not None else (None, None)
        return dq, dk, dv, dr.to(rel_bias.dtype), *pads, None, None, None


def cpu_operator(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None = None,
                 pad_v: Tensor | None = None, query_start: int = 0, query_step: int = 1) -> Tensor:
    """Sliding-dilated attention by the fused C++ operator: out (B, Tq, H, Dh) for queries at positions
    query_start + i·query_step (module doc for the layouts); the registered operator when torch.compile traces
    this call, the extension through `_EagerOperator` otherwise."""
    if torch.compiler.is_compiling():
        return sliding_dilated_cpp.sliding_dilated_cpu(q, k, v, rel_bias, dilation, pad_k, pad_v, query_start,
                                                       query_step)
    return _EagerOperator.apply(q, k, v, rel_bias, pad_k, pad_v, dilation, query_start, query_step)
