"""The crash-consistency harness (eval/crash_consistency.py): every job killed with SIGKILL at a random moment and
rerun gives the uninterrupted run's outputs, and the harness's comparisons catch what they are meant to catch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_script


@pytest.mark.slow
def test_every_job_killed_at_a_random_moment_and_rerun_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    """One kill point per job (the committed results/crash_consistency.md has more): about 40 CPU-seconds."""
    harness = load_script("eval/crash_consistency.py")
    report = tmp_path / "report.md"
    status = harness.main(["--jobs", "prepare,pretrain,evaluate,export", "--kills-per-job", "1", "--seed", "3",
                           "--out", str(report)])
    text = report.read_text()
    assert status == 0, text
    rows = [line for line in text.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in harness.JOBS]
    assert len(rows) == 4 and all(line.rstrip().endswith("| hold |") for line in rows), text


def test_the_comparisons_catch_a_row_twice_a_changed_weight_and_a_changed_shard(tmp_path: Path) -> None:
    """Planted faults the harness must report: a results row appended twice, one weight changed by one ulp, one
    byte of a shard changed; the fields that only say when or how fast do not count."""
    import torch

    harness = load_script("eval/crash_consistency.py")
    results = tmp_path / "results.jsonl"
    row = {"run": "a", "length": 64, "ppl": 3.25, "seconds": 1.0}
    results.write_text(json.dumps(row) + "\n")
    once = harness._rows(results)
    results.write_text(json.dumps({**row, "seconds": 9.0}) + "\n")
    assert harness._rows(results) == once  # timing aside
    results.write_text((json.dumps(row) + "\n") * 2)
    assert harness._rows(results) != once

    weights = torch.ones(3)
    torch.save({"state_dict": {"w": weights}}, tmp_path / "a.pt")
    torch.save({"state_dict": {"w": torch.nextafter(weights, torch.tensor(2.0))}}, tmp_path / "b.pt")
    assert harness._weights(tmp_path / "a.pt") != harness._weights(tmp_path / "b.pt")

    for name, shard in (("x", b"\x00\x01"), ("y", b"\x00\x02")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.bin").write_bytes(shard)
        (tmp_path / name / "manifest.json").write_text(json.dumps({"created_at": name, "stats": {"seconds": {}}}))
    assert harness._files(tmp_path / "x") != harness._files(tmp_path / "y")
    (tmp_path / "y" / "train.bin").write_bytes(b"\x00\x01")
    assert harness._files(tmp_path / "x") == harness._files(tmp_path / "y")


def test_a_resumed_preparation_leaves_no_temporary_of_the_killed_run_in_the_work_folder(tmp_path: Path) -> None:
    """The harness's finding: a preparation killed while writing its work folder's owner record left
    `.owner.json.<pid>.tmp` there, and the rerun, which reuses that folder and installs it as the data folder,
    carried it along. The dead writer's temporary goes; a running writer's stays."""
    import subprocess
    import sys

    from regulargpt.data.rebuild import claim_work_folder

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        work = tmp_path / "out" / ".work-abc"
        work.mkdir(parents=True)
        (work / f".owner.json.{dead}.tmp").write_text("{")
        (work / f".owner.json.{live.pid}.tmp").write_text("{")
        claim_work_folder(tmp_path / "out", ".work-abc")
        assert sorted(p.name for p in work.iterdir()) == [f".owner.json.{live.pid}.tmp", "owner.json"]
    finally:
        live.kill()
        live.wait()
