"""The v3 LM study (issues 25 and 28): its staged plan, the CPU estimate from v2's recorded timings, the findings it
computes (paired gaps, the training-budget fit) against hand-computed values, and a tiny real run of the staged
machinery (train in stage order, evaluate, receptive field, README, resume)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from pathlib import Path

import pytest

from regulargpt.config import load_config
from regulargpt.evaluation.lm_findings import summarise
from regulargpt.evaluation.lm_trends import budget_markdown, fit_gap_trend, gap_table
from regulargpt.experiments import lm_comparison as study
from regulargpt.experiments.lm_comparison.estimate import recorded_cpu, stage_costs
from regulargpt.experiments.lm_comparison.stages import receptive_field_dir
from regulargpt.experiments.lm_comparison.v3_report import budget_suffixes, v3_sections


def test_the_v3_stages_cover_every_row_once_with_the_asked_seeds() -> None:
    plan = study.V3
    runs = [(m.name, s) for _, m, s in plan.trainings()]
    assert len(runs) == len(set(runs)) == 35
    seeds = {name: sorted(s for n, s in runs if n == name) for name, _ in runs}
    assert seeds["alibi_l12"] == [0, 1, 2] and seeds["kerple_log_l12"] == [0]  # 3 seeds for ALiBi-12
    for model in study.V3_BUDGET_MODELS:  # 2 seeds at every budget
        assert all(len(seeds[model + suffix]) >= 2 for suffix in ("_s400", "", "_s3600"))
    assert seeds["nope_w64"] == seeds["rope_w64"] == [0, 1]
    # the first stage holds every row the headline answers need at seed 0
    first = {(n, s) for n, s in runs[:6]}
    assert first == {(n, 0) for n in ("regular_gpt", "alibi", "nope_w64", "rope_w64", "alibi_l12", "rg_c8")}
    assert plan.then == ("v2-t256",) and study.STUDIES["v2-t256"].lengths[-1] == 8192
    # the position encodings of 2023: one seed each, the last stage, every one probed with passkey
    assert runs[-4:] == [("fire", 0), ("xpos", 0), ("sandwich", 0), ("rope", 0)]
    assert plan.probes == (("fire", "passkey"), ("xpos", "passkey"), ("sandwich", "passkey"), ("rope", "passkey"))
    by_name = {m.name: m for m in plan.models}
    assert [s.as_dict() for s in by_name["rope"].rope_scalings] == [
        {"rope_type": "yarn", "factor": 32, "original_max_position_embeddings": 64},
        {"rope_type": "dynamic", "factor": 32, "original_max_position_embeddings": 64}]
    assert plan.steps_of(by_name["fire"]) == 1200 and by_name["rope"].sets == ()  # 1.2M tokens, no window


def test_v3_rows_train_with_their_own_steps_layers_and_window() -> None:
    plan = study.V3
    by_name = {m.name: m for m in plan.models}
    sets = study.train_overrides(plan, "python-stdlib", 1, by_name["alibi_s3600"])
    assert "train.steps=3600" in sets and "train.seed=1" in sets and plan.tokens_of(by_name["alibi_s3600"]) == 3_686_400
    assert budget_suffixes(plan) == {409_600: "_s400", 1_228_800: "", 3_686_400: "_s3600"}
    cfg = load_config(study.ROOT / "configs" / "tiny" / "rope.json",
                      study.train_overrides(plan, "python-stdlib", 0, by_name["rope_w64_l12"])).model
    assert (cfg.window, cfg.n_layers, cfg.position) == (64, 12, "rope")
    counts = study.parameter_counts(plan)  # passes: the 12-layer rows are matched on layer applications
    assert counts["alibi_l12"] > 2 * counts["regular_gpt"]
    bad = dataclasses.replace(plan, models=(*plan.models[:3], dataclasses.replace(by_name["alibi_l12"],
                                                                                 matched="parameters")), stages=())
    with pytest.raises(SystemExit, match="alibi_l12"):
        study.parameter_counts(bad)


def test_the_estimate_prices_rows_from_the_recorded_cpu_seconds() -> None:
    """v2-t256's committed trainings.jsonl records ALiBi (T = 256, 1.2M tokens) at 163.2 CPU s; a 12-layer ALiBi
    at T = 64 costs that × the FLOP ratio 3·[n·(2·12d² + 2d·(T + 1)) + 2dV] at d = 128, V = 2048; 3.6M tokens
    cost 3× the 1.2M run."""
    records = [json.loads(line) for line in (study.V2_T256.out / "trainings.jsonl").read_text().splitlines()]
    assert [r["cpu_seconds"] for r in records if r["run"].endswith("/alibi-seed0")] == [163.2]
    assert recorded_cpu(study.V2_T256)["alibi"] == 163.2
    d, v = 128, 2048

    def flops(n: int, t: int) -> float:
        return 3 * (n * (2 * 12 * d * d + 2 * d * (t + 1)) + 2 * d * v)

    plan = dataclasses.replace(study.V3, stages=(
        study.Stage("a", "", (("alibi_l12", (0,)),)), study.Stage("b", "", (("alibi_s3600", (0, 1)),))))
    a, b = stage_costs(plan, (study.V2_T256,))
    assert a.train_s == pytest.approx(163.2 * flops(12, 64) / flops(4, 256), rel=1e-6)
    assert b.train_s == pytest.approx(2 * 3 * 163.2 * flops(4, 64) / flops(4, 256), rel=1e-6)
    assert b.runs == 2 and not b.unpriced


def _rows(ppl: dict[tuple[str, int, str | None], dict[int, float]]) -> list[dict]:
    """Result rows of runs results/x/runs/d/<variant>-seed<k>: {(variant, seed, policy): {length: ppl}}."""
    return [{"run": f"results/x/runs/d/{v}-seed{s}", "depth_policy": p, "dataset": "d", "split": "test",
             "length": L, "protocol": "nonoverlapping", "stride": L, "tokens": 100, "ppl": x, "model": v}
            for (v, s, p), by_length in ppl.items() for L, x in by_length.items()]


def test_gap_table_and_budget_fit_match_hand_computed_values() -> None:
    """RegularGPT at 110/120 (seeds 0/1) against ALiBi at 100/100: gaps +10%, +20% → "+15.0% ± 7.1 (n=2)". Budget
    gaps 40, 30, 20 % at 1e5, 1e6, 1e7 tokens: −10 points per decade, +10% predicted at 1e8."""
    rows = _rows({("rg", 0, None): {64: 110.0, 128: 121.0}, ("rg", 1, None): {64: 120.0, 128: 120.0},
                  ("alibi", 0, None): {64: 100.0, 128: 100.0}, ("alibi", 1, None): {64: 100.0, 128: 96.0},
                  ("rg", 0, "train"): {64: 110.0, 128: 100.0}})
    table = summarise(rows, "d")
    lines = gap_table(table, [("rg", "adaptive"), ("rg", "train")], [("alibi", "adaptive")], [64, 128], 64)
    assert lines[0] == "| row | depth policy | vs alibi at 1× | vs alibi at 2× |"
    assert lines[2] == "| rg | adaptive | +15.0% ± 7.1 (n=2) | +23.0% ± 2.8 (n=2) |"
    assert lines[3] == "| rg | train | +10.0% (n=1) | 0.0% (n=1) |"
    fit = fit_gap_trend([(1e5, 40.0), (1e6, 30.0), (1e7, 20.0)], 1e8)
    assert fit is not None and fit.slope == pytest.approx(-10) and fit.predicted == pytest.approx(10)
    noisy = fit_gap_trend([(1e5, 41.0), (1e5, 39.0), (1e7, 21.0), (1e7, 19.0)], 1e9)
    # s² = 4·1/(4−2) = 2; Sxx = 4·1 = 4; x̄ = 6: se = sqrt(2)·sqrt(1/4 + 9/4)
    assert noisy is not None and noisy.predicted == pytest.approx(0) and noisy.predicted_se == pytest.approx(
        math.sqrt(2) * math.sqrt(2.5))
    budgets = _rows({("rg_s1", 0, None): {64: 140.0, 128: 150.0}, ("alibi_s1", 0, None): {64: 100.0, 128: 99.0},
                     ("rg", 0, None): {64: 130.0, 128: 130.0}, ("alibi", 0, None): {64: 100.0, 128: 100.0},
                     ("rg_s2", 0, None): {64: 120.0, 128: 125.0}, ("alibi_s2", 0, None): {64: 100.0, 128: 100.0}})
    text = "\n".join(budget_markdown(summarise(budgets, "d"), {10**5: "_s1", 10**6: "", 10**7: "_s2"}, ["rg"],
                                     "alibi", 64, 128, 10**8))
    assert "| rg_s1 | 100,000 | 1 | +40.0% |" in text and "| rg_s2 | 10,000,000 | 1 | +20.0% |" in text
    assert "changes -10.0 ± 0.0 points per decade" in text and "gap % = 90.0 -10.0·log10 N" in text
    assert "predicts +10.0% ± 0.0" in text


@pytest.fixture(scope="module")
def stdlib_2048(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """python-stdlib, 400 kB, the study's 2048-piece tokenizer: the data root of a tiny staged plan."""
    from regulargpt.data import prepare

    root = tmp_path_factory.mktemp("lm_data")
    prepare("python-stdlib", root / "python-stdlib", vocab_size=study.VOCAB, max_bytes=400_000, val_fraction=0.2,
            num_proc=1)
    return root


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_a_tiny_staged_study_trains_in_stage_order_reports_and_resumes(stdlib_2048: Path, tmp_path: Path) -> None:
    base = study.V3
    by_name = {m.name: m for m in base.models}
    plan = dataclasses.replace(
        base, out=tmp_path / "v3", data_root=stdlib_2048, max_bytes=400_000, steps=3, batch_size=2, multiples=2,
        eval_tokens=256, then=(), receptive_field_length=64, receptive_fields=(("nope_w64", ""), ("regular_gpt", "train")),
        models=(by_name["regular_gpt"], by_name["alibi"], by_name["nope_w64"],
                dataclasses.replace(by_name["alibi_s400"], name="alibi_s6", steps=6),
                dataclasses.replace(by_name["regular_gpt_s400"], name="regular_gpt_s6", steps=6)),
        stages=(study.Stage("first", "the headline rows", (("nope_w64", (0,)), ("regular_gpt", (0,)),
                                                          ("alibi", (0,)))),
                study.Stage("second", "a budget", (("alibi_s6", (0,)), ("regular_gpt_s6", (0,))))))
    counts = study.parameter_counts(plan)  # (no prepare_data: the fixture's data, with a val split long enough)
    assert study.train_all(plan) == []
    order = sorted(plan.trainings(), key=lambda r: (plan.run_dir(*r) / "wall.json").stat().st_mtime_ns)
    assert [m.name for _, m, _ in order] == ["nope_w64", "regular_gpt", "alibi", "alibi_s6", "regular_gpt_s6"]
    assert json.loads((plan.run_dir(*order[3]) / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 6
    study.evaluate_all(plan, memory_gb=1.0)
    assert (receptive_field_dir(plan, "nope_w64", "") / "receptive_field.json").is_file()
    rf = json.loads((receptive_field_dir(plan, "regular_gpt", "train") / "receptive_field.json").read_text())
    assert rf["model"].endswith("depth=train") and rf["length"] == 64
    study.write_readme(plan, counts, "python eval/lm_comparison.py --study v3", [], None)
    readme = (plan.out / "README.md").read_text()
    for needle in ("## Stages", "| first | the headline rows | 3 / 3 |", "### Equal parameters or equal compute",
                   "| regular_gpt | train | ", "### As training grows", "| regular_gpt_s6 | 768 | 1 |",
                   "against a 64-token window", "| nope_w64 | own |", "| regular_gpt | train | "):
        assert needle in readme, needle
    assert (plan.out / "gap_vs_tokens.png").is_file() and (plan.out / "ppl_vs_length_by_budget.png").is_file()
    assert v3_sections(dataclasses.replace(plan, stages=())) == []
    before = {r: (plan.run_dir(*r) / "wall.json").stat().st_mtime_ns for r in plan.trainings()}
    assert study.train_all(plan) == []  # resumed: nothing trains again
    assert before == {r: (plan.run_dir(*r) / "wall.json").stat().st_mtime_ns for r in plan.trainings()}


def test_a_study_whose_run_folders_are_gone_resumes_from_its_committed_rows(stdlib_2048: Path, tmp_path: Path) -> None:
    """A fresh checkout has results.jsonl and trainings.jsonl but no run folders: a run whose every row (each length,
    each extra depth policy, its receptive field) is recorded is not retrained and still counts as done in the stage
    table and the README's timings; a run missing one row is retrained. The first trainings run two at a time
    (--jobs 2)."""
    base = study.V3
    by_name = {m.name: m for m in base.models}
    plan = dataclasses.replace(
        base, out=tmp_path / "v3", data_root=stdlib_2048, max_bytes=400_000, steps=3, batch_size=2, multiples=2,
        eval_tokens=256, then=(), receptive_field_length=64, receptive_fields=(("regular_gpt", "train"),),
        models=(by_name["regular_gpt"], by_name["alibi"]),
        stages=(study.Stage("first", "the headline rows", (("regular_gpt", (0,)), ("alibi", (0,)))),))
    assert study.train_all(plan, jobs=2) == []  # both at once, each timed apart
    study.evaluate_all(plan, memory_gb=1.0)
    rg, alibi = plan.trainings()
    assert [study.missing_rows(plan, *r) for r in (rg, alibi)] == [[], []]
    records = study.training_records(plan)
    assert sorted(records) == sorted(study.rel_path(plan.run_dir(*r)) for r in (rg, alibi))
    assert all(r["tokens"] == 3 * 2 * 64 and r["cpu_seconds"] > 0 for r in records.values())
    first_end = min(r["started_unix"] + r["seconds"] for r in records.values())
    assert all(r["started_unix"] < first_end for r in records.values())  # the two trainings overlapped
    with pytest.raises(ValueError, match="jobs"):
        study.train_all(plan, jobs=0)
    for r in (rg, alibi):  # the machine did not persist
        shutil.rmtree(plan.run_dir(*r))
    results = plan.out / "python-stdlib" / "results.jsonl"
    rows = results.read_text().splitlines()
    dropped = [line for line in rows if json.loads(line)["run"].endswith("alibi-seed0")
               and json.loads(line)["length"] == 128]
    results.write_text("\n".join(line for line in rows if line not in dropped) + "\n")
    assert study.missing_rows(plan, *alibi) == [(128, None, "nonoverlapping", None, None)]
    assert study.done(plan, *rg) and not study.done(plan, *alibi)
    assert "| first | the headline rows | 1 / 2 |" in study.estimate_table([plan])
    assert study.train_all(plan) == []  # trains alibi again, not regular_gpt
    assert not plan.run_dir(*rg).exists() and (plan.run_dir(*alibi) / "model.pt").is_file()
    counts = study.parameter_counts(plan)
    study.write_readme(plan, counts, "python eval/lm_comparison.py --study v3", [], None)
    assert "- Training: 2 runs," in (plan.out / "README.md").read_text()  # rg's timing from trainings.jsonl
    # a follow-up plan in the same process counts only the CPU of the children finished since it started
    assert study.children_cpu() >= 6  # so counting every child (the bug) would read >= 0.1 min, not 0.0
    study.write_readme(plan, counts, "python eval/lm_comparison.py --study v3", [], time.time(), study.children_cpu())
    assert json.loads((plan.out / "invocation.json").read_text())["cpu_min"] == 0.0


def test_a_paired_gap_reports_its_mean_and_per_seed_range_by_hand() -> None:
    from regulargpt.evaluation.lm_findings import Summary
    from regulargpt.experiments.lm_comparison.v3_report import _mean_gap

    table = {("rg", "train"): Summary("rg", "train", {64: {0: 60.0, 1: 66.0, 2: 70.0}}),
             ("w", "adaptive"): Summary("w", "adaptive", {64: {0: 50.0, 1: 50.0}})}
    gap = _mean_gap(table, ("rg", "train"), ("w", "adaptive"), 64)  # seeds 0, 1 only: +20% and +32%
    assert gap is not None and gap.n == 2
    assert all(math.isclose(a, b) for a, b in zip((gap.mean, gap.lo, gap.hi), (26.0, 20.0, 32.0)))
    assert gap.spread == "n=2, seeds +20.0 … +32.0%"
    assert _mean_gap(table, ("rg", "train"), ("w", "adaptive"), 128) is None
    one = _mean_gap({**table, ("w", "adaptive"): Summary("w", "adaptive", {64: {0: 50.0}})},
                    ("rg", "train"), ("w", "adaptive"), 64)
    assert one is not None and one.spread == "n=1"


def test_an_evaluation_time_rope_scaling_is_checked_where_the_plan_is_written() -> None:
    yarn = study.RopeScaling("yarn", 32, 64)
    assert yarn.key == '{"factor":32.0,"original_max_position_embeddings":64,"rope_type":"yarn"}'
    with pytest.raises(ValueError, match=r"rope_type: 'yarnn' is not accepted; expected one of 'linear', 'ntk', "
                                         r"'dynamic', 'yarn'"):
        study.RopeScaling("yarnn", 32, 64)
    with pytest.raises(ValueError, match="factor: 0.5 is not accepted"):
        study.RopeScaling("dynamic", 0.5, 64)
    with pytest.raises(TypeError, match="rope_scalings takes RopeScaling objects"):
        study.Variant("rope", "rope", rope_scalings=({"rope_type": "yarn", "factor": 32},))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeat a rope_type"):
        study.Variant("rope", "rope", rope_scalings=(yarn, study.RopeScaling("yarn", 16, 64)))
    with pytest.raises(ValueError, match="probes"):
        dataclasses.replace(study.V3, probes=(("rope", "passkeys"),))


def _row(run: str, length: int, **extra: object) -> dict:
    """A perplexity row of the v3 plan's results file (eval tokens 16384), or a probe row with probe=…"""
    base = {"run": run, "depth_policy": None, "dataset": "python-stdlib", "split": "test", "length": length,
            "protocol": "nonoverlapping", "stride": length, "tokens": 16384, "ppl": 100.0, "model": "RoPE"}
    if "probe" in extra:
        base.update(split=None, protocol=None, stride=None, tokens=None, by_depth=[])
    return {**base, **extra}


def test_missing_rows_asks_for_each_scaled_row_and_each_probe_row(tmp_path: Path) -> None:
    """The v3 rope seed-0 run at 64 … 2048: unscaled rows at every length but 2048, whose only row is scaled (YaRN);
    YaRN at 64 and 2048; passkey at every length, at 256 with 3 trials (not the plan's 20), and under YaRN at 64.
    Missing: unscaled 2048, YaRN 128 … 1024, dynamic NTK everywhere, passkey 256, passkey under YaRN 128 … 2048 and
    under dynamic NTK everywhere."""
    plan = dataclasses.replace(study.V3, out=tmp_path)
    rope = next(m for m in plan.models if m.name == "rope")
    run = study.rel_path(plan.run_dir("python-stdlib", rope, 0))
    yarn = '{"factor":32.0,"original_max_position_embeddings":64,"rope_type":"yarn"}'
    dynamic = '{"factor":32.0,"original_max_position_embeddings":64,"rope_type":"dynamic"}'
    rows = [_row(run, L) for L in (64, 128, 256, 512, 1024)] + [_row(run, L, rope_scaling=yarn) for L in (64, 2048)]
    assert plan.probe_trials == 20
    rows += [_row(run, L, probe="passkey", probe_config={"trials": 3 if L == 256 else 20}, accuracy=1.0)
             for L in (64, 128, 256, 512, 1024, 2048)]
    rows.append(_row(run, 64, probe="passkey", probe_config={"trials": 20}, accuracy=1.0, rope_scaling=yarn))
    (tmp_path / "python-stdlib").mkdir()
    (tmp_path / "python-stdlib" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert study.missing_rows(plan, "python-stdlib", rope, 0) == [
        (2048, None, "nonoverlapping", None, None),
        *((L, None, "nonoverlapping", yarn, None) for L in (128, 256, 512, 1024)),
        *((L, None, "nonoverlapping", dynamic, None) for L in (64, 128, 256, 512, 1024, 2048)),
        (256, None, None, None, "passkey"),
        *((L, None, None, yarn, "passkey") for L in (128, 256, 512, 1024, 2048)),
        *((L, None, None, dynamic, "passkey") for L in (64, 128, 256, 512, 1024, 2048))]
    assert len(study.missing_rows(plan, "python-stdlib", rope, 1)) == 18  # seed 1: no probe rows asked


def test_the_positions_table_reads_scaled_and_probe_rows_by_hand(tmp_path: Path) -> None:
    """FIRE at ppl 100 (64) and 150 (128) against ALiBi's 80, 80: ratio 1.500, gaps +25.0% and +87.5%; RoPE + YaRN
    at 90, 99: ratio 1.100; FIRE's passkey 1.00 at 64 and 0.80 at 128: effective length 64; RoPE + YaRN's passkey
    0.30 at 64 (its own row, not the unscaled RoPE's): effective length < 64."""
    from regulargpt.experiments.lm_comparison.v3_report import _positions

    plan = dataclasses.replace(study.V3, out=tmp_path, multiples=2)
    run = str(tmp_path / "runs" / "python-stdlib")
    yarn = '{"factor":32.0,"original_max_position_embeddings":64,"rope_type":"yarn"}'
    rows = [_row(f"{run}/fire-seed0", 64, ppl=100.0), _row(f"{run}/fire-seed0", 128, ppl=150.0),
            _row(f"{run}/alibi-seed0", 64, ppl=80.0), _row(f"{run}/alibi-seed0", 128, ppl=80.0),
            _row(f"{run}/rope-seed0", 64, ppl=90.0, rope_scaling=yarn),
            _row(f"{run}/rope-seed0", 128, ppl=99.0, rope_scaling=yarn),
            _row(f"{run}/fire-seed0", 64, probe="passkey", accuracy=1.0),
            _row(f"{run}/fire-seed0", 128, probe="passkey", accuracy=0.8),
            _row(f"{run}/rope-seed0", 64, probe="passkey", accuracy=0.3, rope_scaling=yarn)]
    (tmp_path / "python-stdlib").mkdir()
    (tmp_path / "python-stdlib" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = summarise(rows, "python-stdlib")
    assert set(table) == {("fire", "adaptive"), ("alibi", "adaptive"), ("rope+yarn", "adaptive")}
    lines = _positions(plan, table, 64, 128)
    assert lines[-3:] == ["| fire | adaptive | 1 | 100.00 | 150.00 | 1.500 | +25.0% | +87.5% | 1.00 | 0.80 | 64 |",
                          "| rope+yarn | adaptive | 1 | 90.00 | 99.00 | 1.100 | +12.5% | +23.8% | 0.30 | — | < 64 |",
                          "| alibi | adaptive | 1 | 80.00 | 80.00 | 1.000 | — | — | — | — | — |"]
