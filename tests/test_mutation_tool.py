"""eval/mutation.py: every mutant of eval/mutants.json still applies to exactly one place of the tree and maps to
test files that exist; a mutant whose text is gone or doubled is an error, not a silent no-op; the report's kill
rate leaves equivalent mutants out of the denominator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import ROOT, load_script

tool = load_script("eval/mutation.py")


def test_every_listed_mutant_applies_once_and_has_tests() -> None:
    mutants = tool.load_mutants(ROOT / "eval" / "mutants.json")
    assert 40 <= len(mutants) <= 120  # the report reruns every mutant: keep it within one sweep
    for m in mutants:
        text = (ROOT / m.file).read_text()
        assert m.apply(text) != text and text.count(m.find) == 1, m
        first, wider = tool.tests_for(m.file)
        assert first and all((ROOT / t).is_file() for t in first + wider), m.file


def test_a_stale_or_ambiguous_mutant_is_an_error(tmp_path: Path) -> None:
    m = tool.Mutant(3, "f.py", "sign flip", "return -x", "return x")
    with pytest.raises(tool.MutantError, match=r"mutant 3 \(f.py\): 'return -x' occurs 0 times"):
        m.apply("return x\n")
    with pytest.raises(tool.MutantError, match="occurs 2 times"):
        m.apply("return -x\nreturn -x\n")
    assert m.line("a\nb\nreturn -x\n") == 3
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps([{"file": "f.py", "find": "a", "replace": "b"}]))
    with pytest.raises(tool.MutantError, match=r"mutant 0 has missing keys \['kind'\]"):
        tool.load_mutants(bad)
    with pytest.raises(tool.MutantError, match="no tests mapped"):
        tool.tests_for("regulargpt/cli.py")


def test_report_counts_and_kill_rate() -> None:
    m = [tool.Mutant(i, "regulargpt/tasks/x.py", "off-by-one", "a", "b") for i in range(4)]
    outcomes = [tool.Outcome(m[0], 5, "killed", "tests/t.py::a", 1.0), tool.Outcome(m[1], 6, "killed", "timeout", 2.0),
                tool.Outcome(m[2], 7, "survived", "", 3.0), tool.Outcome(m[3], 8, "equivalent", "same table", 4.0)]
    prov = {"command": "python eval/mutation.py", "commit": "abc", "machine": "m", "date": "d"}
    text = tool.report(outcomes, prov, full=False)
    assert text.startswith("# Mutation check") and "- Git commit: `abc`" in text
    assert "Killed 2/3 = 66.7% of the non-equivalent mutants; 1 equivalent" in text and "1 survived" in text
    assert "| 2 | tasks/x.py:7 | off-by-one | `a` → `b` | survived |  | 3 |" in text
