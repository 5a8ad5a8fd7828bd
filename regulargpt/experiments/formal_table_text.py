"""The markdown text of Tables 1 and 2 (:mod:`regulargpt.experiments.formal_tables`): header lines, cells, marks.

A cell is ``max / mean (n)`` over seeds × learning rates, e.g. ``1.000 / 0.983 (3)``; a cell still waiting for runs
says so, ``0.912 / 0.912 (1 of 3; rest pending)``; marks follow it: `` †`` when a run did not fit its training
lengths (mean accuracy over them < :data:`FIT_THRESHOLD`), `` ‡`` when a run was kept by the last-model rule and the
profile's checkpoint rule could change it. The header starts with the command, commit, machine and date; the
``- Command / Commit / Machine / Date`` lines are the provenance stamp that
:mod:`~regulargpt.experiments.table_changes` ignores when it decides whether a table changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from regulargpt.experiments.formal_records import OTHER_RULE, SAME_MODEL, RunRecord
from regulargpt.train.formal_selection import describe_rule

__all__ = ["FIT_THRESHOLD", "STALE_NOTE", "cell_text", "fit_text", "header_lines", "marks", "protocol_lines",
           "rule_lines"]

STALE_NOTE = "(stale: trained with a recipe the profile no longer plans)"
FIT_THRESHOLD = 0.99  # a run "fits" its training lengths when its mean accuracy over them is at least this


def rule_lines(records: list[RunRecord], standing: dict[str, str], cell_rule: dict[tuple[str, str], str]) -> list[str]:
    """Which checkpoint rule made the runs (one line per rule the profile plans): how many runs it kept, how many
    kept by the last model are the same model (SAME_MODEL), how many it could still change (OTHER_RULE, ‡)."""
    lines = []
    for rule in sorted(set(cell_rule.values()) or {r.rule for r in records}):
        mine = [r for r in records if cell_rule.get((r.task_id, r.model), r.rule) == rule]
        same = sum(standing.get(r.name) == SAME_MODEL for r in mine)
        other = sum(standing.get(r.name) == OTHER_RULE for r in mine)
        parts = [f"{len(mine) - same - other} runs kept by it"]
        if same:
            parts.append(f"{same} kept by the last-model rule (trained before this rule) with a fit of 1.000 over "
                         f"every training length at their last step, the model this rule keeps too (ties go to "
                         f"the last)")
        if other:
            parts.append(f"{other} kept by the last-model rule, which this rule could change (cells marked ‡; the "
                         f"sweep trains them again)")
        lines.append(f"- Checkpoint kept (eval.select_last / select_every): {describe_rule(rule)} (`{rule}`): "
                     + "; ".join(parts))
    return lines


def header_lines(title: str, prov: dict[str, str], profile: str, pending: list[str],
            carried: list[RunRecord] = (), records: list[RunRecord] = (), rules: list[str] = ()) -> list[str]:
    lines = [f"# {title} — profile `{profile}`", "", f"- Command: `{prov['command']}`", f"- Commit: {prov['commit']}",
             f"- Machine: {prov['machine']}", f"- Date: {prov['date']}", *rules]
    if records:
        trained = [r.trained_at or "not recorded" for r in records]
        lines.append("- Runs trained by the code at: " + ", ".join(f"{c} ({trained.count(c)})"
                                                                for c in sorted(set(trained))))
    if carried:
        commits = sorted({r.commit for r in carried})
        lines.append(f"- Carried from the kept table's run records (run folders not in --runs): {len(carried)} runs, "
                     f"first aggregated at {', '.join(commits)}")
    stale = [p.split("/")[0] for p in pending if p.endswith(STALE_NOTE)]
    if stale:
        per_task = ", ".join(f"{task} {stale.count(task)}" for task in dict.fromkeys(stale))
        lines.append(f"- Stale (not counted): {len(stale)} runs {STALE_NOTE[len('(stale: '):-1]}: {per_task}")
    pending = [p for p in pending if not p.endswith(STALE_NOTE)]
    if pending:
        lines.append(f"- Pending (not counted): {len(pending)} runs: " + ", ".join(pending))
    return lines + [""]


def cell_text(cell: dict[str, Any] | None) -> str:
    """``max / mean (n)``; a cell with runs still to come says so: ``… (2 of 3; rest pending)`` or
    ``pending (0 of 3)``."""
    if cell is None:
        return "–"
    expected = cell.get("expected", cell["n"])
    if cell["n"] == 0:
        return f"pending (0 of {expected})"
    text = f"{cell['max']:.3f} / {cell['mean']:.3f}"
    return f"{text} ({cell['n']})" if cell["n"] >= expected else f"{text} ({cell['n']} of {expected}; rest pending)"


def marks(cell: dict[str, Any] | None) -> str:
    """`` †`` when a run of the cell did not fit its training lengths, `` ‡`` when one was kept by another
    checkpoint rule than the profile plans."""
    cell = cell or {}
    return (" †" if cell.get("unfit") else "") + (" ‡" if cell.get("other_rule") else "")


def fit_text(cell: dict[str, Any] | None) -> str:
    """``max / mean`` of the runs' fits, and how many runs are below the threshold:
    ``0.750 / 0.750 (3 of 3 < 0.99)``."""
    fits = [f for f in (cell or {}).get("fits", []) if f is not None]
    if not fits:
        return "–"
    text = f"{max(fits):.3f} / {float(np.mean(fits)):.3f}"
    return f"{text} ({cell['unfit']} of {len(fits)} < {FIT_THRESHOLD:g})" if cell["unfit"] else text


def protocol_lines(proto: dict[str, Any]) -> list[str]:
    intro = ("Protocol (read from the runs): score = mean per-length accuracy over the evaluated lengths in the "
             "score range (the authors' code averages 42..500; we include 41).")
    lines = [intro, ""]
    for task, entries in proto.items():
        for e in entries:
            lines.append(f"- {task}: train lengths {e['train_lengths']}, batch {e['batch_size']}; evaluated "
                         f"{e['eval_lengths']}, {e['samples_per_length']} sequences per length; score over "
                         f"{e['score_lengths']}")
    return lines + [""]
