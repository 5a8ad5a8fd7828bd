"""Dense causal Transformer: the language-model baselines (`TransformerLM`) and the formal-language Transformer
(`TransformerClassifier`, a causal encoder read at the last position).

`position` selects the position signal (see :mod:`regulargpt.model.position`):

* none          NoPE: the causal mask is the only order signal;
* sinusoidal    x_t += [sin(t·ω) | cos(t·ω)] at the input;
* learned       x_t += P[t], t < max_positions (longer inputs are an error);
* rope          q, k rotated by position (RoPE; ``rope_scaling`` rescales it at inference);
* xpos          RoPE with a per-dimension exponential decay (xPos);
* alibi, t5, kerple_log, kerple_power, sandwich: an additive bias b_h(m − n) on the attention logits;
* fire          an additive learned bias of the log distance normalised by the query position (FIRE);
* xl_relative   Transformer-XL relative logits (q + u)·k + (q + v)·r_{m−n}.

``window`` W > 0 restricts every layer to a causal sliding window (query m sees keys m−W+1..m), with any of the
signals above but xl_relative (:mod:`regulargpt.model.window_attention`); W = 0 is full causal attention.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor, nn

from regulargpt.config import ModelConfig
from regulargpt.model.dense_attention import CausalBias, causal_attention
from regulargpt.model.fire import FireBias
from regulargpt.model.layers import AttendFn, OutputHead, TokenEmbedding, TransformerLayer, init_weights
from regulargpt.model.position import (
    ATTENTION_BIASES,
    LearnedPositions,
    RotaryEmbedding,
    SandwichBias,
    T5Bias,
    XPosEmbedding,
    sinusoidal_table,
)
from regulargpt.model.window_attention import sliding_window_attention
from regulargpt.model.xl_relative import XLRelativeAttention

__all__ = ["TransformerLM", "TransformerClassifier"]


class _DenseTransformer(nn.Module):
    """Embedding, `n_layers` distinct dense causal layers with the configured position signal, and a head."""

    def __init__(self, cfg: ModelConfig, out_features: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed = TokenEmbedding(cfg)
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.n_layers))
        self.head = OutputHead(cfg, out_features, tied=self.embed.table if cfg.tie_embeddings else None)
        self.learned_positions = (
            LearnedPositions(cfg.max_positions, cfg.d_model, cfg.init_std) if cfg.position == "learned" else None
        )
        self.rotary: RotaryEmbedding | None = None
        if cfg.position == "rope":
            self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_base, cfg.rope_scaling)
        elif cfg.position == "xpos":
            self.rotary = XPosEmbedding(cfg.head_dim, cfg.rope_base, cfg.xpos_gamma, cfg.xpos_scale_base)
        init_weights(self, cfg, applications=cfg.n_layers)
        # One bias module per model, shared by every layer (as in ALiBi/T5/KERPLE); created after init_weights so
        # KERPLE keeps its reference initialisation.
        self.bias: nn.Module | None = None
        if cfg.position == "t5":
            self.bias = T5Bias(cfg.n_heads, cfg.t5_num_buckets, cfg.t5_max_distance, cfg.init_std)
        elif cfg.position == "sandwich":
            self.bias = SandwichBias(cfg.n_heads, cfg.sandwich_dim)
        elif cfg.position == "fire":
            self.bias = FireBias(cfg.n_heads, cfg.fire_mlp_width, cfg.fire_init_c, cfg.fire_init_threshold)
        elif cfg.position in ATTENTION_BIASES:
            self.bias = ATTENTION_BIASES[cfg.position](cfg.n_heads)
        self.xl = XLRelativeAttention(cfg.d_model, cfg.n_heads, cfg.init_std) if cfg.position == "xl_relative" else None

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, bias: CausalBias | None = None) -> Tensor:
        """Attention of one layer; `bias`: the forward pass's shared bias blocks (default: this model's bias)."""
        if self.xl is not None:
            return self.xl(q, k, v, self.config.attention_memory_mb)
        if self.rotary is not None:  # keys at positions 0..T−1, queries the last Tq of them
            q, k = self.rotary.rotate_pair(q, k, 0)
        return self.attention_kernel(q, k, v, bias)

    def attention_kernel(self, q: Tensor, k: Tensor, v: Tensor, bias: CausalBias | None = None) -> Tensor:
        """Causal attention of q (the last Tq positions) over k, v, position signals already applied: the sliding
        window of ``config.window`` keys, or every earlier key (window 0); `bias`: default this model's bias."""
        bias_fn = self.bias if bias is None else bias
        if self.config.window:
            return sliding_window_attention(q, k, v, self.config.window, bias_fn, self.config.attention_memory_mb)
        return causal_attention(q, k, v, bias_fn, self.config.attention_memory_mb)

    def encode(self, tokens: Tensor, last_only: bool = False) -> Tensor:
        """tokens (B, T) → final hidden states (B, T, d), before the head; with `last_only`, (B, 1, d) for the last
        position, whose last layer then computes one query row (the other rows of that layer are never read)."""
        t = tokens.shape[1]
        x = self.embed(tokens)
        if self.config.position == "sinusoidal":
            x = x + sinusoidal_table(torch.arange(t, device=tokens.device), self.config.d_model).to(x.dtype)
        elif self.learned_positions is not None:
            x = x + self.learned_positions(t).to(x.dtype)
        attend: AttendFn = self._attend
        windowed = 0 < self.config.window < t  # banded: no (T, T) bias blocks
        if self.bias is not None and not windowed:  # one set of bias blocks for every layer (dense_attention.CausalBias)
            blocks = CausalBias.for_pass(self.bias, x.shape[0], self.config.n_heads, t, self.config.attention_memory_mb,
                                         x.device, torch.promote_types(x.dtype, torch.float32))
            attend = partial(self._attend, bias=blocks)
        for i, layer in enumerate(self.layers):
            last = last_only and i == len(self.layers) - 1
            x = layer(x, attend, slice(t - 1, None) if last else None)
        return x

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, length: int) -> int:
        """Training FLOPs per token (3 × forward) at length T: weight matmuls of every layer and the head, plus
        attention over the (T+1)/2 keys a causal query sees on average:
        3 · [n_layers · (2·(4d² + 2·ffn_mult·d²) + 4·d·(T+1)/2) + 2·d·V]; with a window W < T, a query sees
        (W+1)/2 … W keys: the mean over positions, W − W(W−1)/(2T), replaces (T+1)/2."""
        cfg = self.config
        d = cfg.d_model
        if 0 < cfg.window < length:
            seen = cfg.window - cfg.window * (cfg.window - 1) / (2 * length)
        else:
            seen = (length + 1) / 2
        per_layer = 2 * (4 * d * d + 2 * cfg.ffn_mult * d * d) + int(4 * d * seen)
        return 3 * (cfg.n_layers * per_layer + 2 * d * self.head.proj.out_features)


class TransformerLM(_DenseTransformer):
    """tokens (B, T) → next-token logits (B, T, vocab)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, cfg.vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.encode(tokens))


class TransformerClassifier(_DenseTransformer):
    """tokens (B, T) → class logits (B, num_classes), read at the last position of a causal encoder (which sees the
    whole input there)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg, cfg.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.head(self.encode(tokens, last_only=True)[:, -1])
