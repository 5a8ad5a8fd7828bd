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
  Work is geometric: O(T·C·d·K) in total. With K = 1 only the kept positions are computed: each attends to its
  own chunk of C keys (:func:`chunk_attention`), so queries, output projection and FFN run on T/C rows per step.
  The classifier's forward then also computes each distinct chunk of the batch once (`tree_memo`): with a small
  vocabulary most chunks of the first steps repeat (parity, T = 40, batch 128: 4 distinct chunks at step 0).

The last position of sliding mode equals the tree-mode output (tested).

Worked example (C=2, T=5): L = 3; sliding dilations 1, 2, 4. Tree mode keeps positions {4, 2, 0} after step 0,
{4, 0} after step 1 and {4} after step 2; position 4 has then seen 4, 3 (step 0), 2 (step 1) and 0 (step 2) plus
the pads behind them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from regulargpt.config import ModelConfig
from regulargpt.model.layers import OutputHead, TokenEmbedding, TransformerLayer, init_weights
from regulargpt.model.position import alibi_slopes
from regulargpt.model.cpu_operator import cpu_operator
from regulargpt.model.sliding_dilated import adaptive_depth, autocast_inputs, fused_algorithm, sliding_dilated_attention
from regulargpt.model.tree_memo import distinct_rows, memoized_tree

__all__ = ["RegularGPTStack", "RegularGPT", "RegularGPTClassifier", "batch_pads", "chunk_attention", "init_rel_bias",
           "last_of_each_chunk"]


def chunk_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, pad_k: Tensor | None,
                    pad_v: Tensor | None, algorithm: Literal["auto", "cpp", "torch"] = "auto") -> Tensor:
    """Attention of the last position of every chunk to its own chunk (tree mode, K = 1).

    k, v: (B, H, t, Dh) at the current resolution; q: (B, H, ceil(t/C), Dh) for positions t−1−iC (ascending). The
    sequence is left-padded to a multiple of C with the pad key/value (or masked slots when pads are None); chunk i's
    slot w holds the key at offset j = C−1−w from its query, with logit q·k/sqrt(Dh) + r[h, j]. Equals
    sliding-dilated attention at dilation 1 evaluated at the kept positions.

    "cpp" runs the fused operator with queries at positions (t−1) % C + i·C (query_start, query_step = C,
    dilation 1), on transpose(1, 2) views; "torch" the chunked einsums below (the reference); "auto" the operator
    whenever `fused_algorithm` says it runs on this device.
    """
    b, h, t, dh = k.shape
    c = rel_bias.shape[1]
    if algorithm == "auto":
        algorithm = "cpp" if fused_algorithm(q.device.type) == "cpp" else "torch"
    if algorithm == "cpp":
        q, k, v, pad_k, pad_v = autocast_inputs(q, k, v, pad_k, pad_v)
        with torch.autocast(q.device.type, enabled=False):
            out = cpu_operator(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), rel_bias, 1, pad_k, pad_v,
                               query_start=(t - 1) % c, query_step=c)  # (B, ceil(t/C), H, Dh)
        return out.transpose(1, 2)
    nc = q.shape[2]
    left = nc * c - t
    sdt = torch.promote_types(q.dtype, torch.float32)
    if left:
        fill_k = pad_k[:, :, None].expand(b, h, left, dh) if pad_k is not None else k.new_zeros(b, h, left, dh)
        fill_v = pad_v[:, :, None].expand(b, h, left, dh) if pad_v is not None else v.new_zeros(b, h, left, dh)
        k, v = torch.cat([fill_k, k], dim=2), torch.cat([fill_v, v], dim=2)
    kc, vc = k.view(b, h, nc, c, dh), v.view(b, h, nc, c, dh)  # (B, H, nc, C, Dh)
    scores = torch.einsum("bhnd,bhncd->bhnc", q, kc).to(sdt) / math.sqrt(dh)
    scores = scores + rel_bias.to(sdt).flip(-1)[None, :, None, :]  # slot w ↔ offset C−1−w
    if pad_k is None and left:
        masked = torch.zeros(nc, c, dtype=torch.bool, device=q.device)
        masked[0, :left] = True
        scores = scores.masked_fill(masked, float("-inf"))
    return torch.einsum("bhnc,bhncd->bhnd", scores.softmax(-1).to(v.dtype), vc)


