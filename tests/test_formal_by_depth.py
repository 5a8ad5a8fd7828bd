"""Accuracy by adaptive depth (regulargpt/evaluation/formal_by_depth.py) against hand-computed groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import tiny_raw

from regulargpt.commands.formal_suite import main as formal_main
from regulargpt.config import ConfigError, FormalConfig, load_config_dict, save_config
from regulargpt.evaluation.formal_by_depth import by_depth_markdown, depth_profile
from regulargpt.data.sources import DataError
from regulargpt.evaluation.formal_scoring import RangeEvalError


def _run(root: Path, accuracies: dict[int, float], inputs: dict[int, int] | None = None, **model: object) -> Path:
    """A run folder task/model/seed with the tiny config (C = 2 by default, training lengths 1..6) and range rows."""
    run = root / "parity_check" / "regular_gpt_c2" / "seed0_lr0.01"
    run.mkdir(parents=True)
    raw = tiny_raw()
    raw["model"].update(model)
    save_config(load_config_dict(raw, kind=FormalConfig), run / "config.resolved.json")
    rows = [{"length": t, "input_length": (inputs or {}).get(t, t), "accuracy": a, "n": 16}
            for t, a in accuracies.items()]
    (run / "range.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_lengths_are_grouped_by_the_depth_their_input_needs(tmp_path: Path) -> None:
    # C = 2: depth 1 = 1..2, 2 = 3..4, 3 = 5..8, 4 = 9..16; training lengths 1..6 → L_train = 3
    acc = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0, 7: 0.8, 8: 0.6, 9: 0.5, 12: 0.5}
    profile = depth_profile(_run(tmp_path, acc))
    assert profile.name == "parity_check/regular_gpt_c2/seed0_lr0.01"
    assert (profile.chunk_size, profile.train_depth) == (2, 3)
    assert profile.depths == {1: (1, 2, 2, 1.0), 2: (3, 4, 2, 1.0), 3: (5, 8, 4, pytest.approx(0.85)),
                              4: (9, 12, 2, 0.5)}
    assert profile.first_break() == 3 and profile.first_break(0.8) == 4
    # fit: lengths 1..6 (data.min_length..max_length) all 1.0; score: 7..12 (eval.score_min_length..max_length)
    # = mean(0.8, 0.6, 0.5, 0.5) = 0.6; so it fits and does not extrapolate: counted in the first line
    assert (profile.fit, profile.score) == (1.0, pytest.approx(0.6))
    table = by_depth_markdown([profile])
    assert table[0] == "1 runs; 1 of them fit their training lengths (fit ≥ 0.99) and score < 0.99 past them."
    assert "| L=3 (5..8) | L=4 (9..12) |" in table[4]
    assert profile.held_out_seen == (2, pytest.approx(0.7))  # 7 and 8: past the training lengths 1..6, depth 3
    assert table[6] == ("| parity_check/regular_gpt_c2/seed0_lr0.01 | 1.000 | 0.600 | 3 | 1.000 | 1.000 | 0.850 | "
                        "0.500* | 3 | 0.700 (2) |")


def test_the_depth_follows_the_input_length_and_the_chunk_size(tmp_path: Path) -> None:
    # length 4 read as 5 input tokens (as modular arithmetic pads) needs depth 3 with C = 2; with C = 3 depth 2
    profile = depth_profile(_run(tmp_path / "a", {4: 0.5, 5: 1.0}, inputs={4: 5}))
    assert profile.depths == {3: (4, 5, 2, 0.75)}
    profile = depth_profile(_run(tmp_path / "b", {3: 1.0, 4: 1.0, 9: 0.9, 10: 0.7}, chunk_size=3))
    assert profile.depths == {1: (3, 3, 1, 1.0), 2: (4, 9, 2, pytest.approx(0.95)), 3: (10, 10, 1, 0.7)}
    assert profile.train_depth == 2  # the longest training length, 6, takes 2 steps with C = 3


def test_the_training_depth_comes_from_the_longest_training_length_not_the_evaluated_ones(tmp_path: Path) -> None:
    # trained on 1..12 (D_12 trains on 1..80) but evaluated only at 1..4 and 9..12: lengths 9..12 need 4 steps, seen
    run = _run(tmp_path, {1: 1.0, 4: 1.0, 9: 0.9, 12: 0.9})
    config = json.loads((run / "config.resolved.json").read_text())
    config["data"]["max_length"] = 12
    (run / "config.resolved.json").write_text(json.dumps(config))
    profile = depth_profile(run)
    assert profile.train_depth == 4
    assert "0.900 |" in by_depth_markdown([profile])[6] and "*" not in by_depth_markdown([profile])[6]


def test_bad_runs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config.resolved.json: file not found"):
        depth_profile(tmp_path)
    lstm = _run(tmp_path / "lstm", {1: 1.0}, architecture="lstm")
    with pytest.raises(ConfigError, match="'lstm'; accuracy by depth needs a RegularGPT run"):
        depth_profile(lstm)
    empty = _run(tmp_path / "empty", {})
    with pytest.raises(RangeEvalError, match="range.jsonl: no evaluated lengths"):
        depth_profile(empty)


def test_only_runs_that_fit_and_miss_are_counted(tmp_path: Path) -> None:
    """The first line counts fit ≥ 0.99 and score < 0.99: a run that extrapolates and one that never fit are not."""
    extrapolates = depth_profile(_run(tmp_path / "a", {1: 1.0, 6: 1.0, 9: 1.0}))
    never_fit = depth_profile(_run(tmp_path / "b", {1: 1.0, 6: 0.9, 9: 0.5}))  # fit 0.95
    misses = depth_profile(_run(tmp_path / "c", {1: 1.0, 6: 0.99, 9: 0.98}))  # fit 0.995, score 0.98
    assert [(p.fit, p.score) for p in (extrapolates, never_fit, misses)] == [
        (1.0, 1.0), (pytest.approx(0.95), 0.5), (pytest.approx(0.995), 0.98)]
    assert by_depth_markdown([extrapolates, never_fit, misses])[0].startswith("3 runs; 1 of them fit")


def test_by_depth_command_prints_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, {1: 1.0, 6: 1.0, 9: 0.25})
    out = tmp_path / "by_depth.md"
    assert formal_main(["by-depth", "--runs", str(run), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Accuracy by adaptive depth\n\n- Command: `python eval/formal.py") and "Git commit" in text
    assert "| 1.000 | 0.250 | 3 | 1.000 | 1.000 | 0.250* | 4 | – |" in text  # no length in 7..8
    assert "0.250*" in capsys.readouterr().out


def test_the_report_is_regenerated_from_its_raw_records_alone(tmp_path: Path) -> None:
    """`--out X.md` writes X.json (the per-length accuracies); `--records X.json` rewrites the same tables with the
    run folder gone; a file without records is one clear error."""
    import shutil

    run = _run(tmp_path / "runs", {1: 1.0, 6: 1.0, 9: 0.25})
    out = tmp_path / "by_depth.md"
    assert formal_main(["by-depth", "--runs", str(run), "--out", str(out)]) == 0
    record = json.loads(out.with_suffix(".json").read_text())["records"][0]
    assert record["rows"] == [[1, 1, 1.0], [6, 6, 1.0], [9, 9, 0.25]] and record["chunk_size"] == 2
    assert f"--records {out.with_suffix('.json')}" in out.read_text()
    shutil.rmtree(tmp_path / "runs")
    again = tmp_path / "again.md"
    assert formal_main(["by-depth", "--records", str(out.with_suffix(".json")), "--out", str(again)]) == 0
    table = lambda text: text.split("\n\n", 2)[2].split("Raw records")[0].strip()  # noqa: E731 (after the stamp)
    assert table(again.read_text()) == table(out.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text('{"records": []}')
    with pytest.raises(DataError, match="bad.json: expected"):
        formal_main(["by-depth", "--records", str(bad)])
