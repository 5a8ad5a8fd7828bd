"""The language-model trainer's resume policy: where a run goes, which config changes a resume accepts, and
extending a finished run to more steps (``--extend-to``).

A run directory that holds ``config.resolved.json`` is resumed by the same command; the config must be the same
except for the :data:`RESUME_FREE` keys (compared by :mod:`regulargpt.run_directory.config_check`). The one
other accepted change is an extension: ``train.steps`` raised and the finished run's step appended to
``train.extended_from`` (:func:`extension_config`), after which the finished run's ``model.pt`` is kept as
``model_step<N>.pt`` (:func:`set_aside_export`). Resuming and extending read the data folder from the run
(:func:`with_saved_data_path`), so the command need not repeat ``--set data.path=…``.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from regulargpt.config import Config, save_config
from regulargpt.run_directory.layout import CONFIG_FILE, MODEL_FILE
from regulargpt.errors import TrainError
from regulargpt.run_directory.checkpoints import latest_step
from regulargpt.run_directory.config_check import (
    ResumePolicy,
    check_config_unchanged,
    config_changes,
    saved_config,
)

__all__ = ["RESUME_FREE_KEYS", "RESUME_FREE", "default_run_dir", "check_or_write_config", "extension_config",
           "set_aside_export", "with_saved_data_path"]

# Keys that may change between a run and its resumption: they do not change what is trained.
RESUME_FREE_KEYS = frozenset({
    "data.path",  # the data may move (e.g. to node-local disk); its fingerprint is compared instead
    "data.verify",  # how the data is checked at start, not what it is
    "train.log_every", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep_last",
    "train.max_bad_steps", "train.activation_checkpointing", "train.dist_timeout_s", "train.compile",
    "train.grad_accum",  # derived on resume from the run's global batch and the number of processes (world_change)
})
RESUME_FREE = ResumePolicy(keys=RESUME_FREE_KEYS, sections=("eval", "logging"))
_EXTENSION_KEYS = {"train.steps", "train.extended_from"}


def default_run_dir(config_path: str | Path, seed: int) -> Path:
    """``runs/<config stem>-seed<seed>``, e.g. ``runs/regular_gpt-seed0`` for configs/tiny/regular_gpt.json."""
    return Path("runs") / f"{Path(config_path).stem}-seed{seed}"


def check_or_write_config(run_dir: Path, cfg: Config, write: bool = True) -> int | None:
    """Write config.resolved.json for a new run; for an existing one, fail clearly on any training-relevant change.
    → the step the run is being extended from when `cfg` is its :func:`extension_config` (else None).

    Every rank may check; only the one with ``write=True`` writes.
    """
    path = run_dir / CONFIG_FILE
    old = saved_config(run_dir, TrainError)
    if old is None:
        if write:
            save_config(cfg, path)
        return None
    changes = config_changes(old, cfg, RESUME_FREE)
    extending = (set(changes) <= _EXTENSION_KEYS and cfg.train.steps > old.train.steps
                 and cfg.train.extended_from == [*old.train.extended_from, old.train.steps]
                 and latest_step(run_dir) == old.train.steps)
    if not extending:
        hint = (f"; to continue the finished run to more steps pass --extend-to N (it has {old.train.steps})"
                if "train.steps" in changes else "")
        check_config_unchanged(run_dir, changes, TrainError, hint)
    if write:
        save_config(cfg, path)  # record the current values of the resume-free keys (and of an extension)
    return old.train.steps if extending else None


def extension_config(run_dir: Path, cfg: Config, steps: int) -> Config:
    """`cfg` continued to `steps` optimizer steps (``--extend-to``): ``train.steps`` raised to `steps` and the step
    the finished run had reached appended to ``train.extended_from``, where the LR schedule is re-planned
    (:func:`regulargpt.train.engine.lr_factor`). A run already extended to `steps` keeps its extension (rerunning
    the command resumes it). TrainError for a run that does not exist, has not finished, or already has as many
    steps.
    """
    saved_cfg = saved_config(run_dir, TrainError)
    if saved_cfg is None:
        raise TrainError(f"--extend-to {steps}: {run_dir} holds no run to extend (no {CONFIG_FILE}); train it first")
    saved = saved_cfg.train
    if steps == saved.steps and saved.extended_from:
        extended_from = saved.extended_from
    elif steps <= saved.steps:
        raise TrainError(f"--extend-to {steps}: the run in {run_dir} already has train.steps={saved.steps}; "
                         f"pass a larger number of steps")
    elif latest_step(run_dir) != saved.steps:
        raise TrainError(f"--extend-to {steps}: the run in {run_dir} is at step {latest_step(run_dir) or 0} of "
                         f"{saved.steps}; let it finish first (rerun it without --extend-to), then extend it")
    else:
        extended_from = [*saved.extended_from, saved.steps]
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=steps, extended_from=extended_from))


def set_aside_export(run_dir: Path, step: int) -> Path | None:
    """An extension starts: the finished run's model.pt → model_step<step>.pt (a model.pt means "finished" to
    launch/submit.py and the sbatch script's requeue). → the new path, or None without a model.pt."""
    path = run_dir / MODEL_FILE
    if not path.is_file():
        return None
    os.replace(path, run_dir / f"model_step{step}.pt")
    return run_dir / f"model_step{step}.pt"


def with_saved_data_path(run_dir: Path, cfg: Config, overrides: list[str]) -> tuple[Config, str | None]:
    """`cfg` for resuming or extending the run in `run_dir`: without a ``--set data.path=…`` among `overrides`, the
    run's own ``data.path`` (from its config.resolved.json) replaces the config file's → (config, a note saying so,
    or None when nothing changed). A fresh run directory keeps `cfg`. Example: ``--config
    configs/tiny/regular_gpt.json --run-dir runs/x --extend-to 2000`` trains on the data runs/x trained on, not
    on configs/base.json's ``data/python-stdlib``."""
    given = any(item.split("=", 1)[0].strip() == "data.path" for item in overrides)
    saved = saved_config(run_dir, TrainError)
    if given or saved is None or not saved.data.path or saved.data.path == cfg.data.path:
        return cfg, None
    note = (f"{run_dir}: data.path={saved.data.path} (the run's, from its {CONFIG_FILE}; --set data.path=… "
            f"to move the data)")
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=saved.data.path)), note