def init_rel_bias(rel_bias: Tensor, scheme: str) -> None:
    """Window scalars r (H, C): "normal" N(0, 0.02) (the authors' code); "zeros"; "recency" r[h, j] = −s_h·j with
    ALiBi's head slopes s_h (H = 4: s = 1/4, 1/16, 1/64, 1/256, so head 0 starts at r = 0, −0.25, −0.5, −0.75)."""
    with torch.no_grad():
        if scheme == "normal":
            nn.init.normal_(rel_bias, 0.0, 0.02)
        elif scheme == "zeros":
            nn.init.zeros_(rel_bias)
        elif scheme == "recency":
            h, c = rel_bias.shape
            rel_bias.copy_(-alibi_slopes(h)[:, None] * torch.arange(c, dtype=torch.float32)[None, :])
        else:
            raise ValueError(f"rel_bias_init: unknown scheme {scheme!r}; expected normal, zeros or recency")


PadKV = tuple[Tensor, Tensor]  # the pad state's key and value at one sub-layer, each (1, H, Dh)


def last_of_each_chunk(length: int, chunk_size: int) -> slice:
    """The positions tree mode keeps after a depth step over `length` positions: t−1, t−1−C, … (the last of each
    chunk once the sequence is left-padded to a multiple of C), as a slice in increasing order.

    Example: length 5, C = 2 → slice(0, None, 2) → positions 0, 2, 4; length 6, C = 4 → slice(1, None, 4) → 1, 5.
    """
    return slice((length - 1) % chunk_size, None, chunk_size)


