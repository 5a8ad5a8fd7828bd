"""The stages of a study, each resumable: data preparation, the parameter budget, training (launch/pretrain.py per
run, skipped when its model.pt exists or when every row it would be scored for is already in the committed results
file, so a checkout whose run folders did not survive resumes from its committed rows) and evaluation
(eval/extrapolate.py, which skips rows already scored). Each stage runs the checkout's own scripts in subprocesses
from ``ROOT``. Every finished training appends its timing to the committed OUT/trainings.jsonl."""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from tqdm.auto import tqdm

from regulargpt.config import load_config
from regulargpt.evaluation.lm_report import load_rows
from regulargpt.experiments.lm_comparison.plans import ROOT, VOCAB, Plan, Variant, rel_path, train_overrides
from regulargpt.files import atomic_write_text
from regulargpt.model import build_model
from regulargpt.provenance import git_commit, utc_date

__all__ = ["Need", "children_cpu", "done", "evaluate_all", "missing_rows", "parameter_counts", "prepare_data",
           "receptive_field_dir", "receptive_fields", "train_all", "training_records"]


def _show(cmd: list[str]) -> None:
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)


def _run(cmd: list[str]) -> int:
    """Run a command from the repository root, its output to this process's stdout; → its exit code."""
    _show(cmd)
    return subprocess.run(cmd, cwd=ROOT, check=False).returncode


def prepare_data(plan: Plan) -> None:
    for dataset in plan.datasets:
        cmd = [sys.executable, "data_prep/prepare.py", "--source", dataset, "--out", rel_path(plan.data_root / dataset),
               "--vocab-size", str(VOCAB), "--max-bytes", str(plan.max_bytes), "--num-proc", "1"]
        if _run(cmd) != 0:
            raise SystemExit(f"error: data preparation for {dataset} failed (see above)")


def parameter_counts(plan: Plan) -> dict[str, int]:
    """Parameters of every model; SystemExit when one matched on parameters (``Variant.matched``; the 12-layer
    rows are matched on layer applications instead) is more than 10% away from RegularGPT's."""
    counts = {}
    for model in plan.models:
        cfg = load_config(ROOT / "configs" / "tiny" / f"{model.config}.json",
                          train_overrides(plan, plan.datasets[0], 0, model))
        counts[model.name] = build_model(cfg.model).num_parameters()
    reference = counts.get("regular_gpt", next(iter(counts.values())))
    print("parameters (budget: RegularGPT ±10%, except rows matched on layer applications):", flush=True)
    for model, n in counts.items():
        print(f"  {model:17s} {n:>10,}  ({(n / reference - 1) * 100:+.2f}%)", flush=True)
    by_params = {m.name for m in plan.models if m.matched == "parameters"}
    far = [m for m, n in counts.items() if m in by_params and abs(n / reference - 1) > 0.10]
    if far:
        raise SystemExit(f"error: {far} are more than 10% away from RegularGPT's {reference:,} parameters")
    return counts


class Need(NamedTuple):
    """One result a run still lacks (:func:`missing_rows`): a perplexity row (protocol "nonoverlapping" or
    "sliding"; `rope_scaling` the canonical JSON of an evaluation-time RoPE scaling, None for none), a probe row
    (`probe` "passkey" or "copy", protocol None, as the probe rows record) or a receptive field (length 0,
    protocol "receptive_field")."""

    length: int
    policy: str | None
    protocol: str | None
    rope_scaling: str | None = None
    probe: str | None = None


def missing_rows(plan: Plan, dataset: str, variant: Variant, seed: int) -> list[Need]:
    """Every row :func:`evaluate_all` writes for this run that OUT/<dataset>/results.jsonl lacks (perplexity rows
    keyed by the run's path and the plan's token count, probe rows by the plan's probe_trials), plus
    ``Need(0, policy, "receptive_field")`` for a missing seed-0 receptive field of the plan's. Examples: a v3
    ``regular_gpt`` seed-1 run needs lengths 64 … 2048 under its own depth and again under ``train``: 12 rows; the
    v3 ``rope`` seed-0 run needs the 6 lengths unscaled, with YaRN and with dynamic NTK, and 6 passkey rows under
    each of the three: 36."""
    run = rel_path(plan.run_dir(dataset, variant, seed))
    need = [Need(L, None, "nonoverlapping") for L in plan.lengths]
    need += [Need(L, p, "nonoverlapping") for p in ("train", "per_position") if p in variant.depth_policies
             for L in plan.lengths]
    need += [Need(L, None, "nonoverlapping", s.key) for s in variant.rope_scalings for L in plan.lengths]
    if variant.name in plan.sliding_check and seed == 0:
        need += [Need(L, None, "sliding") for L in plan.sliding_lengths]
    first = seed == 0 and dataset == plan.datasets[0]
    if first:
        need += [Need(L, None, None, scaling, probe) for name, probe in plan.probes if name == variant.name
                 for scaling in (None, *(s.key for s in variant.rope_scalings)) for L in plan.lengths]
    path = plan.out / dataset / "results.jsonl"
    have = {Need(r["length"], r["depth_policy"], r["protocol"], r.get("rope_scaling"), r.get("probe"))
            for r in (load_rows(path) if path.is_file() else []) if r["run"] == run
            and (r["tokens"] == plan.eval_tokens if not r.get("probe")
                 else r["probe_config"]["trials"] == plan.probe_trials)}
    missing = [key for key in need if key not in have]
    if first:
        missing += [Need(0, policy or None, "receptive_field") for name, policy in plan.receptive_fields
                    if name == variant.name and not (receptive_field_dir(plan, name, policy)
                                                     / "receptive_field.json").is_file()]
    return missing


