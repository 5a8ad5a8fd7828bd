"""The one provenance stamp (regulargpt/provenance.py) that every report carries."""

import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

from regulargpt.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]


def test_stamp_names_command_commit_machine_and_date() -> None:
    before = datetime.now(UTC).replace(second=0, microsecond=0)
    stamp = provenance("python eval/x.py --out y")
    assert sorted(stamp) == ["command", "commit", "date", "machine"] and stamp["command"] == "python eval/x.py --out y"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", stamp["commit"]) and head.startswith(stamp["commit"][:12])
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip() != ""
    assert stamp["commit"].endswith("+dirty") == dirty
    date = datetime.strptime(stamp["date"], "%Y-%m-%d %H:%M UTC").replace(tzinfo=UTC)
    assert before <= date <= before + timedelta(minutes=2)
    assert re.search(r"\d+ cores.*; torch \d", stamp["machine"])
