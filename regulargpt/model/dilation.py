"""Fold the dilation away: a sequence seen at dilation D is D interleaved subsequences at dilation 1.

Both sliding-dilated kernels (the CPU bands in `sliding_dilated.py`, FlexAttention in `flex_sliding.py`) run on
the folded view. Subsequence s holds positions s, s+D, s+2D, …; the sequence is padded at the end to N·D,
N = ceil(T/D). Worked example (T=5, D=2): N=3, subsequence 0 = positions 0, 2, 4; subsequence 1 = 1, 3, (pad).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = ["fold_dilation", "unfold_dilation"]


def fold_dilation(x: Tensor, dilation: int) -> Tensor:
    """(B, H, T, Dh) -> (B, H, D, N, Dh): D interleaved subsequences, T padded at the end to N*D."""
    b, h, t, dh = x.shape
    n = -(-t // dilation)
    if n * dilation != t:
        x = F.pad(x, (0, 0, 0, n * dilation - t))
    return x.view(b, h, n, dilation, dh).transpose(2, 3)  # (B, H, D, N, Dh)


def unfold_dilation(x: Tensor, length: int) -> Tensor:
    """(B, H, D, N, Dh) -> (B, H, T, Dh), dropping the end padding."""
    b, h, d, n, dh = x.shape
    return x.transpose(2, 3).reshape(b, h, n * d, dh)[:, :, :length]
