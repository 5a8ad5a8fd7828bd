"""`auto` on CUDA: the measured table (regulargpt/kernels/dispatch_cuda.json) and its rule, the Triton fallback, and
eval/bench_kernel_gpu.py (CPU run, the table it derives). No GPU needed: the rule is pure arithmetic on the table."""

import json
import subprocess
import sys
import warnings

import pytest
import torch
from helpers import ROOT, load_script, run_env

from regulargpt.kernels import dispatch_cuda
from regulargpt.model import sliding_dilated

BENCH = load_script("eval/bench_kernel_gpu.py")
TABLE = {"reach_log2": 2, "cells": [
    {"length": 16384, "chunk": 8, "dilation": 8, "dtype_bytes": 2, "fastest": "triton"},
    {"length": 512, "chunk": 4, "dilation": 1, "dtype_bytes": 2, "fastest": "shift"},
    {"length": 4096, "chunk": 8, "dilation": 1, "dtype_bytes": 4, "fastest": "blocked"}]}


@pytest.mark.parametrize(("chunk", "dilation", "length", "dtype", "want"), [
    (8, 8, 16384, torch.bfloat16, "triton"),   # the cell itself
    (16, 16, 16384, torch.float16, "triton"),  # |log2 2| + 0 + |log2 2| = 2 <= reach 2
    (16, 32, 16384, torch.bfloat16, None),     # 1 + 0 + 2 = 3 > reach
    (4, 2, 1024, torch.bfloat16, "shift"),     # 0 + 1 + 1 = 2 from the T 512 cell, 6 from the other
    (8, 1, 4096, torch.float32, "blocked"),    # only the 4-byte cell counts for fp32
    (8, 8, 16384, torch.float32, None),        # 4-byte cell: 0 + 2 + 3 = 5 away
])
def test_the_nearest_cell_within_reach_decides(chunk, dilation, length, dtype, want) -> None:
    assert dispatch_cuda.table_choice(chunk, dilation, length, dtype, TABLE) == want


@pytest.mark.parametrize(("cell", "message"), [({"fastest": "flex"}, r"cells\[0\].fastest"),
                                               ({"chunk": 0}, r"cells\[0\].chunk"), ({"length": "16k"}, "length")])
def test_a_bad_table_names_the_file_and_key(tmp_path, cell, message) -> None:
    bad = {"reach_log2": 1, "cells": [{**TABLE["cells"][0], **cell}]}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=message) as info:
        dispatch_cuda.load_table(path)
    assert str(path) in str(info.value)


def test_the_committed_table_is_the_recorded_gpu_measurement_read_back() -> None:
    """Not typed by hand: regenerated from results/gpu/check/kernels.md it is the same JSON (triton 2.29 ms fastest)."""
    committed = dispatch_cuda.load_table(dispatch_cuda.TABLE)
    regenerated = BENCH.table_from_check(ROOT / "results/gpu/check/kernels.md")
    assert {**committed, "source": None} == {**regenerated, "source": None}
    assert [c["fastest"] for c in committed["cells"]] == ["triton"]


def test_auto_on_cuda_takes_triton_where_the_table_says_and_falls_back_once_when_it_cannot_build(monkeypatch) -> None:
    monkeypatch.setattr(dispatch_cuda, "_default_table", lambda: TABLE)
    monkeypatch.setitem(sliding_dilated._FUSED, "cuda", ("triton", lambda: None))
    assert sliding_dilated.choose_algorithm(8, 8, 16384, torch.bfloat16, "cuda") == "triton"
    assert sliding_dilated.choose_algorithm(8, 1, 4096, torch.float32, "cuda") == "blocked"  # the table's band pick
    far = sliding_dilated.choose_band(2, 1, 64, torch.bfloat16)
    assert sliding_dilated.choose_algorithm(2, 1, 64, torch.bfloat16, "cuda") == far  # out of reach: the band rule

    monkeypatch.setitem(sliding_dilated._FUSED, "cuda", ("triton", lambda: "no triton here"))
    monkeypatch.setattr(sliding_dilated, "_FUSED_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        picks = [sliding_dilated.choose_algorithm(8, 8, 16384, torch.bfloat16, "cuda") for _ in range(3)]
    assert picks == [sliding_dilated.choose_band(8, 8, 16384, torch.bfloat16)] * 3
    assert [str(w.message) for w in caught if "no triton here" in str(w.message)] != []
    assert len([w for w in caught if "triton" in str(w.message)]) == 1


def test_the_table_keeps_the_fastest_correct_algorithm_per_cell() -> None:
    rows = [{"T": 64, "C": 2, "D": 1, "algorithm": "triton", "median_ms": 1.0, "correct": False},
            {"T": 64, "C": 2, "D": 1, "algorithm": "shift", "median_ms": 3.0, "correct": True},
            {"T": 64, "C": 2, "D": 1, "algorithm": "blocked", "median_ms": 2.0, "correct": True},
            {"T": 64, "C": 2, "D": 2, "algorithm": "triton", "median_ms": 0.5, "correct": True},
            {"T": 64, "C": 2, "D": 2, "algorithm": "blocked", "error": "boom"},
            {"T": 64, "C": 2, "D": 1, "algorithm": "sdpa", "median_ms": 0.1}]
    table = BENCH.dispatch_table(rows, torch.bfloat16, "cmd")
    assert [(c["dilation"], c["fastest"]) for c in table["cells"]] == [(1, "blocked"), (2, "triton")]
    assert all(c["dtype_bytes"] == 2 for c in table["cells"])


def test_depth_dilations_are_the_powers_of_c_below_t() -> None:
    assert BENCH.depth_dilations(16384, 8) == [1, 8, 64, 512, 4096]
    assert BENCH.depth_dilations(65536, 16) == [1, 16, 256, 4096]
    assert BENCH.depth_dilations(1, 4) == [1]


def test_the_bench_runs_on_cpu_and_reports_every_row(tmp_path) -> None:
    out, jsonl = tmp_path / "k.md", tmp_path / "k.jsonl"
    cmd = [sys.executable, "eval/bench_kernel_gpu.py", "--device", "cpu", "--lengths", "40", "--chunks", "4",
           "--dtype", "fp32", "--reps", "3", "--heads", "2", "--head-dim", "8", "--out", str(out),
           "--jsonl", str(jsonl)]
    proc = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert sorted({r["D"] for r in rows}) == [1, 4, 16]
    by = {(r["algorithm"], r["D"]): r for r in rows}
    assert by["triton", 1]["error"].startswith("skipped")
    for name in ("shift", "blocked"):
        for d in (1, 4, 16):
            assert by[name, d]["correct"] and by[name, d]["clock"] == "wall" and by[name, d]["median_ms"] > 0
    assert "median_ms" in by["sdpa", 1] and ("sdpa", 4) not in by
    text = out.read_text()
    assert "wall clock" in text and "| 40 | 4 | 16 | blocked |" in text
