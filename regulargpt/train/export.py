"""Consolidating a language-model checkpoint into one fp32 ``model.pt`` (any ZeRO stage, one CPU process).

    from regulargpt.train.export import export_model
    export_model("runs/tiny-regular_gpt-seed0")          # → runs/tiny-regular_gpt-seed0/model.pt, from `latest`

The checkpoint is verified against its ``checksums.json`` first (a corrupt one is refused, naming it), its fp32
weights gathered over ranks (:func:`consolidated_state_dict`) and loaded with ``strict=True`` into the model the
run's config describes, then written in the :mod:`regulargpt.checkpoint` format with the step, tokens and the
training tokenizer's hash in its meta. ``launch/export.py`` is the command line; the trainer calls it at the end.
:func:`run_weights` is the model the other export formats write (safetensors, Hugging Face): a checkpoint
consolidated in memory, or the run's model.pt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from regulargpt.config import Config
from regulargpt.files import remove_dead_temporaries
from regulargpt.run_directory.layout import CONFIG_FILE, MODEL_FILE
from regulargpt.run_directory.lm_resume import run_config
from regulargpt.train.engine import TrainError
from regulargpt.run_directory.checkpoints import (
    checkpoint_steps,
    latest_step,
    read_trainer_state,
    verify_checkpoint,
)
from regulargpt.run_directory.safe_load import safe_loading

__all__ = ["consolidated_model", "consolidated_state_dict", "export_model", "run_weights"]


def _stage0_state_dict(folder: Path, names: list[list[str]]) -> dict[str, torch.Tensor]:
    """ZeRO-0: the module state, with bf16/fp16 weights replaced by the optimizer's fp32 master copies."""
    path = folder / "mp_rank_00_model_states.pt"
    if not path.is_file():
        raise TrainError(f"{path}: missing; is {folder} a complete ZeRO-0 checkpoint?")
    with safe_loading():
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    state = {k: v.float() if v.is_floating_point() else v for k, v in ckpt["module"].items()}
    optim = ckpt.get("optimizer") or {}
    masters = optim.get("fp32_groups") if isinstance(optim, dict) else None
    if masters is not None:
        for group_names, group in zip(names, masters):
            for name, tensor in zip(group_names, group):
                state[name] = tensor.detach().float().view_as(state[name]).clone()
    return state


