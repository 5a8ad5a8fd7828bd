"""Shared test settings (deterministic, single-threaded-friendly CPU runs) and the fixtures several files use.

Helper functions live in tests/helpers.py.
"""

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny prepared data folder: 400 kB of the Python stdlib, BPE vocabulary 512 (about 2 s)."""
    from regulargpt.data import prepare

    out = tmp_path_factory.mktemp("data") / "stdlib"
    prepare("python-stdlib", out, vocab_size=512, max_bytes=400_000, val_fraction=0.2, num_proc=1)
    return out


@pytest.fixture(scope="session")
def zero3_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two processes, ZeRO-3, bf16, activation checkpointing, 12 steps uninterrupted: the reference run that the
    resume, kill -9 and export tests compare against."""
    from helpers import ZERO3, pretrain

    run_dir = tmp_path_factory.mktemp("z3") / "run"
    pretrain(data_dir, run_dir, *ZERO3, nproc=2)
    return run_dir
