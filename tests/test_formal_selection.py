"""The end-of-run checkpoint rule (eval.select_last / select_every): which model a formal run keeps, how run records
and tables say which rule kept it, and which recorded runs a new rule leaves as they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import Crash, CrashingTask, load_script, tiny_cfg, tiny_raw, write_formal_configs
from helpers import formal_losses as losses

from regulargpt.checkpoint import load_model_file
from regulargpt.config import ConfigError, FormalConfig, load_config_dict
from regulargpt.evaluation.formal_scoring import range_evaluate, range_score
from regulargpt.experiments.formal_sweep import recipe_id
from regulargpt.tasks import make_task
from regulargpt.train.formal_selection import rule_name, rule_sets
from regulargpt.train.formal_trainer import formal_task, train_formal


def _cfg(steps: int, select_last: int = 1, select_every: int = 100, **train: float) -> FormalConfig:
    raw = tiny_raw(steps=steps, lr=0.05, **train)  # a high rate: the fit moves from check to check
    raw["eval"].update(select_last=select_last, select_every=select_every)
    return load_config_dict(raw, kind=FormalConfig)


def _fit(model_path: Path, out: Path) -> float:
    """The fit of a model.pt by range evaluation at every training length (1..6), 16 strings each: the table's fit."""
    cfg, model, _ = load_model_file(model_path)
    rows = range_evaluate(model, make_task("parity_check"), range(1, 7), 16, out, progress=False)
    return range_score(rows, 1, 6)


