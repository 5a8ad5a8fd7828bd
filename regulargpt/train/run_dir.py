"""The run directory: resolved config, DeepSpeed checkpoints with our trainer state, resume, keep-last-k, export.

Layout::

    runs/tiny-regular_gpt-seed0/
      config.resolved.json          the full config this run trains with (compared on resume)
      metrics.jsonl                 one JSON object per logged step (see regulargpt.train.logging)
      global_step100/               DeepSpeed checkpoint of step 100 (files depend on the ZeRO stage) plus
        trainer_state.json            step, tokens, world size, sampler state, data fingerprint, parameter names
        rng_rank<r>.pt                each rank's python / numpy / torch RNG states
      global_step200/
      latest                        "global_step200": written last, atomically; a checkpoint without it is partial
      model.pt                      consolidated fp32 model (regulargpt.checkpoint format), written at the end
      zero_to_fp32.py               copied there by DeepSpeed (ZeRO ≥ 1); launch/export.py does the same job

A checkpoint counts once ``latest`` names it: a run killed while saving resumes from the previous one, and the
partial folder is removed on resume. ``keep_last`` complete checkpoints are kept, older ones deleted.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.config import Config, ConfigError, config_to_dict, load_config_dict, save_config
from regulargpt.io import atomic_write_text
from regulargpt.train.engine import TrainError

__all__ = [
    "RESUME_FREE_KEYS",
    "default_run_dir",
    "check_or_write_config",
    "latest_step",
    "checkpoint_steps",
    "write_trainer_state",
    "read_trainer_state",
    "mark_latest",
    "prune_checkpoints",
    "remove_partial_checkpoints",
    "rng_state",
    "save_rng",
    "load_rng",
    "consolidated_state_dict",
    "export_model",
]

CONFIG_FILE, LATEST, TRAINER_STATE = "config.resolved.json", "latest", "trainer_state.json"
_TAG = re.compile(r"^global_step(\d+)$")

# Keys that may change between a run and its resumption: they do not change what is trained.
RESUME_FREE_KEYS = {
    "data.path",  # the data may move (e.g. to node-local disk); its fingerprint is compared instead
    "train.log_every", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep_last",
    "train.max_bad_steps", "train.activation_checkpointing",
}
_RESUME_FREE_SECTIONS = ("eval.", "logging.")


def default_run_dir(config_path: str | Path, seed: int) -> Path:
    """``runs/<config stem>-seed<seed>``, e.g. ``runs/regular_gpt-seed0`` for configs/tiny/regular_gpt.json."""
    return Path("runs") / f"{Path(config_path).stem}-seed{seed}"


def _flatten(cfg: dict[str, Any]) -> dict[str, Any]:
    """{"model": {"d_model": 8}, "deepspeed": {...}} → {"model.d_model": 8, "deepspeed": {...}}."""
    out: dict[str, Any] = {}
    for section, fields in cfg.items():
        if section == "deepspeed":
            out[section] = fields
        else:
            out.update({f"{section}.{k}": v for k, v in fields.items()})
    return out


def check_or_write_config(run_dir: Path, cfg: Config, write: bool = True) -> None:
    """Write config.resolved.json for a new run; for an existing one, fail clearly on any training-relevant change.

    Every rank may check; only the one with ``write=True`` writes.
    """
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        if write:
            save_config(cfg, path)
        return
    try:
        old = load_config_dict(json.loads(path.read_text()), source=str(path))
    except (ConfigError, json.JSONDecodeError) as err:
        raise TrainError(f"{path}: cannot read the run's config ({err}); use another --run-dir") from None
    before, after = _flatten(config_to_dict(old)), _flatten(config_to_dict(cfg))
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)
               and k not in RESUME_FREE_KEYS and not k.startswith(_RESUME_FREE_SECTIONS)]
    if changed:
        diffs = "; ".join(f"{k}: run has {before.get(k)!r}, now {after.get(k)!r}" for k in changed[:8])
        raise TrainError(f"{run_dir} holds a run with a different config ({diffs}). Resume with the same config, "
                         f"or pass a new --run-dir")
    if write:
        save_config(cfg, path)  # record the current values of the resume-free keys


# ------------------------------------------------------------------------------------------------ checkpoints


def checkpoint_steps(run_dir: Path) -> list[int]:
    """Steps of all ``global_step<N>`` folders (complete or not), ascending."""
    if not run_dir.is_dir():
        return []
    return sorted(int(m.group(1)) for p in run_dir.iterdir() if p.is_dir() and (m := _TAG.match(p.name)))


def latest_step(run_dir: Path) -> int | None:
    """The step ``latest`` names, or None for a fresh run directory."""
    path = run_dir / LATEST
    if not path.is_file():
        return None
    tag = path.read_text().strip()
    m = _TAG.match(tag)
    if not m or not (run_dir / tag).is_dir():
        raise TrainError(f"{path}: names {tag!r}, which is not a checkpoint folder in {run_dir}")
    return int(m.group(1))


def write_trainer_state(run_dir: Path, step: int, state: dict[str, Any]) -> None:
    text = json.dumps(state, indent=2, sort_keys=True) + "\n"
    atomic_write_text(run_dir / f"global_step{step}" / TRAINER_STATE, text)


def read_trainer_state(run_dir: Path, step: int) -> dict[str, Any]:
    path = run_dir / f"global_step{step}" / TRAINER_STATE
    if not path.is_file():
        raise TrainError(f"{path}: missing; not a checkpoint written by regulargpt")
    return json.loads(path.read_text())


def mark_latest(run_dir: Path, step: int) -> None:
    """Make global_step<step> the checkpoint a resume starts from (atomic rename)."""
    atomic_write_text(run_dir / LATEST, f"global_step{step}")


def prune_checkpoints(run_dir: Path, keep: int) -> list[int]:
    """Delete complete checkpoints older than the newest `keep` (never the latest, never newer ones); → deleted."""
    last = latest_step(run_dir)
    if last is None:
        return []
    complete = [s for s in checkpoint_steps(run_dir) if s <= last]
    doomed = complete[:-keep] if keep > 0 else []
    for s in doomed:
        shutil.rmtree(run_dir / f"global_step{s}", ignore_errors=True)
    return doomed


def remove_partial_checkpoints(run_dir: Path) -> list[int]:
    """On resume: delete checkpoint folders newer than ``latest`` (a save that was interrupted)."""
    last = latest_step(run_dir)
    partial = [s for s in checkpoint_steps(run_dir) if last is None or s > last]
    for s in partial:
        shutil.rmtree(run_dir / f"global_step{s}", ignore_errors=True)
    return partial


# ------------------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_rng(run_dir: Path, step: int, rank: int) -> None:
    from regulargpt.io import atomic_write

    atomic_write(run_dir / f"global_step{step}" / f"rng_rank{rank}.pt", lambda f: torch.save(rng_state(), f))


def load_rng(run_dir: Path, step: int, rank: int) -> None:
    path = run_dir / f"global_step{step}" / f"rng_rank{rank}.pt"
    if not path.is_file():
        raise TrainError(f"{path}: missing (was the run saved with another number of processes?)")
    state = torch.load(path, weights_only=False)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


# ------------------------------------------------------------------------------------------------------ export


def _stage0_state_dict(folder: Path, names: list[list[str]]) -> dict[str, torch.Tensor]:
    """ZeRO-0: the module state, with bf16/fp16 weights replaced by the optimizer's fp32 master copies."""
    path = folder / "mp_rank_00_model_states.pt"
    if not path.is_file():
        raise TrainError(f"{path}: missing; is {folder} a complete ZeRO-0 checkpoint?")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
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

    sd = get_fp32_state_dict_from_zero_checkpoint(str(run_dir), tag=f"global_step{step}")
    return {k: v.float() if v.is_floating_point() else v for k, v in sd.items()}


