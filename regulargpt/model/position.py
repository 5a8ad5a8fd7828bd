"""Position signals for the dense baselines: additive attention biases and absolute/rotary embeddings.

Additive biases (Δ = query − key >= 0; added to the logits after the 1/sqrt(d_head) scaling; computed in fp32):

* ALiBi:         b_h(Δ) = −m_h·Δ, fixed slopes m_h (see :func:`alibi_slopes`).
* T5:            b_h(Δ) = table[bucket(Δ), h], learned; 32 causal buckets up to distance 128.
* KERPLE-log:    b_h(Δ) = −r1_h·log(1 + r2_h·Δ),   r1, r2 >= 0.01.
* KERPLE-power:  b_h(Δ) = −r1_h·Δ^{r2_h},           r1 >= 0.01, r2 ∈ [0.01, 2].
* Sandwich:      b_h(Δ) = (Σ_{i=1}^{d'/2} cos(Δ / 10000^(2i/d')) − d'/2) / (8h/H), fixed (see :class:`SandwichBias`).

FIRE, whose bias depends on the query position too, is in :mod:`regulargpt.model.fire`.

Every bias module maps (query positions (Tq,), key positions (Tk,)) to an (H, Tq, Tk) fp32 tensor; entries with
Δ < 0 are finite filler (the caller masks them). Registry: :data:`ATTENTION_BIASES`.

Embeddings: sinusoidal and learned absolute positions (added to token embeddings); RoPE and xPos (rotate q and k)
are in :mod:`regulargpt.model.rotary` (re-exported here).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from regulargpt.model.rotary import RotaryEmbedding, XPosEmbedding

__all__ = [
    "alibi_slopes",
    "t5_relative_bucket",
    "AlibiBias",
    "T5Bias",
    "KerpleLogBias",
    "KerplePowerBias",
    "SandwichBias",
    "ATTENTION_BIASES",
    "sinusoidal_table",
    "LearnedPositions",
    "RotaryEmbedding",
    "XPosEmbedding",
]

KERPLE_EPS = 0.01


def alibi_slopes(n_heads: int) -> Tensor:
    """ALiBi head slopes (Press et al. 2022), fp32, shape (n_heads,).

    n a power of two: m_i = 2^(−8i/n), i = 1..n. Otherwise the power-of-two schedule for the largest power p < n,
    followed by every other slope of the 2p schedule for the remaining n − p heads.

    >>> alibi_slopes(4).tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    """
    if n_heads < 1:
        raise ValueError(f"alibi_slopes: n_heads must be >= 1, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    p = 1 << (n_heads.bit_length() - 1)
    slopes = power_of_two(p)
    if p != n_heads:
        slopes += power_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


def t5_relative_bucket(distance: Tensor, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Causal T5 bucket of distance Δ = query − key (negative Δ, a future key, maps to bucket 0).

    Δ < num_buckets/2 → Δ (exact); else min(num_buckets−1, nb/2 + floor(log(Δ/(nb/2)) / log(max_distance/(nb/2))
    · nb/2)). Computed in fp64 so bucket boundaries are exact. 32/128: 15→15, 16→16, 19→17, 112→30, 113→31, 10000→31.
    """
    n = distance.clamp(min=0).to(torch.int64)
    max_exact = num_buckets // 2
    scaled = torch.log(n.clamp(min=1).double() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).floor().to(torch.int64)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(n < max_exact, n, large)


def _distance(query_pos: Tensor, key_pos: Tensor) -> Tensor:
    return (query_pos[:, None] - key_pos[None, :]).float()  # (Tq, Tk)


class AlibiBias(nn.Module):
    """ALiBi: b_h(Δ) = −m_h·Δ with fixed slopes (a buffer, not a parameter)."""

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        return -self.slopes.float()[:, None, None] * _distance(query_pos, key_pos)[None]  # (H, Tq, Tk)


class T5Bias(nn.Module):
    """T5 relative bias: a learned (num_buckets, H) table indexed by the causal bucket of Δ; b_h(Δ) = b_h(W) for
    every Δ >= W = ``constant_beyond`` (= max_distance, the last bucket)."""

    def __init__(self, n_heads: int, num_buckets: int = 32, max_distance: int = 128, init_std: float = 0.02) -> None:
        super().__init__()
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.constant_beyond = max_distance  # every Δ >= max_distance is the last bucket (dense_attention, near_bias)
        self.table = nn.Parameter(torch.randn(num_buckets, n_heads) * init_std)

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        bucket = t5_relative_bucket(query_pos[:, None] - key_pos[None, :], self.num_buckets, self.max_distance)
        return self.table.float()[bucket].permute(2, 0, 1)  # (Tq, Tk, H) -> (H, Tq, Tk)


class _ClampStraightThrough(torch.autograd.Function):
    """clamp(x, lo, hi) in the forward pass, identity gradient in the backward pass."""

    @staticmethod
    def forward(ctx, x: Tensor, lo: float, hi: float | None) -> Tensor:  # type: ignore[override]
        return x.clamp(min=lo, max=hi)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        return grad, None, None


