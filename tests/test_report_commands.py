"""Every committed report under results/ that names the command which (re)generates it — a ``Command: `python …```
line, the provenance stamp's form — names a script that exists, and that script's argument parser accepts the
command's flags as written. Parsed, never run: ``ArgumentParser.parse_args`` is wrapped to stop right after a
successful parse (a rejected flag exits with status 2 as on the command line)."""

from __future__ import annotations

import argparse
import functools
import inspect
import re
import shlex
import sys
from pathlib import Path

import pytest

from helpers import ROOT, load_script

COMMAND = re.compile(r"[Cc]ommand:?\**:? `(python [^`]+)`")


def report_commands() -> list[tuple[str, str]]:
    """(report path relative to the checkout, command) for every command line in results/**/*.md."""
    found = []
    for report in sorted((ROOT / "results").rglob("*.md")):
        for command in COMMAND.findall(report.read_text(encoding="utf-8")):
            found.append((str(report.relative_to(ROOT)), command))
    return found


def script_of(command: str) -> tuple[str, list[str]]:
    """``python /work/main/eval/x.py --a 1`` → ("eval/x.py", ["--a", "1"]): a checkout path, absolute or not."""
    words = shlex.split(command)
    script = words[1]
    for top in ("eval/", "launch/", "data_prep/"):
        if top in script:
            script = top + script.split(top, 1)[1]
            break
    return script, words[2:]


_load = functools.cache(load_script)  # one module per script for the whole walk


class _Parsed(Exception):
    """Raised in place of running the command once its arguments parsed."""


def test_the_walk_finds_the_reports_that_name_their_command() -> None:
    found = report_commands()
    reports = {r for r, _ in found}
    assert len(found) >= 90 and "results/lm_cpu_v2/README.md" in reports and "results/formal/table1_cpu.md" in reports
    assert script_of("python /work/main/eval/receptive_field.py --run r") == ("eval/receptive_field.py", ["--run", "r"])


@pytest.mark.parametrize("report,command", report_commands(), ids=lambda x: x if x.startswith("results") else "")
def test_the_reports_command_exists_and_its_flags_parse(report: str, command: str, monkeypatch) -> None:
    script, argv = script_of(command)
    assert (ROOT / script).is_file(), f"{report}: {script} does not exist"
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    main = _load(script).main
    with pytest.raises(_Parsed):
        try:
            main(argv) if inspect.signature(main).parameters else main()
        except SystemExit as exit_:
            pytest.fail(f"{report}: `{command[:200]}` is rejected by {script}'s parser (exit {exit_.code})")
