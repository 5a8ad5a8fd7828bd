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
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from regulargpt.config import ConfigError, formal_config_from_saved
from regulargpt.evaluation.formal_scoring import RangeEvalError, read_rows
from regulargpt.files import read_json_object
from regulargpt.model.sliding_dilated import adaptive_depth
from regulargpt.run_directory.layout import CONFIG_FILE, RANGE_FILE
from regulargpt.tasks import make_task

__all__ = ["DepthProfile", "by_depth_markdown", "depth_profile"]


@dataclass(frozen=True)
class DepthProfile:
    """One run's accuracy per depth: ``depths[L] = (shortest length, longest length, number of lengths, mean
    accuracy)`` over its evaluated lengths of depth L."""

    name: str
    chunk_size: int
    train_depth: int
    depths: dict[int, tuple[int, int, int, float]]
    held_out_seen: tuple[int, float] | None = None  # (lengths, mean accuracy): past the training lengths, seen depth

    def first_break(self, threshold: float = 0.99) -> int | None:
        """The smallest depth whose mean accuracy is below `threshold` (None: none is)."""
        return next((d for d, (*_, acc) in sorted(self.depths.items()) if acc < threshold), None)


def depth_profile(run_dir: str | Path) -> DepthProfile:
    """A RegularGPT run's accuracy per depth from its ``config.resolved.json`` and ``range.jsonl``; the name is the
    run folder's last three parts (``task/model/seed_lr``)."""
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
    c = cfg.model.chunk_size
    depth_of = {t: adaptive_depth(int(row.get("input_length", t)), c) for t, row in rows.items()}
    groups: dict[int, list[tuple[int, float]]] = {}
    for length, row in sorted(rows.items()):
        groups.setdefault(depth_of[length], []).append((length, float(row["accuracy"])))
    longest, _ = make_task(cfg.data.task, **cfg.data.task_options).sample(1, cfg.data.max_length,
                                                                           torch.Generator().manual_seed(0))
    depths = {d: (members[0][0], members[-1][0], len(members), float(np.mean([a for _, a in members])))
              for d, members in sorted(groups.items())}
    train_depth = adaptive_depth(longest.shape[1], c)
    control = [float(row["accuracy"]) for t, row in rows.items() if t > cfg.data.max_length
               and depth_of[t] <= train_depth]
    return DepthProfile("/".join(run_dir.parts[-3:]), c, train_depth, depths,
                        (len(control), float(np.mean(control))) if control else None)


def by_depth_markdown(profiles: list[DepthProfile], threshold: float = 0.99) -> list[str]:
    """One table per chunk size: a row per run, a column per depth (its lengths in the header), cells the mean
    accuracy; depths past the run's training depth are marked *; then the first depth below `threshold`, and the
    control: mean accuracy (number of lengths) over the lengths past the training lengths at a seen depth."""
    lines: list[str] = []
    for c in sorted({p.chunk_size for p in profiles}):
        mine = [p for p in profiles if p.chunk_size == c]
        depths = sorted({d for p in mine for d in p.depths})
        spans = {d: (min(p.depths[d][0] for p in mine if d in p.depths),
                     max(p.depths[d][1] for p in mine if d in p.depths)) for d in depths}
        head = [f"L={d} ({lo}..{hi})" if lo != hi else f"L={d} ({lo})" for d, (lo, hi) in spans.items()]
        lines += [f"Chunk size C = {c} (columns: depth L and the evaluated lengths that need it; * = deeper than "
                  f"any training length; cell = mean accuracy over those lengths; last column: the lengths past the "
                  f"training lengths that need no unseen depth):", "",
                  "| run | L_train | " + " | ".join(head) + f" | first depth < {threshold:g} | held out, seen depth |",
                  "|---|---:|" + "---:|" * len(depths) + "---:|---:|"]
        for p in mine:
            cells = [(f"{p.depths[d][3]:.3f}" + ("*" if d > p.train_depth else "")) if d in p.depths else "–"
                     for d in depths]
            first = p.first_break(threshold)
            control = f"{p.held_out_seen[1]:.3f} ({p.held_out_seen[0]})" if p.held_out_seen else "–"
            lines.append(f"| {p.name} | {p.train_depth} | " + " | ".join(cells) + f" | {first or '—'} | {control} |")
        lines.append("")
    return lines