class _SlidingDilatedLayer(nn.Module):
    """One of the K shared sub-layers: a Transformer layer plus its per-head window scalars r (H, C)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer = TransformerLayer(cfg)
        self.rel_bias = nn.Parameter(torch.zeros(cfg.n_heads, cfg.chunk_size))

    def pad_step(self, pad: Tensor) -> tuple[PadKV, Tensor]:
        """The pad state entering this sub-layer (d,) → (its key/value here, the pad state leaving it).

        Attention over identical pads returns the pad's own value, so the pad passes the layer as a length-1 sequence
        whose attention output is its value: one projection gives the key, the value and (through
        ``from_attention``) the next state. Key and value come from ``key_value`` (calls of the norm and projection
        modules), not captured inside the layer's forward: a tensor that leaves a module other than through its
        output breaks ZeRO-3's re-gathering of that module's weights in the backward (size-0 parameters;
        tests/test_pretrain.py's ZeRO-3 run).
        """
        pad_seq = pad.view(1, 1, -1)  # (1, 1, d)
        pad_k, pad_v = self.layer.key_value(pad_seq)  # (1, H, 1, Dh)
        next_pad = self.layer.from_attention(pad_seq, pad_v)
        return (pad_k.squeeze(2), pad_v.squeeze(2)), next_pad.view(-1)

    def forward(self, x: Tensor, pad_kv: PadKV | None, dilation: int) -> Tensor:
        """x: (B, T, d); pad_kv: this sub-layer's pad key/value, each (B, H, Dh) (`batch_pads`), or None in mask
        mode."""
        pad_k, pad_v = (None, None) if pad_kv is None else pad_kv

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:  # (B, T, H, Dh): the fused kernels' own layout
            return sliding_dilated_attention(q, k, v, self.rel_bias, dilation, pad_k, pad_v, layout="bthd")

        return self.layer(x, attend, token_major=True)


def batch_pads(pads: list[PadKV | None], batch: int) -> list[PadKV | None]:
    """Each sub-layer's pad key/value (1, H, Dh) expanded to (B, H, Dh) (views), once per forward: every depth step
    reads the same tensors, so their gradients meet before one reduction over the batch."""
    return [None if kv is None else (kv[0].expand(batch, -1, -1), kv[1].expand(batch, -1, -1)) for kv in pads]


class RegularGPTStack(nn.Module):
    """The shared block of K sub-layers, its learned pad vector, and the two execution modes."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.chunk_size, self.thickness = cfg.chunk_size, cfg.thickness
        self.depth_policy, self.train_length = cfg.depth_policy, cfg.train_length
        self.sublayers = nn.ModuleList(_SlidingDilatedLayer(cfg) for _ in range(cfg.thickness))
        self.pad = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.pad == "learned" else None

    def depth(self, length: int) -> int:
        """Depth steps run on a sequence of `length` tokens in sliding mode, by ``depth_policy``.

        adaptive: ceil(log_C T) (the paper); train: ceil(log_C T_train) at every length (a window of C^L_train
        tokens); per_position: ceil(log_C T) steps, of which position m takes part in max(1, ceil(log_C(m+1))).
        """
        if self.depth_policy == "train":
            if self.train_length < 1:
                raise ValueError("depth_policy 'train' needs model.train_length >= 1 (the training length)")
            return adaptive_depth(self.train_length, self.chunk_size)
        return adaptive_depth(length, self.chunk_size)

    def step_mask(self, length: int, level: int, device: torch.device) -> Tensor | None:
        """per_position: (T, 1) bool, True where position m takes part in depth step `level` (m >= C^level, or level
        0); None when every position does. Worked example, C = 2, T = 5: step 1 → m >= 2; step 2 → m >= 4."""
        if self.depth_policy != "per_position" or level == 0:
            return None
        return (torch.arange(length, device=device) >= self.chunk_size**level)[:, None]

    def pad_states(self) -> list[PadKV | None]:
        """Each sub-layer's pad key/value: p through sub-layers 0..k−1 (the same at every depth step, since the
        weights are shared), computed once per forward; Nones in mask mode."""
        if self.pad is None:
            return [None] * self.thickness
        out: list[PadKV | None] = []
        pad = self.pad
        for sub in self.sublayers:
            kv, pad = sub.pad_step(pad)
            out.append(kv)
        return out

    def step(self, x: Tensor, dilation: int, pads: list[PadKV | None] | None = None) -> Tensor:
        """One depth step: the K shared sub-layers at `dilation` over every position of x (B, T, d); `pads`: the
        sub-layers' pad keys/values expanded to x's batch (`batch_pads`), computed here when None."""
        pads = batch_pads(self.pad_states(), x.shape[0]) if pads is None else pads
        for sub, pad_kv in zip(self.sublayers, pads):
            x = sub(x, pad_kv, dilation)
        return x

    def sliding(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, T, d): depth step l at dilation C**l; every position (adaptive, train) or the positions
        m >= C**l (per_position, the others keep their state)."""
        pads = batch_pads(self.pad_states(), x.shape[0])
        for level in range(self.depth(x.shape[1])):
            active = self.step_mask(x.shape[1], level, x.device)
            new = self.step(x, self.chunk_size**level, pads)
            x = new if active is None else torch.where(active, new, x)
        return x

    def tree_steps(self, x: Tensor, every_position: bool = False) -> Iterator[Tensor]:
        """Tree mode one depth step at a time: (B, T, d) → yields the kept states (B, ceil(t/C), d) after each of
        the ``depth(T)`` steps, the last one (B, 1, d).

        A step runs the K shared sub-layers at dilation 1 and keeps :func:`last_of_each_chunk`. With K = 1 only the
        kept positions are computed, unless `every_position` (the step runs on every position, then the kept ones
        are selected: the same states up to fp32 rounding, for probes that must match a reference bit for bit).
        """
        pads = batch_pads(self.pad_states(), x.shape[0])
        for _ in range(self.depth(x.shape[1])):
            x = self._tree_step(x, pads, every_position)
            yield x

    def _tree_step(self, x: Tensor, pads: list[PadKV | None], every_position: bool = False) -> Tensor:
        """One tree-mode depth step (B, t, d) → (B, ceil(t/C), d); `pads` expanded to x's batch (`batch_pads`)."""
        keep = last_of_each_chunk(x.shape[1], self.chunk_size)
        if self.thickness == 1 and not every_position:
            return self._kept_only(x, keep, pads[0])
        return self.step(x, 1, pads)[:, keep]

    def tree(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, d): the state of the last position, computing only the positions that feed it."""
        for x in self.tree_steps(x):
            pass
        assert x.shape[1] == 1, "adaptive depth must reduce the sequence to one position"
        return x[:, 0]

    def tree_memoized(self, states: Tensor, ids: Tensor) -> Tensor:
        """Tree mode over x = states[ids] without building x: states (n, d), ids (B, T) → (B, d), equal to
        ``tree(states[ids])`` up to fp32 summation order; every distinct chunk is computed once (`memoized_tree`).
        K = 1 only, and only where equal rows give equal outputs (no active dropout)."""
        if self.thickness != 1:
            raise ValueError(f"tree_memoized needs thickness 1 (a chunk's state depends on its chunk alone); got "
                             f"{self.thickness}")
        return memoized_tree(states, ids, self.depth(ids.shape[1]), self.chunk_size, self.pad, self._chunk_step,
                             self._tree_rest)

    def _tree_rest(self, x: Tensor, steps: int) -> Tensor:
        """The last `steps` tree-mode depth steps on x (B, t, d) → (B, d) (`tree_memoized`'s fallback); the pad
        pass runs only if one of those steps has a partial chunk (t mod C ≠ 0), the only place pads are read."""
        lengths = [x.shape[1]]
        for _ in range(steps - 1):
            lengths.append(-(-lengths[-1] // self.chunk_size))
        padded = any(t % self.chunk_size for t in lengths)
        pads = batch_pads(self.pad_states(), x.shape[0]) if padded else [None] * self.thickness
        for _ in range(steps):
            x = self._tree_step(x, pads)
        return x[:, 0]

    def _chunk_step(self, table: Tensor, rows: Tensor) -> Tensor:
        """One K = 1 depth step on the chunk sequences table[rows]: table (n, d), rows (m, t' <= C) → (m, d).

        q, k, v are projected once per table row and gathered per chunk; the query is the chunk's last slot. Keys a
        chunk lacks (t' < C, mask mode) are masked by `chunk_attention`; learned pads are rows of the table."""
        sub = self.sublayers[0]
        layer, d = sub.layer, table.shape[-1]
        qkv = F.embedding(rows, layer.qkv(layer.norm1(table) if layer.pre_norm else table))  # (m, t', 3d)
        q, k, v = qkv.split(d, dim=-1)  # one cat joins their gradients
        q, k, v = (layer._split_heads(part) for part in (q[:, -1:], k, v))
        a = chunk_attention(q, k, v, sub.rel_bias, None, None)  # (m, H, 1, Dh)
        return layer.from_attention(F.embedding(rows[:, -1:], table), a)[:, 0]  # (m, 1, d) → (m, d)

    def _kept_only(self, x: Tensor, keep: slice, pad_kv: PadKV | None) -> Tensor:
        """One depth step of a K = 1 stack computed at the kept positions only; pad_kv each (B, H, Dh) or None."""
        sub = self.sublayers[0]
        pad_k, pad_v = (None, None) if pad_kv is None else pad_kv
        return sub.layer(x, lambda q, k, v: chunk_attention(q, k, v, sub.rel_bias, pad_k, pad_v), keep)


class _RegularGPTBase(nn.Module):
    def __init__(self, cfg: ModelConfig, out_features: int) -> None:
        super().__init__()
        self.config = cfg
        self.embed = TokenEmbedding(cfg)
        self.stack = RegularGPTStack(cfg)
        self.head = OutputHead(cfg, out_features, tied=self.embed.table if cfg.tie_embeddings else None)
        train_depth = adaptive_depth(cfg.train_length, cfg.chunk_size) if cfg.train_length else 1
        init_weights(self, cfg, applications=cfg.thickness * train_depth)
        for sub in self.stack.sublayers:
            init_rel_bias(sub.rel_bias, cfg.rel_bias_init)
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
        """With K = 1 and no active dropout each distinct token is embedded once and each distinct chunk computed
        once (`RegularGPTStack.tree_memoized`: the same logits and parameter gradients, less work); otherwise
        `forward_every_sequence`. ``embed`` then sees the distinct tokens (n,), not (B, T)."""
        if self.stack.thickness == 1 and not (self.training and self.config.dropout > 0):
            vocab = self.config.vocab_size
            if vocab <= tokens.numel():  # the whole table: a formal language's few symbols
                return self.head(self.stack.tree_memoized(self.embed(torch.arange(vocab, device=tokens.device)), tokens))
            distinct, ids = distinct_rows(tokens.reshape(-1, 1), vocab)  # (n, 1), (B·T,)
            return self.head(self.stack.tree_memoized(self.embed(distinct[:, 0]), ids.view(tokens.shape)))
        return self.forward_every_sequence(tokens)

    def forward_every_sequence(self, tokens: Tensor) -> Tensor:
        """Tree mode over every sequence, (B, T) → (B, classes): for probes that read per-position tensors (the
        embeddings' gradient, hooks), and the reference of the memoised forward."""
        return self.head(self.stack.tree(self.embed(tokens)))

    def flops_per_token(self, length: int) -> int:
        """Training FLOPs per input token in tree mode: step l touches ceil(T/C^l) positions (geometric sum). Counts
        `forward_every_sequence`; the memoised forward does less wherever chunks repeat across the batch."""
        per_app, _ = self._matmul_flops_per_position(length)
        c, positions, t = self.config.chunk_size, 0, length
        for _ in range(self.stack.depth(length)):
            positions += t
            t = -(-t // c)
        return 3 * (self.config.thickness * per_app * positions + 2 * self.config.d_model * self.config.num_classes) // length
