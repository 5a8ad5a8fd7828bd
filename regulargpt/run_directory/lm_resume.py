"""The language-model trainer's resume policy: where a run goes, which config changes a resume accepts, and
extending a finished run to more steps (``--extend-to``).

A run directory that holds ``config.resolved.json`` is resumed by the same command; the config must be the same
(unless the run never trained: :func:`never_trained`) except for the :data:`RESUME_FREE` keys (compared by :mod:`regulargpt.run_directory.config_check`). The one
other accepted change is an extension: ``train.steps`` raised and the finished run's step appended to
``train.extended_from`` (:func:`extension_config`), after which the finished run's ``model.pt`` is kept as
``model_step<N>.pt`` (:func:`set_aside_export`). Resuming and extending read the data folder from the run
(:func:`with_saved_data_path`), so the command need not repeat ``--set data.path=…``.

A resume may also change optimizer settings the user names (``--allow-changed train.lr``, one of
:data:`ALLOW_CHANGED_KEYS`), e.g. to continue a diverged run at a lower rate; each such change is printed and
appended to ``changes.jsonl`` (``{"step": 40, "key": "train.lr", "old": 1.0, "new": 0.0003}``: steps after 40 ran
at the new value; ``metrics.jsonl``'s ``lr`` column shows the rate each logged step applied).

Every checkpoint carries the resolved config too (``trainer_state.json``'s ``"config"``), so a run whose
``config.resolved.json`` is missing or unreadable is compared with that copy and the file rewritten from it
(:func:`run_config`); a run whose checkpoints predate that copy resumes as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from regulargpt.config import Config, ConfigError, config_from_saved, save_config
from regulargpt.run_directory.layout import CONFIG_FILE, METRICS_FILE, MODEL_FILE
from regulargpt.errors import TrainError
from regulargpt.run_directory.checkpoints import checkpoint_config, checkpoint_steps, latest_step
from regulargpt.run_directory.config_check import (
    ResumePolicy,
    check_config_unchanged,
    config_changes,
    saved_config,
)

__all__ = ["RESUME_FREE_KEYS", "RESUME_FREE", "ALLOW_CHANGED_KEYS", "CHANGES_FILE", "default_run_dir",
           "check_allow_changed", "run_config", "check_or_write_config", "extension_config", "set_aside_export",
           "with_saved_data_path"]

# Keys that may change between a run and its resumption: they do not change what is trained.
RESUME_FREE_KEYS = frozenset({
    "data.path",  # the data may move (e.g. to node-local disk); its fingerprint is compared instead
    "data.paths",  # likewise a mixture's folders: their fingerprints and weights are compared, in order
    "data.verify",  # how the data is checked at start, not what it is
    "train.log_every", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep_last",
    "train.max_bad_steps", "train.divergence_factor", "train.activation_checkpointing", "train.dist_timeout_s", "train.compile",
    "train.grad_accum",  # derived on resume from the run's global batch and the number of processes (world_change)
})
RESUME_FREE = ResumePolicy(keys=RESUME_FREE_KEYS, sections=("eval", "logging"))
_EXTENSION_KEYS = {"train.steps", "train.extended_from"}
# Keys a resume may change when named with --allow-changed: the optimizer's settings and the LR schedule, which the
# resumed optimizer takes from the config (lm_checkpoint.Checkpoints.resume), not from the checkpoint.
ALLOW_CHANGED_KEYS = frozenset({"train.lr", "train.min_lr_ratio", "train.warmup_fraction", "train.schedule",
                                "train.beta1", "train.beta2", "train.eps", "train.grad_clip"})
CHANGES_FILE = "changes.jsonl"


def check_allow_changed(keys: list[str]) -> frozenset[str]:
    """The ``--allow-changed`` keys (each flag one key or a comma-separated list) → a set; ConfigError for a key a
    resume cannot change."""
    out = frozenset(k.strip() for item in keys for k in item.split(",") if k.strip())
    bad = sorted(out - ALLOW_CHANGED_KEYS)
    if bad:
        hint = "; to train past the run's last step use --extend-to N" if "train.steps" in bad else ""
        raise ConfigError(f"--allow-changed {bad[0]}: not a setting a resume can change; allowed: "
                          f"{', '.join(sorted(ALLOW_CHANGED_KEYS))}{hint}")
    return out


def run_config(run_dir: Path) -> tuple[Config | None, str | None]:
    """The config the run in `run_dir` trains with → (config, None) from its config.resolved.json; when that file is
    missing or unreadable, (config, note) from the copy in its newest checkpoint that has one; (None, None) for a
    new run. A missing file with only older checkpoints (no copy inside) reads as a new run, as before; an
    unreadable one without a copy is the TrainError of :func:`saved_config`."""
    path = run_dir / CONFIG_FILE
    try:
        saved = saved_config(run_dir, TrainError)
    except TrainError:
        found = checkpoint_config(run_dir)
        if found is None:
            raise
        why = "is unreadable"
    else:
        if saved is not None:
            return saved, None
        found = checkpoint_config(run_dir)
        if found is None:
            return None, None
        why = "is missing"
    step, raw = found
    source = f"{run_dir}/global_step{step}/trainer_state.json[config]"
    try:
        cfg = config_from_saved(raw, source=source)
    except ConfigError as err:
        raise TrainError(f"{err}; the run's config is unusable, use another --run-dir") from None
    return cfg, f"{path} {why}; using the config saved in global_step{step} and rewriting the file from it"


def never_trained(run_dir: Path) -> bool:
    """True when `run_dir` holds no checkpoint folder (``global_step<N>``; set-aside ones do not count) and no
    metrics row: a run refused or crashed before its first step (e.g. out of memory) left nothing to resume, so
    any config may start it."""
    metrics = run_dir / METRICS_FILE
    return not checkpoint_steps(run_dir) and not (metrics.is_file() and metrics.read_text().strip())


def _record_changes(run_dir: Path, changes: dict[str, tuple[Any, Any]]) -> None:
    """Print and append the --allow-changed changes to changes.jsonl, at the step the run resumes from."""
    step = latest_step(run_dir) or 0
    with open(run_dir / CHANGES_FILE, "a") as handle:
        for key, (old, new) in changes.items():
            handle.write(json.dumps({"step": step, "key": key, "old": old, "new": new}) + "\n")
            print(f"note: {run_dir}: {key} {old!r} → {new!r} from step {step + 1} on (--allow-changed; recorded "
                  f"in {run_dir / CHANGES_FILE})", file=sys.stderr, flush=True)


def default_run_dir(config_path: str | Path, seed: int) -> Path:
    """``runs/<config stem>-seed<seed>``, e.g. ``runs/regular_gpt-seed0`` for configs/tiny/regular_gpt.json."""
    return Path("runs") / f"{Path(config_path).stem}-seed{seed}"


def check_or_write_config(run_dir: Path, cfg: Config, write: bool = True,
                          allow: frozenset[str] = frozenset()) -> int | None:
    """Write config.resolved.json for a new run; for an existing one, fail clearly on any training-relevant change
    other than the `allow` keys (``--allow-changed``, recorded by :func:`_record_changes`).
    → the step the run is being extended from when `cfg` is its :func:`extension_config` (else None).

    Every rank may check; only the one with ``write=True`` writes (and prints).
    """
    path = run_dir / CONFIG_FILE
    old, note = run_config(run_dir)
    if old is None:
        if write:
            save_config(cfg, path)
        return None
    if note and write:
        save_config(old, path)
        print(f"note: {note}", file=sys.stderr, flush=True)
    changes = config_changes(old, cfg, RESUME_FREE)
    allowed = {k: v for k, v in changes.items() if k in allow}
    changes = {k: v for k, v in changes.items() if k not in allow}
    extending = (set(changes) <= _EXTENSION_KEYS and cfg.train.steps > old.train.steps
                 and cfg.train.extended_from == [*old.train.extended_from, old.train.steps]
                 and latest_step(run_dir) == old.train.steps)
    if changes and not extending and never_trained(run_dir):
        if write:
            print(f"note: {run_dir} never trained (no checkpoint, no metrics row): its {CONFIG_FILE} is replaced by "
                  f"this config", file=sys.stderr, flush=True)
    elif not extending:
        hint = (f"; to continue the finished run to more steps pass --extend-to N (it has {old.train.steps})"
                if "train.steps" in changes else "")
        check_config_unchanged(run_dir, changes, TrainError, hint)
    if write and allowed:
        _record_changes(run_dir, allowed)
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
    saved_cfg, _ = run_config(run_dir)
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
    """`cfg` for resuming or extending the run in `run_dir`: without a ``--set data.path=…`` (or ``data.paths``)
    among `overrides`, the run's own ``data.path`` or mixture (``data.paths``, and its ``data.weights`` unless
    ``--set data.weights=…`` is given; from its config.resolved.json) replaces the config file's → (config, a note
    saying so, or None when nothing changed). A fresh run directory keeps `cfg`. Example: ``--config
    configs/tiny/regular_gpt.json --run-dir runs/x --extend-to 2000`` trains on the data runs/x trained on, not
    on configs/base.json's ``data/python-stdlib``."""
    keys = {item.split("=", 1)[0].strip() for item in overrides}
    saved, _ = run_config(run_dir)
    if keys & {"data.path", "data.paths"} or saved is None or not saved.data.folders:
        return cfg, None
    weights = cfg.data.weights if "data.weights" in keys else saved.data.weights
    data = dataclasses.replace(cfg.data, path=saved.data.path, paths=saved.data.paths,
                               weights=weights if saved.data.paths else [])
    if data == cfg.data:
        return cfg, None
    key = "data.paths" if saved.data.paths else "data.path"
    note = (f"{run_dir}: {key}={','.join(saved.data.folders)} (the run's, from its {CONFIG_FILE}; --set {key}=… "
            f"to move the data)")
    return dataclasses.replace(cfg, data=data), note
