"""Time to the first training batch and memory of the data loader on a prepared folder (memory-mapped splits): open
the train split, check the tokenizer, draw WindowSampler batches, print the times and the process's anonymous and
file-backed resident memory (/proc/self/status).

    python eval/bench_loader.py data/big                      # seq_len 512 × 8, 500 batches
    python eval/bench_loader.py data/big --seq-len 1024 --batches 100
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`


def _resident_mb() -> dict[str, float]:
    """RssAnon and RssFile of this process in MB, from /proc/self/status."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(status[key].split()[0]) / 1024 for key in ("RssAnon", "RssFile")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a prepared data folder, e.g. data/big")
    p.add_argument("--seq-len", type=int, default=512, help="window length (default 512)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per batch (default 8)")
    p.add_argument("--batches", type=int, default=500, help="batches drawn in all (default 500)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    import torch  # noqa: F401  (training imports it anyway; timed apart from the data)

    from regulargpt.data import WindowSampler, check_tokenizer, open_split
    t1 = time.perf_counter()
    split = open_split(args.data, "train")
    check_tokenizer(args.data)
    sampler = WindowSampler(split, seq_len=args.seq_len, micro_batch_size=args.batch_size, seed=0)
    sampler.batch(0)
    t2 = time.perf_counter()
    for step in range(1, args.batches):
        sampler.batch(step)
    t3 = time.perf_counter()
    mb = _resident_mb()
    print(f"{args.data}: {len(split):,} train tokens; open + first batch {t2 - t1:.2f} s (imports {t1 - t0:.2f} s); "
          f"{args.batches - 1} more batches of {args.batch_size}x{args.seq_len + 1} {t3 - t2:.2f} s; "
          f"RssAnon {mb['RssAnon']:.0f} MB, RssFile {mb['RssFile']:.0f} MB (page cache of the mapped split, "
          "reclaimable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
