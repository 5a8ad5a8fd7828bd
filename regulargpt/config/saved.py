"""Run configs saved by older code, read by today's classes: before the ``data`` and ``eval`` sections were split
per trainer (one section holding both trainers' fields) and, for formal runs, before :class:`FormalConfig` existed
(a whole :class:`Config`). Fixtures of both layouts: tests/fixtures/."""

from __future__ import annotations

import dataclasses
from typing import Any

from regulargpt.config.loading import load_config_dict
from regulargpt.config.run_configs import Config, FormalConfig
from regulargpt.config.sections import (
    ConfigError,
    DataConfig,
    EvalConfig,
    FormalDataConfig,
    FormalEvalConfig,
    FormalTrainConfig,
    TrainConfig,
)


# The keys `data` and `eval` held for the formal trainer while both trainers shared those sections (up to commit
# 0152525), with the defaults at which every language-model run saved them.
_FORMAL_KEYS_BEFORE_SPLIT = {"data": {"task": "", "task_options": {}, "min_length": 1, "max_length": 40},
                             "eval": {"max_length": 500, "samples_per_length": 512, "score_min_length": 41}}


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def config_from_saved(raw: dict[str, Any], source: str) -> Config:
    """A :class:`Config` from a language-model run's saved config (``config.resolved.json``, a model file's
    config), also in the layout written while ``data`` and ``eval`` held the formal trainer's fields too: those
    keys are dropped when they hold the defaults every language-model run saved; any other value is a ConfigError
    (such a file did not come from the language-model trainer)."""
    if isinstance(raw, dict):
        raw = dict(raw)
        for name, old_defaults in _FORMAL_KEYS_BEFORE_SPLIT.items():
            section = raw.get(name)
            if not isinstance(section, dict):
                continue
            for key, value in section.items():
                if key in old_defaults and value != old_defaults[key]:
                    raise ConfigError(f"{source}: {name}.{key}: {value!r} is a formal-language setting, not allowed "
                                      f"in a language-model config (only its old default {old_defaults[key]!r} "
                                      f"is dropped); a formal-language model has model.head 'classifier'")
            raw[name] = {k: v for k, v in section.items() if k not in old_defaults}
    return load_config_dict(raw, source, Config)


def formal_config_from_saved(raw: dict[str, Any], source: str) -> FormalConfig:
    """A :class:`FormalConfig` from a formal run's saved config, also in the layouts written before it had its own
    sections: a whole :class:`Config` (before FormalConfig existed), and ``data``/``eval`` sections shared with the
    language-model trainer. The language-model-only keys of those layouts (``deepspeed``, ``train.schedule``,
    ``grad_accum``, ``precision``, ``zero_stage``, ..., ``data.path``, ``data.seq_len``, ``eval.lengths``,
    ``protocol``, ...) the formal trainer either required at their defaults or never read, so they are dropped."""
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k != "deepspeed"}
        for name, lm, formal in (("data", DataConfig, FormalDataConfig), ("train", TrainConfig, FormalTrainConfig),
                                 ("eval", EvalConfig, FormalEvalConfig)):
            lm_only = _field_names(lm) - _field_names(formal)
            if isinstance(raw.get(name), dict):
                raw[name] = {k: v for k, v in raw[name].items() if k not in lm_only}
    return load_config_dict(raw, source, FormalConfig)
