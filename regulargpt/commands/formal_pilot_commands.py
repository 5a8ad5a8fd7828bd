"""The formal suite's budget commands: how long and at which learning rate to train (pilots), as subcommands of
``python eval/formal.py`` (regulargpt/commands/formal_suite.py registers them through :func:`add_pilot_parsers`).

    # training seconds until the held-out score (41, 92, ..., 500) first reaches 0.99, per task and seed
    python eval/formal.py time-to-solve --profile cpu --threads 1 --out results/formal/time_to_solve_t1.md

    # step counts from pilot runs: the step from which training batches stay >= 0.99, and 1.6x it
    python eval/formal.py pilot-steps --runs /tmp/pilot/tomita_3-s0 /tmp/pilot/dyck_2-s0

    # a task's learning rate from training-length validation: the lowest mean loss over its sweep runs
    python eval/formal.py choose-lr --runs runs/lr_even_pairs/even_pairs/regular_gpt_c2/seed*

    # one long run per seed, seeds in turn in slices of 1,000 steps; the report is rewritten after every slice
    python eval/formal.py long-run --task modular_arithmetic_5 --steps 100000 --hours 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from regulargpt.checkpoint import load_model_file
from regulargpt.cli import fraction, non_negative_float, non_negative_int, positive_float, positive_int
from regulargpt.config import ConfigError
from regulargpt.evaluation.formal_scoring import RangeEvalError
from regulargpt.experiments.formal_sweep import load_profile, plan_runs
from regulargpt.provenance import report_head
from regulargpt.run_directory.layout import CONFIG_FILE, METRICS_FILE, SOLVE_FILE


def cmd_time_to_solve(args: argparse.Namespace) -> int:
    """Train the profile's runs of one model with a SolveCheck (training unchanged) and tabulate the first step and
    training second at which the held-out score reached the threshold. With --out X.md the raw records (each run's
    check rows and solve step) go to X.json beside it; --records X.json rewrites the report from them alone."""
    import json
    import shlex

    from regulargpt.files import atomic_write_text, read_json_object, read_jsonl
    from regulargpt.provenance import provenance
    from regulargpt.train.formal_trainer import SolveCheck, train_formal

    if args.records:
        raw = read_json_object(Path(args.records), ConfigError, "pass the .json that `time-to-solve --out X.md` wrote")
        if not isinstance(raw.get("settings"), dict) or not isinstance(raw.get("records"), list):
            raise ConfigError(f"{args.records}: expected the keys 'settings' and 'records' of a time-to-solve record")
        settings, records = raw["settings"], raw["records"]
    else:
        torch.set_num_threads(args.threads)
        profile = load_profile(args.profile, args.configs)
        runs = Path(args.runs) / f"threads{args.threads}"
        check = SolveCheck(every=args.every)
        settings = {"model": args.model, "profile": profile.name, "threads": args.threads, "every": check.every,
                    "lengths": list(check.lengths), "samples": check.samples, "threshold": check.threshold,
                    "runs": str(runs)}
        records = []
        for spec in plan_runs(profile, runs, configs_dir=args.configs, tasks=args.tasks, models=[args.model],
                              seeds=args.seeds):
            meta = load_model_file(train_formal(spec.cfg, spec.run_dir, solve_check=check))[2]
            records.append({"task": spec.task_id, "seed": spec.seed, "steps": spec.cfg.train.steps,
                            "solved_step": meta.get("solved_step"), "solved_seconds": meta.get("solved_seconds"),
                            "solved_cpu_seconds": meta.get("solved_cpu_seconds"),  # None: trained before recorded
                            "checks": read_jsonl(spec.run_dir / SOLVE_FILE)})
            print(solve_table([records[-1]])[-1], flush=True)
    prov = provenance("python eval/formal.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    head = [*report_head(f"Time to solve: {settings['model']}, profile `{settings['profile']}`, "
                         f"{settings['threads']} thread(s)", prov),
            f"Every {settings['every']} steps the held-out score (mean accuracy at lengths "
            f"{', '.join(map(str, settings['lengths']))}; {settings['samples']} fixed strings each) is measured without "
            f"changing training; *solved* = the first check at >= {settings['threshold']}. Training seconds (wall, and "
            f"CPU of the process: all its threads) exclude the checks; on a loaded machine wall > CPU / threads. "
            f"Runs in `{settings['runs']}` (resumable).", ""]
    lines = solve_table(records)
    if args.out:
        if not args.records:
            raw_path = Path(args.out).with_suffix(".json")
            atomic_write_text(raw_path, json.dumps({"provenance": prov, "settings": settings, "records": records}) + "\n")
            lines += ["", f"Raw records: `{raw_path.name}` (regenerate: `python eval/formal.py time-to-solve --records "
                          f"{raw_path} --out {args.out}`)."]
        atomic_write_text(Path(args.out), "\n".join(head + lines) + "\n")
        print(f"wrote {args.out}")
    return 0


def solve_table(records: list[dict]) -> list[str]:
    """The time-to-solve table, one row per run record: solve step, training wall and CPU seconds, last check."""
    lines = ["| task | seed | solved at step | training wall s | training CPU s | score at the end | steps |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        cpu = r.get("solved_cpu_seconds")
        solved = (f"{r['solved_step']} | {r['solved_seconds']:.1f} | " + ("—" if cpu is None else f"{cpu:.1f}")
                  if r.get("solved_step") else "not solved | — | —")
        lines.append(f"| {r['task']} | {r['seed']} | {solved} | {r['checks'][-1]['score']:.3f} | {r['steps']} |")
    return lines


def cmd_long_run(args: argparse.Namespace) -> int:
    """Train the profile's TASK/MODEL run of every seed to --steps (the profile's recipe otherwise), in slices of
    --slice steps with the seeds in turn, so that every seed's curve grows together; a SolveCheck every --every steps
    records the held-out score without changing training. After every slice (and with --report-only) the report
    (markdown + PNG beside it) is rewritten from the runs' time_to_solve.jsonl."""
    import shlex
    import time

    from regulargpt.evaluation.formal_long_run import curve_table, plot_curves, standing_lines
    from regulargpt.provenance import provenance
    from regulargpt.files import atomic_write_text, read_jsonl
    from regulargpt.train.formal_trainer import SolveCheck, check_lengths_option, train_formal

    torch.set_num_threads(args.threads)
    profile = load_profile(args.profile, args.configs)
    specs = plan_runs(profile, args.runs, configs_dir=args.configs, tasks=[args.task], models=[args.model],
                      seeds=args.seeds, lrs=args.lrs, sets=[f"train.steps={args.steps}", f"train.save_every={args.slice}"])
    several = len({spec.lr for spec in specs}) > 1
    labels = {spec.name: f"seed {spec.seed}" + (f", lr {spec.lr:g}" if several else "") for spec in specs}
    check = SolveCheck(every=args.every, lengths=check_lengths_option(args.check_lengths, specs[0].cfg))
    data = specs[0].cfg.data
    lo, hi = min(check.lengths), max(check.lengths)
    fit = data.min_length <= lo and hi <= data.max_length  # a fit check (pilot), not a held-out one
    measure = f"fit (mean accuracy over the training lengths {lo}..{hi})" if fit else "held-out score"
    ylabel = f"accuracy over the training lengths ({lo}–{hi})" if fit else f"held-out accuracy (lengths {lo}–{hi})"
    command = "python eval/formal.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out = Path(args.out)

    def report() -> None:
        curves = {labels[spec.name]: read_jsonl(spec.run_dir / SOLVE_FILE) for spec in specs}
        cfg = specs[0].cfg
        rates = ", ".join(f"{lr:g}" for lr in dict.fromkeys(spec.lr for spec in specs))
        prov = provenance(command)
        title = f"{args.task}: long {args.model} runs"
        plot_curves(curves, out.with_suffix(".png"), title, ylabel)
        lines = [*report_head(title, prov),
                 f"Profile `{profile.name}`'s recipe for {args.task}/{args.model} (d_model {cfg.model.d_model}, "
                 f"Adam, constant lr {rates}, batch {cfg.train.batch_size}, one length per batch from "
                 f"{cfg.data.min_length}..{cfg.data.max_length}), trained to {args.steps:,} steps in slices of "
                 f"{args.slice:,} ({'seeds and rates' if several else 'seeds'} in turn; the slices equal one "
                 f"uninterrupted run). Every {check.every} steps "
                 f"the {'fit' if fit else 'held-out score'}: mean accuracy at lengths {', '.join(map(str, check.lengths))}, "
                 f"{check.samples} fixed strings each (chance depends on the task: 1/{cfg.model.num_classes} for "
                 f"balanced classes). Runs in `{args.runs}` (resumable: rerun the command).", "",
                 "## Where it stands", "", *standing_lines(curves, args.steps, measure), "",
                 f"## {'Fit' if fit else 'Held-out score'} against steps", "",
                 f"![curves]({out.with_suffix('.png').name})", "",
                 *curve_table(curves, args.every_row)]
        atomic_write_text(out, "\n".join(lines) + "\n")

    if args.report_only:
        report()
        print(f"wrote {out}")
        return 0
    deadline = time.monotonic() + args.hours * 3600 if args.hours else None
    stop = 0
    while stop < args.steps:
        stop = min(stop + args.slice, args.steps)
        for spec in specs:
            train_formal(spec.cfg, spec.run_dir, solve_check=check, stop_at=stop)
        report()
        print(f"step {stop:,}: wrote {out}", flush=True)
        if deadline is not None and time.monotonic() > deadline:
            print(f"--hours {args.hours:g} reached; rerun the same command to continue", flush=True)
            break
    return 0


