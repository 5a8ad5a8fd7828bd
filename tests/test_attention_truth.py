"""Attention kernels against references written out in the test, element by element, with biases and masks typed
from the formulas (never taken from the module under test): dense causal and windowed ALiBi attention, and
sliding-dilated attention with its pad state (every kernel the CPU can run)."""

from __future__ import annotations

import math

import pytest
import torch

from regulargpt.model import AlibiBias
from regulargpt.model.dense_attention import causal_attention
from regulargpt.model.regular_gpt import init_rel_bias
from regulargpt.model.sliding_dilated import sliding_dilated_attention
from regulargpt.model.window_attention import sliding_window_attention

SLOPES_2_HEADS = [2.0**-4, 2.0**-8]  # ALiBi, n = 2: 2^(-8i/2), i = 1, 2


def _loop_attention(q, k, v, visible, bias) -> torch.Tensor:
    """out[b, h, i] = Σ_j softmax_j(q_i·k_j/√d + bias(h, i, j)) v_j over the keys j with visible(i, j); queries are
    the last Tq positions. Plain Python loops."""
    b, h, tq, d = q.shape
    tk = k.shape[2]
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            for qi in range(tq):
                i = tk - tq + qi
                keys = [j for j in range(tk) if visible(i, j)]
                logits = torch.stack([q[bi, hi, qi] @ k[bi, hi, j] / math.sqrt(d) + bias(hi, i, j) for j in keys])
                weights = logits.softmax(0)
                out[bi, hi, qi] = sum(w * v[bi, hi, j] for w, j in zip(weights, keys))
    return out


@pytest.mark.parametrize("window,tq", [(0, 9), (0, 1), (3, 9), (4, 2), (1, 9)])
def test_alibi_attention_full_and_windowed_equals_the_loop(window: int, tq: int) -> None:
    """Key j is visible from query i iff 0 <= i − j (< W when windowed); the ALiBi logit adds −m_h·(i − j)."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, tq, 4)
    k, v = torch.randn(2, 2, 9, 4), torch.randn(2, 2, 9, 4)
    q, k = q * 3, k * 3  # visible softmax differences
    bias = AlibiBias(2)
    with torch.no_grad():
        bias.slopes.mul_(16.0)  # slopes 1 and 1/16: a wrong sign or distance moves the output by O(1)
    slopes = [16 * s for s in SLOPES_2_HEADS]
    reach = window or 10**9
    want = _loop_attention(q, k, v, lambda i, j: 0 <= i - j < reach, lambda h, i, j: -slopes[h] * (i - j))
    got = sliding_window_attention(q, k, v, window, bias) if window else causal_attention(q, k, v, bias)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


def _dilated_loop(q, k, v, r, dilation, pad_k, pad_v):
    """Query m sees the keys m − j·D, j = 0..C−1 (logit + r[h, j]); a negative position reads the pad key/value, or
    is masked when there are no pads."""
    b, h, t, d = q.shape
    c = r.shape[1]
    out = torch.zeros_like(q)
    for bi in range(b):
        for hi in range(h):
            for m in range(t):
                logits, values = [], []
                for j in range(c):
                    n = m - j * dilation
                    if n < 0 and pad_k is None:
                        continue
                    key = k[bi, hi, n] if n >= 0 else pad_k[bi, hi]
                    values.append(v[bi, hi, n] if n >= 0 else pad_v[bi, hi])
                    logits.append(q[bi, hi, m] @ key / math.sqrt(d) + r[hi, j])
                weights = torch.stack(logits).softmax(0)
                out[bi, hi, m] = sum(w * x for w, x in zip(weights, values))
    return out


@pytest.mark.parametrize("algorithm", ["auto", "shift", "blocked"])
@pytest.mark.parametrize("c,dilation,t,pad", [(2, 1, 5, True), (2, 2, 5, False), (3, 3, 11, True), (3, 9, 12, False),
                                              (4, 4, 9, True)])
def test_sliding_dilated_attention_equals_the_loop(algorithm: str, c: int, dilation: int, t: int, pad: bool) -> None:
    torch.manual_seed(c * 100 + t)
    q, k, v = (torch.randn(1, 2, t, 4, dtype=torch.float64) * 2 for _ in range(3))
    r = torch.randn(2, c, dtype=torch.float64)
    pk, pv = (torch.randn(1, 2, 4, dtype=torch.float64), torch.randn(1, 2, 4, dtype=torch.float64)) if pad else (None, None)
    want = _dilated_loop(q, k, v, r, dilation, pk, pv)
    got = sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm)
    assert torch.allclose(got, want, atol=1e-9), (got - want).abs().max()


def test_recency_window_scalars_are_minus_alibi_slope_times_offset() -> None:
    r = torch.empty(4, 3)
    init_rel_bias(r, "recency")
    assert r.tolist() == [[0.0, -1 / 4, -2 / 4], [0.0, -1 / 16, -2 / 16], [0.0, -1 / 64, -2 / 64],
                          [0.0, -1 / 256, -2 / 256]]
