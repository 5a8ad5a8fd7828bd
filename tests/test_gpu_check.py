"""eval/gpu_check.sh, the prepared check of a GPU machine, run here with DEVICE=cpu at tiny sizes: every step of the
flow (environment, kernel correctness, kernel timing, the trainer stopped by SIGTERM and resumed, compiled, export,
extrapolation, generation, profile) finishes, so the script does not first break on a GPU. And eval/gpu_deps.py's
list of the wheels it ships covers what DeepSpeed imports at run time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import ROOT, run_env


@pytest.mark.slow
def test_gpu_check_runs_every_step_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = run_env(DEVICE="cpu", OUT=str(out), PYTHON=sys.executable, WORK=str(tmp_path / "work"))
    proc = subprocess.run(["bash", "eval/gpu_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)  # above the sum of the CPU caps (eval/gpu_check.sh)
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["env", "correctness", "kernels", "train", "eval", "profile"]
    assert proc.returncode == 0, summary + [proc.stdout[-3000:]]
    correctness = (out / "correctness.md").read_text()
    assert correctness.count("| ok |") == 3 * 6 and "FAIL" not in correctness  # cpp, blocked, shift: 2 dtypes × 3
    assert all(f"| {name} |" in correctness for name in ("cpp", "blocked", "shift"))
    kernels = (out / "kernels.md").read_text()
    assert all(f"| 4096 | {name} | " in kernels for name in ("blocked", "shift", "sdpa-causal"))
    train_log = (out / "train.log").read_text()
    assert "stop requested (signal SIGTERM)" in train_log and "resuming at step" in train_log
    runs = {path.stem: [json.loads(x) for x in path.read_text().splitlines()] for path in (out / "train").iterdir()}
    assert set(runs) == {"regular_gpt", "alibi", "rope"}  # (compile: COMPILED=regular_gpt; off here for time)
    assert all(rows[-1]["step"] == 40 for rows in runs.values())
    assert "| regular_gpt | 40 | " in train_log and "| 1 | " in train_log  # the throughput table, the plan's row
    assert (out / "extrapolate" / "results.jsonl").is_file()
    assert "tokens/s" in (out / "generate.md").read_text() and "self time" in (out / "profile.md").read_text()


def test_the_shipped_wheels_cover_deepspeeds_runtime_imports(tmp_path):
    """`missing` imports DeepSpeed's training paths in a fresh process: every distribution they load is a listed
    wheel or in the GPU image; `install` finds every listed module importable here (so their import names are
    right) and installs nothing."""
    for args in (["missing"], ["install", "--wheels", str(tmp_path / "none"), "--target", str(tmp_path / "deps")]):
        proc = subprocess.run([sys.executable, "eval/gpu_deps.py", *args], cwd=ROOT, env=run_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.strip().splitlines()[-1] in ("none", "nothing to install")