def consolidated_state_dict(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """The fp32 model state of checkpoint `step`, consolidated over ranks (any ZeRO stage, one CPU process).

    ZeRO ≥ 1 goes through DeepSpeed's zero_to_fp32 (fp32 master partitions of every rank, gathered);
    ZeRO-0 reads the module state and, for bf16/fp16 training, the optimizer's fp32 master weights.
    """
    state = read_trainer_state(run_dir, step)
    folder = run_dir / f"global_step{step}"
    if state["zero_stage"] == 0:
        return _stage0_state_dict(folder, state["param_names"])
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    with safe_loading():
        sd = get_fp32_state_dict_from_zero_checkpoint(str(run_dir), tag=f"global_step{step}")
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def consolidated_model(run_dir: str | Path, step: int | None = None) -> tuple[Config, nn.Module, dict[str, Any]]:
    """(config, fp32 model, meta) of checkpoint `step` (default: the one ``latest`` names), verified, consolidated
    over ranks and loaded with ``strict=True``. meta: step, tokens, run_dir, checkpoint, tokenizer_sha256.
    TrainError for a checkpoint holding a NaN or infinite weight: such a model is never exported."""
    from regulargpt.model import build_model

    run_dir = Path(run_dir)
    cfg, _ = run_config(run_dir)  # config.resolved.json, or the copy in the newest checkpoint when it is lost
    if cfg is None:
        raise TrainError(f"{run_dir}: no {CONFIG_FILE}; not a run directory")
    if step is None:
        step = latest_step(run_dir)
        if step is None:
            raise TrainError(f"{run_dir}: no checkpoint yet (no 'latest' file)")
    elif not (run_dir / f"global_step{step}").is_dir():
        raise TrainError(f"{run_dir}: no checkpoint global_step{step}; have {checkpoint_steps(run_dir)}")
    reason = verify_checkpoint(run_dir, step)
    if reason:
        raise TrainError(f"{run_dir}/global_step{step} is corrupt ({reason}); export another one with --step N "
                         f"(have {checkpoint_steps(run_dir)})")
    try:
        state = consolidated_state_dict(run_dir, step)
    except TrainError:
        raise
    except (OSError, RuntimeError, KeyError, ValueError) as err:  # e.g. a legacy checkpoint with a damaged file
        raise TrainError(f"{run_dir}/global_step{step}: cannot read the checkpoint "
                         f"({type(err).__name__}: {err})") from None
    bad = [name for name, tensor in state.items() if tensor.is_floating_point() and not tensor.isfinite().all()]
    if bad:
        raise TrainError(f"{run_dir}/global_step{step}: non-finite weights ({', '.join(bad[:3])}"
                         f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}): the run diverged before this "
                         f"checkpoint; nothing exported (have {checkpoint_steps(run_dir)}; export an earlier one "
                         f"with --step N)")
    model = build_model(cfg.model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise TrainError(f"{run_dir}/global_step{step}: weights do not fit the config's model: {err}") from None
    trainer = read_trainer_state(run_dir, step)
    meta = {"step": step, "tokens": trainer.get("tokens", 0), "run_dir": str(run_dir),
            "checkpoint": f"global_step{step}"}
    tokenizer_sha = trainer.get("data", {}).get("tokenizer_sha256")
    if tokenizer_sha:  # evaluation and generation check their tokenizer against it (training_tokenizer_sha)
        meta["tokenizer_sha256"] = tokenizer_sha
    return cfg, model.eval(), meta


def export_model(run_dir: str | Path, step: int | None = None, out: str | Path | None = None) -> Path:
    """Write the consolidated fp32 ``model.pt`` of a checkpoint (default: latest) → its path.

    The weights are loaded into a fresh model with ``strict=True`` before writing, so a file that is written loads.
    Temporaries of earlier exports killed mid-write (``.model.pt.<pid>.tmp`` of an ended pid) are removed first.
    """
    from regulargpt.checkpoint import save_model_file

    out = Path(out) if out is not None else Path(run_dir) / MODEL_FILE
    remove_dead_temporaries(out)
    cfg, model, meta = consolidated_model(run_dir, step)
    save_model_file(out, cfg, model, meta=meta)
    return out


def run_weights(source: str | Path, step: int | None = None) -> tuple[Path | None, Config, nn.Module, dict[str, Any]]:
    """The language model to export from `source` → (its run directory or None, config, fp32 model, meta).

    A run directory: checkpoint `step`, by default the one ``latest`` names, or its ``model.pt`` when it has no
    checkpoint. A model.pt path: that file (its folder is the run directory when it holds a saved config)."""
    from regulargpt.checkpoint import load_model_file

    source = Path(source)
    if source.is_dir() and (step is not None or latest_step(source) is not None):
        cfg, model, meta = consolidated_model(source, step)
        return source, cfg, model, meta
    if step is not None:
        raise TrainError(f"--step {step}: {source} is a model file, not a run directory with checkpoints")
    model_path = source / MODEL_FILE if source.is_dir() else source
    if not model_path.is_file():
        raise TrainError(f"{source}: no checkpoint and no {MODEL_FILE}; train it first (launch/pretrain.py)")
    loaded, model, meta = load_model_file(model_path)
    if not isinstance(loaded, Config):
        raise TrainError(f"{model_path}: model.head {loaded.model.head!r} is a sequence classifier; only language "
                         f"models (head 'lm') export to this format")
    run_dir = model_path.parent if (model_path.parent / CONFIG_FILE).is_file() else None
    return run_dir, loaded, model, meta
