"""Rotary position signals: RoPE (with the inference-time scalings of ``model.rope_scaling``) and xPos.

RoPE (Su et al. 2021) rotates each (x_{2i}, x_{2i+1}) pair of q and k by the angle p·θ_i, θ_i = base^(−2i/Dh),
i < Dh/2, so q_m·k_n depends on m − n only. ``rope_scaling`` (Hugging Face semantics, checked by
:func:`regulargpt.config.rope_scaling.check_rope_scaling`) changes θ and multiplies cos and sin by an attention
factor a (so the logits by a²); f = factor, L0 = original_max_position_embeddings, d = Dh:

* linear (position interpolation, Chen et al. 2023):  θ_i / f;
* ntk (NTK-aware, fixed):                            base' = base · f^(d/(d−2));
* dynamic (dynamic NTK) at sequence length T:        base' = base · (f·max(T, L0)/L0 − (f − 1))^(d/(d−2));
* yarn (Peng et al. 2023): θ_i' = θ_i/f · (1 − γ_i) + θ_i · γ_i, γ_i = 1 − clamp((i − lo)/(hi − lo), 0, 1), with
  lo, hi = floor/ceil of d·log(L0 / (2π·β))/(2·log base) at β = beta_fast (32) and beta_slow (1), clipped to
  [0, d − 1]; a = attention_factor, else mscale(f, mscale)/mscale(f, mscale_all_dim) when both are set, else
  mscale(f) = 0.1·ln f + 1.

xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer"): RoPE times a per-pair scale
ζ_i = (2i/d + γ)/(1 + γ), γ = 0.4: q at position n is multiplied by ζ_i^((n − c)/B), k at m by ζ_i^(−(m − c)/B)
(B = scale_base, 512), so q·k carries ζ_i^((n − m)/B), a decay with distance for n > m. The centre c cancels in
the product; it is the middle of the key positions of each call (as torchscale's ``min_pos = −length//2``), which
keeps the exponents within ±T/(2B): fp32 and bf16 stay finite to T ≈ 2·B·ln(3.4e38)/ln(1/ζ_0) ≈ 72,500 at B = 512
(measured: the scales are finite at T = 72,400, and overflow at 72,600).

Both modules expose ``rotate_pair(q, k, key_start)`` (keys at positions key_start.., the queries the last rows of
them); ``length_dependent`` says a key's rotation depends on the sequence length (dynamic NTK, xPos's centre), so a
decoder must rotate its cached keys at every step rather than cache them rotated.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["RotaryEmbedding", "XPosEmbedding", "rope_frequencies"]


def rope_frequencies(head_dim: int, base: float, scaling: dict[str, Any] | None = None,
                     length: int = 0) -> tuple[Tensor, float]:
    """(θ (Dh/2,) fp32, attention factor a) of RoPE with `scaling` (module doc) at sequence length `length`
    (read by dynamic NTK only). Computed in fp64.

    >>> rope_frequencies(4, 100.0)[0].tolist(), rope_frequencies(4, 100.0, {"rope_type": "linear", "factor": 2.0})[0]
    ([1.0, 0.10000000149011612], tensor([0.5000, 0.0500]))
    """
    scaling = scaling or {}
    kind, d = scaling.get("rope_type"), head_dim
    factor = scaling.get("factor", 1.0)
    exponents = torch.arange(0, d, 2, dtype=torch.float64) / d  # 2i/d
    if kind == "ntk":
        base = base * factor ** (d / (d - 2))
    elif kind == "dynamic":
        original = scaling["original_max_position_embeddings"]
        base = base * (factor * max(length, original) / original - (factor - 1)) ** (d / (d - 2))
    theta = base ** -exponents
    attention = 1.0
    if kind == "linear":
        theta = theta / factor
    elif kind == "yarn":
        theta, attention = _yarn(theta, d, base, factor, scaling)
    return theta.float(), attention


def _yarn(theta: Tensor, d: int, base: float, factor: float, scaling: dict[str, Any]) -> tuple[Tensor, float]:
    """YaRN's blend of interpolated and original frequencies, and its attention factor (module doc)."""
    original = scaling["original_max_position_embeddings"]

    def dim_of(rotations: float) -> float:  # the dimension that turns `rotations` times over the original length
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = dim_of(scaling.get("beta_fast", 32.0)), dim_of(scaling.get("beta_slow", 1.0))
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - lo) / ((hi - lo) or 0.001)).clamp(0, 1)
    theta = theta / factor * ramp + theta * (1 - ramp)  # ramp 0: extrapolate (θ), ramp 1: interpolate (θ/f)

    def mscale(m: float = 1.0) -> float:
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1 else 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        ms, ms_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(ms) / mscale(ms_all) if ms and ms_all else mscale()
    return theta, float(attention)


