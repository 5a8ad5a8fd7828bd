"""The formal trainer's checkpoint: one file, ``ckpt.pt``, and the one before it, ``ckpt.prev.pt``.

Layout inside the run directory (file names in :mod:`regulargpt.run_directory.layout`)::

    ckpt.pt          a dict saved with torch.save (the trainer's keys: model, optimizer, step, RNG states, …)
    ckpt.prev.pt     the checkpoint before it: each save renames ckpt.pt to this, then writes ckpt.pt atomically

Rotation keeps exactly one older checkpoint (:func:`save_ckpt`); a crash between the two renames leaves
``ckpt.prev.pt`` and no ``ckpt.pt``, never a partial file. Resume (:func:`load_ckpt`) takes ``ckpt.pt``; one that
cannot be read (truncated, overwritten) is set aside as ``ckpt.pt.corrupt`` and ``ckpt.prev.pt`` used, with a
warning naming both (the rule of :mod:`regulargpt.run_directory.fallback`).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from regulargpt.checkpoint import CheckpointError
from regulargpt.files import atomic_write_bytes
from regulargpt.write_errors import explain_write_error
from regulargpt.run_directory.layout import CKPT_FILE, METRICS_FILE, PREV_CKPT_FILE
from regulargpt.run_directory.fallback import fallback_warning, set_aside

__all__ = ["save_ckpt", "load_ckpt"]


def save_ckpt(run_dir: Path, state: dict[str, Any]) -> None:
    """Write ckpt.pt atomically, keeping the one it replaces as ckpt.prev.pt."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with explain_write_error(run_dir / CKPT_FILE, "the checkpoint", len(buffer.getvalue())):
        atomic_write_bytes(run_dir / CKPT_FILE, buffer.getvalue(), previous=run_dir / PREV_CKPT_FILE)


def _read(path: Path, required: Iterable[str]) -> tuple[dict[str, Any] | None, str]:
    """→ (the state in `path`, '') or (None, why it is unusable)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated zip, garbage, ...: any failure to read means the file is unusable
        return None, f"unreadable ({type(err).__name__})"
    keys = tuple(required)
    if not isinstance(state, dict) or any(key not in state for key in keys):
        return None, f"not a formal-training checkpoint (expected keys {', '.join(keys)})"
    return state, ""


def ckpt_config(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """(file, resolved config) from ckpt.pt, else ckpt.prev.pt, when it carries one (``"config"``: saved since
    #37); None otherwise. For a run whose config.resolved.json is lost (the formal trainer's _prepare_run_dir)."""
    for path in (run_dir / CKPT_FILE, run_dir / PREV_CKPT_FILE):
        state = _read(path, ())[0] if path.is_file() else None
        if state is not None and isinstance(state.get("config"), dict):
            return path, state["config"]
    return None


def load_ckpt(run_dir: Path, required: Iterable[str]) -> dict[str, Any] | None:
    """The state to resume from: ckpt.pt, else ckpt.prev.pt (warning on stderr naming both); None for a fresh run.
    A file that cannot be loaded, or lacks a key of `required`, is unusable.

    An unreadable ckpt.pt is set aside as ckpt.pt.corrupt, so that the next save does not rotate it over the good
    ckpt.prev.pt. CheckpointError when checkpoint files exist but none can be read.
    """
    newest, previous = run_dir / CKPT_FILE, run_dir / PREV_CKPT_FILE
    problems: list[tuple[Path, str]] = []
    for path in (newest, previous):
        if not path.is_file():
            continue
        state, reason = _read(path, required)
        if state is None:
            problems.append((path, reason))
            continue
        if path == previous and newest.is_file():
            chosen = f"{previous} (step {state['step']})"
            print(f"warning: {fallback_warning(newest, problems[0][1], set_aside(newest), chosen)}", file=sys.stderr,
                  flush=True)
        return state
    if problems:
        listed = "; ".join(f"{path}: {reason}" for path, reason in problems)
        raise CheckpointError(f"no readable checkpoint in {run_dir}: {listed}; delete them (and {METRICS_FILE}) to "
                              f"train from scratch, or use another --run-dir")
    return None
