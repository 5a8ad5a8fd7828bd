"""RegularGPT (Chi et al. 2023): Sliding-Dilated-Attention + adaptive depth + one shared block of K sub-layers.

For an input of length T, with chunk size C and thickness K:

    L = adaptive_depth(T, C) = max(1, ceil(log_C T)) depth steps; step l uses dilation D = C**l;
    every step applies the same K sub-layers (weights W_0..W_{K-1}), so K·L layer applications, K layers of weights.

Sub-layer k of step l attends, at query position m, to the keys m − j·D (j < C) with learnable per-head scalars
r_k[h, j] on the logits. Keys at negative positions read the *pad state*: the learned vector p at the first
sub-layer of each step, then p passed through the earlier sub-layers of that step as a length-1 sequence (attention
over identical pads returns the pad's own value). With ``pad="mask"`` those keys are masked instead.

Two execution modes over the same weights:

* sliding (language modelling): every position is computed at every step, O(T·C·d) per sub-layer;
* tree (classification, the authors' formulation): at each step run the K sub-layers at the current resolution
  (dilation 1), then keep positions T'−1, T'−1−C, … (the last of each chunk). Out-of-range keys read the pad state,
  which is exactly what left-padding with p to a multiple of C gives. After L steps one position is left.
  Work is geometric: O(T·C·d·K) in total.

The last position of sliding mode equals the tree-mode output (tested).

Worked example (C=2, T=5): L = 3; sliding dilations 1, 2, 4. Tree mode keeps positions {4, 2, 0} after step 0,
{4, 0} after step 1 and {4} after step 2; position 4 has then seen 4, 3 (step 0), 2 (step 1) and 0 (step 2) plus
the pads behind them.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from regulargpt.config import ModelConfig
from regulargpt.model.layers import OutputHead, TokenEmbedding, TransformerLayer, init_weights
from regulargpt.model.sliding_dilated import adaptive_depth, sliding_dilated_attention

__all__ = ["RegularGPTStack", "RegularGPT", "RegularGPTClassifier"]


class _SlidingDilatedLayer(nn.Module):
    """One of the K shared sub-layers: a Transformer layer plus its per-head window scalars r (H, C)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer = TransformerLayer(cfg)
        self.rel_bias = nn.Parameter(torch.zeros(cfg.n_heads, cfg.chunk_size))

    def forward(self, x: Tensor, pad: Tensor | None, dilation: int) -> tuple[Tensor, Tensor | None]:
        """x: (B, T, d); pad: (d,) pad state entering this sub-layer, or None in mask mode → (x', pad')."""
        if pad is None:
            return self.layer(x, lambda q, k, v: sliding_dilated_attention(q, k, v, self.rel_bias, dilation)), None
        pad_seq = pad.view(1, 1, -1)  # (1, 1, d)
        pad_k, pad_v = self.layer.key_value(pad_seq)  # (1, H, 1, Dh)
        b = x.shape[0]
        pad_k = pad_k[:, :, 0].expand(b, -1, -1)  # (B, H, Dh)
        pad_v = pad_v[:, :, 0].expand(b, -1, -1)
        out = self.layer(
            x, lambda q, k, v: sliding_dilated_attention(q, k, v, self.rel_bias, dilation, pad_k, pad_v)
        )
        next_pad = self.layer(pad_seq, lambda q, k, v: v)  # attention over identical pads returns v
        return out, next_pad.view(-1)


class RegularGPTStack(nn.Module):
    """The shared block of K sub-layers, its learned pad vector, and the two execution modes."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.chunk_size, self.thickness = cfg.chunk_size, cfg.thickness
        self.sublayers = nn.ModuleList(_SlidingDilatedLayer(cfg) for _ in range(cfg.thickness))
        self.pad = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.pad == "learned" else None

    def depth(self, length: int) -> int:
        return adaptive_depth(length, self.chunk_size)

    def _step(self, x: Tensor, dilation: int) -> Tensor:
        pad = self.pad
        for sub in self.sublayers:
            x, pad = sub(x, pad, dilation)
        return x

    def sliding(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, T, d): every position, depth step l at dilation C**l."""
        for level in range(self.depth(x.shape[1])):
            x = self._step(x, self.chunk_size**level)
        return x

    def tree(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, d): the state of the last position, computing only the positions that feed it."""
        for _ in range(self.depth(x.shape[1])):
            x = self._step(x, 1)
            t = x.shape[1]
            x = x[:, (t - 1) % self.chunk_size:: self.chunk_size]  # keep t−1, t−1−C, …  (B, ceil(t/C), d)
        assert x.shape[1] == 1, "adaptive depth must reduce the sequence to one position"
        return x[:, 0]

    def layer_parameters(self) -> int:
        """Parameters used by one layer application (one sub-layer), incl. its window scalars."""
        return sum(p.numel() for p in self.sublayers[0].parameters())


class _RegularGPTBase(nn.Module):
    def __init__(self, cfg: ModelConfig, out_features: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed = TokenEmbedding(cfg)
        self.stack = RegularGPTStack(cfg)
        self.head = OutputHead(cfg, out_features, tied=self.embed.table if cfg.tie_embeddings else None)
        init_weights(self, cfg.init_std)
        for sub in self.stack.sublayers:
            nn.init.normal_(sub.rel_bias, 0.0, 0.02)
        if self.stack.pad is not None:
            nn.init.normal_(self.stack.pad, 0.0, 0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _matmul_flops_per_position(self, length: int) -> tuple[int, int]:
        """(forward matmul FLOPs of one layer application per position, layer applications at this length)."""
        cfg = self.config
        d = cfg.d_model
        per_app = 2 * (4 * d * d + 2 * cfg.ffn_mult * d * d) + 2 * 2 * cfg.chunk_size * d  # projections, FFN, attn
        return per_app, cfg.thickness * self.stack.depth(length)


class RegularGPT(_RegularGPTBase):
    """Language model (sliding mode): tokens (B, T) → next-token logits (B, T, vocab)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, cfg.vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.stack.sliding(self.embed(tokens)))

    def flops_per_token(self, length: int) -> int:
        """Training FLOPs per token (forward + backward = 3 × forward) at sequence length `length`.

        Counts weight matmuls of the K·L layer applications and the head, and attention over the C keys each
        query actually sees: 3 · [K·L · (2·(4d² + 2·ffn_mult·d²) + 4·C·d) + 2·d·V].
        """
        per_app, apps = self._matmul_flops_per_position(length)
        return 3 * (apps * per_app + 2 * self.config.d_model * self.config.vocab_size)


class RegularGPTClassifier(_RegularGPTBase):
    """Sequence classifier (tree mode): tokens (B, T) → class logits (B, num_classes) read at the last position."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, cfg.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.stack.tree(self.embed(tokens)))

    def flops_per_token(self, length: int) -> int:
        """Training FLOPs per input token in tree mode: step l touches ceil(T/C^l) positions (geometric sum)."""
        per_app, _ = self._matmul_flops_per_position(length)
        c, positions, t = self.config.chunk_size, 0, length
        for _ in range(self.stack.depth(length)):
            positions += t
            t = -(-t // c)
        return 3 * (self.config.thickness * per_app * positions + 2 * self.config.d_model * self.config.num_classes) // length
