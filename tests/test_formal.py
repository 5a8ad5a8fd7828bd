"""Formal-language pipeline: training loop + resume, range evaluation + score, sweep skipping, aggregation."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import HAS_MATPLOTLIB, Crash, CrashingTask, load_script, tiny_cfg, tiny_raw
from helpers import formal_losses as losses

from regulargpt.checkpoint import save_model_file
from regulargpt.config import ConfigError, FormalConfig, load_config_dict
from regulargpt.evaluation.formal_scoring import RangeEvalError, parse_lengths, range_evaluate, range_score, read_rows
from regulargpt.experiments.formal_sweep import Profile, load_profile, plan_runs, run_sweep
from regulargpt.experiments.formal_records import read_records
from regulargpt.experiments.formal_tables import collect_runs, table1, table2, write_tables
from regulargpt.model import build_model
from regulargpt.provenance import git_commit
from regulargpt.tasks import make_task
from regulargpt.train.formal_trainer import formal_task, train_formal

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "formal"


def test_training_writes_run_files_and_resume_is_exact(tmp_path: Path) -> None:
    cfg = tiny_cfg()
    straight = tmp_path / "straight"
    train_formal(cfg, straight)
    for name in ("config.resolved.json", "metrics.jsonl", "ckpt.pt", "model.pt"):
        assert (straight / name).is_file(), name
    rows = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert set(rows[0]) == {"step", "loss", "acc", "lr", "length", "seconds"}
    assert all(1 <= r["length"] <= 6 for r in rows)

    resumed = tmp_path / "resumed"
    with pytest.raises(Crash):  # dies during step 6: the last checkpoint is step 3, metrics reached step 5
        train_formal(cfg, resumed, task_factory=lambda c: CrashingTask(formal_task(c), crash_at=6))
    assert not (resumed / "model.pt").exists() and len(losses(resumed)) == 5
    train_formal(cfg, resumed)
    assert losses(resumed) == losses(straight)
    a = torch.load(straight / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(resumed / "model.pt", weights_only=True)["state_dict"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_with_a_different_config_is_an_error(tmp_path: Path) -> None:
    train_formal(tiny_cfg(steps=2), tmp_path)
    with pytest.raises(ConfigError, match="train.lr"):
        train_formal(tiny_cfg(steps=2, lr=5e-3), tmp_path)


def test_vocab_or_classes_disagreeing_with_the_task_is_a_clear_error(tmp_path: Path) -> None:
    raw = tiny_raw()
    raw["model"]["vocab_size"] = 3
    with pytest.raises(ConfigError, match=r"model.vocab_size = 3 .*input_vocab_size = 2"):
        train_formal(load_config_dict(raw, kind=FormalConfig), tmp_path)
    raw["model"]["vocab_size"], raw["data"]["task"] = 2, "cycle_navigation"
    with pytest.raises(ConfigError, match="model.vocab_size = 2 .*input_vocab_size = 3"):
        formal_task(load_config_dict(raw, kind=FormalConfig))


def test_parse_lengths() -> None:
    assert parse_lengths("", 5) == [1, 2, 3, 4, 5]
    assert parse_lengths("1-3,41-500:20,500", 500) == [1, 2, 3, *range(41, 500, 20), 500]
    assert parse_lengths("90-200", 100) == list(range(90, 101))
    with pytest.raises(ValueError):
        parse_lengths("5-2", 10)


def test_range_evaluation_is_in_eval_mode_and_resumable(tmp_path: Path) -> None:
    model = build_model(tiny_cfg().model)  # dropout 0.1: outputs would vary in train mode
    modes: list[bool] = []
    model.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    task = make_task("parity_check")
    first = range_evaluate(model.train(), task, [1, 5, 9], 32, tmp_path / "a.jsonl", batch_tokens=40, progress=False)
    assert modes and not any(modes)
    second = range_evaluate(model, task, [1, 5, 9], 32, tmp_path / "b.jsonl", progress=False)
    # other sub-batches (batch_tokens): the same accuracies; the loss up to float summation order
    assert {t: {**row, "loss": pytest.approx(row["loss"], rel=1e-5)} for t, row in first.items()} == second
    assert [row["n"] for row in first.values()] == [32, 32, 32]
    calls = len(modes)
    range_evaluate(model, task, [1, 5, 9, 11], 32, tmp_path / "b.jsonl", progress=False)  # only length 11 is new
    assert len(modes) == calls + 1 and sorted(read_rows(tmp_path / "b.jsonl")) == [1, 5, 9, 11]
    with pytest.raises(ValueError, match="n=32"):
        range_evaluate(model, task, [1], 64, tmp_path / "b.jsonl", progress=False)


def test_score_averages_exactly_lengths_41_to_max(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"length": t, "input_length": t, "accuracy": t / 100, "n": 4}) + "\n"
                            for t in range(1, 61)))
    rows = read_rows(path)
    assert range_score(rows, 41, 60) == pytest.approx(sum(range(41, 61)) / 20 / 100)
    assert range_score(rows, 41, 50) == pytest.approx(0.455)
    assert range_score({t: rows[t] for t in (1, 40, 41, 59)}, 41, 60) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        range_score({t: rows[t] for t in range(1, 41)}, 41, 60)


def _fake_run(runs: Path, model: str, seed: int, accuracy: dict[float | None, float], lr: float = 0.01,
              loss: float | None = None) -> None:
    """A finished run folder with constant per-length accuracies (None = range.jsonl, else range_p<P>.jsonl), and
    with `loss` a constant per-length loss in range.jsonl."""
    cfg = tiny_cfg()
    run = runs / "parity_check" / model / f"seed{seed}_lr{lr:g}"
    run.mkdir(parents=True)
    lengths = [1, 6, 7, 12]
    p_values = [p for p in accuracy if p is not None]
    (run / "sweep.json").write_text(json.dumps({"profile": "quick", "task_id": "parity_check", "model": model,
                                                "seed": seed, "lr": lr, "eval_lengths": lengths,
                                                "samples_per_length": 16, "table2_p_one": [*p_values, 0.5]}))
    (run / "config.resolved.json").write_text(json.dumps({"model": vars(cfg.model), "data": vars(cfg.data),
                                                          "train": vars(cfg.train), "eval": vars(cfg.eval),
                                                          "logging": vars(cfg.logging)}))
    save_model_file(run / "model.pt", cfg, build_model(cfg.model), meta={"train_seconds": 1.0})
    for p, acc in accuracy.items():
        name = "range.jsonl" if p is None else f"range_p{p:g}.jsonl"
        # lengths <= 6 (training) get acc + 0.1 (capped), lengths >= 7 (extrapolation) get acc
        graded = {} if loss is None or p is not None else {"loss": loss}
        (run / name).write_text("".join(json.dumps({"length": t, "input_length": t, "n": 16, **graded,
                                                    "accuracy": min(1.0, acc + 0.1) if t <= 6 else acc}) + "\n"
                                        for t in lengths))


def test_aggregation_on_hand_made_runs(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    _fake_run(runs, "regular_gpt_c2", 0, {None: 1.0, 0.1: 0.8})
    _fake_run(runs, "regular_gpt_c2", 1, {None: 0.6, 0.1: 0.5})
    _fake_run(runs, "lstm", 0, {None: 0.7, 0.1: 0.7})
    pending = runs / "parity_check" / "lstm" / "seed1_lr0.01"
    pending.mkdir()
    (pending / "sweep.json").write_text((runs / "parity_check/lstm/seed0_lr0.01/sweep.json").read_text())

    finished, waiting = collect_runs(runs, "quick")
    assert len(finished) == 3 and waiting == ["parity_check/lstm/seed1_lr0.01"]
    t1 = table1([r.record("test") for r in finished], ["parity_check"], ["regular_gpt_c2", "lstm"])
    assert t1["parity_check"]["regular_gpt_c2"]["max"] == pytest.approx(1.0)
    assert t1["parity_check"]["regular_gpt_c2"]["mean"] == pytest.approx(0.8)
    assert t1["parity_check"]["lstm"]["n"] == 1
    t2 = table2([r.record("test") for r in finished], "parity_check", [0.1, 0.5], ["regular_gpt_c2", "lstm"])
    assert t2["extrapolation"]["regular_gpt_c2"]["0.1"]["mean"] == pytest.approx(0.65)
    assert t2["train_lengths"]["regular_gpt_c2"]["0.1"]["max"] == pytest.approx(0.9)
    assert t2["extrapolation"]["regular_gpt_c2"]["0.5"]["max"] == pytest.approx(1.0)  # P = 0.5 is range.jsonl

    profile = Profile(name="quick", description="", tasks=["parity_check", "even_pairs"],
                      models=["regular_gpt_c2", "lstm"], seeds=[0, 1], table2_task="parity_check",
                      table2_p_one=[0.1, 0.5], sections={"First": ["parity_check"], "Second": ["even_pairs"]})
    paths = write_tables(runs, profile, tmp_path, command=["eval/formal.py", "aggregate"])
    text = (tmp_path / "table1_quick.md").read_text()
    assert len(paths) == 4 and "1.000 / 0.800 (2)" in text and "7..12" in text and "Commit:" in text
    assert "### First" in text and "### Second" not in text  # a section without finished or planned runs is left out
    assert json.loads((tmp_path / "table2_quick.json").read_text())["table"] == json.loads(json.dumps(t2))


def test_tables_tell_a_failure_to_fit_from_a_failure_to_extrapolate(tmp_path: Path) -> None:
    """A run's fit is its mean accuracy over the training lengths (the fake runs: lengths 1 and 6 at acc + 0.1);
    a cell with a run below 0.99 is marked † and the fit table says how many runs miss."""
    runs = tmp_path / "runs"
    _fake_run(runs, "regular_gpt_c2", 0, {None: 0.95})  # fits: training lengths at 1.0, extrapolation 0.95
    _fake_run(runs, "lstm", 0, {None: 0.5})  # does not fit: training lengths at 0.6
    _fake_run(runs, "lstm", 1, {None: 1.0})
    finished, _ = collect_runs(runs, "quick")
    t1 = table1([r.record("test") for r in finished], ["parity_check"], ["regular_gpt_c2", "lstm"])
    assert t1["parity_check"]["regular_gpt_c2"]["fits"] == [pytest.approx(1.0)]
    assert t1["parity_check"]["regular_gpt_c2"]["unfit"] == 0
    assert sorted(t1["parity_check"]["lstm"]["fits"]) == [pytest.approx(0.6), pytest.approx(1.0)]
    assert t1["parity_check"]["lstm"]["unfit"] == 1
    profile = Profile(name="quick", description="", tasks=["parity_check"], models=["regular_gpt_c2", "lstm"],
                      seeds=[0, 1], table2_task="parity_check")
    write_tables(runs, profile, tmp_path, command=["x"])
    text = (tmp_path / "table1_quick.md").read_text()
    assert "| parity_check | 0.950 / 0.950 (1) | 1.000 / 0.750 (2) † |" in text
    assert "| parity_check | 1.000 / 1.000 | 1.000 / 0.800 (1 of 2 < 0.99) |" in text


def test_tables_say_which_planned_cells_are_still_running(tmp_path: Path) -> None:
    """With the profile's planned runs, every planned cell is shown with how many of its runs have finished, and a
    finished run made with another recipe is not counted (listed as stale)."""
    runs = tmp_path / "runs"
    _fake_run(runs, "regular_gpt_c2", 0, {None: 1.0})
    _fake_run(runs, "lstm", 0, {None: 0.7})
    profile = Profile(name="quick", description="", tasks=["parity_check", "even_pairs"],
                      models=["regular_gpt_c2", "lstm"], seeds=[0, 1], table2_task="parity_check",
                      sections={"First": ["parity_check"], "Second": ["even_pairs"]})
    recipe = collect_runs(runs, "quick")[0][0].recipe
    specs = [SimpleNamespace(task_id=t, model=m, recipe=recipe if m == "regular_gpt_c2" else "another", rule="last",
                             last_model_recipe=recipe if m == "regular_gpt_c2" else "another")
             for t in profile.tasks for m in profile.models for _ in (0, 1)]
    write_tables(runs, profile, tmp_path, specs=specs, command=["x"])  # type: ignore[arg-type]
    text = (tmp_path / "table1_quick.md").read_text()
    assert "1.000 / 1.000 (1 of 2; rest pending)" in text
    assert "pending (0 of 2)" in text and "### Second" in text
    assert "Stale (not counted): 1 runs trained with a recipe the profile no longer plans: parity_check 1" in text
    cell = json.loads((tmp_path / "table1_quick.json").read_text())["table"]["parity_check"]["regular_gpt_c2"]
    assert cell["recipes"] == [recipe] and cell["expected"] == 2 and cell["n"] == 1


def _body(markdown: str) -> str:
    """A table's markdown below its provenance header (from the protocol lines on)."""
    return markdown[markdown.index("\nProtocol"):]


