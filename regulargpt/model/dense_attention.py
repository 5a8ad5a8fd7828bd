"""Dense causal attention for the baselines, with an optional additive bias, in bounded memory.

out_m = Σ_{n <= m} softmax_n(q_m·k_n / sqrt(Dh) + b(m, n)) v_n

Without a bias this is ``scaled_dot_product_attention(is_causal=True)`` (a fused kernel that never materialises
T×T). With a bias, queries are processed in chunks of `chunk` rows: one chunk holds a (B, H, chunk, T) score block,
so peak memory is O(B·H·chunk·T), never B·H·T·T at long evaluation lengths. Bias, scores and softmax run in fp32
(fp64 for fp64 inputs); probabilities are cast back to the value dtype for the weighted sum.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["causal_attention", "query_chunk_size"]

BiasFn = Callable[[Tensor, Tensor], Tensor]  # (query positions (Tq,), key positions (Tk,)) -> (H, Tq, Tk) fp32


def query_chunk_size(batch: int, heads: int, length: int, memory_mb: int) -> int:
    """Largest query chunk whose fp32 score block (B, H, chunk, T) — held about 3× (scores, probs, bias) — fits."""
    per_row = 3 * 4 * batch * heads * length
    return max(1, min(length, (memory_mb << 20) // max(per_row, 1)))


def causal_attention(q: Tensor, k: Tensor, v: Tensor, bias: BiasFn | None = None, memory_mb: int = 256) -> Tensor:
    """Causal attention; k, v: (B, H, Tk, Dh), q: (B, H, Tq, Dh) for the LAST Tq positions (Tq = Tk: every
    position; Tq = 1: only the last, which sees every key). `bias` maps positions to an (H, Tq, Tk) fp32 bias.
    """
    b, h, tq, dh = q.shape
    tk = k.shape[2]
    first = tk - tq  # absolute position of the first query
    if bias is None:
        if tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        visible = torch.arange(tk, device=q.device)[None, :] <= torch.arange(first, tk, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    sdt = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(dh)
    chunk = query_chunk_size(b, h, tk, memory_mb)
    positions = torch.arange(tk, device=q.device)
    outs = []
    for start in range(0, tq, chunk):
        stop = min(tq, start + chunk)
        end = first + stop  # keys 0..end−1 are visible to this chunk's last query
        query_pos = positions[first + start:end]
        scores = torch.matmul(q[:, :, start:stop], k[:, :, :end].transpose(-1, -2)).to(sdt) * scale  # (B, H, c, end)
        scores = scores + bias(query_pos, positions[:end]).to(sdt)[None]
        future = positions[:end][None, :] > query_pos[:, None]  # (c, end)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1).to(v.dtype)
        outs.append(torch.matmul(probs, v[:, :, :end]))  # (B, H, c, Dh)
    return torch.cat(outs, dim=2)
