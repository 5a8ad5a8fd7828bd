"""Shared test settings (deterministic, single-threaded-friendly CPU runs) and the fixtures several files use.

Helper functions live in tests/helpers.py.
"""

import fcntl
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`), the `slow` tests first: handed out one at a time (--maxschedchunk 1), the
    longest start early and the short ones fill both workers at the end. One process keeps the file order."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: file order otherwise


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """``make(path)`` once per test run, even under pytest-xdist: the first worker that asks makes it in the folder
    its workers share (the parent of each worker's basetemp) under an exclusive lock, the others wait and reuse it,
    so every test compares against the same files. A make that failed leaves no ``.done`` mark: the next asker
    starts again from nothing (and fails with its own error)."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # <basetemp>/popen-gw<N> → <basetemp>
    path, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)
            make(path)
            done.touch()
    return path


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny prepared data folder: 400 kB of the Python stdlib, BPE vocabulary 512 (about 2 s)."""
    from regulargpt.data import prepare

    def make(path: Path) -> None:
        prepare("python-stdlib", path / "stdlib", vocab_size=512, max_bytes=400_000, val_fraction=0.2, num_proc=1)

    return once_per_run(tmp_path_factory, "data", make) / "stdlib"


@pytest.fixture(scope="session")
def zero3_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two processes, ZeRO-3, bf16, activation checkpointing, 12 steps uninterrupted: the reference run that the
    resume, kill -9 and export tests compare against (one per test run: about a CPU-minute)."""
    from helpers import ZERO3, pretrain

    return once_per_run(tmp_path_factory, "z3", lambda path: pretrain(data_dir, path / "run", *ZERO3, nproc=2)) / "run"
