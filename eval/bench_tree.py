"""Benchmark: a RegularGPT classifier training step in tree mode against the same weights in sliding mode.

Tree mode keeps only the last position of every chunk after each depth step (and with K = 1 computes only those);
sliding mode computes every position at every step and reads the last one. Same model, same batch, same loss.

    python eval/bench_tree.py --config configs/formal/parity_check.json --out results/bench_tree.md

Timing is robust to a shared, noisy machine: after `--warmup` untimed steps per mode, the modes' timed steps are
interleaved (sliding, tree, sliding, tree, …), so a burst of load from another process hits both, and each mode
reports the median and the minimum of its `--reps` steps. The speed-up is the ratio of the medians. Example: steps of
50, 51, 49, 90, 50 ms give median 50 ms, min 49 ms (the mean, 58 ms, would carry the one 90 ms outlier).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regulargpt.cli import positive_int  # noqa: E402
from regulargpt.config import FormalConfig, load_config  # noqa: E402
from regulargpt.model import build_model  # noqa: E402
from regulargpt.provenance import git_commit, machine, utc_date  # noqa: E402

MODES = ("sliding", "tree")


def training_step(model: torch.nn.Module, mode: str, tokens: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    """One classifier step (forward, backward, Adam) in `mode`, with its own optimizer: tree mode is the
    classifier's forward (what training runs), sliding mode the same weights' sliding stack read at the last
    position."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        logits = model(tokens) if mode == "tree" else model.head(model.stack.sliding(model.embed(tokens))[:, -1])
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step


def interleaved_seconds(steps: dict[str, Callable[[], None]], reps: int, warmup: int) -> dict[str, list[float]]:
    """Each step run `warmup` times untimed, then `reps` timed rounds, one step of every mode per round:
    {mode: [seconds of each timed step]}."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    for _ in range(reps):
        for mode, step in steps.items():
            start = time.perf_counter()
            step()
            times[mode].append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/formal/parity_check.json")
    parser.add_argument("--set", action="append", default=["model.d_model=64"], metavar="KEY=VALUE",
                        help="config overrides (default: model.d_model=64, the quick profile's width)")
    parser.add_argument("--lengths", default="10,20,40", help="input lengths (default: %(default)s)")
    parser.add_argument("--batch", type=positive_int, default=128)
    parser.add_argument("--reps", type=positive_int, default=15, help="timed steps per mode (default: %(default)s)")
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed steps per mode (default: %(default)s)")
    parser.add_argument("--modes", choices=("both", *MODES), default="both",
                        help="time both modes (default) or one; a mode not timed is '-' in the table")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/bench_tree.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = load_config(args.config, args.set, FormalConfig)
    model = build_model(cfg.model)
    modes = MODES if args.modes == "both" else (args.modes,)
    lines = [
        "# Tree mode vs sliding mode: one classifier training step (forward, backward, Adam)",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Git commit: {git_commit()}  ",
        f"Machine: {machine()}, torch threads {args.threads}  ",
        f"Date: {utc_date()}  ",
        (f"Model: C={cfg.model.chunk_size}, K={cfg.model.thickness}, d={cfg.model.d_model}, heads={cfg.model.n_heads}; "
         f"batch {args.batch}; median (and min) of {args.reps} steps per mode after {args.warmup} warm-up steps, "
         "the modes' steps interleaved; speed-up = ratio of the medians."),
        "",
        "| T | sliding (ms) | tree (ms) | speed-up | sliding min (ms) | tree min (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for t in (int(x) for x in args.lengths.split(",")):
        tokens = torch.randint(0, cfg.model.vocab_size, (args.batch, t))
        labels = torch.randint(0, cfg.model.num_classes, (args.batch,))
        steps = {mode: training_step(model, mode, tokens, labels) for mode in modes}
        times = interleaved_seconds(steps, args.reps, args.warmup)
        median = {mode: statistics.median(times.get(mode, [float("nan")])) for mode in MODES}
        fastest = {mode: min(times.get(mode, [float("nan")])) for mode in MODES}
        ms = {mode: "-" if mode not in times else f"{median[mode] * 1e3:.1f}" for mode in MODES}
        mins = {mode: "-" if mode not in times else f"{fastest[mode] * 1e3:.1f}" for mode in MODES}
        ratio = f"{median['sliding'] / median['tree']:.1f}×" if len(times) == 2 else "-"
        lines.append(f"| {t} | {ms['sliding']} | {ms['tree']} | {ratio} | {mins['sliding']} | {mins['tree']} |")
        print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
