"""The resumable perplexity sweep: every (run, length) not yet in ``results.jsonl``, with skipped rows that say why.

Loads each run (:mod:`regulargpt.evaluation.scored_run`: ``model.pt``, refused when older than the run's newest
checkpoint), checks that it was trained with the evaluation data's tokenizer, plans and
scores its windows with :mod:`regulargpt.evaluation.perplexity`, and appends one row per (run, dataset, split,
length, protocol, stride, tokens), recording the step and the sha256 of the weights it scored and the split's
fingerprint (``split_fingerprint``: the manifest's sha256 and token count of the split, checked against the file
at level ``verify`` first, :mod:`regulargpt.data.verify`). A row already present for the same weights and data is
not recomputed, so a killed sweep resumes where it stopped; a row of other weights (the run was exported again
since) or of other data (the folder was rebuilt with other content; a row of older code records none) is rescored,
and one line says how many and why.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.config import ConfigError, EvalConfig
from regulargpt.config.rope_scaling import describe_rope_scaling, rope_scaling_key
from regulargpt.data import TokenSplit
from regulargpt.data.verify import DEFAULT_LEVEL
from regulargpt.evaluation.results_file import ResultsFile, is_done
from regulargpt.evaluation.scored_run import (
    RunInfo,
    check_compatible,
    load_run,
    open_eval_split,
    run_variant,
    training_tokenizer_sha,
    variant_id,
)
from regulargpt.evaluation.perplexity import (
    EvalError,
    Protocol,
    WindowPlan,
    all_reduce_sums,
    choose_batch_size,
    estimate_memory,
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
    "variant_id",
]

_NOTED: set[str] = set()  # the notes on data folders already printed (a manifest without block checksums)


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
    return {"run": info.run, "depth_policy": info.depth_override,
            "rope_scaling": rope_scaling_key(info.cfg.model.rope_scaling), "model": info.label, "seed": info.seed,
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
          depth_policy: str | None = None, verify: str = DEFAULT_LEVEL,
          rope_scaling: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Evaluate every (run, length) not already in ``out_dir/results.jsonl``; returns this sweep's rows.

    `depth_policy` scores every run (RegularGPT only) with that depth policy instead of its own; such rows are keyed
    and labelled apart from the model's own (``depth=train``); `rope_scaling` likewise rescales every run's RoPE
    (each must have position 'rope'), rows keyed by the scaling's canonical JSON (``rope_scaling``). `verify` is the
    level the split is checked at against its manifest (size, blocks or full; :mod:`regulargpt.data.verify`).

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
    data = open_eval_split(data_dir, split, verify)
    if data.note and rank == 0 and data.note not in _NOTED:  # once per process (sweep_runs calls per group)
        _NOTED.add(data.note)
        print(f"note: {data.note}", file=sys.stderr, flush=True)
    dataset = Path(data_dir).resolve().name
    counts = plan_tokens(len(data), lengths, tokens, protocol)
    scored: dict[str, tuple[str | None, str | None, str]] = {}  # run → (depth policy, scaling, weights' sha256)
    for run in runs:  # fail on a bad run before spending time on the others
        checked = load_run(run, depth_policy=depth_policy, rope_scaling=rope_scaling)
        check_compatible(checked, data)
        if checked.note and rank == 0:
            print(checked.note, file=sys.stderr, flush=True)
        scored[str(run)] = (checked.depth_override, rope_scaling_key(checked.cfg.model.rope_scaling),
                            checked.weights_sha256)
    results = ResultsFile(Path(out_dir) / "results.jsonl", repair=rank == 0)
    done = results.latest()
    before_tokens = {key[:-2] + key[-1:]: row for key, row in done.items()}  # also a row whose token count differs
    _barrier()  # every rank has read the file before rank 0 appends to it
    stride_of = {length: length if protocol == "nonoverlapping" else (stride or max(1, length // 2)) for length in lengths}
    rows: list[dict[str, Any]] = []
    already = 0
    replaced: dict[str, int] = {}  # why rows of other data are rescored → how many
    if rank == 0 and progress:
        print(_estimate(runs, lengths, counts, len(data), tokens), file=sys.stderr, flush=True)
    bar = tqdm(total=len(runs) * sum(counts.values()), desc="tokens scored", unit="tok", unit_scale=True,
               disable=rank != 0 or not progress)  # updated within each (run, length) row: rate and ETA
    for run in runs:
        info: RunInfo | None = None
        depth, scaling, weights = scored[str(run)]
        for length in lengths:
            key = (str(run).rstrip("/"), depth, scaling, dataset, split, length, protocol, stride_of[length],
                   counts[length], None)  # lm_report.ROW_KEY; probe None: a perplexity row
            if is_done(done.get(key), memory_gb, weights, data.fingerprint):
                already += 1
                bar.update(counts[length])
                continue
            old = done.get(key) or before_tokens.get(key[:-2] + key[-1:])
            if old is not None and old.get("split_fingerprint") != data.fingerprint:
                why = _other_data(old.get("split_fingerprint"), data.fingerprint)
                replaced[why] = replaced.get(why, 0) + 1
            info = info or load_run(run, device, depth_policy, rope_scaling)
            start = bar.n
            row = _evaluate_length(info, data, dataset, split, length, protocol, stride_of[length], counts[length],
                                   memory_gb, batch_size, device, rank, world, lambda n: bar.update(n * world))
            if rank == 0:
                results.append(row)
                bar.write(_describe(row))
            rows.append(row)
            bar.update(start + counts[length] - bar.n)
        del info
    bar.close()
    if already and rank == 0:
        print(f"{already} of {len(runs) * len(lengths)} (run, length) rows were already in {results.path} for the "
              f"same weights and data; not rescored", file=sys.stderr, flush=True)
    for why, count in replaced.items():
        if rank == 0:
            print(f"rescored {count} (run, length) row(s) of {results.path}: they {why}; the tables read only rows "
                  f"of {data.path}'s current content", file=sys.stderr, flush=True)
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


def sweep_runs(runs: Sequence[str | Path], data_dir: str | Path | None, split: str, out_dir: str | Path,
               overrides: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`sweep` with each run's settings taken from its saved ``eval`` section (lengths, protocol, stride,
    tokens, memory_gb), overridden by `overrides` (the command line); runs with equal settings are swept together.
    Example: a run trained with ``eval.lengths=[64, 128]`` is scored at 64 and 128 unless ``lengths`` is given.

    `data_dir` None scores each run on the folders it trained on: its ``data.path``, or every corpus of its mixture
    (``data.paths``) separately, each corpus's rows under its own ``dataset`` (the folder's name)."""
    overrides = overrides or {}
    groups: dict[tuple[EvalSettings, str], list[str | Path]] = {}
    for run in runs:
        info = load_run(run, depth_policy=kwargs.get("depth_policy"), rope_scaling=kwargs.get("rope_scaling"))
        folders = [str(data_dir)] if data_dir is not None else info.cfg.data.folders
        if not folders:
            raise EvalError(f"{run}: its config names no data folder (data.path, data.paths); pass --data DIR")
        for folder in folders:
            groups.setdefault((eval_settings(info.cfg.eval, overrides), folder), []).append(run)
    rows: list[dict[str, Any]] = []
    for (settings, folder), members in groups.items():
        rows += sweep(members, folder, split, list(settings.lengths), out_dir, protocol=settings.protocol,
                      stride=settings.stride, tokens=settings.tokens, memory_gb=settings.memory_gb, **kwargs)
    return rows


