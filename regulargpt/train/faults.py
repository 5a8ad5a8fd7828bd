"""Test-only fault injection for the language-model trainer: make chosen training steps produce a NaN.

    REGULARGPT_INJECT_NAN="loss@3,grad@5" python launch/pretrain.py ...

``loss@N``: the loss of optimizer step N (1-based, as logged) becomes NaN; ``grad@N``: the loss of step N stays
finite but its gradients become NaN (an identity on the logits whose backward multiplies by NaN). Injected on the
highest rank only, so a test with several processes shows that every rank agrees to skip. Unset, nothing changes:
the trainer reads the variable once and keeps an empty plan. Used by tests/test_faults.py.
"""

from __future__ import annotations

import os

import torch

__all__ = ["ENV", "nan_plan", "poison"]

ENV = "REGULARGPT_INJECT_NAN"


def nan_plan(rank: int, world_size: int) -> dict[int, str]:
    """{step: "loss" | "grad"} from the environment, for the highest rank; {} elsewhere or when unset."""
    spec = os.environ.get(ENV, "").strip()
    if not spec or rank != world_size - 1:
        return {}
    plan = {}
    for item in spec.split(","):
        kind, _, step = item.strip().partition("@")
        if kind not in ("loss", "grad") or not step.isdigit():
            raise ValueError(f"{ENV}={spec!r}: bad item {item!r}; expected loss@STEP or grad@STEP")
        plan[int(step)] = kind
    return plan


class _NanGradient(torch.autograd.Function):
    """Identity forward; backward returns NaN gradients."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


def poison(kind: str | None, logits: torch.Tensor) -> tuple[torch.Tensor, float]:
    """→ (logits to use, factor for the loss): NaN gradients through the logits, or a NaN loss, or neither."""
    if kind == "grad":
        return _NanGradient.apply(logits), 1.0
    return logits, float("nan") if kind == "loss" else 1.0
