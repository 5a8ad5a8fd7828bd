"""Benchmark: what each data verification level (regulargpt/data/verify.py) costs when a job opens a split.

Writes a synthetic data folder with one split of `--size-gb` GB (random uint16 tokens) and a manifest recording
its sha256 and block checksums, as preparation does, then times ``open_split(folder, "test", verify=LEVEL)``:

    python eval/bench_verify.py --size-gb 1 --out results/bench_verify.md

Each level is timed twice: with the file's pages dropped from the page cache first (``posix_fadvise
DONTNEED`` on this one file: the first open of a split after a reboot, or on a cold node), and with them cached
(a file just written or read). ``full`` is timed on its first run (the whole file hashed) and again (its digest from
the cache, :mod:`regulargpt.data.digest_cache`, kept in a temporary XDG_CACHE_HOME). Each time is the median of
`--reps` runs (the first full run: once per page-cache state, each with an emptied digest cache).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from regulargpt.cli import positive_float, positive_int  # noqa: E402
from regulargpt.data import open_split  # noqa: E402
from regulargpt.data.digest_cache import cache_path  # noqa: E402
from regulargpt.data.integrity import BLOCK_BYTES, BLOCKS, block_checksums  # noqa: E402
from regulargpt.files import atomic_write_text, sha256_file  # noqa: E402
from regulargpt.provenance import provenance, report_head  # noqa: E402


def write_folder(folder: Path, size_bytes: int) -> Path:
    """A data folder whose test split is `size_bytes` of random uint16 tokens (written 64 MiB at a time), with the
    manifest entries preparation writes (sha256, blocks); train and val are tiny."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    splits = {}
    for name, size in (("train", 2048), ("val", 2048), ("test", size_bytes)):
        path = folder / f"{name}.bin"
        with open(path, "wb") as handle:
            for start in range(0, size, 1 << 26):
                handle.write(rng.integers(0, 8000, min(1 << 26, size - start) // 2, dtype=np.uint16).tobytes())
        splits[name] = {"tokens": size // 2, "documents": 1, "file": path.name, "sha256": sha256_file(path),
                        "blocks": block_checksums(path)}
    (folder / "tokenizer.model").write_bytes(b"synthetic")
    manifest = {"format_version": 1, "dtype": "uint16", "vocab_size": 8000, "splits": splits,
                "tokenizer": {"file": "tokenizer.model", "sha256": sha256_file(folder / "tokenizer.model")}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "test.bin"


def evict(path: Path) -> None:
    """Drop this file's pages from the page cache (its next read comes from the disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(run: Callable[[], object], before: Callable[[], None], reps: int) -> float:
    """Median seconds of `reps` calls of `run`, each after `before`."""
    times = []
    for _ in range(reps):
        before()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(folder: Path, path: Path, reps: int) -> list[tuple[str, str, float, float]]:
    """Rows (level, what it reads, seconds with the file evicted, seconds with it cached)."""
    def forget_digests() -> None:
        cache_path().unlink(missing_ok=True)

    def open_at(level: str) -> Callable[[], object]:
        return lambda: open_split(folder, "test", verify=level)

    rows = []
    size_gb = path.stat().st_size / 1e9
    cases = [("size", "one stat", open_at("size"), lambda: None, reps),
             ("blocks", f"{BLOCKS} blocks of {BLOCK_BYTES // 1024} KiB", open_at("blocks"), lambda: None, reps),
             ("full, first time", f"the blocks + the whole file ({size_gb:.2f} GB)", open_at("full"), forget_digests,
              1),
             ("full, again", "the blocks + the digest cache", open_at("full"), lambda: None, reps)]
    for level, reads, run, before, n in cases:
        cold = timed(run, lambda: (before(), evict(path)), n)
        warm = timed(run, before, n)
        rows.append((level, reads, cold, warm))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gb", type=positive_float, default=1.0, help="split size in GB (default 1), e.g. 0.1")
    p.add_argument("--reps", type=positive_int, default=5, help="runs per timing, median reported (default 5)")
    p.add_argument("--out", help="markdown report to write, e.g. results/bench_verify.md (default: print only)")
    args = p.parse_args(argv)
    command = "python " + shlex.join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # the user's digest cache is left alone
        path = write_folder(Path(tmp) / "data", int(args.size_gb * 1e9) // 2 * 2)
        rows = measure(Path(tmp) / "data", path, args.reps)
    lines = [*report_head(f"Data verification cost on a {args.size_gb:g} GB split", provenance(command)),
             "Seconds to open one split at each `--verify-data` level (median of "
             f"{args.reps} runs; `full, first time` once per column). Evicted: the file's pages dropped from the "
             "page cache first (a cold open); cached: its pages in memory.", "",
             "| level | reads | evicted (s) | cached (s) |", "|---|---|---:|---:|",
             *(f"| {level} | {reads} | {cold:.4f} | {warm:.4f} |" for level, reads, cold, warm in rows)]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
