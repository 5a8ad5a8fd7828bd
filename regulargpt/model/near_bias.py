"""The gradient of a learned distance bias that is constant beyond a window, computed on the band alone.

FlexAttention differentiates a ``score_mod`` that reads a learned table by scattering dS into the table at every
one of the B·H·T² scores (atomic adds on a GPU, most of them onto the same few addresses): T5 trained at 0.28× the
rate of ALiBi, whose table needs no gradient. A T5 bias is constant per head beyond its window W (every Δ >= W is
the last bucket), and a softmax row is unchanged when one constant is added to all its logits, so

    L(table) = L(near),   near[h, Δ] = table[h, Δ] − table[h, W] for Δ < W, 0 beyond,

and the gradient needs dS only on the band Δ < W:

    dL/dnear[h, Δ] = Σ_{b, m} dS[b, h, m, m − Δ],   dS = P ⊙ (dP − D),   P = exp(s − lse),
    s[m, n] = q_m·k_n/√Dh + table[h, m − n],   dP[m, n] = dO_m·v_n,   D_m = dO_m·O_m,

O(B·H·T·2W·Dh) work in two batched matmuls per block of W queries, no atomics. FlexAttention then reads the table
detached (the same kernel as ALiBi's) and returns lse; :func:`with_near_bias_gradient` routes the band gradient
to `near`. Worked example (W = 2, one query m = 1 seeing keys 0 and 1): dnear[h, 0] = dS[1, 1], dnear[h, 1] =
dS[1, 0]; the gradient of table[h, W] (−(dnear[h, 0] + dnear[h, 1])) is the far keys' Σ dS, since each row's dS
sums to 0.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["near_bias_gradient", "with_near_bias_gradient"]


def near_bias_gradient(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor, table: Tensor,
                       window: int) -> Tensor:
    """(H, W) fp32: Σ over batch and queries of dS at each distance Δ < W (module doc). q, k, v, out, dout:
    (B, H, T, Dh); lse: (B, H, T) natural-log logsumexp of each query's logits; table: (H, >= W) the bias the
    forward read. Blocks of W queries against their 2W keys (the previous block and their own)."""
    b, h, t, dh = q.shape
    w = window
    nb = -(-t // w)
    sdt = torch.promote_types(q.dtype, torch.float32)
    end = nb * w - t
    qb, ob, db = (F.pad(x, (0, 0, 0, end)).view(b, h, nb, w, dh) for x in (q, out, dout))  # (B, H, nb, W, Dh)
    lse_b = F.pad(lse, (0, end)).view(b, h, nb, w, 1)
    # keys and values with W zero rows in front: block i's window is rows i·W .. i·W + 2W − 1 (an unfold view)
    kw, vw = (F.pad(x, (0, 0, w, end)).unfold(2, 2 * w, w) for x in (k, v))  # (B, H, nb, Dh, 2W)
    r = torch.arange(w, device=q.device)[:, None]
    slot = torch.arange(2 * w, device=q.device)[None, :]
    distance = w + r - slot  # (W, 2W): Δ of query row r against key slot
    visible = ((distance >= 0) & (distance < w))[None].expand(nb, w, 2 * w).clone()  # (nb, W, 2W)
    visible[0, :, :w] = False  # block 0's previous block is the zero padding in front of the sequence
    logits = torch.matmul(qb, kw).to(sdt) / math.sqrt(dh) + table.to(sdt)[:, distance.clamp(0, w - 1)][None, :, None]
    probs = torch.where(visible, logits - lse_b, float("-inf")).exp()  # (B, H, nb, W, 2W)
    dprobs = torch.matmul(db, vw).to(sdt)
    rowdot = (db.to(sdt) * ob.to(sdt)).sum(-1, keepdim=True)  # D_m, (B, H, nb, W, 1)
    dscores = (probs * (dprobs - rowdot)).sum(dim=(0, 2)).contiguous()  # (H, W, 2W)
    # Δ = W + r − slot: the entries of one Δ lie 2W + 1 apart in the flattened (W, 2W) block, Δ = W − 1 − e at
    # offset 1 + e
    diagonals = dscores.as_strided((h, w, w), (2 * w * w, 1, 2 * w + 1), 1).sum(-1)  # (H, W) by e
    return diagonals.flip(-1)


class _NearBiasGradient(torch.autograd.Function):
    """out unchanged; backward passes dout on to FlexAttention's backward (q, k, v) and returns the band gradient
    for `near`."""

    @staticmethod
    def forward(ctx, out: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor, table: Tensor,  # type: ignore[override]
                near: Tensor) -> Tensor:
        ctx.save_for_backward(out, lse, q, k, v, table)
        ctx.window = near.shape[1]
        return out.view_as(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout: Tensor):  # type: ignore[override]
        out, lse, q, k, v, table = ctx.saved_tensors
        dnear = near_bias_gradient(q.detach(), k.detach(), v.detach(), out.detach(), lse, dout, table, ctx.window)
        return dout, None, None, None, None, None, dnear


def with_near_bias_gradient(out: Tensor, lse: Tensor, q: Tensor, k: Tensor, v: Tensor, table: Tensor,
                            window: int) -> Tensor:
    """out (B, H, T, Dh) of attention with logits q·k/√Dh + table[h, m − n] computed from the table detached, made
    to carry the table's gradient: `table` (H, T) the learned distance table, constant beyond `window` < T."""
    near = table[:, :window] - table[:, window:window + 1]  # (H, W): the bias less its far value
    return _NearBiasGradient.apply(out, lse, q, k, v, table.detach(), near)
