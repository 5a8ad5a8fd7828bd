"""Probes into a trained model: RegularGPT's hidden state after every depth step, the input span each kept state
covers and the transition it should encode, and per-position input-gradient norms.

Tree mode (RegularGPT classifier, chunk size C, thickness K, L = ceil(log_C T) depth steps): step l runs the K
shared sub-layers at the current resolution (each position m sees m, m−1, …, m−C+1, pads below 0), then keeps
positions t−1, t−1−C, … . The state kept at input position i after step l covers the input span

    [max(0, i − (C^(l+1) − 1)), i]      for K = 1   (C^(l+1) tokens ending at i, clipped at 0),

and wider, overlapping spans for K > 1; :func:`tree_spans` computes them exactly for any C, K.

Example (C=2, K=1, T=5): after step 0 the kept positions 4, 2, 0 cover [3, 4], [1, 2], [0, 0]; after step 1 the
kept 4, 0 cover [1, 4], [0, 0]; after step 2 the last position covers [0, 4].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from regulargpt.model import RegularGPTClassifier, adaptive_depth
from regulargpt.model.regular_gpt import last_of_each_chunk

__all__ = ["SPAN_TRANSITIONS", "Span", "input_gradient_norms", "pad_chain", "span_transitions", "tree_spans",
           "tree_states"]


@dataclass(frozen=True)
class Span:
    """The input positions [start[j], end[j]] (inclusive) covered by kept state j of one depth step."""

    start: np.ndarray  # (n_l,) int64, nondecreasing
    end: np.ndarray  # (n_l,) int64: the input position the state sits at

    def __len__(self) -> int:
        return int(self.end.shape[0])


def tree_spans(length: int, chunk_size: int, thickness: int) -> list[Span]:
    """The span of every kept state after every depth step of tree mode, exactly (one Span per step).

    Each sub-layer widens position m's span to start where position max(0, m − C + 1) starts (pads cover no input),
    then every C-th position from the last is kept.
    """
    if thickness < 1:  # length and chunk_size are checked by adaptive_depth
        raise ValueError(f"tree_spans: thickness must be >= 1, got {thickness}")
    start = np.arange(length, dtype=np.int64)  # (T,) at resolution 0 every position covers itself
    end = np.arange(length, dtype=np.int64)
    spans = []
    for _ in range(adaptive_depth(length, chunk_size)):
        for _ in range(thickness):
            start = start[np.maximum(np.arange(len(start)) - (chunk_size - 1), 0)]
        keep = last_of_each_chunk(len(start), chunk_size)
        start, end = start[keep], end[keep]
        spans.append(Span(start.copy(), end.copy()))
    return spans



def pad_chain(length: int, chunk_size: int) -> int:
    """The longest run of depth steps in which the leftmost kept state, covering r >= 2 input symbols, meets only pads.

    Tree mode left-pads every step to a multiple of C, so a length just above a power of C leaves a short prefix in
    the leftmost chunk; its state is then combined with nothing but the pad at every following step until the
    prefix merges with real symbols again (a single-symbol prefix, r = 1, is not counted: that is the pad-only
    input a length-1 string also sees). Computed from :func:`tree_spans` with K = 1: a step where the leftmost
    state's span does not grow is a pad-only step.

    Worked examples (C = 2): T = 34 keeps the prefix [0, 1] after step 0 and meets only pads at the next 4 steps
    (lengths 17, 9, 5, 3 are odd): 4, the longest of any T <= 40. T = 258: the same prefix meets 7 pad-only steps.
    T = 257: a one-symbol prefix, 0. T = 512: no pads at all, 0.

    >>> pad_chain(34, 2), pad_chain(258, 2), pad_chain(257, 2), pad_chain(512, 2), pad_chain(40, 2)
    (4, 7, 0, 0, 2)
    """
    best = run = 0
    previous_end = None
    for span in tree_spans(length, chunk_size, 1):
        end = int(span.end[0])  # the leftmost state covers input positions [0, end]
        run = run + 1 if end == previous_end and end >= 1 else 0
        best = max(best, run)
        previous_end = end
    return best

def tree_states(model: RegularGPTClassifier, tokens: Tensor) -> list[Tensor]:
    """tokens (B, T) → the kept hidden states after each depth step: a list of L tensors (B, n_l, d).

    The model's own tree steps (``stack.tree_steps(x, every_position=True)``: the K shared sub-layers over every
    position at the current resolution, pads included, then keep x[:, t−1, t−1−C, …]), aligned with
    ``tree_spans(T, C, K)[l]``. The last state is checked against the model's real forward (logits within 1% of
    their scale), so a probe that drifted from the model fails loudly instead of plotting something else.
    """
    if not isinstance(model, RegularGPTClassifier):
        raise TypeError(f"tree_states needs a RegularGPT classifier (tree mode), got {type(model).__name__}")
    with torch.no_grad():
        states = list(model.stack.tree_steps(model.embed(tokens), every_position=True))  # L × (B, n_l, d)
        logits, expected = model.head(states[-1][:, 0]), model(tokens)  # (B, classes) twice
    scale = float(expected.abs().max().clamp_min(1.0))  # fp32 rounding differs between the two paths: at T=500
    if float((logits - expected).abs().max()) > 1e-2 * scale:  # a trained model shows ~1e-3 (fp64: ~1e-13)
        raise RuntimeError(f"tree_states disagrees with the model's forward (max |Δlogit| = "
                           f"{float((logits - expected).abs().max()):.3g}): the probe no longer follows tree mode")
    return states


# task → (per-token move v(a), modulus M): the transition of a span is sum(v(a)) mod M, which indexes the task's
# transition functions one-to-one. Parity: flip or not; Cycle Navigation: rotation by k (paper §7.3).
SPAN_TRANSITIONS: dict[str, tuple[tuple[int, ...], int]] = {
    "parity_check": ((0, 1), 2),
    "cycle_navigation": ((-1, 0, 1), 5),
}


def span_transitions(task: str, tokens: Tensor, span: Span) -> Tensor:
    """The transition each kept state should encode: (B, T) tokens, Span of n states → (B, n) class ids.

    Parity: number of 1s in the span mod 2; Cycle Navigation: net displacement (#right − #left) mod 5.
    Example (cycle navigation): span "2 2 0 1" → +1 +1 −1 0 → 1.
    """
    if task not in SPAN_TRANSITIONS:
        raise ValueError(f"no span transition for task {task!r}; supported: {', '.join(SPAN_TRANSITIONS)}")
    moves, modulus = SPAN_TRANSITIONS[task]
    steps = torch.tensor(moves, dtype=torch.long, device=tokens.device)[tokens]  # (B, T)
    prefix = F.pad(steps.cumsum(dim=1), (1, 0))  # (B, T+1): prefix[:, t] = sum of the first t moves
    start = torch.as_tensor(span.start, device=tokens.device)
    end = torch.as_tensor(span.end, device=tokens.device)
    return (prefix[:, end + 1] - prefix[:, start]) % modulus  # (B, n)


def input_gradient_norms(model: nn.Module, tokens: Tensor, targets: Tensor) -> Tensor:
    """‖∂ℓ_b/∂e_{b,t}‖₂ for every sequence b and input position t: (B, T) → (B, T).

    e = the output of ``model.embed`` (token embeddings as the layers receive them), captured by a forward hook.
    ℓ_b is the cross-entropy of the final prediction: the class logits of a classifier (B, classes), or the
    next-token logits at the LAST position of a language model (B, T, V) → (B, V). Losses are summed over the
    batch, so each row's gradient is its own loss's gradient. Dropout is whatever mode the model is in.
    (The authors add a zero ``dummy`` to the embeddings before the √d scale; that gradient is √d × this one, and
    the factor cancels in any normalised map.)
    """
    captured: list[Tensor] = []
    handle = model.embed.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        with torch.enable_grad():
            # a RegularGPT classifier's forward embeds each distinct token once: run it per position instead
            logits = model.forward_every_sequence(tokens) if isinstance(model, RegularGPTClassifier) else model(tokens)
            if logits.dim() == 3:  # language model: only the last position's next-token prediction
                logits = logits[:, -1]  # (B, V)
            # fp64 loss: a confident trained model's p − y would round to exact zeros in fp32
            loss = F.cross_entropy(logits.double(), targets, reduction="sum")
            (grad,) = torch.autograd.grad(loss, captured)  # (B, T, d); parameters get no .grad
    finally:
        handle.remove()
    return grad.norm(dim=-1)  # (B, T)
