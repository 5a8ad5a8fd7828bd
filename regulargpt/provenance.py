"""The one provenance stamp every report in ``results/`` carries: command, git commit, machine and UTC date.

    >>> stamp = provenance("python eval/extrapolate.py --out results/lm")
    >>> sorted(stamp)
    ['command', 'commit', 'date', 'machine']

``commit`` is the 12-character hash of HEAD, with ``+dirty`` when tracked files have uncommitted changes (e.g.
``5737f89c1a2b+dirty``; ``unknown`` outside a git checkout). ``machine`` names the host, the CPU, the core count, the
GPU if any, torch and the thread setting, e.g. ``box (AMD EPYC 9R45, 2 cores; torch 2.13.0, OMP_NUM_THREADS=1)``.
``date`` is minutes in UTC: ``2026-11-30 18:39 UTC``.
"""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["cpu_name", "git_commit", "machine", "provenance", "utc_date"]

_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=_ROOT, capture_output=True, text=True, timeout=10,
                              check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str:
    """HEAD's 12-character hash, ``+dirty`` when tracked files outside ``results/`` changed since; ``unknown``
    outside git. Reports under results/ are what a run writes, not the code it ran: a script that regenerates
    several reports in turn would otherwise stamp all but the first ``+dirty``."""
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"):
        commit += "+dirty"
    return commit


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (e.g. ``AMD EPYC 9R45``), else what `platform` knows."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def utc_date() -> str:
    """Now, to the minute, in UTC: ``2026-11-30 18:39 UTC``."""
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine() -> str:
    """Host, CPU, cores, GPU, torch and threads: ``box (AMD EPYC 9R45, 2 cores; torch 2.13.0, OMP_NUM_THREADS=1)``."""
    import torch

    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{platform.node()} ({cpu_name()}, {os.cpu_count()} cores{gpu}; torch {torch.__version__}, "
            f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")


def provenance(command: str) -> dict[str, str]:
    """``{"command", "commit", "machine", "date"}`` for a report made by `command` (see the module docstring)."""
    return {"command": command, "commit": git_commit(), "machine": machine(), "date": utc_date()}


def stamp_lines(prov: dict[str, str]) -> list[str]:
    """The stamp as markdown bullets: ``- Command: `…```, ``- Git commit: `…```, ``- Machine: …``, ``- Date: …``."""
    return [f"- Command: `{prov['command']}`", f"- Git commit: `{prov['commit']}`", f"- Machine: {prov['machine']}",
            f"- Date: {prov['date']}"]


def report_head(title: str, prov: dict[str, str]) -> list[str]:
    """A report's first lines: ``# title``, a blank, the stamp's bullets (:func:`stamp_lines`), a blank."""
    return [f"# {title}", "", *stamp_lines(prov), ""]
