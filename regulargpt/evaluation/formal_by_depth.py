"""Accuracy by adaptive depth: at which depth a RegularGPT's length extrapolation breaks.

RegularGPT runs L(T) = max(1, ceil(log_C T)) depth steps of one shared block on an input of T tokens
(:func:`~regulargpt.model.sliding_dilated.adaptive_depth`). The training lengths use depths 1..L_train; a longer
input needs depth steps the model never ran in training. This groups a run's range evaluation (``range.jsonl``) by
the depth each evaluated input needs::

    acc(L) = mean over the evaluated lengths T with L(input_length(T)) = L of accuracy(T)

and L_train = L(input length of a training string of the longest training length, data.max_length): D_12 trains
on 1..80, so with C = 2 its lengths up to 128 need no unseen depth.

Worked example (C = 2, training lengths 1..40, so L_train = 6; the cpu profile evaluates 1..40 and 41, 64, ...,
478): depth 6 holds 33..40, 41 and 64; depth 7 holds 87 and 110; depth 8 133..248; depth 9 271..478. A run that
computes its state exactly keeps 1.0 at every depth; one whose shared step is only nearly exact loses accuracy at
each new depth (errors compound through the steps).

The control: the evaluated lengths past the training lengths that still need no unseen depth (C = 2, T_train = 40:
41 and 64), ``held_out_seen``. High accuracy there and low at the next depth says the depth breaks, not the length.

Each row also carries the run's *fit* (mean accuracy over data.min_length..data.max_length) and *score* (over
eval.score_min_length..eval.max_length), as Table 1 defines them, so a report shows which of its runs fit their
training lengths (fit ≥ 0.99) but do not extrapolate (score < 0.99): the runs this analysis is for.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from regulargpt.config import ConfigError, formal_config_from_saved
from regulargpt.data.sources import DataError
from regulargpt.evaluation.formal_scoring import RangeEvalError, range_score, read_rows
from regulargpt.files import read_json_object
from regulargpt.model.sliding_dilated import adaptive_depth
from regulargpt.run_directory.layout import CONFIG_FILE, RANGE_FILE
from regulargpt.tasks import make_task

__all__ = ["DepthProfile", "by_depth_markdown", "depth_profile", "depth_record", "profile_from_record",
           "read_depth_records"]


@dataclass(frozen=True)
class DepthProfile:
    """One run's accuracy per depth: ``depths[L] = (shortest length, longest length, number of lengths, mean
    accuracy)`` over its evaluated lengths of depth L."""

    name: str
    chunk_size: int
    train_depth: int
    depths: dict[int, tuple[int, int, int, float]]
    held_out_seen: tuple[int, float] | None = None  # (lengths, mean accuracy): past the training lengths, seen depth
    fit: float | None = None  # mean accuracy over the training lengths (None: a record without it)
    score: float | None = None  # mean accuracy over the score lengths

    def first_break(self, threshold: float = 0.99) -> int | None:
        """The smallest depth whose mean accuracy is below `threshold` (None: none is)."""
        return next((d for d, (*_, acc) in sorted(self.depths.items()) if acc < threshold), None)


def depth_record(run_dir: str | Path) -> dict[str, Any]:
    """The raw record behind a run's :class:`DepthProfile`, small enough to commit beside the report: the run's name
    (its folder's last three parts, ``task/model/seed_lr``), chunk size, longest training length and the input
    length of a training string that long, and every evaluated ``[length, input_length, accuracy]`` of its
    ``range.jsonl``, with the run's fit and score (Table 1's definitions; None where no evaluated length falls in
    their range). Example: ``{"run": "dyck_4/regular_gpt_c2/seed0_lr0.001", "chunk_size": 2, "max_length": 40,
    "train_input_length": 40, "fit": 0.997, "score": 0.956, "rows": [[1, 1, 1.0], [2, 2, 1.0], …]}``."""
    run_dir = Path(run_dir)
    cfg = formal_config_from_saved(read_json_object(run_dir / CONFIG_FILE, ConfigError, "pass a run folder of a "
                                                    "formal sweep or launch/train_formal.py"),
                                   source=str(run_dir / CONFIG_FILE))
    if cfg.model.architecture != "regular_gpt":
        raise ConfigError(f"{run_dir}: model.architecture is {cfg.model.architecture!r}; accuracy by depth needs a "
                          f"RegularGPT run (its depth grows with the input length)")
    rows = read_rows(run_dir / RANGE_FILE)
    if not rows:
        raise RangeEvalError(f"{run_dir / RANGE_FILE}: no evaluated lengths; run `python eval/formal.py range --run "
                             f"{run_dir} --out {run_dir / RANGE_FILE}` first")
    longest, _ = make_task(cfg.data.task, **cfg.data.task_options).sample(1, cfg.data.max_length,
                                                                           torch.Generator().manual_seed(0))
    def mean_over(lo: int, hi: int) -> float | None:
        try:
            return range_score(rows, lo, hi)
        except RangeEvalError:
            return None

    return {"run": "/".join(run_dir.parts[-3:]), "chunk_size": cfg.model.chunk_size, "max_length": cfg.data.max_length,
            "train_input_length": int(longest.shape[1]),
            "fit": mean_over(cfg.data.min_length, cfg.data.max_length),
            "score": mean_over(cfg.eval.score_min_length, cfg.eval.max_length),
            "rows": [[t, int(row.get("input_length", t)), float(row["accuracy"])] for t, row in sorted(rows.items())]}


def profile_from_record(record: dict[str, Any]) -> DepthProfile:
    """A :class:`DepthProfile` from a :func:`depth_record` (a run folder's, or one read back from a report's JSON)."""
    c = int(record["chunk_size"])
    depth_of = {int(t): adaptive_depth(int(n), c) for t, n, _ in record["rows"]}
    groups: dict[int, list[tuple[int, float]]] = {}
    for t, _, acc in sorted(record["rows"]):
        groups.setdefault(depth_of[int(t)], []).append((int(t), float(acc)))
    depths = {d: (members[0][0], members[-1][0], len(members), float(np.mean([a for _, a in members])))
              for d, members in sorted(groups.items())}
    train_depth = adaptive_depth(int(record["train_input_length"]), c)
    control = [float(acc) for t, _, acc in record["rows"] if int(t) > int(record["max_length"])
               and depth_of[int(t)] <= train_depth]
    return DepthProfile(str(record["run"]), c, train_depth, depths,
                        (len(control), float(np.mean(control))) if control else None,
                        record.get("fit"), record.get("score"))


def depth_profile(run_dir: str | Path) -> DepthProfile:
    """A RegularGPT run's accuracy per depth from its ``config.resolved.json`` and ``range.jsonl``; the name is the
    run folder's last three parts (``task/model/seed_lr``)."""
    return profile_from_record(depth_record(run_dir))


