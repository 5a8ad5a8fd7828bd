"""CPU time of a study before it runs, from the timings finished studies recorded (the committed trainings.jsonl and
result rows of v2-t256 and v3: every run's own CPU seconds, trained with the fused C++ operator).

Each training (variant, seed) is priced from the recorded row it derives from (the same config and overrides, less
``model.window``, ``model.n_layers`` and ``model.chunk_size``; a window W = T_train trains exactly as the unwindowed
model), scaled by tokens and by the models' own training FLOPs per token at the training length:

    cpu(v) = cpu_recorded(ref) · tokens(v) / tokens(ref) · flops(v, T_v) / flops(ref, T_ref)

and its scoring (every depth policy it is scored with) by the recorded scoring seconds of the reference, scaled by
Σ_L flops(v, L) over the plan's lengths against Σ_L flops(ref, L) over the reference plan's. Worked example (a
recorded ALiBi at 166 CPU s per 1.2M-token run): ALiBi with 12 layers, 1.2M tokens → 166 · 5.44M / 2.16M ≈ 418 s.
An estimate: FLOPs do not price kernels alike (RegularGPT's banded attention is memory-bound), so rows whose
reference differs only in layers or tokens are the trustworthy ones; another chunk size is priced by FLOPs only.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from regulargpt.config import load_config
from regulargpt.evaluation.lm_findings import run_name
from regulargpt.experiments.lm_comparison.plans import ROOT, V2_T256, V3, Plan, Variant, rel_path, train_overrides
from regulargpt.experiments.lm_comparison.stages import done, training_records
from regulargpt.model import build_model

__all__ = ["RECORDED", "StageCost", "estimate_table", "recorded_cpu", "recorded_scoring", "stage_costs"]

_STRUCTURAL = ("model.window=", "model.n_layers=", "model.chunk_size=")  # priced by FLOPs; stripped to find the
# reference row


def recorded_cpu(plan: Plan) -> dict[str, float]:
    """variant → mean CPU seconds per training run of a finished study, from its committed OUT/trainings.jsonl
    (each run's own user + system seconds). Example: two alibi runs of 160 and 170 s → {"alibi": 165.0}."""
    seconds: dict[str, list[float]] = defaultdict(list)
    for run, record in training_records(plan).items():
        named = run_name(run)
        if named is not None and record.get("cpu_seconds"):
            seconds[named[0]].append(float(record["cpu_seconds"]))
    return {name: sum(values) / len(values) for name, values in seconds.items()}


def recorded_scoring(results: Path) -> dict[tuple[str, str], float]:
    """(variant, depth policy or "own") → mean scoring seconds per run over the nonoverlapping rows of a results
    file whose runs are named ``…/runs/<dataset>/<variant>-seed<k>``."""
    totals: dict[tuple[str, str], float] = {}
    runs: dict[tuple[str, str], set[str]] = {}
    for line in results.read_text().splitlines():
        row = json.loads(line)
        if row.get("protocol") != "nonoverlapping" or row.get("skipped"):
            continue
        key = (Path(row["run"]).name.rsplit("-seed", 1)[0], row.get("depth_policy") or "own")
        totals[key] = totals.get(key, 0.0) + row["seconds"]
        runs.setdefault(key, set()).add(row["run"])
    return {k: v / len(runs[k]) for k, v in totals.items()}


def _reference(variant: Variant, recorded: Plan) -> Variant | None:
    """The recorded plan's first row that `variant` derives from: the same config and the same overrides once the
    structural ones (priced by FLOPs) are left out on both sides."""
    def core(v: Variant) -> tuple[str, ...]:
        return tuple(s for s in v.sets if not s.startswith(_STRUCTURAL))

    return next((m for m in recorded.models if m.config == variant.config and core(m) == core(variant)), None)


def _flops(plan: Plan, variant: Variant, lengths: list[int]) -> int:
    cfg = load_config(ROOT / "configs" / "tiny" / f"{variant.config}.json",
                      train_overrides(plan, plan.datasets[0], 0, variant)).model
    model = build_model(cfg)
    return sum(model.flops_per_token(length) for length in lengths)


@dataclass(frozen=True)
class StageCost:
    """One stage's trainings and their estimated CPU seconds (training, scoring); `unpriced`: rows with no
    recorded reference."""

    name: str
    why: str
    runs: int
    train_s: float
    eval_s: float
    unpriced: tuple[str, ...]


RECORDED = (V2_T256, V3)  # the finished studies an estimate prices from, the first that has a row's reference wins


def stage_costs(plan: Plan, recorded: tuple[Plan, ...] = RECORDED) -> list[StageCost]:
    """The estimated cost of every stage of `plan` (one pseudo-stage for an unstaged plan), priced from the
    trainings.jsonl and python-stdlib results of the first `recorded` study with a timed reference row."""
    cpus = [(rec, recorded_cpu(rec)) for rec in recorded]
    price: dict[str, tuple[float, float] | None] = {}
    for variant in plan.models:
        found = next(((rec, ref, cpu) for rec, cpu in cpus if (ref := _reference(variant, rec)) and ref.name in cpu),
                     None)
        if found is None:
            price[variant.name] = None
            continue
        recorded_plan, ref, cpu = found
        scoring = recorded_scoring(recorded_plan.out / "python-stdlib" / "results.jsonl")
        train_scale = (plan.tokens_of(variant) / recorded_plan.tokens_of(ref) * _flops(plan, variant, [plan.train_length])
                       / _flops(recorded_plan, ref, [recorded_plan.train_length]))
        eval_scale = _flops(plan, variant, plan.lengths) / _flops(recorded_plan, ref, recorded_plan.lengths)
        policies = ["own", *variant.depth_policies]
        price[variant.name] = (cpu[ref.name] * train_scale,
                               sum(scoring.get((ref.name, p), 0.0) for p in policies) * eval_scale)
    stages = [(s.name, s.why, [(v, k) for _ in plan.datasets for v, seeds in s.runs for k in seeds])
              for s in plan.stages] or [
        ("all", "every training of the plan", [(m.name, s) for _, m, s in plan.trainings()])]
    out = []
    for name, why, runs in stages:
        priced = [price[v] for v, _ in runs if price[v] is not None]
        out.append(StageCost(name, why, len(runs), sum(p[0] for p in priced if p), sum(p[1] for p in priced if p),
                             tuple(sorted({v for v, _ in runs if price[v] is None}))))
    return out


def estimate_table(plans: list[Plan], recorded: tuple[Plan, ...] = RECORDED) -> str:
    """Markdown: every stage of `plans` in run order, what it answers, its trainings finished so far (a model.pt
    in the run directory, or every row scored: ``stages.done``), and its estimated CPU minutes (training +
    scoring) with the running total in hours."""
    lines = ["| study | stage | answers | trainings done | est. CPU min (train + scoring) | cumulative h |",
             "|---|---|---|---:|---:|---:|"]
    total = 0.0
    for plan in plans:
        finished = {(m.name, s) for d, m, s in plan.trainings() if done(plan, d, m, s)}
        stage_runs = {s.name: {(v, k) for v, seeds in s.runs for k in seeds} for s in plan.stages}
        for cost in stage_costs(plan, recorded):
            runs = stage_runs.get(cost.name, {(m.name, s) for _, m, s in plan.trainings()})
            total += cost.train_s + cost.eval_s
            unpriced = f" (not priced: {', '.join(cost.unpriced)})" if cost.unpriced else ""
            lines.append(f"| {rel_path(plan.out)} | {cost.name} | {cost.why} | {len(runs & finished)} / {cost.runs} | "
                         f"{cost.train_s / 60:.0f} + {cost.eval_s / 60:.0f}{unpriced} | {total / 3600:.2f} |")
    return "\n".join(lines)
