"""Loading checkpoint files safely: every ``torch.load`` of a run directory's files, DeepSpeed's included, runs with
``weights_only=True`` (no arbitrary code from a file), see :func:`safe_loading`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

__all__ = ["safe_loading"]


@contextmanager
def safe_loading() -> Iterator[None]:
    """Every ``torch.load`` inside runs with ``weights_only=True`` — DeepSpeed's too, which asks for
    ``weights_only=False`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` overrides the argument). Allowed besides tensors and
    plain containers: numpy's array reconstruction (RNG states) and the four plain-data DeepSpeed classes its
    checkpoints hold (loss scalers, the ZeRO stage enum, optimizer fragment addresses). Not thread-safe (it sets
    an environment variable for the duration).
    """
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct

    allowed: list[Any] = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        allowed += [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]
    except ImportError:
        pass
    before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    finally:
        if before is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = before


