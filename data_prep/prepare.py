"""Corpus → sentencepiece BPE tokenizer → flat token shards + manifest.json (see docs/DATA.md).

Examples:
    python data_prep/prepare.py --source python-stdlib --out data/stdlib
    python data_prep/prepare.py --source python-stdlib --out data/tiny --vocab-size 512 --max-bytes 300000
    python data_prep/prepare.py --source debian-prose --out data/prose --max-bytes 2000000
    python data_prep/prepare.py --source 'corpus/*.jsonl' --text-field content --out data/mine
    python data_prep/prepare.py --source notes/ --out data/notes --tokenizer data/stdlib/tokenizer.model
    python data_prep/prepare.py --source python-stdlib --out data/stdlib --tokenizer data/stdlib/tokenizer.model --force

A killed preparation resumes where it stopped when the same command is run again.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import run  # noqa: E402
from regulargpt.data import prepare  # noqa: E402
from regulargpt.data.sources import KNOWN_SOURCES  # noqa: E402
from regulargpt.data.tokenizer_sample import DEFAULT_SAMPLE_BYTES  # noqa: E402
from regulargpt.folder_lock import hold_target  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and run `regulargpt.data.prepare` (under cli.run: a DataError is one line, exit 2)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", required=True,
                   help=f"a file, folder or glob (txt: one document per file; jsonl/json/parquet: one per row), "
                        f"'hf:<name>[:<config>]' (needs hub access), or one of {', '.join(KNOWN_SOURCES)}. "
                        f"Example: --source python-stdlib")
    p.add_argument("--out", required=True, help="output data folder, e.g. --out data/stdlib")
    p.add_argument("--vocab-size", type=int, help="BPE vocabulary size to train (default 8000; with --tokenizer: "
                                                  "must match it if given)")
    p.add_argument("--tokenizer", help="reuse this sentencepiece .model instead of training one, "
                                       "e.g. --tokenizer data/stdlib/tokenizer.model")
    p.add_argument("--max-bytes", type=int, help="keep the first documents up to this many bytes, e.g. 2000000")
    p.add_argument("--seed", type=int, default=0, help="seed of the document split (default 0)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents for val (default 0.05)")
    p.add_argument("--test-fraction", type=float, default=0.05, help="share of documents for test (default 0.05)")
    p.add_argument("--text-field", default="text", help="jsonl/parquet/hf column holding the text (default 'text')")
    p.add_argument("--num-proc", type=int, help="tokenising processes (default: all cores)")
    p.add_argument("--cache-dir",
                   help="Debian download cache (default $REGULARGPT_CACHE, else ~/.cache/regulargpt/debian)")
    p.add_argument("--skip-bad-rows", action="store_true",
                   help="skip (and count in the manifest) rows with a missing/null/non-string text field, malformed "
                        "JSON, non-UTF-8 or binary files, instead of stopping at the first one")
    p.add_argument("--tokenizer-sample-bytes", type=int, default=DEFAULT_SAMPLE_BYTES,
                   help=f"train the tokenizer on a reproducible sample of this many bytes of train text "
                        f"(default {DEFAULT_SAMPLE_BYTES:,}; memory grows with it, not with the corpus)")
    p.add_argument("--force", action="store_true",
                   help="rebuild even if the folder is up to date, and replace its tokenizer when these options "
                        "train or name another one (refused without it: folders and runs built with the old one "
                        "would stop matching)")
    args = p.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    with hold_target(Path(args.out), "data preparation"):  # one writer per --out
        _prepare(args, command)
    return 0


def _prepare(args: argparse.Namespace, command: str) -> None:
    prepare(args.source, args.out, vocab_size=args.vocab_size, tokenizer=args.tokenizer, max_bytes=args.max_bytes,
            seed=args.seed, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
            text_field=args.text_field, num_proc=args.num_proc, cache_dir=args.cache_dir, force=args.force,
            skip_bad_rows=args.skip_bad_rows, sample_bytes=args.tokenizer_sample_bytes, command=command)


if __name__ == "__main__":
    run(main)
