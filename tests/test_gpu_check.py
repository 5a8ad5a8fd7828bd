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
    assert [line.split(":")[0] for line in summary] == ["env", "correctness", "train", "baselines", "kernels", "eval",
                                                        "profile"]
    assert proc.returncode == 0, summary + [proc.stdout[-3000:]]
    correctness = (out / "correctness.md").read_text()
    assert correctness.count("| ok |") == 3 * 6 and "FAIL" not in correctness  # cpp, shift, blocked: 2 dtypes × 3
    assert all(f"| {name} |" in correctness for name in ("cpp", "blocked", "shift"))
    kernels = (out / "kernels.md").read_text()
    assert all(f"| 4096 | {name} | " in kernels for name in ("blocked", "shift", "sdpa-causal"))
    assert "| 4096 | triton | skipped (does not run on cpu) |" in kernels
    train_log = (out / "train.log").read_text()
    assert "stop requested (signal SIGTERM)" in train_log and "resuming at step" in train_log
    runs = {f"{path.parent.name}/{path.stem}": [json.loads(x) for x in path.read_text().splitlines()]
            for folder in ("train", "baselines") for path in (out / folder).iterdir()}
    assert set(runs) == {"train/regular_gpt", "baselines/alibi", "baselines/t5", "baselines/kerple_log",
                         "baselines/rope"}  # (compile: COMPILED=regular_gpt; off here for time)
    assert runs["train/regular_gpt"][-1]["step"] == 40 and runs["baselines/t5"][-1]["step"] == 20
    assert "| regular_gpt | 40 | " in (out / "train.md").read_text() and "| 1 | " in train_log  # the plan's row
    assert "| kerple_log | 20 | " in (out / "baselines.md").read_text()
    assert {row["length"] for row in map(json.loads, (out / "extrapolate" / "results.jsonl").open())} == {
        32, 64, 128, 256, 512}  # to 16× the training length
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


def test_the_correctness_step_takes_the_algorithms_that_run_on_the_device(monkeypatch):
    """issue 39 §1: on CUDA the check ran the CPU-only C++ operator ("CPU tensors expected", 6 error rows). The
    algorithms come from the registry by device; a CPU-only one asked for on CUDA is a skipped row, not an error,
    and never reaches a kernel (this machine has no CUDA, so running it would raise)."""
    sys.path.insert(0, str(ROOT / "eval"))
    import gpu_steps

    from regulargpt.model.sliding_dilated import algorithms_on

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert algorithms_on("cuda") == ["triton", "shift", "blocked", "flex"]
    assert algorithms_on("cpu") == ["cpp", "shift", "blocked"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert algorithms_on("cpu") == ["cpp", "triton", "shift", "blocked"]
    monkeypatch.delenv("TRITON_INTERPRET")
    assert gpu_steps._algorithms("device", "cuda:0") == ["triton", "shift", "blocked", "flex"]
    rows, ok = gpu_steps.check("cuda", ["cpp"], 8, 1)
    assert ok and rows[2:] == ["| cpp | – | – | – | – | skipped (does not run on cuda) |"]
    rows, ok = gpu_steps.check("cpu", ["flex", "no_such"], 8, 1)  # an unknown name is still its own row
    assert ok and "skipped (does not run on cpu)" in rows[2] and "unknown algorithm" in rows[3]
    script = (ROOT / "eval/gpu_check.sh").read_text()
    assert "--algorithms device" in script and "cpp,blocked,shift" not in script


def test_the_profile_counts_each_kernel_once():
    """First H200 run: the profile's header summed the device time of every event, the operators (which carry the
    time of the kernels they launch) and the kernels themselves: 79.7 ms against the profiler table's 39.9 ms. An
    operator of 10 ms device time launching one 10 ms kernel, plus a 5 ms kernel with no operator: 15 ms."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    sys.path.insert(0, str(ROOT / "eval"))
    import gpu_steps

    events = [SimpleNamespace(device_type=DeviceType.CPU, self_device_time_total=10_000, is_user_annotation=False),
              SimpleNamespace(device_type=DeviceType.CUDA, self_device_time_total=10_000, is_user_annotation=False),
              SimpleNamespace(device_type=DeviceType.CUDA, self_device_time_total=5_000, is_user_annotation=False),
              SimpleNamespace(device_type=DeviceType.CUDA, self_device_time_total=7_000, is_user_annotation=True)]
    assert gpu_steps.device_self_ms(events) == 15.0
