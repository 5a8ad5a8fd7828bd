"""Training loop for the formal-language tasks: one process, plain torch, resumable.

Protocol (RegularGPT's released code, after Deletang et al. 2023): every step draws ONE length T uniformly from
``data.min_length..data.max_length`` (1..40; D_12: 1..80) and a batch of ``train.batch_size`` (128) strings of that
length from the task, then takes one Adam step (betas/eps from the config) on the cross-entropy of the class read at
the last position, after global-norm clipping to ``train.grad_clip`` (1.0), at the constant rate ``train.lr``.

Seeds: ``train.seed`` is split into independent streams with :class:`numpy.random.SeedSequence` — stream 0 seeds
model initialisation, stream 1 the data (lengths and strings), stream 2 the global torch RNG (dropout). Changing the
model therefore never changes the data a seed sees.

Run directory (file names in :mod:`regulargpt.run_directory.layout`; config check, metrics truncation and checkpoint
fallback are the shared :mod:`regulargpt.run_directory`)::

    DIR/config.resolved.json   the resolved config (compared on resume; a different config is an error)
    DIR/metrics.jsonl          {"step", "loss", "acc", "lr", "length", "seconds"} every train.log_every steps
    DIR/ckpt.pt                model + optimizer + step + RNG states, every train.save_every steps and at the end
    DIR/ckpt.prev.pt           the checkpoint before it (each save renames ckpt.pt to this, then writes ckpt.pt)
    DIR/model.pt               the kept model (regulargpt.checkpoint format), written last: the last step's, or
                               with eval.select_last > 1 the best training-length fit of the last checks
                               (:mod:`regulargpt.train.formal_selection`; meta: kept_step, selection)
    DIR/time_to_solve.jsonl    with a :class:`SolveCheck`: {"step", "seconds", "cpu_seconds", "score", "loss",
                               "lengths"} every `every` steps (training wall and process-CPU seconds so far, checks
                               excluded; score and loss: mean accuracy and cross-entropy over the checked lengths)

Resume is automatic: with ``DIR/ckpt.pt`` present training continues from it, metrics rows after its step are
dropped, and the continued run is identical to an uninterrupted one (same batches, same losses, same parameters).
A ``ckpt.pt`` that cannot be read (truncated, overwritten) is renamed ``ckpt.pt.corrupt`` and the run resumes from
``ckpt.prev.pt``, with a warning naming both. A run whose ``model.pt`` exists is finished and is not trained again.

Devices: the model and its optimizer live on `device` (``"cpu"``, ``"cuda"``, ``"cuda:1"``); the strings are drawn on
the CPU from the seeded generator and moved there, so a seed sees the same data on every device. With CUDA the
device's RNG is seeded from stream 2 as well and kept in the checkpoint (dropout on the GPU resumes identically).

Stopping: with ``stop`` (e.g. a :class:`regulargpt.train.stopping.StopRequest`'s ``requested``), the loop asks it
after every step; once it answers True the step is checkpointed and training returns None without ``model.pt``,
as `stop_at` does. A SLURM array task resumes from that checkpoint when it is requeued.

A step whose loss or global gradient norm is not finite is skipped (no optimizer update) with a warning; more than
``train.max_bad_steps`` of them stop the run with a TrainError, leaving the last checkpoint as it was.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from regulargpt.checkpoint import CheckpointError, save_model_file
from regulargpt.config import ConfigError, FormalConfig, config_to_dict, formal_config_from_saved, save_config
from regulargpt.evaluation.formal_scoring import RangeEvalError, held_out_grades, parse_lengths
from regulargpt.files import read_jsonl
from regulargpt.model import build_model
from regulargpt.provenance import git_commit
from regulargpt.run_directory.layout import CKPT_FILE, CONFIG_FILE, METRICS_FILE, MODEL_FILE, SOLVE_FILE
from regulargpt.tasks import Task, TaskError, make_task
from regulargpt.train.engine import TrainError
from regulargpt.train.formal_selection import KeptModel
from regulargpt.run_directory import (
    ResumePolicy,
    check_config_unchanged,
    ckpt_config,
    config_changes,
    load_ckpt,
    open_for_append,
    save_ckpt,
    saved_config,
    truncate_after,
)

__all__ = ["SolveCheck", "check_lengths_option", "formal_task", "seed_stream", "train_formal"]

_CKPT_KEYS = ("model", "optimizer", "data_rng", "torch_rng", "step", "seconds", "bad_steps")  # + cpu_seconds, kept
_INIT_STREAM, _DATA_STREAM, _TORCH_STREAM = 0, 1, 2
_RESUME_FREE = ResumePolicy(sections=("logging",))  # may differ between a run and its resumption


@dataclass(frozen=True)
class SolveCheck:
    """Time-to-solve: every `every` steps, the held-out score (mean accuracy over `lengths`, `samples` fixed strings
    each, :func:`~regulargpt.evaluation.formal_scoring.held_out_grades`) and its cross-entropy are logged with the
    training seconds so far (checks excluded). The first check at >= `threshold` is the time to solve. The check
    reads the model only: training with and without it is identical (tested).

    With `lengths` inside the training range (``--check-lengths 1-40``) the same check measures the *fit*: pilot
    runs choose step counts from it (``eval/formal.py pilot-steps --criterion check``), never from held-out lengths."""

    every: int = 100
    lengths: tuple[int, ...] = tuple(range(41, 501, 51))  # 41, 92, …, 500
    samples: int = 64
    threshold: float = 0.99

    @property
    def span(self) -> list[int]:
        """[shortest, longest, how many] checked lengths, logged with every check row: a reader can tell a held-out
        check (41..500) from a fit check on the training lengths (1..40) without the command line."""
        return [min(self.lengths), max(self.lengths), len(set(self.lengths))]

    def __post_init__(self) -> None:
        if self.every < 1 or self.samples < 1 or not self.lengths or min(self.lengths) < 1:
            raise ConfigError(f"time-to-solve check: every={self.every}, samples={self.samples}, lengths "
                              f"{list(self.lengths)[:3]}…: expected every >= 1, samples >= 1, lengths >= 1")


def check_lengths_option(spec: str | None, cfg: FormalConfig) -> tuple[int, ...]:
    """The lengths of a ``--check-lengths SPEC`` flag (:func:`~regulargpt.evaluation.formal_scoring.parse_lengths`,
    clipped to the longer of eval.max_length and data.max_length); without one, :class:`SolveCheck`'s held-out
    default. A bad spec is a RangeEvalError naming the flag."""
    if spec is None:
        return SolveCheck.lengths
    try:
        return tuple(parse_lengths(spec, max(cfg.eval.max_length, cfg.data.max_length)))
    except RangeEvalError as err:
        raise RangeEvalError(f"--check-lengths: {err}") from None


def seed_stream(seed: int, stream: int) -> int:
    """An independent 63-bit seed for `stream` of base `seed`: SeedSequence(seed, spawn_key=(stream,))."""
    state = np.random.SeedSequence(seed, spawn_key=(stream,)).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


def formal_task(cfg: FormalConfig) -> Task:
    """The config's task, checked against the model: vocab_size and num_classes must equal the task's.

    >>> formal_task(cfg)  # doctest: +SKIP   (model.vocab_size=3 for parity_check)
    ConfigError: model.vocab_size = 3 but task 'parity_check' has input_vocab_size = 2; set model.vocab_size to 2
    """
    if not cfg.data.task:
        raise ConfigError("data.task: '' is not allowed; expected a task name from regulargpt.tasks.TASK_NAMES")
    try:
        task = make_task(cfg.data.task, **cfg.data.task_options)
    except TaskError as err:
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


def _seeded_cuda_rng(device: torch.device, seed: int) -> torch.Tensor | None:
    """The RNG state of a CUDA `device` seeded with `seed` (this device's global RNG is left as it was); None
    elsewhere."""
    if device.type != "cuda":
        return None
    with torch.random.fork_rng(devices=[device]):
        torch.cuda.manual_seed(seed)
        return torch.cuda.get_rng_state(device)


def _prepare_run_dir(cfg: FormalConfig, run_dir: Path) -> None:
    """Compare the run's saved config with `cfg` (a difference outside ``logging`` is a ConfigError naming the keys),
    then record `cfg` as the run's config. A run saved before FormalConfig existed is read without its LM-only keys.
    A missing or unreadable config.resolved.json is replaced by the copy inside ckpt.pt (or ckpt.prev.pt), with a
    note; checkpoints written before they held one resume as before."""
    try:
        old, why = saved_config(run_dir, ConfigError, read=formal_config_from_saved), "is missing"
    except ConfigError:
        if ckpt_config(run_dir) is None:
            raise
        old, why = None, "is unreadable"
    found = ckpt_config(run_dir) if old is None else None
    if found is not None:
        path, raw = found
        old = formal_config_from_saved(raw, source=f"{path}[config]")
        print(f"note: {run_dir / CONFIG_FILE} {why}; using the config saved in {path.name} and rewriting the file "
              f"from it", file=sys.stderr, flush=True)
    if old is not None:
        check_config_unchanged(run_dir, config_changes(old, cfg, _RESUME_FREE), ConfigError)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / CONFIG_FILE)


def train_formal(
    cfg: FormalConfig,
    run_dir: str | Path,
    *,
    task_factory: Callable[[FormalConfig], Task] = formal_task,
    solve_check: SolveCheck | None = None,
    stop_at: int | None = None,
    device: str | torch.device = "cpu",
    stop: Callable[[], bool] | None = None,
) -> Path | None:
    """Train `cfg` in `run_dir` (resuming from ``ckpt.pt`` if present) and return the path of ``model.pt``.

    With `stop_at` < train.steps, training stops after step `stop_at`, writes ``ckpt.pt`` and returns None (no
    ``model.pt``): a long run trained in slices, e.g. stop_at = 1000, 2000, … for several seeds in turn. The learning
    rate is constant and the data and RNG states are checkpointed, so the slices equal one uninterrupted run (tested).

    With `solve_check`, the held-out score is logged to ``time_to_solve.jsonl`` every ``solve_check.every`` steps and
    model.pt's meta records ``solved_step`` / ``solved_seconds`` (the first check >= the threshold; None if none).

    `device`: where the model trains (module docstring); `stop`: asked after every step, True → checkpoint and
    return None (a preempted SLURM task).

    `task_factory` builds the task from the config (tests pass a wrapper to simulate a crash mid-run).
    """
    run_dir = Path(run_dir)
    if stop_at is not None and stop_at < 1:
        raise ConfigError(f"stop_at: {stop_at} is not allowed; expected a step >= 1")
    task = task_factory(cfg)
    model_path = run_dir / MODEL_FILE
    _prepare_run_dir(cfg, run_dir)
    if model_path.is_file():
        return model_path

    tc = cfg.train
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed_stream(tc.seed, _INIT_STREAM))
        model = build_model(cfg.model)  # initialised on the CPU: the same weights on every device
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=tc.lr, betas=(tc.beta1, tc.beta2), eps=tc.eps,
                                 weight_decay=tc.weight_decay)
    data_gen = torch.Generator().manual_seed(seed_stream(tc.seed, _DATA_STREAM))
    torch_rng = torch.Generator().manual_seed(seed_stream(tc.seed, _TORCH_STREAM)).get_state()
    cuda_rng = _seeded_cuda_rng(device, seed_stream(tc.seed, _TORCH_STREAM))
    step, seconds, cpu_seconds, bad_steps = 0, 0.0, 0.0, 0
    kept = KeptModel(cfg, task) if cfg.eval.select_last > 1 else None  # None: the last model is kept
    state = load_ckpt(run_dir, _CKPT_KEYS)
    if state is not None:
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise CheckpointError(f"{run_dir}: the checkpoint does not fit the configured model "
                                  f"({type(err).__name__}: {str(err)[:200]})") from None
        data_gen.set_state(state["data_rng"])
        torch_rng = state["torch_rng"]
        step, seconds, bad_steps = state["step"], state["seconds"], state["bad_steps"]
        cpu_seconds = state.get("cpu_seconds", 0.0)
        if cuda_rng is not None and state.get("cuda_rng") is not None:
            cuda_rng = state["cuda_rng"]
        if kept is not None:
            kept.load_state(state.get("kept"), str(run_dir / CKPT_FILE))
    truncate_after(run_dir / SOLVE_FILE, step)
    solved = next((row for row in read_jsonl(run_dir / SOLVE_FILE)
                   if solve_check and row["score"] >= solve_check.threshold), None) if solve_check else None

    def checkpoint() -> None:
        save_ckpt(run_dir, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "config": raw_config,
                               "data_rng": data_gen.get_state(), "torch_rng": torch.get_rng_state(),
                               "step": step, "seconds": seconds, "cpu_seconds": cpu_seconds,
                               "bad_steps": bad_steps, "kept": kept and kept.state(),
                               "cuda_rng": torch.cuda.get_rng_state(device) if cuda_rng is not None else None})

    raw_config = config_to_dict(cfg)  # in every checkpoint, should config.resolved.json be lost
    model.train()
    lengths = cfg.data.max_length - cfg.data.min_length + 1
    end = tc.steps if stop_at is None else min(stop_at, tc.steps)
    bar = tqdm(total=end, initial=min(step, end), desc=f"{cfg.data.task}/{cfg.model.architecture}",
               disable=not cfg.logging.progress, dynamic_ncols=True, unit="step")
    forked = [device] if cuda_rng is not None else []
    with torch.random.fork_rng(devices=forked), open_for_append(run_dir / METRICS_FILE, step) as metrics:
        torch.set_rng_state(torch_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)
        while step < end:
            start, cpu_start = time.perf_counter(), time.process_time()
            length = cfg.data.min_length + int(torch.randint(lengths, (1,), generator=data_gen))
            inputs, labels = task.sample(tc.batch_size, length, data_gen)  # (B, T), (B,) on the CPU
            inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            logits = model(inputs)  # (B, num_classes)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            finite = math.isfinite(loss.item())
            if finite:
                loss.backward()
                norm = (nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip) if tc.grad_clip > 0
                        else nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
                finite = math.isfinite(float(norm))
                if finite:
                    optimizer.step()
            if not finite:
                bad_steps += 1
                if bad_steps > tc.max_bad_steps:
                    raise TrainError(f"{run_dir}: step {step + 1}: {bad_steps} steps skipped for a non-finite loss or "
                                     f"gradient, more than train.max_bad_steps={tc.max_bad_steps}; stopped (the last "
                                     f"checkpoint, {CKPT_FILE}, is kept). Lower train.lr and rerun to resume")
                bar.write(f"warning: step {step + 1}: non-finite loss or gradient; step skipped, weights unchanged "
                          f"({bad_steps}/{tc.max_bad_steps} allowed)", file=sys.stderr)
            step += 1
            seconds += time.perf_counter() - start
            cpu_seconds += time.process_time() - cpu_start
            acc = (logits.argmax(dim=-1) == labels).float().mean().item()
            bar.update(1)
            if step % tc.log_every == 0 or step == tc.steps:
                row = {"step": step, "loss": loss.item(), "acc": acc, "lr": tc.lr, "length": length,
                       "seconds": round(seconds, 3)}
                metrics.write(json.dumps(row) + "\n")
                metrics.flush()
                bar.set_postfix(loss=f"{loss.item():.4f}", acc=f"{acc:.3f}")
            if solve_check and step % solve_check.every == 0:
                score, check_loss = held_out_grades(model, task, solve_check.lengths, solve_check.samples)
                row = {"step": step, "seconds": round(seconds, 3), "cpu_seconds": round(cpu_seconds, 3), "score": score,
                       "loss": check_loss, "lengths": solve_check.span}
                with (run_dir / SOLVE_FILE).open("a") as handle:
                    handle.write(json.dumps(row) + "\n")
                if solved is None and score >= solve_check.threshold:
                    solved = row
                    bar.write(f"solved: check score {score:.3f} (lengths {solve_check.span[0]}..{solve_check.span[1]}) "
                              f"at step {step} after {seconds:.1f} s of training")
            if kept is not None:
                kept.observe(step, model)
            stopping = stop is not None and step < end and stop()
            if (tc.save_every and step % tc.save_every == 0) or step == end or stopping:
                checkpoint()
            if stopping:
                bar.write(f"stop requested: checkpoint at step {step} of {tc.steps} written in {run_dir}")
                break
    bar.close()
    if step < tc.steps:
        return None
    # code_commit: the code that trained the run (its last slice); the recipe hash covers the config, not the code
    meta: dict[str, Any] = {"step": step, "train_seconds": round(seconds, 3), "bad_steps": bad_steps,
                            "task": cfg.data.task, "code_commit": git_commit()}
    if kept is not None:  # ckpt.pt keeps the last step's weights (resume, extension); model.pt the kept ones
        meta.update(kept.keep(model))
    if solve_check:
        meta.update(solved_step=solved and solved["step"], solved_seconds=solved and solved["seconds"],
                    solved_cpu_seconds=solved and solved.get("cpu_seconds"))
    save_model_file(model_path, cfg, model, meta=meta)
    return model_path
