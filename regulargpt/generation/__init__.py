"""Text generation with cached decoding for every language model (see docs/GENERATION.md).

* :mod:`caches`: append-only key/value caches and ring buffers (the windowed baseline's: :class:`WindowKVCache`);
* :mod:`dense_decoder`: the dense baselines' per-layer KV cache;
* :mod:`regular_decoder`: RegularGPT's ring buffer per (depth step, sub-layer), bounded under ``depth_policy="train"``;
* :mod:`sampling`: greedy, temperature, top-k, top-p;
* :mod:`generate`: the decoding loop;
* :mod:`loading`: a run directory or model file → model and tokenizer.

The model code knows nothing of this package: decoders drive the models' own layers with their own attention
kernels, so cached logits equal the full forward's.
"""

from regulargpt.generation.caches import GrowingTensor, KVCache, RingCache, WindowKVCache
from regulargpt.generation.dense_decoder import DenseDecoder
from regulargpt.generation.errors import GenerationError
from regulargpt.generation.generate import Decoder, check_request, generate, make_decoder, teacher_forced_logits
from regulargpt.generation.regular_decoder import RegularGPTDecoder, ring_window, window_attention
from regulargpt.generation.sampling import SamplingConfig, choose_next, next_token_probs

__all__ = [
    "Decoder",
    "DenseDecoder",
    "GenerationError",
    "GrowingTensor",
    "KVCache",
    "RegularGPTDecoder",
    "RingCache",
    "SamplingConfig",
    "check_request",
    "choose_next",
    "generate",
    "make_decoder",
    "next_token_probs",
    "ring_window",
    "teacher_forced_logits",
    "window_attention",
    "WindowKVCache",
]
