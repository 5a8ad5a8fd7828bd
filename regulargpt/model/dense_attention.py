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


def causal_attention(q: Tensor, k: Tensor, v: Tensor, bias: BiasFn | None = None, memory_mb: int = 256,
                     offset: int = 0) -> Tensor:
    """Causal attention over (B, H, T, Dh) inputs; `bias` maps positions to an (H, Tq, Tk) additive fp32 bias.

    `offset` shifts absolute positions (the first query is position `offset`); biases only see differences.
    """
    b, h, t, dh = q.shape
    if bias is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    sdt = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(dh)
    chunk = query_chunk_size(b, h, t, memory_mb)
    positions = torch.arange(offset, offset + t, device=q.device)
    outs = []
    for start in range(0, t, chunk):
        end = min(t, start + chunk)
        scores = torch.matmul(q[:, :, start:end], k[:, :, :end].transpose(-1, -2)).to(sdt) * scale  # (B, H, c, end)
        scores = scores + bias(positions[start:end], positions[:end]).to(sdt)[None]
        future = positions[:end][None, :] > positions[start:end][:, None]  # (c, end)
        probs = scores.masked_fill(future, float("-inf")).softmax(-1).to(v.dtype)
        outs.append(torch.matmul(probs, v[:, :, :end]))  # (B, H, c, Dh)
    return torch.cat(outs, dim=2)
