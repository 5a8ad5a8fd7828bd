"""Choosing the next token from logits: greedy, or sampling with temperature, top-k and top-p (nucleus).

Sampling draws from p = softmax(logits / temperature) restricted to

* top-k: the k most probable tokens (ties at the k-th value are all kept);
* top-p: the smallest set of most probable tokens whose total probability reaches p (always at least one);

both when both are given (top-k first), renormalised. Worked example, p = [0.5, 0.3, 0.15, 0.05]: top_k = 2 keeps
{0, 1}; top_p = 0.8 keeps {0, 1} (0.5 < 0.8, 0.5 + 0.3 >= 0.8); top_p = 0.9 keeps {0, 1, 2}.

Draws use a seeded CPU ``torch.Generator`` on fp32 probabilities moved to the CPU, so a seed gives the same tokens
on every run (and the draw itself does not depend on the device the logits come from).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from regulargpt.generation.errors import GenerationError

__all__ = ["SamplingConfig", "next_token_probs", "choose_next"]


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen. ``top_k = 0`` and ``top_p = 1`` switch those filters off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise GenerationError(f"temperature must be > 0 when sampling, got {self.temperature} (use greedy "
                                  f"decoding for the most likely token)")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise GenerationError(f"top_p must be in (0, 1] (1 = off), got {self.top_p}")


def next_token_probs(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """logits (B, V) → the fp32 distribution (B, V) that sampling draws from, after temperature, top-k and top-p."""
    scaled = logits.float() / cfg.temperature
    if 0 < cfg.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, cfg.top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    if cfg.top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)  # (B, V)
        before = sorted_probs.cumsum(-1) - sorted_probs  # probability of the tokens ranked above each one
        drop_sorted = before >= cfg.top_p  # the first token always has before = 0 and stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def choose_next(logits: Tensor, cfg: SamplingConfig, generator: torch.Generator) -> Tensor:
    """logits (B, V) → next token ids (B,) on the logits' device: argmax when greedy, else a seeded draw."""
    if cfg.greedy:
        return logits.argmax(-1)
    probs = next_token_probs(logits, cfg).cpu()
    return torch.multinomial(probs, 1, generator=generator)[:, 0].to(logits.device)
