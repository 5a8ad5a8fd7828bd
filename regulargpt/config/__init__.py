"""Typed, validated run configuration loaded from JSON.

A config file is a JSON object with up to six sections::

    {"extends": "../base.json",            # optional, path relative to this file; merged recursively
     "model": {...}, "data": {...}, "train": {...}, "eval": {...}, "logging": {...},
     "deepspeed": {...}}                   # passed through to DeepSpeed unchanged (a plain dict)

Every section is a frozen dataclass below that validates itself in ``__post_init__``, so an invalid config object
cannot exist (``dataclasses.replace`` validates too) and code below trusts the values it reads. Loading is strict: an
unknown key, a wrong type or an impossible value raises :class:`ConfigError`, whose message names the file, the key
path, the value and what is allowed, e.g.::

    configs/tiny/regular_gpt.json: model.chunk_sise: unknown key; did you mean 'chunk_size'?
    configs/tiny/regular_gpt.json: train.lr: 0.0 is not allowed; expected a number > 0

There is one config class per trainer, each holding only the fields its trainer reads (setting the other trainer's
key is an unknown-key error); ``load_config(path, kind=...)`` picks the class::

    section    Config (language models)                    FormalConfig (formal languages)
    model      ModelConfig                                 ModelConfig, head "classifier"
    data       DataConfig: path or paths + weights,        FormalDataConfig: task, task_options, min_length, max_length
               seq_len, verify
    train      TrainConfig                                 FormalTrainConfig (no schedule, accumulation, ZeRO...)
    eval       EvalConfig: lengths, protocol, stride,      FormalEvalConfig: max_length, samples_per_length,
               tokens, memory_gb                           score_min_length
    logging    LoggingConfig                               LoggingConfig
    deepspeed  a pass-through dict                         (none)

Run configs saved before the split (one ``data`` and one ``eval`` section holding both trainers' fields, and formal
runs saved as a whole Config) are read by :func:`config_from_saved` and :func:`formal_config_from_saved`.

Command-line overrides use dotted paths and are converted to the field's type: ``--set model.chunk_size=4``,
``--set train.lr=3e-4``, ``--set eval.lengths=64,128,256``. A resolved config round-trips through JSON unchanged:
``load_config_dict(config_to_dict(cfg)) == cfg``.

The package: :mod:`~regulargpt.config.sections` (one dataclass per section), :mod:`~regulargpt.config.run_configs`
(Config, FormalConfig), :mod:`~regulargpt.config.loading` (files, ``extends``, overrides) and
:mod:`~regulargpt.config.saved` (older saved layouts).
"""

from __future__ import annotations

from regulargpt.config.loading import (
    apply_overrides,
    build_section,
    config_to_dict,
    load_config,
    load_config_dict,
    merge_dicts,
    read_json,
    save_config,
)
from regulargpt.config.run_configs import Config, FormalConfig
from regulargpt.config.saved import config_from_saved, formal_config_from_saved
from regulargpt.config.sections import (
    ConfigError,
    DataConfig,
    EvalConfig,
    FormalDataConfig,
    FormalEvalConfig,
    FormalTrainConfig,
    LoggingConfig,
    ModelConfig,
    TrainConfig,
)

__all__ = [
    "ConfigError",
    "ModelConfig",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "LoggingConfig",
    "Config",
    "FormalDataConfig",
    "FormalTrainConfig",
    "FormalEvalConfig",
    "FormalConfig",
    "config_from_saved",
    "formal_config_from_saved",
    "load_config",
    "load_config_dict",
    "config_to_dict",
    "apply_overrides",
    "build_section",
    "read_json",
    "save_config",
    "merge_dicts",
]
