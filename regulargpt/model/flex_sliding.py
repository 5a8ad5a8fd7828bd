"""Sliding-dilated attention through FlexAttention (`algorithm="flex"`, by name only: `auto` never picks it).

Same rule as `sliding_dilated_attention`: query m sees the keys m - j·D, j < C, with logit q·k/sqrt(Dh) + r[h, j].

Layout. Fold the dilation away (D interleaved subsequences of length N = ceil(T/D)) and lay the subsequences end to
end: folded query n of subsequence s is row s·N + n. In pad mode each subsequence's keys get o = C−1 pad rows in
front, so a subsequence holds M = N + o keys and folded key n − j sits at row s·M + n + o − j (mask mode: o = 0,
M = N). Then

    mask_mod(q_row, k_row):  s_q == s_k  and  0 <= j < C,   j = n_q + o − n_k
    score_mod(score, h, q_row, k_row) = score + r[h, j]

Worked example (T=5, C=2, D=2, pads): N=3, o=1, M=4; query position 4 is s=0, n=2, row 2; it sees k rows 3 (j=0,
position 4) and 2 (j=1, position 2); query position 1 is s=1, n=0, row 3, and sees k rows 5 (position 1) and 4 (the pad).

Block sparsity. Built directly from the band, never from a T×T mask: the visible k rows of q row i lie in
[s·M + max(0, n + o − C + 1), s·M + n + o], both ends non-decreasing in i, so each 128-row query block needs one
contiguous run of key blocks (`band_block_mask`). Work is O(T·(C + 128)) scores; memory O(T) for the tensors
and O((T/128)²) int32 for the BlockMask's index table (4 MiB at T = 131,072).

FlexAttention has no backward on CPU in torch 2.13; on CPU this path serves forward-only use (benchmarks, tests of
the formulation). On an H200 (torch 2.11) it was correct but 7.8× slower than the blocked kernel on the same GPU
(results/gpu/README.md), so `auto` runs shift/blocked there too.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from regulargpt.model.dilation import fold_dilation, unfold_dilation

__all__ = ["band_block_mask", "flex_available", "flex_sliding_dilated_attention", "run_compiled_flex"]

_BLOCK = 128  # FlexAttention's default tile, for query and key blocks alike
# Smaller Triton tiles, taken for the rest of the process after the default ones ask for more shared memory than the
# GPU has (seen on an H200 with bf16, Dh = 64: "out of resource ... Required: 245760 Hardware limit: 232448").
# Forward BLOCK_M/N and backward BLOCK_M1/N1/M2/N2 all divide the block mask's 128-row blocks.
_SMALL_TILES = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64,
                "BLOCK_N2": 32}
_kernel_options: dict | None = None  # None: the compiler's own choice; _SMALL_TILES once that ran out of resources


def flex_available() -> bool:
    """True when torch has FlexAttention and a Triton to compile it for CUDA."""
    return _flex_importable()


@functools.lru_cache(maxsize=1)
def _flex_importable() -> bool:
    """Checked once per process: `auto` asks on every attention call."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return bool(has_triton())


def _band_geometry(n: int, c: int, pads: bool) -> tuple[int, int]:
    """(o, M): pad rows per subsequence and keys per subsequence."""
    o = c - 1 if pads else 0
    return o, n + o


