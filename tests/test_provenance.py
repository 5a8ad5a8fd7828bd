"""The one provenance stamp (regulargpt/provenance.py) that every report carries."""

import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from regulargpt import provenance as provenance_module
from regulargpt.provenance import git_commit, provenance, report_head

ROOT = Path(__file__).resolve().parents[1]


def test_stamp_names_command_commit_machine_and_date() -> None:
    before = datetime.now(UTC).replace(second=0, microsecond=0)
    stamp = provenance("python eval/x.py --out y")
    assert sorted(stamp) == ["command", "commit", "date", "machine"] and stamp["command"] == "python eval/x.py --out y"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", stamp["commit"]) and head.startswith(stamp["commit"][:12])
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results"],
                           cwd=ROOT, capture_output=True, text=True).stdout.strip() != ""
    assert stamp["commit"].endswith("+dirty") == dirty
    date = datetime.strptime(stamp["date"], "%Y-%m-%d %H:%M UTC").replace(tzinfo=UTC)
    assert before <= date <= before + timedelta(minutes=2)
    assert re.search(r"\d+ cores.*; torch \d", stamp["machine"])


def test_a_changed_report_under_results_is_not_dirty_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scripts that write several reports in turn stamp each with the commit: earlier outputs are not code changes."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    (tmp_path / "results").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "report.md").write_text("old\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    monkeypatch.setattr(provenance_module, "_ROOT", tmp_path)
    assert not git_commit().endswith("+dirty")
    (tmp_path / "results" / "report.md").write_text("new\n")
    assert not git_commit().endswith("+dirty")
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit().endswith("+dirty")


def test_report_head_is_title_blank_four_stamp_bullets_blank() -> None:
    prov = {"command": "python eval/x.py", "commit": "5737f89c1a2b", "machine": "box (2 cores)",
            "date": "2026-12-02 13:00 UTC"}
    assert report_head("Title", prov) == [
        "# Title", "", "- Command: `python eval/x.py`", "- Git commit: `5737f89c1a2b`", "- Machine: box (2 cores)",
        "- Date: 2026-12-02 13:00 UTC", ""]
