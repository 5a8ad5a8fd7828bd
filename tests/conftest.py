"""Shared test settings: deterministic, single-threaded-friendly CPU runs."""

import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
