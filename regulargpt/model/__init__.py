"""Models: the sliding-dilated kernel, RegularGPT (LM and classifier), and the dense baselines.

Model code knows nothing of DeepSpeed, SLURM or wandb. Build any model from its config with :func:`build_model`.
"""

from __future__ import annotations

from torch import nn

from regulargpt.config import ModelConfig
from regulargpt.model.dense_attention import causal_attention
from regulargpt.model.position import (
    ATTENTION_BIASES,
    AlibiBias,
    KerpleLogBias,
    KerplePowerBias,
    T5Bias,
    alibi_slopes,
    t5_relative_bucket,
)
from regulargpt.model.regular_gpt import RegularGPT, RegularGPTClassifier
from regulargpt.model.sliding_dilated import (
    adaptive_depth,
    reference_sliding_dilated_attention,
    sliding_dilated_attention,
)
from regulargpt.model.transformer_lm import TransformerLM

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
    "ATTENTION_BIASES",
    "RegularGPT",
    "RegularGPTClassifier",
    "TransformerLM",
    "build_model",
]


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model a config describes: (architecture, head) → class.

    regular_gpt/lm → RegularGPT, regular_gpt/classifier → RegularGPTClassifier, transformer/lm → TransformerLM.
    Every model has ``num_parameters()`` and ``flops_per_token(length)``.
    """
    cfg.validate()
    key = (cfg.architecture, cfg.head)
    builders: dict[tuple[str, str], type[nn.Module]] = {
        ("regular_gpt", "lm"): RegularGPT,
        ("regular_gpt", "classifier"): RegularGPTClassifier,
        ("transformer", "lm"): TransformerLM,
    }
    if key not in builders:
        allowed = ", ".join(f"{a}/{h}" for a, h in builders)
        raise ValueError(f"model: architecture={cfg.architecture!r} with head={cfg.head!r} is not built; have {allowed}")
    return builders[key](cfg)
