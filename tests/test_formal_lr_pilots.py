"""Fit pilots at several learning rates (`long-run --lrs`), resumed across sittings, and the rate chosen from their
training-length loss (`choose-lr --at-step`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import load_script, tiny_raw, write_formal_configs

from regulargpt.evaluation.formal_scoring import RangeEvalError


def test_pilots_at_several_rates_resume_and_choose_a_rate_on_training_lengths(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = write_formal_configs(tmp_path / "configs", {
        "name": "t", "description": "test", "tasks": ["parity_check"], "models": ["c3"], "seeds": [0, 1],
        "lrs": {"*/*": [0.01]}, "eval_lengths": "1-2", "table2_task": "parity_check", "table2_p_one": []},
        tiny_raw(), chunk_size=3)
    cli = load_script("eval/formal.py")
    runs, out = tmp_path / "pilots", tmp_path / "pilot.md"
    args = ["long-run", "--task", "parity_check", "--model", "c3", *common,
            "--seeds", "0", "1", "--lrs", "0.003", "0.03", "--steps", "6", "--slice", "2", "--every", "2",
            "--every-row", "2", "--check-lengths", "1-6", "--runs", str(runs), "--out", str(out)]
    assert cli.main([*args, "--hours", "1e-9"]) == 0  # the first sitting stops after one slice
    assert "rerun the same command to continue" in capsys.readouterr().out
    assert "- seed 0, lr 0.003: step 2 of 6" in out.read_text()
    assert cli.main(args) == 0  # the next sitting continues every pilot to step 6
    text = out.read_text()
    for label in ("seed 0, lr 0.003", "seed 1, lr 0.003", "seed 0, lr 0.03", "seed 1, lr 0.03"):
        assert f"- {label}: step 6 of 6" in text
    assert "| step | seed 0, lr 0.003 | seed 0, lr 0.03 | seed 1, lr 0.003 | seed 1, lr 0.03 |" in text
    assert "constant lr 0.003, 0.03" in text

    dirs = sorted((runs / "parity_check" / "c3").iterdir())
    rows = {d.name: [json.loads(x) for x in (d / "time_to_solve.jsonl").read_text().splitlines()] for d in dirs}
    assert all([r["step"] for r in v] == [2, 4, 6] for v in rows.values())  # each check once, across sittings
    mean_loss = {lr: np.mean([rows[f"seed{s}_lr{lr}"][-1]["loss"] for s in (0, 1)]) for lr in ("0.003", "0.03")}
    chosen = min(mean_loss, key=mean_loss.get)
    capsys.readouterr()
    assert cli.main(["choose-lr", "--runs", *map(str, dirs), "--at-step", "6"]) == 0
    table = capsys.readouterr().out
    assert "from the fit check at step 6" in table
    assert next(line for line in table.splitlines() if "**yes**" in line).startswith(f"| {float(chosen):g} |")
    with pytest.raises(RangeEvalError, match="no fit check at step 5"):
        cli.main(["choose-lr", "--runs", *map(str, dirs), "--at-step", "5"])

    held_out = [a if a != "1-6" else "7-12" for a in args]  # checks past the training lengths choose nothing
    held_out[held_out.index(str(runs))] = str(tmp_path / "held_out")
    held_out[held_out.index("--seeds") + 1: held_out.index("--lrs") + 3] = ["0", "--lrs", "0.003"]
    assert cli.main(held_out) == 0
    with pytest.raises(RangeEvalError, match="not inside the training lengths"):
        cli.main(["choose-lr", "--runs", *map(str, sorted((tmp_path / "held_out" / "parity_check" / "c3").iterdir())),
                  "--at-step", "6"])
