"""Causal sliding-window attention for the windowed dense baseline (``model.window`` = W > 0), banded: no T×T tensor.

Query m sees exactly the last W keys, m − W < n <= m:

    out_m = Σ_{n = max(0, m−W+1)}^{m} softmax_n(q_m·k_n / sqrt(Dh) + b(m − n)) v_n

with b an optional relative bias (ALiBi, T5, KERPLE: every registered bias depends on Δ = m − n alone). Position
signals applied to q/k or the input (RoPE, sinusoidal, learned) happen before, as in dense attention.

Blocks. The queries are cut into blocks of W (the last block padded with dummy queries whose output is dropped);
query block j (absolute positions f + jW … f + jW + W − 1, f = the first query's position) reads 2W keys, the key
block before it and its own, at positions f − W + jW … f + jW + W − 1 (keys below position 0 are zero padding,
masked). In block coordinates, query i and key slot s have Δ = W + i − s, visible iff 0 <= Δ < W, i.e.
i < s <= W + i: the same (W, 2W) band for every block, and the bias of that band is computed once per call,
``bias(W..2W−1, 0..2W−1)`` → (H, W, 2W). Work and memory: O(T·2W) scores per head instead of O(T²/2).
Worked example, W = 2, queries at 0..3: block 0 = queries 0, 1 against keys −2, −1, 0, 1 (−2, −1 padding), query 1
sees slots 2, 3 = keys 0, 1; block 1 = queries 2, 3 against keys 0..3, query 3 sees keys 2, 3.

W >= the number of keys: every key is in every query's window, and this is dense causal attention
(:func:`~regulargpt.model.dense_attention.causal_attention`, its fused paths) exactly; so a model trained at
T_train = W trains exactly as the unwindowed baseline, and differs only past W.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from regulargpt.model.dense_attention import BiasFn, CausalBias, causal_attention

__all__ = ["sliding_window_attention", "window_band_mask"]


def window_band_mask(window: int, bias: BiasFn | None, device: torch.device, dtype: torch.dtype) -> Tensor:
    """(H or 1, W, 2W) additive mask of one query block against its two key blocks: b(Δ) where 0 <= Δ < W with
    Δ = W + i − s, −inf elsewhere.

    >>> window_band_mask(2, None, torch.device("cpu"), torch.float32)[0].tolist()
    [[-inf, 0.0, 0.0, -inf], [-inf, -inf, 0.0, 0.0]]
    """
    queries = torch.arange(window, 2 * window, device=device)
    keys = torch.arange(2 * window, device=device)
    delta = queries[:, None] - keys[None, :]  # (W, 2W)
    outside = (delta < 0) | (delta >= window)
    values = torch.zeros(1, window, 2 * window, device=device) if bias is None else bias(queries, keys)
    return values.to(dtype).masked_fill(outside, float("-inf"))  # (H, W, 2W)


def _blocks_per_chunk(batch: int, heads: int, window: int, memory_mb: int) -> int:
    """Query blocks per chunk whose fp32 scores (B, H, blocks, W, 2W), held about 3×, fit in memory_mb."""
    per_block = 3 * 4 * batch * heads * window * 2 * window
    return max(1, (memory_mb << 20) // per_block)


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, bias: BiasFn | CausalBias | None = None,
                             memory_mb: int = 256) -> Tensor:
    """Causal attention over the last `window` keys; k, v: (B, H, Tk, Dh), q: (B, H, Tq, Dh) for the LAST Tq
    positions (Tq = Tk: every position; Tq = 1: the newest, as in cached decoding) → (B, H, Tq, Dh).

    `bias` maps (query positions, key positions) to an (H, Tq, Tk) fp32 bias of Δ alone, or is a pass's
    :class:`~regulargpt.model.dense_attention.CausalBias` (used as is when W >= Tk). Scores, bias and softmax in
    fp32 (fp64 for fp64 inputs); under autocast the two products run in the autocast dtype. Memory: query blocks in
    chunks whose score block stays under `memory_mb`.
    """
    if window < 1:
        raise ValueError(f"sliding_window_attention: window must be >= 1, got {window}")
    b, h, tq, dh = q.shape
    tk = k.shape[2]
    if window >= tk:  # every key is inside every window: dense causal attention, exactly
        return causal_attention(q, k, v, bias, memory_mb)
    bias_fn = bias.bias if isinstance(bias, CausalBias) else bias
    device = q.device.type
    if torch.is_autocast_enabled(device):
        low = torch.get_autocast_dtype(device)
        q, k, v = (x.to(low) for x in (q, k, v))
    w, first = window, tk - tq
    blocks = -(-tq // w)
    lo, hi = first - w, first + blocks * w  # key positions lo..hi−1 feed the blocks; outside 0..tk−1: zero padding
    pad = (0, 0, max(0, -lo), max(0, hi - tk))
    k_slab = F.pad(k[:, :, max(0, lo):min(hi, tk)], pad).unflatten(2, (blocks + 1, w))  # (B, H, blocks+1, W, Dh)
    v_slab = F.pad(v[:, :, max(0, lo):min(hi, tk)], pad).unflatten(2, (blocks + 1, w))
    q_blocks = F.pad(q, (0, 0, 0, blocks * w - tq)).unflatten(2, (blocks, w))  # (B, H, blocks, W, Dh)
    mask_dtype = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(device, enabled=False):  # it would cast the fp32 mask to bf16
        band = window_band_mask(w, bias_fn, q.device, mask_dtype)  # (H|1, W, 2W)
        # key slots s < W of block 0 sit at positions lo + s; those below 0 are padding
        padding = (torch.arange(2 * w, device=q.device) + lo < 0)  # (2W,)
        step = _blocks_per_chunk(b, h, w, memory_mb)
        outs = []
        for j0 in range(0, blocks, step):
            j1 = min(blocks, j0 + step)
            keys = torch.cat([k_slab[:, :, j0:j1], k_slab[:, :, j0 + 1:j1 + 1]], dim=3)  # (B, H, n, 2W, Dh)
            values = torch.cat([v_slab[:, :, j0:j1], v_slab[:, :, j0 + 1:j1 + 1]], dim=3)
            mask = band[:, None].expand(-1, j1 - j0, -1, -1)  # (H|1, n, W, 2W)
            if j0 == 0 and bool(padding.any()):
                mask = mask.clone()
                mask[:, 0] = mask[:, 0].masked_fill(padding[None, None, :], float("-inf"))
            outs.append(_masked_attention(q_blocks[:, :, j0:j1], keys, values, mask))  # (B, H, n, W, Dh)
    out = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    return out.flatten(2, 3)[:, :, :tq]  # (B, H, blocks·W, Dh) → the real queries


def _masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """softmax(q·kᵀ/sqrt(Dh) + mask)·v over the last two axes; q (B, H, n, W, Dh), k, v (B, H, n, 2W, Dh), mask
    (H|1, n, W, 2W). A mask without gradient and fp32/fp64 inputs: the fused SDPA kernel on (B, H·n, W, Dh);
    otherwise (a learned bias's gradient, bf16) explicit products with the logits in the mask's dtype."""
    b, h, n, w, dh = q.shape
    if not mask.requires_grad and q.dtype.itemsize >= 4:
        merged = F.scaled_dot_product_attention(
            q.reshape(b, h * n, w, dh), k.reshape(b, h * n, 2 * w, dh), v.reshape(b, h * n, 2 * w, dh),
            attn_mask=mask.expand(h, -1, -1, -1).reshape(h * n, w, 2 * w)[None])  # (B, H·n, W, Dh)
        return merged.unflatten(1, (h, n))
    scores = torch.matmul(q, k.transpose(-1, -2)).to(mask.dtype) * (1.0 / math.sqrt(dh))  # (B, H, n, W, 2W)
    probs = (scores + mask[None]).softmax(-1).to(v.dtype)
    return torch.matmul(probs, v)  # (B, H, n, W, Dh)
