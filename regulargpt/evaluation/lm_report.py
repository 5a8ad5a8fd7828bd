"""Tables and plots from perplexity rows (``results.jsonl`` of :mod:`regulargpt.evaluation.length_sweep`).

Reads only the rows: nothing here runs a model. A table row is one *variant*: runs whose resolved model and training
configs are equal except for the seed (``variant`` in each result row, with the config it hashes in
``variant_config``). Variants that share a display name are told apart by what differs between them, e.g.
``RegularGPT C4 K4 pad=mask depth=train``; a checkpoint that is not the run's last step adds ``step=N``. For every
(dataset, split, protocol) group:

* ``table.md``: rows = variants, columns = lengths, mean ± std (sample std, n − 1) of ppl over seeds, the best mean
  per column in bold, the exact token count per length, and the command, git commit, machine and date on top;
* ``ppl_vs_length.png``: log2 x axis, log y axis, one line per model (mean over seeds) and a min–max seed band;
* ``loss_vs_position.png``: one panel per model, mean NLL per octave of window position, one line per length.

The plots need matplotlib; without it they are skipped with one line and the table is written all the same.

Example::

    rows = load_rows("results/lm/results.jsonl")
    write_report(rows, "results/lm", command="python eval/extrapolate.py ...")
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from regulargpt.evaluation.plotting import pyplot, skipped_plots
from regulargpt.evaluation.probe_report import plot_probes, probe_tables
from regulargpt.evaluation.result_rows import ROW_KEY, Row, latest_rows, load_rows, row_key, variant_id_of, variant_labels
from regulargpt.files import atomic_savefig, atomic_write_text
from regulargpt.provenance import provenance, report_head

__all__ = [
    "ROW_KEY",
    "aggregate",
    "console_tables",
    "latest_rows",
    "row_key",
    "variant_labels",
    "load_rows",
    "markdown_table",
    "plot_loss_vs_position",
    "plot_ppl_vs_length",
    "provenance",  # re-exported from regulargpt.provenance for the scripts that import it from here
    "write_report",
]

def aggregate(rows: Sequence[Row]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Group → {"lengths", "models" (variant labels, first-seen order), "cells" {(label, L): [ppl per run]},
    "seeds" (distinct seeds per label), "runs", "skipped", "tokens", "stride", "train_length", "params"} over the
    latest rows; rows are keyed by variant (see :func:`variant_labels`), never by the model name alone."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    latest = latest_rows(rows)
    labels = variant_labels(latest)
    for row in latest:
        if row.get("probe"):  # probe rows have their own tables (regulargpt.evaluation.probe_sweep)
            continue
        g = groups.setdefault((row["dataset"], row["split"], row["protocol"]), {
            "lengths": set(), "models": {}, "cells": defaultdict(list), "skipped": {}, "tokens": {}, "stride": {},
            "train_length": set(), "params": defaultdict(set), "seeds": defaultdict(set), "runs": defaultdict(set)})
        model, length = labels[variant_id_of(row)], row["length"]
        g["runs"][model].add(row["run"])
        g["lengths"].add(length)
        g["models"].setdefault(model, None)
        g["train_length"].add(row.get("train_length"))
        g["params"][model].add(row.get("params"))
        g["stride"][length] = row["stride"]
        if row.get("skipped"):
            g["skipped"][(model, length)] = row["skipped"]
            continue
        g["cells"][(model, length)].append(row["ppl"])
        g["seeds"][model].add(row["seed"])
        g["tokens"][length] = row["tokens"]
    for g in groups.values():
        g["lengths"] = sorted(g["lengths"])
        g["models"] = list(g["models"])
    return groups


def _fmt(values: list[float]) -> str:
    mean = float(np.mean(values))
    digits = 2 if mean < 1000 else 0
    if len(values) < 2:
        return f"{mean:,.{digits}f}"
    return f"{mean:,.{digits}f} ± {float(np.std(values, ddof=1)):,.{digits}f}"


def markdown_table(group: dict[str, Any]) -> str:
    """One group's table (see the module docstring), with footnotes for skipped cells."""
    lengths, models = group["lengths"], group["models"]
    train = {t for t in group["train_length"] if t}
    train_len = next(iter(train)) if len(train) == 1 else None
    heads = [f"{L} ({L / train_len:g}×)" if train_len else str(L) for L in lengths]
    lines = ["| model | params | seeds | " + " | ".join(heads) + " |", "|---|---:|---:|" + "---:|" * len(lengths)]
    best = {L: min((np.mean(group["cells"][(m, L)]) for m in models if group["cells"].get((m, L))), default=None)
            for L in lengths}
    notes: dict[str, int] = {}
    for m in models:
        cells = []
        for L in lengths:
            values = group["cells"].get((m, L))
            if values:
                text = _fmt(values)
                cells.append(f"**{text}**" if np.mean(values) == best[L] and len(models) > 1 else text)
            elif (m, L) in group["skipped"]:
                mark = notes.setdefault(group["skipped"][(m, L)], len(notes) + 1)
                cells.append(f"skipped [{mark}]")
            else:
                cells.append("—")
        params = "/".join(f"{p / 1e6:.3f}M" for p in sorted(p for p in group["params"][m] if p))
        lines.append(f"| {m} | {params} | {len(group['seeds'][m])} | " + " | ".join(cells) + " |")
    tokens = group["tokens"]
    if tokens and len(set(tokens.values())) == 1:
        lines.append(f"\nEvery length scores the same {next(iter(tokens.values())):,} tokens.")
    elif tokens:
        lines.append("\nTokens scored per length: " + ", ".join(f"{L}: {tokens[L]:,}" for L in sorted(tokens)) + ".")
    for reason, mark in notes.items():
        lines.append(f"\n[{mark}] skipped: {reason}")
    return "\n".join(lines)


