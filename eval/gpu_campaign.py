"""The Python steps of eval/gpu_campaign.sh: the study plan, the corpus summary, the study's throughput table and the
campaign README (docs/GPU_CHECK.md).

    python eval/gpu_campaign.py plan --plan configs/campaign/plan.json --configs configs/campaign --out W/plan.json
    python eval/gpu_campaign.py corpus W/data --out W/corpus.md
    python eval/gpu_campaign.py throughput W/study --plan W/plan.json --out W/study.md
    python eval/gpu_campaign.py report --from DIR --out results/gpu/2026-12-06-campaign/README.md

`plan` fixes the step count before the first step, from the rates of the plan's record folder
(regulargpt/experiments/gpu_campaign/plan.py has the formula); `--steps N` fixes it instead (the CPU rehearsal).
It writes OUT (JSON, read by the script) and OUT with .md (the table), and prints the table.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from regulargpt.config import ConfigError, load_config  # noqa: E402
from regulargpt.experiments.gpu_campaign import plan as planning  # noqa: E402
from regulargpt.experiments.gpu_campaign import report  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402


def _write(out: Path, title: str, lines: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join([f"# {title}", "", f"`{' '.join(sys.argv)}`", "", *lines, ""])
    atomic_write_text(out, text)
    print(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("plan", help="fix the study's step count and per-run caps")
    s.add_argument("--plan", type=Path, default=Path("configs/campaign/plan.json"))
    s.add_argument("--configs", type=Path, default=Path("configs/campaign"), help="folder of <model>.json")
    s.add_argument("--set", action="append", default=[], help="--set key=value for every model, e.g. "
                                                              "--set model.d_model=32")
    s.add_argument("--steps", type=int, default=None, help="fix the step count (CPU rehearsal), e.g. --steps 20")
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("corpus", help="splits of a prepared python-packages folder")
    s.add_argument("data", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("throughput", help="what each model of the study trained")
    s.add_argument("study", type=Path, help="folder of <model>.jsonl metrics")
    s.add_argument("--plan", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("report", help="the campaign README from an unpacked campaign folder")
    s.add_argument("--from", dest="folder", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        if args.command == "plan":
            cfg = planning.load_plan_config(args.plan)
            configs = {}
            for name in cfg.models:
                path = args.configs / f"{name}.json"
                if not path.is_file():
                    raise ConfigError(f"{args.plan}: model {name!r} has no config {path}")
                configs[name] = load_config(path, args.set)
            plan = planning.plan_study(cfg, configs, planning.recorded_rates(cfg.record), args.steps)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out, plan.to_json())
            _write(args.out.with_suffix(".md"), "Study plan", plan.markdown())
        elif args.command == "corpus":
            _write(args.out, "Corpus", report.corpus_summary(args.data))
        elif args.command == "throughput":
            import json

            plan = json.loads(args.plan.read_text())
            _write(args.out, "Study throughput", report.study_table(report.study_rows(args.study, plan),
                                                                    plan["steps"]))
        else:
            text = report.write_readme(args.folder, args.out, " ".join(["python", *sys.argv]))
            print(text)
    except (ConfigError, FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
