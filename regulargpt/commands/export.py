"""Write the consolidated fp32 model file (model.pt) of a training run's checkpoint; works for every ZeRO stage.

Examples:
    python launch/export.py runs/regular_gpt-seed0                     # latest checkpoint → runs/.../model.pt
    python launch/export.py runs/regular_gpt-seed0 --step 1000 --out /tmp/step1000.pt

One CPU process, no GPU and no torch.distributed needed: ZeRO-1/2/3 partitions of all ranks are gathered from the
checkpoint files (DeepSpeed's zero_to_fp32), ZeRO-0 bf16 runs use the optimizer's fp32 master weights. The weights are
loaded into a fresh model (strict) before the file is written. Load it with regulargpt.checkpoint.load_model_file.
A checkpoint that fails its checksums is refused (exit 2, `error: ...`).
"""

from __future__ import annotations

import argparse
import os
from typing import NoReturn

from regulargpt.cli import positive_int, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", help="training run directory, e.g. runs/regular_gpt-seed0")
    p.add_argument("--step", type=positive_int, help="checkpoint step to export (default: the one 'latest' names), e.g. 1000")
    p.add_argument("--out", help="output file (default RUN_DIR/model.pt), e.g. --out exports/rgpt.pt")
    args = p.parse_args(argv)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # only checkpoint files are read
    from regulargpt.train import export_model

    path = export_model(args.run_dir, step=args.step, out=args.out)
    print(f"wrote {path}")
    return 0


def console() -> NoReturn:
    """The ``regulargpt-export`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