def done(plan: Plan, dataset: str, variant: Variant, seed: int) -> bool:
    """A training needs no (re)run: its model.pt exists, or every row it would be scored for is recorded."""
    return (plan.run_dir(dataset, variant, seed) / "model.pt").is_file() or not missing_rows(plan, dataset, variant,
                                                                                            seed)


def training_records(plan: Plan) -> dict[str, dict]:
    """OUT/trainings.jsonl: run path → its last record (seconds, cpu_seconds, tokens, tokens_per_s, started_unix,
    date, commit)."""
    path = plan.out / "trainings.jsonl"
    if not path.is_file():
        return {}
    return {r["run"]: r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())}


def _record_training(plan: Plan, run_dir: Path, seconds: float, cpu: float, cmd: list[str], started: float) -> None:
    """wall.json in the run folder, and the same timing appended to the committed OUT/trainings.jsonl (rewritten
    whole to a temporary name and renamed), so the README keeps it when the run folder is gone."""
    atomic_write_text(run_dir / "wall.json",
                      json.dumps({"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "command": cmd}) + "\n")
    last = json.loads((run_dir / "metrics.jsonl").read_text().strip().splitlines()[-1])
    record = {"run": rel_path(run_dir), "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
              "tokens": last["tokens"], "tokens_per_s": round(last["tokens"] / max(last["elapsed_s"], 1e-9), 1),
              "started_unix": round(started, 1), "date": utc_date(), "commit": git_commit()}
    path = plan.out / "trainings.jsonl"
    old = path.read_text() if path.is_file() else ""
    atomic_write_text(path, old + json.dumps(record, sort_keys=True) + "\n")


@dataclass
class _Training:
    """One launched training: its label, run folder, command, process, open log file and start time."""
    label: str
    run_dir: Path
    cmd: list[str]
    proc: subprocess.Popen
    log: IO[bytes]
    started: float  # time.perf_counter() at launch
    started_unix: float  # time.time() at launch


def _launch(plan: Plan, dataset: str, variant: Variant, seed: int) -> _Training:
    """Start launch/pretrain.py for one run in the background, its output appended to the run's train.log."""
    run_dir = plan.run_dir(dataset, variant, seed)
    cmd = [sys.executable, "launch/pretrain.py", "--config", f"configs/tiny/{variant.config}.json",
           "--run-dir", rel_path(run_dir)]
    for item in train_overrides(plan, dataset, seed, variant):
        cmd += ["--set", item]
    _show(cmd)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "train.log", "ab")  # noqa: SIM115 (closed by _reap)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    return _Training(f"{dataset}/{variant.name}-seed{seed}", run_dir, cmd, proc, log, time.perf_counter(), time.time())


def _reap(running: list[_Training]) -> tuple[_Training, int, float]:
    """Wait until one of `running` exits; → it, its exit code and its own CPU seconds (user + system, from
    os.wait4's rusage of that child, so concurrent trainings are timed apart)."""
    while True:
        for job in running:
            pid, status, usage = os.wait4(job.proc.pid, os.WNOHANG)
            if pid:
                job.proc.returncode = os.waitstatus_to_exitcode(status)
                job.log.close()
                return job, job.proc.returncode, usage.ru_utime + usage.ru_stime
        time.sleep(0.5)


def train_all(plan: Plan, after_each: Callable[[], None] | None = None, jobs: int = 1) -> list[str]:
    """Train every run not :func:`done` (no model.pt and rows missing from the results file), `jobs` at a time,
    started in the plan's order (stage by stage), calling `after_each` after every finished run (evaluate + report,
    so results appear as runs finish; the other trainings go on meanwhile); → the runs that failed. With jobs = 2
    on two cores, two single-threaded trainings share the machine (OMP_NUM_THREADS=1 each)."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    queue = []
    for dataset, variant, seed in plan.trainings():
        if (plan.run_dir(dataset, variant, seed) / "model.pt").is_file():
            continue
        if not missing_rows(plan, dataset, variant, seed):
            print(f"{dataset}/{variant.name}-seed{seed}: every row recorded in {rel_path(plan.out / dataset)}/"
                  "results.jsonl (run folder absent): not retrained", flush=True)
            continue
        queue.append((dataset, variant, seed))
    failed: list[str] = []
    running: list[_Training] = []
    bar = tqdm(total=len(queue), desc="training", unit="run", file=sys.stdout, mininterval=0)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                running.append(_launch(plan, *queue.pop(0)))
            bar.set_postfix_str(", ".join(job.label for job in running))
            job, rc, cpu = _reap(running)
            running.remove(job)
            bar.update()
            seconds = time.perf_counter() - job.started
            if rc != 0 or not (job.run_dir / "model.pt").is_file():
                failed.append(job.label)
                tail = (job.run_dir / "train.log").read_text(errors="replace")[-1500:]
                bar.write(f"training {job.label} failed (exit {rc}); last lines of its train.log:\n{tail}")
                continue
            _record_training(plan, job.run_dir, seconds, cpu, job.cmd, job.started_unix)
            bar.write(f"trained {job.label} in {seconds:.0f} s ({cpu:.0f} CPU s)")
            if after_each is not None:
                after_each()
    finally:  # an interrupted study leaves no training behind that a rerun would collide with
        for job in running:
            job.proc.terminate()
            job.proc.wait()
            job.log.close()
        bar.close()
    return failed


def children_cpu() -> float:
    """CPU seconds (user + system) used so far by finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _finished(plan: Plan, dataset: str, names: tuple[str, ...] | None = None,
              policy: str | None = None, seeds: tuple[int, ...] | None = None) -> list[str]:
    """Run directories with a model.pt, in training order; optionally only `names`, variants scored with `policy`,
    or `seeds`."""
    return [rel_path(plan.run_dir(d, m, s)) for d, m, s in plan.trainings()
            if d == dataset and (names is None or m.name in names) and (policy is None or policy in m.depth_policies)
            and (seeds is None or s in seeds) and (plan.run_dir(d, m, s) / "model.pt").is_file()]


def evaluate_all(plan: Plan, memory_gb: float) -> None:
    """Every finished run at every length (its own depth policy), RegularGPT runs again with each extra depth policy
    of their variant, RoPE runs again with each evaluation-time scaling of theirs, the sliding-protocol check, and
    the plan's probes on seed 0 of the first dataset (a RoPE run's also under each of its scalings); extrapolate.py skips rows already in the results file."""
    for dataset in plan.datasets:
        base = [sys.executable, "eval/extrapolate.py", "--data", rel_path(plan.data_root / dataset), "--split", "test",
                "--tokens", str(plan.eval_tokens), "--out", rel_path(plan.out / dataset), "--memory-gb", str(memory_gb),
                "--device", "cpu", "--no-progress"]
        lengths = ["--lengths", ",".join(map(str, plan.lengths))]
        jobs = [(_finished(plan, dataset), lengths)]
        jobs += [(_finished(plan, dataset, policy=p), [*lengths, "--depth-policy", p]) for p in ("train", "per_position")]
        scalings = {s.key: s for m in plan.models for s in m.rope_scalings}
        jobs += [(_finished(plan, dataset, tuple(m.name for m in plan.models if s in m.rope_scalings)),
                  [*lengths, "--rope-scaling", key]) for key, s in scalings.items()]
        if dataset == plan.datasets[0]:
            for probe in dict.fromkeys(p for _, p in plan.probes):
                probed = [m for m in plan.models if (m.name, probe) in plan.probes]
                flags = [*lengths, "--probe", probe, "--probe-trials", str(plan.probe_trials)]
                jobs.append((_finished(plan, dataset, tuple(m.name for m in probed), seeds=(0,)), flags))
                jobs += [(_finished(plan, dataset, tuple(m.name for m in probed if s in m.rope_scalings), seeds=(0,)),
                          [*flags, "--rope-scaling", key]) for key, s in scalings.items()]
        if plan.sliding_check:
            jobs.append((_finished(plan, dataset, plan.sliding_check, seeds=(0,)),
                         ["--lengths", ",".join(map(str, plan.sliding_lengths)), "--protocol", "sliding",
                          "--stride", "32"]))
        for runs, extra in jobs:
            if runs and _run([*base, "--runs", *runs, *extra]) != 0:
                raise SystemExit(f"error: evaluation on {dataset} failed (see above)")
    receptive_fields(plan)


def receptive_field_dir(plan: Plan, variant: str, policy: str) -> Path:
    """OUT/receptive_field/<variant>[-<policy>]: where the seed-0 receptive field of (variant, policy) goes."""
    return plan.out / "receptive_field" / (f"{variant}-{policy}" if policy else variant)


def receptive_fields(plan: Plan) -> None:
    """eval/receptive_field.py for each of the plan's (variant, depth policy) whose seed-0 run on the first dataset
    has finished and whose receptive_field.json is missing: 32 test windows of receptive_field_length (as v2)."""
    dataset = plan.datasets[0]
    variants = {m.name: m for m in plan.models}
    for name, policy in plan.receptive_fields:
        run_dir, out = plan.run_dir(dataset, variants[name], 0), receptive_field_dir(plan, name, policy)
        if not (run_dir / "model.pt").is_file() or (out / "receptive_field.json").is_file():
            continue
        cmd = [sys.executable, "eval/receptive_field.py", "--run", rel_path(run_dir), "--out", rel_path(out),
               "--length", str(plan.receptive_field_length), "--samples", "32",
               "--data", rel_path(plan.data_root / dataset), *(["--depth-policy", policy] if policy else [])]
        if _run(cmd) != 0:
            raise SystemExit(f"error: the receptive field of {name} {policy} failed (see above)")
