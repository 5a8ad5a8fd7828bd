"""The perplexity sweep's ``results.jsonl``: append-only rows, and which stored row still counts as done.

A row counts as done for the same (run, depth policy, dataset, split, length, protocol, stride, tokens) key
(:func:`regulargpt.evaluation.lm_report.row_key`) when it scored the same weights (``weights_sha256``), the same
data (``split_fingerprint``: the manifest's sha256 and token count of the split) and was not skipped for memory
under a smaller budget than now; anything else is scored again and the new row, appended last, is the one the
tables read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from regulargpt.evaluation.result_rows import row_key
from regulargpt.files import read_jsonl
from regulargpt.write_errors import explain_write_error

__all__ = ["ResultsFile", "is_done"]


class ResultsFile:
    """Append-only JSONL of result rows. Each append is one line, flushed and fsynced; opening the file reads it with
    :func:`regulargpt.files.read_jsonl` (a partial last line left by a crash is dropped and, with ``repair``, cut off
    so the next append starts on a clean line; any other bad line is an error)."""

    def __init__(self, path: str | Path, repair: bool = True) -> None:
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = read_jsonl(self.path, repair=repair)

    def latest(self) -> dict[tuple[Any, ...], dict[str, Any]]:
        """The last row written for every key."""
        return {row_key(r): r for r in self.rows}

    def append(self, row: dict[str, Any]) -> None:
        """Append `row` as one fsynced line; a failed write is one WriteError line (regulargpt.write_errors; a partly
        written line is the torn tail the next open cuts off)."""
        line = (json.dumps(row, sort_keys=True) + "\n").encode()
        with explain_write_error(self.path, "a result row to", len(line)):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        self.rows.append(row)


def is_done(row: dict[str, Any] | None, memory_gb: float, weights: str = "",
            split_fingerprint: dict[str, Any] | None = None) -> bool:
    """A stored row counts as done unless it scored other weights than `weights` (rows written before the hash was
    recorded count as the same weights), other data than `split_fingerprint` (a row without one, written before it
    was recorded, counts as other data: the folder may have been rebuilt since) or was skipped for memory under a
    smaller budget than now."""
    if row is None or (weights and row.get("weights_sha256", weights) != weights):
        return False
    if split_fingerprint is not None and row.get("split_fingerprint") != split_fingerprint:
        return False
    if row.get("skipped") and row.get("skipped_for") == "memory":
        return float(row.get("memory_gb", 0.0)) >= memory_gb
    return True
