"""The language-model trainer's checkpoints: DeepSpeed ``global_step<N>/`` folders, ``latest``, checksums, resume
with fallback, keep-last-k, and each rank's RNG state.

Layout inside the run directory::

    global_step100/               DeepSpeed checkpoint of step 100 (files depend on the ZeRO stage) plus
      trainer_state.json            step, tokens, world size, sampler state, data fingerprint, parameter names
      rng_rank<r>.pt                each rank's python / numpy / torch RNG states
      checksums.json                size + sha256 of every other file: the completion marker, written last
    global_step200/
    latest                        "global_step200": written after checksums.json, atomically

Save order: every rank writes its files → barrier → rank 0 fsyncs and hashes them into ``checksums.json``
(:func:`write_checksums`) → ``latest`` (:func:`mark_latest`) → older checkpoints beyond ``keep_last`` are deleted
(:func:`prune_checkpoints`). A checkpoint counts once ``latest`` names it: a run killed while saving resumes from the
previous one, and the partial folder is removed on resume. A checkpoint that fails its checksums later (truncated,
overwritten, a missing file) is set aside and the older intact checkpoint used instead, with a warning naming both
(:func:`resume_step`, the rule of :mod:`regulargpt.run_directory.fallback`).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.files import atomic_write, atomic_write_text, read_json_object, sha256_file
from regulargpt.errors import TrainError
from regulargpt.run_directory.fallback import fallback_warning, set_aside
from regulargpt.run_directory.safe_load import safe_loading

__all__ = [
    "checkpoint_steps",
    "latest_step",
    "write_trainer_state",
    "read_trainer_state",
    "checkpoint_config",
    "checkpoint_bytes",
    "write_checksums",
    "verify_checkpoint",
    "resume_step",
    "mark_latest",
    "prune_checkpoints",
    "remove_partial_checkpoints",
    "rng_state",
    "save_rng",
    "load_rng",
]

LATEST, TRAINER_STATE, CHECKSUMS = "latest", "trainer_state.json", "checksums.json"
_TAG = re.compile(r"^global_step(\d+)$")


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of all ``global_step<N>`` folders (complete or not), ascending."""
    if not run_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in run_dir.iterdir() if p.is_dir() and (m := _TAG.match(p.name)))


def latest_step(run_dir: Path) -> int | None:
    """The step ``latest`` names, or None for a fresh run directory."""
    path = run_dir / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    m = _TAG.match(tag)
    if not m or not (run_dir / tag).is_dir():
        raise TrainError(f"{path}: names {tag!r}, which is not a checkpoint folder in {run_dir}")
    return int(m.group(1))


def write_trainer_state(run_dir: Path, step: int, state: dict[str, Any]) -> None:
    """Write global_step<step>/trainer_state.json (rank 0): our side of the checkpoint, atomically."""
    text = json.dumps(state, indent=2, sort_keys=True) + "\n"
    atomic_write_text(run_dir / f"global_step{step}" / TRAINER_STATE, text)


def read_trainer_state(run_dir: Path, step: int) -> dict[str, Any]:
    """global_step<step>/trainer_state.json; TrainError naming the file when it is missing or not a JSON object."""
    path = run_dir / f"global_step{step}" / TRAINER_STATE
    if not path.is_file():
        raise TrainError(f"{path}: missing; not a checkpoint written by regulargpt")
    return read_json_object(path, TrainError, "the checkpoint is corrupt")


def checkpoint_config(run_dir: Path) -> tuple[int, dict[str, Any]] | None:
    """(step, resolved config) from the newest checkpoint whose ``trainer_state.json`` carries one (``"config"``:
    written since #37; older checkpoints have none) → None when no checkpoint does. The one ``latest`` names is
    tried first, then the other folders, newest first; unreadable ones are passed over."""
    try:
        newest = latest_step(run_dir)
    except TrainError:
        newest = None
    for step in dict.fromkeys([*([newest] if newest is not None else []), *reversed(checkpoint_steps(run_dir))]):
        try:
            config = read_trainer_state(run_dir, step).get("config")
        except TrainError:
            continue
        if isinstance(config, dict):
            return step, config
    return None


def checkpoint_bytes(run_dir: Path) -> int | None:
    """Bytes of the checkpoint ``latest`` names (what the next one needs, for a disk-full message); None without."""
    try:
        step = latest_step(run_dir)
    except TrainError:
        return None
    if step is None:
        return None
    return sum(p.stat().st_size for p in (run_dir / f"global_step{step}").rglob("*") if p.is_file())


def write_checksums(run_dir: Path, step: int) -> None:
    """Seal global_step<step>/ (rank 0, after every rank has written its files): fsync each file and record its size
    and sha256 in ``checksums.json``, atomically. Costs one read of the checkpoint (about 1 s per GB)."""
    folder = run_dir / f"global_step{step}"
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # DeepSpeed's torch.save does not; the data must be on disk before the marker is
        finally:
            os.close(fd)
        files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    atomic_write_text(folder / CHECKSUMS, json.dumps({"step": step, "files": files}, indent=1, sort_keys=True) + "\n")


