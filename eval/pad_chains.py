"""Accuracy of RegularGPT classifiers against the pad chain of each length (docs/FORMAL.md, "Why a seed misses").

Tree mode left-pads every depth step to a multiple of C, so at a length just above a power of C a short prefix sits
alone in the leftmost chunk and its state is combined with nothing but the learned pad for several steps in a row
(`regulargpt.evaluation.probes.pad_chain`). Training lengths 1..40 (C = 2) reach chains of at most 4, and only
T = 34 reaches 4; lengths up to 500 reach 7. If a model's "state ∘ pad" step is not an exact identity on states,
the prefix's state drifts one step further at each pad-only step, and strings whose label depends on that prefix
fail. This script measures every length 1..max on the fixed evaluation strings of `eval/formal.py range` and
groups the accuracy by pad chain, split into training and held-out lengths.

Examples::

    python eval/pad_chains.py --runs results/formal/runs/even_pairs/regular_gpt_c2/seed*_lr0.001 \\
        --out results/formal/pad_chains.md
    python eval/pad_chains.py --runs runs/formal/parity_check/regular_gpt_c2/seed0_lr0.001 --max-length 200 \\
        --samples 64 --out /tmp/pad_chains.md
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs its own checkout's code (worktrees too)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from regulargpt.checkpoint import load_model_file  # noqa: E402
from regulargpt.cli import positive_int, run  # noqa: E402
from regulargpt.config import FormalConfig  # noqa: E402
from regulargpt.evaluation.formal_scoring import held_out_score  # noqa: E402
from regulargpt.evaluation.probes import pad_chain  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.model import RegularGPTClassifier  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402
from regulargpt.tasks import make_task  # noqa: E402


def chain_rows(per_length: dict[int, float], chunk_size: int, train_max: int) -> list[dict]:
    """Per pad chain k: how many training (<= train_max) and held-out lengths have it, and their accuracies."""
    groups: dict[int, dict[str, list[float]]] = {}
    for length, accuracy in per_length.items():
        side = "train" if length <= train_max else "held_out"
        groups.setdefault(pad_chain(length, chunk_size), {"train": [], "held_out": []})[side].append(accuracy)
    rows = []
    for k, sides in sorted(groups.items()):
        row: dict = {"chain": k}
        for side, values in sides.items():
            row[f"{side}_lengths"] = len(values)
            row[f"{side}_mean"] = float(np.mean(values)) if values else None
            row[f"{side}_min"] = float(np.min(values)) if values else None
        rows.append(row)
    return rows


def _cell(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def markdown(results: list[dict], header: dict) -> str:
    lines = ["# Accuracy by pad chain (RegularGPT tree mode)", "",
             f"- command: `{header['command']}`", f"- git commit: {header['commit']}",
             f"- machine: {header['machine']}", f"- date: {header['date']}",
             f"- every length 1..{header['max_length']}, {header['samples']} fixed evaluation strings each "
             "(the strings of `eval/formal.py range`); pad chain = the longest run of depth steps in which the "
             "leftmost state, covering >= 2 symbols, meets only pads (`regulargpt.evaluation.probes.pad_chain`)", ""]
    for result in results:
        lines += [f"## {result['run']}", "",
                  f"{result['task']}, C = {result['chunk_size']}, training lengths {result['min_length']}.."
                  f"{result['train_max']}; accuracy on lengths {result['score_min_length']}..{header['max_length']}: "
                  f"**{_cell(result['held_out_accuracy'])}**", "",
                  "| pad chain | training lengths | their accuracy (mean / min) | held-out lengths | "
                  "their accuracy (mean / min) |", "|---:|---:|---|---:|---|"]
        for r in result["chains"]:
            lines.append(f"| {r['chain']} | {r['train_lengths']} | {_cell(r['train_mean'])} / {_cell(r['train_min'])} "
                         f"| {r['held_out_lengths']} | {_cell(r['held_out_mean'])} / {_cell(r['held_out_min'])} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", required=True, help="run directories holding model.pt")
    parser.add_argument("--out", required=True, type=Path, help="markdown report; a .json beside it holds the rows")
    parser.add_argument("--max-length", type=positive_int, default=500, help="evaluate lengths 1..N (default 500)")
    parser.add_argument("--samples", type=positive_int, default=128, help="strings per length (default 128)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    results = []
    for run_dir in args.runs:
        cfg, model, _ = load_model_file(Path(run_dir) / "model.pt")
        if not isinstance(model, RegularGPTClassifier) or not isinstance(cfg, FormalConfig):
            print(f"error: {run_dir} holds a {type(model).__name__}; pad chains exist in RegularGPT's tree mode only",
                  file=sys.stderr)
            return 2
        task = make_task(cfg.data.task, **cfg.data.task_options)
        per_length = {t: held_out_score(model, task, [t], args.samples)
                      for t in tqdm(range(1, args.max_length + 1), desc=str(run_dir), dynamic_ncols=True)}
        held_out = [a for t, a in per_length.items() if t >= cfg.eval.score_min_length]
        results.append({"run": str(run_dir), "task": cfg.data.task, "chunk_size": cfg.model.chunk_size,
                        "min_length": cfg.data.min_length, "train_max": cfg.data.max_length,
                        "score_min_length": cfg.eval.score_min_length,
                        "held_out_accuracy": float(np.mean(held_out)) if held_out else None,
                        "chains": chain_rows(per_length, cfg.model.chunk_size, cfg.data.max_length),
                        "per_length": {str(t): a for t, a in per_length.items()}})
        print(f"{run_dir}: lengths {cfg.eval.score_min_length}..{args.max_length} "
              f"{_cell(results[-1]['held_out_accuracy'])}")
    header = {"max_length": args.max_length, "samples": args.samples, **provenance(shlex.join(["python", *sys.argv]))}
    atomic_write_text(args.out.with_suffix(".json"), json.dumps({**header, "runs": results}, indent=1) + "\n")
    atomic_write_text(args.out, markdown(results, header))
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    run(main)
