"""What a rewrite of a committed report table changes: nothing (then the files are left byte-identical), or which
runs were added or dropped and which cells moved.

A table is a markdown file and its JSON (``payload``) written together; both carry a provenance stamp (command,
commit, machine, date) that differs at every aggregation. Two tables are *the same* when they are equal without it.
Example, table 1 aggregated again after one more seed of D_3 finished::

    describe_changes(old, new)
    # → "1 run added (dyck_3/regular_gpt_c2/seed2_lr0.001); 1 cell changed: dyck_3 regular_gpt_c2 max 1 → 1,
    #    mean 0.877 → 0.918, runs 2 → 3"
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regulargpt.experiments.formal_records import RunRecord

__all__ = ["describe_changes", "read_table", "same_apart_from_provenance"]

# The markdown lines of the stamp (formal_table_text.header_lines): the only lines that change when nothing else does.
_STAMP_PREFIXES = ("- Command:", "- Commit:", "- Machine:", "- Date:")


def _without_stamp(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if not line.startswith(_STAMP_PREFIXES)]


def _canonical(payload: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in payload.items() if k != "provenance"}, sort_keys=True)


def read_table(json_path: Path) -> dict[str, Any] | None:
    """The payload of an existing table JSON, or None when there is none (or it does not parse)."""
    try:
        payload = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def same_apart_from_provenance(md_path: Path, old: dict[str, Any] | None, markdown: str,
                               payload: dict[str, Any]) -> bool:
    """True when the table at `md_path` (with JSON payload `old`) equals `markdown` / `payload` but for the stamp."""
    if old is None or not md_path.is_file():
        return False
    return _canonical(old) == _canonical(json.loads(json.dumps(payload))) and \
        _without_stamp(md_path.read_text()) == _without_stamp(markdown)


def _run_names(payload: dict[str, Any]) -> set[str]:
    return {RunRecord.from_json(raw, "table JSON").name for raw in payload.get("runs", [])}


def _cells(tree: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], dict[str, Any]]:
    """Every table cell (a dict with "max") of a nested table, by its path of keys."""
    if not isinstance(tree, dict):
        return {}
    if "max" in tree:
        return {path: tree}
    return {k: v for key, sub in tree.items() for k, v in _cells(sub, (*path, str(key))).items()}


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _cell_change(old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    if old is None or new is None:
        return "added" if old is None else "removed"
    return ", ".join(f"{label} {_fmt(old.get(key))} → {_fmt(new.get(key))}"
                     for key, label in (("max", "max"), ("mean", "mean"), ("n", "runs")))


def describe_changes(old: dict[str, Any] | None, new: dict[str, Any]) -> str:
    """One line: the runs added and dropped (table 1's run records) and the cells whose max, mean or run count
    changed; "a new table" without an old one."""
    if old is None:
        return "a new table"
    out = []
    before, after = _run_names(old), _run_names(new)
    for verb, names in (("added", sorted(after - before)), ("dropped", sorted(before - after))):
        if names:
            shown = ", ".join(names[:5]) + (f", … ({len(names) - 5} more)" if len(names) > 5 else "")
            out.append(f"{len(names)} run{'s' if len(names) > 1 else ''} {verb} ({shown})")
    old_cells, new_cells = _cells(old.get("table")), _cells(new.get("table"))
    changed = []
    for path in sorted(set(old_cells) | set(new_cells)):
        a, b = old_cells.get(path), new_cells.get(path)
        if a is None or b is None or any(a.get(k) != b.get(k) for k in ("max", "mean", "n")):
            changed.append(f"{' '.join(path)} {_cell_change(a, b)}")
    if changed:
        out.append(f"{len(changed)} cell{'s' if len(changed) > 1 else ''} changed: " + "; ".join(changed[:10])
                   + (f"; … ({len(changed) - 10} more)" if len(changed) > 10 else ""))
    return "; ".join(out) or "no run or cell changed (run records, settings, pending runs or layout did)"