def _mask_mod(n: int, m: int, o: int, c: int) -> Callable:
    def band(b: Tensor, h: Tensor, q_row: Tensor, k_row: Tensor) -> Tensor:
        j = q_row % n + o - k_row % m
        return (q_row // n == k_row // m) & (j >= 0) & (j < c)

    return band


def _score_mod(rel_bias: Tensor, n: int, m: int, o: int, c: int) -> Callable:
    def bias(score: Tensor, b: Tensor, h: Tensor, q_row: Tensor, k_row: Tensor) -> Tensor:
        j = (q_row % n + o - k_row % m).clamp(0, c - 1)  # out-of-band j are masked anyway
        return score + rel_bias[h, j]

    return bias


@functools.lru_cache(maxsize=64)
def band_block_mask(n: int, d: int, c: int, pads: bool, device: str):  # -> BlockMask
    """The BlockMask of the band over D subsequences of N queries, from per-row key ranges (no T×T tensor).

    Query block i covers rows [128·i, 128·i + 127]; its key blocks are lo//128 ... hi//128 with lo the first
    visible k row of its first query and hi the last visible k row of its last query.
    """
    from torch.nn.attention.flex_attention import BlockMask

    o, m = _band_geometry(n, c, pads)
    q_len, kv_len = d * n, d * m
    q_blocks, kv_blocks = -(-q_len // _BLOCK), -(-kv_len // _BLOCK)
    first = torch.arange(q_blocks, device=device) * _BLOCK
    last = (first + _BLOCK - 1).clamp(max=q_len - 1)
    lo = (first // n) * m + (first % n + o - (c - 1)).clamp(min=0)
    hi = (last // n) * m + last % n + o
    lo_block, hi_block = lo // _BLOCK, hi // _BLOCK
    count = hi_block - lo_block + 1  # (q_blocks,)
    # BlockMask wants (q_blocks, kv_blocks) indices of which the first `count` per row are used: O((T/128)²) int32
    indices = (lo_block[:, None] + torch.arange(kv_blocks, device=device)[None, :]).clamp(max=kv_blocks - 1)
    return BlockMask.from_kv_blocks(
        count.to(torch.int32)[None, None], indices.to(torch.int32)[None, None],  # (1, 1, q_blocks[, kv_blocks])
        BLOCK_SIZE=_BLOCK, mask_mod=_mask_mod(n, m, o, c), seq_lengths=(q_len, kv_len),
    )


_RECOMPILE_LIMIT = 64  # one compiled kernel per (folded geometry, dtype): depth steps × evaluated lengths


@functools.lru_cache(maxsize=1)
def _compiled_flex() -> Callable:
    """flex_attention compiled with static shapes.

    Static, because every geometry (N, M, o, C) is a Python constant of mask_mod/score_mod: under automatic dynamic
    shapes torch 2.13 reused a kernel specialised for another geometry and returned wrong outputs (seen on CPU).
    Each depth step and each evaluated length is then its own compile, so dynamo's per-function recompile limit
    (8 by default, after which it silently runs the eager, T×T-materialising implementation) is raised.
    """
    import torch._dynamo.config as dynamo_config
    from torch.nn.attention.flex_attention import flex_attention

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"  # older torch
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), _RECOMPILE_LIMIT))
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=1)
def _compiled_flex_dynamic() -> Callable:
    """flex_attention compiled once for every batch size and length (``dynamic=True``): for score and mask mods
    with no Python constant of the geometry (dense_attention's causal distance table, whose length is a tensor
    dimension), where one kernel is correct at every shape. Called under `_no_duck_shapes`."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def _no_duck_shapes() -> contextlib.AbstractContextManager:
    """Symbolic sizes that merely coincide (a batch of 4 and 4 query blocks) stay separate symbols: with duck
    shaping the first compile guards on their equality and the next length recompiles."""
    import torch.fx.experimental._config as fx_config

    return fx_config.patch(use_duck_shape=False)


def run_compiled_flex(q: Tensor, k: Tensor, v: Tensor, score_mod: Callable, block_mask: object,
                      dynamic: bool = False, **options: object) -> Tensor | tuple[Tensor, Tensor]:
    """The compiled flex_attention(q, k, v, score_mod, block_mask, **options), retried once with `_SMALL_TILES`
    (kept for the rest of the process) when the compiler's default tiles ask for more shared memory than the GPU
    has: the one retry of both FlexAttention users (this module's sliding-dilated band, dense_attention's biased
    baselines). `dynamic`: the one shape-generic compile (`_compiled_flex_dynamic`) while the default tiles hold;
    else, and after the retry (a dynamic compile would make the tile sizes symbolic inputs, which Triton needs as
    constants), static shapes, one compile per shape (`_compiled_flex`). `options`: flex_attention's other
    keywords (return_lse)."""
    global _kernel_options

    def attend() -> Tensor | tuple[Tensor, Tensor]:
        if not dynamic or _kernel_options is not None:
            return _compiled_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                    kernel_options=_kernel_options, **options)
        with _no_duck_shapes():
            return _compiled_flex_dynamic()(q, k, v, score_mod=score_mod, block_mask=block_mask,
                                            kernel_options=_kernel_options, **options)

    try:
        return attend()
    except Exception as error:  # noqa: BLE001  (inductor raises its own types; only resource errors retry)
        if _kernel_options is not None or "out of resource" not in str(error):
            raise
        _kernel_options = dict(_SMALL_TILES)
        return attend()


def flex_sliding_dilated_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                                   pad_k: Tensor | None = None, pad_v: Tensor | None = None,
                                   compile: bool = True) -> Tensor:
    """Exact sliding-dilated attention by FlexAttention over the end-to-end folded sequence.

    Args: as `sliding_dilated_attention` (q, k, v: (B, H, T, Dh); rel_bias: (H, C); pads: (B, H, Dh) or None).
    compile: run the compiled (fused, block-sparse) kernel; False runs FlexAttention's eager implementation,
        which materialises the (D·N, D·M) scores (small inputs in tests only).

    Returns: (B, H, T, Dh) in q's dtype.
    """
    from torch.nn.attention.flex_attention import flex_attention

    needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad
                                                 for x in (q, k, v, rel_bias, pad_k, pad_v))
    if q.device.type == "cpu" and needs_grad:
        raise ValueError("algorithm='flex': FlexAttention has no backward on CPU in torch "
                         f"{torch.__version__}; use algorithm='shift' or 'blocked' (or 'auto') for CPU training")
    b, h, t, dh = q.shape
    c = rel_bias.shape[1]
    n = -(-t // dilation)
    o, m = _band_geometry(n, c, pad_k is not None)
    qf, kf, vf = (fold_dilation(x, dilation) for x in (q, k, v))  # (B, H, D, N, Dh)
    if pad_k is not None:
        kf = torch.cat([pad_k[:, :, None, None, :].expand(b, h, dilation, o, dh), kf], dim=3)  # (B, H, D, M, Dh)
        vf = torch.cat([pad_v[:, :, None, None, :].expand(b, h, dilation, o, dh), vf], dim=3)
    rows_q, rows_k = dilation * n, dilation * m
    block_mask = band_block_mask(n, dilation, c, pad_k is not None, str(q.device))
    score_mod = _score_mod(rel_bias.to(torch.promote_types(q.dtype, torch.float32)), n, m, o, c)
    args = (qf.reshape(b, h, rows_q, dh), kf.reshape(b, h, rows_k, dh), vf.reshape(b, h, rows_k, dh))
    if compile:
        out = run_compiled_flex(*args, score_mod=score_mod, block_mask=block_mask)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            out = flex_attention(*args, score_mod=score_mod, block_mask=block_mask)
    return unfold_dilation(out.view(b, h, dilation, n, dh), t)  # (B, H, D·N, Dh) -> (B, H, T, Dh)
