"""The GPU campaign's study plan: equal tokens for every model, planned from training rates measured on a GPU before.

The campaign (eval/gpu_campaign.sh, docs/GPU_CHECK.md) trains each model of configs/campaign/ with the real trainer
one after another inside one capped step. Its step count is fixed before the first step, from rates on record:

    rate_m   = rate_f · (A_f / A_m) · kind_factor          (tokens/s planned for model m)
    N        = margin · (budget_s − n · overhead_s_per_run) / Σ_m 1 / rate_m      (tokens per model)
    steps    = clamp(floor(N / tokens_per_step), min_steps, max_steps)

rate_f is the recorded rate of m's family (RegularGPT, or a dense transformer at the record's own config), A the
layer applications at the training length (RegularGPT: K · ceil(log_C T); dense: n_layers) — a step costs about the
same per layer application, which is what the record shows at T = 512 (a host-bound step: RegularGPT with 12
applications and ALiBi with 12 layers ran 217k and 214k tokens/s on the H200). `kind_factor` maps the recording GPU
to the slower one the plan must fit (H200 → H100: 0.7, their HBM bandwidth ratio 3.35 / 4.8 TB/s).

Worked example: one RegularGPT at 150,000 tokens/s and three baselines at 450,000, budget 280 s, 30 s start-up each,
margin 0.85: N = 0.85 · 160 / (1/150,000 + 3/450,000) = 10.2M tokens, 622 steps of 16,384 tokens.

Each run's time cap is its start-up plus its planned training time plus a share of the slack proportional to that
time, so the caps add up to the budget; a run over its cap is stopped (checkpoint, export) and the report says so.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from regulargpt.config import Config, ConfigError, load_config
from regulargpt.model.sliding_dilated import adaptive_depth


@dataclass(frozen=True)
class CampaignPlanConfig:
    """configs/campaign/plan.json: which models, which record the rates come from, and the study's time budget."""

    models: list[str] = field(default_factory=lambda: ["regular_gpt", "alibi", "kerple_log", "rope"])
    record: str = "results/gpu/check"  # folder of a gpu check/campaign: train.md and baselines/<name>.jsonl
    record_kind: str = "nvidia-h200"
    kind_factor: float = 0.7  # planned rate = recorded rate × this (the slower kind the plan must fit)
    overhead_s_per_run: float = 30.0  # launcher, imports, engine set-up, first-step compile and export, per run
    budget_s: float = 280.0  # seconds for all runs, start-ups included (the study step's cap minus bookkeeping)
    margin: float = 0.85  # fraction of the training time the plan fills
    min_steps: int = 100
    max_steps: int = 20000

    def __post_init__(self) -> None:
        if not self.models or len(set(self.models)) != len(self.models):
            raise ConfigError(f"models: {self.models!r}; expected a non-empty list of distinct config names")
        for key in ("kind_factor", "overhead_s_per_run", "budget_s", "margin"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: {getattr(self, key)!r}; expected a number > 0")
        if self.margin > 1:
            raise ConfigError(f"margin: {self.margin!r}; expected a fraction in (0, 1]")
        if not 1 <= self.min_steps <= self.max_steps:
            raise ConfigError(f"min_steps {self.min_steps}, max_steps {self.max_steps}; expected 1 <= min <= max")
        if self.budget_s <= len(self.models) * self.overhead_s_per_run:
            raise ConfigError(f"budget_s {self.budget_s} leaves no training time after {len(self.models)} start-ups "
                              f"of {self.overhead_s_per_run} s")


def load_plan_config(path: str | Path) -> CampaignPlanConfig:
    """Read and validate a plan file; errors name the file and the key."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path}: cannot read a JSON object ({err})") from None
    known = set(CampaignPlanConfig.__dataclass_fields__)
    unknown = sorted(set(raw) - known) if isinstance(raw, dict) else []
    if not isinstance(raw, dict) or unknown:
        raise ConfigError(f"{path}: unknown keys {unknown}; expected keys among {sorted(known)}")
    try:
        return CampaignPlanConfig(**raw)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def layer_applications(cfg: Config) -> int:
    """Layer applications per token at the training length: K · ceil(log_C T) for RegularGPT, n_layers otherwise.

    >>> from regulargpt.config import load_config
    >>> layer_applications(load_config("configs/campaign/regular_gpt.json"))  # K 4, C 16, T 512: 4 · 3
    12
    """
    if cfg.model.architecture == "regular_gpt":
        return cfg.model.thickness * adaptive_depth(cfg.data.seq_len, cfg.model.chunk_size)
    return cfg.model.n_layers


def family(cfg: Config) -> str:
    """The record a model's rate is planned from: "regular_gpt", or "alibi" for every dense transformer (ALiBi,
    KERPLE and T5 train on FlexAttention, RoPE on SDPA flash; the record has ALiBi at batch 32 only)."""
    return "regular_gpt" if cfg.model.architecture == "regular_gpt" else "alibi"


@dataclass(frozen=True)
class RecordedRate:
    tokens_per_s: float
    layer_applications: int
    tokens_per_step: int
    source: str  # the file and rows it was read from


def _metrics_rate(path: Path) -> float:
    """Mean tokens/s of a metrics.jsonl without its first window (the warm-up and first-step compile)."""
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rates = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r]
    if not rates:
        raise ValueError(f"{path}: no tokens_per_s in any row")
    return statistics.mean(rates[1:] or rates)


def recorded_rates(record: str | Path, root: str | Path = ".") -> dict[str, RecordedRate]:
    """{family: rate} read from a GPU record folder: train/regular_gpt.jsonl (configs/base.json) and
    baselines/alibi.jsonl (configs/baselines/alibi.json), each with the config it ran."""
    record, root = Path(root) / record, Path(root)
    out = {}
    for name, metrics, config in (("regular_gpt", "train/regular_gpt.jsonl", "configs/base.json"),
                                  ("alibi", "baselines/alibi.jsonl", "configs/baselines/alibi.json")):
        path = record / metrics
        if not path.is_file():
            raise FileNotFoundError(f"{path}: the recorded rate of {name} is missing (the plan's 'record' folder "
                                    f"must hold {metrics})")
        cfg = load_config(root / config)
        out[name] = RecordedRate(_metrics_rate(path), layer_applications(cfg), cfg.train.batch_size * cfg.data.seq_len,
                                 f"{path.relative_to(root) if path.is_relative_to(root) else path} ({config})")
    return out


@dataclass
class ModelPlan:
    name: str
    layer_applications: int
    planned_tokens_per_s: float
    planned_train_s: float
    cap_s: float
    rate_from: str


@dataclass
class StudyPlan:
    steps: int
    tokens_per_step: int
    tokens_per_model: int
    budget_s: float
    models: list[ModelPlan]
    settings: dict[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    def markdown(self) -> list[str]:
        lines = [f"Equal tokens per model: **{self.steps} steps × {self.tokens_per_step:,} tokens = "
                 f"{self.tokens_per_model:,} tokens**, planned within {self.budget_s:.0f} s (start-ups included; "
                 f"kind factor {self.settings['kind_factor']}, margin {self.settings['margin']}, "
                 f"{self.settings['overhead_s_per_run']:.0f} s start-up per run).", "",
                 "| model | layer applications | planned tokens/s | planned training (s) | cap (s) | rate from |",
                 "|---|---:|---:|---:|---:|---|"]
        for m in self.models:
            lines.append(f"| {m.name} | {m.layer_applications} | {m.planned_tokens_per_s:,.0f} | "
                         f"{m.planned_train_s:.0f} | {m.cap_s:.0f} | {m.rate_from} |")
        return lines


def plan_study(plan: CampaignPlanConfig, configs: dict[str, Config], rates: dict[str, RecordedRate],
               steps: int | None = None) -> StudyPlan:
    """The plan of the module docstring; `steps` fixes the step count instead (the CPU rehearsal)."""
    tokens_per_step = {cfg.train.batch_size * cfg.data.seq_len * cfg.train.grad_accum for cfg in configs.values()}
    if len(tokens_per_step) != 1:
        raise ConfigError(f"the campaign's models train on different tokens per step {sorted(tokens_per_step)}; "
                          f"equal tokens per model needs one batch_size × seq_len × grad_accum")
    tps = tokens_per_step.pop()
    planned = {}
    for name in plan.models:
        cfg = configs[name]
        rec = rates[family(cfg)]
        planned[name] = (rec.tokens_per_s * rec.layer_applications / layer_applications(cfg) * plan.kind_factor,
                         f"{rec.source}: {rec.tokens_per_s:,.0f} tokens/s at {rec.layer_applications} applications")
    train_s = plan.budget_s - len(plan.models) * plan.overhead_s_per_run
    if steps is None:
        tokens = plan.margin * train_s / sum(1 / rate for rate, _ in planned.values())
        steps = min(plan.max_steps, max(plan.min_steps, math.floor(tokens / tps)))
    times = {name: steps * tps / rate for name, (rate, _) in planned.items()}
    slack = max(0.0, train_s - sum(times.values()))
    total = sum(times.values())
    models = [ModelPlan(name, layer_applications(configs[name]), planned[name][0], times[name],
                        plan.overhead_s_per_run + times[name] + slack * times[name] / total, planned[name][1])
              for name in plan.models]
    settings = {key: getattr(plan, key) for key in ("kind_factor", "overhead_s_per_run", "margin", "record",
                                                     "record_kind")}
    return StudyPlan(steps, tps, steps * tps, plan.budget_s, models, settings)
