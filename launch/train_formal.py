"""Train one formal-language classifier (Adam, clipping, constant LR, one length per batch); resumes automatically.

Example::

    python launch/train_formal.py --config configs/formal/parity_check.json \\
        --set train.steps=2000 --set train.lr=1e-3 --run-dir runs/parity-c2

Writes DIR/config.resolved.json, DIR/metrics.jsonl, DIR/ckpt.pt and finally DIR/model.pt (see
regulargpt/train/formal.py). Evaluate with ``python eval/formal.py range --run DIR --out DIR/range.jsonl``.
"""

from __future__ import annotations

import argparse
import sys

import torch

from regulargpt.config import ConfigError, load_config
from regulargpt.train.formal import train_formal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="task config, e.g. configs/formal/parity_check.json")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set model.chunk_size=3 (repeatable)")
    parser.add_argument("--run-dir", required=True, help="run directory; an existing run in it is resumed")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default), e.g. 1")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        cfg = load_config(args.config, args.set)
        path = train_formal(cfg, args.run_dir)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"model: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
