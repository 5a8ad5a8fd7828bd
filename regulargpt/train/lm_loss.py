"""Next-token cross-entropy in fp32 without an fp32 copy of the whole (B, T, V) logits.

    loss = lm_loss(logits, targets)        # logits (B, T, V) in any float dtype, targets (B, T) int64

    loss = (1 / N) · Σ_rows CE(float32(logits_row), target_row),   N = B · T

fp32 logits (the CPU configs) go straight to ``F.cross_entropy``: bit for bit today's loss. Lower-precision logits
(bf16 on a GPU) are cut into row chunks of at most ``chunk_elements`` values; each chunk is cast to fp32, reduced
with ``reduction="sum"`` and recomputed in the backward pass (``torch.utils.checkpoint``), so only the bf16 logits and
one fp32 chunk (and its softmax in the backward) are alive at a time instead of two fp32 (B, T, V) tensors (the
cast and log-softmax's saved output). Base config, B = 32, T = 512, V = 8000: 2 × 524 MB fp32 become 2 × 66 MB.
Every row is computed exactly as in the unchunked loss; only the order of the final sum differs (fp32 rounding:
tests/test_host_syncs.py compares both, loss and gradients).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["CHUNK_ELEMENTS", "lm_loss"]

CHUNK_ELEMENTS = 1 << 24  # 16 M fp32 values (64 MB) per chunk


def _chunk_loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets, reduction="sum")


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """Mean cross-entropy of `logits` (B, T, V) against `targets` (B, T), computed in fp32 (see the module doc)."""
    flat = logits.reshape(-1, logits.shape[-1])  # (B·T, V)
    labels = targets.reshape(-1)  # (B·T,)
    if flat.dtype == torch.float32:
        return F.cross_entropy(flat, labels)
    rows = max(1, chunk_elements // flat.shape[1])
    total = flat.new_zeros((), dtype=torch.float32)
    for start in range(0, flat.shape[0], rows):
        part, part_labels = flat[start:start + rows], labels[start:start + rows]
        if torch.is_grad_enabled() and flat.requires_grad:
            total = total + checkpoint(_chunk_loss_sum, part, part_labels, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(part, part_labels)
    return total / flat.shape[0]
