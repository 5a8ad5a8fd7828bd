"""Which weights an evaluation or a generation uses: the step and sha256 of a model file, and whether its run has
newer weights than it.

A run directory's ``model.pt`` is a copy of one checkpoint (``launch/export.py``, or the trainer when it finishes).
When the run goes on (resumed, or stopped again before its end) its newest checkpoint (``latest``) passes the
exported step and ``model.pt`` is stale. The policy, for ``eval/extrapolate.py`` and ``launch/generate.py`` alike:

- a **run directory** whose ``model.pt`` is older than the run's newest checkpoint is refused
  (:class:`StaleModelError`), naming both steps, the export command that refreshes it and the file path that uses
  the older weights deliberately. Refused rather than re-exported or consolidated on the fly: the run may still be
  training into that folder, a ZeRO-3 consolidation takes minutes and a full copy of the weights in memory, and a
  command that scores weights other than the ones on disk would make ``results.jsonl`` irreproducible;
- a **model file** given by path (``runs/x/model.pt``, ``runs/x/model_step65.pt``) is used as named, with a note
  on stderr when its run directory holds a newer checkpoint;
- every result row records ``step`` and ``weights_sha256`` (:func:`weights_sha256`), so a row can always be traced
  to the weights it scored, and a sweep rescores a row whose weights have changed since.

Example: a run exported at step 65 and resumed to a checkpoint at step 96::

    check_fresh(Path("runs/x"), Path("runs/x/model.pt"), {"step": 65})        # StaleModelError
    check_fresh(Path("runs/x/model.pt"), Path("runs/x/model.pt"), {"step": 65})
    # → "note: runs/x/model.pt holds the weights of step 65; the run's newest checkpoint is step 96 …"
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from regulargpt.errors import TrainError, UserError
from regulargpt.run_directory.checkpoints import latest_step

__all__ = ["StaleModelError", "check_fresh", "weights_sha256"]


class StaleModelError(UserError, ValueError):
    """A run directory's model.pt holds older weights than the run's newest checkpoint."""


def weights_sha256(state_dict: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the parameters and buffers: for each name in sorted order, the name, dtype, shape and raw bytes.

    Independent of the file it was read from (its config, meta and pickling), so a re-export of the same checkpoint
    has the same hash and any changed weight a different one."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().to("cpu").contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _newest_step(run_dir: Path) -> int | None:
    try:
        return latest_step(run_dir)
    except TrainError:  # a `latest` naming a missing folder: nothing newer that could be scored
        return None


def check_fresh(given: Path, model_path: Path, meta: Mapping[str, Any]) -> str | None:
    """Apply the module's policy to `model_path` (read from `given`, a run directory or the file itself) whose meta
    is `meta` → a note to print when a model file was named although its run has a newer checkpoint, else None.

    StaleModelError when `given` is a run directory whose model.pt is older than its newest checkpoint."""
    step = meta.get("step")
    newest = _newest_step(model_path.parent)
    if not isinstance(step, int) or newest is None or newest <= step:
        return None
    if given.is_dir():
        raise StaleModelError(
            f"{model_path} holds the weights of step {step}, but the run's newest checkpoint is step {newest}; "
            f"export the newest with `python launch/export.py {given}` (or name the file, "
            f"{model_path}, to use the step-{step} weights deliberately)")
    return (f"note: {model_path} holds the weights of step {step}; the run's newest checkpoint is step {newest} "
            f"(`python launch/export.py {model_path.parent}` exports it)")
