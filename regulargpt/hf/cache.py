"""One of our cached decoders behind ``transformers``' ``Cache`` interface, so that ``generate`` drives it.

``generate`` keeps whatever cache the model returns (``outputs.cache``) and hands it back with the next token only
(``get_seq_length`` tells it how many tokens the cache has seen). :class:`DecoderCache` holds the decoder that
:func:`regulargpt.generation.make_decoder` picks for the model: RegularGPT's ring buffers per (depth step,
sub-layer), bounded under ``depth_policy="train"``, or a dense baseline's KV cache per layer. The first forward
prefills it with the prompt; each later forward appends tokens with ``step``, which costs one row per layer::

    out = model(prompt, use_cache=True)              # out.cache: DecoderCache, length T
    out = model(next_ids[:, None], cache=out.cache)  # logits of position T, from the caches

Decoding is per batch of sequences that start together at position 0 and grow together: beam search (which
reorders rows), cropping (assisted decoding) and padded batches are refused with a message saying so.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers.cache_utils import Cache

from regulargpt.generation import Decoder, GenerationError

__all__ = ["DecoderCache"]


class DecoderCache(Cache):
    """The cache ``generate`` passes between forwards: one regulargpt decoder and the batch size it decodes."""

    def __init__(self, decoder: Decoder) -> None:
        super().__init__(layers=[])
        self.decoder = decoder
        self.batch = 0

    @torch.no_grad()
    def prefill(self, tokens: Tensor, last_only: bool = False) -> Tensor:
        """tokens (B, T) from position 0 → logits (B, T, V), or (B, 1, V) with `last_only`."""
        self.batch = tokens.shape[0]
        return self.decoder.prefill(tokens, last_only=last_only)

    @torch.no_grad()
    def extend(self, tokens: Tensor) -> Tensor:
        """tokens (B, n) at the next n positions → their logits (B, n, V), one decoder step per token."""
        if tokens.shape[0] != self.batch:
            raise GenerationError(f"this cache decodes {self.batch} sequences, got a batch of {tokens.shape[0]} "
                                  f"(beam search and batch reordering are not supported)")
        return torch.stack([self.decoder.step(tokens[:, i]) for i in range(tokens.shape[1])], dim=1)

    # ------------------------------------------------------------------------ what generate asks of a Cache

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.decoder.length

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1 if self.decoder.max_length is None else self.decoder.max_length

    @property
    def batch_size(self) -> int:
        return self.batch

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_sliding(self) -> list[bool]:
        return [False]

    @property
    def is_linear(self) -> list[bool]:
        return [False]

    def reset(self) -> None:
        self.decoder.reset()
        self.batch = 0

    def _unsupported(self, what: str) -> GenerationError:
        return GenerationError(f"{what} is not supported by regulargpt's cached decoders: decode with greedy search "
                               f"or sampling (num_beams=1), without an assistant model")

    def reorder_cache(self, beam_idx: Tensor) -> None:
        raise self._unsupported("beam search (reordering the cache)")

    def crop(self, tokens_to_remove: int) -> None:
        raise self._unsupported("cropping the cache (assisted or speculative decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise self._unsupported("expanding a filled cache")

    def batch_select_indices(self, indices: Tensor) -> None:
        raise self._unsupported("selecting rows of a filled cache")
