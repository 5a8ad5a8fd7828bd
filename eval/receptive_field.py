"""Receptive field of a trained model: cumulative normalised input-gradient norms of its final prediction
(RegularGPT paper Figure 4; Chi et al. 2022b's tool).

Examples::

    # formal-language run: strings of the run's task and their true labels
    python eval/receptive_field.py --run runs/analyses/parity_check --length 500 --samples 256 \\
        --out results/analyses/parity_check

    # language-model run (RegularGPT or TransformerLM): windows of the run's test split, loss at the last position
    python eval/receptive_field.py --run runs/lm/regular_gpt --length 2048 --samples 64 --out results/analyses/lm
    python eval/receptive_field.py --run runs/lm/regular_gpt --random-tokens --length 512 --out /tmp/rf

Writes OUT/receptive_field.csv (position, distance, grad_norm, normalised, cumulative), OUT/receptive_field.png
and OUT/receptive_field.json / .md (provenance; how many most recent tokens hold 50/90/99% of the gradient).
See docs/ANALYSES.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runs its own checkout's code (worktrees too)

import torch  # noqa: E402

from regulargpt.checkpoint import load_model_file  # noqa: E402
from regulargpt.cli import non_negative_int, positive_int, run  # noqa: E402
from regulargpt.config import FormalConfig  # noqa: E402
from regulargpt.evaluation.receptive_field import (  # noqa: E402
    formal_batch,
    lm_batch,
    plot_receptive_field,
    receptive_field,
    write_csv,
)
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402


def markdown(summary: dict) -> str:
    reach = summary["tokens_holding_mass"]
    return (f"# Receptive field: {summary['model']}, {summary['inputs']} (T={summary['length']}, "
            f"{summary['sequences']} sequences)\n\n"
            f"- command: `{summary['command']}`\n- git commit: {summary['commit']}\n"
            f"- machine: {summary['machine']}\n- date: {summary['date']}\n\n"
            f"| most recent tokens holding 50% | 90% | 99% | share of the last token | share of the first token |\n"
            f"|---|---|---|---|---|\n"
            f"| {reach['50%']} | {reach['90%']} | {reach['99%']} | {summary['last_token_share']:.4f} | "
            f"{summary['first_token_share']:.4f} |\n\n![receptive field](receptive_field.png)\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory holding model.pt, e.g. runs/analyses/parity_check")
    parser.add_argument("--out", required=True, help="output directory, e.g. results/analyses/parity_check")
    parser.add_argument("--length", type=non_negative_int, default=0,
                        help="input length T (default: eval.max_length of a formal run, data.seq_len of an LM run)")
    parser.add_argument("--samples", type=positive_int, default=256, help="sequences averaged over (default 256)")
    parser.add_argument("--batch-size", type=positive_int, default=32, help="sequences per backward pass (default 32)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of the strings / window offsets (default 0)")
    parser.add_argument("--split", default="test", help="LM runs: data split to draw windows from (default test)")
    parser.add_argument("--data", default=None, help="LM runs: data folder instead of the run's data.path")
    parser.add_argument("--random-tokens", action="store_true",
                        help="LM runs: uniform random tokens instead of data windows (no data needed)")
    parser.add_argument("--depth-policy", choices=("adaptive", "train", "per_position"), default=None,
                        help="RegularGPT LM runs: score the same weights with this depth policy (default: the "
                             "model's own), e.g. --depth-policy train")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    overrides = {"depth_policy": args.depth_policy} if args.depth_policy else None
    cfg, model, _ = load_model_file(Path(args.run) / "model.pt", model_overrides=overrides)
    if isinstance(cfg, FormalConfig):
        length = args.length or cfg.eval.max_length
        tokens, targets = formal_batch(cfg, length, args.samples, args.seed)
        source = f"task {cfg.data.task}"
    else:
        length = args.length or cfg.data.seq_len
        tokens, targets = lm_batch(cfg, length, args.samples, args.seed, args.split, args.data, args.random_tokens)
        folder = args.data or (cfg.data.folders or [""])[0]  # a mixture: its first corpus unless --data
        source = "random tokens" if args.random_tokens else f"{folder} [{args.split}]"
    rf = receptive_field(model, tokens, targets, args.batch_size)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rf, out / "receptive_field.csv")
    name = f"{cfg.model.architecture} {cfg.model.head}" + (f" ({cfg.model.position})" if cfg.model.position != "none"
                                                          else "")
    if args.depth_policy:
        name += f" depth={args.depth_policy}"
    if cfg.model.window:  # a sliding window: the prediction reads at most n_layers·(W − 1) + 1 tokens
        name += f" window {cfg.model.window} (reach {cfg.model.n_layers * (cfg.model.window - 1) + 1})"
    plot_receptive_field(rf, out / "receptive_field.png", f"{name}, {source}")
    reach = {f"{int(m * 100)}%": rf.reach(m) for m in (0.5, 0.9, 0.99)}
    summary = {"model": name, "inputs": source, "length": length, "sequences": rf.sequences,
               "tokens_holding_mass": reach, "last_token_share": float(rf.normalised[-1]),
               "first_token_share": float(rf.normalised[0]),
               **provenance(shlex.join(["python", *sys.argv]))}
    atomic_write_text(out / "receptive_field.json", json.dumps(summary, indent=1) + "\n")
    atomic_write_text(out / "receptive_field.md", markdown(summary))
    print(f"{name}, {source}, T={length}: the last {reach['50%']} / {reach['90%']} / {reach['99%']} tokens hold "
          f"50/90/99% of the normalised gradient")
    print(f"wrote {out / 'receptive_field.png'}, {out / 'receptive_field.csv'}, {out / 'receptive_field.json'}")
    return 0


if __name__ == "__main__":
    run(main)
