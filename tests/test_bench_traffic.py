"""eval/bench_traffic.py: the traffic floor's byte count, the op-traffic lower bound, and the report."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import load_script

bench = load_script("eval/bench_traffic.py")


def test_floor_bytes_counts_each_tensor_once() -> None:
    # the example: T = 65536, H = 8, Dh = 64, fp32 → 8 tensors of 2^25 elements, pads, scalars
    assert bench.floor_bytes(1, 8, 65536, 64, 2, 4) == 8 * 2**25 * 4 + 4 * 512 * 4 + 2 * 16 * 4 == 1_073_750_144
    assert bench.floor_bytes(2, 8, 1024, 64, 8, 2) == 8 * 2 * 8 * 1024 * 64 * 2 + 4 * 2 * 8 * 64 * 2 + 2 * 8 * 8 * 4


def test_kernel_flops_by_hand() -> None:
    # per (query, head): forward 2·C·Dh (scores) + 2·C·Dh (output), backward 4 · 2·C·Dh (dP, dq, dk, dv)
    assert bench.kernel_flops(1, 8, 65536, 64, 16) == 65536 * 8 * (4 + 8) * 16 * 64 == 6_442_450_944
    assert bench.kernel_flops(2, 1, 3, 4, 2) == 2 * 3 * 12 * 2 * 4


def test_op_traffic_is_at_least_the_inputs_read_once() -> None:
    inputs = bench._inputs(1, 2, 256, 16, 2, torch.float32)
    ops, traffic = bench.op_traffic(inputs, 2, 4)
    q_bytes = 256 * 2 * 16 * 4
    assert ops > 10 and traffic >= 4 * q_bytes  # q, k, v and dout are each read at least once


def test_projection_layout_views_one_leaf_and_each_pass_starts_from_no_gradient() -> None:
    """--layout projection: q, k, v are (B, H, T, Dh) views of one (B, T, 3·H·Dh) leaf (a position's rows
    3·H·Dh apart, as in the model); a repeated forward+backward leaves the leaf's gradient of one pass, not a sum."""
    q, k, v, pad_k, pad_v, rel_bias, dout = inputs = bench._inputs(1, 2, 64, 16, 4, torch.float32, "projection")
    assert q.shape == dout.shape == (1, 2, 64, 16) and q.stride(2) == 3 * 2 * 16 and q._base is k._base is v._base
    bench.forward_backward(inputs, 4)
    first = q._base.grad.clone()
    bench.forward_backward(inputs, 4)
    torch.testing.assert_close(q._base.grad, first)
    heads = bench._inputs(1, 2, 64, 16, 4, torch.float32)
    assert heads[0].is_leaf and heads[0].stride(2) == 16


def test_report_and_bad_flags(tmp_path: Path) -> None:
    out = tmp_path / "t.md"
    assert bench.main(["--lengths", "128", "--chunks", "2", "--dtypes", "fp32", "--reps", "1", "--threads", "1",
                       "--no-compile", "--stream-gib", "0.05", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| 128 | 2 | fp32 |" in text and "Measured bandwidth" in text and "— | — | — |" in text
    assert "GFLOP/s, the compute floor's rate" in text and "time ÷ compute floor" in text
    assert "triad beside the row GB/s" in text and "- Layout: heads" in text
    assert bench.main(["--lengths", "96", "--chunks", "4", "--dtypes", "bf16", "--reps", "1", "--threads", "1",
                       "--no-compile", "--stream-gib", "0.05", "--layout", "projection", "--out", str(out)]) == 0
    assert "| 96 | 4 | bf16 |" in out.read_text() and "- Layout: projection" in out.read_text()
    with pytest.raises(SystemExit):
        bench.main(["--dtypes", "fp16", "--out", str(out)])


def test_floor_at_the_triad_beside_the_row_by_hand() -> None:
    """1e9 bytes in 0.1 s: at the run's best 40 GB/s the floor is 25 ms (4.0×); at 20 GB/s measured beside the row,
    50 ms (2.0×)."""
    row = {"t": 65536, "chunk": 8, "dtype": "fp32", "algorithm": "cpp", "seconds": 0.1, "floor_bytes": 10**9,
           "flops": 10**9, "ops": 22, "op_bytes": 10**9, "bandwidth_now": 20.0}
    args = SimpleNamespace(heads=8, head_dim=64, reps=5, stream_gib=1.0, layout="heads")
    text = bench.render([row], {"copy": 30.0, "triad": 40.0}, args, "python eval/bench_traffic.py", 100.0)
    assert "| 65,536 | 8 | fp32 | cpp | 100.0 | 25.0 | 4.0× | 20.0 | 2.0× | 10.0 | 10.0× | 1.0× |" in text


def test_floor_takes_the_best_bandwidth_of_the_run_when_a_row_measured_more() -> None:
    """The start measured 20 GB/s, a later row 50: the floor is 1e9 bytes at 50 GB/s = 20 ms for every row, so the
    first row's 0.1 s is 5.0× (not 2.5× at the slow start's 40 ms), and at its own 20 GB/s 2.0×."""
    rows = [{"t": 65536, "chunk": c, "dtype": "fp32", "algorithm": "cpp", "seconds": 0.1, "floor_bytes": 10**9,
             "flops": 10**9, "ops": 22, "op_bytes": 10**9, "bandwidth_now": now} for c, now in ((8, 20.0), (16, 50.0))]
    args = SimpleNamespace(heads=8, head_dim=64, reps=5, stream_gib=1.0, layout="heads")
    text = bench.render(rows, {"copy": 18.0, "triad": 20.0}, args, "python eval/bench_traffic.py", 100.0)
    assert "| 65,536 | 8 | fp32 | cpp | 100.0 | 20.0 | 5.0× | 20.0 | 2.0× | 10.0 | 10.0× | 1.0× |" in text
    assert "beside a row), 50.0 GB/s" in text


def test_repetitions_rotate_over_the_algorithms_and_tiles_run_with_the_sweep_off(monkeypatch) -> None:
    """reps = 2 over (cpp, cpp-tiles, cpp-rows): warm-up of each, then cpp, tiles, rows, cpp, tiles, rows; the tiles'
    calls are cpp with head_sweep(False) around them, the rows' cpp with chain_lanes(False)."""
    state, calls = {"sweep": True, "lanes": True}, []

    def recording(key: str):
        @contextlib.contextmanager
        def switch(enabled: bool):
            state[key] = enabled
            try:
                yield
            finally:
                state[key] = True
        return switch

    monkeypatch.setattr(bench, "head_sweep", recording("sweep"))
    monkeypatch.setattr(bench, "chain_lanes", recording("lanes"))
    monkeypatch.setattr(bench, "forward_backward", lambda inputs, chunk, attention: calls.append(
        (attention.keywords["algorithm"], state["sweep"], state["lanes"])))
    medians = bench.timed_in_rotation((), 2, 2, ["cpp", "cpp-tiles", "cpp-rows"])
    assert calls == [("cpp", True, True), ("cpp", False, True), ("cpp", True, False)] * 3
    assert set(medians) == {"cpp", "cpp-tiles", "cpp-rows"} and all(m >= 0 for m in medians.values())
