"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context Transformers",
arXiv 2310.04418): a learned bias of the log-distance, normalised by the query's own position.

    b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) ),   ψ(x) = log(c·x + 1),

i the query position, j <= i the key's (causal: j > i is masked by the caller; its entries here are finite filler),
f_θ: R → R^H an MLP with one hidden layer (width 32, ReLU), one output per head, c > 0 learnable (init 0.1) and the
threshold L = |λ|·L0 learnable through λ (init 1, L0 = 512): "progressive interpolation" — below L the
normaliser is fixed (short inputs are not stretched), beyond it every query sees its distances mapped into [0, 1].
Where the paper leaves a detail open this follows the implementation recorded in
/work/shared/reference/paper_facts.md §5.2 (``|c·x|`` inside the log, ε = 1e-6 added to the normaliser).

Unlike ALiBi/T5/KERPLE/Sandwich the bias depends on i, not only on i − j (``distance_only = False``): it runs the
chunked dense path, never FlexAttention's per-distance table, and no sliding window. Memory: the MLP's hidden
layer is a (Tq, Tk, width) fp32 block per query chunk, about width/H times the bias block itself.

Worked example (c = 1, L = 2, H = 1, f_θ = identity): query 3, key 0: ψ(3)/ψ(max(2, 3)) = 1; key 2:
log 2 / log 4 = 0.5; query 1, key 0: ψ(1)/ψ(2) = log 2 / log 3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FireBias"]

FIRE_EPS = 1e-6


class FireBias(nn.Module):
    """(query positions (Tq,), key positions (Tk,)) → (H, Tq, Tk) fp32 FIRE bias (module doc)."""

    distance_only = False  # the bias reads the query position: no per-distance table (FlexAttention, windows)

    def __init__(self, n_heads: int, width: int = 32, init_c: float = 0.1, init_threshold: float = 512.0) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, n_heads))
        # (1,), not 0-dim: DeepSpeed's initial broadcast views every parameter as bytes, which a 0-dim tensor refuses
        self.c = nn.Parameter(torch.tensor([float(init_c)]))  # (1,)
        self.threshold_scale = nn.Parameter(torch.tensor([1.0]))  # (1,) λ: L = |λ|·L0
        self.init_threshold = float(init_threshold)

    def normalised_distance(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        """(Tq, Tk) fp32: ψ(i − j) / (ψ(max(L, i)) + ε), the MLP's input."""
        c = self.c.float()
        rel = (query_pos[:, None] - key_pos[None, :]).float()  # (Tq, Tk)
        threshold = (self.threshold_scale.float() * self.init_threshold).abs()
        normaliser = torch.maximum(query_pos.float(), threshold)  # (Tq,)
        psi_rel = torch.log1p((c * rel).abs())
        psi_norm = torch.log1p((c * normaliser).abs())
        return psi_rel / (psi_norm[:, None] + FIRE_EPS)

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        x = self.normalised_distance(query_pos, key_pos)
        hidden, out = self.mlp[0], self.mlp[2]
        with torch.autocast(x.device.type, enabled=False):  # fp32 whatever the weights' dtype
            h = F.relu(F.linear(x[..., None], hidden.weight.float(), hidden.bias.float()))  # (Tq, Tk, width)
            bias = F.linear(h, out.weight.float(), out.bias.float())  # (Tq, Tk, H)
        return bias.permute(2, 0, 1)  # (H, Tq, Tk)