def test_kept_run_records_carry_runs_whose_folders_are_gone(tmp_path: Path) -> None:
    """A table's JSON holds one record per run; aggregating again with it as `keep` and no run folders rewrites the
    same tables; a run folder replaces its record; a record whose recipe the profile no longer plans is dropped."""
    runs = tmp_path / "runs"
    _fake_run(runs, "regular_gpt_c2", 0, {None: 1.0, 0.1: 0.8})
    _fake_run(runs, "regular_gpt_c2", 1, {None: 0.6, 0.1: 0.5})
    _fake_run(runs, "lstm", 0, {None: 0.7, 0.1: 0.7})
    profile = Profile(name="quick", description="", tasks=["parity_check"], models=["regular_gpt_c2", "lstm"],
                      seeds=[0, 1], table2_task="parity_check", table2_p_one=[0.1, 0.5])
    first, again, kept = tmp_path / "first", tmp_path / "again", tmp_path / "kept.json"
    write_tables(runs, profile, first, command=["x"])
    (first / "table1_quick.json").rename(kept)
    write_tables(tmp_path / "gone", profile, again, command=["x"], keep=kept)
    for name in ("table1_quick.md", "table2_quick.md"):
        assert _body((again / name).read_text()) == _body((first / name).read_text())
    assert "Carried from the kept table's run records (run folders not in --runs): 3 runs" in (
        again / "table1_quick.md").read_text()
    assert "Runs trained by the code at: not recorded (3)" in (again / "table1_quick.md").read_text()
    records = read_records(again / "table1_quick.json")
    assert [(r.name, r.score) for r in records] == [("parity_check/lstm/seed0_lr0.01", pytest.approx(0.7)),
                                                    ("parity_check/regular_gpt_c2/seed0_lr0.01", pytest.approx(1.0)),
                                                    ("parity_check/regular_gpt_c2/seed1_lr0.01", pytest.approx(0.6))]
    assert records[1].table2 == {"0.1": [pytest.approx(0.9), pytest.approx(0.8)],
                                 "0.5": [pytest.approx(1.0), pytest.approx(1.0)]}

    # seed 1 trained again (its folder is back, now at 1.0): the folder wins over the record
    (tmp_path / "new").mkdir()
    _fake_run(tmp_path / "new", "regular_gpt_c2", 1, {None: 1.0, 0.1: 1.0})
    write_tables(tmp_path / "new", profile, again, command=["x"], keep=kept)
    cell = json.loads((again / "table1_quick.json").read_text())["table"]["parity_check"]["regular_gpt_c2"]
    assert cell["mean"] == pytest.approx(1.0) and cell["n"] == 2

    # the profile now plans another recipe for the lstm: its record is not counted, and the table says why
    specs = [SimpleNamespace(task_id="parity_check", model=m, recipe=records[1].recipe if m != "lstm" else "new",
                             rule="last", last_model_recipe=records[1].recipe if m != "lstm" else "new")
             for m in profile.models for _ in (0, 1)]
    write_tables(tmp_path / "gone", profile, again, specs=specs, command=["x"], keep=kept)  # type: ignore[arg-type]
    text = (again / "table1_quick.md").read_text()
    assert "Stale (not counted): 1 runs" in text and "pending (0 of 2)" in text