def test_the_kept_model_is_the_best_training_length_fit_of_the_last_checks(tmp_path: Path) -> None:
    """Against brute force: runs of 6, 8, 10 and 12 steps under the last-model rule are the models at those steps
    (constant rate, same data); their fits by range evaluation pick the model a 12-step run with select_last = 4,
    select_every = 2 keeps (the highest fit, ties to the later). Training itself is unchanged by the checks."""
    kept = train_formal(_cfg(12, 4, 2), tmp_path / "rule")
    plain = {s: train_formal(_cfg(s), tmp_path / f"plain{s}") for s in (6, 8, 10, 12)}
    assert losses(tmp_path / "rule") == losses(tmp_path / "plain12")
    last = torch.load(tmp_path / "rule" / "ckpt.pt", weights_only=True)["model"]  # ckpt.pt: the last step's weights
    ref = load_model_file(plain[12])[1].state_dict()
    assert all(torch.equal(last[k], ref[k]) for k in ref)

    fits = {s: _fit(path, tmp_path / f"fit{s}.jsonl") for s, path in plain.items()}
    best = max(fits.values())
    expected_step = max(s for s, f in fits.items() if f == best)
    meta = load_model_file(kept)[2]
    assert meta["selection"] == {"rule": "best-fit-of-4-every-2", "checks": [[s, fits[s]] for s in (6, 8, 10, 12)]}
    assert meta["kept_step"] == expected_step
    a, b = load_model_file(kept)[1].state_dict(), load_model_file(plain[expected_step])[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_killed_inside_the_window_keeps_the_same_model(tmp_path: Path) -> None:
    """Checks at steps 8, 10, 12; checkpoints every 3 steps. Killed during step 11 (after the checks at 8 and 10,
    the last checkpoint at step 9 holds the check at 8), the resumed run keeps what an uninterrupted one keeps."""
    cfg = _cfg(12, 3, 2, save_every=3)
    whole = train_formal(cfg, tmp_path / "whole")
    # sample calls: steps 1-8 (8), the check at 8 (6 lengths), steps 9, 10, the check at 10 (6), step 11 = call 23
    with pytest.raises(Crash):
        train_formal(cfg, tmp_path / "killed", task_factory=lambda c: CrashingTask(formal_task(c), crash_at=23))
    assert torch.load(tmp_path / "killed" / "ckpt.pt", weights_only=True)["step"] == 9
    resumed = train_formal(cfg, tmp_path / "killed")
    assert load_model_file(whole)[2]["selection"] == load_model_file(resumed)[2]["selection"]
    a, b = load_model_file(whole)[1].state_dict(), load_model_file(resumed)[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_rule_is_validated_named_and_part_of_the_recipe() -> None:
    with pytest.raises(ConfigError, match=r"eval.select_last = 5, eval.select_every = 2.*train.steps = 8"):
        _cfg(8, 5, 2)
    with pytest.raises(ConfigError, match="select_every"):
        _cfg(8, 2, 0)
    assert rule_name(_cfg(8).eval) == "last" and rule_name(_cfg(8, 3, 2).eval) == "best-fit-of-3-every-2"
    assert rule_sets("best-fit-of-3-every-2") == ["eval.select_last=3", "eval.select_every=2"]
    assert rule_sets("last") == ["eval.select_last=1"]
    with pytest.raises(ConfigError, match="best-fit-of-N-every-M"):
        rule_sets("best-of-3")
    # select_every means nothing under the last-model rule: the recipe ignores it there, not otherwise
    assert recipe_id(_cfg(8)) == recipe_id(_cfg(8, 1, 3)) == recipe_id(tiny_cfg(steps=8, lr=0.05))
    assert recipe_id(_cfg(8, 3, 2)) not in (recipe_id(_cfg(8)), recipe_id(_cfg(8, 3, 3)))


def test_a_new_rule_keeps_the_recorded_runs_it_cannot_change_and_marks_and_retrains_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three seeds recorded under the last-model rule; the profile then plans best-of-3. A record whose fit is
    1.0 over every training length is the model the rule keeps (ties go to the last): it is counted as the rule's
    and not trained again. The others stay in the table, marked ‡ and counted apart in the header, until the
    sweep trains them again under the rule; then no cell is marked."""
    configs, runs, tables = tmp_path / "configs", tmp_path / "runs", tmp_path / "tables"
    profile = {"name": "t", "description": "test", "tasks": ["parity_check"], "models": ["c2"], "seeds": [0, 1, 2],
               "lrs": {"*/*": [0.01]}, "eval_lengths": "1-6,7-8", "table2_task": "parity_check",
               "table2_p_one": []}
    common = write_formal_configs(configs, profile, tiny_raw(steps=6, save_every=0))
    cli = load_script("eval/formal.py")
    assert cli.main(["sweep", *common, "--out", str(runs)]) == 0
    assert cli.main(["aggregate", *common, "--runs", str(runs), "--out-dir", str(tables)]) == 0
    table = tables / "table1_t.json"
    payload = json.loads(table.read_text())
    assert [r["rule"] for r in payload["runs"]] == ["last"] * 3
    assert "- Checkpoint kept (eval.select_last / select_every): the last model (`last`): 3 runs kept by it" in (
        tables / "table1_t.md").read_text()
    # the record of seed 0 says its last model fit every training string, the others that they did not
    for record, fit in zip(payload["runs"], (1.0, 0.9, 0.5)):
        record["fit"] = fit
    table.write_text(json.dumps(payload))
    (runs / "parity_check").rename(tmp_path / "lost")  # a new machine: only the records are left

    profile["overrides"] = {"*/*": {"eval": {"select_last": 3, "select_every": 2}}}
    write_formal_configs(configs, profile, tiny_raw(steps=6, save_every=0))
    assert cli.main(["aggregate", *common, "--runs", str(runs), "--out-dir", str(tables)]) == 0
    text = (tables / "table1_t.md").read_text()
    assert ("the best training-length fit of the last 3 checks, 2 steps apart" in text and "0 runs kept by it; 1 "
            "kept by the last-model rule (trained before this rule) with a fit of 1.000" in text
            and "2 kept by the last-model rule, which this rule could change (cells marked ‡" in text)
    assert "| parity_check | " in text and " ‡ |" in text and "Stale" not in text
    cell = json.loads(table.read_text())["table"]["parity_check"]["c2"]
    assert cell["n"] == 3 and cell["other_rule"] == 2 and cell["rules"] == ["last"]

    capsys.readouterr()
    assert cli.main(["sweep", *common, "--out", str(runs), "--recorded", str(table), "--list"]) == 0
    listed = capsys.readouterr().out
    assert "1 runs already recorded" in listed and "2 runs to train or finish" in listed
    lines = listed.strip().splitlines()
    names = lines.index("parity_check/c2/seed1_lr0.01")
    assert lines[names + 1] == "parity_check/c2/seed2_lr0.01"
    assert lines[names + 2].startswith("estimated training time (one thread per run; evaluation not included): ")
    assert lines[names + 3].startswith("  c2: 2 runs, 12 steps, ") and "(records, 3 runs)" in lines[names + 3]
    assert not (runs / "parity_check").exists()  # --list trains nothing
    assert cli.main(["sweep", *common, "--out", str(runs), "--recorded", str(table)]) == 0
    assert "1 runs already recorded" in capsys.readouterr().out
    assert sorted(p.name for p in (runs / "parity_check" / "c2").iterdir()) == ["seed1_lr0.01", "seed2_lr0.01"]
    assert cli.main(["aggregate", *common, "--runs", str(runs), "--out-dir", str(tables)]) == 0
    text = (tables / "table1_t.md").read_text()
    assert "2 runs kept by it; 1 kept by the last-model rule" in text and "‡" not in text
    records = json.loads(table.read_text())["runs"]
    assert [r["rule"] for r in records] == ["last", "best-fit-of-3-every-2", "best-fit-of-3-every-2"]
    assert all(r["kept_step"] in (2, 4, 6) for r in records[1:])
