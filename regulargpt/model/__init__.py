"""Models: the sliding-dilated kernel, RegularGPT (LM and classifier), and the dense baselines.

Model code knows nothing of DeepSpeed, SLURM or wandb. Build any model from its config with :func:`build_model`.
"""

from __future__ import annotations

from torch import nn

from regulargpt.config import ModelConfig
from regulargpt.model.dense_attention import causal_attention
from regulargpt.model.fire import FireBias
from regulargpt.model.position import (
    ATTENTION_BIASES,
    AlibiBias,
    KerpleLogBias,
    KerplePowerBias,
    SandwichBias,
    T5Bias,
    alibi_slopes,
    t5_relative_bucket,
)
from regulargpt.model.recurrent import RecurrentClassifier
from regulargpt.model.regular_gpt import RegularGPT, RegularGPTClassifier
from regulargpt.model.rotary import RotaryEmbedding, XPosEmbedding
from regulargpt.model.sliding_dilated import (
    adaptive_depth,
    reference_sliding_dilated_attention,
    sliding_dilated_attention,
)
from regulargpt.model.transformer_lm import TransformerClassifier, TransformerLM

__all__ = [
    "adaptive_depth",
    "sliding_dilated_attention",
    "reference_sliding_dilated_attention",
    "causal_attention",
    "alibi_slopes",
    "t5_relative_bucket",
    "AlibiBias",
    "T5Bias",
    "KerpleLogBias",
    "KerplePowerBias",
    "SandwichBias",
    "FireBias",
    "RotaryEmbedding",
    "XPosEmbedding",
    "ATTENTION_BIASES",
    "RegularGPT",
    "RegularGPTClassifier",
    "TransformerLM",
    "TransformerClassifier",
    "RecurrentClassifier",
    "build_model",
]


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model a config describes: (architecture, head) → class.

    regular_gpt/lm → RegularGPT, regular_gpt/classifier → RegularGPTClassifier, transformer/lm → TransformerLM,
    transformer/classifier → TransformerClassifier, rnn|lstm/classifier → RecurrentClassifier.
    Every model has ``num_parameters()`` and ``flops_per_token(length)``.
    """
    builders: dict[tuple[str, str], type[nn.Module]] = {
        ("regular_gpt", "lm"): RegularGPT,
        ("regular_gpt", "classifier"): RegularGPTClassifier,
        ("transformer", "lm"): TransformerLM,
        ("transformer", "classifier"): TransformerClassifier,
        ("rnn", "classifier"): RecurrentClassifier,
        ("lstm", "classifier"): RecurrentClassifier,
    }
    return builders[(cfg.architecture, cfg.head)](cfg)  # ModelConfig admits exactly these pairs
