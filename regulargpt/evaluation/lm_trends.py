"""The v3 study's answers, computed from result rows only: paired gaps between rows (equal parameters vs equal
compute, RegularGPT under ``depth_policy=train`` vs a plain local window) and the gap's trend with training tokens.

Rows are :class:`~regulargpt.evaluation.lm_findings.Summary` objects keyed (variant, depth policy). A gap is
ppl / ppl_ref − 1 per seed both rows have, then mean ± sample std (``+31.0% ± 2.0`` over 2 seeds).

The trend fits the per-seed gaps g (in %) at each budget linearly in log10 of the training tokens N by least
squares, g = a + b·log10 N, and extrapolates to `predict_at` tokens with the usual standard error of a predicted
mean, s·sqrt(1/n + (x − x̄)²/Sxx), s² = Σ residual² / (n − 2). Worked example: gaps 30, 25, 20 at N = 1e5, 1e6,
1e7 → b = −5 per decade, and at 1e8 the fit predicts 15 (exactly, residuals 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from regulargpt.evaluation.lm_findings import Summary, _ms
from regulargpt.evaluation.plotting import pyplot
from regulargpt.files import atomic_savefig

__all__ = ["GapFit", "budget_markdown", "fit_gap_trend", "gap_table", "plot_gap_vs_tokens", "plot_ppl_by_budget"]

Key = tuple[str, str]  # (variant, depth policy)


def gap_table(table: dict[Key, Summary], rows: Sequence[Key], refs: Sequence[Key], lengths: Sequence[int],
              train_length: int) -> list[str]:
    """Markdown: one line per row of `rows`, one column per (ref, length): the row's paired gap to the ref
    (> 0 = the row is worse), with the seeds it is paired over. Rows or refs without results are left out."""
    rows = [r for r in rows if r in table]
    refs = [r for r in refs if r in table]
    if not rows or not refs:
        return []
    head = [f"vs {v}{'' if p == 'adaptive' else f' ({p})'} at {L // train_length}×" for v, p in refs for L in lengths]
    lines = ["| row | depth policy | " + " | ".join(head) + " |", "|---|---|" + "---:|" * len(head)]
    for key in rows:
        cells = []
        for ref in refs:
            for length in lengths:
                gaps = table[key].paired(table[ref], length)
                cells.append(f"{_ms(gaps, pct=True, digits=1)} (n={len(gaps)})" if gaps else "—")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return lines


@dataclass(frozen=True)
class GapFit:
    """g = intercept + slope·log10(tokens), fitted to `points` (tokens, gap %); prediction at `at` tokens with its
    standard error (nan with fewer than 3 points)."""

    slope: float  # gap points per decade of training tokens
    intercept: float
    slope_se: float
    at: float
    predicted: float
    predicted_se: float
    points: int
    budgets: int


def fit_gap_trend(points: Sequence[tuple[float, float]], at: float) -> GapFit | None:
    """Least-squares fit of gap (%) on log10(tokens); None with fewer than 2 distinct budgets.

    >>> f = fit_gap_trend([(1e5, 30.0), (1e6, 25.0), (1e7, 20.0)], 1e8)
    >>> round(f.slope, 6), round(f.predicted, 6), f.predicted_se
    (-5.0, 15.0, 0.0)
    """
    x = np.log10([t for t, _ in points])
    y = np.asarray([g for _, g in points], dtype=float)
    budgets = len(set(x.tolist()))
    if budgets < 2:
        return None
    mean_x = float(x.mean())
    sxx = float(((x - mean_x) ** 2).sum())
    slope = float(((x - mean_x) * (y - y.mean())).sum() / sxx)
    intercept = float(y.mean() - slope * mean_x)
    x_at = math.log10(at)
    n = len(points)
    if n > 2:
        s = math.sqrt(float(((y - intercept - slope * x) ** 2).sum()) / (n - 2))
        slope_se = s / math.sqrt(sxx)
        predicted_se = s * math.sqrt(1 / n + (x_at - mean_x) ** 2 / sxx)
    else:
        slope_se = predicted_se = math.nan
    return GapFit(slope, intercept, slope_se, at, intercept + slope * x_at, predicted_se, n, budgets)


def _budget_rows(table: dict[Key, Summary], budgets: dict[int, str], model: str, policy: str
                 ) -> list[tuple[int, Summary]]:
    """(tokens, Summary) of `model` at each budget (row name model + suffix) that has results."""
    return [(tokens, table[(model + suffix, policy)]) for tokens, suffix in sorted(budgets.items())
            if (model + suffix, policy) in table]


def budget_markdown(table: dict[Key, Summary], budgets: dict[int, str], models: Sequence[str], reference: str,
                    train_length: int, longest: int, predict_at: int) -> list[str]:
    """Markdown: per model and budget, the paired gap to `reference` at 1× (its own adaptive depth; `train` is the
    same at 1×) and ppl(longest)/ppl(1×) under adaptive and train depth; then the fitted trend of each model's gap
    and what it predicts at `predict_at` tokens. `budgets`: training tokens → the suffix of that budget's row names
    (e.g. {409600: "_s400", 1228800: ""})."""
    multiple = longest // train_length
    lines = [f"| row | training tokens | seeds | gap to {reference} at 1× (paired) | ppl {multiple}× / 1×, adaptive | "
             f"ppl {multiple}× / 1×, train | {reference} ppl {multiple}× / 1× |", "|---|---:|---:|---:|---:|---:|---:|"]
    fits = []
    for model in models:
        points: list[tuple[float, float]] = []
        for tokens, row in _budget_rows(table, budgets, model, "adaptive"):
            ref = table.get((reference + budgets[tokens], "adaptive"))
            gaps = row.paired(ref, train_length) if ref is not None else []
            points += [(tokens, 100 * g) for g in gaps]
            trained = table.get((row.variant, "train"))
            lines.append(f"| {row.variant} | {tokens:,} | {len(row.at(train_length))} | "
                         f"{_ms(gaps, pct=True, digits=1)} | {_ms(row.ratio(train_length, longest), digits=3)} | "
                         f"{_ms(trained.ratio(train_length, longest), digits=3) if trained else '—'} | "
                         f"{_ms(ref.ratio(train_length, longest), digits=3) if ref else '—'} |")
        fit = fit_gap_trend(points, predict_at) if points else None
        if fit is not None:
            fits.append((model, fit))
    lines.append("")
    for model, fit in fits:
        se = "" if math.isnan(fit.slope_se) else f" ± {fit.slope_se:.1f}"
        pred_se = "" if math.isnan(fit.predicted_se) else f" ± {fit.predicted_se:.1f} (standard error of the fit)"
        lines.append(f"- **{model}**: the gap changes {fit.slope:+.1f}{se} points per decade of training tokens "
                     f"(gap % = {fit.intercept:.1f} {fit.slope:+.1f}·log10 N, least squares over {fit.points} "
                     f"per-seed gaps at {fit.budgets} budgets); at {fit.at:,.0f} tokens it predicts "
                     f"{fit.predicted:+.1f}%{pred_se}.")
    if fits:
        lines.append("- **How far to trust the prediction**: a straight line in log(tokens) through "
                     f"{max(f.budgets for _, f in fits)} budgets within one decade, extrapolated past the largest; "
                     "the form is an assumption (a gap in % cannot fall below −100%, and both models approach their "
                     "capacity as tokens grow), and with 1–2 seeds per budget the standard error above is itself "
                     "rough. Read the sign of the slope, not the predicted value.")
    return lines


def plot_gap_vs_tokens(table: dict[Key, Summary], budgets: dict[int, str], models: Sequence[str], reference: str,
                       train_length: int, predict_at: int, path: str | Path) -> None:
    """Per-seed gaps to `reference` at 1× against training tokens (log x), their means, and each fitted line
    extended (dashed) to `predict_at`."""
    plt = pyplot(path)
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for model in models:
        points = []
        for tokens, row in _budget_rows(table, budgets, model, "adaptive"):
            ref = table.get((reference + budgets[tokens], "adaptive"))
            points += [(tokens, 100 * g) for g in (row.paired(ref, train_length) if ref is not None else [])]
        if not points:
            continue
        xs = sorted({t for t, _ in points})
        means = [float(np.mean([g for t, g in points if t == x])) for x in xs]
        (line,) = ax.plot(xs, means, marker="o", label=model)
        ax.scatter([t for t, _ in points], [g for _, g in points], color=line.get_color(), s=12, alpha=0.5)
        fit = fit_gap_trend(points, predict_at)
        if fit is not None:
            grid = np.logspace(math.log10(xs[0]), math.log10(predict_at), 20)
            ax.plot(grid, fit.intercept + fit.slope * np.log10(grid), "--", color=line.get_color(), linewidth=1)
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel(f"ppl gap to {reference} at 1× (%)")
    ax.set_title("RegularGPT's gap to ALiBi as training grows (dashed: log-linear fit)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    atomic_savefig(fig, Path(path), dpi=130, bbox_inches="tight")
    plt.close(fig)


def plot_ppl_by_budget(table: dict[Key, Summary], budgets: dict[int, str], models: Sequence[str],
                       lengths: Sequence[int], path: str | Path) -> None:
    """One panel per budget: mean ppl against evaluation length for every (model, depth policy) at that budget."""
    plt = pyplot(path)
    if plt is None:
        return
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, len(budgets), figsize=(5 * len(budgets), 4.2), squeeze=False, sharey=True)
    for ax, (tokens, suffix) in zip(axes[0], sorted(budgets.items())):
        for (variant, policy), row in sorted(table.items()):
            if variant not in {m + suffix for m in models}:
                continue
            xs = [L for L in lengths if row.at(L)]
            if xs:
                ax.plot(xs, [float(np.mean(row.at(L))) for L in xs], marker="o",
                        label=f"{variant} {policy}" + (f" ({len(row.at(xs[0]))} seeds)" if row.at(xs[0]) else ""))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(list(lengths), [str(L) for L in lengths])
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 60, not 6×10^1
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("evaluation length L (tokens)")
        ax.set_title(f"{tokens:,} training tokens")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("perplexity")
    atomic_savefig(fig, Path(path), dpi=130, bbox_inches="tight")
    plt.close(fig)
