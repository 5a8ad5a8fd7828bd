"""Formal-language length extrapolation: range evaluation, sweeps, and the Table 1 / Table 2 reports.

Subcommands (each resumable; rerun the same command to continue)::

    # accuracy at every length 1..500 (512 sequences each) of one trained run; prints the score over 41..500
    python eval/formal.py range --run runs/parity-c2 --out runs/parity-c2/range.jsonl
    python eval/formal.py range --run runs/parity-c2 --p-one 0.3 --lengths 1-40,41-500:20 --out /tmp/p03.jsonl

    # tasks x models x seeds x learning rates, trained and evaluated under a profile (configs/formal/profiles/)
    python eval/formal.py sweep --profile quick --out results/formal/runs
    python eval/formal.py sweep --profile paper --tasks parity_check --models regular_gpt_c2 --seeds 0 1 --lrs 3e-4

    # results/formal/table1_<profile>.md/.json and table2_<profile>.md/.json from the finished runs
    python eval/formal.py aggregate --runs results/formal/runs --profile quick

    # training seconds until the held-out score (41, 92, ..., 500) first reaches 0.99, per task and seed
    python eval/formal.py time-to-solve --profile cpu --threads 1 --out results/formal/time_to_solve_t1.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable from a checkout without `pip install -e .`

import torch  # noqa: E402

from regulargpt.checkpoint import load_model_file  # noqa: E402
from regulargpt.cli import run  # noqa: E402
from regulargpt.evaluation.formal import (  # noqa: E402
    RangeEvalError,
    check_lengths,
    parse_lengths,
    range_evaluate,
    range_score,
)
from regulargpt.evaluation.formal_sweep import load_profile, plan_runs, run_sweep  # noqa: E402
from regulargpt.evaluation.formal_tables import write_tables  # noqa: E402
from regulargpt.tasks import make_task  # noqa: E402
from regulargpt.train.formal import MODEL_FILE  # noqa: E402


def cmd_range(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    cfg, model, _ = load_model_file(Path(args.run) / MODEL_FILE)
    if cfg.model.head != "classifier" or not cfg.data.task:
        raise RangeEvalError(f"--run {args.run}: its {MODEL_FILE} is a language model (model.head={cfg.model.head!r}, "
                             f"data.task={cfg.data.task!r}), not a formal-language classifier; evaluate it with "
                             f"`python eval/extrapolate.py --runs {args.run} --out DIR`")
    options = dict(cfg.data.task_options)
    if args.p_one is not None:
        options["p_one"] = args.p_one
    task = make_task(cfg.data.task, **options)
    max_length = args.max_length or cfg.eval.max_length
    samples = args.samples or cfg.eval.samples_per_length
    lengths = parse_lengths(args.lengths, max_length)
    check_lengths(cfg.model, lengths, args.run)
    rows = range_evaluate(model, task, lengths, samples, args.out, progress=cfg.logging.progress)
    lo = cfg.eval.score_min_length
    scored = [t for t in rows if lo <= t <= max_length]
    print(f"score (mean accuracy over {len(scored)} evaluated lengths in {lo}..{max_length}, {samples} sequences "
          f"each): {range_score(rows, lo, max_length):.4f}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile, args.configs)
    specs = plan_runs(profile, args.out, configs_dir=args.configs, tasks=args.tasks, models=args.models,
                      seeds=args.seeds, lrs=args.lrs, sets=args.set)
    print(f"sweep {profile.name}: {len(specs)} runs under {args.out} ({args.workers} worker(s) x {args.threads} "
          f"thread(s))", flush=True)
    results = run_sweep(specs, workers=args.workers, threads=args.threads)
    failed = [r for r in results if r["error"]]
    print(f"done: {len(results) - len(failed)} runs finished now, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile, args.configs)
    specs = plan_runs(profile, args.runs, configs_dir=args.configs)
    paths = write_tables(args.runs, profile, args.out_dir, specs=specs,
                         command=["python", "eval/formal.py", *sys.argv[1:]])
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_time_to_solve(args: argparse.Namespace) -> int:
    """Train the profile's runs of one model with a SolveCheck (training unchanged) and tabulate the first step and
    training second at which the held-out score reached the threshold."""
    import shlex

    from regulargpt.files import atomic_write_text, read_jsonl
    from regulargpt.provenance import provenance
    from regulargpt.train.formal import SOLVE_FILE, SolveCheck, train_formal

    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, args.configs)
    runs = Path(args.runs) / f"threads{args.threads}"
    specs = plan_runs(profile, runs, configs_dir=args.configs, tasks=args.tasks, models=[args.model],
                      seeds=args.seeds)
    check = SolveCheck(every=args.every)
    lines = ["| task | seed | solved at step | training wall s | training CPU s | score at the end | steps |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for spec in specs:
        path = train_formal(spec.cfg, spec.run_dir, solve_check=check)
        meta = load_model_file(path)[2]
        checks = read_jsonl(spec.run_dir / SOLVE_FILE)
        cpu = meta.get("solved_cpu_seconds")  # None for runs trained before it was recorded
        solved = (f"{meta['solved_step']} | {meta['solved_seconds']:.1f} | " + ("—" if cpu is None else f"{cpu:.1f}")
                  if meta.get("solved_step") else "not solved | — | —")
        lines.append(f"| {spec.task_id} | {spec.seed} | {solved} | {checks[-1]['score']:.3f} | {spec.cfg.train.steps} |")
        print(lines[-1], flush=True)
    command = "python eval/formal.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    prov = provenance(command)
    head = [f"# Time to solve: {args.model}, profile `{profile.name}`, {args.threads} thread(s)", "",
            f"- Command: `{prov['command']}`", f"- Git commit: `{prov['commit']}`", f"- Machine: {prov['machine']}",
            f"- Date: {prov['date']}", "",
            f"Every {check.every} steps the held-out score (mean accuracy at lengths "
            f"{', '.join(map(str, check.lengths))}; {check.samples} fixed strings each) is measured without changing "
            f"training; *solved* = the first check at >= {check.threshold}. Training seconds (wall, and CPU of the "
            f"process: all its threads) exclude the checks; on a loaded machine wall > CPU / threads. "
            f"Runs in `{runs}` (resumable).", ""]
    if args.out:
        atomic_write_text(Path(args.out), "\n".join(head + lines) + "\n")
        print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("range", help="per-length accuracy of one run (JSONL), and its score")
    p.add_argument("--run", required=True, help="run directory holding model.pt, e.g. runs/parity-c2")
    p.add_argument("--out", required=True, help="JSONL file; lengths already in it are skipped, e.g. DIR/range.jsonl")
    p.add_argument("--max-length", type=int, default=0, help="longest length (0 = the run's eval.max_length, 500)")
    p.add_argument("--samples", type=int, default=0, help="sequences per length (0 = eval.samples_per_length, 512)")
    p.add_argument("--lengths", default="", help="length spec, e.g. 1-40,41-500:20 (default: every length)")
    p.add_argument("--p-one", type=float, default=None, help="parity_check: evaluate at this P(1), e.g. 0.3")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.set_defaults(func=cmd_range)

    p = sub.add_parser("sweep", help="train + range-evaluate tasks x models x seeds x lrs (skips finished runs)")
    p.add_argument("--profile", required=True, help="profile name (configs/formal/profiles/NAME.json) or path")
    p.add_argument("--out", default="results/formal/runs", help="runs folder (default results/formal/runs)")
    p.add_argument("--tasks", nargs="+", help="task configs, e.g. parity_check even_pairs (default: the profile's)")
    p.add_argument("--models", nargs="+", help="model presets, e.g. regular_gpt_c2 lstm (default: the profile's)")
    p.add_argument("--seeds", nargs="+", type=int, help="seeds, e.g. 0 1 2 (default: the profile's)")
    p.add_argument("--lrs", nargs="+", type=float, help="learning rates for every run, e.g. 1e-3 (default: profile)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run, e.g. --set train.log_every=50 (repeatable)")
    p.add_argument("--workers", type=int, default=1, help="parallel processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("aggregate", help="write results/formal/table{1,2}_<profile>.{md,json}")
    p.add_argument("--runs", default="results/formal/runs", help="runs folder of the sweep")
    p.add_argument("--profile", required=True, help="profile whose runs are tabulated, e.g. quick")
    p.add_argument("--out-dir", default="results/formal", help="where the tables go (default results/formal)")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("time-to-solve", help="training seconds until the held-out score first reaches 0.99")
    p.add_argument("--profile", default="cpu", help="profile giving each task's config (default cpu)")
    p.add_argument("--model", default="regular_gpt_c2", help="model preset (default regular_gpt_c2)")
    p.add_argument("--tasks", nargs="+", default=["parity_check", "even_pairs", "cycle_navigation"],
                   help="tasks (default parity_check even_pairs cycle_navigation)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds (default 0 1 2)")
    p.add_argument("--every", type=int, default=100, help="steps between held-out checks (default 100)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--runs", default="runs/time_to_solve", help="runs folder (default runs/time_to_solve)")
    p.add_argument("--out", help="markdown report, e.g. results/formal/time_to_solve_t1.md")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.set_defaults(func=cmd_time_to_solve)

    args = parser.parse_args(argv)
    for flag, low in (("every", 1), ("max_length", 0), ("samples", 0), ("threads", 1), ("workers", 1)):
        value = getattr(args, flag, low)  # not every subcommand has every flag
        if value < low:
            parser.error(f"--{flag.replace('_', '-')} {value}: expected an integer >= {low}")
    return args.func(args)


if __name__ == "__main__":
    run(main)
