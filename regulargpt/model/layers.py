"""Building blocks shared by RegularGPT and the dense baselines: one Transformer layer with a pluggable attention
pattern, pre- or post-LN, and the token embedding / output heads.

A layer computes, with `attend` the attention pattern (sliding-dilated, dense causal, ...)::

    pre-LN:   h = x + Attn(LN1(x));   y = h + FFN(LN2(h))
    post-LN:  h = LN1(x + Attn(x));   y = LN2(h + FFN(h))
    Attn(x) = W_o · attend(W_q x, W_k x, W_v x)           (heads split as (B, H, T, Dh))
    FFN(x)  = W_2 · act(W_1 x + b_1) + b_2                (hidden width ffn_mult · d)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from regulargpt.config import ModelConfig

__all__ = ["AttendFn", "TransformerLayer", "TokenEmbedding", "OutputHead", "init_weights"]

AttendFn = Callable[[Tensor, Tensor, Tensor], Tensor]  # (q, k, v), each (B, H, T, Dh) -> (B, H, T, Dh)


class TransformerLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads, self.pre_norm = cfg.n_heads, cfg.norm == "pre"
        self.qkv = nn.Linear(d, 3 * d, bias=cfg.qkv_bias)
        self.out = nn.Linear(d, d, bias=cfg.qkv_bias)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ffn_in = nn.Linear(d, cfg.ffn_mult * d)
        self.ffn_out = nn.Linear(cfg.ffn_mult * d, d)
        self.act: Callable[[Tensor], Tensor] = F.gelu if cfg.activation == "gelu" else F.relu
        self.drop = nn.Dropout(cfg.dropout)

    def _split_heads(self, x: Tensor, token_major: bool = False) -> Tensor:
        b, t, _ = x.shape
        heads = x.view(b, t, self.n_heads, -1)  # (B, T, d) → (B, T, H, Dh), a view
        return heads if token_major else heads.transpose(1, 2)  # (B, H, T, Dh), a view

    def _heads(self, x: Tensor, keep: slice | None = None,
               token_major: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v, each (B, H, ·, Dh), or (B, ·, H, Dh) when `token_major`; with `keep`, queries only for the
        positions x[:, keep].

        Split along the projection's last axis (views of its (B, T, 3d) output), so the backward joins dq, dk, dv
        with one concatenation into the projection's gradient (an unbind of a (3, B, H, T, Dh) permute would stack
        them, then copy the permuted stack once more to reshape it).
        """
        if keep is None:
            q, k, v = (self._split_heads(part, token_major) for part in self.qkv(x).chunk(3, dim=-1))
            return q, k, v
        d = x.shape[-1]
        w, bias = self.qkv.weight, self.qkv.bias
        q = self._split_heads(F.linear(x[:, keep], w[:d], None if bias is None else bias[:d]), token_major)
        kv = F.linear(x, w[d:], None if bias is None else bias[d:])  # (B, T, 2d)
        k, v = (self._split_heads(part, token_major) for part in kv.chunk(2, dim=-1))
        return q, k, v

    def key_value(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values this layer would compute for x (B, T, d): each (B, H, T, Dh). Used for pad states."""
        _, k, v = self._heads(self.norm1(x) if self.pre_norm else x)
        return k, v

    def attention(self, x: Tensor, attend: AttendFn, keep: slice | None = None) -> Tensor:
        """Attn(x) of the module doc: (B, T, d) → (B, Tq, d), Tq = T or the rows x[:, keep]."""
        return self._project(attend(*self._heads(x, keep)))

    def _project(self, a: Tensor, token_major: bool = False) -> Tensor:
        if not token_major:
            a = a.transpose(1, 2)  # (B, H, Tq, Dh) → (B, Tq, H, Dh)
        b, t, h, dh = a.shape
        return self.drop(self.out(a.reshape(b, t, h * dh)))  # (B, Tq, H, Dh) → (B, Tq, d): a view when contiguous

    def feed_forward(self, x: Tensor) -> Tensor:
        return self.drop(self.ffn_out(self.act(self.ffn_in(x))))

    def forward(self, x: Tensor, attend: AttendFn, keep: slice | None = None, token_major: bool = False) -> Tensor:
        """(B, T, d) → (B, T, d); with `keep`, only the rows x[:, keep] are computed (queries there, keys everywhere),
        and `attend` receives q for those rows only. `token_major`: `attend` takes and returns (B, T, H, Dh) (views
        of the projections, no transposes) instead of (B, H, T, Dh)."""
        rows = x if keep is None else x[:, keep]
        heads = self._heads(self.norm1(x) if self.pre_norm else x, keep, token_major)
        return self.from_attention(rows, attend(*heads), token_major)

    def from_attention(self, rows: Tensor, a: Tensor, token_major: bool = False) -> Tensor:
        """The rest of the layer at `rows` (B, Tq, d) given its attention heads a = attend(q, k, v) (B, H, Tq, Dh),
        or (B, Tq, H, Dh) when `token_major`: output projection, residuals, norms and FFN (pre-LN: h = rows + W_o·a,
        y = h + FFN(LN2(h)); post-LN: h = LN1(rows + W_o·a), y = LN2(h + FFN(h)))."""
        h = rows + self._project(a, token_major)
        if self.pre_norm:
            return h + self.feed_forward(self.norm2(h))
        h = self.norm1(h)
        return self.norm2(h + self.feed_forward(h))


class TokenEmbedding(nn.Module):
    """Token embedding, optionally × sqrt(d) (the authors' formal-language models), then dropout."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.table = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model) if cfg.embedding_scale else 1.0
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.drop(self.table(tokens) * self.scale)


class OutputHead(nn.Module):
    """Final LayerNorm (pre-LN models only; post-LN layers end normalised) and a linear read-out."""

    def __init__(self, cfg: ModelConfig, out_features: int, tied: nn.Embedding | None = None) -> None:
        super().__init__()
        self.norm: nn.Module = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.proj = nn.Linear(cfg.d_model, out_features, bias=cfg.head == "classifier")
        if tied is not None:
            self.proj.weight = tied.weight

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.norm(x))


_HAIKU_TRUNCATION = 0.87962566103423978  # std of a unit normal truncated to [-2, 2]


def init_weights(module: nn.Module, cfg: ModelConfig, applications: int = 0) -> None:
    """Initialise every linear, embedding and LayerNorm of `module` from the config.

    * ``init="normal"``: linear weights N(0, init_std) (GPT-2 / GPT-NeoX);
    * ``init="fan_in"``: Haiku's default, a normal truncated at ±2 units and rescaled to std σ = 1/sqrt(fan_in)
      (d 64: σ = 0.125; the 4d → d FFN output: 0.0625) — the authors' formal-language initialisation;
    * token embeddings N(0, embedding_init_std or init_std) in both schemes (the authors: a one-hot map with std 0.02);
    * ``depth_scaled_init`` with `applications` layer applications: the attention and FFN output projections are then
      divided by sqrt(2 · applications) (GPT-2's residual rule; K = 4, L = 3: ÷ sqrt(24) ≈ 4.9);
    * zero biases, unit LayerNorm.
    """
    embedding_weights = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    for m in module.modules():
        if isinstance(m, nn.Linear) and id(m.weight) in embedding_weights:  # a head tied to the embedding
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            if cfg.init == "fan_in":
                std = (1.0 / math.sqrt(m.in_features)) / _HAIKU_TRUNCATION
                nn.init.trunc_normal_(m.weight, 0.0, std, -2 * std, 2 * std)
            else:
                nn.init.normal_(m.weight, 0.0, cfg.init_std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, cfg.embedding_init_std or cfg.init_std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if cfg.depth_scaled_init and applications > 0:
        for m in module.modules():
            if isinstance(m, TransformerLayer):
                m.out.weight.data.div_(math.sqrt(2 * applications))
                m.ffn_out.weight.data.div_(math.sqrt(2 * applications))
