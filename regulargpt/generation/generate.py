"""The generation loop: a cached decoder for any language model, then prefill → (choose, step) × N.

    ids   = prompt repeated num_samples times              (B, T)
    logits = decoder.prefill(ids)[:, -1]                   next-token logits at position T−1
    for i < max_new_tokens: x_i = choose(logits); logits = decoder.step(x_i)

Position T+i's token is chosen from the logits of position T+i−1, so N new tokens read T+N−1 positions. A sample
stops at its first end-of-text id (kept in its output); the loop stops when every sample has stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor, nn

from regulargpt.generation.dense_decoder import DenseDecoder
from regulargpt.generation.errors import GenerationError
from regulargpt.generation.regular_decoder import RegularGPTDecoder
from regulargpt.generation.sampling import SamplingConfig, choose_next
from regulargpt.model.regular_gpt import RegularGPT
from regulargpt.model.transformer_lm import TransformerLM

__all__ = ["Decoder", "GenerationStats", "make_decoder", "teacher_forced_logits", "check_request", "generate"]


class Decoder(Protocol):
    """What every cached decoder offers (:class:`DenseDecoder`, :class:`RegularGPTDecoder`)."""

    length: int  # positions decoded so far
    max_length: int | None  # the longest sequence the model accepts, or None

    def reset(self, reserve: int = 0) -> None: ...

    def prefill(self, tokens: Tensor, last_only: bool = False, reserve: int = 0) -> Tensor: ...

    def step(self, tokens: Tensor) -> Tensor: ...

    def fill_random(self, length: int, batch: int, reserve: int = 0) -> None: ...

    @property
    def cache_bytes(self) -> int: ...


@dataclass
class GenerationStats:
    """What a :func:`generate` call held at its end: the positions its cache covers and the cache's size in bytes
    (RegularGPT under depth policy train: bounded by its rings, whatever the length; a KV cache: grows with it)."""

    positions: int = 0
    cache_bytes: int = 0


def make_decoder(model: nn.Module) -> Decoder:
    """The cached decoder of a language model: RegularGPT → rings per (step, sub-layer); TransformerLM → KV cache."""
    if isinstance(model, RegularGPT):
        return RegularGPTDecoder(model)
    if isinstance(model, TransformerLM):
        return DenseDecoder(model)
    raise GenerationError(f"{type(model).__name__} is not a language model (generation needs model.head 'lm')")


@torch.no_grad()
def teacher_forced_logits(decoder: Decoder, tokens: Tensor, prompt_length: int = 1) -> Tensor:
    """Logits (B, T, V) of tokens (B, T) computed the cached way: prefill the first `prompt_length` tokens, then
    one `step` per further token. Equal to ``model(tokens)`` (the tests' check, and perplexity through the cache)."""
    out = [decoder.prefill(tokens[:, :prompt_length])]
    out += [decoder.step(tokens[:, t])[:, None] for t in range(prompt_length, tokens.shape[1])]
    return torch.cat(out, dim=1)


def check_request(decoder: Decoder, vocab_size: int, prompt: Sequence[int], max_new_tokens: int) -> None:
    """GenerationError for an empty prompt, an id outside 0..vocab_size−1, max_new_tokens < 0, or more positions
    than the model has (learned positions: T + N − 1 <= max_positions)."""
    if not prompt:
        raise GenerationError("the prompt is empty (it encodes to no tokens); give at least one character")
    bad = [i for i in prompt if not 0 <= i < vocab_size]
    if bad:
        raise GenerationError(f"prompt token ids {bad[:5]} are outside the model's vocabulary 0..{vocab_size - 1} "
                              f"(a tokenizer other than the one the model was trained with?)")
    if max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    needed = len(prompt) + max_new_tokens - 1
    if decoder.max_length is not None and needed > decoder.max_length:
        raise GenerationError(f"a prompt of {len(prompt)} tokens plus {max_new_tokens} new tokens reads {needed} "
                              f"positions, but this model has learned absolute positions up to "
                              f"max_positions={decoder.max_length}; ask for at most "
                              f"{max(0, decoder.max_length - len(prompt) + 1)} new tokens")


@torch.no_grad()
def generate(model: nn.Module, prompt: Sequence[int], max_new_tokens: int, sampling: SamplingConfig,
             seed: int = 0, num_samples: int = 1, eos_id: int | None = None,
             on_tokens: Callable[[list[int]], None] | None = None,
             stats: GenerationStats | None = None) -> list[list[int]]:
    """New token ids for each of `num_samples` continuations of `prompt` (decoded as one batch).

    `on_tokens` receives the tokens chosen at each step, one per sample (streaming); `stats`, when given, is filled
    with the cache's final positions and size. Same seed, same output.
    """
    if num_samples < 1:
        raise GenerationError(f"num_samples must be >= 1, got {num_samples}")
    decoder = make_decoder(model)
    check_request(decoder, model.config.vocab_size, prompt, max_new_tokens)
    out: list[list[int]] = [[] for _ in range(num_samples)]
    if max_new_tokens == 0:
        return out
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt)] * num_samples, dtype=torch.long, device=device)  # (B, T)
    logits = decoder.prefill(ids, last_only=True, reserve=len(prompt) + max_new_tokens - 1)[:, 0]  # (B, V)
    generator = torch.Generator().manual_seed(seed)
    stopped = [False] * num_samples
    for i in range(max_new_tokens):
        chosen = choose_next(logits, sampling, generator)  # (B,)
        values = chosen.tolist()
        for b, token in enumerate(values):
            if not stopped[b]:
                out[b].append(token)
                stopped[b] = token == eos_id
        if on_tokens is not None:
            on_tokens(values)
        if all(stopped) or i == max_new_tokens - 1:
            break
        logits = decoder.step(chosen)
    if stats is not None:
        stats.positions, stats.cache_bytes = decoder.length, decoder.cache_bytes
    return out
