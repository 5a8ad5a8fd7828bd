"""Cached decoding for the dense baselines (:class:`~regulargpt.model.TransformerLM`, every position signal).

Each layer keeps a :class:`~regulargpt.generation.caches.KVCache` of the keys and values of every position so far.
Feeding n new tokens at absolute positions t..t+n−1 runs each layer on those n rows only:

    q, k, v = W_qkv x_new                       (B, H, n, Dh)
    K, V    = cache.append(k, v)                (B, H, t+n, Dh)
    out     = causal_attention(q, K, V, bias)   q are the LAST n of t+n positions; bias rows for them only

so the new query rows see exactly what they see in a full forward. The position signal is applied at absolute
positions: sinusoidal/learned rows t..t+n−1 added to the new embeddings; RoPE rotates the new q and k at their
positions and the cache stores rotated keys (xPos and dynamic-NTK RoPE, whose rotation of a key depends on the
sequence length, cache raw keys and rotate all of them at each step, as a full forward of that length would);
ALiBi/T5/KERPLE/Sandwich/FIRE and Transformer-XL compute the bias of the new query rows (``bias(query_pos,
key_pos)`` with query_pos = t..t+n−1). Memory: 2 · n_layers · B · T · d values at context T;
time per token: O(n_layers · (d² + T·d)).

A windowed model (``model.window`` = W > 0) keeps a W-slot ring per layer instead
(:class:`~regulargpt.generation.caches.WindowKVCache`): `append` returns the W − 1 older keys and the new ones, and
the model's own windowed kernel reads them. Memory 2 · n_layers · B · W · d values, constant in the stream's length.
"""

from __future__ import annotations

import torch
from torch import Tensor

from regulargpt.generation.caches import KVCache, WindowKVCache
from regulargpt.generation.errors import GenerationError
from regulargpt.model.layers import AttendFn
from regulargpt.model.position import sinusoidal_table
from regulargpt.model.transformer_lm import TransformerLM

__all__ = ["DenseDecoder"]


class DenseDecoder:
    """prefill(prompt) then step(token) for a TransformerLM; logits equal the full forward's at every position.

    Example::

        dec = DenseDecoder(model)
        logits = dec.prefill(prompt)          # (B, T, V)
        nxt = logits[:, -1].argmax(-1)        # (B,)
        logits = dec.step(nxt)                # (B, V): position T
    """

    def __init__(self, model: TransformerLM) -> None:
        self.model = model
        self.caches: list[KVCache | WindowKVCache] = []
        self.length = 0

    @property
    def max_length(self) -> int | None:
        """The longest sequence this model can decode (learned positions), or None for no limit."""
        cfg = self.model.config
        return cfg.max_positions if cfg.position == "learned" else None

    def reset(self, reserve: int = 0) -> None:
        """Forget the sequence; `reserve` (the positions it will have, if known) sizes the caches once."""
        window = self.model.config.window
        self.caches = [WindowKVCache(window, reserve) if window else KVCache(reserve) for _ in self.model.layers]
        self.length = 0

    @torch.no_grad()
    def prefill(self, tokens: Tensor, last_only: bool = False, reserve: int = 0) -> Tensor:
        """Start a new sequence: tokens (B, T) → logits (B, T, V), or (B, 1, V) of the last position. `reserve`:
        the positions the sequence will have (prompt + new tokens − 1), to size the caches once."""
        self.reset(reserve)
        return self._extend(tokens, last_only)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """Append one token per sequence: tokens (B,) → logits (B, V) of the new position."""
        if not self.caches:
            raise RuntimeError("DenseDecoder.step before prefill: prefill the prompt first")
        return self._extend(tokens[:, None], last_only=True)[:, 0]

    @property
    def cache_bytes(self) -> int:
        return sum(c.nbytes for c in self.caches)

    @torch.no_grad()
    def fill_random(self, length: int, batch: int, reserve: int = 0) -> None:
        """Benchmarks only: the caches as after `length` tokens of `batch` sequences, holding random keys and values
        (decode time does not depend on what they hold); the logits that follow are meaningless."""
        self.reset(reserve)
        weight = self.model.embed.table.weight
        shape = (batch, self.model.config.n_heads, length, self.model.config.head_dim)
        for cache in self.caches:
            cache.append(torch.randn(shape, dtype=weight.dtype, device=weight.device),
                         torch.randn(shape, dtype=weight.dtype, device=weight.device))
        self.length = length

    def _extend(self, tokens: Tensor, last_only: bool) -> Tensor:
        model, cfg = self.model, self.model.config
        start, n = self.length, tokens.shape[1]
        limit = self.max_length
        if limit is not None and start + n > limit:
            raise GenerationError(f"this model has learned absolute positions up to model.max_positions={limit}; "
                                  f"it cannot decode position {start + n - 1} (ask for fewer tokens)")
        positions = torch.arange(start, start + n, device=tokens.device)
        x = model.embed(tokens)  # (B, n, d)
        if cfg.position == "sinusoidal":
            x = x + sinusoidal_table(positions, cfg.d_model).to(x.dtype)
        elif model.learned_positions is not None:
            x = x + model.learned_positions.table[start:start + n].to(x.dtype)
        for i, (layer, cache) in enumerate(zip(model.layers, self.caches)):
            last = last_only and i == len(model.layers) - 1
            x = layer(x, self._attend_fn(cache, positions), slice(n - 1, None) if last else None)
        self.length += n
        return model.head(x)

    def _attend_fn(self, cache: KVCache | WindowKVCache, positions: Tensor) -> AttendFn:
        model = self.model
        memory = model.config.attention_memory_mb

        start, n = self.length, positions.shape[0]  # the new positions are start..start+n−1

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            """q: (B, H, nq, Dh) for the last nq new positions; k, v: (B, H, n, Dh) of all the new positions."""
            rotary = model.rotary
            if rotary is not None and not rotary.length_dependent:  # RoPE: the cache stores rotated keys
                q, k = rotary.rotate_pair(q, k, start)
            keys, values = cache.append(k, v)  # (B, H, t+n, Dh); windowed: (B, H, min(W−1, t)+n, Dh)
            if rotary is not None and rotary.length_dependent:  # xPos, dynamic NTK: rotate the cached keys anew
                q, keys = rotary.rotate_pair(q, keys, start + n - keys.shape[2])
            if model.xl is not None:
                return model.xl(q, keys, values, memory)
            return model.attention_kernel(q, keys, values)

        return attend
