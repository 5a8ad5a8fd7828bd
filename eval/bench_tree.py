"""Benchmark: a RegularGPT classifier training step in tree mode against the same weights in sliding mode.

Tree mode keeps only the last position of every chunk after each depth step (and with K = 1 computes only those);
sliding mode computes every position at every step and reads the last one. Same model, same batch, same loss.

    python eval/bench_tree.py --config configs/formal/parity_check.json --out results/bench_tree.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regulargpt.cli import positive_int  # noqa: E402
from regulargpt.config import FormalConfig, load_config  # noqa: E402
from regulargpt.model import build_model  # noqa: E402
from regulargpt.provenance import git_commit, machine, utc_date  # noqa: E402


def step_seconds(model: torch.nn.Module, mode: str, tokens: torch.Tensor, labels: torch.Tensor, reps: int) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        x = model.embed(tokens)
        state = model.stack.tree(x) if mode == "tree" else model.stack.sliding(x)[:, -1]
        loss = F.cross_entropy(model.head(state), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    step()
    start = time.perf_counter()
    for _ in range(reps):
        step()
    return (time.perf_counter() - start) / reps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/formal/parity_check.json")
    parser.add_argument("--set", action="append", default=["model.d_model=64"], metavar="KEY=VALUE",
                        help="config overrides (default: model.d_model=64, the quick profile's width)")
    parser.add_argument("--lengths", default="10,20,40", help="input lengths (default: %(default)s)")
    parser.add_argument("--batch", type=positive_int, default=128)
    parser.add_argument("--reps", type=positive_int, default=5)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/bench_tree.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.config, args.set, FormalConfig)
    model = build_model(cfg.model)
    lines = [
        "# Tree mode vs sliding mode: one classifier training step (forward, backward, Adam)",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Git commit: {git_commit()}  ",
        f"Machine: {machine()}, torch threads {args.threads}  ",
        f"Date: {utc_date()}  ",
        f"Model: C={cfg.model.chunk_size}, K={cfg.model.thickness}, d={cfg.model.d_model}, heads={cfg.model.n_heads}; "
        f"batch {args.batch}; mean of {args.reps} steps after one warm-up step.",
        "",
        "| T | sliding (ms) | tree (ms) | speed-up |",
        "|---|---|---|---|",
    ]
    for t in (int(x) for x in args.lengths.split(",")):
        tokens = torch.randint(0, cfg.model.vocab_size, (args.batch, t))
        labels = torch.randint(0, cfg.model.num_classes, (args.batch,))
        sliding = step_seconds(model, "sliding", tokens, labels, args.reps)
        tree = step_seconds(model, "tree", tokens, labels, args.reps)
        lines.append(f"| {t} | {sliding * 1e3:.1f} | {tree * 1e3:.1f} | {sliding / tree:.1f}× |")
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
