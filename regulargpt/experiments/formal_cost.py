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

GPU-hours (:func:`gpu_estimate_lines`, one run per GPU as ``sweep --slurm --gpus-per-task 1`` queues them): the
rate of run folders trained on a GPU (their sweep.json says ``"device": "cuda…"``) where there are some, else the
CPU rate × :data:`GPU_STEP_FACTOR`. That factor is an assumption, not a measurement: no formal run has been timed on
a GPU yet. These models are small (d ≤ 256, batch 128, strings of at most 80 symbols), so a step is a few hundred
small kernels and its time on a GPU is set by launch latency rather than arithmetic; we assume a GPU step costs a
quarter of a one-thread CPU step. The first GPU sweep replaces the assumption by its measured rates. Example: the
3 Transformer runs above → 5,500 × 0.15 × 0.25 / 3600 = 0.057 GPU-hours.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from regulargpt.files import read_json_object, read_jsonl
from regulargpt.run_directory.layout import CONFIG_FILE, METRICS_FILE, SWEEP_FILE

if TYPE_CHECKING:
    from regulargpt.experiments.formal_records import RunRecord
    from regulargpt.experiments.formal_sweep import RunSpec

__all__ = ["GPU_STEP_FACTOR", "Rate", "estimate_lines", "gpu_estimate_lines", "measured_rates", "reached_step"]

GPU_STEP_FACTOR = 0.25  # GPU seconds per step / one-thread CPU seconds per step: assumed (module docstring)

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


def _device(run_dir: Path) -> str:
    """The device type a sweep run folder trained on (sweep.json's ``device``, e.g. 'cuda:1' → 'cuda'); 'cpu' when
    it does not say (folders from before the device was recorded)."""
    sweep = run_dir / SWEEP_FILE
    return str(read_json_object(sweep).get("device", "cpu")).split(":")[0] if sweep.is_file() else "cpu"


def measured_rates(out_dir: str | Path, records: Iterable[RunRecord] = (),
                   device: str = "cpu") -> dict[tuple[str, int], Rate]:
    """(model, data.max_length) → its measured :class:`Rate` on `device` ('cpu' or 'cuda'): the run folders
    ``OUT/<task>/<model>/<run>`` trained there first, then (CPU only) the records for the pairs no folder covers."""
    samples: dict[tuple[str, int], list[float]] = {}
    for metrics in sorted(Path(out_dir).glob(f"*/*/*/{METRICS_FILE}")):
        step, seconds = reached_step(metrics.parent)
        config = metrics.parent / CONFIG_FILE
        if step >= _MIN_STEPS and seconds > 0 and config.is_file() and _device(metrics.parent) == device:
            max_length = int(read_json_object(config)["data"]["max_length"])
            samples.setdefault((metrics.parent.parent.name, max_length), []).append(seconds / step)
    rates = {key: Rate(statistics.median(v), len(v), "run folders") for key, v in samples.items()}
    from_records: dict[tuple[str, int], list[float]] = {}
    for r in records if device == "cpu" else ():
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


def gpu_estimate_lines(specs: list[RunSpec], cpu_rates: dict[tuple[str, int], Rate],
                       gpu_rates: dict[tuple[str, int], Rate], factor: float = GPU_STEP_FACTOR) -> list[str]:
    """GPU-hours per model and in all: each run's remaining steps × its GPU rate (measured on a GPU, else the CPU
    rate × `factor`); models with neither are named."""
    per_model: dict[str, list[float]] = {}
    sources: dict[str, set[str]] = {}
    for spec in specs:
        t = spec.cfg.data.max_length
        measured, cpu = _rate(gpu_rates, spec.model, t), _rate(cpu_rates, spec.model, t)
        if measured is None and cpu is None:
            continue
        seconds = measured.seconds if measured else cpu.seconds * factor
        remaining = max(0, spec.cfg.train.steps - reached_step(spec.run_dir)[0])
        entry = per_model.setdefault(spec.model, [0, 0.0])
        entry[0], entry[1] = entry[0] + 1, entry[1] + remaining * seconds / 3600
        sources.setdefault(spec.model, set()).add(
            f"{seconds:.4f} s/step at T={t} (" + (f"GPU {measured.source}" if measured else
                                                   f"CPU {cpu.source} × {factor:g}, assumed") + ")")
    total = sum(h for _, h in per_model.values())
    lines = [f"estimated GPU time (one run per GPU; evaluation not included): {total:.2f} GPU-hours (GPU rate = "
             f"measured on a GPU, else CPU s/step × {factor:g}: formal_cost.GPU_STEP_FACTOR, an assumption)"]
    lines += [f"  {model}: {int(n)} runs, {hours:.2f} GPU-hours at " + "; ".join(sorted(sources[model]))
              for model, (n, hours) in per_model.items()]
    return lines
