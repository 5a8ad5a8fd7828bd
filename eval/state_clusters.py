"""Cluster RegularGPT's per-depth-step hidden states on long inputs (paper §7.3, Figure 3).

Examples::

    # a RegularGPT classifier trained on parity_check or cycle_navigation (its task is read from the run's config)
    python eval/state_clusters.py --run runs/analyses/parity_check --out results/analyses/parity_check
    python eval/state_clusters.py --run runs/analyses/cycle_navigation --length 500 --samples 256 --k-max 8 \\
        --out results/analyses/cycle_navigation

Writes OUT/clusters.png (one 2-D PCA panel per depth step plus all steps pooled, coloured by the true transition
of each state's span), OUT/clusters.json (per step: k* chosen by silhouette over k = 2..k_max, silhouettes,
purity, inverse purity, ...; and the provenance) and OUT/clusters.md. See docs/ANALYSES.md.
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
from regulargpt.evaluation.probes import SPAN_TRANSITIONS  # noqa: E402
from regulargpt.evaluation.state_clusters import cluster_depth_steps, plot_steps  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.model import RegularGPTClassifier  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402
from regulargpt.tasks import make_task  # noqa: E402


def markdown(rows: list[dict], header: dict[str, str | int]) -> str:
    lines = [f"# State clusters: {header['task']} (T={header['length']}, {header['samples']} sequences)", "",
             f"- command: `{header['command']}`", f"- git commit: {header['commit']}",
             f"- machine: {header['machine']}", f"- date: {header['date']}", "",
             ("| step | states/seq | span (tokens) | points | distinct states | true transitions | k* | "
              "silhouette(k*) | purity | inverse purity | silhouette of true labels |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = "all" if r["step"] < 0 else str(r["step"])
        span = str(r["span_min"]) if r["span_min"] == r["span_max"] else f"{r['span_min']}–{r['span_max']}"
        lines.append(f"| {step} | {r['kept_positions']} | {span} | {r['points']} | {r['distinct_states']} | "
                     f"{r['labels_present']} | {r['k_best']} | {r['silhouettes'][r['k_best']]:.3f} | "
                     f"{r['purity']:.3f} | {r['inverse_purity']:.3f} | {r['label_silhouette']:.3f} |")
    lines += ["", "![state clusters](clusters.png)"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="run directory holding model.pt, e.g. runs/analyses/parity_check")
    parser.add_argument("--out", required=True, help="output directory, e.g. results/analyses/parity_check")
    parser.add_argument("--length", type=positive_int, default=500, help="input length T (default 500, the paper's)")
    parser.add_argument("--samples", type=positive_int, default=256, help="input strings (default 256)")
    parser.add_argument("--k-max", type=positive_int, default=8, help="k-means tries k = 2..K_MAX (default 8)")
    parser.add_argument("--max-points", type=positive_int, default=20000,
                        help="states clustered per depth step, sampled with the seed (default 20000)")
    parser.add_argument("--seed", type=non_negative_int, default=0, help="seed of the inputs, subsampling and k-means (default 0)")
    parser.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    cfg, model, _ = load_model_file(Path(args.run) / "model.pt")
    task_name = cfg.data.task if isinstance(cfg, FormalConfig) else ""
    if not isinstance(model, RegularGPTClassifier) or task_name not in SPAN_TRANSITIONS:
        print(f"error: need a RegularGPT classifier on one of {', '.join(SPAN_TRANSITIONS)}; "
              f"{args.run} is {type(model).__name__} on {task_name or 'no task'!r}", file=sys.stderr)
        return 2
    task = make_task(task_name, **cfg.data.task_options)
    tokens, _ = task.sample(args.samples, args.length, torch.Generator().manual_seed(args.seed))
    results = cluster_depth_steps(model, task_name, tokens, k_max=args.k_max, seed=args.seed,
                                  max_points=args.max_points)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    header = {"task": task_name, "length": args.length, "samples": args.samples,
              "chunk_size": cfg.model.chunk_size, "thickness": cfg.model.thickness,
              **provenance(shlex.join(["python", *sys.argv]))}
    rows = [summary.row() for summary, _, _ in results]
    atomic_write_text(out / "clusters.json", json.dumps({**header, "steps": rows}, indent=1) + "\n")
    atomic_write_text(out / "clusters.md", markdown(rows, header))
    plot_steps(results, out / "clusters.png",
               f"{task_name}: RegularGPT C={cfg.model.chunk_size} K={cfg.model.thickness} states at T={args.length}")
    for r in rows:
        step = "all" if r["step"] < 0 else r["step"]
        print(f"step {step}: k*={r['k_best']} purity={r['purity']:.3f} inverse={r['inverse_purity']:.3f} "
              f"({r['labels_present']} true transitions)")
    print(f"wrote {out / 'clusters.png'}, {out / 'clusters.json'}, {out / 'clusters.md'}")
    return 0


if __name__ == "__main__":
    run(main)
