"""eval/gpu_campaign.sh, the prepared GPU campaign, run here with DEVICE=cpu at tiny sizes: every step of the LM part
(environment, kernel correctness, kernel timing, a python-packages corpus split by package, the four-model study
with the real trainer, extrapolation under both depth policies, profile) finishes and is packed, a step cut by its
cap leaves the finished steps' files, the caps on a GPU add up to the budgets, the plan follows its formula, and the
report reads what came back. And eval/gpu_deps.py's list of the wheels it ships covers what DeepSpeed imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile

import pytest
from helpers import ROOT, run_env

LM_STEPS = ["env", "correctness", "kernels", "corpus", "study", "eval", "profile"]
MODELS = ["regular_gpt", "alibi", "kerple_log", "rope"]


def _campaign(tmp_path, *args, **env):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(["bash", "eval/gpu_campaign.sh", *args], cwd=ROOT, capture_output=True, text=True,
                          env=run_env(DEVICE="cpu", OUT=str(out), WORK=str(work), PYTHON=sys.executable, **env),
                          timeout=1500)  # above the sum of the CPU caps (eval/gpu_campaign.sh)
    return proc, out


def _unpack(out, tmp_path, part="lm"):
    folder = tmp_path / f"unpacked-{part}"
    with tarfile.open(out / f"campaign-{part}.tgz") as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.mark.slow
def test_the_campaign_runs_every_step_on_cpu_and_its_report_reads_what_came_back(tmp_path):
    proc, out = _campaign(tmp_path)
    summary = (out / "summary-lm.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == LM_STEPS
    assert proc.returncode == 0, summary + [proc.stdout[-3000:], proc.stderr[-2000:]]
    assert all(re.search(r"\(\d+ s, planned \d+ s\)$", line) for line in summary)  # actual and planned seconds
    assert sorted(p.name for p in out.iterdir()) == ["campaign-lm.tgz", "summary-lm.txt"]  # under the 8-file limit
    got = _unpack(out, tmp_path)
    correctness = (got / "correctness.md").read_text()
    assert correctness.count("| ok |") == 6 and "FAIL" not in correctness  # the CPU's fused kernel, 3 cases × 2 dtypes
    assert "| cpp | bf16 | 16, 16 |" in correctness
    plan = json.loads((got / "plan.json").read_text())
    assert plan["steps"] == 20 and [m["name"] for m in plan["models"]] == MODELS
    for name in MODELS:  # the real trainer ran every model to the planned step
        recs = [json.loads(line) for line in (got / "study" / f"{name}.jsonl").read_text().splitlines()]
        assert recs[-1]["step"] == 20 and recs[-1]["tokens"] == 20 * 4 * 32
    rows = [json.loads(line) for line in (got / "extrapolate" / "results.jsonl").read_text().splitlines()]
    assert {r["length"] for r in rows} == {32, 64, 128, 256, 512} and {r["tokens"] for r in rows} == {2048}
    policies = {(r["run"].rsplit("/", 1)[-1], r.get("depth_policy")) for r in rows}
    assert policies == {(m, None) for m in MODELS} | {("regular_gpt", "train")}
    corpus = (got / "corpus.md").read_text()
    assert "python-packages" in corpus and all(f"| {split} |" in corpus for split in ("train", "val", "test"))
    report = subprocess.run([sys.executable, "eval/gpu_campaign.py", "report", "--from", str(got), "--out",
                             str(tmp_path / "README.md")], cwd=ROOT, env=run_env(), capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "README.md").read_text()
    table = text[text.index("## Perplexity"):]
    assert "| regular_gpt (depth adaptive) |" in table and "| regular_gpt (depth train) |" in table
    assert all(f"| {m} |" in table for m in MODELS[1:]) and "| 32 | 64 | 128 | 256 | 512 |" in table
    assert "Not reached" not in text and "| profile | exit 0 |" in text


@pytest.mark.slow
def test_the_speed_part_runs_every_step_on_cpu(tmp_path):
    """--part speed: the dispatch table (blocked and shift on a CPU), the training step against ALiBi and T5, and
    the long-context bench on the 16k configs cut to T = 256: each step exits 0 and its files are packed."""
    proc, out = _campaign(tmp_path, "--part", "speed")
    summary = (out / "summary-speed.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == ["env", "dispatch", "train_speed", "long"], summary
    assert proc.returncode == 0, summary + [proc.stdout[-3000:], proc.stderr[-2000:]]
    got = _unpack(out, tmp_path, "speed")
    table = json.loads((got / "dispatch.json").read_text())
    assert {c["fastest"] for c in table["cells"]} <= {"blocked", "shift"} and len(table["cells"]) == 4  # D 1,4,16,64
    bench = (got / "bench_train.md").read_text()
    assert "| transformer/alibi |" in bench and "| transformer/t5 |" in bench
    rows = [json.loads(line) for line in (got / "long_context.jsonl").read_text().splitlines()]
    assert {r["model"] for r in rows} == {"regular_gpt", "regular_gpt_train", "alibi", "flash"}
    assert all(r["status"] == "ok" for r in rows), rows


@pytest.mark.slow
def test_a_step_cut_by_its_cap_leaves_the_finished_steps_files(tmp_path):
    """The study gets a 3 s cap: it is cut (its first run stopped), the later steps still run, and the tarball holds
    every file of the steps before it."""
    proc, out = _campaign(tmp_path, CAMPAIGN_CAPS="60 1 120 120 3 120 1")
    summary = dict(line.split(": ", 1) for line in (out / "summary-lm.txt").read_text().splitlines())
    assert summary["study"].startswith("timed out") and summary["corpus"].startswith("exit 0"), summary
    assert proc.returncode != 0
    got = _unpack(out, tmp_path)
    assert (got / "corpus.md").is_file() and (got / "kernels.md").is_file() and (got / "env.log").is_file()
    assert "no trained run to score" in (got / "eval.log").read_text()


def _caps(script: str, name: str) -> list[int]:
    """The GPU branch's caps: the second assignment of NAME in the script (the first is the CPU rehearsal's)."""
    values = re.findall(rf"^  {name}=\(([\d ]+)\)", script, flags=re.M)
    assert len(values) == 2, values
    return [int(x) for x in values[1].split()]


def test_the_caps_on_a_gpu_add_up_to_the_budgets():
    """Issue 49: the LM part within 510 s on an H100 (one call of at most 8.5 minutes), the speed part 210 s."""
    script = (ROOT / "eval/gpu_campaign.sh").read_text()
    lm, speed = _caps(script, "CAPS"), _caps(script, "SPEED_CAPS")
    assert len(lm) == len(LM_STEPS) and sum(lm) <= 510
    assert dict(zip(LM_STEPS, lm)) == {"env": 20, "correctness": 40, "kernels": 30, "corpus": 40, "study": 295,
                                       "eval": 70, "profile": 15}
    assert len(speed) == 4 and sum(speed) <= 210


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
    script = (ROOT / "eval/gpu_campaign.sh").read_text()  # on the GPU the campaign checks the Triton kernel only
    assert re.search(r"^  STEPS_FLAG=\(\) CHECK=\(--algorithms triton --length 1003 ", script, flags=re.M)


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