def test_an_unchanged_table_is_left_byte_identical_and_a_changed_one_says_what_changed(tmp_path: Path) -> None:
    """Aggregating again (another command, same runs) leaves both tables' bytes alone and says so; one more run
    rewrites them with a line naming the added run and the cell whose mean and run count moved."""
    runs = tmp_path / "runs"
    _fake_run(runs, "regular_gpt_c2", 0, {None: 1.0, 0.1: 0.8})
    profile = Profile(name="quick", description="", tasks=["parity_check"], models=["regular_gpt_c2"],
                      seeds=[0, 1], table2_task="parity_check", table2_p_one=[0.1, 0.5])
    messages: list[str] = []
    paths = write_tables(runs, profile, tmp_path / "out", command=["first"], log=messages.append)
    assert messages == [f"{paths[0]}: a new table", f"{paths[2]}: a new table"]
    before = {p: p.read_bytes() for p in paths}
    messages.clear()
    write_tables(runs, profile, tmp_path / "out", command=["second", "command"], log=messages.append)
    assert {p: p.read_bytes() for p in paths} == before
    assert messages == [f"{p}: unchanged but for its provenance stamp; left as it was" for p in (paths[0], paths[2])]
    _fake_run(runs, "regular_gpt_c2", 1, {None: 0.6, 0.1: 0.5})
    messages.clear()
    write_tables(runs, profile, tmp_path / "out", command=["third"], log=messages.append)
    assert messages[0] == (f"{paths[0]}: 1 run added (parity_check/regular_gpt_c2/seed1_lr0.01); 1 cell changed: "
                           f"parity_check regular_gpt_c2 max 1 → 1, mean 1 → 0.8, runs 1 → 2")
    assert "cells changed" in messages[1] and "train_lengths regular_gpt_c2 0.1" in messages[1]