def verify_checkpoint(run_dir: Path, step: int, legacy_ok: bool = True) -> str:
    """'' when global_step<step>/ is intact, else the reason: a missing folder or file, a size or sha256 that
    differs from ``checksums.json``, an unreadable ``trainer_state.json``.

    A folder without ``checksums.json`` was written before checksums existed: accepted (``legacy_ok``) when its
    trainer state reads, since ``latest`` already guaranteed it complete.
    """
    folder = run_dir / f"global_step{step}"
    if not folder.is_dir():
        return "the folder is missing"
    marker = folder / CHECKSUMS
    if marker.is_file():
        try:
            listed = read_json_object(marker)["files"]
            expected = {name: (int(info["bytes"]), str(info["sha256"])) for name, info in listed.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{CHECKSUMS} is unreadable"
        for name, (size, digest) in sorted(expected.items()):
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {CHECKSUMS} says {size}"
            if sha256_file(path) != digest:
                return f"{name} does not match its sha256 in {CHECKSUMS}"
    elif not legacy_ok:
        return f"no {CHECKSUMS} (an interrupted save)"
    try:
        read_trainer_state(run_dir, step)
    except TrainError:
        return f"{TRAINER_STATE} is missing or unreadable"
    return ""


def resume_step(run_dir: Path) -> tuple[int | None, list[str]]:
    """The checkpoint a restarted run resumes from → (step or None for a fresh run, warnings). Rank 0 only.

    Normally the one ``latest`` names; folders newer than it (interrupted saves) are deleted. If it fails
    :func:`verify_checkpoint`, the newest older checkpoint that passes is used: every failed folder is renamed
    ``global_step<N>.corrupt`` (:func:`~regulargpt.run_directory.fallback.set_aside`) and ``latest``
    rewritten, and a warning names both checkpoints. Without any intact checkpoint: TrainError listing what is wrong
    with each (nothing is renamed then).
    """
    path = run_dir / LATEST
    if not path.is_file():
        return None, []
    m = _TAG.match(path.read_text().strip())
    named = int(m.group(1)) if m else None  # an unreadable `latest`: only sealed folders can be trusted
    if named is not None:
        remove_partial_checkpoints(run_dir, named)
    for leftover in run_dir.glob(".deleting-global_step*"):  # a prune killed half-way
        shutil.rmtree(leftover, ignore_errors=True)
    failed: list[tuple[int, str]] = []
    if named is not None and not (run_dir / f"global_step{named}").is_dir():
        failed.append((named, "the folder is missing"))
    chosen = None
    for step in sorted((s for s in checkpoint_steps(run_dir) if named is None or s <= named), reverse=True):
        reason = verify_checkpoint(run_dir, step, legacy_ok=named is not None)
        if not reason:
            chosen = step
            break
        failed.append((step, reason))
    problems = "; ".join(f"global_step{s}: {why}" for s, why in failed) or "no checkpoint folder"
    if chosen is None:
        raise TrainError(f"{run_dir}: no intact checkpoint to resume from ({problems}); move the run directory "
                         f"away (or delete its global_step* folders and 'latest') to start again")
    warnings = []
    for step, reason in failed:
        folder = run_dir / f"global_step{step}"
        kept = set_aside(folder) if folder.is_dir() else None
        warnings.append(fallback_warning(folder, reason, kept, f"global_step{chosen}"))
    if failed or named is None:
        mark_latest(run_dir, chosen)
    return chosen, warnings


def mark_latest(run_dir: Path, step: int) -> None:
    """Make global_step<step> the checkpoint a resume starts from (atomic rename)."""
    atomic_write_text(run_dir / LATEST, f"global_step{step}")


def _delete_checkpoint(run_dir: Path, step: int) -> None:
    """Rename first (atomic), then delete: a half-deleted folder never looks like a checkpoint."""
    doomed = run_dir / f".deleting-global_step{step}"
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(run_dir / f"global_step{step}", doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def prune_checkpoints(run_dir: Path, keep: int, protect: int | None = None) -> list[int]:
    """Delete complete checkpoints older than the newest `keep` (never the latest, never newer ones, never
    `protect`: the newest one known good while newer ones are unverified, regulargpt.train.divergence); → deleted."""
    last = latest_step(run_dir)
    if last is None:
        return []
    complete = [s for s in checkpoint_steps(run_dir) if s <= last]
    doomed = [s for s in complete[:-keep] if s != protect] if keep > 0 else []
    for s in doomed:
        _delete_checkpoint(run_dir, s)
    return doomed


def remove_partial_checkpoints(run_dir: Path, last: int | None = None) -> list[int]:
    """On resume: delete checkpoint folders newer than ``latest`` (or `last`): saves that were interrupted."""
    last = latest_step(run_dir) if last is None else last
    partial = [s for s in checkpoint_steps(run_dir) if last is None or s > last]
    for s in partial:
        _delete_checkpoint(run_dir, s)
    return partial


# ------------------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch (and CUDA, when present) RNG states."""
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_rng(run_dir: Path, step: int, rank: int) -> None:
    """Write :func:`rng_state` to global_step<step>/rng_rank<rank>.pt, atomically (every rank its own)."""
    atomic_write(run_dir / f"global_step{step}" / f"rng_rank{rank}.pt", lambda f: torch.save(rng_state(), f))


def load_rng(run_dir: Path, step: int, rank: int) -> None:
    """Restore this rank's RNG states from global_step<step>/rng_rank<rank>.pt (loaded with weights_only=True)."""
    path = run_dir / f"global_step{step}" / f"rng_rank{rank}.pt"
    if not path.is_file():
        raise TrainError(f"{path}: missing (was the run saved with another number of processes?)")
    with safe_loading():
        state = torch.load(path, weights_only=True)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
