"""The consolidated model file: one fp32 ``model.pt`` that evaluation and analyses load.

Format (a plain dict saved with ``torch.save``; loads with ``weights_only=True``)::

    {"format": "regulargpt-model", "version": 1,
     "config": <resolved config as a JSON-able dict>,      # Config, or FormalConfig when model.head is "classifier"
     "state_dict": {name: fp32 tensor},
     "meta": {"step": int, ...}}                           # free-form, JSON-able

Written atomically (temporary name + rename); a failed write (full disk, quota, read-only file system, …) is one
WriteError line naming the file and the cause (:func:`regulargpt.write_errors.explain_write_error`).
:func:`save_safetensors_file` writes the same weights as a plain
``model.safetensors`` (``python launch/export.py RUN --format safetensors``): the state dict under our names, the
config and meta as JSON strings in its header metadata (``format``, ``config``, ``meta``); a head tied to the
embedding is stored under both names (safetensors holds no shared tensors).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from regulargpt.config import Config, FormalConfig, config_from_saved, config_to_dict, formal_config_from_saved
from regulargpt.errors import UserError
from regulargpt.files import atomic_write_bytes
from regulargpt.write_errors import explain_write_error

__all__ = ["CheckpointError", "save_model_file", "save_safetensors_file", "load_model_file"]

_FORMAT, _VERSION = "regulargpt-model", 1


class CheckpointError(UserError, ValueError):
    """A model file that is missing, corrupt, or does not match the model it is loaded into."""


def save_model_file(path: str | Path, cfg: Config | FormalConfig, model: nn.Module,
                    meta: dict[str, Any] | None = None) -> None:
    state = _fp32_cpu_state(model)
    payload = {"format": _FORMAT, "version": _VERSION, "config": config_to_dict(cfg), "state_dict": state,
               "meta": dict(meta or {})}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    with explain_write_error(path, "the model file", len(buffer.getvalue())):
        atomic_write_bytes(path, buffer.getvalue())


def _fp32_cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", torch.float32) if v.is_floating_point() else v.detach().cpu()
            for k, v in model.state_dict().items()}


def save_safetensors_file(path: str | Path, cfg: Config | FormalConfig, model: nn.Module,
                          meta: dict[str, Any] | None = None) -> None:
    """The fp32 weights as a plain safetensors file, with the resolved config and meta in its header. Read it with
    ``safetensors.torch.load_file`` (tensors) and ``safe_open(path, "pt").metadata()["config"]`` (JSON)."""
    from safetensors.torch import save

    state = {k: v.clone().contiguous() for k, v in _fp32_cpu_state(model).items()}  # tied weights: a copy per name
    header = {"format": _FORMAT, "config": json.dumps(config_to_dict(cfg), sort_keys=True),
              "meta": json.dumps(dict(meta or {}), sort_keys=True)}
    data = save(state, metadata=header)
    with explain_write_error(path, "the safetensors file", len(data)):
        atomic_write_bytes(path, data)


def load_model_file(path: str | Path, map_location: str | torch.device = "cpu",
                    model_overrides: dict[str, Any] | None = None,
                    override_architectures: frozenset[str] | None = None,
                    ) -> tuple[Config | FormalConfig, nn.Module, dict[str, Any]]:
    """Load a model file → (config, model in eval mode, meta). Clear errors for missing/corrupt/mismatched files.

    The config is the trainer's class: a :class:`FormalConfig` for a sequence classifier (``model.head`` is
    "classifier": the formal-language trainer's RegularGPT, transformer, RNN and LSTM), a :class:`Config` otherwise;
    files saved in older layouts are read by :func:`regulargpt.config.formal_config_from_saved` and
    :func:`regulargpt.config.config_from_saved`.

    `model_overrides` replaces inference-time model fields that change no weight, e.g. ``{"depth_policy": "train"}``
    (the returned config carries them); with `override_architectures` only a model of one of those architectures
    gets them (``frozenset({"regular_gpt"})``: an ALiBi run loads as saved)."""
    from regulargpt.model import build_model

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: model file not found (export one with `python launch/export.py RUN_DIR`)")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated zip, pickle error, ...
        raise CheckpointError(f"{path}: cannot read model file ({type(err).__name__}: {err})") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise CheckpointError(f"{path}: not a regulargpt model file (expected format {_FORMAT!r})")
    if payload.get("version") != _VERSION:
        raise CheckpointError(f"{path}: model file version {payload.get('version')!r}; this code reads {_VERSION}")
    raw = payload.get("config")
    saved_model = raw.get("model") if isinstance(raw, dict) else None
    architecture = saved_model.get("architecture", "regular_gpt") if isinstance(saved_model, dict) else None
    if override_architectures is not None and architecture not in override_architectures:
        model_overrides = None
    if model_overrides and isinstance(raw, dict):
        raw = {**raw, "model": {**raw.get("model", {}), **model_overrides}}
    model_raw = raw.get("model") if isinstance(raw, dict) else None
    classifier = isinstance(model_raw, dict) and model_raw.get("head") == "classifier"
    read = formal_config_from_saved if classifier else config_from_saved
    cfg: Config | FormalConfig = read(raw, source=f"{path}[config]")
    model = build_model(cfg.model)
    state = payload.get("state_dict")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: no state_dict in the model file")
    mine = model.state_dict()
    missing, unexpected = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(mine[k].shape)}" for k in sorted(set(mine) & set(state))
              if tuple(state[k].shape) != tuple(mine[k].shape)]
    if missing or unexpected or shapes:
        raise CheckpointError(
            f"{path}: weights do not match the model its config describes (a checkpoint from a different model "
            f"config?); missing {missing[:5]}, unexpected {unexpected[:5]}, shape (file vs config) {shapes[:3]}"
        )
    model.load_state_dict(state, strict=True)
    return cfg, model.eval(), dict(payload.get("meta", {}))
