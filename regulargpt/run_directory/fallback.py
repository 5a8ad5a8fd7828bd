"""Falling back from a corrupt checkpoint: one rule for both trainers' checkpoint layouts.

When the checkpoint a run would resume from fails its check (the language-model trainer's ``global_step<N>/``
against ``checksums.json``, the formal trainer's ``ckpt.pt`` by loading it), the run resumes from the newest older
checkpoint that passes. The failed one is kept for inspection under ``<name>.corrupt`` (``.corrupt1``, ``.corrupt2``
if that is taken), a name neither trainer reads, so the next save cannot rotate it over the good one, and one warning
names both checkpoints::

    checkpoint runs/a/global_step9 is corrupt: model_states.pt does not match its sha256 in checksums.json
    (kept as global_step9.corrupt); resuming from global_step6 instead, the newest intact one
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["set_aside", "fallback_warning"]


def set_aside(path: Path, suffix: str = "corrupt") -> Path:
    """Rename a corrupt checkpoint file or folder to the first free ``<name>.corrupt[N]`` → the new path (``suffix``
    "diverged": a checkpoint saved after a run diverged, regulargpt.train.divergence)."""
    base = path.with_name(f"{path.name}.{suffix}")
    target, n = base, 1
    while target.exists():
        target, n = base.with_name(f"{base.name}{n}"), n + 1
    os.replace(path, target)
    return target


def fallback_warning(bad: Path, reason: str, kept: Path | None, chosen: str) -> str:
    """The warning for resuming from `chosen` because `bad` failed its check for `reason` (kept as `kept`)."""
    aside = f" (kept as {kept.name})" if kept is not None else ""
    return f"checkpoint {bad} is corrupt: {reason}{aside}; resuming from {chosen} instead, the newest intact one"
