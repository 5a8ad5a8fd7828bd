"""Tables and heat maps of the probe rows (:mod:`regulargpt.evaluation.probe_sweep`) of a ``results.jsonl``: accuracy
by model × length with each model's effective context length, then length × depth per model; ``probe_<name>.png``.
Reads only rows; :func:`regulargpt.evaluation.lm_report.write_report` adds these sections to table.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from regulargpt.evaluation.plotting import pyplot
from regulargpt.evaluation.result_rows import latest_rows, variant_labels
from regulargpt.evaluation.retrieval_probes import COPY_SPAN, DISTRACTORS, effective_length
from regulargpt.files import atomic_savefig

__all__ = ["plot_probes", "probe_tables"]


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
