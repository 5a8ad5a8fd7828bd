"""The console scripts (setup.py) and the thin scripts in launch/ and eval/ run the same commands."""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from helpers import ROOT, load_script

# console script → the documented script that wraps the same `main`
WRAPPERS = {
    "regulargpt-pretrain": "launch/pretrain.py",
    "regulargpt-train-formal": "launch/train_formal.py",
    "regulargpt-extrapolate": "eval/extrapolate.py",
    "regulargpt-generate": "launch/generate.py",
    "regulargpt-formal": "eval/formal.py",
    "regulargpt-export": "launch/export.py",
    "regulargpt-submit": "launch/submit.py",
    "regulargpt-lm-comparison": "eval/lm_comparison.py",
}


def _console_scripts() -> dict[str, str]:
    """name → "module:function", read from setup.py's source (not from an installed distribution)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    entry_points = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "entry_points"))
    pairs = (line.split("=") for line in entry_points["console_scripts"])
    return {name.strip(): target.strip() for name, target in pairs}


def _resolve(target: str) -> Callable[[], object]:
    module, _, attr = target.partition(":")
    function: Callable[[], object] = getattr(importlib.import_module(module), attr)
    return function


def test_every_console_script_resolves_to_a_callable() -> None:
    scripts = _console_scripts()
    assert set(scripts) == set(WRAPPERS)
    for name, target in scripts.items():
        assert callable(_resolve(target)), f"{name} = {target}"


def test_each_documented_script_wraps_the_main_of_its_console_script() -> None:
    for name, target in _console_scripts().items():
        module = target.partition(":")[0]
        assert load_script(WRAPPERS[name]).main is importlib.import_module(module).main, name


def test_a_console_script_reports_a_user_error_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    console = _resolve(_console_scripts()["regulargpt-train-formal"])
    monkeypatch.setattr(sys, "argv", ["regulargpt-train-formal", "--config", str(tmp_path / "no_such_config.json"),
                                      "--run-dir", str(tmp_path / "run")])
    with pytest.raises(SystemExit) as exit_info:
        console()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "no_such_config.json" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("script", "argv", "message"), [
    ("launch/train_formal.py", ["--config", "c.json", "--run-dir", "r", "--threads", "-1"],
     "argument --threads: '-1': expected an integer >= 0"),
    ("launch/train_formal.py", ["--config", "c.json", "--run-dir", "r", "--time-to-solve", "0"],
     "argument --time-to-solve: '0': expected an integer >= 1"),
    ("eval/formal.py", ["sweep", "--profile", "quick", "--out", "o", "--workers", "0"],
     "argument --workers: '0': expected an integer >= 1"),
    ("eval/formal.py", ["sweep", "--profile", "quick", "--out", "o", "--lrs", "nan"],
     "argument --lrs: 'nan': expected a finite number > 0"),
    ("eval/formal.py", ["range", "--run", "r", "--out", "o", "--p-one", "1.5"],
     "argument --p-one: '1.5': expected a number in [0, 1]"),
    ("eval/extrapolate.py", ["--runs", "r", "--data", "d", "--out", "o", "--lengths", "64,x"],
     "argument --lengths: '64,x': expected comma-separated integers"),
    ("launch/generate.py", ["m.pt", "--prompt", "x", "--num-samples", "0"],
     "argument --num-samples: '0': expected an integer >= 1"),
    ("eval/plan_scale.py", ["--batch", "0"], "argument --batch: '0': expected an integer >= 1"),
])
def test_a_bad_flag_value_is_an_argparse_error_naming_the_flag(script: str, argv: list[str], message: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Numbers that must be positive or in a range are checked when parsed (regulargpt.cli's argparse types):
    exit status 2 and argparse's usual ``error: argument --flag: ...`` line, before anything runs."""
    with pytest.raises(SystemExit) as exit_info:
        load_script(script).main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_script_runs_its_own_checkout_before_an_installed_package(tmp_path: Path) -> None:
    """A sweep runs from a git worktree at a fixed commit while the venv's editable install points at main: the
    script must import the worktree's code. A decoy `regulargpt` first on PYTHONPATH must lose to the checkout."""
    decoy = tmp_path / "regulargpt"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy regulargpt was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "launch/export.py"), "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "decoy" not in proc.stderr


_SCRIPTS = sorted({*WRAPPERS.values(), *(str(p.relative_to(ROOT)) for p in (ROOT / "eval").glob("*.py"))})


@pytest.mark.parametrize("script", _SCRIPTS)
def test_every_script_that_imports_the_package_puts_its_checkout_first(script: str) -> None:
    """Statically: the sys.path.insert of the script's own checkout comes before its first regulargpt import."""
    tree = ast.parse((ROOT / script).read_text())
    first_import = insert = None
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("regulargpt") and first_import is None:
            first_import = node.lineno
        if insert is None and "sys.path.insert" in ast.unparse(node):
            insert = node.lineno
    if first_import is None:
        pytest.skip(f"{script} imports regulargpt only inside functions or not at all")
    assert insert is not None and insert < first_import, script


COMMAND_SOURCES = sorted([*(ROOT / "regulargpt" / "commands").glob("*.py"), ROOT / "data_prep" / "prepare.py"])


@pytest.mark.parametrize("path", COMMAND_SOURCES, ids=lambda p: p.name)
def test_help_examples_keep_their_line_continuations(path: Path) -> None:
    """A `\\` ending a line of a (non-raw) docstring joins the lines in --help; the examples need `\\\\`."""
    tree = ast.parse(path.read_text())
    node = tree.body[0] if tree.body and isinstance(tree.body[0], ast.Expr) else None
    if node is None or not isinstance(node.value, ast.Constant) or not isinstance(node.value.value, str):
        pytest.skip("no module docstring")
    raw = ast.get_source_segment(path.read_text(), node.value) or ""
    assert raw.count("\n") == node.value.value.count("\n"), f"{path}: a line continuation is swallowed in --help"
