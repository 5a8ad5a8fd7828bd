"""Cached decoding for RegularGPT: ring buffers per (depth step, sub-layer), bounded under ``depth_policy="train"``.

What a new position reads. In sliding mode, sub-layer k of depth step l (dilation D = C^l) computes position m
from the sub-layer's *input* states at positions m − j·D, j = 0..C−1 (negative positions read the pad key/value,
or are masked with ``pad="mask"``). So decoding position m needs, for every (l, k), the keys and values of that
sub-layer's input at positions m − D, …, m − (C−1)·D, and nothing older: step l keeps a ring buffer of

    W_l = (C − 1)·C^l + 1   positions   (the new one included),

per sub-layer, plus one pad key/value per sub-layer (the learned pad p passed through the earlier sub-layers of the
step; the same at every step, computed once). Worked example, C = 4, K = 4, train length 64 (L = 3): W = 4, 13, 49;
66 positions per sub-layer, 264 key/value pairs in all, for a stream of any length. A new token costs K·L
sub-layer applications on one row, each attending to C keys: constant time and memory per token.

Depth policies (see :meth:`~regulargpt.model.regular_gpt.RegularGPTStack.depth`):

* ``train``: L = ceil(log_C T_train) steps at every length, every position takes part in every step. The rings
  stop growing once the stream is W_{L−1} long: constant memory for an unbounded stream.
* ``per_position``: position m takes part in step l iff l = 0 or m >= C^l, and the newest position always takes
  part in every step that exists. Step l starts when m reaches C^l; its ring then needs positions 0..C^l − 1,
  which do not take part in it: each reads only itself and pads at that dilation, so its keys/values there depend
  on its final state alone. The decoder keeps every position's final state (B, T, d) and fills the new step's ring
  from them when the step starts (one pass over the history, log_C T times in all). Memory grows with T, as the
  receptive field does.
* ``adaptive`` (the paper): L = ceil(log_C T) for the whole sequence, every position in every step. While L stays
  the same, earlier positions do not change and decoding is cached as under ``train``; when the new token makes
  L grow (T = C^L + 1) every earlier state changes, so the whole prefix is recomputed (a full forward over the
  kept token ids). Correct, not fast: log_C T full forwards over a stream of T tokens.

Logits equal the full forward's at every position (tests/test_generation.py, fp64 to 1e-9).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from regulargpt.generation.caches import GrowingTensor, RingCache
from regulargpt.model.layers import AttendFn
from regulargpt.model.regular_gpt import RegularGPT
from regulargpt.model.sliding_dilated import sliding_dilated_attention

__all__ = ["RegularGPTDecoder", "ring_window", "window_attention"]


def ring_window(chunk_size: int, level: int) -> int:
    """Positions a step-`level` ring keeps: (C − 1)·C^level + 1. C = 4: 4, 13, 49, 193, …"""
    return (chunk_size - 1) * chunk_size**level + 1


def window_attention(q: Tensor, keys: Tensor, values: Tensor, rel_bias: Tensor) -> Tensor:
    """One query against its own n <= C keys: softmax_j(q·k_j / sqrt(Dh) + r[h, j]) · v_j.

    q: (B, H, 1, Dh); keys, values: (B, H, n, Dh) with key j at offset j·D; rel_bias: (H, n). Scores and softmax
    in fp32 (fp64 for fp64 inputs), as in the sliding-dilated kernel. → (B, H, 1, Dh).
    """
    sdt = torch.promote_types(q.dtype, torch.float32)
    scores = torch.matmul(q, keys.transpose(-1, -2)).to(sdt) * (1.0 / math.sqrt(q.shape[-1]))  # (B, H, 1, n)
    scores = scores + rel_bias.to(sdt)[None, :, None, :]
    return torch.matmul(scores.softmax(-1).to(values.dtype), values)


class RegularGPTDecoder:
    """prefill(prompt) then step(token) for a RegularGPT language model, under its own depth policy.

    Example::

        dec = RegularGPTDecoder(model)        # model.config.depth_policy = "train"
        logits = dec.prefill(prompt)          # (B, T, V), equal to model(prompt)
        logits = dec.step(logits[:, -1].argmax(-1))  # (B, V): position T, from the rings only
    """

    max_length: int | None = None  # no position limit

    def __init__(self, model: RegularGPT) -> None:
        self.model, self.stack = model, model.stack
        self.chunk_size = model.stack.chunk_size
        self.policy = model.stack.depth_policy
        self.rings: list[list[RingCache]] = []  # [depth step][sub-layer]
        self.history = GrowingTensor(dim=1)  # per_position: final states (B, T, d)
        self.tokens = GrowingTensor(dim=1)  # adaptive: token ids (B, T), for the recompute when L grows
        self.length = 0
        self.reserve = 0  # positions the sequence will have, if known: sizes rings and states once
        self._pads: list[tuple[Tensor, Tensor] | None] | None = None

    def reset(self, reserve: int = 0) -> None:
        """Forget the sequence; `reserve` (the positions it will have, if known) sizes the rings and states once."""
        self.rings, self.length, self.reserve = [], 0, reserve
        self.history = GrowingTensor(dim=1, reserve=reserve)
        self.tokens = GrowingTensor(dim=1, reserve=reserve)

    @property
    def cache_bytes(self) -> int:
        """Bytes held: rings, plus the final states (per_position) or token ids (adaptive)."""
        return sum(r.nbytes for rings in self.rings for r in rings) + self.history.nbytes + self.tokens.nbytes

    @torch.no_grad()
    def fill_random(self, length: int, batch: int, reserve: int = 0) -> None:
        """Benchmarks only: the rings (and per_position's final states) as after `length` tokens of `batch`
        sequences, holding random values (decode time does not depend on them); the logits that follow are
        meaningless."""
        self.reset(reserve)
        cfg, weight = self.model.config, self.model.embed.table.weight
        for level in range(self.stack.depth(length)):
            window = ring_window(self.chunk_size, level)
            rings = [RingCache(window, max(0, length - window), reserve) for _ in self.stack.sublayers]
            shape = (batch, cfg.n_heads, min(window, length), cfg.head_dim)
            for ring in rings:
                ring.write(torch.randn(shape, dtype=weight.dtype, device=weight.device),
                           torch.randn(shape, dtype=weight.dtype, device=weight.device))
            self.rings.append(rings)
        if self.policy == "per_position":
            self.history.append(torch.randn(batch, length, cfg.d_model, dtype=weight.dtype, device=weight.device))
        if self.policy == "adaptive":
            self.tokens.append(torch.zeros(batch, length, dtype=torch.long, device=weight.device))
        self.length = length

    @torch.no_grad()
    def prefill(self, tokens: Tensor, last_only: bool = False, reserve: int = 0) -> Tensor:
        """Start a new sequence: tokens (B, T) → logits (B, T, V), or (B, 1, V) of the last position. `reserve`:
        the positions the sequence will have (prompt + new tokens − 1), to size the rings once."""
        self.reset(reserve)
        if self.policy == "adaptive":
            self.tokens.append(tokens)
        return self._forward(tokens, last_only)

    @torch.no_grad()
    def step(self, tokens: Tensor) -> Tensor:
        """Append one token per sequence: tokens (B,) → logits (B, V) of the new position m = length."""
        if not self.rings:
            raise RuntimeError("RegularGPTDecoder.step before prefill: prefill the prompt first")
        m = self.length
        depth = self.stack.depth(m + 1)
        if self.policy == "adaptive":
            every = self.tokens.append(tokens[:, None])  # (B, m+1)
            if depth != len(self.rings):  # L grew: every earlier state changes
                return self._forward(every, last_only=True)[:, 0]
        while len(self.rings) < depth:  # per_position: step l starts at m = C^l
            self._start_step(len(self.rings))
        x = self.model.embed(tokens[:, None])  # (B, 1, d)
        for level, rings in enumerate(self.rings):
            dilation = self.chunk_size**level
            for sub, ring, pads in zip(self.stack.sublayers, rings, self._pad_states()):
                x = sub.layer(x, self._attend_one(ring, sub.rel_bias, m, dilation, pads))
        if self.policy == "per_position":
            self.history.append(x)
        self.length = m + 1
        return self.model.head(x)[:, 0]

    # ------------------------------------------------------------------------------------------------ internals

    def _pad_states(self) -> list[tuple[Tensor, Tensor] | None]:
        """Per sub-layer (pad key, pad value), each (1, H, Dh), computed once; None per sub-layer in mask mode."""
        if self._pads is None:
            self._pads = self.stack.pad_states()
        return self._pads

    def _forward(self, tokens: Tensor, last_only: bool) -> Tensor:
        """The model's sliding forward over tokens (B, T), filling one ring per (step, sub-layer) on the way."""
        b, t = tokens.shape
        x = self.model.embed(tokens)  # (B, T, d)
        self.rings = []
        for level in range(self.stack.depth(t)):
            x = self._run_step(x, level, self.stack.step_mask(t, level, x.device))
        if self.policy == "per_position":
            self.history = GrowingTensor(dim=1, reserve=self.reserve)
            self.history.append(x)
        self.length = t
        return self.model.head(x[:, -1:] if last_only else x)

    def _run_step(self, x: Tensor, level: int, active: Tensor | None) -> Tensor:
        """Depth step `level` over every row of x (B, T, d) from position 0, recording the rings; positions where
        `active` (T, 1) is False keep their state (per_position)."""
        dilation = self.chunk_size**level
        window = ring_window(self.chunk_size, level)
        rings = [RingCache(window, reserve=self.reserve) for _ in self.stack.sublayers]
        h = x
        for sub, ring, pads in zip(self.stack.sublayers, rings, self._pad_states()):
            pad_k, pad_v = (None, None) if pads is None else (pads[0].expand(x.shape[0], -1, -1),
                                                               pads[1].expand(x.shape[0], -1, -1))  # (B, H, Dh)

            def attend(q: Tensor, k: Tensor, v: Tensor, ring: RingCache = ring, rel_bias: Tensor = sub.rel_bias,
                       pad_k: Tensor | None = pad_k, pad_v: Tensor | None = pad_v) -> Tensor:
                ring.write(k, v)
                return sliding_dilated_attention(q, k, v, rel_bias, dilation, pad_k, pad_v)

            h = sub.layer(h, attend)
        self.rings.append(rings)
        return h if active is None else torch.where(active, h, x)

    def _start_step(self, level: int) -> None:
        """per_position: depth step `level` begins with the position about to be decoded, m = C^level. Its ring
        needs positions 0..m−1, which do not take part in the step: run it on their final states, where each
        reads only itself and pads (m − D < 0), and keep the keys/values."""
        assert self.policy == "per_position" and self.length == self.chunk_size**level, (self.length, level)
        self._run_step(self.history.view(), level, None)  # (B, m, d); the output is not used

    def _attend_one(self, ring: RingCache, rel_bias: Tensor, m: int, dilation: int,
                    pads: tuple[Tensor, Tensor] | None) -> AttendFn:
        """Attention of new position m to m − j·D, j < C: its own key (written to the ring first) and the ring's."""
        c = self.chunk_size

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            ring.write(k, v)
            seen = [m - j * dilation for j in range(c) if m - j * dilation >= 0]  # j = 0, 1, … in order
            keys, values = ring.read(seen)  # (B, H, n, Dh)
            n = len(seen)
            if n < c and pads is not None:  # the other C − n offsets read the pad key/value
                b, h, _, dh = keys.shape
                keys = torch.cat([keys, pads[0][:, :, None].expand(b, h, c - n, dh)], dim=2)  # (B, H, C, Dh)
                values = torch.cat([values, pads[1][:, :, None].expand(b, h, c - n, dh)], dim=2)
                n = c
            return window_attention(q, keys, values, rel_bias[:, :n])  # mask mode: masked offsets left out

        return attend
