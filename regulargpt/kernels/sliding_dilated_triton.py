"""Fused sliding-dilated attention in Triton (CUDA): forward and backward, the operator of `regulargpt.kernels`.

Query i sits at position p_i = query_start + i·query_step and reads the C keys p_i − j·D (j = 0..C−1) in place:

    s_j = q_i · k_{p_i − jD} / sqrt(Dh) + r[h, j]     (key position < 0: pad_k, or s_j = −inf with no pads)
    P = softmax_j(s),  out_i = Σ_j P_j v_{p_i − jD},  lse_i = log Σ_j exp(s_j)
    backward: dP_j = dout_i · v_j,  δ_i = Σ_j P_j dP_j,  dS_j = P_j (dP_j − δ_i)
              dq_i = scale Σ_j dS_j k_j                 dr[h, j] = Σ_{b, i} dS_j
              dk_n = scale Σ_j dS[m, j] q_m,  dv_n = Σ_j P[m, j] dout_m   over the queries at m = n + jD
              dpad_k = scale Σ_{i, j: pad} dS_j q_i,  dpad_v = Σ_{i, j: pad} P_j dout_i

Worked example (C = 2, D = 2, T = 5, sliding): query 4 reads keys 4 and 2; query 1 reads key 1 and the pad; key 2
collects from queries 2 (j = 0) and 4 (j = 1).

Layout: q (B, Tq, H, Dh), k, v (B, T, H, Dh) as the qkv projection produces them (any strides with stride(-1) = 1,
so views of one packed (B, T, 3, H, Dh) tensor are read without a copy); out, dq, dk, dv contiguous in that layout.
A program owns one (b, h) and a block of queries (forward, dq) or keys (dk, dv); each of its C shifted tiles is one
strided slab of rows, and the scores are row-wise sums in fp32 registers (no tl.dot: C <= 8 or so keys per query).
The forward runs an online softmax over j (one pass, C tiles of k and v loaded once). dq expands dS_j to
Σ_j P_j dP_j k_j − δ Σ_j P_j k_j, so the query kernel also loads each tile once.

Saved for the backward: the log-sum-exp, fp32 (B, H, Tq), not the C probabilities: 4 bytes per (query, head)
instead of 4C, and the backward recomputes s_j for free, since both backward kernels load k_j (dq, δ) or q_m (dk)
anyway (chosen by this byte count; not timed, no GPU was at hand). The query kernel also writes δ (B, H, Tq); the key kernel then recomputes P[m, j] and dS[m, j] from lse_m
and δ_m, so no (T, C) probability or dS buffer is written. No atomics: dk/dv in gather form, dr and dpad as per-block
partial sums (B, H, blocks, C or Dh) reduced once by torch, so a rerun is bit-identical.

Registered as `torch.ops.regulargpt.sliding_dilated_triton` with `torch.library.triton_op` + `wrap_triton` and its
autograd (a second triton_op for the backward), so torch.compile and CUDA graphs capture it. CPU tensors run only
under Triton's interpreter (tests): `triton_op` accepts interpreted kernels, and `wrap_triton` hands them back
unwrapped on torch 2.13 but rejects them on 2.11 (`_traceable` launches them directly there); in both cases
TRITON_INTERPRET=1 must be set before triton is first imported, since it also decides at import whether triton's
own @jit library functions (tl.sum among them) are interpreted; set later it breaks them, set in-process it changes
every triton user after it. tests/test_kernel_triton.py therefore runs the cases in a child process. torch.compile
is CUDA-only: wrap_triton hands an interpreted kernel back unwrapped, so tracing would launch it on fake tensors.
Block sizes: fixed heuristics (about 16K fp32 registers of tiles per program at num_warps 4, no autotuning), 8 rows
under the interpreter so tiny tests span several blocks. The loop over j is a `tl.range` loop, not unrolled, and
each j rebuilds its tile addresses from one (BLOCK,) row vector: unrolled, the compiler hoisted all C tile loads
(255 registers and KB of spills at C = 16); now 0 spills and <= 167 registers in every kernel at C = 8 and 16
for sm_90 (`python eval/kernel_resources.py`, results/triton_resources.md).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.library import triton_op, wrap_triton

__all__ = ["triton_sliding_dilated_attention"]

_INTERPRETED_BLOCK = 8  # queries / keys per program on CPU tensors (interpreter): several blocks at tiny T


@triton.jit
def _query_block(n_queries, head_dim, query_start, query_step, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's query rows (BLOCK_M,), their positions, the head-dim columns and the in-range tile mask."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    row_ok = rows < n_queries
    return rows, row_ok, query_start + rows * query_step, cols, row_ok[:, None] & (cols < head_dim)[None, :]


@triton.jit
def _pad_rows(pk_ptr, pv_ptr, b, h, spk_b, spk_h, spv_b, spv_h, cols, head_dim, HAS_PAD: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """pad_k[b, h], pad_v[b, h] in fp32 (BLOCK_D,), zeros when there are no pads (never used then)."""
    if HAS_PAD:
        pad_k = tl.load(pk_ptr + b * spk_b + h * spk_h + cols, mask=cols < head_dim, other=0.0).to(tl.float32)
        pad_v = tl.load(pv_ptr + b * spv_b + h * spv_h + cols, mask=cols < head_dim, other=0.0).to(tl.float32)
    else:
        pad_k = tl.zeros([BLOCK_D], tl.float32)
        pad_v = pad_k
    return pad_k, pad_v


@triton.jit
def _shifted_slab(q, k_head, v_head, sk_t, sv_t, pad_k, pad_v, r_row, pos, cols, row_tile, j, dilation, scale,
                  HAS_PAD: tl.constexpr):
    """Keys and values p_i − jD of a query block in fp32 (the pads where that is < 0), and the scores s_j
    (−inf there without pads). k_head, v_head point at (b, h, position 0); the tile addresses are rebuilt here from
    one row vector each j, so no 2-D pointer tile lives across the loop over j."""
    key_pos = pos - j * dilation  # (BLOCK_M,) int32: positions below 0 are masked (pads)
    inside = key_pos >= 0
    tile_ok = inside[:, None] & row_tile
    rows = key_pos.to(tl.int64)
    k_j = tl.load(k_head + rows[:, None] * sk_t + cols[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    v_j = tl.load(v_head + rows[:, None] * sv_t + cols[None, :], mask=tile_ok, other=0.0).to(tl.float32)
    if HAS_PAD:
        k_j = tl.where(inside[:, None], k_j, pad_k[None, :])
        v_j = tl.where(inside[:, None], v_j, pad_v[None, :])
    s = tl.sum(q * k_j, axis=1) * scale + tl.load(r_row + j)
    if not HAS_PAD:
        s = tl.where(inside, s, float("-inf"))
    return k_j, v_j, s, inside


@triton.jit
def _forward_kernel(q_ptr, k_ptr, v_ptr, r_ptr, pk_ptr, pv_ptr, out_ptr, lse_ptr,
                    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, spk_b, spk_h, spv_b, spv_h,
                    n_heads, n_queries, head_dim, dilation, query_start, query_step, scale,
                    C: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), bh % n_heads
    rows, row_ok, pos, cols, row_tile = _query_block(n_queries, head_dim, query_start, query_step, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows.to(tl.int64)[:, None] * sq_t + cols[None, :],
                mask=row_tile, other=0.0).to(tl.float32)  # (BLOCK_M, BLOCK_D)
    k_head, v_head = k_ptr + b * sk_b + h * sk_h, v_ptr + b * sv_b + h * sv_h
    r_row = r_ptr + h * C
    pad_k, pad_v = _pad_rows(pk_ptr, pv_ptr, b, h, spk_b, spk_h, spv_b, spv_h, cols, head_dim, HAS_PAD, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for j in tl.range(0, C):  # a loop, not unrolled: unrolled, the C tile loads are hoisted and all live at once
        k_j, v_j, s, inside = _shifted_slab(q, k_head, v_head, sk_t, sv_t, pad_k, pad_v, r_row, pos, cols, row_tile, j,
                                            dilation, scale, HAS_PAD)
        m_new = tl.maximum(m_i, s)  # finite from j = 0 on: position p_i itself is always visible
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new)
        acc = acc * alpha[:, None] + p[:, None] * v_j
        l_i = l_i * alpha + p
        m_i = m_new
    out_rows = (b * n_queries + rows) * n_heads + h  # out is contiguous (B, Tq, H, Dh)
    tl.store(out_ptr + out_rows[:, None] * head_dim + cols[None, :], (acc / l_i[:, None]).to(out_ptr.dtype.element_ty),
             mask=row_tile)
    tl.store(lse_ptr + bh * n_queries + rows, m_i + tl.log(l_i), mask=row_ok)


@triton.jit
def _query_backward_kernel(q_ptr, k_ptr, v_ptr, r_ptr, pk_ptr, pv_ptr, do_ptr, lse_ptr,
                           dq_ptr, delta_ptr, dr_ptr, dpk_ptr, dpv_ptr,
                           sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, spk_b, spk_h, spv_b, spv_h,
                           sdo_b, sdo_t, sdo_h,
                           n_heads, n_queries, head_dim, dilation, query_start, query_step, scale,
                           C: tl.constexpr, HAS_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_C: tl.constexpr):
    bh = tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), bh % n_heads
    rows, row_ok, pos, cols, row_tile = _query_block(n_queries, head_dim, query_start, query_step, BLOCK_M, BLOCK_D)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows.to(tl.int64)[:, None] * sq_t + cols[None, :],
                mask=row_tile, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + b * sdo_b + h * sdo_h + rows.to(tl.int64)[:, None] * sdo_t + cols[None, :],
                 mask=row_tile, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + bh * n_queries + rows, mask=row_ok, other=0.0)
    k_head, v_head = k_ptr + b * sk_b + h * sk_h, v_ptr + b * sv_b + h * sv_h
    r_row = r_ptr + h * C
    pad_k, pad_v = _pad_rows(pk_ptr, pv_ptr, b, h, spk_b, spk_h, spv_b, spv_h, cols, head_dim, HAS_PAD, BLOCK_D)
    slots = tl.arange(0, BLOCK_C)
    p_all = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)  # P[i, j]
    dp_all = tl.zeros([BLOCK_M, BLOCK_C], tl.float32)  # dP[i, j]
    pdp_k = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # Σ_j P_j dP_j k_j
    p_k = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # Σ_j P_j k_j
    pdp_pad = tl.zeros([BLOCK_M], tl.float32)  # Σ_{j: pad} P_j dP_j
    p_pad = tl.zeros([BLOCK_M], tl.float32)  # Σ_{j: pad} P_j
    for j in tl.range(0, C):  # a loop, not unrolled: unrolled, the C tile loads are hoisted and all live at once
        k_j, v_j, s, inside = _shifted_slab(q, k_head, v_head, sk_t, sv_t, pad_k, pad_v, r_row, pos, cols, row_tile, j,
                                            dilation, scale, HAS_PAD)
        p = tl.where(row_ok, tl.exp(s - lse), 0.0)
        dp = tl.sum(do * v_j, axis=1)
        p_all = tl.where(slots[None, :] == j, p[:, None], p_all)
        dp_all = tl.where(slots[None, :] == j, dp[:, None], dp_all)
        pdp_k += (p * dp)[:, None] * k_j
        p_k += p[:, None] * k_j
        if HAS_PAD:
            pdp_pad += tl.where(inside, 0.0, p * dp)
            p_pad += tl.where(inside, 0.0, p)
    delta = tl.sum(p_all * dp_all, axis=1)  # δ_i = Σ_j P_j dP_j
    dq = scale * (pdp_k - delta[:, None] * p_k)
    dq_rows = (b * n_queries + rows) * n_heads + h  # dq is contiguous (B, Tq, H, Dh)
    tl.store(dq_ptr + dq_rows[:, None] * head_dim + cols[None, :], dq.to(dq_ptr.dtype.element_ty), mask=row_tile)
    tl.store(delta_ptr + bh * n_queries + rows, delta, mask=row_ok)
    block = bh * tl.num_programs(0) + tl.program_id(0)  # this program's slot in the partial-sum buffers
    ds_all = p_all * (dp_all - delta[:, None])
    tl.store(dr_ptr + block * C + slots, tl.sum(ds_all, axis=0), mask=slots < C)
    if HAS_PAD:
        ds_pad = pdp_pad - delta * p_pad
        tl.store(dpk_ptr + block * head_dim + cols, scale * tl.sum(ds_pad[:, None] * q, axis=0), mask=cols < head_dim)
        tl.store(dpv_ptr + block * head_dim + cols, tl.sum(p_pad[:, None] * do, axis=0), mask=cols < head_dim)


@triton.jit
def _key_backward_kernel(q_ptr, k_ptr, v_ptr, r_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
                         sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sdo_b, sdo_t, sdo_h,
                         n_heads, n_keys, n_queries, head_dim, dilation, query_start, query_step, scale,
                         C: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid, bh = tl.program_id(0), tl.program_id(1)
    b, h = (bh // n_heads).to(tl.int64), bh % n_heads
    keys = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    key_ok = keys < n_keys
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < head_dim
    key_tile = key_ok[:, None] & col_ok[None, :]
    k = tl.load(k_ptr + b * sk_b + h * sk_h + keys.to(tl.int64)[:, None] * sk_t + cols[None, :],
                mask=key_tile, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * sv_b + h * sv_h + keys.to(tl.int64)[:, None] * sv_t + cols[None, :],
                mask=key_tile, other=0.0).to(tl.float32)
    q_head, do_head = q_ptr + b * sq_b + h * sq_h, do_ptr + b * sdo_b + h * sdo_h
    lse_row, delta_row, r_row = lse_ptr + bh * n_queries, delta_ptr + bh * n_queries, r_ptr + h * C
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for j in tl.range(0, C):  # not unrolled (see the forward)
        offset = keys + j * dilation - query_start  # query position m = n + jD, relative to query 0
        query = offset // query_step
        reads = key_ok & (offset >= 0) & (offset % query_step == 0) & (query < n_queries)
        query = tl.where(reads, query, 0).to(tl.int64)
        tile_ok = reads[:, None] & col_ok[None, :]
        q_m = tl.load(q_head + query[:, None] * sq_t + cols[None, :], mask=tile_ok, other=0.0).to(tl.float32)
        do_m = tl.load(do_head + query[:, None] * sdo_t + cols[None, :], mask=tile_ok, other=0.0).to(tl.float32)
        lse = tl.load(lse_row + query, mask=reads, other=0.0)
        delta = tl.load(delta_row + query, mask=reads, other=0.0)
        s = tl.sum(q_m * k, axis=1) * scale + tl.load(r_row + j)
        p = tl.where(reads, tl.exp(s - lse), 0.0)  # P[m, j]
        ds = p * (tl.sum(do_m * v, axis=1) - delta)  # dS[m, j]
        dk += ds[:, None] * q_m
        dv += p[:, None] * do_m
    out_rows = (b * n_keys + keys) * n_heads + h  # dk, dv are contiguous (B, T, H, Dh)
    tl.store(dk_ptr + out_rows[:, None] * head_dim + cols[None, :], (scale * dk).to(dk_ptr.dtype.element_ty),
             mask=key_tile)
    tl.store(dv_ptr + out_rows[:, None] * head_dim + cols[None, :], dv.to(dv_ptr.dtype.element_ty), mask=key_tile)


def _launch(kernel: triton.JITFunction, q: Tensor, grid: tuple[int, int], *args: object, **meta: object) -> None:
    if q.device.type != "cuda" and isinstance(kernel, triton.JITFunction):
        raise RuntimeError("triton_sliding_dilated_attention: CPU tensors run only under Triton's interpreter, with "
                           "TRITON_INTERPRET=1 set before triton is imported (tests); on CPU use the C++ kernel")
    _traceable(kernel)[grid](*args, **meta)  # Triton's default num_warps = 4


def _traceable(kernel: object) -> object:
    """``wrap_triton(kernel)`` where torch accepts the kernel, else the kernel itself (an interpreted one).

    What wrap_triton accepts differs by release: torch 2.13 hands an interpreted kernel (TRITON_INTERPRET=1: an
    ``InterpretedFunction``, not a ``JITFunction``) back unwrapped, torch 2.11 raises RuntimeError for anything but
    ``JITFunction``/``Autotuner``. Launching the interpreted kernel directly is what 2.13 does; a compiled kernel that
    wrap_triton rejects is a real error and is raised."""
    try:
        return wrap_triton(kernel)
    except RuntimeError:
        if isinstance(kernel, (triton.JITFunction, triton.runtime.Autotuner)):
            raise
        return kernel


def _block(device: torch.device, head_block: int, register_tiles: int) -> int:
    """Rows per program: about 16K fp32 registers of tiles on CUDA (64 rows at Dh = 64 forward), 8 interpreted."""
    if device.type != "cuda":
        return _INTERPRETED_BLOCK
    rows = 16384 // (register_tiles * head_block)
    return max(16, min(128, 1 << (rows.bit_length() - 1)))  # the power of 2 at or below


def _pad_args(pad_k: Tensor | None, pad_v: Tensor | None, like: Tensor) -> tuple[Tensor, Tensor, int, int, int, int]:
    if pad_k is None or pad_v is None:
        return like, like, 0, 0, 0, 0  # never read (HAS_PAD = False)
    return pad_k, pad_v, pad_k.stride(0), pad_k.stride(1), pad_v.stride(0), pad_v.stride(1)


@triton_op("regulargpt::sliding_dilated_triton", mutates_args={})
def _sliding_dilated_op(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None,
                        pad_v: Tensor | None, query_start: int, query_step: int) -> tuple[Tensor, Tensor]:
    """(out (B, Tq, H, Dh) in q's dtype, lse (B, H, Tq) fp32)."""
    b, tq, h, dh = q.shape
    c = rel_bias.shape[1]
    out = torch.empty((b, tq, h, dh), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, tq), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(dh)
    block_m = _block(q.device, block_d, register_tiles=4)
    pads = _pad_args(pad_k, pad_v, q)
    _launch(_forward_kernel, q, (triton.cdiv(tq, block_m), b * h),
            q, k, v, rel_bias.float().contiguous(), pads[0], pads[1], out, lse,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *pads[2:],
            h, tq, dh, dilation, query_start, query_step, 1.0 / math.sqrt(dh),
            C=c, HAS_PAD=pad_k is not None, BLOCK_M=block_m, BLOCK_D=block_d)
    return out, lse


@triton_op("regulargpt::sliding_dilated_triton_backward", mutates_args={})
def _sliding_dilated_backward_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                                 pad_k: Tensor | None, pad_v: Tensor | None, lse: Tensor, query_start: int,
                                 query_step: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dr (H, C) fp32, dpad_k, dpad_v (B, H, Dh) fp32; empty (0,) without pads)."""
    b, tq, h, dh = q.shape
    t, c = k.shape[1], rel_bias.shape[1]
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    r32 = rel_bias.float().contiguous()
    has_pad = pad_k is not None
    block_d = triton.next_power_of_2(dh)
    scale = 1.0 / math.sqrt(dh)
    block_m = _block(q.device, block_d, register_tiles=6)
    blocks = triton.cdiv(tq, block_m)
    dq = torch.empty((b, tq, h, dh), dtype=q.dtype, device=q.device)
    delta = torch.empty((b, h, tq), dtype=torch.float32, device=q.device)
    dr_part = torch.empty((b, h, blocks, c), dtype=torch.float32, device=q.device)
    pad_part = (b, h, blocks, dh) if has_pad else (0,)
    dpk_part, dpv_part = (torch.empty(pad_part, dtype=torch.float32, device=q.device) for _ in range(2))
    pads = _pad_args(pad_k, pad_v, q)
    _launch(_query_backward_kernel, q, (blocks, b * h),
            q, k, v, r32, pads[0], pads[1], dout, lse, dq, delta, dr_part, dpk_part, dpv_part,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *pads[2:], *dout.stride()[:3],
            h, tq, dh, dilation, query_start, query_step, scale,
            C=c, HAS_PAD=has_pad, BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_C=triton.next_power_of_2(c))
    dk = torch.empty((b, t, h, dh), dtype=k.dtype, device=k.device)
    dv = torch.empty((b, t, h, dh), dtype=v.dtype, device=v.device)
    block_n = _block(q.device, block_d, register_tiles=6)
    _launch(_key_backward_kernel, q, (triton.cdiv(t, block_n), b * h),
            q, k, v, r32, dout, lse, delta, dk, dv,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3],
            h, t, tq, dh, dilation, query_start, query_step, scale,
            C=c, BLOCK_N=block_n, BLOCK_D=block_d)
    if has_pad:
        dpk_part, dpv_part = dpk_part.sum(2), dpv_part.sum(2)  # (B, H, Dh)
    return dq, dk, dv, dr_part.sum((0, 2)), dpk_part, dpv_part


def _setup_context(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, rel_bias, dilation, pad_k, pad_v, query_start, query_step = inputs
    ctx.save_for_backward(q, k, v, rel_bias, pad_k, pad_v, output[1])
    ctx.positions = (dilation, query_start, query_step)
    ctx.mark_non_differentiable(output[1])


def _backward(ctx: torch.autograd.function.FunctionCtx, dout: Tensor, _dlse: Tensor | None) -> tuple[Tensor | None, ...]:
    q, k, v, rel_bias, pad_k, pad_v, lse = ctx.saved_tensors
    dilation, query_start, query_step = ctx.positions
    dq, dk, dv, dr, dpk, dpv = torch.ops.regulargpt.sliding_dilated_triton_backward(
        dout, q, k, v, rel_bias, dilation, pad_k, pad_v, lse, query_start, query_step)
    if pad_k is None or pad_v is None:
        dpad_k = dpad_v = None
    else:
        dpad_k, dpad_v = dpk.to(pad_k.dtype), dpv.to(pad_v.dtype)
    return dq, dk, dv, dr.to(rel_bias.dtype), None, dpad_k, dpad_v, None, None


_sliding_dilated_op.register_autograd(_backward, setup_context=_setup_context)


def triton_sliding_dilated_attention(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int,
                                     pad_k: Tensor | None = None, pad_v: Tensor | None = None,
                                     query_start: int = 0, query_step: int = 1) -> Tensor:
    """The operator contract of `regulargpt.kernels` on CUDA tensors (CPU tensors: the interpreter, tests only).

    Args:
        q: (B, Tq, H, Dh); k, v: (B, T, H, Dh); stride(-1) == 1, other strides free. fp32, bf16 or fp16.
        rel_bias: (H, C), any float dtype (used in fp32). dilation: D >= 1.
        pad_k, pad_v: (B, H, Dh) (stride 0 along B allowed), or both None to mask key positions below 0.
        query_start, query_step: query i sits at position query_start + i·query_step (tree mode: (t−1) % C, C).

    Returns:
        out (B, Tq, H, Dh), contiguous, q's dtype; differentiable in q, k, v, rel_bias, pad_k, pad_v.
    """
    _check(q, k, v, rel_bias, dilation, pad_k, pad_v, query_start, query_step)
    return torch.ops.regulargpt.sliding_dilated_triton(q, k, v, rel_bias, dilation, pad_k, pad_v,
                                                       query_start, query_step)[0]


def _check(q: Tensor, k: Tensor, v: Tensor, rel_bias: Tensor, dilation: int, pad_k: Tensor | None,
           pad_v: Tensor | None, query_start: int, query_step: int) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or q.shape[::2] != k.shape[::2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q must be (B, Tq, H, Dh) and k, v (B, T, H, Dh); got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    b, tq, h, dh = q.shape
    if rel_bias.dim() != 2 or rel_bias.shape[0] != h or rel_bias.shape[1] < 1:
        raise ValueError(f"rel_bias must be (H, C) with H = {h}, C >= 1; got {tuple(rel_bias.shape)}")
    if dilation < 1 or query_step < 1 or query_start < 0:
        raise ValueError(f"need dilation >= 1, query_step >= 1, query_start >= 0; got {dilation}, {query_step}, "
                         f"{query_start}")
    if tq and query_start + (tq - 1) * query_step >= k.shape[1]:
        raise ValueError(f"query positions {query_start} + i·{query_step}, i < {tq}, run past T = {k.shape[1]}")
    if (pad_k is None) != (pad_v is None):
        raise ValueError("pad_k and pad_v must both be given or both be None")
    pads = [x for x in (pad_k, pad_v) if x is not None]
    for pad in pads:
        if pad.shape != (b, h, dh):
            raise ValueError(f"pad_k/pad_v must be (B, H, Dh) = {(b, h, dh)}; got {tuple(pad.shape)}")
    for x in [q, k, v, *pads]:
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16) or x.stride(-1) != 1:
            raise ValueError(f"the Triton kernel takes fp32/bf16/fp16 tensors with stride(-1) == 1; got {x.dtype}, "
                             f"strides {x.stride()}")
        if x.device != q.device or x.dtype != q.dtype or rel_bias.device != q.device:
            raise ValueError(f"q, k, v, the pads and rel_bias must share one device (and all but rel_bias one dtype);"
                             f" got {x.device}/{x.dtype} against q's {q.device}/{q.dtype}")