def _evaluate_length(info: RunInfo, data: TokenSplit, dataset: str, split: str, length: int, protocol: Protocol,
                     stride: int, n: int, memory_gb: float, batch_size: int, device: torch.device | str, rank: int,
                     world: int, progress: Callable[[int], object] | None = None) -> dict[str, Any]:
    cfg = info.cfg.model
    common = {"memory_gb": memory_gb, "world_size": world, "split_fingerprint": data.fingerprint,
              "data_verified": data.verified}
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
    nll_sum, counts = score_windows(info.model, data.tokens, plan.shard(rank, world), batch, device, progress)
    nll_sum, counts = all_reduce_sums(nll_sum, counts)
    return result_row(info, dataset, split, plan, protocol, nll_sum, counts, time.perf_counter() - t0,
                      batch_size=batch, **common)


def _other_data(old: dict[str, Any] | None, now: dict[str, Any]) -> str:
    """Why a stored row is of other data, e.g. "scored other content (split sha256 3f2a…, 1,200 tokens; now
    9c01…, 2,400 tokens)"."""
    if not isinstance(old, dict):
        return "record no split fingerprint (written before rows recorded the data they scored)"

    def show(fp: dict[str, Any]) -> str:
        sha = fp.get("sha256")
        return f"{sha[:12] + '…' if isinstance(sha, str) else 'no sha256'}, {fp.get('tokens'):,} tokens"

    return f"scored other content (split sha256 {show(old)}; now {show(now)})"


def _estimate(runs: Sequence[str | Path], lengths: Sequence[int], counts: dict[int, int], available: int,
              requested: int) -> str:
    """The line printed before a sweep starts: what it will score, and how to change it."""
    total = len(runs) * sum(counts.values())
    budget = (f"eval.tokens / --tokens {requested:,} per length" if requested
              else "eval.tokens / --tokens 0: the whole split at every length")
    return (f"scoring {total:,} tokens: {len(runs)} run(s) × {len(lengths)} length(s) × up to {max(counts.values()):,} "
            f"tokens ({budget}; the split has {available:,}); the bar below shows the rate and the time left")


def _describe(row: dict[str, Any]) -> str:
    depth = f" depth={row['depth_policy']}" if row.get("depth_policy") else ""
    if row.get("rope_scaling"):
        depth += f" rope={describe_rope_scaling(json.loads(row['rope_scaling']))}"
    head = (f"{row['run']}{depth} ({row['model']} seed {row['seed']}, step {row['step']}, weights "
            f"{row['weights_sha256'][:12]}) · {row['dataset']} L={row['length']}")
    if row.get("skipped"):
        return f"{head}: skipped ({row['skipped']})"
    return (f"{head}: ppl {row['ppl']:.3f} over {row['tokens']} tokens in {row['windows']} windows "
            f"({row['protocol']}, stride {row['stride']}, batch {row['batch_size']}, {row['seconds']:.1f} s)")
