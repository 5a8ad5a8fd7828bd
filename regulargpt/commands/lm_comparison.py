"""`python eval/lm_comparison.py` (console script `regulargpt-lm-comparison`): the CPU-scale length-extrapolation comparison: RegularGPT against ALiBi, T5, KERPLE-log/power, RoPE and NoPE.

Stages (each resumable; rerun the same command after an interruption):
  1. data: data_prep/prepare.py for every dataset (BPE vocab 2048, --max-bytes cap) into DATA_ROOT/<dataset>;
  2. parameter budget: every model of configs/tiny/ within ±10% of RegularGPT's count (checked, printed);
  3. training: launch/pretrain.py per (dataset, model, seed) into OUT/runs/<dataset>/<model>-seed<k>; runs with a
     model.pt are skipped; every run trains on the same number of tokens (steps × batch × 64);
  4. evaluation: eval/extrapolate.py per dataset (non-overlapping windows, 64 … 32×64, the same tokens at every
     length) into OUT/<dataset>/ (results.jsonl, table.md, ppl_vs_length.png, loss_vs_position.png);
  5. OUT/README.md: commands, git commit, machine, date, parameter counts, tokens, tables, and where RegularGPT
     wins or loses (every number read from the result files).

A staged study (--study v3) trains its stages in order, each stage's runs before the next's (the most informative
rows first; the README lists the stages and how far they got), then runs the studies it names (v3: the T = 256 pair,
--study v2-t256). --estimate prints each stage's CPU time estimated from v2's recorded timings and exits.

Examples:
    OMP_NUM_THREADS=1 nohup python eval/lm_comparison.py > results/lm_cpu/comparison.log 2>&1 &   # ~75 min, 1 core
    python eval/lm_comparison.py --demo                          # 1 seed, 4 models, up to 16x: a few minutes
    python eval/lm_comparison.py --report-only                   # rewrite OUT/README.md from the results
    python eval/lm_comparison.py --study v3 --estimate           # the v3 stages and their estimated CPU hours
    mkdir -p results/lm_cpu_v3 && OMP_NUM_THREADS=1 nohup python eval/lm_comparison.py --study v3 > results/lm_cpu_v3/study.log 2>&1 &
    OMP_NUM_THREADS=1 python eval/lm_comparison.py --study v3 --jobs 2   # two single-threaded trainings at a time
    python eval/lm_comparison.py --study v3 --slurm --dry-run   # SLURM: the arrays, scoring and report jobs
    python eval/lm_comparison.py --study v3 --slurm --array-throttle 8 --partition cpu   # queued (reruns: the rest)

With --slurm nothing trains here: each stage's missing trainings become one job array, each followed by a scoring
job (chained, afterany), and the README is the last job (regulargpt/experiments/lm_comparison/slurm.py).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import NoReturn

from regulargpt.cli import positive_float, positive_int, run
from regulargpt.folder_lock import hold_folder
from regulargpt.evaluation.lm_report import console_tables, load_rows
from regulargpt.experiments.lm_comparison import slurm
from regulargpt.experiments.lm_comparison import (
    DEMO,
    STUDIES,
    Plan,
    children_cpu,
    estimate_table,
    evaluate_all,
    parameter_counts,
    prepare_data,
    rel_path,
    train_all,
    write_readme,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", action="store_true", help="the small version: python-stdlib, 1 seed, RegularGPT + ALiBi "
                                                       "+ KERPLE-log + NoPE, 200 steps, up to 16× (out results/demo/lm)")
    p.add_argument("--study", choices=sorted(STUDIES), default="v1",
                   help="which study: v1 (results/lm_cpu, superseded), v2 (results/lm_cpu_v2: 1.2M tokens per run, "
                        "the RegularGPT knob ablation, depth policies), v2-t256 (results/lm_cpu_v2_t256: RegularGPT "
                        "C8 vs ALiBi trained at T = 256, evaluated to 8192) or v3 (results/lm_cpu_v3, staged: equal "
                        "compute, 0.4M/1.2M/3.6M training tokens, the windowed baseline; then v2-t256); default v1")
    p.add_argument("--estimate", action="store_true",
                   help="print the study's stages with CPU minutes estimated from v2's recorded timings, and exit")
    p.add_argument("--out", help="output folder (default: the study's, or results/demo/lm with --demo)")
    p.add_argument("--data-root", help="prepared datasets folder (default data/lm_cpu), e.g. --data-root "
                                       "/scratch/lm_cpu")
    p.add_argument("--steps", type=positive_int, help="training steps per run (default 300; demo 200), e.g. --steps 100")
    p.add_argument("--eval-tokens", type=positive_int, help="tokens scored per length (default 16384; demo 8192)")
    p.add_argument("--memory-gb", type=positive_float, default=4.0, help="evaluation memory budget (default 4)")
    p.add_argument("--report-only", action="store_true", help="only rewrite OUT/README.md from existing results")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="trainings at a time, started in stage order (default 1; 2 on a 2-core machine with "
                        "OMP_NUM_THREADS=1: each training is single-threaded, each is timed apart)")
    slurm.add_slurm_arguments(p)
    args = p.parse_args(argv)
    slurm.check_flags(args)
    first = DEMO if args.demo else STUDIES[args.study]
    if args.out:
        first.out = Path(args.out).resolve()
    plans = [first, *(STUDIES[name] for name in first.then)]  # a staged study's follow-ups keep their own out
    for plan in plans:
        if args.data_root:
            plan.data_root = Path(args.data_root).resolve()
        if args.steps:
            plan.steps = args.steps
        if args.eval_tokens:
            plan.eval_tokens = args.eval_tokens
    if args.estimate:
        print(estimate_table(plans))
        return 0
    if args.array_task is not None:  # one training of a stage's job array (launch/slurm/array.sbatch)
        return slurm.run_training_task(first, args.stage, args.array_task)
    if args.job == "prepare":  # the --slurm jobs' data preparation and scoring, for this plan only
        prepare_data(first)
        return 0
    if args.job == "evaluate":
        evaluate_all(first, args.memory_gb)
        return 0
    if args.slurm:
        return slurm.submit_study(plans, args)
    command = "python " + " ".join(shlex.quote(a) for a in [rel_path(Path(sys.argv[0])), *(argv or sys.argv[1:])])
    failed: list[str] = []
    for plan in plans:
        with hold_folder(plan.out, "study"):  # one study per folder (its trainings and scorings lock their own)
            failed += _run_plan(plan, command, args.memory_gb, args.report_only, args.jobs)
    return 1 if failed else 0


def _run_plan(plan: Plan, command: str, memory_gb: float, report_only: bool, jobs: int = 1) -> list[str]:
    """Every stage of one plan (data, budget, training with evaluation and the README after each run); → failures."""
    started, cpu_started = time.time(), children_cpu()
    print(f"comparison: {len(plan.trainings())} trainings of {plan.train_tokens:,} tokens (budget rows: their own), "
          f"lengths {plan.lengths}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"out {rel_path(plan.out)}", flush=True)
    counts = parameter_counts(plan)
    failed: list[str] = []
    if not report_only:
        prepare_data(plan)

        def evaluate_and_report() -> None:
            evaluate_all(plan, memory_gb)
            write_readme(plan, counts, command, [], started, cpu_started)

        failed = train_all(plan, evaluate_and_report, jobs)
        evaluate_all(plan, memory_gb)
    write_readme(plan, counts, command, failed, None if report_only else started, cpu_started)
    for dataset in plan.datasets:  # the tables README.md holds, on the console too
        path = plan.out / dataset / "results.jsonl"
        if path.is_file():
            print("\n" + console_tables(load_rows(path)), flush=True)
    return failed


def console() -> NoReturn:
    """The ``regulargpt-lm-comparison`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
