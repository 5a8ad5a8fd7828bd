"""Step counts from pilot runs: how long a task needs to fit its training lengths.

A pilot is a RegularGPT C = 2 run of a task (the profile's recipe, seed 0) whose ``metrics.jsonl`` logs the training
batch accuracy every `log_every` steps (each batch has one length from 1..40). The *stable step* is the first logged
step from which every later logged batch has accuracy >= `threshold`; the profile gives the task at least
`factor` × the stable step, rounded up to a multiple of `round_to`. Only training-length accuracy is used: the
held-out lengths (41..500) never choose a step count.

Worked example: accuracies logged at steps 50, 100, 150, 200 = 0.62, 1.0, 0.97, 1.0 → stable step 200 (150 dips
below 0.99), recommended ceil(1.6 × 200 / 100) × 100 = 400. A run whose last logged batch is below the threshold
has no stable step (None): it did not fit its training lengths in the pilot's steps.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["stable_step", "recommended_steps"]


def stable_step(rows: list[dict[str, Any]], threshold: float = 0.99) -> int | None:
    """First logged step from which every logged training-batch accuracy is >= threshold (None if the last is not)."""
    stable = None
    for row in sorted(rows, key=lambda r: r["step"]):
        if row["acc"] >= threshold:
            stable = row["step"] if stable is None else stable
        else:
            stable = None
    return stable


def recommended_steps(stable: int, factor: float = 1.6, round_to: int = 100) -> int:
    """ceil(factor × stable / round_to) × round_to, e.g. 200 → 400."""
    return math.ceil(factor * stable / round_to) * round_to
