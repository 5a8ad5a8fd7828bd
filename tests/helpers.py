"""Helpers shared by several test files: tiny pretraining runs as subprocesses, tiny formal-language configs, hand-made
data folders, and file-tree snapshots. (Fixtures built on them live in conftest.py.)

Pretraining runs use launch/pretrain.py (torchrun, the deepspeed launcher, or plain python) with OMP_NUM_THREADS=1,
which makes CPU training bit-for-bit deterministic for a fixed number of processes: each op runs single-threaded in
a fixed order, gloo reduces in a fixed order, and every batch is a function of (seed, step, micro_step, rank).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from regulargpt.config import FormalConfig, load_config_dict
from regulargpt.tasks import Task

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent



def load_script(relative: str) -> ModuleType:
    """A thin CLI script (launch/, eval/ are not packages), e.g. "eval/extrapolate.py", loaded as a module."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem + "_cli", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------- pretraining

TINY = [
    "model.vocab_size=512", "model.d_model=32", "model.n_heads=2", "model.chunk_size=4", "model.thickness=2",
    "data.seq_len=32", "train.batch_size=4", "train.steps=12", "train.lr=0.003", "train.log_every=1",
    "train.eval_every=6", "train.eval_batches=2", "train.save_every=3", "train.keep_last=2", "logging.progress=false",
]
ZERO3 = ["train.zero_stage=3", "train.precision=bf16", "train.activation_checkpointing=true"]


# Plots are optional (regulargpt/evaluation/plotting.py): without matplotlib (the GPU image) no PNG is written.
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def run_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this checkout first on PYTHONPATH, then what was there (the packages
    eval/gpu_campaign.sh installs beside an image, e.g.)."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=path)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pretrain_cmd(nproc: int, launcher: str = "torchrun") -> list[str]:
    script = str(ROOT / "launch" / "pretrain.py")
    if nproc == 1:
        return [sys.executable, script]
    if launcher == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", str(nproc), "--master_port", str(free_port()), script]
    return [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(nproc), script]


def pretrain_args(data_dir: Path, run_dir: Path, *sets: str) -> list[str]:
    args = ["--config", str(ROOT / "configs/tiny/regular_gpt.json"), "--run-dir", str(run_dir)]
    for item in [f"data.path={data_dir}", *TINY, *sets]:
        args += ["--set", item]
    return args


def pretrain(data_dir: Path, run_dir: Path, *sets: str, nproc: int = 1, launcher: str = "torchrun",
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A tiny training run to completion (exit status 0 asserted)."""
    proc = subprocess.run(pretrain_cmd(nproc, launcher) + pretrain_args(data_dir, run_dir, *sets), cwd=ROOT,
                          env=env or run_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run_dir)}


def latest_step(run_dir: Path) -> int:
    latest = run_dir / "latest"
    return int(latest.read_text().strip().removeprefix("global_step")) if latest.is_file() else 0


def wait_for(proc: subprocess.Popen, ready, timeout: float = 180.0) -> None:
    """Poll `ready()` every 20 ms until it is true, the process ends, or `timeout` passes."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and not ready():
        time.sleep(0.02)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process and all its descendants at once, as a node failure or `scancel` would (torchrun starts each
    rank in a session of its own, so killing its process group alone would leave the ranks running)."""
    import psutil

    try:
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for member in family:
        try:
            member.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)
    psutil.wait_procs(family[1:], timeout=60)


def interrupt(cmd: list[str], run_dir: Path, sig: int, after_latest: int = 1) -> subprocess.Popen:
    """Start a run, wait until `latest` names a checkpoint ≥ after_latest, send `sig` to the process group."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    wait_for(proc, lambda: latest_step(run_dir) >= after_latest)
    if proc.poll() is None:
        kill_tree(proc) if sig == signal.SIGKILL else proc.send_signal(sig)
    proc.wait(timeout=120)
    return proc


def checkpoint_dirs(run_dir: Path) -> list[str]:
    """Names of the global_step<N> folders (not global_step<N>.corrupt), sorted as strings."""
    return sorted(p.name for p in run_dir.glob("global_step*") if re.fullmatch(r"global_step\d+", p.name))


# ---------------------------------------------------------------------------------------------- formal tasks


def tiny_raw(**train: float) -> dict:
    """A parity-check classifier config small enough to train in a fraction of a second."""
    return {
        "model": {"architecture": "regular_gpt", "head": "classifier", "vocab_size": 2, "num_classes": 2,
                  "d_model": 16, "n_heads": 2, "norm": "post", "activation": "relu", "embedding_scale": True,
                  "dropout": 0.1},
        "data": {"task": "parity_check", "min_length": 1, "max_length": 6},
        "train": {"seed": 3, "steps": 8, "lr": 1e-2, "batch_size": 8, "log_every": 1, "save_every": 3, **train},
        "eval": {"max_length": 12, "samples_per_length": 16, "score_min_length": 7},
        "logging": {"progress": False},
    }


def tiny_cfg(**train: float) -> FormalConfig:
    return load_config_dict(tiny_raw(**train), kind=FormalConfig)


def write_formal_configs(configs: Path, profile: dict, task: dict, chunk_size: int = 2) -> list[str]:
    """A config folder for formal sweeps: `task` as configs/parity_check.json, one model preset ``c<chunk_size>``,
    `profile` as profiles/<name>.json (rewritten on every call) → the ``--profile NAME --configs DIR`` arguments."""
    (configs / "models").mkdir(parents=True, exist_ok=True)
    (configs / "profiles").mkdir(exist_ok=True)
    (configs / "parity_check.json").write_text(json.dumps(task))
    (configs / "models" / f"c{chunk_size}.json").write_text(json.dumps({"model": {"chunk_size": chunk_size}}))
    (configs / "profiles" / f"{profile['name']}.json").write_text(json.dumps(profile))
    return ["--profile", profile["name"], "--configs", str(configs)]


def formal_losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


class Crash(RuntimeError):
    pass


class CrashingTask(Task):
    """Wraps a task and raises on the `crash_at`-th sample call: a run killed between checkpoints."""

    def __init__(self, inner: Task, crash_at: int) -> None:
        self.inner, self.crash_at, self.calls = inner, crash_at, 0
        self.name, self.input_vocab_size, self.num_classes = inner.name, inner.input_vocab_size, inner.num_classes

    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        if self.calls == self.crash_at:
            raise Crash
        return self.inner.sample(batch_size, length, generator)

    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.inner.label(inputs)


# ------------------------------------------------------------------------------------------------------- data


def fake_data_folder(path: Path, tokens: dict[str, np.ndarray], vocab_size: int = 100, dtype: str = "uint16",
                     tokenizer: bytes = b"fake sentencepiece model") -> Path:
    """A data folder written by hand (no tokenizer training): `<split>.bin`, a tokenizer file and a manifest whose
    sha256 matches it. Enough for every reader; not for encoding text."""
    path.mkdir(parents=True)
    (path / "tokenizer.model").write_bytes(tokenizer)
    splits = {}
    for name, arr in tokens.items():
        arr.astype(dtype).tofile(path / f"{name}.bin")
        splits[name] = {"tokens": len(arr), "documents": 1, "file": f"{name}.bin"}
    manifest = {"format_version": 1, "dtype": dtype, "vocab_size": vocab_size, "splits": splits,
                "tokenizer": {"file": "tokenizer.model", "sha256": hashlib.sha256(tokenizer).hexdigest()}}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under `roots` (files or folders), keyed by path: compare before/after a command."""
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []
        out.update({str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files})
        if not root.exists():
            out[str(root)] = "absent"
    return out
