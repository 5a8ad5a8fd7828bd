"""Dense causal attention for the baselines, with an optional additive bias, in bounded memory.

out_m = Σ_{n <= m} softmax_n(q_m·k_n / sqrt(Dh) + b(m, n)) v_n

Without a bias this is ``scaled_dot_product_attention(is_causal=True)`` (a fused kernel that never materialises
T×T). With a bias, queries are processed in chunks of `chunk` rows against a float mask (H, chunk, keys) = the bias
plus −inf above the diagonal: peak memory O(B·H·chunk·T), never B·H·T·T at long evaluation lengths. The mask is
fp32 (fp64 for fp64 inputs) whatever the input dtype, so with bf16 q/k/v the logits, bias and softmax stay fp32 and
only the two products run in bf16. Per chunk, the faster of two exact paths measured here (eval/bench_train.py,
docs/PERFORMANCE.md):

* fp32/fp64 inputs and a mask that needs no gradient (ALiBi; any bias under ``torch.no_grad``):
  ``scaled_dot_product_attention(attn_mask=mask)``, which on CPU runs the fused flash kernel (online softmax, no
  score block stored); equal to the explicit path to rounding (fp32: ~5e-7 relative);
* otherwise (a learned bias's gradient, which flash does not return; bf16, where the CPU flash kernel with an fp32
  mask measured 1.4-4× slower): matmul, + mask, softmax in fp32, matmul: the previous implementation, bit for bit.

:class:`CausalBias` computes each masked block once per forward pass and hands the same tensor to every layer
(the bias is shared by all layers), as long as the blocks of one pass fit in ``memory_mb``: at the training length
the bias, its mask and, for learned biases, its backward then run once per step instead of once per layer. Longer
inputs compute each chunk's block in every layer, as before (bounded memory wins over reuse).

Worked example (T = 4, one head, ALiBi slope 1/2): the mask row of query 2 is [−1, −1/2, 0, −inf].

Backends (:func:`attention_backend`, the one place the choice is made): on CUDA a biased pass over every position
runs FlexAttention (:func:`flex_causal_attention`): the bias enters as ``score_mod`` through a table of the bias at
each distance, table[h, Δ] = b_h(m, m − Δ), with a causal block mask; a learned bias's gradient reaches its
parameters through the table. Exact for biases of the distance Δ = m − n only (ALiBi, T5, KERPLE, Sandwich; checked
for every registered bias in tests/test_attention_backends.py); a bias with ``distance_only = False`` (FIRE) runs
"chunked". Without a bias, SDPA with ``is_causal`` (its flash kernel on CUDA in bf16: RoPE, xPos and NoPE); the CPU
keeps the paths above.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from regulargpt.model.near_bias import with_near_bias_gradient

__all__ = ["CausalBias", "attention_backend", "causal_attention", "distance_table", "flex_causal_attention",
           "query_chunk_size"]

BiasFn = Callable[[Tensor, Tensor], Tensor]  # (query positions (Tq,), key positions (Tk,)) -> (H, Tq, Tk) fp32


def query_chunk_size(batch: int, heads: int, length: int, memory_mb: int) -> int:
    """Largest query chunk whose fp32 score block (B, H, chunk, T) — held about 3× (scores, probs, bias) — fits."""
    per_row = 3 * 4 * batch * heads * length
    return max(1, min(length, (memory_mb << 20) // max(per_row, 1)))


class CausalBias:
    """Masked bias blocks of one forward pass: block(a, b) = bias(a..b−1, 0..b−1) + (−inf where key > query).

    :meth:`for_pass` computes the blocks a full pass will ask for up front, while their total size stays within the
    budget, and every later :meth:`block` call returns the same tensors; any other block is computed on each call.
    Up front, not on first use: a layer under activation checkpointing must save the same tensors in its forward and
    in its recomputation. Create one per forward pass: the blocks hold the bias of that pass's parameters (and, for a
    learned bias, its autograd graph, so the layers' gradients meet in one bias backward).

    >>> blocks = CausalBias(lambda qp, kp: -(qp[:, None] - kp[None, :]).float()[None])
    >>> blocks.block(1, 3, torch.device("cpu"), torch.float32)[0].tolist()
    [[-1.0, 0.0, -inf], [-2.0, -1.0, 0.0]]
    """

    def __init__(self, bias: BiasFn) -> None:
        self.bias = bias
        self._blocks: dict[tuple[int, int, torch.dtype, torch.device], Tensor] = {}

    @classmethod
    def for_pass(cls, bias: BiasFn, batch: int, heads: int, length: int, memory_mb: int, device: torch.device,
                 dtype: torch.dtype) -> CausalBias:
        """The blocks `causal_attention` asks for over `length` positions (its query chunks), memoised while their
        total stays within memory_mb; `dtype`: the mask dtype, promote(q dtype, fp32)."""
        blocks = cls(bias)
        if attention_backend(device, length, length, True, getattr(bias, "distance_only", True)) == "flex":
            return blocks  # FlexAttention reads the bias per distance, not these blocks
        chunk, used = query_chunk_size(batch, heads, length, memory_mb), 0
        for start in range(0, length, chunk):
            stop = min(length, start + chunk)
            used += heads * (stop - start) * stop * dtype.itemsize
            if used > memory_mb << 20:
                break
            blocks._blocks[(start, stop, dtype, device)] = blocks.block(start, stop, device, dtype)
        return blocks

    def block(self, first: int, stop: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """(H, stop − first, stop): queries at positions first..stop−1 against keys 0..stop−1, in `dtype`."""
        cached = self._blocks.get((first, stop, dtype, device))
        if cached is not None:
            return cached
        keys = torch.arange(stop, device=device)
        queries = keys[first:]
        future = keys[None, :] > queries[:, None]  # (c, stop)
        return self.bias(queries, keys).to(dtype).masked_fill(future, float("-inf"))  # (H, c, stop)


def attention_backend(device: torch.device, query_length: int, key_length: int, biased: bool,
                      distance_only: bool = True) -> str:
    """The kernel :func:`causal_attention` runs: "sdpa-causal" (no bias, every position), "sdpa-mask" (no bias, the
    last queries only), "flex" (a bias of the distance alone, every position, on CUDA with FlexAttention available),
    else "chunked" (the query-chunked paths of the module doc; FIRE, whose bias reads the query position too)."""
    every = query_length == key_length
    if not biased:
        return "sdpa-causal" if every else "sdpa-mask"
    if device.type == "cuda" and every and distance_only and not _flex_failed:
        from regulargpt.model.flex_sliding import flex_available

        if flex_available():
            return "flex"
    return "chunked"


_flex_failed: list[str] = []  # the error FlexAttention raised in this process, if any: later calls run "chunked"


def distance_table(bias: BiasFn, length: int, device: torch.device) -> Tensor:
    """(H, length) fp32: the bias at distances 0..length−1, table[h, Δ] = bias(m, m − Δ)[h], read off the last query
    against every key (keys length−1 … 0: distances 0 … length−1). Equal to the full bias when it depends on Δ only."""
    positions = torch.arange(length, device=device)
    return bias(positions[-1:], positions.flip(0))[:, 0].float()


@functools.lru_cache(maxsize=16)
def _causal_block_mask(length: int, device: str):  # -> BlockMask
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(lambda b, h, m, n: m >= n, None, None, length, length, device=device)


def flex_causal_attention(q: Tensor, k: Tensor, v: Tensor, bias: BiasFn, compiled: bool = True) -> Tensor:
    """FlexAttention over every position of q, k, v (B, H, T, Dh): score + table[h, m − n] under a causal block
    mask (:func:`distance_table`). `compiled=False`: torch's eager implementation (its forward also runs on CPU).

    Compiles: without gradients (evaluation) one shape-generic kernel serves every length and batch size (at most
    two compiles in a process: batch 1 is its own); with gradients, static shapes (one compile per training shape).
    A learned bias constant beyond a window (``bias.constant_beyond`` = W < T: T5) is read detached and its gradient
    computed on the band of distances < W (`near_bias`), not by the kernel's scatter into the table."""
    from torch.nn.attention.flex_attention import flex_attention

    from regulargpt.model.flex_sliding import run_compiled_flex  # the compiled flex_attention, small-tile retry

    length = q.shape[2]
    table = distance_table(bias, length, q.device)  # (H, T)
    window = getattr(bias, "constant_beyond", None)
    near = torch.is_grad_enabled() and table.requires_grad and window is not None and window < length
    read = table.detach() if near else table

    def score_mod(score: Tensor, b: Tensor, h: Tensor, m: Tensor, n: Tensor) -> Tensor:
        return score + read[h, (m - n).clamp(min=0)]  # above the diagonal: masked, any finite filler

    grads = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, table))
    attend = functools.partial(run_compiled_flex, dynamic=not grads) if compiled else flex_attention
    block_mask = _causal_block_mask(length, str(q.device))
    if not near:
        return attend(q, k, v, score_mod=score_mod, block_mask=block_mask)
    out, lse = attend(q, k, v, score_mod=score_mod, block_mask=block_mask, return_lse=True)
    return with_near_bias_gradient(out, lse, q, k, v, table, window)


