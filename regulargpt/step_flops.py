"""FLOPs of one training step of a language-model config, activation checkpointing's recompute included, and the
FLOP ratio of a dense baseline to another model at the same tokens per step.

Per token, from the model's own count (``flops_per_token``, built on the meta device): A = forward FLOPs of the layer
applications, h = 2·d·V of the head. Forward + backward is 3× the forward; checkpointing
(:func:`regulargpt.train.engine.apply_activation_checkpointing`, which wraps the Transformer layers only, not the
head) runs every layer application's forward once more in the backward::

    F_step = B·T · (3·(A + h) + [checkpointing]·A)

    RegularGPT  A = K·L · (2·(4d² + 2f·d²) + 4·C·d)    L = ceil(log_C T) (adaptive), ceil(log_C T_train) (train)
    dense       A = n_layers · (2·(4d² + 2f·d²) + 4·d·(T+1)/2)   (a causal query sees (T+1)/2 keys on average)

The 2·(4d² + 2f·d²) are the q, k, v, output and FFN matmuls; 4·C·d and 4·d·(T+1)/2 the two attention products
(scores and the weighted sum of values) over the keys a query sees. The ratio F_dense / F_other at equal B·T does not
depend on the batch.

Worked example, configs/long at T = 65,536 (d 768, f 4, V 8000, C 8, K 4, 12 dense layers; h = 12,288,000):
RegularGPT adaptive L = 6, A = 24 · (14,155,776 + 24,576) = 340,328,448; ALiBi A = 12 · (14,155,776 +
4·768·65,537/2) = 12 · (14,155,776 + 100,664,832) = 1,377,847,296; with checkpointing the ratio is
(4 · 1,377,847,296 + 3h) / (4 · 340,328,448 + 3h) = 3.97, and against depth_policy train (T_train 512, L = 3,
A = 170,164,224) 7.73.
"""

from __future__ import annotations

import torch

from regulargpt.config import Config, ConfigError
from regulargpt.model import build_model

__all__ = ["forward_flops_per_token", "step_flops", "flop_ratio"]


def forward_flops_per_token(cfg: Config, length: int) -> tuple[int, int]:
    """(A, h): forward FLOPs per token of the layer applications and of the head at sequence length `length`."""
    if cfg.model.head != "lm":
        raise ConfigError(f"model.head: {cfg.model.head!r} is not counted here; expected 'lm' (a language model)")
    with torch.device("meta"):
        model = build_model(cfg.model)
    head = 2 * cfg.model.d_model * cfg.model.vocab_size
    layers, rest = divmod(model.flops_per_token(length), 3)  # flops_per_token = 3 · (A + h)
    assert rest == 0, "flops_per_token is three times the forward count"
    return layers - head, head


def step_flops(cfg: Config, length: int | None = None, batch: int | None = None,
               checkpointing: bool | None = None) -> int:
    """F_step of the module doc for one micro-batch of `batch` sequences of `length` tokens (default: the config's
    data.seq_len, train.batch_size and train.activation_checkpointing)."""
    t = cfg.data.seq_len if length is None else length
    b = cfg.train.batch_size if batch is None else batch
    ac = cfg.train.activation_checkpointing if checkpointing is None else checkpointing
    layers, head = forward_flops_per_token(cfg, t)
    return b * t * (3 * (layers + head) + (layers if ac else 0))


def flop_ratio(dense: Config, other: Config, length: int) -> float:
    """F_step(dense) / F_step(other) at `length`, both at one sequence per step (the ratio at any equal B·T), each
    with its own checkpointing setting: the step-time advantage `other` would have at equal FLOP/s."""
    return step_flops(dense, length, 1) / step_flops(other, length, 1)