def write_report(rows: Sequence[Row], out_dir: str | Path, command: str, title: str = "Perplexity vs evaluation length",
                 extra: str = "", probe_threshold: float = 0.9) -> list[str]:
    """Write table.md, ppl_vs_length.png and loss_vs_position.png into `out_dir` from the rows → the names written
    (the plots only with matplotlib installed: `regulargpt.evaluation.plotting`); probe rows add their sections
    (effective length at `probe_threshold`) and probe_<name>.png (:mod:`regulargpt.evaluation.probe_report`)."""
    out_dir = Path(out_dir)
    prov = provenance(command)
    groups = aggregate(rows)
    parts = report_head(title, prov)
    if extra:
        parts += [extra, ""]
    for (dataset, split, protocol), g in groups.items():
        strides = sorted(set(g["stride"].values()))
        how = ("non-overlapping windows (every token of every window scored)" if protocol == "nonoverlapping"
               else "sliding windows, stride " + ("L/2" if all(g["stride"][L] == max(1, L // 2) for L in g["lengths"])
                                                  else ", ".join(map(str, strides))))
        intro = (f"Perplexity (exp of the mean token NLL), {how}; mean ± sample std over seeds; best mean per "
                 f"length in bold. Column headers: evaluation length (multiple of the training length).")
        parts += [f"## {dataset} · {split} split · {protocol}", "", intro, "", markdown_table(g), ""]
    parts.append(probe_tables(rows, probe_threshold))
    atomic_write_text(out_dir / "table.md", "\n".join(parts).rstrip() + "\n")
    plots = [out_dir / "ppl_vs_length.png", out_dir / "loss_vs_position.png"]
    plot_ppl_vs_length(rows, plots[0])
    plot_loss_vs_position(rows, plots[1])
    return ["table.md", *(path.name for path in plots if str(path) not in skipped_plots()), *plot_probes(rows, out_dir)]


def console_tables(rows: Sequence[Row]) -> str:
    """The tables of table.md without its provenance and plots, for the console at the end of a sweep: one
    ``dataset · split · protocol`` heading and :func:`markdown_table` per group."""
    return "\n\n".join(f"{dataset} · {split} split · {protocol} (perplexity, mean ± std over seeds)\n"
                       + markdown_table(g) for (dataset, split, protocol), g in aggregate(rows).items())


def _save(fig: Any, path: Path) -> None:
    atomic_savefig(fig, path, dpi=130, bbox_inches="tight")


def _plain_ticks(ax: Any, lengths: list[int]) -> None:
    """Tick labels as plain numbers: the evaluation lengths on x, %g on a log y axis (not 2^k or a×10^b)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xticks(lengths, [str(L) for L in lengths])
    ax.xaxis.set_minor_formatter(NullFormatter())
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)


def plot_ppl_vs_length(rows: Sequence[Row], path: str | Path) -> None:
    """Mean ppl per model against length (log2 x, log y), min–max over seeds as a band; one panel per group."""
    plt = pyplot(path)
    if plt is None:
        return
    groups = aggregate(rows)
    fig, axes = plt.subplots(1, max(1, len(groups)), figsize=(6.5 * max(1, len(groups)), 4.5), squeeze=False)
    for ax, ((dataset, split, protocol), g) in zip(axes[0], groups.items()):
        for m in g["models"]:
            xs = [L for L in g["lengths"] if g["cells"].get((m, L))]
            if not xs:
                continue
            vals = [g["cells"][(m, L)] for L in xs]
            mean = [float(np.mean(v)) for v in vals]
            (line,) = ax.plot(xs, mean, marker="o", label=m)
            if any(len(v) > 1 for v in vals):
                ax.fill_between(xs, [min(v) for v in vals], [max(v) for v in vals], color=line.get_color(), alpha=0.2)
        for t in sorted(t for t in g["train_length"] if t):
            ax.axvline(t, color="grey", linestyle="--", linewidth=1, label=f"training length {t}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_ticks(ax, g["lengths"])
        ax.set_xlabel("evaluation length L (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{dataset} ({split}, {protocol})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    _save(fig, Path(path))
    plt.close(fig)


def _position_curves(rows: Sequence[Row], group: tuple[str, str, str],
                     min_tokens: int = 64) -> dict[str, dict[int, tuple[list, list]]]:
    """model → length → (bucket centres, token-weighted mean NLL over seeds), leaving out buckets with fewer than
    `min_tokens` tokens (the first octaves of a long window hold one token per window: noise, not a curve)."""
    acc: dict[str, dict[int, dict[tuple[int, int], list[float]]]] = defaultdict(lambda: defaultdict(dict))
    latest = latest_rows(rows)
    labels = variant_labels(latest)
    for row in latest:
        if (row["dataset"], row["split"], row["protocol"]) != group or row.get("skipped") or row.get("probe"):
            continue
        for b in row.get("per_position", []):
            s = acc[labels[variant_id_of(row)]][row["length"]].setdefault((b["start"], b["end"]), [0.0, 0])
            s[0] += b["nll"] * b["tokens"]
            s[1] += b["tokens"]
    out: dict[str, dict[int, tuple[list, list]]] = {}
    for model, by_len in acc.items():
        out[model] = {}
        for length, buckets in sorted(by_len.items()):
            keys = sorted(k for k, (_, n) in buckets.items() if n >= min_tokens)
            centres = [math.sqrt(max(a, 0.5) * max(e - 1, 0.5)) if e - a > 1 else max(a, 0.5) for a, e in keys]
            out[model][length] = (centres, [buckets[k][0] / buckets[k][1] for k in keys])
    return out


def plot_loss_vs_position(rows: Sequence[Row], path: str | Path) -> None:
    """Per model, mean NLL per octave of window position (octaves with >= 64 scored tokens), one line per evaluation
    length: where a model breaks."""
    plt = pyplot(path)
    if plt is None:
        return
    groups = list(aggregate(rows).items())
    curves = [(key, g, _position_curves(rows, key)) for key, g in groups]
    ncols = max(1, max((len(g["models"]) for _, g in groups), default=1))
    ncols = min(ncols, 4)
    nrows = sum(-(-len(g["models"]) // ncols) for _, g in groups) or 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows), squeeze=False, sharey="row",
                             layout="constrained")
    cmap = plt.get_cmap("viridis")
    r = 0
    for key, g, by_model in curves:
        for i, model in enumerate(g["models"]):
            ax = axes[r + i // ncols][i % ncols]
            lengths = sorted(by_model.get(model, {}))
            for j, length in enumerate(lengths):
                xs, ys = by_model[model][length]
                ax.plot(xs, ys, marker=".", color=cmap(j / max(1, len(lengths) - 1)), label=f"L={length}")
            for t in sorted(t for t in g["train_length"] if t):
                ax.axvline(t, color="grey", linestyle="--", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_title(f"{model} · {key[0]}", fontsize=9)
            ax.set_xlabel("position in window")
            ax.set_ylabel("mean NLL (nats)")
            ax.grid(True, alpha=0.3)
            if lengths:
                ax.legend(fontsize=6)
        used = len(g["models"])
        for i in range(used, -(-used // ncols) * ncols):
            axes[r + i // ncols][i % ncols].axis("off")
        r += -(-used // ncols)
    _save(fig, Path(path))
    plt.close(fig)
