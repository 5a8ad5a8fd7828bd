"""Retrieval probes (:mod:`regulargpt.evaluation.retrieval_probes`) over the runs and lengths of a perplexity sweep,
as rows of the same ``results.jsonl``, and their tables and heat maps.

A probe row has the perplexity row's identity fields and ``probe`` ("passkey" or "copy"), which is the last field
of its key (:data:`regulargpt.evaluation.lm_report.ROW_KEY`: perplexity rows have ``probe`` null, so the two never
replace each other), ``probe_config`` (depths, trials, seed, distractors or span), ``by_depth`` [{depth, accuracy,
distance}] and ``accuracy`` (their mean). A row counts as done for the same weights, tokenizer and probe_config.

Effective context length (RULER's): the longest probed length at which the accuracy (mean over depths and seeds)
is ≥ the threshold (``--probe-threshold``, default 0.9) at that length and at every shorter probed length.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.data import Tokenizer
from regulargpt.evaluation.length_sweep import eval_settings
from regulargpt.evaluation.lm_report import latest_rows, variant_labels
from regulargpt.evaluation.perplexity import EvalError
from regulargpt.evaluation.plotting import pyplot
from regulargpt.evaluation.results_file import ResultsFile
from regulargpt.evaluation.retrieval_probes import (COPY_SPAN, DISTRACTORS, PROBES, effective_length, min_length,
                                                    probe_accuracy)
from regulargpt.evaluation.scored_run import RunInfo, check_compatible, load_run, open_eval_split, variant_id
from regulargpt.files import atomic_savefig

__all__ = ["DEFAULT_DEPTHS", "parse_probes", "plan_probes", "probe_tables", "plot_probes", "run_probes"]

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
                probes: Sequence[str], depth_policy: str | None = None) -> Plan:
    """Every (run, data folder, lengths) the probes will score, checked before any work: EvalError for a length a
    learned-position model cannot read (> max_positions) or one a probe does not fit in."""
    plan: Plan = []
    for run in runs:
        info = load_run(run, depth_policy=depth_policy)
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
    return {"run": info.run, "depth_policy": info.depth_override, "model": info.label, "seed": info.seed,
            "step": info.step, "weights_sha256": info.weights_sha256, "variant": variant_id(info.variant),
            "variant_config": info.variant, "dataset": dataset, "split": None, "length": length, "protocol": None,
            "stride": None, "tokens": None, "train_length": info.cfg.data.seq_len, "params": info.params,
            "probe": probe, "probe_config": config, "tokenizer_sha256": tokenizer_sha, "by_depth": by_depth,
            "accuracy": float(np.mean([d["accuracy"] for d in by_depth])), "seconds": round(seconds, 3)}


def run_probes(plan: Plan, probes: Sequence[str], split: str, out_dir: str | Path, depths: Sequence[float] = DEFAULT_DEPTHS,
               trials: int = 10, seed: int = 0, device: torch.device | str = "cpu",
               depth_policy: str | None = None) -> list[dict[str, Any]]:
    """Score every (run, folder, length, probe) of `plan` not yet in ``out_dir/results.jsonl`` → the new rows."""
    results = ResultsFile(Path(out_dir) / "results.jsonl")
    done = {(r["run"], r.get("depth_policy"), r["dataset"], r["length"], r["probe"]): r
            for r in results.rows if r.get("probe")}
    rows = []
    for run, folder, lengths in plan:
        info = load_run(run, device, depth_policy)
        data = open_eval_split(folder, split, "size")  # its tokenizer; the probes read no split tokens
        check_compatible(info, data)
        tok, dataset = Tokenizer.load(data.tokenizer_path), Path(folder).resolve().name
        for probe in probes:
            config = _probe_config(probe, depths, trials, seed)
            for length in lengths:
                old = done.get((info.run, info.depth_override, dataset, length, probe))
                if old and (old.get("weights_sha256"), old.get("probe_config"), old.get("tokenizer_sha256")) == (
                        info.weights_sha256, config, tok.sha256):
                    continue
                t0 = time.perf_counter()
                by_depth = probe_accuracy(info.model, probe, tok, length, depths, trials, seed, device)
                row = _row(info, dataset, length, probe, config, tok.sha256, by_depth, time.perf_counter() - t0)
                results.append(row)
                rows.append(row)
                print(f"{info.run} · {probe} L={length}: accuracy {row['accuracy']:.3f} ("
                      + ", ".join(f"δ={d['depth']:g}: {d['accuracy']:.2f}" for d in by_depth) + ")", flush=True)
    return rows


def _cells(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(dataset, probe) → {"models": [label], "acc": {(label, L): [accuracy per run]}, "depth": {(label, L, δ):
    [accuracy]}, "distance": {(L, δ): tokens}} over the latest probe rows."""
    latest = [r for r in latest_rows(rows) if r.get("probe")]
    labels = variant_labels(latest)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in latest:
        g = out.setdefault((r["dataset"], r["probe"]), {"models": {}, "acc": defaultdict(list),
                                                        "depth": defaultdict(list), "distance": {}})
        label = labels[r.get("variant") or r["model"]]
        g["models"].setdefault(label, None)
        g["acc"][(label, r["length"])].append(r["accuracy"])
        for d in r["by_depth"]:
            g["depth"][(label, r["length"], d["depth"])].append(d["accuracy"])
            g["distance"][(r["length"], d["depth"])] = d["distance"]
    return out