class _KerpleBias(nn.Module):
    """Shared parameters of the KERPLE kernels: r1, r2 per head, uniform init as in the reference code.

    Positivity: the *effective* parameters are clamp(raw, 0.01[, 2]) at every forward, as in the reference code. The
    clamp passes gradients straight through (no dead gradient once a raw value leaves the box) and never writes to
    the parameter in place, so it is safe under ZeRO-3 partitioning. So the constraint holds for the values used in
    the bias after any optimizer step, whatever the raw parameters become.
    """

    r2_max: float | None = None
    init_scale: tuple[float, float] = (2.0, 1.0)  # r1 ~ U(0, a), r2 ~ U(0, b)

    def __init__(self, n_heads: int) -> None:
        super().__init__()
        self.r1 = nn.Parameter(torch.rand(n_heads) * self.init_scale[0])
        self.r2 = nn.Parameter(torch.rand(n_heads) * self.init_scale[1])

    def effective(self) -> tuple[Tensor, Tensor]:
        """(r1, r2) as used in the bias, fp32, inside their constraint boxes."""
        r1 = _ClampStraightThrough.apply(self.r1.float(), KERPLE_EPS, None)
        r2 = _ClampStraightThrough.apply(self.r2.float(), KERPLE_EPS, self.r2_max)
        return r1, r2


class KerpleLogBias(_KerpleBias):
    """KERPLE-log: b_h(Δ) = −r1_h·log(1 + r2_h·Δ); <= 0 and non-increasing in Δ."""

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        r1, r2 = self.effective()
        dist = _distance(query_pos, key_pos).clamp(min=0)[None]  # (1, Tq, Tk)
        return -r1[:, None, None] * torch.log1p(r2[:, None, None] * dist)


class KerplePowerBias(_KerpleBias):
    """KERPLE-power: b_h(Δ) = −r1_h·Δ^{r2_h}, r2 ∈ (0, 2]; <= 0 and non-increasing in Δ. Init r1 ~ U(0,1), r2 ~ U(0,2)."""

    r2_max = 2.0
    init_scale = (1.0, 2.0)

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        r1, r2 = self.effective()
        dist = _distance(query_pos, key_pos).clamp(min=0)[None]
        return -r1[:, None, None] * dist.pow(r2[:, None, None])


class SandwichBias(nn.Module):
    """Sandwich (Chi, Fan, Rudnicky, Ramadge 2022, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis", arXiv 2212.10356): the inner product of two sinusoidal position vectors of dimension
    d', p_m·p_n = Σ_{i=1}^{d'/2} cos((m − n)·ω_i), ω_i = 10000^(−2i/d'), shifted by −d'/2 so that it is 0 at Δ = 0
    and <= 0 elsewhere, and compressed per head by the ALiBi-like ratio 8h/H, h = 1..H:

        b_h(Δ) = (Σ_{i=1}^{d'/2} cos(Δ·ω_i) − d'/2) / (8h/H).

    Fixed, no parameter. The paper's text could not be read here; this follows NVIDIA NeMo's implementation,
    "based on arXiv 2212.10356" (frequencies i = 1..d'/2, the −d'/2 shift, the 8h/H divisor), as recorded in
    /work/shared/reference/paper_facts.md §5.1. Example, d' = 2, H = 8, head 1: b(Δ) = cos(Δ/100) − 1.
    """

    def __init__(self, n_heads: int, dim: int = 128) -> None:
        super().__init__()
        half = dim // 2
        omega = 10000.0 ** (-2.0 * torch.arange(1, half + 1, dtype=torch.float64) / dim)  # (d'/2,)
        self.register_buffer("omega", omega, persistent=False)
        ratio = 8.0 * torch.arange(1, n_heads + 1, dtype=torch.float64) / n_heads  # (H,)
        self.register_buffer("ratio", ratio, persistent=False)
        self.half = half

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        dist = (query_pos[:, None] - key_pos[None, :]).double()  # (Tq, Tk), fp64: the sum cancels d'/2 terms
        shifted = torch.zeros_like(dist)
        for omega in self.omega.to(dist.device):  # one (Tq, Tk) block at a time, never (Tq, Tk, d'/2)
            shifted += torch.cos(dist * omega) - 1.0
        return (shifted[None] / self.ratio.to(dist.device)[:, None, None]).float()  # (H, Tq, Tk)


ATTENTION_BIASES: dict[str, type[nn.Module]] = {
    "alibi": AlibiBias,
    "t5": T5Bias,
    "kerple_log": KerpleLogBias,
    "kerple_power": KerplePowerBias,
    "sandwich": SandwichBias,
}


def sinusoidal_table(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """Sinusoidal embedding rows, (T, dim): [sin(p·ω_i) | cos(p·ω_i)], ω_i = base^(−2i/dim), i < dim/2."""
    half = dim // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float64, device=positions.device) * 2.0 / dim)
    angles = positions.double()[:, None] * freqs[None, :]  # (T, dim/2)
    table = torch.cat([angles.sin(), angles.cos()], dim=-1)
    if dim % 2:
        table = torch.cat([table, torch.zeros_like(table[:, :1])], dim=-1)
    return table.float()


class LearnedPositions(nn.Module):
    """Learned absolute positions 0..max_positions−1; a longer input raises a clear error."""

    def __init__(self, max_positions: int, dim: int, init_std: float = 0.02) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Parameter(torch.randn(max_positions, dim) * init_std)

    def forward(self, length: int) -> Tensor:
        if length > self.max_positions:
            raise ValueError(
                f"input length {length} exceeds model.max_positions={self.max_positions}: a model with learned "
                f"absolute positions cannot run past the positions it was trained with"
            )
        return self.table[:length]
