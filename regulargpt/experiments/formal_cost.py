"""What a sweep has left to train, in CPU-hours: each run's remaining steps × its model's seconds per step.

``sweep --list`` prints it, so a sitting can plan what fits. The rates are measured, never typed in::

    rate(model, T) = median over measured runs of training seconds / steps      (T = data.max_length)
    remaining(run) = train.steps − the step its folder's metrics.jsonl reached  (0 for a new folder)
    hours(model)   = Σ_runs remaining × rate / 3600

Measured runs are the run folders under the sweep's ``--out`` (metrics.jsonl's last row ``{"step", "seconds"}``:
this machine and code) and, for a (model, T) no folder covers, the committed records (``train_seconds / steps``;
older code can be slower). A (model, T) with neither takes the model's rate at another T, scaled by the ratio of
mean training lengths: a step costs about linearly in its length for every model here (the Transformer's attention
is quadratic, so its long-T estimate is low), e.g. D_12 (1..80) from 1..40: × (1 + 80) / (1 + 40) = 1.98.

Worked example: 3 Transformer runs of 2,000 steps, one folder already at step 500, rate 0.15 s/step →
(1,500 + 2,000 + 2,000) × 0.15 / 3600 = 0.23 CPU-hours. Evaluation time is not included.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from regulargpt.files import read_json_object, read_jsonl
from regulargpt.run_directory.layout import CONFIG_FILE, METRICS_FILE

if TYPE_CHECKING:
    from regulargpt.experiments.formal_records import RunRecord
    from regulargpt.experiments.formal_sweep import RunSpec

__all__ = ["Rate", "estimate_lines", "measured_rates", "reached_step"]

_MIN_STEPS = 100  # a folder measured over fewer steps is start-up noise, not a rate


@dataclass(frozen=True)
class Rate:
    """Seconds per training step of one model at training lengths up to `max_length`, and where it comes from."""

    seconds: float
    runs: int
    source: str  # "run folders" | "records" | "scaled from T=<n>"


def reached_step(run_dir: Path) -> tuple[int, float]:
    """(step, training seconds) of the last row of a run folder's metrics.jsonl; (0, 0.0) without one."""
    rows = read_jsonl(run_dir / METRICS_FILE)
    return (int(rows[-1]["step"]), float(rows[-1]["seconds"])) if rows else (0, 0.0)


def measured_rates(out_dir: str | Path, records: Iterable[RunRecord] = ()) -> dict[tuple[str, int], Rate]:
    """(model, data.max_length) → its measured :class:`Rate`: the run folders ``OUT/<task>/<model>/<run>`` first,
    the records for the pairs no folder covers."""
    samples: dict[tuple[str, int], list[float]] = {}
    for metrics in sorted(Path(out_dir).glob(f"*/*/*/{METRICS_FILE}")):
        step, seconds = reached_step(metrics.parent)
        config = metrics.parent / CONFIG_FILE
        if step >= _MIN_STEPS and seconds > 0 and config.is_file():
            max_length = int(read_json_object(config)["data"]["max_length"])
            samples.setdefault((metrics.parent.parent.name, max_length), []).append(seconds / step)
    rates = {key: Rate(statistics.median(v), len(v), "run folders") for key, v in samples.items()}
    from_records: dict[tuple[str, int], list[float]] = {}
    for r in records:
        key = (r.model, int(str(r.protocol.get("train_lengths", "1..40")).split("..")[-1]))
        if key not in rates and r.steps and r.train_seconds:
            from_records.setdefault(key, []).append(r.train_seconds / r.steps)
    rates.update({key: Rate(statistics.median(v), len(v), "records") for key, v in from_records.items()})
    return rates


def _rate(rates: dict[tuple[str, int], Rate], model: str, max_length: int) -> Rate | None:
    if (model, max_length) in rates:
        return rates[(model, max_length)]
    others = sorted((t, r) for (m, t), r in rates.items() if m == model)
    if not others:
        return None
    t, r = min(others, key=lambda item: abs(item[0] - max_length))
    return Rate(r.seconds * (1 + max_length) / (1 + t), r.runs, f"scaled from T={t}")


def estimate_lines(specs: list[RunSpec], rates: dict[tuple[str, int], Rate]) -> list[str]:
    """The estimate per model (runs, remaining steps, CPU-hours, the rate and its source), per task, and in all."""
    per_model: dict[str, list[float]] = {}
    per_task: dict[str, float] = {}
    used: dict[str, set[str]] = {}
    unknown: dict[str, int] = {}
    for spec in specs:
        rate = _rate(rates, spec.model, spec.cfg.data.max_length)
        if rate is None:
            unknown[spec.model] = unknown.get(spec.model, 0) + 1
            continue
        remaining = max(0, spec.cfg.train.steps - reached_step(spec.run_dir)[0])
        hours = remaining * rate.seconds / 3600
        entry = per_model.setdefault(spec.model, [0, 0, 0.0])
        entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + remaining, entry[2] + hours
        per_task[spec.task_id] = per_task.get(spec.task_id, 0.0) + hours
        used.setdefault(spec.model, set()).add(f"{rate.seconds:.3f} s/step at T={spec.cfg.data.max_length} "
                                               f"({rate.source}, {rate.runs} runs)")
    total = sum(h for _, _, h in per_model.values())
    lines = [f"estimated training time (one thread per run; evaluation not included): {total:.1f} CPU-hours"]
    lines += [f"  {model}: {int(n)} runs, {int(steps):,} steps, {hours:.1f} CPU-hours at "
              + "; ".join(sorted(used[model])) for model, (n, steps, hours) in per_model.items()]
    lines += [f"  {model}: {n} runs with no measured rate (no run folder or record of this model)"
              for model, n in unknown.items()]
    if per_task:
        lines.append("  by task: " + ", ".join(f"{task} {h:.1f}" for task, h in
                                                sorted(per_task.items(), key=lambda item: -item[1])))
    return lines
