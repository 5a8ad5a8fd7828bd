"""The resumable perplexity sweep: every (run, length) not yet in ``results.jsonl``, with skipped rows that say why.

Loads each run (``model.pt``, refused when older than the run's newest checkpoint:
:mod:`regulargpt.evaluation.run_weights`), checks that it was trained with the evaluation data's tokenizer, plans and
scores its windows with :mod:`regulargpt.evaluation.perplexity`, and appends one row per (run, dataset, split,
length, protocol, stride, tokens), recording the step and the sha256 of the weights it scored. A row already present
for the same weights is not recomputed, so a killed sweep resumes where it stopped; a row of other weights (the run
was exported again since) is rescored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from regulargpt.checkpoint import load_model_file
from regulargpt.config import Config, ConfigError, EvalConfig, config_to_dict
from regulargpt.data import DataError, TokenSplit, load_manifest, open_split
from regulargpt.files import read_json_object
from regulargpt.run_directory.layout import MODEL_FILE
from regulargpt.evaluation.results_file import ResultsFile, is_done
from regulargpt.evaluation.run_weights import check_fresh, weights_sha256
from regulargpt.evaluation.perplexity import (
    EvalError,
    Protocol,
    WindowPlan,
    all_reduce_sums,
    choose_batch_size,
    estimate_memory,
    model_label,
    plan_tokens,
    plan_windows,
    position_buckets,
    score_windows,
)

__all__ = [
    "ResultsFile",
    "RunInfo",
    "EvalSettings",
    "check_compatible",
    "distributed_context",
    "eval_settings",
    "load_run",
    "run_variant",
    "open_eval_split",
    "sweep",
    "sweep_runs",
    "training_tokenizer_sha",
]

# Config keys that do not change what a run is (bookkeeping, resources): left out of its variant.
_NOT_VARIANT = {"model": {"attention_memory_mb"},
                "train": {"seed", "log_every", "eval_every", "eval_batches", "save_every", "keep_last", "max_bad_steps"}}


def run_variant(cfg: Config, meta: dict[str, Any]) -> dict[str, Any]:
    """What a run is, without its seed: the resolved model and training config (dotted keys), the training length and
    dataset, and ``checkpoint_step`` when the model is not the run's final step. Runs with equal variants differ
    only in the seed and belong in one table row."""
    d = config_to_dict(cfg)
    out = {f"{section}.{k}": v for section in ("model", "train") for k, v in d[section].items()
           if k not in _NOT_VARIANT[section]}
    if not cfg.train.extended_from:  # a key added later: runs that were never extended keep their variant id
        del out["train.extended_from"]
    if not cfg.model.window:  # likewise: unwindowed runs keep the variant id they had before model.window existed
        del out["model.window"]
    out["data.seq_len"] = cfg.data.seq_len
    out["data.dataset"] = Path(cfg.data.path).name if cfg.data.path else ""
    step = meta.get("step")
    if isinstance(step, int) and step != cfg.train.steps:
        out["checkpoint_step"] = step
    return out


def variant_id(variant: dict[str, Any]) -> str:
    """A short stable id of a variant (sha1 of its canonical JSON)."""
    return hashlib.sha1(json.dumps(variant, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class RunInfo:
    """One trained model to evaluate: its key (the run path as given), config, model and what the tables show."""

    run: str
    path: Path
    cfg: Config
    model: nn.Module
    meta: dict[str, Any]
    depth_override: str | None = None  # an evaluation-time depth policy (None: the model's own)
    weights_sha256: str = ""  # run_weights.weights_sha256 of the fp32 weights as loaded
    note: str | None = None  # said once before the run is used: a named model file older than its run's newest

    @property
    def step(self) -> int | None:
        """The training step of the weights (model.pt's meta), None when the file does not record it."""
        step = self.meta.get("step")
        return step if isinstance(step, int) else None

    @property
    def label(self) -> str:
        return model_label(self.cfg.model)

    @property
    def seed(self) -> int:
        return self.cfg.train.seed

    @property
    def params(self) -> int:
        """The model's parameter count (rows report it; the memory estimate counts its fp32 weights)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def variant(self) -> dict[str, Any]:
        return run_variant(self.cfg, self.meta)


def load_run(run: str | Path, device: torch.device | str = "cpu", depth_policy: str | None = None) -> RunInfo:
    """A run directory holding model.pt, or a model.pt path → RunInfo (model in eval mode on `device`).

    `depth_policy` scores a RegularGPT with another depth policy than it was trained with (same weights); other
    architectures load with their own (their rows are keyed and labelled as without it). A run directory whose
    model.pt is older than its newest checkpoint is refused (:func:`regulargpt.evaluation.run_weights.check_fresh`).
    """
    path = Path(run)
    model_path = path / MODEL_FILE if path.is_dir() else path
    if not model_path.is_file():
        if path.is_dir() and (path / "latest").is_file():  # trained (or stopped) but not exported
            raise EvalError(f"run directory {path} has no model.pt but has checkpoints (latest: "
                            f"{(path / 'latest').read_text().strip()}); export one with "
                            f"`python launch/export.py {path}`")
        where = f"run directory {path} has no model.pt" if path.is_dir() else f"{path} does not exist"
        raise EvalError(f"{where}; train it with `python launch/pretrain.py --config FILE --run-dir {path}` first")
    try:
        cfg, model, meta = load_model_file(model_path, map_location=device,
                                           model_overrides={"depth_policy": depth_policy} if depth_policy else None,
                                           override_architectures=frozenset({"regular_gpt"}))
    except ConfigError as err:
        raise EvalError(f"{model_path}: --depth-policy {depth_policy}: {err}") from None
    if not isinstance(cfg, Config):  # a FormalConfig: a sequence classifier
        raise EvalError(f"{model_path}: a sequence classifier (head {cfg.model.head!r}), not a language model; "
                        f"perplexity and generation need a model trained by launch/pretrain.py (head 'lm')")
    note = check_fresh(path, model_path, meta)
    depth = depth_policy if cfg.model.architecture == "regular_gpt" else None
    return RunInfo(str(run).rstrip("/"), model_path, cfg, model.to(device).eval(), meta, depth,
                   weights_sha256(model.state_dict()), note)


def training_tokenizer_sha(info: RunInfo) -> tuple[str, str] | None:
    """(sha256 of the tokenizer the run trained with, where it was found), if the run recorded it.

    Read from model.pt's meta (``tokenizer_sha256``, stored at export). A model.pt exported before the hash was
    stored: the data fingerprint in the ``trainer_state.json`` of the checkpoint it was exported from, else the
    manifest of the run's ``data.path`` if that folder exists.
    """
    meta_sha = info.meta.get("tokenizer_sha256")
    if isinstance(meta_sha, str) and meta_sha:
        return meta_sha, f"{info.path} meta"
    state = info.path.parent / str(info.meta.get("checkpoint", "")) / "trainer_state.json"
    if info.meta.get("checkpoint") and state.is_file():
        sha = read_json_object(state).get("data", {}).get("tokenizer_sha256")
        if isinstance(sha, str) and sha:
            return sha, str(state)
    if info.cfg.data.path and (Path(info.cfg.data.path) / "manifest.json").is_file():
        try:
            return load_manifest(info.cfg.data.path)["tokenizer"]["sha256"], f"{info.cfg.data.path}/manifest.json"
        except DataError:
            return None
    return None


def _training_tokenizer_file(info: RunInfo) -> str:
    """Where the run's tokenizer file is: in the data folder it trained on (its data.path; a run directory holds
    none), or a description of it when that folder is not here."""
    try:
        manifest = load_manifest(info.cfg.data.path)
        return str(Path(info.cfg.data.path) / manifest["tokenizer"]["file"])
    except (DataError, KeyError, TypeError):
        return f"<the tokenizer.model of the data folder the run trained on, data.path={info.cfg.data.path!r}>"


def open_eval_split(data_dir: str | Path, split: str) -> TokenSplit:
    """Open the held-out split; EvalError (not a traceback) when the folder or split is missing or corrupt."""
    try:
        tokens = open_split(data_dir, split)
        if not tokens.tokenizer_path.is_file():
            raise EvalError(f"data folder {data_dir} has no tokenizer file {tokens.tokenizer_path.name} (listed in its "
                            f"manifest.json); re-run data_prep/prepare.py for it")
        return tokens
    except DataError as err:
        raise EvalError(str(err)) from None


def check_compatible(info: RunInfo, split: TokenSplit) -> None:
    """The run's vocabulary and tokenizer must be the data folder's; EvalError naming both otherwise."""
    vocab = info.cfg.model.vocab_size
    if vocab != split.vocab_size:
        raise EvalError(f"{info.run}: model vocab_size {vocab} does not match data folder {split.data_dir} "
                        f"(vocab_size {split.vocab_size}); evaluate on data tokenised with the run's tokenizer")
    found = training_tokenizer_sha(info)
    data_sha = split.manifest["tokenizer"]["sha256"]
    if found is not None and found[0] != data_sha:
        raise EvalError(f"{info.run}: trained with tokenizer sha256 {found[0][:12]}… ({found[1]}) but data folder "
                        f"{split.data_dir} was tokenised with {data_sha[:12]}…; prepare the evaluation data with "
                        f"`python data_prep/prepare.py --tokenizer {_training_tokenizer_file(info)} …`")
    try:
        split.check_token_range(vocab)
    except DataError as err:
        raise EvalError(str(err)) from None


def result_row(info: RunInfo, dataset: str, split: str, plan: WindowPlan, protocol: Protocol,
               nll_sum: np.ndarray, counts: np.ndarray, seconds: float, **extra: Any) -> dict[str, Any]:
    """A finished row: token-weighted mean NLL, ppl = exp(NLL), per-position octave buckets."""
    tokens = int(counts.sum())
    nll = float(nll_sum.sum() / tokens)
    return {**_row_base(info, dataset, split, plan.length, protocol, plan.stride, tokens),
            "windows": len(plan.starts), "nll": nll, "ppl": math.exp(nll),
            "per_position": position_buckets(nll_sum, counts), "seconds": round(seconds, 3), **extra}


def skipped_row(info: RunInfo, dataset: str, split: str, length: int, protocol: Protocol, stride: int, tokens: int,
                reason: str, kind: str, **extra: Any) -> dict[str, Any]:
    return {**_row_base(info, dataset, split, length, protocol, stride, tokens), "nll": None, "ppl": None,
            "skipped": reason, "skipped_for": kind, "seconds": 0.0, **extra}


def _row_base(info: RunInfo, dataset: str, split: str, length: int, protocol: Protocol, stride: int,
              tokens: int) -> dict[str, Any]:
    variant = info.variant
    return {"run": info.run, "depth_policy": info.depth_override, "model": info.label, "seed": info.seed,
            "step": info.step, "weights_sha256": info.weights_sha256,
            "variant": variant_id(variant), "variant_config": variant, "dataset": dataset, "split": split,
            "length": length, "protocol": protocol, "stride": stride, "tokens": tokens,
            "train_length": info.cfg.data.seq_len, "params": info.params}


def distributed_context() -> tuple[int, int]:
    """(rank, world size). Under torchrun/deepspeed (WORLD_SIZE > 1 in the environment) joins a gloo group."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and dist.is_available() and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def sweep(runs: Sequence[str | Path], data_dir: str | Path, split: str, lengths: Sequence[int], out_dir: str | Path,
          protocol: Protocol = "nonoverlapping", stride: int = 0, tokens: int = 0, memory_gb: float = 4.0,
          batch_size: int = 0, device: torch.device | str = "cpu", progress: bool = True,
          depth_policy: str | None = None) -> list[dict[str, Any]]:
    """Evaluate every (run, length) not already in ``out_dir/results.jsonl``; returns this sweep's rows.

    `depth_policy` scores every run (RegularGPT only) with that depth policy instead of its own; such rows are keyed
    and labelled apart from the model's own (``depth=train``).

    Every rank computes its share of the windows; rank 0 appends the reduced rows. Rows record the exact token
    count, the stride, the batch size and the memory budget. A length that cannot run gets a ``skipped`` row.
    """
    from tqdm.auto import tqdm

    if not lengths or any(length < 1 for length in lengths):
        raise EvalError(f"--lengths must be integers >= 1, got {list(lengths)}")
    if protocol == "sliding" and stride and stride > min(lengths):
        raise EvalError(f"--stride {stride} exceeds the shortest length {min(lengths)}; a window cannot advance past "
                        f"its own end (use a stride <= every length, or leave it out for L/2)")
    rank, world = distributed_context()
    data = open_eval_split(data_dir, split)
    dataset = Path(data_dir).resolve().name
    counts = plan_tokens(len(data), lengths, tokens, protocol)
    scored: dict[str, tuple[str | None, str]] = {}  # run → (depth policy it is scored with, its weights' sha256)
    for run in runs:  # fail on a bad run before spending time on the others
        checked = load_run(run, depth_policy=depth_policy)
        check_compatible(checked, data)
        if checked.note and rank == 0:
            print(checked.note, file=sys.stderr, flush=True)
        scored[str(run)] = (checked.depth_override, checked.weights_sha256)
    results = ResultsFile(Path(out_dir) / "results.jsonl", repair=rank == 0)
    done = results.latest()
    _barrier()  # every rank has read the file before rank 0 appends to it
    stride_of = {length: length if protocol == "nonoverlapping" else (stride or max(1, length // 2)) for length in lengths}
    rows: list[dict[str, Any]] = []
    already = 0
    bar = tqdm(total=len(runs) * len(lengths), desc="(run, length)", disable=rank != 0 or not progress)
    for run in runs:
        info: RunInfo | None = None
        depth, weights = scored[str(run)]
        for length in lengths:
            key = (str(run).rstrip("/"), depth, dataset, split, length, protocol, stride_of[length], counts[length])
            if is_done(done.get(key), memory_gb, weights):
                already += 1
                bar.update()
                continue
            info = info or load_run(run, device, depth_policy)
            row = _evaluate_length(info, data, dataset, split, length, protocol, stride_of[length], counts[length],
                                   memory_gb, batch_size, device, rank, world)
            if rank == 0:
                results.append(row)
                bar.write(_describe(row))
            rows.append(row)
            bar.update()
        del info
    bar.close()
    if already and rank == 0:
        print(f"{already} of {len(runs) * len(lengths)} (run, length) rows were already in {results.path} for the "
              f"same weights; not rescored", file=sys.stderr, flush=True)
    _barrier()
    return rows


@dataclass(frozen=True)
class EvalSettings:
    """How one run is scored: its config's ``eval`` section, with command-line values overriding field by field."""

    lengths: tuple[int, ...]
    protocol: Protocol
    stride: int
    tokens: int
    memory_gb: float


def eval_settings(section: EvalConfig, overrides: dict[str, Any]) -> EvalSettings:
    """The run's eval section, with every non-None entry of `overrides` (``lengths``, ``protocol``, ``stride``,
    ``tokens``, ``memory_gb``) replacing its field; the result is validated like a config section."""
    given = {k: (list(v) if k == "lengths" else v) for k, v in overrides.items() if v is not None}
    unknown = set(given) - {f.name for f in dataclasses.fields(EvalSettings)}
    if unknown:
        raise EvalError(f"unknown evaluation setting(s) {sorted(unknown)}")
    try:
        merged = dataclasses.replace(section, **given)  # validated like a config section
    except ConfigError as err:
        raise EvalError(str(err)) from None
    return EvalSettings(tuple(sorted(set(merged.lengths))), merged.protocol, merged.stride, merged.tokens,
                        merged.memory_gb)


def sweep_runs(runs: Sequence[str | Path], data_dir: str | Path, split: str, out_dir: str | Path,
               overrides: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`sweep` with each run's settings taken from its saved ``eval`` section (lengths, protocol, stride,
    tokens, memory_gb), overridden by `overrides` (the command line); runs with equal settings are swept together.
    Example: a run trained with ``eval.lengths=[64, 128]`` is scored at 64 and 128 unless ``lengths`` is given."""
    overrides = overrides or {}
    groups: dict[EvalSettings, list[str | Path]] = {}
    for run in runs:
        info = load_run(run, depth_policy=kwargs.get("depth_policy"))
        groups.setdefault(eval_settings(info.cfg.eval, overrides), []).append(run)
    rows: list[dict[str, Any]] = []
    for settings, members in groups.items():
        rows += sweep(members, data_dir, split, list(settings.lengths), out_dir, protocol=settings.protocol,
                      stride=settings.stride, tokens=settings.tokens, memory_gb=settings.memory_gb, **kwargs)
    return rows


def _evaluate_length(info: RunInfo, data: TokenSplit, dataset: str, split: str, length: int, protocol: Protocol,
                     stride: int, n: int, memory_gb: float, batch_size: int, device: torch.device | str, rank: int,
                     world: int) -> dict[str, Any]:
    cfg = info.cfg.model
    common = {"memory_gb": memory_gb, "world_size": world}
    if n == 0:
        return skipped_row(info, dataset, split, length, protocol, stride, 0,
                           f"the {split} split has {len(data)} tokens, fewer than one window of {length} + 1", "data",
                           **common)
    if cfg.position == "learned" and length > cfg.max_positions:
        return skipped_row(info, dataset, split, length, protocol, stride, n,
                           f"learned absolute positions end at max_positions={cfg.max_positions}", "positions", **common)
    plan = plan_windows(n, length, protocol, stride)
    per_rank = -(-len(plan.starts) // world)
    fits = choose_batch_size(cfg, length, memory_gb, per_rank, info.params)
    if fits == 0:
        need = estimate_memory(cfg, length, 1, info.params) / 2**30
        return skipped_row(info, dataset, split, length, protocol, stride, n,
                           f"needs ~{need:.1f} GiB for one window (budget {memory_gb:g} GiB)", "memory", **common)
    batch = min(batch_size, fits) if batch_size else fits
    t0 = time.perf_counter()
    nll_sum, counts = score_windows(info.model, data.tokens, plan.shard(rank, world), batch, device)
    nll_sum, counts = all_reduce_sums(nll_sum, counts)
    return result_row(info, dataset, split, plan, protocol, nll_sum, counts, time.perf_counter() - t0,
                      batch_size=batch, **common)


def _describe(row: dict[str, Any]) -> str:
    depth = f" depth={row['depth_policy']}" if row.get("depth_policy") else ""
    head = (f"{row['run']}{depth} ({row['model']} seed {row['seed']}, step {row['step']}, weights "
            f"{row['weights_sha256'][:12]}) · {row['dataset']} L={row['length']}")
    if row.get("skipped"):
        return f"{head}: skipped ({row['skipped']})"
    return (f"{head}: ppl {row['ppl']:.3f} over {row['tokens']} tokens in {row['windows']} windows "
            f"({row['protocol']}, stride {row['stride']}, batch {row['batch_size']}, {row['seconds']:.1f} s)")
