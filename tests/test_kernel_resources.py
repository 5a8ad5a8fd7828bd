"""eval/kernel_resources.py: the Triton kernels compiled for sm_90 meet kernels.md's register gates, and the
interpreter's byte count agrees with a hand count."""

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers import ROOT, load_script, run_env

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
RESOURCES = load_script("eval/kernel_resources.py")


@pytest.mark.parametrize("chunk", [8, 16])
def test_every_kernel_compiles_for_sm90_without_spills_within_168_registers_and_vector_loads(chunk) -> None:
    if not RESOURCES._ptxas().exists():
        pytest.skip("this triton wheel has no ptxas-blackwell")
    launches = RESOURCES.capture_launches(16384, 12, 64, chunk, 64, RESOURCES._DTYPES["bf16"], pad=True)
    assert [name for name, _, _ in launches] == ["_forward_kernel", "_query_backward_kernel", "_key_backward_kernel"]
    for name, args, meta in launches:
        got = RESOURCES.compile_resources(name, args, meta)
        assert got["spill_stores"] == 0 and got["spill_loads"] == 0, (name, got)
        assert 0 < got["registers"] <= 168, (name, got)
        assert got["loads_v4"] > 0, (name, got)


def test_interpreted_forward_bytes_match_a_hand_count() -> None:
    """T 64, H 1, Dh 16, C 4, D 1, fp32 with pads. Forward requested: q and out once, k and v C slabs less the
    C(C−1)/2 rows below position 0 (they read the pad); unique: q, k, v, out once (+ lse, r, pads: < 0.2)."""
    t, c = 64, 4
    code = ("import json, sys; sys.path.insert(0, 'eval'); from kernel_resources import count_bytes; "
            f"print(json.dumps(count_bytes({t}, 1, 16, {c}, 1)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=run_env(TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["kernel"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    forward = rows["_forward_kernel"]
    slabs = (c * t - c * (c - 1) / 2) / t
    assert 2 + 2 * slabs <= forward["requested"] < 2 + 2 * slabs + 0.2
    assert 4 <= forward["unique"] < 4.2
    assert set(rows) == {"_forward_kernel", "_query_backward_kernel", "_key_backward_kernel"}