def cmd_pilot_steps(args: argparse.Namespace) -> int:
    """Per pilot run: its task, steps trained, the stable step and the recommended step count; then per task (over
    its seeds): the count that lets the slowest seed fit (markdown on stdout; with --out also a file headed by the
    command, commit, machine and date)."""
    import shlex

    from regulargpt.evaluation.formal_pilots import check_rows, recommended_steps, stable_step, task_steps
    from regulargpt.files import atomic_write_text, read_json_object, read_jsonl
    from regulargpt.provenance import provenance

    lines = ["| pilot | task | steps trained | stable from step | recommended steps |", "|---|---|---:|---:|---:|"]
    dirs = [Path(r) for r in args.runs]
    names = [d.name for d in dirs]
    by_task: dict[str, list[tuple[int | None, int]]] = {}  # task -> (stable step, steps trained) per pilot
    for run_dir in dirs:
        label = run_dir.name if names.count(run_dir.name) == 1 else "/".join(run_dir.parts[-3:])
        rows = read_jsonl(run_dir / METRICS_FILE)
        if not rows:
            lines.append(f"| {label} | — | 0 | not started | — |")
            continue
        data = read_json_object(run_dir / CONFIG_FILE)["data"]
        task = data["task"] + "".join(f" {k}={v}" for k, v in sorted(data.get("task_options", {}).items()))
        if args.criterion == "check":
            source = run_dir / SOLVE_FILE
            fit = check_rows(read_jsonl(source), data.get("min_length", 1), data.get("max_length", 40), str(source))
            if not fit:
                raise RangeEvalError(f"{source}: missing or empty; train the pilot with --time-to-solve EVERY "
                                     f"--check-lengths {data.get('min_length', 1)}-{data.get('max_length', 40)}")
            rows = fit
        stable = stable_step(rows, args.threshold, forgive=args.forgive)
        advice = (f"{stable:,} | {recommended_steps(stable, args.factor):,}" if stable is not None
                  else "not stable | more than the pilot's steps")
        lines.append(f"| {label} | {task} | {rows[-1]['step']:,} | {advice} |")
        by_task.setdefault(task, []).append((stable, rows[-1]["step"]))
    lines += ["", "Per task (its pilots are its seeds): the count that lets the slowest stable seed fit; a seed that "
              "never fit gets at least its pilot's length (formal_pilots.task_steps).", "",
              "| task | pilots | stable | steps |", "|---|---:|---:|---|"]
    for task, pilots in by_task.items():
        steps = task_steps(pilots, args.factor)
        unstable = [n for s, n in pilots if s is None]
        verdict = (f"unknown: no pilot stable within {max(unstable):,} steps" if steps is None else f"{steps:,}" + (
            f" ({len(unstable)} of {len(pilots)} never fit in {max(unstable):,} steps)" if unstable else ""))
        lines.append(f"| {task} | {len(pilots)} | {len(pilots) - len(unstable)} | {verdict} |")
    print("\n".join(lines))
    if args.out:
        prov = provenance("python eval/formal.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        head = [*report_head("Step counts from pilot runs", prov),
                (f"*Stable from step*: the first logged step (every `log_every` steps, each batch one length from the "
                 f"training range) from which every logged training batch has accuracy >= {args.threshold}; "
                 if args.criterion == "batches" else
                 f"*Stable from step*: the first fit check (mean accuracy over every training length, "
                 f"`--time-to-solve --check-lengths 1-40`) from which every check is >= {args.threshold}; ") +
                (f"a dip of at most {args.forgive} consecutive values below it after that step is forgiven "
                 f"(`--forgive {args.forgive}`); " if args.forgive else "") +
                f"*recommended*: {args.factor:g} x that, rounded up to 100 "
                f"(regulargpt/evaluation/formal_pilots.py). Held-out lengths never choose a step count.", ""]
        atomic_write_text(Path(args.out), "\n".join(head + lines) + "\n")
        print(f"wrote {args.out}")
    return 0