def probe_tables(rows: Sequence[dict[str, Any]], threshold: float) -> str:
    """Markdown: per (dataset, probe) accuracy by model × length (mean over depths and seeds) with the effective
    context length at `threshold`, then each model's length × depth table. Empty when there are no probe rows."""
    parts = []
    for (dataset, probe), g in _cells(rows).items():
        lengths = sorted({L for _, L in g["acc"]})
        depths = sorted({d for _, _, d in g["depth"]})
        how = (f"log-likelihood ranking of the true key against {DISTRACTORS} random keys (chance "
               f"{1 / (1 + DISTRACTORS):.2f})" if probe == "passkey"
               else f"teacher-forced next-token accuracy on the second copy of a {COPY_SPAN}-token span")
        parts += [f"## {dataset} · {probe} probe", "", f"Accuracy: {how}; mean over depths {', '.join(map(str, depths))}"
                  f" and seeds. Effective length: the longest length with accuracy >= {threshold:g} there and at "
                  f"every shorter length.", "",
                  "| model | " + " | ".join(map(str, lengths)) + " | effective length |",
                  "|---|" + "---:|" * (len(lengths) + 1)]
        for m in g["models"]:
            acc = {L: float(np.mean(g["acc"][(m, L)])) for L in lengths if g["acc"].get((m, L))}
            eff = effective_length(acc, threshold)
            parts.append(f"| {m} | " + " | ".join(f"{acc[L]:.2f}" if L in acc else "—" for L in lengths)
                         + f" | {eff if eff is not None else f'< {min(lengths)}'} |")
        for m in g["models"]:
            parts += ["", f"{m}: accuracy by length (rows) × depth (columns), with the distance in tokens from the "
                      f"{'key' if probe == 'passkey' else 'first copy'} to the end of the window", "",
                      "| length | " + " | ".join(f"δ={d:g}" for d in depths) + " |", "|---:|" + "---:|" * len(depths)]
            for L in lengths:
                parts.append(f"| {L} | " + " | ".join(
                    f"{np.mean(g['depth'][(m, L, d)]):.2f} ({g['distance'][(L, d)]})" if g["depth"].get((m, L, d))
                    else "—" for d in depths) + " |")
        parts.append("")
    return "\n".join(parts)


def plot_probes(rows: Sequence[dict[str, Any]], out_dir: str | Path) -> list[str]:
    """``probe_<name>.png`` per probe: one heat map per model (x: length, y: depth, colour: accuracy) → the names
    written (none without matplotlib)."""
    written = []
    by_probe: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
    for (dataset, probe), g in _cells(rows).items():
        by_probe[probe].append((dataset, g))
    for probe, groups in by_probe.items():
        path = Path(out_dir) / f"probe_{probe}.png"
        plt = pyplot(path)
        if plt is None:
            continue
        panels = [(dataset, g, m) for dataset, g in groups for m in g["models"]]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
        for ax, (dataset, g, m) in zip(axes[0], panels):
            lengths = sorted({L for mm, L in g["acc"] if mm == m})
            depths = sorted({d for mm, _, d in g["depth"] if mm == m})
            grid = np.array([[np.mean(g["depth"].get((m, L, d), [np.nan])) for L in lengths] for d in depths])
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
            ax.set_xticks(range(len(lengths)), [str(L) for L in lengths])
            ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
            ax.set_xlabel("length L (tokens)")
            ax.set_ylabel("depth")
            ax.set_title(f"{m} · {dataset}", fontsize=9)
        fig.colorbar(image, ax=axes[0].tolist(), label=f"{probe} accuracy")
        atomic_savefig(fig, path, dpi=130, bbox_inches="tight")
        plt.close(fig)
        written.append(path.name)
    return written
