"""Retrieval probes (:mod:`regulargpt.evaluation.retrieval_probes`) over the runs and lengths of a perplexity sweep,
as rows of the same ``results.jsonl`` (their tables and heat maps: :mod:`regulargpt.evaluation.probe_report`).

A probe row has the perplexity row's identity fields and ``probe`` ("passkey" or "copy"), which is the last field
of its key (:data:`regulargpt.evaluation.result_rows.ROW_KEY`: perplexity rows have ``probe`` null, so the two never
replace each other; a RoPE scaling at evaluation, ``--rope-scaling``, keys the row by its canonical JSON in
``rope_scaling`` as it keys perplexity rows), ``probe_config`` (depths, trials, seed, distractors or span), ``by_depth`` [{depth, accuracy,
distance}] and ``accuracy`` (their mean). A row counts as done for the same weights, tokenizer and probe_config.

Effective context length (RULER's): the longest probed length at which the accuracy (mean over depths and seeds)
is ≥ the threshold (``--probe-threshold``, default 0.9) at that length and at every shorter probed length.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.config.rope_scaling import describe_rope_scaling, rope_scaling_key
from regulargpt.data import Tokenizer
from regulargpt.evaluation.length_sweep import eval_settings
from regulargpt.evaluation.perplexity import EvalError
from regulargpt.evaluation.results_file import ResultsFile
from regulargpt.evaluation.retrieval_probes import COPY_SPAN, DISTRACTORS, PROBES, min_length, probe_accuracy
from regulargpt.evaluation.scored_run import RunInfo, check_compatible, load_run, open_eval_split, variant_id

__all__ = ["DEFAULT_DEPTHS", "parse_probes", "plan_probes", "run_probes"]

DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
Plan = list[tuple[str | Path, str, tuple[int, ...]]]  # (run, data folder, lengths)


def parse_probes(values: Sequence[str] | None) -> list[str]:
    """``--probe passkey --probe copy`` or ``--probe passkey,copy`` → ["passkey", "copy"]; EvalError naming an
    unknown one and the accepted names."""
    names = list(dict.fromkeys(n.strip() for v in values or [] for n in v.split(",") if n.strip()))
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        raise EvalError(f"--probe {', '.join(unknown)}: unknown probe; accepted: {', '.join(PROBES)}")
    return names


def plan_probes(runs: Sequence[str | Path], data_dir: str | Path | None, split: str, overrides: dict[str, Any],
                probes: Sequence[str], depth_policy: str | None = None,
                rope_scaling: dict[str, Any] | None = None) -> Plan:
    """Every (run, data folder, lengths) the probes will score, checked before any work: EvalError for a length a
    learned-position model cannot read (> max_positions), one a probe does not fit in, or a `rope_scaling` on a
    run without RoPE."""
    plan: Plan = []
    for run in runs:
        info = load_run(run, depth_policy=depth_policy, rope_scaling=rope_scaling)
        lengths = eval_settings(info.cfg.eval, overrides).lengths
        model = info.cfg.model
        if model.position == "learned" and max(lengths) > model.max_positions:
            too_long = [n for n in lengths if n > model.max_positions]
            raise EvalError(f"--probe: {run} has learned absolute positions up to max_positions={model.max_positions}"
                            f"; it cannot read probe length(s) {', '.join(map(str, too_long))}: pass --lengths up "
                            f"to {model.max_positions}, or probe that run separately")
        for folder in [str(data_dir)] if data_dir is not None else info.cfg.data.folders:
            tok = Tokenizer.load(open_eval_split(folder, split, "size").tokenizer_path)
            for probe in probes:
                shortest = min_length(probe, tok)
                if min(lengths) < shortest:
                    raise EvalError(f"--probe {probe}: length {min(lengths)} is too short (the probe needs >= "
                                    f"{shortest} tokens with {folder}'s tokenizer); pass --lengths of at least "
                                    f"{shortest}")
            plan.append((run, folder, lengths))
    return plan


def _probe_config(probe: str, depths: Sequence[float], trials: int, seed: int) -> dict[str, Any]:
    extra = {"distractors": DISTRACTORS} if probe == "passkey" else {"span": COPY_SPAN}
    return {"depths": list(depths), "trials": trials, "seed": seed, **extra}


def _row(info: RunInfo, dataset: str, length: int, probe: str, config: dict[str, Any], tokenizer_sha: str,
         by_depth: list[dict[str, float]], seconds: float) -> dict[str, Any]:
    return {"run": info.run, "depth_policy": info.depth_override,
            "rope_scaling": rope_scaling_key(info.cfg.model.rope_scaling), "model": info.label, "seed": info.seed,
            "step": info.step, "weights_sha256": info.weights_sha256, "variant": variant_id(info.variant),
            "variant_config": info.variant, "dataset": dataset, "split": None, "length": length, "protocol": None,
            "stride": None, "tokens": None, "train_length": info.cfg.data.seq_len, "params": info.params,
            "probe": probe, "probe_config": config, "tokenizer_sha256": tokenizer_sha, "by_depth": by_depth,
            "accuracy": float(np.mean([d["accuracy"] for d in by_depth])), "seconds": round(seconds, 3)}


def run_probes(plan: Plan, probes: Sequence[str], split: str, out_dir: str | Path, depths: Sequence[float] = DEFAULT_DEPTHS,
               trials: int = 10, seed: int = 0, device: torch.device | str = "cpu",
               depth_policy: str | None = None, rope_scaling: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Score every (run, folder, length, probe) of `plan` not yet in ``out_dir/results.jsonl`` → the new rows; with
    `rope_scaling` every run's RoPE is rescaled (as :func:`regulargpt.evaluation.length_sweep.sweep_runs` does)."""
    results = ResultsFile(Path(out_dir) / "results.jsonl")
    done = {(r["run"], r.get("depth_policy"), r.get("rope_scaling"), r["dataset"], r["length"], r["probe"]): r
            for r in results.rows if r.get("probe")}
    rows = []
    for run, folder, lengths in plan:
        info = load_run(run, device, depth_policy, rope_scaling)
        scaling = rope_scaling_key(info.cfg.model.rope_scaling)
        data = open_eval_split(folder, split, "size")  # its tokenizer; the probes read no split tokens
        check_compatible(info, data)
        tok, dataset = Tokenizer.load(data.tokenizer_path), Path(folder).resolve().name
        for probe in probes:
            config = _probe_config(probe, depths, trials, seed)
            for length in lengths:
                old = done.get((info.run, info.depth_override, scaling, dataset, length, probe))
                if old and (old.get("weights_sha256"), old.get("probe_config"), old.get("tokenizer_sha256")) == (
                        info.weights_sha256, config, tok.sha256):
                    continue
                t0 = time.perf_counter()
                by_depth = probe_accuracy(info.model, probe, tok, length, depths, trials, seed, device)
                row = _row(info, dataset, length, probe, config, tok.sha256, by_depth, time.perf_counter() - t0)
                results.append(row)
                rows.append(row)
                rope = f" · rope={describe_rope_scaling(info.cfg.model.rope_scaling)}" if scaling else ""
                print(f"{info.run}{rope} · {probe} L={length}: accuracy {row['accuracy']:.3f} ("
                      + ", ".join(f"δ={d['depth']:g}: {d['accuracy']:.2f}" for d in by_depth) + ")", flush=True)
    return rows
