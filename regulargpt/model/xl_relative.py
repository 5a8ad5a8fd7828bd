"""Transformer-XL relative position encoding (Dai et al. 2019), causal, for the formal-language Transformer baseline.

logit(m, n) = [ (q_m + u)·k_n  +  (q_m + v)·r_{m−n} ] / sqrt(Dh),   n <= m,

with learned per-head content bias u and position bias v (H, Dh), and r_Δ = W_r · sin/cos(Δ) the projected
sinusoidal encoding of the distance Δ = m − n (W_r bias-free, d → d, split into heads). Queries are processed in
chunks, so memory is O(B·H·chunk·T) like the other dense baselines.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from regulargpt.model.dense_attention import query_chunk_size
from regulargpt.model.position import sinusoidal_table

__all__ = ["XLRelativeAttention"]


class XLRelativeAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        head_dim = d_model // n_heads
        self.u = nn.Parameter(torch.randn(n_heads, head_dim) * init_std)
        self.v = nn.Parameter(torch.randn(n_heads, head_dim) * init_std)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        nn.init.normal_(self.proj.weight, 0.0, init_std)

    def relative_keys(self, length: int, device: torch.device) -> Tensor:
        """r_Δ for Δ = 0..length−1, split into heads: (H, length, Dh)."""
        table = sinusoidal_table(torch.arange(length, device=device), self.d_model)  # (L, d)
        return self.proj(table.to(self.proj.weight.dtype)).view(length, self.n_heads, -1).transpose(0, 1)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, memory_mb: int = 256) -> Tensor:
        """Causal attention with XL relative logits; k, v: (B, H, T, Dh), q: (B, H, Tq, Dh) for the last Tq
        positions (Tq = T: every position; Tq = 1: the last only) → (B, H, Tq, Dh)."""
        b, h, tq, dh = q.shape
        t = k.shape[2]
        first = t - tq
        sdt = torch.promote_types(q.dtype, torch.float32)
        rel = self.relative_keys(t, q.device).to(q.dtype)  # (H, T, Dh)
        u = self.u.to(q.dtype)[None, :, None, :]
        w = self.v.to(q.dtype)[None, :, None, :]
        chunk = query_chunk_size(b, h, t, memory_mb)
        positions = torch.arange(t, device=q.device)
        outs = []
        for start in range(0, tq, chunk):
            stop = min(tq, start + chunk)
            end = first + stop
            query_pos = positions[first + start:end]
            qc = q[:, :, start:stop]
            content = torch.matmul(qc + u, k[:, :, :end].transpose(-1, -2))  # (B, H, c, end)
            by_distance = torch.matmul(qc + w, rel[:, :end].transpose(-1, -2))  # (B, H, c, Δ = 0..end−1)
            distance = (query_pos[:, None] - positions[None, :end]).clamp(min=0)  # (c, end)
            position_term = by_distance.gather(-1, distance.expand(b, h, -1, -1))
            scores = (content + position_term).to(sdt) / math.sqrt(dh)
            future = positions[None, :end] > query_pos[:, None]
            probs = scores.masked_fill(future, float("-inf")).softmax(-1).to(v.dtype)
            outs.append(torch.matmul(probs, v[:, :, :end]))
        return torch.cat(outs, dim=2)
