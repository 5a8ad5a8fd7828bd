"""The combined table and plots of several eval/extrapolate.py outputs (nothing is recomputed; docs/TRAINING.md, SLURM).

Example (what the comparison job of launch/submit.py runs once every evaluation of a sweep has finished)::

    python eval/compare.py --results results/eval/stdlib/regular_gpt-seed0 results/eval/stdlib/alibi-seed0 \\
        --out results/eval/sweep/comparison

Reads DIR/results.jsonl of every --results folder and writes OUT/results.jsonl (their rows, one file),
OUT/table.md, OUT/ppl_vs_length.png and OUT/loss_vs_position.png, grouped by dataset, split and protocol like
eval/extrapolate.py's own report. Exit status 2 with one `error:` line when a folder has no results.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import run  # noqa: E402
from regulargpt.evaluation.lm_report import latest_rows, load_rows, write_report  # noqa: E402
from regulargpt.evaluation.perplexity import EvalError  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", nargs="+", required=True,
                   help="output folders of eval/extrapolate.py, e.g. --results results/eval/stdlib/*-seed0")
    p.add_argument("--out", required=True, help="folder for the combined results, e.g. --out results/eval/comparison")
    args = p.parse_args(argv)
    rows = []
    for folder in args.results:
        path = Path(folder) / "results.jsonl"
        if not path.is_file() or not (found := load_rows(path)):
            raise EvalError(f"--results {folder}: no rows in {path}; evaluate the run first with eval/extrapolate.py")
        rows += found
    rows = latest_rows(rows)
    out = Path(args.out)
    atomic_write_text(out / "results.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    command = "python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    written = write_report(rows, out, command, title="Perplexity vs evaluation length: sweep comparison")
    print(f"wrote {out}/results.jsonl ({len(rows)} rows from {len(args.results)} folders), {', '.join(written)}")
    return 0


if __name__ == "__main__":
    run(main)