def _rotate(x: Tensor, positions: Tensor, theta: Tensor, scale: Tensor | float) -> Tensor:
    """x (B, H, T, Dh) with pair i rotated by positions·θ_i and multiplied by `scale` ((T, Dh/2) or a number)."""
    angles = positions.float()[:, None] * theta.to(x.device)[None, :]  # (T, Dh/2)
    cos, sin = angles.cos() * scale, angles.sin() * scale
    xf = x.float().unflatten(-1, (-1, 2))  # (B, H, T, Dh/2, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).to(x.dtype)  # (B, H, T, Dh)


class RotaryEmbedding(nn.Module):
    """RoPE with an optional inference-time `scaling` (module doc); computed in fp32."""

    def __init__(self, head_dim: int, base: float = 10000.0, scaling: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.head_dim, self.base, self.scaling = head_dim, base, dict(scaling or {})
        theta, self.attention_factor = rope_frequencies(head_dim, base, self.scaling)
        self.register_buffer("inv_freq", theta, persistent=False)
        self.length_dependent = self.scaling.get("rope_type") == "dynamic"

    def frequencies(self, length: int) -> tuple[Tensor, float]:
        """(θ, attention factor) at sequence length `length` (it matters for dynamic NTK only)."""
        if not self.length_dependent:
            return self.inv_freq, self.attention_factor
        return rope_frequencies(self.head_dim, self.base, self.scaling, length)

    def forward(self, x: Tensor, positions: Tensor, length: int = 0) -> Tensor:
        """x: (B, H, T, Dh), positions: (T,) → rotated x, same dtype; `length`: the sequence length (dynamic)."""
        theta, attention = self.frequencies(length)
        return _rotate(x, positions, theta, attention)

    def rotate_pair(self, q: Tensor, k: Tensor, key_start: int) -> tuple[Tensor, Tensor]:
        """k (B, H, Tk, Dh) at positions key_start..key_start+Tk−1 and q (B, H, Tq, Dh) at the last Tq of them."""
        length = key_start + k.shape[2]
        keys = torch.arange(key_start, length, device=k.device)
        return self(q, keys[k.shape[2] - q.shape[2]:], length), self(k, keys, length)


class XPosEmbedding(RotaryEmbedding):
    """xPos: RoPE with the per-pair scale ζ_i^(±(p − c)/B) (module doc); q and k go through :meth:`rotate_pair`
    together (their scales differ and share the centre c)."""

    def __init__(self, head_dim: int, base: float = 10000.0, gamma: float = 0.4, scale_base: float = 512.0) -> None:
        super().__init__(head_dim, base)
        zeta = (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim + gamma) / (1 + gamma)  # (Dh/2,)
        self.register_buffer("zeta", zeta.float(), persistent=False)
        self.scale_base = scale_base
        self.length_dependent = True  # the centre moves with the keys

    def scale(self, positions: Tensor, centre: int, key: bool) -> Tensor:
        """(T, Dh/2) fp32: ζ^((p − c)/B) for queries, ζ^(−(p − c)/B) for keys."""
        power = (positions.float() - centre) / self.scale_base * (-1.0 if key else 1.0)
        return self.zeta.to(positions.device)[None, :] ** power[:, None]

    def forward(self, x: Tensor, positions: Tensor, length: int = 0) -> Tensor:
        raise TypeError("XPosEmbedding scales queries and keys differently: call rotate_pair(q, k, key_start)")

    def rotate_pair(self, q: Tensor, k: Tensor, key_start: int) -> tuple[Tensor, Tensor]:
        keys = torch.arange(key_start, key_start + k.shape[2], device=k.device)
        queries = keys[k.shape[2] - q.shape[2]:]
        centre = key_start + k.shape[2] // 2
        return (_rotate(q, queries, self.inv_freq, self.scale(queries, centre, key=False)),
                _rotate(k, keys, self.inv_freq, self.scale(keys, centre, key=True)))
