"""The GPU campaign's study plan (regulargpt/experiments/gpu_campaign/plan.py) against hand-computed figures, its
validation, and the perplexity table of its report against hand-written rows."""
from __future__ import annotations

import json

import pytest
from helpers import ROOT

from regulargpt.config import ConfigError, load_config
from regulargpt.experiments.gpu_campaign import plan as planning
from regulargpt.experiments.gpu_campaign.report import perplexity_table


def _configs():
    return {name: load_config(ROOT / "configs/campaign" / f"{name}.json")
            for name in ("regular_gpt", "alibi", "kerple_log", "rope")}


def _rate(tokens_per_s, applications):
    return planning.RecordedRate(tokens_per_s, applications, 16384, "hand")


def test_the_plan_gives_equal_tokens_from_the_formula_and_caps_that_fill_the_budget():
    """The docstring's worked example: rates 150,000 (RegularGPT, 12 applications) and 450,000 (each 4-layer
    baseline), i.e. records of 150,000 and 150,000 at 12 applications with kind factor 1; budget 280 s, 4 × 30 s
    start-ups, margin 0.85 → N = 0.85 · 160 / (1/150,000 + 3/450,000) = 10,200,000 tokens → 622 steps of 16,384."""
    cfg = planning.CampaignPlanConfig(kind_factor=1.0, overhead_s_per_run=30, budget_s=280, margin=0.85)
    rates = {"regular_gpt": _rate(150_000, 12), "alibi": _rate(150_000, 12)}
    plan = planning.plan_study(cfg, _configs(), rates)
    assert plan.steps == 622 and plan.tokens_per_step == 32 * 512 and plan.tokens_per_model == 622 * 16384
    by_name = {m.name: m for m in plan.models}
    assert by_name["regular_gpt"].planned_tokens_per_s == pytest.approx(150_000)
    assert by_name["rope"].planned_tokens_per_s == pytest.approx(450_000) and by_name["rope"].layer_applications == 4
    assert by_name["regular_gpt"].planned_train_s == pytest.approx(622 * 16384 / 150_000)
    assert sum(m.cap_s for m in plan.models) == pytest.approx(280)  # start-ups + training + the slack, shared
    cut = planning.plan_study(cfg, _configs(), {k: _rate(0.7 * v.tokens_per_s, 12) for k, v in rates.items()})
    assert cut.steps == int(0.7 * 10_200_000 / 16384)  # rates scale the tokens linearly


def test_the_kind_factor_and_the_step_bounds_apply():
    rates = {"regular_gpt": _rate(150_000, 12), "alibi": _rate(150_000, 12)}
    half = planning.plan_study(planning.CampaignPlanConfig(kind_factor=0.5), _configs(), rates)
    full = planning.plan_study(planning.CampaignPlanConfig(kind_factor=1.0), _configs(), rates)
    assert abs(half.steps - full.steps / 2) <= 1
    tiny = planning.plan_study(planning.CampaignPlanConfig(kind_factor=1e-6, min_steps=100), _configs(), rates)
    assert tiny.steps == 100
    assert planning.plan_study(planning.CampaignPlanConfig(), _configs(), rates, steps=7).steps == 7


def test_the_committed_plan_reads_the_recorded_h200_rates():
    """configs/campaign/plan.json plans from results/gpu/check: RegularGPT 217,379 tokens/s (the train.md row) and
    ALiBi the mean of its metrics without the first window."""
    cfg = planning.load_plan_config(ROOT / "configs/campaign/plan.json")
    rates = planning.recorded_rates(cfg.record, root=ROOT)
    rows = [json.loads(x) for x in (ROOT / cfg.record / "baselines/alibi.jsonl").read_text().splitlines()]
    assert rates["alibi"].tokens_per_s == pytest.approx(sum(r["tokens_per_s"] for r in rows[1:]) / (len(rows) - 1))
    assert round(rates["regular_gpt"].tokens_per_s) == 217_379 and rates["regular_gpt"].layer_applications == 12


@pytest.mark.parametrize("raw, message", [
    ({"models": []}, "models"), ({"margin": 1.5}, "margin"), ({"budget_s": 100}, "no training time"),
    ({"min_steps": 10, "max_steps": 5}, "min_steps"), ({"kind_factr": 1}, r"unknown keys \['kind_factr'\]"),
])
def test_a_bad_plan_file_names_the_file_and_key(tmp_path, raw, message):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message) as err:
        planning.load_plan_config(path)
    assert str(path) in str(err.value)


def test_the_perplexity_table_has_a_row_per_model_and_depth_policy(tmp_path):
    """Rows as extrapolate.py writes them: RegularGPT at two depth policies, ALiBi once; ppl by length and the
    ratio of the longest length's to the training length's, by hand: 12.0 / 10.0 = 1.200, 33.0 / 11.0 = 3.000."""
    def row(run, length, ppl, policy=None, arch="transformer"):
        return {"run": f"/w/runs/{run}", "model": run, "length": length, "ppl": ppl, "tokens": 4096,
                "train_length": 512, "depth_policy": policy, "dataset": "data", "split": "test",
                "protocol": "nonoverlapping", "stride": length, "step": 20, "variant": run + str(policy),
                "seed": 0, "variant_config": {"model.architecture": arch, "model.depth_policy": "adaptive"}}
    rows = [row("regular_gpt", 512, 10.0, arch="regular_gpt"), row("regular_gpt", 1024, 12.0, arch="regular_gpt"),
            row("regular_gpt", 512, 10.0, "train", "regular_gpt"), row("regular_gpt", 1024, 10.5, "train",
                                                                       "regular_gpt"),
            row("alibi", 512, 11.0), row("alibi", 1024, 33.0)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = perplexity_table(path)
    assert "| model | 512 | 1,024 | ppl(max) / ppl(train) |" in lines
    assert "| alibi | 11.00 | 33.00 | 3.000 |" in lines
    assert "| regular_gpt (depth adaptive) | 10.00 | 12.00 | 1.200 |" in lines
    assert "| regular_gpt (depth train) | 10.00 | 10.50 | 1.050 |" in lines
