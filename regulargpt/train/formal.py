"""Training loop for the formal-language tasks: one process, plain torch, resumable.

Protocol (RegularGPT's released code, after Deletang et al. 2023): every step draws ONE length T uniformly from
``data.min_length..data.max_length`` (1..40; D_12: 1..80) and a batch of ``train.batch_size`` (128) strings of that
length from the task, then takes one Adam step (betas/eps from the config) on the cross-entropy of the class read at
the last position, after global-norm clipping to ``train.grad_clip`` (1.0), at the constant rate ``train.lr``.

Seeds: ``train.seed`` is split into independent streams with :class:`numpy.random.SeedSequence` — stream 0 seeds
model initialisation, stream 1 the data (lengths and strings), stream 2 the global torch RNG (dropout). Changing the
model therefore never changes the data a seed sees.

Run directory::

    DIR/config.resolved.json   the resolved config (compared on resume; a different config is an error)
    DIR/metrics.jsonl          {"step", "loss", "acc", "lr", "length", "seconds"} every train.log_every steps
    DIR/ckpt.pt                model + optimizer + step + RNG states, every train.save_every steps and at the end
    DIR/model.pt               the final model (regulargpt.checkpoint format), written last

Resume is automatic: with ``DIR/ckpt.pt`` present training continues from it, metrics rows after its step are
dropped, and the continued run is identical to an uninterrupted one (same batches, same losses, same parameters).
A run whose ``model.pt`` exists is finished and is not trained again.
"""

from __future__ import annotations

import io
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from regulargpt.checkpoint import save_model_file
from regulargpt.config import Config, ConfigError, config_to_dict, save_config
from regulargpt.io import atomic_write_bytes, atomic_write_text
from regulargpt.model import build_model
from regulargpt.tasks import Task, make_task

__all__ = ["CKPT_FILE", "CONFIG_FILE", "METRICS_FILE", "MODEL_FILE", "formal_task", "seed_stream", "train_formal"]

CKPT_FILE, MODEL_FILE, CONFIG_FILE, METRICS_FILE = "ckpt.pt", "model.pt", "config.resolved.json", "metrics.jsonl"
_INIT_STREAM, _DATA_STREAM, _TORCH_STREAM = 0, 1, 2
_RESUME_FREE_SECTIONS = ("logging",)  # may differ between a run and its resumption


def seed_stream(seed: int, stream: int) -> int:
    """An independent 63-bit seed for `stream` of base `seed`: SeedSequence(seed, spawn_key=(stream,))."""
    state = np.random.SeedSequence(seed, spawn_key=(stream,)).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def formal_task(cfg: Config) -> Task:
    """The config's task, checked against the model: vocab_size and num_classes must equal the task's.

    >>> formal_task(cfg)  # doctest: +SKIP   (model.vocab_size=3 for parity_check)
    ConfigError: model.vocab_size = 3 but task 'parity_check' has input_vocab_size = 2; set model.vocab_size to 2
    """
    if not cfg.data.task:
        raise ConfigError("data.task: '' is not allowed; expected a task name from regulargpt.tasks.TASK_NAMES")
    try:
        task = make_task(cfg.data.task, **cfg.data.task_options)
    except ValueError as err:
        raise ConfigError(f"data.task / data.task_options: {err}") from None
    for key, wanted in (("vocab_size", task.input_vocab_size), ("num_classes", task.num_classes)):
        have = getattr(cfg.model, key)
        if have != wanted:
            task_attr = "input_vocab_size" if key == "vocab_size" else key
            raise ConfigError(
                f"model.{key} = {have} but task {cfg.data.task!r} {cfg.data.task_options or ''} has "
                f"{task_attr} = {wanted}; set model.{key} to {wanted}"
            )
    return task


def _check_supported(cfg: Config) -> None:
    """Fields of the language-model trainer that this loop does not implement are errors, not silently ignored."""
    expected = {"model.head": (cfg.model.head, "classifier"), "train.schedule": (cfg.train.schedule, "constant"),
                "train.grad_accum": (cfg.train.grad_accum, 1), "train.precision": (cfg.train.precision, "fp32"),
                "train.zero_stage": (cfg.train.zero_stage, 0)}
    for key, (have, want) in expected.items():
        if have != want:
            raise ConfigError(f"{key}: {have!r} is not allowed for formal-language training; expected {want!r}")


def _comparable(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg_dict.items() if k not in _RESUME_FREE_SECTIONS}