def export_model(run_dir: str | Path, step: int | None = None, out: str | Path | None = None) -> Path:
    """Write the consolidated fp32 ``model.pt`` of a checkpoint (default: latest) → its path.

    The weights are loaded into a fresh model with ``strict=True`` before writing, so a file that is written loads.
    """
    from regulargpt.checkpoint import save_model_file
    from regulargpt.model import build_model

    run_dir = Path(run_dir)
    cfg_path = run_dir / CONFIG_FILE
    if not cfg_path.is_file():
        raise TrainError(f"{run_dir}: no {CONFIG_FILE}; not a run directory")
    cfg = load_config_dict(json.loads(cfg_path.read_text()), source=str(cfg_path))
    if step is None:
        step = latest_step(run_dir)
        if step is None:
            raise TrainError(f"{run_dir}: no checkpoint yet (no 'latest' file)")
    elif not (run_dir / f"global_step{step}").is_dir():
        raise TrainError(f"{run_dir}: no checkpoint global_step{step}; have {checkpoint_steps(run_dir)}")
    state = consolidated_state_dict(run_dir, step)
    model = build_model(cfg.model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise TrainError(f"{run_dir}/global_step{step}: weights do not fit the config's model: {err}") from None
    trainer = read_trainer_state(run_dir, step)
    out = Path(out) if out is not None else run_dir / "model.pt"
    save_model_file(out, cfg, model, meta={"step": step, "tokens": trainer.get("tokens", 0),
                                           "run_dir": str(run_dir), "checkpoint": f"global_step{step}"})
    return out
