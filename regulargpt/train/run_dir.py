"""The run directory: resolved config, DeepSpeed checkpoints with our trainer state, resume, keep-last-k, export.

Layout::

    runs/tiny-regular_gpt-seed0/
      config.resolved.json          the full config this run trains with (compared on resume)
      metrics.jsonl                 one JSON object per logged step (see regulargpt.train.metrics_log)
      global_step100/               DeepSpeed checkpoint of step 100 (files depend on the ZeRO stage) plus
        trainer_state.json            step, tokens, world size, sampler state, data fingerprint, parameter names
        rng_rank<r>.pt                each rank's python / numpy / torch RNG states
        checksums.json                size + sha256 of every other file: the completion marker, written last
      global_step200/
      latest                        "global_step200": written after checksums.json, atomically
      model.pt                      consolidated fp32 model (regulargpt.checkpoint format), written at the end
      zero_to_fp32.py               copied there by DeepSpeed (ZeRO ≥ 1); launch/export.py does the same job

Save order: every rank writes its files → barrier → rank 0 fsyncs and hashes them into ``checksums.json`` →
``latest`` → older checkpoints beyond ``keep_last`` are deleted. A checkpoint counts once ``latest`` names it: a run
killed while saving resumes from the previous one, and the partial folder is removed on resume. A checkpoint that
fails its checksums later (truncated, overwritten, a missing file) is skipped on resume with a warning naming it and
the older intact checkpoint used instead (:func:`resume_step`).

Every ``torch.load`` of checkpoint files, DeepSpeed's included, runs with ``weights_only=True`` (:func:`safe_loading`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.config import Config, ConfigError, config_to_dict, load_config_dict, save_config
from regulargpt.files import atomic_write_text, read_json_object, sha256_file
from regulargpt.run_files import CONFIG_FILE, MODEL_FILE
from regulargpt.train.engine import TrainError

__all__ = [
    "RESUME_FREE_KEYS",
    "default_run_dir",
    "check_or_write_config",
    "extension_config",
    "set_aside_export",
    "latest_step",
    "checkpoint_steps",
    "safe_loading",
    "write_checksums",
    "verify_checkpoint",
    "resume_step",
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

LATEST, TRAINER_STATE, CHECKSUMS = "latest", "trainer_state.json", "checksums.json"
_TAG = re.compile(r"^global_step(\d+)$")

# Keys that may change between a run and its resumption: they do not change what is trained.
RESUME_FREE_KEYS = {
    "data.path",  # the data may move (e.g. to node-local disk); its fingerprint is compared instead
    "train.log_every", "train.eval_every", "train.eval_batches", "train.save_every", "train.keep_last",
    "train.max_bad_steps", "train.activation_checkpointing", "train.dist_timeout_s", "train.compile",
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


def _saved_config(run_dir: Path) -> Config:
    path = run_dir / CONFIG_FILE
    try:
        return load_config_dict(read_json_object(path, ConfigError), source=str(path))
    except ConfigError as err:
        raise TrainError(f"{path}: cannot read the run's config ({err}); use another --run-dir") from None


def check_or_write_config(run_dir: Path, cfg: Config, write: bool = True) -> int | None:
    """Write config.resolved.json for a new run; for an existing one, fail clearly on any training-relevant change.
    → the step the run is being extended from when `cfg` is its :func:`extension_config` (else None).

    Every rank may check; only the one with ``write=True`` writes.
    """
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        if write:
            save_config(cfg, path)
        return None
    old = _saved_config(run_dir)
    before, after = _flatten(config_to_dict(old)), _flatten(config_to_dict(cfg))
    changed = [k for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)
               and k not in RESUME_FREE_KEYS and not k.startswith(_RESUME_FREE_SECTIONS)]
    extending = (set(changed) <= {"train.steps", "train.extended_from"} and cfg.train.steps > old.train.steps
                 and cfg.train.extended_from == [*old.train.extended_from, old.train.steps]
                 and latest_step(run_dir) == old.train.steps)
    if changed and not extending:
        diffs = "; ".join(f"{k}: run has {before.get(k)!r}, now {after.get(k)!r}" for k in changed[:8])
        hint = (f"; to continue the finished run to more steps pass --extend-to N (it has {old.train.steps})"
                if "train.steps" in changed else "")
        raise TrainError(f"{run_dir} holds a run with a different config ({diffs}). Resume with the same config, "
                         f"or pass a new --run-dir{hint}")
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
    if not (run_dir / CONFIG_FILE).is_file():
        raise TrainError(f"--extend-to {steps}: {run_dir} holds no run to extend (no {CONFIG_FILE}); train it first")
    saved = _saved_config(run_dir).train
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
    return read_json_object(path, TrainError, "the checkpoint is corrupt")


def write_checksums(run_dir: Path, step: int) -> None:
    """Seal global_step<step>/ (rank 0, after every rank has written its files): fsync each file and record its size
    and sha256 in ``checksums.json``, atomically. Costs one read of the checkpoint (about 1 s per GB)."""
    folder = run_dir / f"global_step{step}"
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # DeepSpeed's torch.save does not; the data must be on disk before the marker is
        finally:
            os.close(fd)
        files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    atomic_write_text(folder / CHECKSUMS, json.dumps({"step": step, "files": files}, indent=1, sort_keys=True) + "\n")


def verify_checkpoint(run_dir: Path, step: int, legacy_ok: bool = True) -> str:
    """'' when global_step<step>/ is intact, else the reason: a missing folder or file, a size or sha256 that
    differs from ``checksums.json``, an unreadable ``trainer_state.json``.

    A folder without ``checksums.json`` was written before checksums existed: accepted (``legacy_ok``) when its
    trainer state reads, since ``latest`` already guaranteed it complete.
    """
    folder = run_dir / f"global_step{step}"
    if not folder.is_dir():
        return "the folder is missing"
    marker = folder / CHECKSUMS
    if marker.is_file():
        try:
            listed = read_json_object(marker)["files"]
            expected = {name: (int(info["bytes"]), str(info["sha256"])) for name, info in listed.items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{CHECKSUMS} is unreadable"
        for name, (size, digest) in sorted(expected.items()):
            path = folder / name
            if not path.is_file():
                return f"{name} is missing"
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, {CHECKSUMS} says {size}"
            if sha256_file(path) != digest:
                return f"{name} does not match its sha256 in {CHECKSUMS}"
    elif not legacy_ok:
        return f"no {CHECKSUMS} (an interrupted save)"
    try:
        read_trainer_state(run_dir, step)
    except TrainError:
        return f"{TRAINER_STATE} is missing or unreadable"
    return ""


def _set_aside(run_dir: Path, step: int) -> str:
    """Rename a corrupt global_step<step> to global_step<step>.corrupt[N] (kept for inspection, ignored) → new name."""
    base = f"global_step{step}.corrupt"
    name, n = base, 1
    while (run_dir / name).exists():
        name, n = f"{base}{n}", n + 1
    os.replace(run_dir / f"global_step{step}", run_dir / name)
    return name


def resume_step(run_dir: Path) -> tuple[int | None, list[str]]:
    """The checkpoint a restarted run resumes from → (step or None for a fresh run, warnings). Rank 0 only.

    Normally the one ``latest`` names; folders newer than it (interrupted saves) are deleted. If it fails
    :func:`verify_checkpoint`, the newest older checkpoint that passes is used: every failed folder is renamed
    ``global_step<N>.corrupt`` and ``latest`` rewritten, and a warning names both checkpoints. Without any intact
    checkpoint: TrainError listing what is wrong with each (nothing is renamed then).
    """
    path = run_dir / LATEST
    if not path.is_file():
        return None, []
    m = _TAG.match(path.read_text().strip())
    named = int(m.group(1)) if m else None  # an unreadable `latest`: only sealed folders can be trusted
    if named is not None:
        remove_partial_checkpoints(run_dir, named)
    for leftover in run_dir.glob(".deleting-global_step*"):  # a prune killed half-way
        shutil.rmtree(leftover, ignore_errors=True)
    failed: list[tuple[int, str]] = []
    if named is not None and not (run_dir / f"global_step{named}").is_dir():
        failed.append((named, "the folder is missing"))
    chosen = None
    for step in sorted((s for s in checkpoint_steps(run_dir) if named is None or s <= named), reverse=True):
        reason = verify_checkpoint(run_dir, step, legacy_ok=named is not None)
        if not reason:
            chosen = step
            break
        failed.append((step, reason))
    problems = "; ".join(f"global_step{s}: {why}" for s, why in failed) or "no checkpoint folder"
    if chosen is None:
        raise TrainError(f"{run_dir}: no intact checkpoint to resume from ({problems}); move the run directory "
                         f"away (or delete its global_step* folders and 'latest') to start again")
    warnings = []
    for step, reason in failed:
        kept = f" (kept as {_set_aside(run_dir, step)})" if (run_dir / f"global_step{step}").is_dir() else ""
        warnings.append(f"checkpoint {run_dir}/global_step{step} is corrupt: {reason}{kept}; resuming from "
                        f"global_step{chosen} instead, the newest intact one")
    if failed or named is None:
        mark_latest(run_dir, chosen)
    return chosen, warnings


def mark_latest(run_dir: Path, step: int) -> None:
    """Make global_step<step> the checkpoint a resume starts from (atomic rename)."""
    atomic_write_text(run_dir / LATEST, f"global_step{step}")


def _delete_checkpoint(run_dir: Path, step: int) -> None:
    """Rename first (atomic), then delete: a half-deleted folder never looks like a checkpoint."""
    doomed = run_dir / f".deleting-global_step{step}"
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(run_dir / f"global_step{step}", doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def prune_checkpoints(run_dir: Path, keep: int) -> list[int]:
    """Delete complete checkpoints older than the newest `keep` (never the latest, never newer ones); → deleted."""
    last = latest_step(run_dir)
    if last is None:
        return []
    complete = [s for s in checkpoint_steps(run_dir) if s <= last]
    doomed = complete[:-keep] if keep > 0 else []
    for s in doomed:
        _delete_checkpoint(run_dir, s)
    return doomed


def remove_partial_checkpoints(run_dir: Path, last: int | None = None) -> list[int]:
    """On resume: delete checkpoint folders newer than ``latest`` (or `last`): saves that were interrupted."""
    last = latest_step(run_dir) if last is None else last
    partial = [s for s in checkpoint_steps(run_dir) if last is None or s > last]
    for s in partial:
        _delete_checkpoint(run_dir, s)
    return partial


@contextmanager
def safe_loading() -> Iterator[None]:
    """Every ``torch.load`` inside runs with ``weights_only=True`` — DeepSpeed's too, which asks for
    ``weights_only=False`` (``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` overrides the argument). Allowed besides tensors and
    plain containers: numpy's array reconstruction (RNG states) and the four plain-data DeepSpeed classes its
    checkpoints hold (loss scalers, the ZeRO stage enum, optimizer fragment addresses). Not thread-safe (it sets
    an environment variable for the duration).
    """
    try:
        from numpy._core.multiarray import _reconstruct  # numpy >= 2
    except ImportError:
        from numpy.core.multiarray import _reconstruct

    allowed: list[Any] = [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]
    try:
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        allowed += [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]
    except ImportError:
        pass
    before = os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD")
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    finally:
        if before is None:
            os.environ.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
        else:
            os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = before


# ------------------------------------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def save_rng(run_dir: Path, step: int, rank: int) -> None:
    from regulargpt.files import atomic_write

    atomic_write(run_dir / f"global_step{step}" / f"rng_rank{rank}.pt", lambda f: torch.save(rng_state(), f))


def load_rng(run_dir: Path, step: int, rank: int) -> None:
    path = run_dir / f"global_step{step}" / f"rng_rank{rank}.pt"
    if not path.is_file():
        raise TrainError(f"{path}: missing (was the run saved with another number of processes?)")
    with safe_loading():
        state = torch.load(path, weights_only=True)
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
    cfg = load_config_dict(read_json_object(cfg_path, ConfigError), source=str(cfg_path))
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
    model = build_model(cfg.model)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise TrainError(f"{run_dir}/global_step{step}: weights do not fit the config's model: {err}") from None
    trainer = read_trainer_state(run_dir, step)
    out = Path(out) if out is not None else run_dir / MODEL_FILE
    meta = {"step": step, "tokens": trainer.get("tokens", 0), "run_dir": str(run_dir),
            "checkpoint": f"global_step{step}"}
    tokenizer_sha = trainer.get("data", {}).get("tokenizer_sha256")
    if tokenizer_sha:  # evaluation and generation check their tokenizer against it (training_tokenizer_sha)
        meta["tokenizer_sha256"] = tokenizer_sha
    save_model_file(out, cfg, model, meta=meta)
    return out
