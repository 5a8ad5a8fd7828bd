"""Resuming a run on another number of processes: the global batch is kept by changing ``train.grad_accum``, and the
checkpoint's partitioned state is re-cut through DeepSpeed's universal checkpoint.

A run's **global batch** (sequences per optimizer step) is fixed for its whole life::

    global = train.batch_size × train.grad_accum × processes          (recorded in every trainer_state.json)

A resume on W processes therefore trains with ``grad_accum = global / (batch_size × W)``, which must be a whole
number ≥ 1; otherwise the resume is refused before anything is written, with the numbers. Example: a run of
batch_size 4, grad_accum 1 on 2 processes (global 8) resumes on 1 process with grad_accum 2; on 4 processes it is
refused (8 / (4 × 4) = 0.5), as is 3 processes (8 / 12).

The state: ZeRO-0 fp32 checkpoints hold the whole model and optimizer in one file and load as they are. Every other
checkpoint (ZeRO 1–3, and bf16, whose optimizer partitions its fp32 master weights) is converted by rank 0 into
DeepSpeed's universal format — one folder per parameter with its fp32 value and Adam moments — at
``RUN/universal/global_step<N>/`` (written under a temporary name and renamed; reused by a resume that is stopped
before its first checkpoint, deleted after it), which the engine then loads with ``checkpoint.load_universal`` for the
new partitioning.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
from pathlib import Path
from typing import Any

from regulargpt.config import Config
from regulargpt.errors import TrainError
from regulargpt.run_directory.checkpoints import LATEST, checkpoint_steps, latest_step, read_trainer_state
from regulargpt.run_directory.config_check import saved_config
from regulargpt.run_directory.safe_load import safe_loading

__all__ = ["UNIVERSAL_DIR", "global_batch", "run_global_batch", "grad_accum_for", "needs_universal",
           "to_universal", "drop_universal", "trainer_state_fields"]

UNIVERSAL_DIR = "universal"


def global_batch(batch_size: int, grad_accum: int, world_size: int) -> int:
    """Sequences per optimizer step: ``batch_size × grad_accum × world_size``."""
    return batch_size * grad_accum * world_size


def run_global_batch(run_dir: Path) -> tuple[int, int, int] | None:
    """(global batch, the world size and step of the checkpoint it was read from) for a run a resume continues; None
    for a fresh one (no ``latest``: folders without it are interrupted saves) or without a readable checkpoint. Read
    from the newest checkpoint up to ``latest`` whose ``trainer_state.json`` reads (every checkpoint of a run has the
    same global batch); one written before the field existed takes ``grad_accum`` from the saved config (such runs
    never changed it)."""
    if not (run_dir / LATEST).is_file():
        return None
    try:
        newest = latest_step(run_dir)
    except TrainError:  # `latest` names no folder: resume_step falls back to the sealed ones
        newest = None
    older = sorted((s for s in checkpoint_steps(run_dir) if newest is None or s < newest), reverse=True)
    for step in ([newest] if newest is not None else []) + older:
        try:
            state = read_trainer_state(run_dir, step)
        except TrainError:
            continue
        world = int(state["world_size"])
        if "global_batch" in state:
            return int(state["global_batch"]), world, step
        saved = saved_config(run_dir, TrainError)
        if saved is not None:
            return global_batch(saved.train.batch_size, saved.train.grad_accum, world), world, step
    return None


def grad_accum_for(run_dir: Path, cfg: Config, world_size: int) -> tuple[int, str | None]:
    """The ``train.grad_accum`` that keeps the run's global batch on `world_size` processes → (grad_accum, a note
    when it differs from the config's, else None). A new run keeps its config's. TrainError, before anything is
    written, when ``global / (batch_size × world_size)`` is not a whole number ≥ 1."""
    t = cfg.train
    found = run_global_batch(run_dir)
    if found is None:
        return t.grad_accum, None
    total, old_world, step = found
    per_step = t.batch_size * world_size
    if total % per_step:
        fits = [w for w in range(1, total // t.batch_size + 1) if (total // t.batch_size) % w == 0]
        raise TrainError(f"{run_dir}: the run's global batch is {total} sequences per step (global_step{step} was "
                         f"written by {old_world} process(es)); {world_size} processes with train.batch_size "
                         f"{t.batch_size} would need train.grad_accum = {total} / ({t.batch_size} × {world_size}) = "
                         f"{total / per_step:.3g}, not a whole number ≥ 1. Resume with a number of processes that "
                         f"divides {total // t.batch_size} ({', '.join(map(str, fits[:8]))}), or start a new "
                         f"--run-dir")
    accum = total // per_step
    if accum == t.grad_accum:
        return accum, None
    return accum, (f"{run_dir}: train.grad_accum {t.grad_accum} → {accum} to keep the run's global batch of {total} "
                   f"sequences ({t.batch_size} per micro-batch × {accum} × {world_size} process(es); global_step"
                   f"{step} was written by {old_world})")


def needs_universal(run_dir: Path, step: int) -> bool:
    """True when global_step<step> holds partitioned optimizer state (``*optim_states.pt``: ZeRO 1–3, bf16), which
    only a universal checkpoint can load on another number of processes; ZeRO-0 fp32 loads as it is."""
    return any((run_dir / f"global_step{step}").glob("*optim_states.pt"))


def to_universal(run_dir: Path, step: int) -> Path:
    """Convert global_step<step> into ``RUN/universal/global_step<step>`` (rank 0; once: an existing conversion is
    reused) with DeepSpeed's ``ds_to_universal``, under :func:`safe_loading` → the universal folder's parent, the
    ``load_dir`` to hand to ``engine.load_checkpoint`` with ``tag=f"global_step{step}"``."""
    from deepspeed.checkpoint import ds_to_universal

    root = run_dir / UNIVERSAL_DIR
    final = root / f"global_step{step}"
    if final.is_dir():
        return root
    tmp = root / f".tmp-global_step{step}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    args = argparse.Namespace(input_folder=str(run_dir / f"global_step{step}"), output_folder=str(tmp),
                              num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)  # the version record our client state lacks
    try:
        with safe_loading(), contextlib.redirect_stdout(io.StringIO()):  # its progress lines: not ours to print
            ds_to_universal.main(args)
    except (RuntimeError, KeyError, ValueError, OSError, AssertionError) as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TrainError(f"{run_dir}/global_step{step}: DeepSpeed could not convert this checkpoint to its universal "
                         f"format for a resume on another number of processes ({type(err).__name__}: "
                         f"{str(err)[:300]}); resume with the number of processes that wrote it") from None
    (root / "latest_universal").unlink(missing_ok=True)  # written by ds_to_universal; we always pass the tag
    os.replace(tmp, final)
    return root


def drop_universal(run_dir: Path) -> None:
    """Delete ``RUN/universal/`` (rank 0, once a checkpoint of the new partitioning is sealed: it is derived data,
    about three times the fp32 model's size)."""
    shutil.rmtree(run_dir / UNIVERSAL_DIR, ignore_errors=True)


def trainer_state_fields(batch_size: int, grad_accum: int, world_size: int) -> dict[str, Any]:
    """What trainer_state.json records about the batch: ``{"grad_accum", "global_batch"}``."""
    return {"grad_accum": grad_accum, "global_batch": global_batch(batch_size, grad_accum, world_size)}
