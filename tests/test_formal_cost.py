"""The sweep's remaining-time estimate (regulargpt/experiments/formal_cost.py) against hand-computed hours."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from regulargpt.experiments.formal_cost import Rate, estimate_lines, measured_rates, reached_step
from regulargpt.experiments.formal_records import RunRecord


def _folder(out: Path, name: str, max_length: int, rows: list[tuple[int, float]]) -> Path:
    """A run folder OUT/<task>/<model>/<run> with a config's data.max_length and metrics rows (step, seconds)."""
    run = out / name
    run.mkdir(parents=True)
    (run / "config.resolved.json").write_text(json.dumps({"data": {"max_length": max_length}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "seconds": t}) + "\n" for s, t in rows))
    return run


def _record(model: str, steps: int, seconds: float, lengths: str = "1..40") -> RunRecord:
    return RunRecord(task_id="parity_check", model=model, seed=0, lr=1e-3, recipe="r", steps=steps, d_model=64,
                     parameters=1, train_seconds=seconds, score=1.0, fit=1.0, trained_p_one=0.5, table2={},
                     protocol={"train_lengths": lengths}, commit="c")


def _spec(out: Path, task: str, model: str, seed: int, steps: int, max_length: int = 40) -> SimpleNamespace:
    cfg = SimpleNamespace(train=SimpleNamespace(steps=steps), data=SimpleNamespace(max_length=max_length))
    return SimpleNamespace(task_id=task, model=model, cfg=cfg, run_dir=out / task / model / f"seed{seed}_lr0.001")


def test_rates_come_from_run_folders_first_then_records(tmp_path: Path) -> None:
    _folder(tmp_path, "parity_check/transformer/seed0_lr0.001", 40, [(100, 10.0), (200, 30.0)])  # 0.15 s/step
    _folder(tmp_path, "even_pairs/transformer/seed0_lr0.001", 40, [(400, 40.0)])  # 0.10
    _folder(tmp_path, "tomita_1/transformer/seed0_lr0.001", 40, [(50, 0.5)])  # under 100 steps: not a rate
    records = [_record("transformer", 1000, 999.0), _record("lstm", 1000, 30.0), _record("lstm", 1000, 50.0)]
    rates = measured_rates(tmp_path, records)
    assert rates[("transformer", 40)] == Rate(pytest.approx(0.125), 2, "run folders")  # median of 0.15, 0.10
    assert rates[("lstm", 40)] == Rate(pytest.approx(0.04), 2, "records")
    assert set(rates) == {("transformer", 40), ("lstm", 40)}
    assert reached_step(tmp_path / "parity_check/transformer/seed0_lr0.001") == (200, 30.0)
    assert reached_step(tmp_path / "nowhere") == (0, 0.0)


def test_estimate_counts_remaining_steps_scales_other_lengths_and_names_unknown_models(tmp_path: Path) -> None:
    _folder(tmp_path, "parity_check/transformer/seed0_lr0.001", 40, [(500, 75.0)])  # 0.15 s/step, at step 500
    rates = measured_rates(tmp_path)
    specs = [_spec(tmp_path, "parity_check", "transformer", s, 2000) for s in (0, 1, 2)]
    specs.append(_spec(tmp_path, "dyck_12", "transformer", 0, 1000, max_length=80))
    specs.append(_spec(tmp_path, "parity_check", "rnn", 0, 1000))
    lines = estimate_lines(specs, rates)
    # (1,500 + 2,000 + 2,000) × 0.15 = 825 s; D_12: 1,000 × 0.15 × 81/41 = 296.3 s; 1,121.3 s = 0.31 h
    assert lines[0] == "estimated training time (one thread per run; evaluation not included): 0.3 CPU-hours"
    assert lines[1] == ("  transformer: 4 runs, 6,500 steps, 0.3 CPU-hours at 0.150 s/step at T=40 (run folders, "
                        "1 runs); 0.296 s/step at T=80 (scaled from T=40, 1 runs)")
    assert lines[2] == "  rnn: 1 runs with no measured rate (no run folder or record of this model)"
    assert lines[3] == "  by task: parity_check 0.2, dyck_12 0.1"


def test_gpu_hours_use_gpu_run_folders_else_the_cpu_rate_times_the_stated_factor(tmp_path: Path) -> None:
    from regulargpt.experiments.formal_cost import GPU_STEP_FACTOR, gpu_estimate_lines

    _folder(tmp_path, "parity_check/transformer/seed0_lr0.001", 40, [(500, 75.0)])  # CPU: 0.15 s/step
    gpu_run = _folder(tmp_path, "parity_check/lstm/seed0_lr0.001", 40, [(1000, 8.0)])  # GPU: 0.008 s/step
    (gpu_run / "sweep.json").write_text(json.dumps({"device": "cuda:0"}))
    cpu_rates, gpu_rates = measured_rates(tmp_path), measured_rates(tmp_path, device="cuda")
    assert set(cpu_rates) == {("transformer", 40)} and gpu_rates == {("lstm", 40): Rate(0.008, 1, "run folders")}
    specs = [_spec(tmp_path, "parity_check", "transformer", s, 2000) for s in (0, 1)]  # 1,500 + 2,000 steps left
    specs += [_spec(tmp_path, "parity_check", "lstm", 1, 9000), _spec(tmp_path, "parity_check", "rnn", 0, 10)]
    lines = gpu_estimate_lines(specs, cpu_rates, gpu_rates, factor=0.2)
    # transformer: 3,500 × 0.15 × 0.2 = 105 s; lstm: 9,000 × 0.008 = 72 s; 177 s = 0.049 h; rnn: no rate, left out
    assert lines[0].startswith("estimated GPU time (one run per GPU; evaluation not included): 0.05 GPU-hours")
    assert lines[1] == "  transformer: 2 runs, 0.03 GPU-hours at 0.0300 s/step at T=40 (CPU run folders × 0.2, assumed)"
    assert lines[2] == "  lstm: 1 runs, 0.02 GPU-hours at 0.0080 s/step at T=40 (GPU run folders)"
    assert len(lines) == 3 and GPU_STEP_FACTOR == 0.25
