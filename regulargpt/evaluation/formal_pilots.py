"""Step counts from pilot runs: how long a task needs to fit its training lengths.

A pilot is a RegularGPT C = 2 run of a task (the profile's recipe) with a measure of its fit logged as it trains,
by one of two criteria:

- ``batches``: ``metrics.jsonl``'s training-batch accuracy every `log_every` steps (each batch one length from
  1..40). Weak where a rare length class decides the task: in (aaaa)* only 10 of the 40 lengths (the multiples of
  4) are positive, and two lucky logged batches looked "stable" to a model that answered "no" at all of them.
- ``check``: ``time_to_solve.jsonl`` written with ``--time-to-solve --check-lengths 1-40``: the mean accuracy over
  every training length (64 fixed strings each) every EVERY steps. :func:`check_rows` refuses a check that
  includes any length outside the training range.

The *stable step* is the first logged step from which every later value is >= `threshold`; the profile gives the
task at least `factor` × the stable step, rounded up to a multiple of `round_to`. Only training lengths are used:
the held-out lengths (41..500) never choose a step count.

Worked example: accuracies logged at steps 50, 100, 150, 200 = 0.62, 1.0, 0.97, 1.0 → stable step 200 (150 dips
below 0.99), recommended ceil(1.6 × 200 / 100) × 100 = 400. A run whose last logged batch is below the threshold
has no stable step (None): it did not fit its training lengths in the pilot's steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from regulargpt.config import ConfigError, FormalConfig, formal_config_from_saved
from regulargpt.evaluation.formal_scoring import RangeEvalError, read_rows
from regulargpt.files import read_json_object, read_jsonl
from regulargpt.run_directory import saved_config
from regulargpt.run_directory.layout import CONFIG_FILE, RANGE_FILE, SOLVE_FILE, SWEEP_FILE

__all__ = ["LrCandidate", "check_rows", "choose_lr", "lr_candidates", "recommended_steps", "stable_step",
           "task_steps"]


def check_rows(rows: list[dict[str, Any]], min_length: int, max_length: int, source: str) -> list[dict[str, Any]]:
    """The rows of a check log (``time_to_solve.jsonl``) as ``{"step", "acc"}`` rows for :func:`stable_step`; a
    RangeEvalError naming `source` when a row's checked lengths (``"lengths": [shortest, longest, count]``) leave the
    training range min_length..max_length, or are not recorded (a log written before they were)."""
    out = []
    for row in rows:
        span = row.get("lengths")
        if not span or span[0] < min_length or span[1] > max_length:
            raise RangeEvalError(f"{source}: step {row.get('step')}: checked lengths {span or 'not recorded'} are not "
                             f"inside the training lengths {min_length}..{max_length}; a step count is chosen on "
                             f"training lengths only (train with --check-lengths {min_length}-{max_length})")
        out.append({"step": row["step"], "acc": row["score"]})
    return out


def stable_step(rows: list[dict[str, Any]], threshold: float = 0.99, forgive: int = 0) -> int | None:
    """First logged step from which every logged accuracy (``acc``: a training batch's, or a fit check's from
    :func:`check_rows`) is >= threshold (None if the last is not).

    With ``forgive = n`` a dip of at most n consecutive values below the threshold after that step — a loss spike
    of a constant-learning-rate run, which it recovers from — does not restart the count, also at the end of the
    log; a longer dip does. Fit checks 0.97, 0.995, 0.97, 0.996, 0.998, 0.97 at steps 100..600: never stable with
    ``forgive=0`` (the last check dips), stable from 200 with ``forgive=1``."""
    if forgive < 0:
        raise ValueError(f"forgive={forgive}: expected a count >= 0")
    stable, dip = None, 0
    for row in sorted(rows, key=lambda r: r["step"]):
        if row["acc"] >= threshold:
            stable, dip = (row["step"] if stable is None else stable), 0
        else:
            dip += 1
            if dip > forgive:
                stable = None
    return stable


def recommended_steps(stable: int, factor: float = 1.6, round_to: int = 100) -> int:
    """ceil(factor × stable / round_to) × round_to, e.g. 200 → 400."""
    return math.ceil(factor * stable / round_to) * round_to


def task_steps(pilots: list[tuple[int | None, int]], factor: float = 1.6, round_to: int = 100) -> int | None:
    """One step count for a task from its pilots, one (stable step, steps trained) pair per seed: the
    recommendation for the slowest seed that became stable, so that every such seed fits. A seed that never became
    stable gets at least its pilot's length (which did not fit it: its cell will stay †, and longer pilots showed
    no sign of helping it). None when no pilot became stable.

    >>> task_steps([(1900, 6000), (2900, 6000), (2400, 6000)])
    4700
    >>> task_steps([(4500, 6000), (None, 6000), (5600, 6000)])  # 1.6 x 5,600 = 8,960 -> 9,000 >= 6,000
    9000
    >>> task_steps([(1000, 6000), (None, 6000)])  # 1,600 is below the pilot that did not fit the second seed
    6000
    """
    stables = [s for s, _ in pilots if s is not None]
    if not stables:
        return None
    steps = recommended_steps(max(stables), factor, round_to)
    if len(stables) < len(pilots):
        steps = max(steps, max(n for s, n in pilots if s is None))
    return steps


@dataclass(frozen=True)
class LrCandidate:
    """One learning rate's runs (one per seed) of a task and model: their mean cross-entropy and accuracy over the
    training lengths, from the fixed evaluation strings of ``range.jsonl``."""

    lr: float
    seeds: tuple[int, ...]
    losses: tuple[float, ...]  # per seed, mean over the training lengths
    fits: tuple[float, ...]  # per seed, mean accuracy over the training lengths

    @property
    def loss(self) -> float:
        return float(np.mean(self.losses))


def choose_lr(candidates: list[LrCandidate]) -> LrCandidate:
    """The candidate with the lowest mean (over seeds) training-length cross-entropy; ties go to the smaller rate.

    Only training lengths are read, so a per-task learning rate is chosen the way the protocol allows (on
    training-length validation), never on held-out lengths. Every candidate must hold the same seeds.

    >>> choose_lr([LrCandidate(1e-3, (0, 1), (0.02, 0.01), (1.0, 1.0)),
    ...            LrCandidate(3e-4, (0, 1), (0.004, 0.006), (1.0, 1.0))]).lr
    0.0003
    """
    if not candidates:
        raise RangeEvalError("choose_lr: no candidate learning rate")
    seeds = {c.seeds for c in candidates}
    if len(seeds) > 1:
        raise RangeEvalError(f"choose_lr: the candidates hold different seeds {sorted(seeds)}; compare learning "
                             f"rates on the same seeds")
    return min(candidates, key=lambda c: (c.loss, c.lr))


def _training_length_grades(run_dir: Path, cfg: FormalConfig, at_step: int | None) -> tuple[float, float]:
    """(mean cross-entropy, mean accuracy) of one run over its training lengths: from ``range.jsonl`` (a sweep run,
    the model it kept), or with `at_step` from the fit check at that step of ``time_to_solve.jsonl`` (a pilot)."""
    lo, hi = cfg.data.min_length, cfg.data.max_length
    if at_step is not None:
        source = run_dir / SOLVE_FILE
        rows = read_jsonl(source)
        check_rows(rows, lo, hi, str(source))  # refuses checks past the training lengths
        row = next((r for r in rows if r["step"] == at_step), None)
        if row is None:
            raise RangeEvalError(f"{source}: no fit check at step {at_step} (checked steps "
                                 f"{rows[0]['step'] if rows else '-'}..{rows[-1]['step'] if rows else '-'}); train "
                                 f"the pilot that far or choose another --at-step")
        return float(row["loss"]), float(row["score"])
    rows = [row for t, row in read_rows(run_dir / RANGE_FILE).items() if lo <= t <= hi]
    if not rows or any("loss" not in row for row in rows):
        raise RangeEvalError(f"{run_dir / RANGE_FILE}: no loss in its training-length rows ({lo}..{hi}); they "
                             f"were evaluated before range rows had one: run the sweep again into a new --out")
    return float(np.mean([r["loss"] for r in rows])), float(np.mean([r["accuracy"] for r in rows]))


def lr_candidates(run_dirs: list[Path], at_step: int | None = None) -> tuple[tuple[str, str], list[LrCandidate]]:
    """((task, model), one LrCandidate per learning rate) from runs of one task and model at several rates: sweep
    runs (``sweep.json``; their range evaluation's training lengths) or, with `at_step`, ``long-run`` pilots
    (``OUT/<task>/<model>/seed<S>_lr<LR>``; their fit check at that step). A ConfigError when the runs hold
    several tasks or models."""
    per_lr: dict[float, list[tuple[int, float, float]]] = {}
    cells = set()
    for run_dir in map(Path, run_dirs):
        cfg = saved_config(run_dir, ConfigError, read=formal_config_from_saved)
        if not isinstance(cfg, FormalConfig):
            raise ConfigError(f"{run_dir / CONFIG_FILE}: missing or not a formal-language run's config")
        if at_step is None:
            info = read_json_object(run_dir / SWEEP_FILE, ConfigError, hint="choose-lr reads runs made by `sweep` "
                                                                               "(pilots: --at-step STEP)")
            cell, seed, lr = (info["task_id"], info["model"]), int(info["seed"]), float(info["lr"])
        else:  # the sweep layout OUT/<task>/<model>/<point>, which long-run uses too
            cell, seed, lr = (run_dir.parent.parent.name, run_dir.parent.name), cfg.train.seed, cfg.train.lr
        cells.add(cell)
        loss, acc = _training_length_grades(run_dir, cfg, at_step)
        per_lr.setdefault(lr, []).append((seed, loss, acc))
    if len(cells) != 1:
        raise ConfigError(f"choose-lr compares one task and model; --runs hold {sorted(cells)}")
    candidates = [LrCandidate(lr, *map(tuple, zip(*sorted(runs)))) for lr, runs in sorted(per_lr.items())]
    return cells.pop(), candidates
