"""The report of a long formal-language run: held-out accuracy (or, for a pilot, the fit on the training lengths)
against training steps, one curve per seed.

Input: per seed, the rows of the run's ``time_to_solve.jsonl`` ({"step", "seconds", "cpu_seconds", "score"}, one
per check; written by :class:`~regulargpt.train.formal_trainer.SolveCheck` without changing training). Output:
markdown with one table row per reported step and one column per curve, a "where it stands" line per curve, and a
PNG of the curves. Curves are keyed by their label, in the order given: ``"seed 0"``, or ``"seed 0, lr 0.003"`` when
several learning rates are piloted.

Worked example: curves {"seed 0": [(500, 0.21), (1000, 0.35)], "seed 1": [(500, 0.20)]} with every_row=500 gives
the rows ``| 500 | 0.210 | 0.200 |`` and ``| 1000 | 0.350 | … |`` (seed 1 has not reached step 1000 yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regulargpt.evaluation.plotting import pyplot
from regulargpt.files import atomic_savefig

__all__ = ["curve_table", "standing_lines", "plot_curves"]


def curve_table(curves: dict[str, list[dict[str, Any]]], every_row: int) -> list[str]:
    """Markdown table: one row per multiple of `every_row` that any curve has reached, one column per curve
    (held-out score at that step, "…" where that curve has not got there yet)."""
    seeds = list(curves)
    scores = {s: {r["step"]: r["score"] for r in rows} for s, rows in curves.items()}
    steps = sorted({step for rows in scores.values() for step in rows if step % every_row == 0})
    lines = ["| step | " + " | ".join(seeds) + " |", "|---:|" + "---:|" * len(seeds)]
    for step in steps:
        cells = [f"{scores[s][step]:.3f}" if step in scores[s] else "…" for s in seeds]
        lines.append(f"| {step:,} | " + " | ".join(cells) + " |")
    return lines


def standing_lines(curves: dict[str, list[dict[str, Any]]], target: int, measure: str = "held-out score") -> list[str]:
    """Per curve: steps trained of `target`, the latest and the best score (`measure` names it: the held-out score,
    or the fit on the training lengths of a pilot), training time so far."""
    lines = []
    for label, rows in curves.items():
        if not rows:
            lines.append(f"- {label}: not started")
            continue
        best = max(rows, key=lambda r: r["score"])
        last = rows[-1]
        lines.append(f"- {label}: step {last['step']:,} of {target:,}; {measure} {last['score']:.3f} now, "
                     f"best {best['score']:.3f} (step {best['step']:,}); {last['seconds'] / 60:.1f} min of training "
                     f"(wall, checks excluded)")
    return lines


def plot_curves(curves: dict[str, list[dict[str, Any]]], path: Path, title: str,
                ylabel: str = "held-out accuracy (lengths 41–500)") -> None:
    """The checked score against steps, one line per curve, 0.99 marked; written atomically as PNG."""
    plt = pyplot(path)
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in curves.items():
        ax.plot([r["step"] for r in rows], [r["score"] for r in rows], marker=".", label=label)
    ax.axhline(0.99, color="grey", linestyle="--", linewidth=0.8, label="0.99")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(loc="lower right")
    atomic_savefig(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)