def test_aggregate_with_a_missing_runs_folder_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "tables"
    with pytest.raises(ConfigError, match=r"--runs .*nowhere: no such folder"):
        load_script("eval/formal.py").main(["aggregate", "--runs", str(tmp_path / "nowhere"), "--profile", "cpu",
                                            "--out-dir", str(out), "--configs", str(CONFIGS)])
    assert not out.exists()


def test_range_rows_hold_the_cross_entropy(tmp_path: Path) -> None:
    """A classifier with a zeroed output layer gives equal logits: every string's loss is ln(classes) exactly."""
    cfg = tiny_cfg()
    model = build_model(cfg.model)
    head = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    torch.nn.init.zeros_(head.weight)
    if head.bias is not None:
        torch.nn.init.zeros_(head.bias)
    rows = range_evaluate(model, formal_task(cfg), [3, 7], 8, tmp_path / "range.jsonl", progress=False)
    assert [rows[t]["loss"] for t in (3, 7)] == [pytest.approx(math.log(cfg.model.num_classes))] * 2


def test_choose_lr_reads_only_the_training_lengths_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lowest mean training-length loss wins, whatever the held-out accuracy (here the loser's is higher)."""
    runs = tmp_path / "runs"
    for seed in (0, 1):
        _fake_run(runs, "regular_gpt_c2", seed, {None: 1.0}, lr=0.001, loss=0.02 + seed * 0.01)
        _fake_run(runs, "regular_gpt_c2", seed, {None: 0.6}, lr=0.003, loss=0.01)
    script = load_script("eval/formal.py")
    dirs = [str(p) for p in sorted((runs / "parity_check" / "regular_gpt_c2").iterdir())]
    assert script.main(["choose-lr", "--runs", *dirs, "--out", str(tmp_path / "lr.md")]) == 0
    table = (tmp_path / "lr.md").read_text()
    assert "| 0.003 | 0, 1 | 1.00e-02, 1.00e-02 | 1.00e-02 |" in table and "| **yes** |" in table
    assert "| 0.001 | 0, 1 | 2.00e-02, 3.00e-02 | 2.50e-02 | 1.000, 1.000 |  |" in table
    _fake_run(runs, "lstm", 0, {None: 1.0}, loss=0.1)  # another model
    with pytest.raises(ConfigError, match="one task and model"):
        script.main(["choose-lr", "--runs", *dirs, str(runs / "parity_check/lstm/seed0_lr0.01")])
    _fake_run(runs, "lstm", 1, {None: 1.0})  # evaluated before rows had a loss
    with pytest.raises(RangeEvalError, match="seed1_lr0.01/range.jsonl: no loss in its training-length rows"):
        script.main(["choose-lr", "--runs", str(runs / "parity_check/lstm/seed1_lr0.01")])


def test_a_table_without_run_records_cannot_be_kept(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(json.dumps({"table": {}}))
    with pytest.raises(ConfigError, match="old.json: holds no 'runs'"):
        read_records(tmp_path / "old.json")
    (tmp_path / "bad.json").write_text(json.dumps({"runs": [{"task_id": "parity_check"}]}))
    with pytest.raises(ConfigError, match=r"bad.json: runs\[0\]: run record keys missing \['model'"):
        read_records(tmp_path / "bad.json")


COMMITTED_TABLES = sorted((Path(__file__).resolve().parents[1] / "results" / "formal").glob("table1_*.json"))


@pytest.mark.parametrize("table", COMMITTED_TABLES, ids=lambda p: p.name)
def test_committed_tables_are_what_their_run_records_render(table: Path, tmp_path: Path) -> None:
    """The committed markdown of Tables 1 and 2 is what the code on main renders from the committed run records."""
    profile = load_profile(json.loads(table.read_text())["profile"], CONFIGS)
    write_tables(tmp_path / "no-runs", profile, tmp_path, specs=plan_runs(profile, "unused", configs_dir=CONFIGS),
                 command=["x"], keep=table)
    for name in (table.name, table.name.replace("table1_", "table2_")):
        committed = table.with_name(name).with_suffix(".md").read_text()
        assert _body((tmp_path / name).with_suffix(".md").read_text()) == _body(committed), name


@pytest.mark.parametrize("table", COMMITTED_TABLES, ids=lambda p: p.name)
def test_committed_tables_match_what_their_profile_runs(table: Path) -> None:
    """A committed Table 1 was made with the recipes its profile plans today; a change to a config, a profile or
    an init default that changes what a run trains makes this fail until the table is regenerated. Runs trained as
    planned but kept by the last-model rule count (the table marks or counts them apart)."""
    payload = json.loads(table.read_text())
    profile = load_profile(payload["profile"], CONFIGS)
    planned: dict[tuple[str, str], set[str]] = {}
    for spec in plan_runs(profile, "unused", configs_dir=CONFIGS):
        planned.setdefault((spec.task_id, spec.model), set()).update({spec.recipe, spec.last_model_recipe})
    for task, row in payload["table"].items():
        for model, cell in row.items():
            stale = set(cell.get("recipes", ["(none recorded)"])) - planned.get((task, model), set())
            assert not stale, f"{table.name}: {task}/{model} was made with recipe(s) {sorted(stale)}; rerun the sweep"


def test_sweep_skips_finished_runs(tmp_path: Path) -> None:
    configs = tmp_path / "configs"
    (configs / "models").mkdir(parents=True)
    (configs / "profiles").mkdir()
    (configs / "parity_check.json").write_text(json.dumps(tiny_raw(steps=2, save_every=0)))
    (configs / "models" / "c2.json").write_text(json.dumps({"model": {"chunk_size": 2}}))
    (configs / "profiles" / "t.json").write_text(json.dumps({
        "name": "t", "description": "test", "tasks": ["parity_check"], "models": ["c2"], "seeds": [0, 1],
        "lrs": {"*/*": [0.01]}, "overrides": {"*/c2": {"train": {"steps": 3}}}, "eval_lengths": "1-2,7-12:5",
        "table2_task": "parity_check", "table2_p_one": [0.3, 0.5]}))
    profile = load_profile("t", configs)
    specs = plan_runs(profile, tmp_path / "runs", configs_dir=configs)
    assert [s.name for s in specs] == ["parity_check/c2/seed0_lr0.01", "parity_check/c2/seed1_lr0.01"]
    assert specs[0].cfg.train.steps == 3 and specs[0].eval_lengths == [1, 2, 7, 12]
    first = run_sweep(specs)
    assert [r["error"] for r in first] == ["", ""]
    assert sorted(p.name for p in specs[0].run_dir.glob("range*.jsonl")) == ["range.jsonl", "range_p0.3.jsonl"]
    assert run_sweep(specs) == []  # everything finished: nothing runs again

    # the profile's step count changes: both run folders are stale, set aside (kept) and trained again
    (configs / "profiles" / "t.json").write_text((configs / "profiles" / "t.json").read_text().replace(
        '"steps": 3', '"steps": 4'))
    specs = plan_runs(load_profile("t", configs), tmp_path / "runs", configs_dir=configs)
    again = run_sweep(specs)
    assert [r["error"] for r in again] == ["", ""]
    aside = sorted(p.name for p in (tmp_path / "runs" / "parity_check" / "c2").iterdir() if ".stale-" in p.name)
    assert len(aside) == 2 and all((specs[0].run_dir.parent / name / "model.pt").is_file() for name in aside)
    assert all(load_config_dict(json.loads((s.run_dir / "config.resolved.json").read_text()), kind=FormalConfig)
               .train.steps == 4 for s in specs)
    assert len(collect_runs(tmp_path / "runs", "t")[0]) == 2  # the tables skip the set-aside folders


def test_a_second_sitting_trains_only_what_the_table_has_not_recorded(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Sweep, aggregate, lose the run folders (a new machine): the sweep skips the runs the table recorded and
    aggregate carries them, so the next sitting trains only a newly planned seed."""
    configs = tmp_path / "configs"
    (configs / "models").mkdir(parents=True)
    (configs / "profiles").mkdir()
    (configs / "parity_check.json").write_text(json.dumps(tiny_raw(steps=2, save_every=0)))
    (configs / "models" / "c2.json").write_text(json.dumps({"model": {"chunk_size": 2}}))
    profile = {"name": "t", "description": "test", "tasks": ["parity_check"], "models": ["c2"], "seeds": [0],
               "lrs": {"*/*": [0.01]}, "eval_lengths": "1-2,7-8", "table2_task": "parity_check", "table2_p_one": []}
    (configs / "profiles" / "t.json").write_text(json.dumps(profile))
    script = load_script("eval/formal.py")
    runs, tables = tmp_path / "runs", tmp_path / "tables"
    common = ["--profile", "t", "--configs", str(configs)]
    recorded = ["--recorded", str(tables / "table1_t.json")]
    assert script.main(["sweep", *common, "--out", str(runs)]) == 0
    assert script.main(["aggregate", *common, "--runs", str(runs), "--out-dir", str(tables)]) == 0
    first = (tables / "table1_t.md").read_text()
    (runs / "parity_check").rename(tmp_path / "lost")
    capsys.readouterr()
    assert script.main(["sweep", *common, "--out", str(runs), *recorded]) == 0
    assert "1 runs already recorded" in capsys.readouterr().out and not runs.joinpath("parity_check").exists()

    profile["seeds"] = [0, 1]  # the next sitting plans one more seed: only it is trained
    (configs / "profiles" / "t.json").write_text(json.dumps(profile))
    assert script.main(["sweep", *common, "--out", str(runs), *recorded]) == 0
    assert [p.name for p in (runs / "parity_check" / "c2").iterdir()] == ["seed1_lr0.01"]
    assert script.main(["aggregate", *common, "--runs", str(runs), "--out-dir", str(tables)]) == 0
    again = json.loads((tables / "table1_t.json").read_text())
    assert all(r["trained_at"] == git_commit() for r in again["runs"])  # model.pt names the code that trained it
    assert [r["seed"] for r in again["runs"]] == [0, 1] and again["table"]["parity_check"]["c2"]["n"] == 2
    assert "(1)" in first and "Carried from the kept table's run records (run folders not in --runs): 1 runs" in (
        tables / "table1_t.md").read_text()


def test_shipped_formal_configs_match_their_tasks() -> None:
    names = sorted(p.stem for p in CONFIGS.glob("*.json") if p.stem != "base")
    assert {"even_pairs", "parity_check", "dyck_12", "tomita_7", "modular_arithmetic_3"} <= set(names)
    for profile_name in ("paper", "quick"):
        profile = load_profile(profile_name, CONFIGS)
        specs = plan_runs(profile, "unused", configs_dir=CONFIGS, tasks=names, seeds=[0])
        assert {s.task_id for s in specs} == set(names)


def test_command_lines_train_and_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_raw(steps=2)))
    train = load_script("launch/train_formal.py")
    with pytest.raises(ConfigError, match="model.vocab_size = 5"):  # launch/ scripts print it via regulargpt.cli.run
        train.main(["--config", str(config), "--set", "model.vocab_size=5", "--run-dir", str(tmp_path / "x")])
    assert train.main(["--config", str(config), "--run-dir", str(tmp_path / "run")]) == 0
    cli = load_script("eval/formal.py")
    out = tmp_path / "range.jsonl"
    assert cli.main(["range", "--run", str(tmp_path / "run"), "--lengths", "1-2,7-12:5", "--samples", "8",
                     "--out", str(out)]) == 0
    assert sorted(read_rows(out)) == [1, 2, 7, 12]
    assert "over 2 evaluated lengths in 7..12, 8 sequences" in capsys.readouterr().out


def test_time_to_solve_check_does_not_change_training(tmp_path: Path) -> None:
    """Dropout is on (0.1) and the check runs in eval mode in the middle of training: the losses, the final weights
    and the data are still those of a run without the check. The check rows and model.pt's meta record the first
    step at or above the threshold."""
    from regulargpt.checkpoint import load_model_file
    from regulargpt.run_directory.layout import SOLVE_FILE
    from regulargpt.train.formal_trainer import SolveCheck

    cfg = tiny_cfg(steps=12, save_every=5)
    plain = train_formal(cfg, tmp_path / "plain")
    check = SolveCheck(every=3, lengths=(7, 12), samples=16, threshold=0.0)  # threshold 0: solved at the first check
    checked = train_formal(cfg, tmp_path / "checked", solve_check=check)
    assert losses(tmp_path / "plain") == losses(tmp_path / "checked")
    a, b = load_model_file(plain)[1].state_dict(), load_model_file(checked)[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(x) for x in (tmp_path / "checked" / SOLVE_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6, 9, 12] and all(0.0 <= r["score"] <= 1.0 for r in rows)
    meta = load_model_file(checked)[2]
    assert meta["solved_step"] == 3 and meta["solved_seconds"] == rows[0]["seconds"]
    never = train_formal(cfg, tmp_path / "never", solve_check=SolveCheck(every=4, lengths=(7,), samples=8,
                                                                         threshold=1.01))
    assert load_model_file(never)[2]["solved_step"] is None


def test_recipe_ignores_seed_and_bookkeeping_but_not_training_settings() -> None:
    from regulargpt.experiments.formal_sweep import recipe_id

    base = recipe_id(tiny_cfg())
    assert recipe_id(tiny_cfg(seed=9, log_every=5, save_every=7)) == base
    assert recipe_id(tiny_cfg(lr=3e-3)) != base and recipe_id(tiny_cfg(steps=9)) != base
    raw = tiny_raw()
    raw["model"]["init"] = "fan_in"
    assert recipe_id(load_config_dict(raw, kind=FormalConfig)) != base


def test_a_run_saved_before_a_config_field_existed_still_resumes(tmp_path: Path) -> None:
    """config.resolved.json written by older code lacks fields added since; at their defaults they are no change."""
    cfg = tiny_cfg(steps=4)
    train_formal(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "config.resolved.json").read_text())
    del saved["train"]["max_bad_steps"], saved["model"]["depth_policy"]
    (tmp_path / "run" / "config.resolved.json").write_text(json.dumps(saved))
    assert train_formal(cfg, tmp_path / "run").is_file()
    with pytest.raises(ConfigError, match="train.steps"):
        train_formal(tiny_cfg(steps=5), tmp_path / "run")


def test_a_run_saved_as_a_language_model_config_still_resumes_and_aggregates(tmp_path: Path) -> None:
    """Before FormalConfig, formal runs saved a whole language-model Config (deepspeed, train.schedule, grad_accum,
    precision, zero_stage, ...: fixtures/formal_config_resolved_v1.json, written by that code for the quick
    profile's parity_check/regular_gpt_c2 seed 0). It still reads as the same config, with the same recipe, so old
    runs resume and their tables stay valid; a config file that sets one of those keys is an unknown-key error."""
    from regulargpt.config import formal_config_from_saved, load_config
    from regulargpt.experiments.formal_sweep import recipe_id

    saved = json.loads((Path(__file__).parent / "fixtures" / "formal_config_resolved_v1.json").read_text())
    old = formal_config_from_saved(saved, "v1")
    spec = next(s for s in plan_runs(load_profile("quick", CONFIGS), "unused", configs_dir=CONFIGS, seeds=[0])
                if s.task_id == "parity_check" and s.model == "regular_gpt_c2" and s.lr == saved["train"]["lr"])
    assert old == spec.cfg and recipe_id(old) == spec.recipe == "61cdcbe16e01"

    cfg = tiny_cfg(steps=4)  # a run directory whose config.resolved.json has the old layout resumes
    train_formal(tiny_cfg(steps=2), tmp_path / "run")
    (tmp_path / "run" / "model.pt").unlink()
    written = json.loads((tmp_path / "run" / "config.resolved.json").read_text())
    lm_only = {k: v for k, v in saved["train"].items() if k not in written["train"]}  # as the old code wrote them
    assert {"schedule", "grad_accum", "precision", "zero_stage"} <= set(lm_only)
    legacy = {**written, "train": {**lm_only, **written["train"]}, "deepspeed": {}}
    (tmp_path / "run" / "config.resolved.json").write_text(json.dumps(legacy))
    assert train_formal(tiny_cfg(steps=2), tmp_path / "run").is_file()
    with pytest.raises(ConfigError, match="train.steps"):
        train_formal(cfg, tmp_path / "run")

    config = tmp_path / "lm_keys.json"
    config.write_text(json.dumps({"extends": str(CONFIGS / "parity_check.json"), "train": {"grad_acum": 2}}))
    with pytest.raises(ConfigError, match=r"lm_keys.json: train.grad_acum: unknown key; did you mean 'grad_clip'"):
        load_config(config, kind=FormalConfig)
    config.write_text(json.dumps({"extends": str(CONFIGS / "parity_check.json"), "train": {"precision": "bf16"}}))
    with pytest.raises(ConfigError, match=r"lm_keys.json: train.precision: unknown key"):
        load_config(config, kind=FormalConfig)
    with pytest.raises(ConfigError, match=r"model.head: 'lm' is not allowed; expected 'classifier'"):
        load_config(CONFIGS / "parity_check.json", ["model.head=lm"], FormalConfig)
    with pytest.raises(ConfigError, match=r"deepspeed: unknown section"):
        load_config_dict({**tiny_raw(), "deepspeed": {}}, kind=FormalConfig)


def test_a_run_trained_in_slices_equals_one_run_and_the_long_run_report(tmp_path: Path) -> None:
    """stop_at trains to a step and checkpoints without model.pt; slices 4, 7, 12 (with dropout, checks in between)
    give the same losses, checks and weights as one run. `long-run` trains two seeds in turn and reports per-step
    scores per seed, a standing line each and a PNG."""
    from regulargpt.checkpoint import load_model_file
    from regulargpt.run_directory.layout import SOLVE_FILE
    from regulargpt.train.formal_trainer import SolveCheck

    cfg = tiny_cfg(steps=12, save_every=5)
    check = SolveCheck(every=2, lengths=(7, 12), samples=8)
    whole = train_formal(cfg, tmp_path / "whole", solve_check=check)
    assert train_formal(cfg, tmp_path / "sliced", solve_check=check, stop_at=4) is None
    assert not (tmp_path / "sliced" / "model.pt").exists()
    assert train_formal(cfg, tmp_path / "sliced", solve_check=check, stop_at=7) is None
    assert train_formal(cfg, tmp_path / "sliced", solve_check=check, stop_at=4) is None  # already past: no-op
    sliced = train_formal(cfg, tmp_path / "sliced", solve_check=check, stop_at=12)
    assert sliced is not None and losses(tmp_path / "whole") == losses(tmp_path / "sliced")
    scores = [[json.loads(x)["score"] for x in (tmp_path / d / SOLVE_FILE).read_text().splitlines()]
              for d in ("whole", "sliced")]
    assert len(scores[0]) == 6 and scores[0] == scores[1]  # checks at steps 2, 4, …, 12 once each
    a, b = load_model_file(whole)[1].state_dict(), load_model_file(sliced)[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ConfigError, match="stop_at: 0"):
        train_formal(cfg, tmp_path / "bad", stop_at=0)

    configs = tmp_path / "configs"
    (configs / "models").mkdir(parents=True)
    (configs / "profiles").mkdir()
    (configs / "parity_check.json").write_text(json.dumps(tiny_raw()))
    (configs / "models" / "c2.json").write_text(json.dumps({"model": {"chunk_size": 2}}))
    (configs / "profiles" / "t.json").write_text(json.dumps({
        "name": "t", "description": "test", "tasks": ["parity_check"], "models": ["c2"], "seeds": [0, 1],
        "lrs": {"*/*": [0.01]}, "eval_lengths": "1-2", "table2_task": "parity_check", "table2_p_one": [0.5]}))
    out = tmp_path / "long.md"
    cli = load_script("eval/formal.py")
    args = ["long-run", "--task", "parity_check", "--model", "c2", "--profile", "t", "--configs", str(configs),
            "--seeds", "0", "1", "--steps", "6", "--slice", "4", "--every", "2", "--every-row", "2",
            "--runs", str(tmp_path / "runs"), "--out", str(out)]
    assert cli.main(args) == 0
    text = out.read_text()
    assert "| 2 | " in text and "| 6 | " in text and "- seed 0: step 6 of 6" in text and "- seed 1: step 6 of 6" in text
    assert not HAS_MATPLOTLIB or out.with_suffix(".png").stat().st_size > 0
    assert cli.main([*args, "--report-only"]) == 0 and out.read_text().split("## Where")[1] == text.split("## Where")[1]
    assert "held-out score" in text and "## Held-out score against steps" in text

    pilot = tmp_path / "pilot.md"  # the same, checking the fit on every training length (1..6): a pilot
    assert cli.main([*args[:-4], "--runs", str(tmp_path / "pilot_runs"), "--out", str(pilot), "--check-lengths",
                     "1-6"]) == 0
    text = pilot.read_text()
    assert "## Fit against steps" in text and "fit (mean accuracy over the training lengths 1..6)" in text
    run = next((tmp_path / "pilot_runs").glob("parity_check/c2/seed0_*"))
    assert cli.main(["pilot-steps", "--runs", str(run), "--criterion", "check", "--threshold", "0"]) == 0


def test_pilot_stable_step_and_recommended_steps() -> None:
    from regulargpt.evaluation.formal_pilots import recommended_steps, stable_step

    rows = [{"step": s, "acc": a} for s, a in ((50, 0.62), (100, 1.0), (150, 0.97), (200, 1.0), (250, 0.995))]
    assert stable_step(rows) == 200 and recommended_steps(200) == 400
    assert stable_step(rows, threshold=0.96) == 100 and recommended_steps(100, factor=1.6) == 200
    assert stable_step([*rows, {"step": 300, "acc": 0.5}]) is None  # did not fit by the end
    assert stable_step(list(reversed(rows))) == 200  # order of the log lines does not matter
    # forgiving isolated dips (the docstring's example), also at the last check; a longer dip restarts the count
    dips = [{"step": 100 * (i + 1), "acc": a} for i, a in enumerate((0.97, 0.995, 0.97, 0.996, 0.998, 0.97))]
    assert stable_step(dips) is None and stable_step(dips, forgive=1) == 200
    long_dip = [*dips[:5], {"step": 600, "acc": 0.9}, {"step": 700, "acc": 0.9}, {"step": 800, "acc": 1.0}]
    assert stable_step(long_dip, forgive=1) == 800 and stable_step(long_dip, forgive=2) == 200
    with pytest.raises(ValueError, match="forgive"):
        stable_step(dips, forgive=-1)
    assert recommended_steps(1100) == 1800 and recommended_steps(1250) == 2000
    from regulargpt.evaluation.formal_pilots import task_steps

    # the slowest seed (2,900) decides: ceil(1.6 x 2900 / 100) x 100
    assert task_steps([(1900, 3000), (2900, 3000), (2400, 3000)]) == 4700
    # a seed that never fit gets at least its pilot's 6,000 steps; the stable ones decide above that
    assert task_steps([(1000, 6000), (None, 6000)]) == 6000
    assert task_steps([(4500, 6000), (None, 6000), (5600, 6000)]) == 9000
    assert task_steps([(None, 6000)]) is None and task_steps([]) is None


def test_a_fit_check_on_training_lengths_chooses_steps_and_a_held_out_check_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--time-to-solve E --check-lengths 1-6` logs the fit on every training length (tiny config: 1..6); pilot-steps
    --criterion check reads it, and refuses a check that reached past the training lengths (held-out lengths never
    choose a step count)."""
    from regulargpt.commands import formal_suite, train_formal as train_cmd
    from regulargpt.evaluation.formal_pilots import check_rows
    from regulargpt.evaluation.formal_scoring import RangeEvalError
    from regulargpt.run_directory.layout import SOLVE_FILE

    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(tiny_raw(steps=6, save_every=0)))
    fit_dir, held_dir = tmp_path / "fit", tmp_path / "held"
    assert train_cmd.main(["--config", str(config), "--run-dir", str(fit_dir), "--time-to-solve", "2",
                           "--check-lengths", "1-6"]) == 0
    rows = [json.loads(x) for x in (fit_dir / SOLVE_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6] and all(r["lengths"] == [1, 6, 6] for r in rows)
    printed = capsys.readouterr().out.splitlines()[-1]  # the console's last line: the solve step and seconds
    first = next((r for r in rows if r["score"] >= 0.99), None)
    best = max(rows, key=lambda r: r["score"])
    expected = (f"time to solve: step {first['step']}, {first['seconds']:.1f} s of training" if first else
                f"not solved: best check score {best['score']:.3f} at step {best['step']} (< 0.99 on lengths 1..6")
    assert printed.startswith(expected), printed
    assert all(r["loss"] > 0 and math.isfinite(r["loss"]) for r in rows)  # the fit check also logs its cross-entropy
    assert check_rows(rows, 1, 6, "x") == [{"step": r["step"], "acc": r["score"]} for r in rows]
    out = tmp_path / "pilot.md"
    assert formal_suite.main(["pilot-steps", "--runs", str(fit_dir), "--criterion", "check", "--threshold", "0",
                              "--out", str(out)]) == 0
    assert "| fit | parity_check | 6 | 2 | 100 |" in out.read_text()  # threshold 0: stable from the first check
    assert "| parity_check | 1 | 1 | 100 |" in out.read_text()  # the per-task summary

    assert train_cmd.main(["--config", str(config), "--run-dir", str(held_dir), "--time-to-solve", "3",
                           "--check-lengths", "7-12"]) == 0
    with pytest.raises(RangeEvalError, match=r"held/time_to_solve\.jsonl: step 3: checked lengths \[7, 12, 6\] "
                                             r"are not inside the training lengths 1\.\.6"):
        formal_suite.main(["pilot-steps", "--runs", str(held_dir), "--criterion", "check"])
    with pytest.raises(RangeEvalError, match=r"--check-lengths: length spec 'x-1'"):
        train_cmd.main(["--config", str(config), "--run-dir", str(tmp_path / "bad"), "--time-to-solve",
                        "--check-lengths", "x-1"])


def test_solve_line_states_the_first_step_at_the_threshold_or_the_best_score() -> None:
    """Hand-built check rows: solved at step 40 (the first >= 0.99, not the best at 60); unsolved: the best score
    and its step; no rows: no check ran."""
    from regulargpt.commands.train_formal import solve_line
    from regulargpt.train.formal_trainer import SolveCheck

    check = SolveCheck(every=20, lengths=(41, 64, 87))
    rows = [{"step": 20, "score": 0.5, "seconds": 1.0}, {"step": 40, "score": 0.991, "seconds": 2.31, "cpu_seconds": 2.04},
            {"step": 60, "score": 1.0, "seconds": 3.5, "cpu_seconds": 3.0}]
    assert solve_line(rows, check) == ("time to solve: step 40, 2.3 s of training (2.0 CPU s), check score 0.991 >= "
                                       "0.99 on lengths 41..87")
    unsolved = [{"step": 20, "score": 0.5, "seconds": 1.0}, {"step": 40, "score": 0.875, "seconds": 2.0},
                {"step": 60, "score": 0.75, "seconds": 3.0}]
    assert solve_line(unsolved, check) == ("not solved: best check score 0.875 at step 40 (< 0.99 on lengths 41..87; "
                                           "3 checks)")
    assert solve_line([], check) == "time to solve: no check ran (every 20 steps)"


def test_time_to_solve_writes_raw_records_and_rewrites_the_report_from_them(tmp_path: Path, monkeypatch) -> None:
    """Training faked (a run's check rows and solve step written by hand): --out X.md writes X.json, and
    --records X.json rewrites the same table with nothing trained; the rows read what the records say."""
    from regulargpt.commands import formal_pilot_commands as pilots
    from regulargpt.commands.formal_suite import main as formal_main
    from regulargpt.train import formal_trainer

    solved = {0: (300, 12.34, 10.0), 1: None}

    def fake_train(cfg, run_dir, solve_check):
        run_dir.mkdir(parents=True, exist_ok=True)
        scores = [0.6, 0.995, 1.0] if solved[cfg.train.seed] else [0.5, 0.75, 0.875]
        (run_dir / "time_to_solve.jsonl").write_text(
            "".join(json.dumps({"step": 100 * (i + 1), "score": s, "seconds": 1.0}) + "\n" for i, s in enumerate(scores)))
        return run_dir / "model.pt"

    def fake_load(path):
        seed = int(path.parent.name.split("seed")[1].split("_")[0])
        meta = {} if solved[seed] is None else dict(zip(("solved_step", "solved_seconds", "solved_cpu_seconds"),
                                                        solved[seed]))
        return None, None, meta

    monkeypatch.setattr(formal_trainer, "train_formal", fake_train)
    monkeypatch.setattr(pilots, "load_model_file", fake_load)
    out = tmp_path / "tts.md"
    assert formal_main(["time-to-solve", "--tasks", "parity_check", "--seeds", "0", "1", "--runs", str(tmp_path / "r"),
                        "--out", str(out)]) == 0
    text = out.read_text()
    assert "| parity_check | 0 | 300 | 12.3 | 10.0 | 1.000 |" in text
    assert "| parity_check | 1 | not solved | — | — | 0.875 |" in text
    again = tmp_path / "again.md"
    assert formal_main(["time-to-solve", "--records", str(out.with_suffix(".json")), "--out", str(again)]) == 0
    table = lambda t: t.split("Runs in")[1].split("Raw records")[0].strip()  # noqa: E731 (after the stamp)
    assert table(again.read_text()) == table(text)
