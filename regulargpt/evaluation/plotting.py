"""matplotlib, optional: every plot of the evaluation asks :func:`pyplot` first, and without matplotlib (the GPU
machine's image has none) it gets None, draws nothing and returns, while the tables and rows beside the plot are
written as usual. One line per process says so, e.g.

    plots skipped: matplotlib is not installed (first: out/ppl_vs_length.png); tables and rows are written
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

__all__ = ["pyplot", "skipped_plots"]

_skipped: list[str] = []  # the plots not drawn in this process, for the one line and the callers' summaries


def pyplot(path: str | Path) -> ModuleType | None:
    """``matplotlib.pyplot`` on the file-only Agg backend, for the plot that goes to `path`; None (and, the first
    time in this process, one line on stderr) when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        if not _skipped:
            print(f"plots skipped: matplotlib is not installed (first: {path}); tables and rows are written",
                  file=sys.stderr)
        _skipped.append(str(path))
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def skipped_plots() -> list[str]:
    """The paths of the plots :func:`pyplot` could not draw in this process, in order."""
    return list(_skipped)
