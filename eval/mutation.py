"""Mutation check: plant one-line bugs in the modules the published numbers depend on and see whether the fast
suite catches each one.

    python eval/mutation.py --out results/mutation.md            # every mutant of eval/mutants.json, 1 core
    python eval/mutation.py --only 3 17 --out /tmp/m.md          # a few, by index
    python eval/mutation.py --list                               # the mutants, numbered

A mutant (eval/mutants.json) is one exact text replacement in one file: ``{"file", "kind", "find", "replace"}``,
with ``"equivalent"`` (why it cannot change any result) when it is known to survive. The tree is copied once to
``--workdir`` (the files ``git ls-files`` lists, tracked and untracked-not-ignored; the checkout itself is never
edited); each mutant is written into the copy, the tests that pin its module (:data:`TEST_MAP`) run with ``-x`` under
``-m "not slow and not long"``, one process, OMP_NUM_THREADS=1, then (if it survived) the wider tests that also
exercise the module, then with ``--full`` the whole non-slow suite; the file is restored. A failing test, a collection error or a timeout is
a kill. A ``find`` that no longer occurs exactly once in its file is reported as stale (the list needs updating)
instead of being run. The report: the provenance header, the kill rate, and one row per mutant.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.provenance import provenance, report_head  # noqa: E402

# Source prefix → (the test files that pin it, run first with -x; the wider tests that also exercise it, run on
# the mutants the first set misses). First matching prefix wins.
TEST_MAP: dict[str, tuple[list[str], list[str]]] = {
    "regulargpt/model/position.py": (["tests/test_position.py", "tests/test_attention_truth.py"],
                                     ["tests/test_dense_attention.py", "tests/test_window_attention.py"]),
    "regulargpt/model/rotary.py": (["tests/test_position.py", "tests/test_rope_scaling.py"],
                                   ["tests/test_position_schemes.py"]),
    "regulargpt/model/cpu_operator.py": (["tests/test_kernel_cpp.py"], ["tests/test_attention_truth.py"]),
    "regulargpt/kernels/sliding_dilated_cpu_sweep.h": (["tests/test_kernel_cpu_sweep.py"], ["tests/test_kernel_cpp.py"]),
    "regulargpt/kernels/sliding_dilated_cpu_row_backward.h": (["tests/test_kernel_cpu_sweep.py"],
                                                               ["tests/test_kernel_cpp.py"]),
    "regulargpt/kernels/": (["tests/test_kernel_cpp.py"], ["tests/test_attention_truth.py"]),
    "regulargpt/model/sliding_dilated.py": (["tests/test_attention_truth.py", "tests/test_sliding_dilated.py"],
                                            ["tests/test_kernel_cpp.py", "tests/test_regular_gpt_truth.py"]),
    "regulargpt/model/dilation.py": (["tests/test_attention_truth.py", "tests/test_sliding_dilated.py"], []),
    "regulargpt/evaluation/": (["tests/test_perplexity_truth.py"], ["tests/test_extrapolate.py"]),
    "regulargpt/train/lm_step.py": (["tests/test_grad_accum.py"], ["tests/test_pretrain.py", "tests/test_host_syncs.py"]),
    "regulargpt/data/mixture.py": (["tests/test_mixture.py"], []),
    "regulargpt/data/": (["tests/test_data.py"], ["tests/test_pretrain.py"]),
    "regulargpt/tasks/": (["tests/test_tasks.py"], ["tests/test_formal.py"]),
}
MARKERS = "not slow and not long"


class MutantError(ValueError):
    """A mutants file entry that cannot be applied (bad keys, or its text not found exactly once)."""


@dataclass(frozen=True)
class Mutant:
    index: int
    file: str
    kind: str
    find: str
    replace: str
    equivalent: str = ""

    def apply(self, text: str) -> str:
        """`text` with `find` replaced; MutantError unless `find` occurs exactly once.

        >>> Mutant(0, "f.py", "sign flip", "return -x", "return x").apply("def f(x):\\n    return -x\\n")
        'def f(x):\\n    return x\\n'
        """
        count = text.count(self.find)
        if count != 1:
            raise MutantError(f"mutant {self.index} ({self.file}): {self.find!r} occurs {count} times, expected once")
        return text.replace(self.find, self.replace)

    def line(self, text: str) -> int:
        """1-based line of the mutated text in the original `text`."""
        return text[: text.index(self.find)].count("\n") + 1


def load_mutants(path: Path) -> list[Mutant]:
    """The entries of a mutants JSON file, numbered from 0; MutantError naming the entry and key otherwise."""
    raw = json.loads(path.read_text())
    if not isinstance(raw, list):
        raise MutantError(f"{path}: expected a JSON list of mutants")
    out = []
    for i, entry in enumerate(raw):
        missing = {"file", "kind", "find", "replace"} - set(entry)
        extra = set(entry) - {"file", "kind", "find", "replace", "equivalent"}
        if missing or extra:
            raise MutantError(f"{path}: mutant {i} has missing keys {sorted(missing)} / unknown keys {sorted(extra)}")
        if entry["find"] == entry["replace"]:
            raise MutantError(f"{path}: mutant {i} replaces {entry['find']!r} by itself")
        out.append(Mutant(i, **entry))
    return out


def tests_for(file: str) -> tuple[list[str], list[str]]:
    """The (first, wider) tests of a source file (:data:`TEST_MAP`); MutantError for an unmapped file."""
    for prefix, tests in TEST_MAP.items():
        if file.startswith(prefix):
            return tests
    raise MutantError(f"{file}: no tests mapped in eval/mutation.py TEST_MAP")


def copy_tree(dest: Path) -> None:
    """The checkout's listed files (tracked, and untracked ones git does not ignore) copied to `dest`."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    if dest.exists():
        shutil.rmtree(dest)
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[str, str, float]:
    """Run `tests` in `tree` with -x → ("killed" | "survived", the first failing test or why, seconds). The pytest
    process (and anything it started) is ended if this process is interrupted or the run times out."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-rfE", "-m", MARKERS,
           *tests]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "killed", f"timeout after {timeout:g} s", time.perf_counter() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    seconds = time.perf_counter() - t0
    if proc.returncode == 0:
        return "survived", "", seconds
    if proc.returncode == 5:
        raise MutantError(f"no tests collected by {' '.join(tests)}")
    found = _FAILED.search(stdout)
    return "killed", found.group(1) if found else f"pytest exit {proc.returncode}", seconds


@dataclass
class Outcome:
    mutant: Mutant
    line: int
    status: str  # killed | survived | equivalent | stale
    by: str
    seconds: float


def check(mutant: Mutant, tree: Path, full: bool, timeout: float) -> Outcome:
    path = tree / mutant.file
    original = path.read_text()
    try:
        mutated, line = mutant.apply(original), mutant.line(original)
    except MutantError as err:
        return Outcome(mutant, 0, "stale", str(err), 0.0)
    path.write_text(mutated)
    first, wider = tests_for(mutant.file)
    stages = [first, wider] + ([["tests"]] if full else [])
    try:
        status, by, seconds = "survived", "", 0.0
        for tests in filter(None, stages):
            status, by, more = run_tests(tree, tests, timeout if tests != ["tests"] else timeout * 4)
            seconds += more
            if status != "survived":
                break
    finally:
        path.write_text(original)
    if status == "survived" and mutant.equivalent:
        status, by = "equivalent", mutant.equivalent
    return Outcome(mutant, line, status, by, seconds)


def _cell(text: str) -> str:
    return "`" + text.strip().replace("|", "\\|").replace("`", "'") + "`"


def report(outcomes: list[Outcome], prov: dict[str, str], full: bool) -> str:
    """The markdown report: header, kill rate (equivalent mutants left out of the denominator), one row each."""
    counts = {s: sum(o.status == s for o in outcomes) for s in ("killed", "survived", "equivalent", "stale")}
    live = counts["killed"] + counts["survived"]
    rate = f"{counts['killed']}/{live} = {100 * counts['killed'] / live:.1f}%" if live else "n/a"
    scope = ("its module's tests, the wider related tests, then the whole non-slow suite for mutants they miss"
             if full else "its module's tests, then the wider related tests for mutants they miss")
    lines = report_head("Mutation check: one-line bugs against the fast suite", prov)
    lines += [f"{len(outcomes)} mutants (eval/mutants.json), each run against {scope} (`-x -m \"{MARKERS}\"`, one "
              f"process, OMP_NUM_THREADS=1). Killed {rate} of the non-equivalent mutants; "
              f"{counts['equivalent']} equivalent (cannot change any result: reason in the row), "
              f"{counts['survived']} survived, {counts['stale']} stale.", "",
              "| # | where | kind | change | result | killed by / why equivalent | s |", "|---|---|---|---|---|---|---|"]
    for o in outcomes:
        m = o.mutant
        where = f"{m.file.removeprefix('regulargpt/')}:{o.line}"
        change = f"{_cell(m.find)} → {_cell(m.replace)}"
        lines.append(f"| {m.index} | {where} | {m.kind} | {change} | {o.status} | {o.by.replace('|', '/')} | "
                     f"{o.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--mutants", type=Path, default=ROOT / "eval" / "mutants.json", help="the mutants JSON file")
    p.add_argument("--only", type=int, nargs="+", help="run only these mutant indices")
    p.add_argument("--out", type=Path, help="write the markdown report here (default: print it)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/regulargpt-mutation"),
                   help="where the tree is copied (kept between runs: the C++ kernel is built once per path)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per test run before the mutant counts as "
                   "killed (the full-suite run gets 4x)")
    p.add_argument("--full", action="store_true", help="run the whole non-slow suite on the mutants the mapped tests miss")
    p.add_argument("--list", action="store_true", help="print the numbered mutants and exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        mutants = load_mutants(args.mutants)
        for m in mutants:
            tests_for(m.file)
        if args.only:
            unknown = sorted(set(args.only) - {m.index for m in mutants})
            if unknown:
                raise MutantError(f"--only {unknown}: no such mutant (0..{len(mutants) - 1})")
            mutants = [m for m in mutants if m.index in set(args.only)]
    except (MutantError, OSError, json.JSONDecodeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.list:
        for m in mutants:
            print(f"{m.index:3d} {m.file}: {m.kind}: {m.find!r} → {m.replace!r}")
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that run_tests ends its pytest on `kill`
    command = "python eval/mutation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    prov = provenance(command.strip())  # the commit of the tree copied next, not whatever HEAD is at the end
    tree = args.workdir / "tree"
    copy_tree(tree)
    outcomes = []
    for m in mutants:
        o = check(m, tree, args.full, args.timeout)
        print(f"{m.index:3d} {o.status:10s} {o.seconds:6.0f}s {m.file}:{o.line} {o.by[:100]}", flush=True)
        outcomes.append(o)
    text = report(outcomes, prov, args.full)
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
