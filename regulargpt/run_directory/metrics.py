"""Metrics files of a run directory on resume: one rule for both trainers.

``metrics.jsonl`` (and the formal trainer's ``time_to_solve.jsonl``) are append-only JSONL, one ``{"step": N, …}``
row per logged step. A run resumed from the checkpoint of step S logs steps S+1, … again, so before appending the
rows with ``step > S`` are dropped, and a last line cut short by a kill (no newline) with them
(:func:`regulargpt.files.read_jsonl` warns about it). The file is rewritten atomically, and only when something is
dropped: a fresh run or an exact resume leaves it untouched. The continued file then equals the one an
uninterrupted run writes.

    rows at steps 2, 4, 6, 8 and a torn '{"step": 1' · resume from step 5 → rows at steps 2, 4
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from regulargpt.files import atomic_write_text, read_jsonl

__all__ = ["truncate_after", "open_for_append"]


def truncate_after(path: Path, step: int) -> None:
    """Drop the rows of `path` logged after `step` (a row without ``step`` counts as step 0) and a torn last line,
    atomically; nothing happens to a file that has neither, or to a missing one."""
    if not path.is_file():
        return
    rows = read_jsonl(path)
    kept = [row for row in rows if row.get("step", 0) <= step]
    if len(kept) != len(rows) or not path.read_bytes().endswith(b"\n"):
        atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in kept))


def open_for_append(path: Path, step: int) -> TextIO:
    """`path` truncated to the rows up to `step` (:func:`truncate_after`), opened for appending rows."""
    truncate_after(path, step)
    return open(path, "a", encoding="utf-8")