@torch.compiler.disable
def _flex_or_none(q: Tensor, k: Tensor, v: Tensor, bias: BiasFn) -> Tensor | None:
    """:func:`flex_causal_attention`, or None (and one warning; "chunked" for the rest of the process) when its
    kernel does not build here. Outside any enclosing torch.compile (``train.compile``): the outer graph breaks here
    and FlexAttention compiles on its own, so a kernel that fails to build (Triton shared memory, any inductor
    error) is raised in this frame, retried with small tiles, then caught; inlined into the outer graph it would be
    raised by the outer compile, past this except (issue 39 §6; tests/test_attention_backends.py injects one)."""
    try:
        return flex_causal_attention(q, k, v, bias)
    except Exception as err:  # noqa: BLE001 (a kernel that does not build here, e.g. Triton shared memory)
        _flex_failed.append(f"{type(err).__name__}: {str(err)[:300]}")
        warnings.warn(f"FlexAttention failed ({_flex_failed[0]}); the biased baselines run the chunked path "
                      f"in this process", RuntimeWarning, stacklevel=3)
        return None


def causal_attention(q: Tensor, k: Tensor, v: Tensor, bias: BiasFn | CausalBias | None = None,
                     memory_mb: int = 256) -> Tensor:
    """Causal attention; k, v: (B, H, Tk, Dh), q: (B, H, Tq, Dh) for the LAST Tq positions (Tq = Tk: every
    position; Tq = 1: only the last, which sees every key). `bias` maps positions to an (H, Tq, Tk) fp32 bias, or is
    a :class:`CausalBias` shared by the layers of one forward pass.
    """
    b, h, tq, _ = q.shape
    tk = k.shape[2]
    first = tk - tq  # absolute position of the first query
    bias_fn = bias.bias if isinstance(bias, CausalBias) else bias
    backend = attention_backend(q.device, tq, tk, bias is not None, getattr(bias_fn, "distance_only", True))
    if backend == "flex":
        out = _flex_or_none(q, k, v, bias_fn)
        if out is not None:
            return out
    if bias is None:
        if tq == tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        visible = torch.arange(tk, device=q.device)[None, :] <= torch.arange(first, tk, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    blocks = bias if isinstance(bias, CausalBias) else CausalBias(bias)
    device = q.device.type
    if torch.is_autocast_enabled(device):  # the products in the autocast dtype, as a matmul under autocast would
        low = torch.get_autocast_dtype(device)
        q, k, v = (x.to(low) for x in (q, k, v))
    mask_dtype = torch.promote_types(q.dtype, torch.float32)
    chunk = query_chunk_size(b, h, tk, memory_mb)
    scale = 1.0 / math.sqrt(q.shape[-1])
    outs = []
    # Outside autocast: it would cast the fp32 mask to bf16 (q, k, v already carry the autocast dtype).
    with torch.autocast(device, enabled=False):
        for start in range(0, tq, chunk):
            stop = min(tq, start + chunk)
            end = first + stop  # keys 0..end−1 are visible to this chunk's last query
            mask = blocks.block(first + start, end, q.device, mask_dtype)  # (H, c, end)
            if not mask.requires_grad and q.dtype.itemsize >= 4:  # fp32/fp64, fixed bias: the flash kernel
                outs.append(F.scaled_dot_product_attention(q[:, :, start:stop], k[:, :, :end], v[:, :, :end],
                                                           attn_mask=mask[None]))  # (B, H, c, Dh)
            else:  # a learned bias needs the mask's gradient; bf16: the explicit path measured faster
                scores = torch.matmul(q[:, :, start:stop], k[:, :, :end].transpose(-1, -2)).to(mask_dtype) * scale
                probs = (scores + mask[None]).softmax(-1).to(v.dtype)  # (B, H, c, end)
                outs.append(torch.matmul(probs, v[:, :, :end]))  # (B, H, c, Dh)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