def read_depth_records(path: str | Path) -> list[dict[str, Any]]:
    """The records a by-depth report's JSON holds (``{"records": [...]}``); DataError naming the file otherwise."""
    raw = read_json_object(Path(path), DataError, "pass the .json that `by-depth --out X.md` wrote beside X.md")
    records = raw.get("records")
    keys = {"run", "chunk_size", "max_length", "train_input_length", "rows"}
    if not isinstance(records, list) or not records or not all(isinstance(r, dict) and keys <= set(r)
                                                               for r in records):
        raise DataError(f"{path}: expected {{\"records\": [...]}} with keys {sorted(keys)} in every record")
    return records


def by_depth_markdown(profiles: list[DepthProfile], threshold: float = 0.99) -> list[str]:
    """One table per chunk size: a row per run, a column per depth (its lengths in the header), cells the mean
    accuracy; depths past the run's training depth are marked *; then the first depth below `threshold`, and the
    control: mean accuracy (number of lengths) over the lengths past the training lengths at a seen depth. The first
    line counts the runs that fit (≥ `threshold`) but score below it."""
    selected = sum(p.fit is not None and p.score is not None and p.fit >= threshold > p.score for p in profiles)
    lines = [f"{len(profiles)} runs; {selected} of them fit their training lengths (fit ≥ {threshold:g}) and score "
             f"< {threshold:g} past them.", ""]
    number = lambda value: "–" if value is None else f"{value:.3f}"  # noqa: E731
    for c in sorted({p.chunk_size for p in profiles}):
        mine = [p for p in profiles if p.chunk_size == c]
        depths = sorted({d for p in mine for d in p.depths})
        spans = {d: (min(p.depths[d][0] for p in mine if d in p.depths),
                     max(p.depths[d][1] for p in mine if d in p.depths)) for d in depths}
        head = [f"L={d} ({lo}..{hi})" if lo != hi else f"L={d} ({lo})" for d, (lo, hi) in spans.items()]
        lines += [f"Chunk size C = {c} (columns: depth L and the evaluated lengths that need it; * = deeper than "
                  f"any training length; cell = mean accuracy over those lengths; last column: the lengths past the "
                  f"training lengths that need no unseen depth):", "",
                  "| run | fit | score | L_train | " + " | ".join(head) + f" | first depth < {threshold:g} | held out, "
                  "seen depth |",
                  "|---|---:|---:|---:|" + "---:|" * len(depths) + "---:|---:|"]
        for p in mine:
            cells = [(f"{p.depths[d][3]:.3f}" + ("*" if d > p.train_depth else "")) if d in p.depths else "–"
                     for d in depths]
            first = p.first_break(threshold)
            control = f"{p.held_out_seen[1]:.3f} ({p.held_out_seen[0]})" if p.held_out_seen else "–"
            lines.append(f"| {p.name} | {number(p.fit)} | {number(p.score)} | {p.train_depth} | " + " | ".join(cells)
                         + f" | {first or '—'} | {control} |")
        lines.append("")
    return lines