def _prepare_run_dir(cfg: Config, run_dir: Path) -> None:
    path = run_dir / CONFIG_FILE
    if path.is_file():
        old = json.loads(path.read_text())
        if _comparable(old) != _comparable(config_to_dict(cfg)):
            diff = sorted(
                f"{s}.{k}" for s, section in _comparable(config_to_dict(cfg)).items() if isinstance(section, dict)
                for k, v in section.items() if old.get(s, {}).get(k) != v
            )
            raise ConfigError(f"{path}: the run directory holds a run with a different config (differs in "
                              f"{', '.join(diff) or 'sections'}); use another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, path)


def _save_ckpt(path: Path, state: dict[str, Any]) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _trim_metrics(path: Path, last_step: int) -> None:
    """Drop metrics rows logged after the checkpoint we resume from (they will be logged again)."""
    if path.is_file():
        rows = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= last_step]
        atomic_write_text(path, "".join(row + "\n" for row in rows))


def train_formal(
    cfg: Config,
    run_dir: str | Path,
    *,
    task_factory: Callable[[Config], Task] = formal_task,
) -> Path:
    """Train `cfg` in `run_dir` (resuming from ``ckpt.pt`` if present) and return the path of ``model.pt``.

    `task_factory` builds the task from the config (tests pass a wrapper to simulate a crash mid-run).
    """
    run_dir = Path(run_dir)
    _check_supported(cfg)
    task = task_factory(cfg)
    model_path = run_dir / MODEL_FILE
    _prepare_run_dir(cfg, run_dir)
    if model_path.is_file():
        return model_path

    tc = cfg.train
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_stream(tc.seed, _INIT_STREAM))
        model = build_model(cfg.model)
    optimizer = torch.optim.Adam(model.parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                                 weight_decay=tc.weight_decay)
    data_gen = torch.Generator().manual_seed(seed_stream(tc.seed, _DATA_STREAM))
    torch_rng = torch.Generator().manual_seed(seed_stream(tc.seed, _TORCH_STREAM)).get_state()
    step, seconds, bad_steps = 0, 0.0, 0
    ckpt_path = run_dir / CKPT_FILE
    if ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        data_gen.set_state(state["data_rng"])
        torch_rng = state["torch_rng"]
        step, seconds, bad_steps = state["step"], state["seconds"], state["bad_steps"]
    _trim_metrics(run_dir / METRICS_FILE, step)

    def checkpoint() -> None:
        _save_ckpt(ckpt_path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                               "data_rng": data_gen.get_state(), "torch_rng": torch.get_rng_state(),
                               "step": step, "seconds": seconds, "bad_steps": bad_steps})

    model.train()
    lengths = cfg.data.max_length - cfg.data.min_length + 1
    bar = tqdm(total=tc.steps, initial=step, desc=f"{cfg.data.task}/{cfg.model.architecture}",
               disable=not cfg.logging.progress, dynamic_ncols=True)
    with torch.random.fork_rng(devices=[]), (run_dir / METRICS_FILE).open("a") as metrics:
        torch.set_rng_state(torch_rng)
        while step < tc.steps:
            start = time.perf_counter()
            length = cfg.data.min_length + int(torch.randint(lengths, (1,), generator=data_gen))
            inputs, labels = task.sample(tc.batch_size, length, data_gen)  # (B, T), (B,)
            logits = model(inputs)  # (B, num_classes)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            if math.isfinite(loss.item()):
                loss.backward()
                if tc.grad_clip > 0:
                    nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
                optimizer.step()
            else:
                bad_steps += 1
                if bad_steps > tc.max_bad_steps:
                    raise RuntimeError(f"{run_dir}: loss is not finite at step {step + 1} "
                                       f"({bad_steps} bad steps > train.max_bad_steps = {tc.max_bad_steps})")
            step += 1
            seconds += time.perf_counter() - start
            acc = (logits.argmax(dim=-1) == labels).float().mean().item()
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.steps:
                row = {"step": step, "loss": loss.item(), "acc": acc, "lr": tc.lr, "length": length,
                       "seconds": round(seconds, 3)}
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
                bar.set_postfix(loss=f"{loss.item():.4f}", acc=f"{acc:.3f}")
            if (tc.save_every and step % tc.save_every == 0) or step == tc.steps:
                checkpoint()
    bar.close()
    save_model_file(model_path, cfg, model, meta={"step": step, "train_seconds": round(seconds, 3),
                                                  "bad_steps": bad_steps, "task": cfg.data.task})
    return model_path
