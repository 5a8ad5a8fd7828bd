"""`eval/formal.py reproduce`: one recorded run retrained from its run record and compared with it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from helpers import load_script, tiny_raw, write_formal_configs

from regulargpt.config import ConfigError
from regulargpt.provenance import git_commit


def _setup(tmp_path: Path, steps: int = 6) -> tuple[list[str], Path]:
    common = write_formal_configs(tmp_path / "configs", {
        "name": "t", "description": "test", "tasks": ["parity_check"], "models": ["c2"], "seeds": [0, 1],
        "lrs": {"*/*": [0.01]}, "overrides": {"*/*": {"eval": {"select_last": 3, "select_every": 2}}},
        "eval_lengths": "1-6,7-9", "table2_task": "parity_check", "table2_p_one": [0.3, 0.5]},
        tiny_raw(steps=steps, save_every=0))
    return common, tmp_path / "tables" / "table1_t.json"


def test_reproduce_retrains_a_record_and_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweep and aggregate a tiny profile, lose the run folders; `reproduce` retrains seed 1 from its record: with
    the same code every number is identical (exit 0). A record whose score the same code does not give is a failure
    (exit 1); with another commit the difference and both commits are printed (exit 0)."""
    common, table = _setup(tmp_path)
    cli = load_script("eval/formal.py")
    assert cli.main(["sweep", *common, "--out", str(tmp_path / "runs")]) == 0
    assert cli.main(["aggregate", *common, "--runs", str(tmp_path / "runs"), "--out-dir", str(table.parent)]) == 0
    (tmp_path / "runs").rename(tmp_path / "lost")
    args = ["reproduce", *common, "--table", str(table), "--task", "parity_check", "--model", "c2", "--seed", "1"]
    capsys.readouterr()
    assert cli.main([*args, "--out", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert "identical: every recorded number is reproduced" in out and f"trained by the code at {git_commit()}" in out
    assert (tmp_path / "again" / "parity_check" / "c2" / "seed1_lr0.01" / "model.pt").is_file()
    with pytest.raises(ConfigError, match="exists; reproduce trains into a fresh folder"):
        cli.main([*args, "--out", str(tmp_path / "again")])

    payload = json.loads(table.read_text())
    record = next(r for r in payload["runs"] if r["seed"] == 1)
    true_score = record["score"]
    record["score"] = true_score - 0.25
    table.write_text(json.dumps(payload))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the run without --out is trained
    assert cli.main(args) == 1  # the same commit, another score: not reproduced
    out = capsys.readouterr().out
    assert "NOT reproduced with the same code commit" in out
    assert f"score: {true_score - 0.25:.6f} → {true_score:.6f} (+0.250000)" in out
    assert list(scratch.iterdir()) == []  # without --out the retrained run is not kept

    record["trained_at"] = "0123456789ab"
    table.write_text(json.dumps(payload))
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert f"the code differs (recorded 0123456789ab, now {git_commit()})" in out and "score: " in out


def test_reproduce_refuses_what_it_cannot_retrain(tmp_path: Path) -> None:
    common, table = _setup(tmp_path)
    cli = load_script("eval/formal.py")
    assert cli.main(["sweep", *common, "--out", str(tmp_path / "runs"), "--seeds", "0"]) == 0
    assert cli.main(["aggregate", *common, "--runs", str(tmp_path / "runs"), "--out-dir", str(table.parent)]) == 0
    args = ["reproduce", *common, "--table", str(table), "--task", "parity_check", "--model", "c2"]
    with pytest.raises(ConfigError, match=r"no record of parity_check/c2 seed 1; it records seed 0 lr 0.01"):
        cli.main([*args, "--seed", "1"])
    _setup(tmp_path, steps=7)  # the task config changed since: the record's recipe is no longer planned
    with pytest.raises(ConfigError, match="the configs changed since"):
        cli.main([*args, "--seed", "0"])
