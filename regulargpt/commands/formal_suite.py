"""Formal-language length extrapolation: range evaluation, sweeps, and the Table 1 / Table 2 reports.

Subcommands (each resumable; rerun the same command to continue)::

    # accuracy at every length 1..500 (512 sequences each) of one trained run; prints the score over 41..500
    python eval/formal.py range --run runs/parity-c2 --out runs/parity-c2/range.jsonl
    python eval/formal.py range --run runs/parity-c2 --p-one 0.3 --lengths 1-40,41-500:20 --out /tmp/p03.jsonl

    # RegularGPT runs' accuracy grouped by the adaptive depth each evaluated length needs (from range.jsonl)
    python eval/formal.py by-depth --runs runs/formal/modular_arithmetic_3/regular_gpt_c2/seed* --out by_depth.md

    # tasks x models x seeds x learning rates, trained and evaluated under a profile (configs/formal/profiles/)
    python eval/formal.py sweep --profile quick --out results/formal/runs
    python eval/formal.py sweep --profile paper --tasks parity_check --models regular_gpt_c2 --seeds 0 1 --lrs 3e-4

    # the same on SLURM: one job array over the unfinished runs (a GPU each), then the tables (--dry-run: the
    # scripts and sbatch commands only); rerun to queue what is still missing
    python eval/formal.py sweep --profile paper --out results/formal/runs --slurm --gpus-per-task 1 --dry-run

    # results/formal/table1_<profile>.md/.json and table2_<profile>.md/.json from the finished runs; runs whose
    # folders are not under --runs are carried from the run records of the table being replaced (--fresh: not)
    python eval/formal.py aggregate --runs results/formal/runs --profile quick

    # retrain one recorded run of results/formal/table1_<profile>.json and compare with its record (same code
    # commit: identical, or exit status 1; other code: the difference and both commits are printed)
    python eval/formal.py reproduce --task dyck_3 --model regular_gpt_c2 --seed 0

    # training seconds until the held-out score (41, 92, ..., 500) first reaches 0.99, per task and seed
    python eval/formal.py time-to-solve --profile cpu --threads 1 --out results/formal/time_to_solve_t1.md

    # step counts from pilot runs: the step from which training batches stay >= 0.99, and 1.6x it
    python eval/formal.py pilot-steps --runs /tmp/pilot/tomita_3-s0 /tmp/pilot/dyck_2-s0

    # a task's learning rate from training-length validation: sweep the candidates, then the lowest mean loss
    python eval/formal.py sweep --profile cpu --tasks even_pairs --models regular_gpt_c2 --lrs 3e-4 1e-3 3e-3 \\
        --out runs/lr_even_pairs
    python eval/formal.py choose-lr --runs runs/lr_even_pairs/even_pairs/regular_gpt_c2/seed*

    # one long run per seed (Modular Arithmetic: the authors trained 1M steps), seeds in turn in slices of 1,000
    # steps, the held-out score every 500; the report is rewritten after every slice; stop any time, rerun to go on
    python eval/formal.py long-run --task modular_arithmetic_5 --steps 100000 --hours 1 \\
        --out results/formal/modular_arithmetic_5_long.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

import torch

from regulargpt.checkpoint import load_model_file
from regulargpt.commands.formal_pilot_commands import add_pilot_parsers
from regulargpt.cli import fraction, non_negative_int, positive_float, positive_int, run
from regulargpt.config import ConfigError, FormalConfig
from regulargpt.evaluation.formal_scoring import (
    RangeEvalError,
    check_lengths,
    parse_lengths,
    range_evaluate,
    range_score,
)
from regulargpt.experiments import formal_slurm
from regulargpt.folder_lock import hold_folder
from regulargpt.experiments.formal_cost import GPU_STEP_FACTOR
from regulargpt.experiments.formal_sweep import load_profile, plan_runs, run_sweep
from regulargpt.experiments.formal_tables import write_tables
from regulargpt.run_directory.layout import MODEL_FILE
from regulargpt.tasks import make_task


def cmd_range(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    cfg, model, _ = load_model_file(Path(args.run) / MODEL_FILE)
    if not isinstance(cfg, FormalConfig):
        raise RangeEvalError(f"--run {args.run}: its {MODEL_FILE} is a language model (model.head={cfg.model.head!r}), "
                             f"not a formal-language classifier; evaluate it with "
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


def cmd_by_depth(args: argparse.Namespace) -> int:
    import json
    import shlex

    from regulargpt.evaluation.formal_by_depth import (
        by_depth_markdown,
        depth_record,
        profile_from_record,
        read_depth_records,
    )
    from regulargpt.files import atomic_write_text
    from regulargpt.provenance import provenance, report_head

    records = read_depth_records(args.records) if args.records else [depth_record(run) for run in args.runs]
    lines = by_depth_markdown([profile_from_record(r) for r in records], args.threshold)
    print("\n".join(lines))
    if args.out:
        prov = provenance("python eval/formal.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        raw = Path(args.out).with_suffix(".json")
        if not args.records:  # the raw records beside the report: `--records` regenerates it from them
            atomic_write_text(raw, json.dumps({"provenance": prov, "records": records}) + "\n")
            lines += ["", f"Raw records: `{raw.name}` (regenerate: `python eval/formal.py by-depth --records {raw} "
                          f"--title {shlex.quote(args.title)} --out {args.out}`)."]
        atomic_write_text(Path(args.out), "\n".join(report_head(args.title, prov) + lines) + "\n")
        print(f"wrote {args.out}")
    return 0


def _table_json(flag: str, given: str | None, default: Path) -> Path | None:
    """The table JSON a flag names (an error if it does not exist), else `default` if it exists, else None."""
    if given is not None:
        if not Path(given).is_file():
            raise ConfigError(f"{flag} {given}: no such table JSON")
        return Path(given)
    return default if default.is_file() else None


def cmd_sweep(args: argparse.Namespace) -> int:
    if args.dry_run and not args.slurm:
        raise ConfigError("--dry-run: only with --slurm (a local sweep has nothing to submit; --list shows its runs)")
    if args.array_task is not None:  # one task of a job array (launch/slurm/array.sbatch passes --array-task)
        return formal_slurm.run_array_task(args, load_profile(args.profile, args.configs))
    if args.list or args.slurm:  # nothing trained here: no lock
        return _sweep(args)
    with hold_folder(args.out, "formal sweep"):  # one local sweep per --out (its runs are trained by its workers)
        return _sweep(args)


def _sweep(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile, args.configs)
    specs = plan_runs(profile, args.out, configs_dir=args.configs, tasks=args.tasks, models=args.models,
                      seeds=args.seeds, lrs=args.lrs, sets=args.set)
    recorded = None if args.retrain_recorded else _table_json(
        "--recorded", args.recorded, Path("results/formal") / f"table1_{profile.name}.json")
    if recorded is not None:
        from regulargpt.experiments.formal_records import PLANNED, SAME_MODEL, read_records, standing

        records = {r.name: r for r in read_records(recorded)}
        skipped = [s for s in specs if s.name in records and not s.run_dir.exists()
                   and standing(records[s.name], s) in (PLANNED, SAME_MODEL)]
        specs = [s for s in specs if all(s is not x for x in skipped)]
        if skipped:
            print(f"sweep {profile.name}: {len(skipped)} runs already recorded in {recorded} with the recipe the "
                  f"profile plans (or kept by the last-model rule with fit 1.000: the same model) are not trained "
                  f"again (--retrain-recorded to train them)", flush=True)
    if args.list:  # what this sweep would train (finished run folders under --out included), per task; nothing runs
        from collections import Counter

        per_task = Counter(s.task_id for s in specs)
        print(f"sweep {profile.name}: {len(specs)} runs to train or finish under {args.out}: "
              + ", ".join(f"{task} {n}" for task, n in per_task.items()))
        print("\n".join(s.name for s in specs))
        from regulargpt.experiments.formal_cost import estimate_lines, gpu_estimate_lines, measured_rates
        from regulargpt.experiments.formal_records import read_records

        cpu_rates = measured_rates(args.out, read_records(recorded) if recorded else [])
        print("\n".join(estimate_lines(specs, cpu_rates)))
        print("\n".join(gpu_estimate_lines(specs, cpu_rates, measured_rates(args.out, device="cuda"),
                                            args.gpu_step_factor)))
        return 0
    if args.slurm:
        return formal_slurm.submit_sweep(args, profile.name, specs)
    print(f"sweep {profile.name}: {len(specs)} runs under {args.out} ({args.workers} worker(s) x {args.threads} "
          f"thread(s), {args.device})", flush=True)
    results = run_sweep(specs, workers=args.workers, threads=args.threads, device=args.device)
    failed = [r for r in results if r["error"]]
    print(f"done: {len(results) - len(failed)} runs finished now, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    if not Path(args.runs).is_dir():  # a typo must not rewrite the committed tables from the kept records alone
        raise ConfigError(f"--runs {args.runs}: no such folder; pass the runs folder of a sweep (`python "
                          f"eval/formal.py sweep --profile {args.profile} --out {args.runs}` makes it)")
    profile = load_profile(args.profile, args.configs)
    specs = plan_runs(profile, args.runs, configs_dir=args.configs, sets=args.set)
    keep = None if args.fresh else _table_json("--keep", args.keep, Path(args.out_dir) / f"table1_{profile.name}.json")
    paths = write_tables(args.runs, profile, args.out_dir, specs=specs, keep=keep,
                         command=["python", "eval/formal.py", *sys.argv[1:]])
    print("\n".join(str(p) for p in paths))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Retrain one recorded run from its record and compare (formal_reproduce): 0 when identical or when the code
    differs from the record's (the difference printed), 1 when the same code gives other numbers."""
    import shutil
    import tempfile

    from regulargpt.experiments.formal_reproduce import find_record, plan_reproduction, reproduce

    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, args.configs)
    table = _table_json("--table", args.table, Path("results/formal") / f"table1_{profile.name}.json")
    if table is None:
        raise ConfigError(f"results/formal/table1_{profile.name}.json: no such table JSON; pass --table PATH")
    record = find_record(table, args.task, args.model, args.seed, args.lr)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="reproduce-"))
    try:
        spec = plan_reproduction(profile, record, out, args.configs)
        print(f"retraining {record.name} from {table} into {spec.run_dir} ({args.threads} thread(s))", flush=True)
        result = reproduce(spec, record)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    print("\n".join(result.report()))
    return 1 if result.differences and result.same_code else 0



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("range", help="per-length accuracy of one run (JSONL), and its score")
    p.add_argument("--run", required=True, help="run directory holding model.pt, e.g. runs/parity-c2")
    p.add_argument("--out", required=True, help="JSONL file; lengths already in it are skipped, e.g. DIR/range.jsonl")
    p.add_argument("--max-length", type=non_negative_int, default=0, help="longest length (0 = the run's eval.max_length, 500)")
    p.add_argument("--samples", type=non_negative_int, default=0, help="sequences per length (0 = eval.samples_per_length, 512)")
    p.add_argument("--lengths", default="", help="length spec, e.g. 1-40,41-500:20 (default: every length)")
    p.add_argument("--p-one", type=fraction, default=None, help="parity_check: evaluate at this P(1), e.g. 0.3")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    p.set_defaults(func=cmd_range)

    p = sub.add_parser("by-depth", help="RegularGPT runs' accuracy grouped by the depth each evaluated length needs")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--runs", nargs="+", help="run folders with config.resolved.json and range.jsonl, "
                                                  "e.g. RUNS/modular_arithmetic_3/regular_gpt_c2/seed*")
    source.add_argument("--records", help="the raw records a previous --out X.md wrote to X.json: rewrite the "
                                          "report from them, e.g. results/formal/by_depth_cpu.json")
    p.add_argument("--threshold", type=fraction, default=0.99, help="accuracy of a depth that holds (default 0.99)")
    p.add_argument("--out", help="also write the tables with their provenance, e.g. results/formal/by_depth_cpu.md")
    p.add_argument("--title", default="Accuracy by adaptive depth", help="the report's title")
    p.set_defaults(func=cmd_by_depth)

    p = sub.add_parser("sweep", help="train + range-evaluate tasks x models x seeds x lrs (skips finished runs)")
    p.add_argument("--profile", required=True, help="profile name (configs/formal/profiles/NAME.json) or path")
    p.add_argument("--out", default="results/formal/runs", help="runs folder (default results/formal/runs)")
    p.add_argument("--tasks", nargs="+", help="task configs, e.g. parity_check even_pairs (default: the profile's)")
    p.add_argument("--models", nargs="+", help="model presets, e.g. regular_gpt_c2 lstm (default: the profile's)")
    p.add_argument("--seeds", nargs="+", type=non_negative_int, help="seeds, e.g. 0 1 2 (default: the profile's)")
    p.add_argument("--lrs", nargs="+", type=positive_float, help="learning rates for every run, e.g. 1e-3 (default: profile)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="config override for every run, e.g. --set train.log_every=50 (repeatable)")
    p.add_argument("--workers", type=positive_int, default=1, help="parallel processes (default 1)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per process (default 1)")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.add_argument("--recorded", help="table1 JSON whose run records count as finished runs (default: "
                                      "results/formal/table1_<profile>.json if it exists)")
    p.add_argument("--retrain-recorded", action="store_true", help="train recorded runs again too")
    p.add_argument("--list", action="store_true", help="print the runs the sweep would train (not yet recorded) and "
                                                       "their estimated CPU- and GPU-hours, and stop; nothing is "
                                                       "trained")
    p.add_argument("--gpu-step-factor", type=positive_float, default=GPU_STEP_FACTOR,
                   help=f"--list: GPU s/step = CPU s/step x this where no GPU run measured it (default "
                        f"{GPU_STEP_FACTOR:g}, an assumption: regulargpt/experiments/formal_cost.py)")
    p.add_argument("--device", default="cpu", help="where the runs train and are evaluated: cpu, cuda, cuda:1 "
                                                   "(default cpu; --slurm: cuda with --gpus-per-task)")
    formal_slurm.add_slurm_arguments(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("aggregate", help="write results/formal/table{1,2}_<profile>.{md,json}")
    p.add_argument("--runs", default="results/formal/runs", help="runs folder of the sweep")
    p.add_argument("--profile", required=True, help="profile whose runs are tabulated, e.g. quick")
    p.add_argument("--out-dir", default="results/formal", help="where the tables go (default results/formal)")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.add_argument("--keep", help="table1 JSON whose run records are carried for runs not under --runs, while the "
                                  "profile plans their recipe (default: OUT_DIR/table1_<profile>.json if it exists)")
    p.add_argument("--fresh", action="store_true", help="carry nothing: tabulate only the runs under --runs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="the config overrides the sweep ran with (repeatable), so its runs count as planned")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("reproduce", help="retrain one recorded run from its run record and compare the scores")
    p.add_argument("--task", required=True, help="task config of the record, e.g. dyck_3")
    p.add_argument("--model", required=True, help="model preset of the record, e.g. regular_gpt_c2")
    p.add_argument("--seed", required=True, type=non_negative_int, help="seed of the record, e.g. 0")
    p.add_argument("--lr", type=positive_float, help="learning rate (only when the table records several)")
    p.add_argument("--profile", default="cpu", help="profile whose table holds the record (default cpu)")
    p.add_argument("--table", help="table1 JSON holding the record (default results/formal/table1_<profile>.json)")
    p.add_argument("--out", help="keep the retrained run under this folder (default: a temporary one, removed)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as the sweep)")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.set_defaults(func=cmd_reproduce)

    add_pilot_parsers(sub)

    args = parser.parse_args(argv)
    return args.func(args)


def console() -> NoReturn:
    """The ``regulargpt-formal`` console script: :func:`main` under :func:`regulargpt.cli.run`."""
    run(main)