def cmd_choose_lr(args: argparse.Namespace) -> int:
    """Per learning rate (over its seeds' runs of one task and model): the mean cross-entropy and accuracy over the
    training lengths (sweep runs: range.jsonl; pilots with --at-step: that step's fit check), and the rate with the
    lowest loss (formal_pilots.choose_lr)."""
    import shlex

    from regulargpt.evaluation.formal_pilots import choose_lr, lr_candidates
    from regulargpt.files import atomic_write_text
    from regulargpt.provenance import provenance

    (task, model), candidates = lr_candidates([Path(r) for r in args.runs], args.at_step)
    best = choose_lr(candidates)
    source = (f"the fit check at step {args.at_step:,} (64 strings per length)" if args.at_step else
              "the range evaluation of the kept model")
    lines = [f"Task {task}, model {model}: mean over the training lengths of the fixed evaluation strings' "
             f"cross-entropy (nats) and accuracy, per seed, from {source}; the rate with the lowest mean loss is "
             f"chosen.", "",
             "| lr | seeds | loss per seed | mean loss | fit per seed | chosen |", "|---:|---|---|---:|---|---|"]
    lines += [f"| {c.lr:g} | {', '.join(map(str, c.seeds))} | {', '.join(f'{x:.2e}' for x in c.losses)} | "
              f"{c.loss:.2e} | {', '.join(f'{x:.3f}' for x in c.fits)} | {'**yes**' if c is best else ''} |"
              for c in candidates]
    print("\n".join(lines))
    if args.out:
        prov = provenance("python eval/formal.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
        head = report_head("Learning rate from training-length validation", prov)
        atomic_write_text(Path(args.out), "\n".join(head + lines) + "\n")
        print(f"wrote {args.out}")
    return 0


def add_pilot_parsers(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register time-to-solve, pilot-steps, choose-lr and long-run on the formal suite's subparsers."""
    p = sub.add_parser("time-to-solve", help="training seconds until the held-out score first reaches 0.99")
    p.add_argument("--profile", default="cpu", help="profile giving each task's config (default cpu)")
    p.add_argument("--model", default="regular_gpt_c2", help="model preset (default regular_gpt_c2)")
    p.add_argument("--tasks", nargs="+", default=["parity_check", "even_pairs", "cycle_navigation"],
                   help="tasks (default parity_check even_pairs cycle_navigation)")
    p.add_argument("--seeds", nargs="+", type=non_negative_int, default=[0, 1, 2], help="seeds (default 0 1 2)")
    p.add_argument("--every", type=positive_int, default=100, help="steps between held-out checks (default 100)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--runs", default="runs/time_to_solve", help="runs folder (default runs/time_to_solve)")
    p.add_argument("--out", help="markdown report, e.g. results/formal/time_to_solve_t1.md (raw records: X.json)")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.add_argument("--records", help="rewrite the report from the raw records a previous --out X.md wrote to X.json "
                                     "(trains nothing), e.g. results/formal/time_to_solve_t1.json")
    p.set_defaults(func=cmd_time_to_solve)

    p = sub.add_parser("pilot-steps", help="step counts from pilot runs' training-batch accuracy")
    p.add_argument("--runs", nargs="+", required=True, help="pilot run directories (metrics.jsonl logged)")
    p.add_argument("--threshold", type=fraction, default=0.99, help="training-batch accuracy (default 0.99)")
    p.add_argument("--criterion", choices=("batches", "check"), default="batches",
                   help="batches: metrics.jsonl's logged training batches; check: time_to_solve.jsonl of a pilot "
                        "trained with --time-to-solve EVERY --check-lengths 1-40 (every training length each check)")
    p.add_argument("--factor", type=positive_float, default=1.6, help="margin over the stable step (default 1.6)")
    p.add_argument("--forgive", type=non_negative_int, default=0,
                   help="after the stable step, dips below the threshold of at most this many consecutive logged "
                        "values do not restart the count (default 0: none)")
    p.add_argument("--out", help="also write the table with its provenance, e.g. results/formal/pilot_steps.md")
    p.set_defaults(func=cmd_pilot_steps)

    p = sub.add_parser("choose-lr", help="a task's learning rate from its sweep runs' training-length loss")
    p.add_argument("--runs", nargs="+", required=True,
                   help="sweep run directories of one task and model at several lrs, e.g. RUNS/even_pairs/"
                        "regular_gpt_c2/seed*_lr*")
    p.add_argument("--at-step", type=positive_int,
                   help="read long-run pilots (OUT/<task>/<model>/seed*_lr*, --check-lengths 1-40) at this step's "
                        "fit check instead of sweep runs' range.jsonl")
    p.add_argument("--out", help="markdown report")
    p.set_defaults(func=cmd_choose_lr)

    p = sub.add_parser("long-run", help="one long run per seed, trained in slices; held-out score vs steps")
    p.add_argument("--task", default="modular_arithmetic_5", help="task config (default modular_arithmetic_5)")
    p.add_argument("--model", default="regular_gpt_c2", help="model preset (default regular_gpt_c2)")
    p.add_argument("--profile", default="cpu", help="profile giving the recipe (default cpu)")
    p.add_argument("--seeds", nargs="+", type=non_negative_int, default=[0, 1, 2], help="seeds (default 0 1 2)")
    p.add_argument("--lrs", nargs="+", type=positive_float,
                   help="learning rates, each a run per seed (default: the profile's); choose-lr --at-step reads "
                        "the pilots' training-length loss")
    p.add_argument("--steps", type=positive_int, default=100_000, help="target steps per seed (default 100000)")
    p.add_argument("--slice", type=positive_int, default=1000, help="steps per seed before the next seed's turn (default 1000)")
    p.add_argument("--every", type=positive_int, default=500, help="steps between held-out checks (default 500)")
    p.add_argument("--check-lengths", metavar="SPEC",
                   help="lengths of the checks instead of 41, 92, …, 500, e.g. 1-40: the fit on every training "
                        "length, for pilots (pilot-steps --criterion check reads the runs)")
    p.add_argument("--every-row", type=positive_int, default=1000, help="steps between report table rows (default 1000)")
    p.add_argument("--hours", type=non_negative_float, default=0.0, help="stop after the slice that passes this many hours "
                                                           "(default 0: run to --steps)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1)")
    p.add_argument("--runs", default="runs/formal_long", help="runs folder (default runs/formal_long)")
    p.add_argument("--out", default="results/formal/modular_arithmetic_5_long.md", help="markdown report (PNG beside)")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report from the runs so far")
    p.add_argument("--configs", default="configs/formal", help="task/model/profile config folder")
    p.set_defaults(func=cmd_long_run)
