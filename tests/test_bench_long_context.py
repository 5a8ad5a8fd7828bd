"""eval/bench_long_context.py on CPU at tiny sizes: one row per (length, model), the FLOP ratio column against a
hand count, a failure at one point as a row, the budget as skipped rows; and regulargpt.step_flops by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import ROOT, load_script
from regulargpt.config import load_config
from regulargpt.step_flops import flop_ratio, step_flops

bench = load_script("eval/bench_long_context.py")
LONG = ROOT / "configs/long"


def _tiny_dir(tmp_path: Path) -> Path:
    """Configs extending configs/long's 16k ones at T = 256 (batch 2) and 512 (batch 1): equal tokens per step."""
    folder = tmp_path / "long"
    folder.mkdir()
    for t, batch in ((256, 2), (512, 1)):
        for name in ("regular_gpt", "regular_gpt_train", "alibi"):
            body = {"extends": str(LONG / f"{name}_16k.json"), "data": {"seq_len": t}, "train": {"batch_size": batch}}
            (folder / f"{name}_{t}.json").write_text(json.dumps(body))
    return folder


def _hand_forward(kind: str, t: int, d: int = 32, vocab: int = 256) -> tuple[int, int]:
    """(A, h) by hand for the --shrink sizes: d 32, FFN 4d, C 8, K 2, 2 dense layers, T_train 512."""
    proj = 2 * (4 * d * d + 8 * d * d)
    if kind == "alibi":
        return 2 * (proj + int(4 * d * (t + 1) / 2)), 2 * d * vocab
    depth = {256: 3, 512: 3}[t]  # ceil(log_8 T) = 3 for both, and 3 under depth_policy train (T_train 512)
    return 2 * depth * (proj + 4 * 8 * d), 2 * d * vocab


def test_step_flops_by_hand_at_64k() -> None:
    """configs/long at T = 65,536, checkpointing on: F = T · (4A + 3h) per sequence."""
    d, v, t = 768, 8000, 65536
    proj, h = 2 * (4 * d * d + 8 * d * d), 2 * d * v
    alibi = 12 * (proj + 4 * d * (t + 1) // 2)
    adaptive, train = 24 * (proj + 4 * 8 * d), 12 * (proj + 4 * 8 * d)
    cfg = {n: load_config(LONG / f"{n}_64k.json") for n in ("alibi", "regular_gpt", "regular_gpt_train")}
    assert step_flops(cfg["alibi"]) == t * (4 * alibi + 3 * h)
    assert step_flops(cfg["regular_gpt"], checkpointing=False) == t * 3 * (adaptive + h)
    expected = (4 * alibi + 3 * h) / (4 * adaptive + 3 * h)
    assert flop_ratio(cfg["alibi"], cfg["regular_gpt"], t) == pytest.approx(expected)
    assert flop_ratio(cfg["alibi"], cfg["regular_gpt_train"], t) == pytest.approx(7.733, abs=1e-3)


@pytest.mark.slow
def test_tiny_cpu_run_rows_and_flop_ratio(tmp_path: Path) -> None:
    folder = _tiny_dir(tmp_path)
    out, jsonl = tmp_path / "long.md", tmp_path / "long.jsonl"
    assert bench.main(["--device", "cpu", "--shrink", "--configs-dir", str(folder), "--lengths", "256,512",
                       "--steps", "3", "--warmup", "1", "--set", "train.precision=fp32",
                       "--out", str(out), "--jsonl", str(jsonl)]) == 0
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert sorted((r["T"], r["model"]) for r in rows) == sorted(
        (t, m) for t in (256, 512) for m in ("regular_gpt", "regular_gpt_train", "alibi", "flash"))
    for r in rows:
        assert r["status"] == "ok" and r["steps_timed"] == 3 and r["step_s"] > 0, r
        a, h = _hand_forward("alibi", r["T"])
        own = _hand_forward("alibi" if r["model"] in ("alibi", "flash") else "regular_gpt", r["T"])
        assert r["flop_ratio"] == pytest.approx((4 * a + 3 * h) / (4 * own[0] + 3 * own[1]))
        assert r["vs_alibi"] == pytest.approx(next(x["step_s"] for x in rows
                                                   if x["T"] == r["T"] and x["model"] == "alibi") / r["step_s"])
    table = [line for line in out.read_text().splitlines() if line.startswith("| 256 ") or line.startswith("| 512 ")]
    assert len(table) == 8
    ratio_column = {(line.split("|")[1].strip(), line.split("|")[2].strip()): float(line.split("|")[11])
                    for line in table}
    assert ratio_column["512", "regular_gpt"] == pytest.approx(next(
        r["flop_ratio"] for r in rows if r["T"] == 512 and r["model"] == "regular_gpt"), abs=0.005)


def test_failure_is_a_row_and_budget_skips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _tiny_dir(tmp_path)
    real = bench.train_step

    def failing(model, opt, tokens):
        if model.config.position == "alibi":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return real(model, opt, tokens)

    monkeypatch.setattr(bench, "train_step", failing)
    jsonl = tmp_path / "rows.jsonl"
    bench.main(["--shrink", "--configs-dir", str(folder), "--lengths", "256", "--models", "alibi,flash",
                "--steps", "3", "--jsonl", str(jsonl), "--set", "train.precision=fp32",
                "--budget-s", "3600"])  # the default 85 s budget can run out on a loaded 2-core machine
    rows = {r["model"]: r for r in map(json.loads, jsonl.read_text().splitlines())}
    assert rows["alibi"]["status"].startswith("OOM at ") and "GiB" in rows["alibi"]["status"]
    assert rows["flash"]["status"] == "ok" and rows["flash"]["vs_alibi"] is None
    bench.main(["--shrink", "--configs-dir", str(folder), "--lengths", "256", "--budget-s", "0",
                "--jsonl", str(jsonl)])
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert len(rows) == 4 and all(r["status"].startswith("skipped: the 0 s budget") for r in rows)


def test_missing_alibi_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(bench.ConfigError, match="no ALiBi config at T = 1024"):
        bench.discover(_tiny_dir(tmp_path), [1024], bench.SHRINK)
