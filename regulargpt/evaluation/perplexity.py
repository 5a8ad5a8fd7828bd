"""Perplexity at many evaluation lengths: window plans, token accounting, bounded-memory scoring, resumable rows.

The held-out split is one token stream x_0 … x_{n−1}; a *window* of length L is the input x_a … x_{a+L−1} with the
targets x_{a+1} … x_{a+L}, and the model predicts target a+1+p from the inputs at positions 0..p of the window.
Every length scores the same targets x_1 … x_N (N = :func:`plan_tokens`), so lengths differ only in context:

* ``nonoverlapping`` (KERPLE / ALiBi): windows start at 0, L, 2L, …; every target of every window is scored.
  Example: N = 4096, L = 1024 → 4 windows, 4 × 1024 = 4096 tokens; at L = 4096 → 1 window, 4096 tokens.
* ``sliding`` with stride S: the first window (start 0) scores all L targets; each next window ends S targets later
  and scores only its last S targets (the last window ends at N and scores what is left). Every target is scored
  once, with at least L − S inputs before it except in the first window. Example: N = 10, L = 4, S = 2 → windows
  start at 0, 2, 4, 6 and score 4 + 2 + 2 + 2 = 10 targets. S = L is exactly ``nonoverlapping``.

ppl = exp(Σ NLL / N). Sums run in float64 over fp32 per-token losses. Under torchrun/deepspeed (WORLD_SIZE > 1)
rank r scores windows r, r + W, r + 2W, … and the sums and counts are all-reduced over gloo.

This module plans and scores; `length_sweep` runs the resumable sweep over runs and lengths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from regulargpt.config import ModelConfig
from regulargpt.errors import UserError
from regulargpt.model.position import ATTENTION_BIASES

__all__ = [
    "EvalError",
    "Protocol",
    "WindowPlan",
    "all_reduce_sums",
    "choose_batch_size",
    "estimate_memory",
    "model_label",
    "plan_tokens",
    "plan_windows",
    "position_buckets",
    "score_windows",
]

Protocol = Literal["nonoverlapping", "sliding"]
_GIB = float(1 << 30)
_MAX_BATCH = 256

_POSITION_NAMES = {"none": "NoPE", "sinusoidal": "Sinusoidal", "learned": "Learned", "rope": "RoPE",
                   "alibi": "ALiBi", "t5": "T5", "kerple_log": "KERPLE-log", "kerple_power": "KERPLE-power",
                   "fire": "FIRE", "xpos": "xPos", "sandwich": "Sandwich"}


class EvalError(UserError, ValueError):
    """A problem the user can fix (missing run or data, mismatched tokenizer, bad lengths); the message says which."""


# ------------------------------------------------------------------------------------------------ token accounting


def plan_tokens(stream_tokens: int, lengths: Sequence[int], requested: int = 0,
                protocol: Protocol = "nonoverlapping") -> dict[int, int]:
    """Targets scored at each length; 0 where the split is shorter than one window.

    A split of n tokens has n − 1 targets. N = `requested` (or all n − 1) rounded down to a multiple of every
    length that fits, so each length uses whole windows and all lengths score the same N. When the lengths'
    least common multiple exceeds that, N is rounded to the longest length and ``nonoverlapping`` scores
    ⌊N / L⌋·L at each L (the counts then differ slightly and the rows say so); ``sliding`` always scores N.

    >>> plan_tokens(10_000, [512, 1024, 2048])
    {512: 8192, 1024: 8192, 2048: 8192}
    >>> plan_tokens(1000, [64, 2048])
    {64: 960, 2048: 0}
    """
    available = max(0, stream_tokens - 1)
    fit = [length for length in lengths if length <= available]
    if not fit:
        return {length: 0 for length in lengths}
    target = min(requested, available) if requested > 0 else available
    longest = max(fit)
    if target < longest:
        raise EvalError(f"--tokens {requested} is less than one window of the longest length {longest}; "
                        f"ask for at least {longest} tokens")
    multiple = math.lcm(*fit)
    n = target // multiple * multiple if multiple <= target else target // longest * longest
    if protocol == "sliding":
        return {length: n if length in fit else 0 for length in lengths}
    return {length: n // length * length if length in fit else 0 for length in lengths}


@dataclass(frozen=True)
class WindowPlan:
    """Window w has inputs stream[starts[w] : starts[w] + length] and scores its positions >= score_from[w]."""

    length: int
    stride: int
    starts: np.ndarray  # (W,) int64
    score_from: np.ndarray  # (W,) int64

    @property
    def tokens(self) -> int:
        return int((self.length - self.score_from).sum())

    def shard(self, rank: int, world: int) -> WindowPlan:
        """The windows rank `rank` of `world` scores: w ≡ rank (mod world)."""
        return WindowPlan(self.length, self.stride, self.starts[rank::world], self.score_from[rank::world])


def plan_windows(tokens: int, length: int, protocol: Protocol, stride: int = 0) -> WindowPlan:
    """Windows that score targets 1..`tokens` once each (see the module docstring).

    `stride` is ignored for ``nonoverlapping`` (it is L); for ``sliding`` 0 means L // 2 (at least 1).

    >>> p = plan_windows(10, 4, "sliding", 2)
    >>> p.starts.tolist(), p.score_from.tolist(), p.tokens
    ([0, 2, 4, 6], [0, 2, 2, 2], 10)
    """
    if tokens < length:
        raise EvalError(f"{tokens} tokens do not fill one window of length {length}")
    if protocol == "nonoverlapping":
        starts = np.arange(tokens // length, dtype=np.int64) * length
        return WindowPlan(length, length, starts, np.zeros_like(starts))
    if protocol != "sliding":
        raise EvalError(f"protocol {protocol!r}: expected 'nonoverlapping' or 'sliding'")
    stride = stride or max(1, length // 2)
    if not 1 <= stride <= length:
        raise EvalError(f"--stride {stride}: expected 1 <= stride <= length {length}")
    steps = -(-(tokens - length) // stride)  # windows after the first
    ends = np.minimum(length + stride * np.arange(steps + 1, dtype=np.int64), tokens)  # last target of each window
    scored = np.diff(ends, prepend=0)
    scored[0] = length
    return WindowPlan(length, stride, ends - length, length - scored)


# ----------------------------------------------------------------------------------------------------- memory


def model_label(cfg: ModelConfig) -> str:
    """Display name: ``RegularGPT C4 K4``, ``ALiBi``, ``KERPLE-log``, ``NoPE``, ``RoPE W64`` (a 64-key window) …"""
    if cfg.architecture == "regular_gpt":
        return f"RegularGPT C{cfg.chunk_size} K{cfg.thickness}"
    if cfg.architecture == "transformer":
        return _POSITION_NAMES[cfg.position] + (f" W{cfg.window}" if cfg.window else "")
    return cfg.architecture.upper()


def estimate_memory(cfg: ModelConfig, length: int, batch: int, params: int) -> int:
    """Bytes one no-grad forward + loss of `batch` windows of `length` needs (an upper-side estimate), for a model
    with `params` parameters (``model.num_parameters()``).

    Per token (fp32): residual, normed input, q/k/v, attention output and FFN hidden (twice, around the activation)
    ≈ (2·ffn_mult + 8)·d values; logits, log-softmax and loss ≈ 3·V. RegularGPT adds its folded band scores
    (~4·H·C). Dense models with an additive bias add their query-chunked score block (``attention_memory_mb``,
    which shrinks its chunk as the batch grows, but holds at least one query row: 3·B·H·L fp32) and the bias blocks
    shared by the layers (``dense_attention.CausalBias``: at most min(budget, 4·H·L²) bytes);
    bias-free dense attention uses the fused kernel (no L×L block). A sliding window W < L
    (``model.window``) adds its banded scores instead, ~3·H·2W per token. FIRE adds its MLP's hidden layer over a
    chunk's distances, 8·width·L per query row of the chunk. Plus the fp32 weights, 4·params.
    """
    per_token = cfg.d_model * (2 * cfg.ffn_mult + 8) + 3 * cfg.vocab_size
    fixed = 0
    if cfg.architecture == "regular_gpt":
        per_token += 4 * cfg.n_heads * cfg.chunk_size
    elif 0 < cfg.window < length:  # banded: scores, probabilities and mask of 2W keys per query, the (W, 2W) band
        per_token += 3 * cfg.n_heads * 2 * cfg.window
    elif cfg.position in ATTENTION_BIASES or cfg.position == "fire":  # an additive bias: the query-chunked path
        block = 12 * batch * cfg.n_heads * length  # one query row of scores, probabilities and bias
        budget = cfg.attention_memory_mb << 20
        fixed = max(min(budget, block * length), block)
        fixed += min(budget, 4 * cfg.n_heads * length * length)
        if cfg.position == "fire":  # its MLP's hidden layer and activation over a chunk's (rows, L) distances
            fixed += 8 * cfg.fire_mlp_width * length * max(1, min(length, budget // block))
    return 4 * per_token * length * batch + fixed + 4 * params


def choose_batch_size(cfg: ModelConfig, length: int, memory_gb: float, windows: int, params: int) -> int:
    """Largest batch (≤ windows, ≤ 256) whose :func:`estimate_memory` stays within `memory_gb`; 0 if even 1 does not."""
    budget = memory_gb * _GIB
    if estimate_memory(cfg, length, 1, params) > budget:
        return 0
    lo, hi = 1, max(1, min(windows, _MAX_BATCH))
    while lo < hi:  # largest b with estimate(b) <= budget
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if estimate_memory(cfg, length, mid, params) <= budget else (lo, mid - 1)
    return lo


# ----------------------------------------------------------------------------------------------------- scoring


def position_buckets(nll_sum: np.ndarray, counts: np.ndarray) -> list[dict[str, float | int]]:
    """Mean NLL over window positions in octaves [0,1), [1,2), [2,4), [4,8), …; empty buckets are left out.

    Octave edges are shared by every length, so curves at different lengths overlay, and the training length
    (a power of two here) is a bucket edge.
    """
    out: list[dict[str, float | int]] = []
    start, end = 0, 1
    while start < len(nll_sum):
        stop = min(end, len(nll_sum))
        n = int(counts[start:stop].sum())
        if n:
            out.append({"start": start, "end": stop, "tokens": n, "nll": float(nll_sum[start:stop].sum() / n)})
        start, end = end, end * 2
    return out


@torch.no_grad()
def score_windows(model: nn.Module, stream: np.ndarray, plan: WindowPlan, batch_size: int,
                  device: torch.device | str = "cpu",
                  progress: Callable[[int], object] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Score the plan's windows → (NLL sum per window position (L,) float64, scored tokens per position (L,) int64).

    `model` maps (B, L) token ids to (B, L, V) logits and must be in eval mode; `progress(n)` is called with the
    tokens scored by each batch.
    """
    length = plan.length
    nll_sum = torch.zeros(length, dtype=torch.float64)
    counts = torch.zeros(length, dtype=torch.int64)
    positions = torch.arange(length)
    for i in range(0, len(plan.starts), batch_size):
        starts = plan.starts[i:i + batch_size]
        block = np.stack([np.asarray(stream[a:a + length + 1], dtype=np.int64) for a in starts])  # (B, L+1)
        ids = torch.from_numpy(block).to(device)
        logits = model(ids[:, :-1])  # (B, L, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="none")
        nll = nll.view(len(starts), length).cpu()  # (B, L)
        scored = positions[None, :] >= torch.from_numpy(plan.score_from[i:i + batch_size])[:, None]  # (B, L)
        nll_sum += torch.where(scored, nll.double(), 0.0).sum(0)
        counts += scored.sum(0)
        if progress is not None:
            progress(int(scored.sum()))
    return nll_sum.numpy(), counts.numpy()


def all_reduce_sums(*arrays: np.ndarray) -> list[np.ndarray]:
    """Sum numpy arrays over the default process group (gloo); identity without one."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return list(arrays)
    out = []
    for a in arrays:
        t = torch.from_numpy(np.ascontiguousarray(a))
        dist.all_reduce(t)
        out.append(t.numpy())
    return out
