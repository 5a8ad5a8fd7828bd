"""Comparing a run directory's saved config with the config a restarted run brings: one rule for both trainers.

A run directory records the config it trains with in ``config.resolved.json``. A restart with the same run
directory must train the same thing, so every field is compared, flattened to ``section.key`` (``deepspeed`` is
compared as one value), except those the trainer declares resume-free in a :class:`ResumePolicy`:

    language-model trainer   sections eval, logging; keys data.path, train.log_every, train.save_every, …
                             (:data:`regulargpt.run_directory.lm_resume.RESUME_FREE`)
    formal trainer           section logging (:mod:`regulargpt.train.formal_trainer`)

The saved file is resolved by today's code (:func:`regulargpt.config.config_from_saved` or
:func:`regulargpt.config.formal_config_from_saved`), so a field added since, at its default, is no difference. Any
other difference is an error in one format naming the file and every differing key with both values, e.g.

    runs/a/config.resolved.json: the run there was trained with a different config (train.lr: run has 0.003,
    now 0.01); resume with the same config, or use another --run-dir
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from regulargpt.config import Config, ConfigError, FormalConfig, config_from_saved, config_to_dict
from regulargpt.files import read_json_object
from regulargpt.run_directory.layout import CONFIG_FILE

__all__ = ["ResumePolicy", "saved_config", "config_changes", "check_config_unchanged"]

_SHOWN = 8  # differing keys listed in the message; the rest are counted


@dataclass(frozen=True)
class ResumePolicy:
    """Which flattened config keys may differ between a run and its resumption (they do not change what is
    trained): the `keys` named, and every key of the `sections` named (``"logging"`` frees ``logging.*``)."""

    keys: frozenset[str] = frozenset()
    sections: tuple[str, ...] = ()

    def is_free(self, key: str) -> bool:
        return key in self.keys or key.split(".", 1)[0] in self.sections


def _flatten(cfg: dict[str, Any]) -> dict[str, Any]:
    """{"model": {"d_model": 8}, "deepspeed": {...}} → {"model.d_model": 8, "deepspeed": {...}}."""
    out: dict[str, Any] = {}
    for section, fields in cfg.items():
        if section == "deepspeed" or not isinstance(fields, dict):
            out[section] = fields
        else:
            out.update({f"{section}.{k}": v for k, v in fields.items()})
    return out


def saved_config(run_dir: Path, error: type[Exception],
                 read: Callable[..., Config | FormalConfig] = config_from_saved) -> Config | FormalConfig | None:
    """The config saved in ``run_dir/config.resolved.json``, resolved by today's code; None for a new run.

    `read(raw, source=...)` builds it: ``config_from_saved`` for the LM trainer, ``formal_config_from_saved`` for the
    formal one. An unreadable or invalid file raises `error` (each trainer's own exception type) naming the file."""
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    raw = read_json_object(path, error, "the run's config is unusable; use another --run-dir")
    try:
        return read(raw, source=str(path))
    except ConfigError as err:
        raise error(f"{err}; the run's config is unusable, use another --run-dir") from None


def config_changes(old: Config | FormalConfig, new: Config | FormalConfig, policy: ResumePolicy) -> dict[str, tuple[Any, Any]]:
    """Every flattened key whose value differs between the run's config and the new one and that `policy` does not
    free → {key: (run's value, new value)}, keys sorted; a key only one side has is compared with None."""
    before, after = _flatten(config_to_dict(old)), _flatten(config_to_dict(new))
    return {k: (before.get(k), after.get(k)) for k in sorted(set(before) | set(after))
            if before.get(k) != after.get(k) and not policy.is_free(k)}


def check_config_unchanged(run_dir: Path, changes: dict[str, tuple[Any, Any]], error: type[Exception],
                           hint: str = "") -> None:
    """Raise `error` when `changes` (from :func:`config_changes`) is not empty, naming the file and the keys;
    `hint` (e.g. ``"; to continue … pass --extend-to N"``) is appended to the message."""
    if not changes:
        return
    diffs = "; ".join(f"{k}: run has {old!r}, now {new!r}" for k, (old, new) in list(changes.items())[:_SHOWN])
    if len(changes) > _SHOWN:
        diffs += f"; and {len(changes) - _SHOWN} more"
    raise error(f"{run_dir / CONFIG_FILE}: the run there was trained with a different config ({diffs}); resume "
                f"with the same config, or use another --run-dir{hint}")
