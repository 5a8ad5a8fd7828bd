"""Measured peak RSS per rank of short 2-rank CPU trainings at ZeRO 1, 2, 3 against the scale planner's estimate.

    python eval/bench_memory.py --data data/stdlib-8k --out results/scale_plan/measured_vs_estimate.md

Each run is ``torchrun --nproc_per_node N launch/pretrain.py --config CONFIG`` with the overrides below, every rank
started through this script (``--as-rank``), which records the kernel's peak RSS of its own process
(``getrusage(RUSAGE_SELF).ru_maxrss``, the same high-water mark as VmHWM): once just before the first checkpoint
is written (the *training peak*: model build, DeepSpeed init, the steps and the final validation) and once at exit
(also the checkpoint and, on rank 0, the model.pt export). CPU ranks have no separate device memory, so the RSS
holds the Python/torch/DeepSpeed runtime as well; that baseline is measured by a run of N ranks that import the
same modules and join the same gloo group but build nothing (``--baseline``). The estimate for the CPU case is

    baseline (measured) + model states + DeepSpeed buffers + activations (regulargpt.scale_plan, device "cpu")

and the report gives measured ÷ estimate per rank. ``REGULARGPT_PEAK_FLOPS`` is set for the runs so that no peak
FLOP/s measurement allocates matrices inside the measured processes (it only changes the logged MFU).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import runpy
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import non_negative_int, positive_int, run  # noqa: E402
from regulargpt.config import load_config  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402

MIB = 2**20
RUN_SETS = ["data.seq_len=512", "train.batch_size=2", "train.steps=3", "train.eval_batches=1", "train.log_every=1",
            "logging.wandb=false", "logging.progress=false"]


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _as_rank(out_dir: Path, baseline: bool, argv: list[str]) -> None:
    """Run one rank (pretraining, or the baseline that builds nothing) and write rank<R>.json with its peaks."""
    record: dict[str, int] = {}
    rank = os.environ.get("RANK", "0")

    def dump() -> None:
        record["exit_peak"] = _peak_rss()
        atomic_write_text(out_dir / f"rank{rank}.json", json.dumps(record) + "\n")

    atexit.register(dump)
    if baseline:
        from regulargpt.train.engine import prepare_process_env, skip_shm_build

        prepare_process_env()
        skip_shm_build()
        import deepspeed
        import torch.distributed as dist

        import regulargpt.train.loop  # noqa: F401  the modules a training rank imports
        from regulargpt.model import build_model  # noqa: F401

        deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        dist.barrier()
        record["train_peak"] = _peak_rss()
        return
    from regulargpt.train import loop

    original_save, original_step, original_build = loop._Trainer.save, loop._Trainer.train_step, loop.build_engine

    def save(self: object) -> None:
        record.setdefault("train_peak", _peak_rss())
        original_save(self)

    def train_step(self: object, *args: object) -> tuple[object, ...]:
        result = original_step(self, *args)
        record.setdefault("step1_peak", _peak_rss())
        return result

    def build_engine(*a: object, **k: object) -> object:
        record["before_engine_peak"] = _peak_rss()
        result = original_build(*a, **k)
        record["engine_peak"] = _peak_rss()
        return result

    loop._Trainer.save, loop._Trainer.train_step, loop.build_engine = save, train_step, build_engine
    sys.argv = [str(ROOT / "launch" / "pretrain.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")


def _launch(nproc: int, out_dir: Path, rank_args: list[str], log: Path) -> list[dict[str, int]]:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", WANDB_MODE="disabled",
               PYTHONPATH=str(ROOT), REGULARGPT_PEAK_FLOPS="1e12")
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", str(nproc),
           str(Path(__file__).resolve()), "--as-rank", str(out_dir), *rank_args]
    with log.open("w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"error: {shlex.join(cmd)} exited {proc.returncode}; see {log}")
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(nproc)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--as-rank"]:  # a rank started by _launch: --as-rank DIR [--baseline | pretrain.py arguments]
        _as_rank(Path(argv[1]), argv[2:] == ["--baseline"], argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/base.json", help="config to train, e.g. --config configs/base.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help=f"extra overrides after the defaults {' '.join(RUN_SETS)}, e.g. --set train.batch_size=1")
    p.add_argument("--data", help="prepared data folder with the config's vocabulary, e.g. --data data/stdlib-8k")
    p.add_argument("--stages", type=non_negative_int, nargs="+", default=[1, 2, 3], help="ZeRO stages, e.g. --stages 1 2 3")
    p.add_argument("--nproc", type=positive_int, default=2, help="ranks per run, e.g. --nproc 2")
    p.add_argument("--out", default="results/scale_plan/measured_vs_estimate.md", help="report (markdown + .json)")
    args = p.parse_args(argv)
    if not args.data:
        p.error("--data is required: a folder from data_prep/prepare.py with the config's vocabulary size")
    from regulargpt.scale_plan import estimate

    command = shlex.join(["python", "eval/bench_memory.py", *argv])
    sets = [*RUN_SETS, f"data.path={args.data}", *args.set]
    cfg = load_config(args.config, sets)
    work = Path(tempfile.mkdtemp(prefix="bench_memory-"))
    print(f"baseline: {args.nproc} ranks that build nothing", flush=True)
    baseline = _launch(args.nproc, work / "baseline", ["--baseline"], work / "baseline.log")
    rows = []
    for stage in args.stages:
        t0 = time.perf_counter()
        run_sets = [*sets, f"train.zero_stage={stage}"]
        pre = ["--config", args.config, "--run-dir", str(work / f"run-z{stage}")]
        for item in run_sets:
            pre += ["--set", item]
        peaks = _launch(args.nproc, work / f"z{stage}", pre, work / f"z{stage}.log")
        est = estimate(load_config(args.config, run_sets), args.nproc, stage, device="cpu")
        for rank, (peak, base) in enumerate(zip(peaks, baseline)):
            total = base["train_peak"] + est.total(cfg.train.activation_checkpointing)
            rows.append({"stage": stage, "rank": rank, "baseline": base["train_peak"], "weights": est.weights,
                         "grads": est.grads, "optimizer": est.optimizer, "buffers": est.buffers,
                         "activations": est.activations_ac if cfg.train.activation_checkpointing else est.activations,
                         "estimate": total, "train_peak": peak["train_peak"], "exit_peak": peak["exit_peak"],
                         "before_engine_peak": peak["before_engine_peak"], "engine_peak": peak["engine_peak"],
                         "step1_peak": peak["step1_peak"],
                         "ratio": peak["train_peak"] / total})
        print(f"ZeRO-{stage}: {time.perf_counter() - t0:.0f} s; " + ", ".join(
            f"rank {r['rank']} {r['train_peak'] / MIB:.0f} MiB (estimate {r['estimate'] / MIB:.0f})"
            for r in rows if r["stage"] == stage), flush=True)
    _write(Path(args.out), rows, provenance(command), args, sets)
    return 0


def _write(out: Path, rows: list[dict[str, float]], prov: dict[str, str], args: argparse.Namespace,
           sets: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out.with_suffix(".json"), json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    run_cmd = shlex.join(["torchrun", "--standalone", "--nproc_per_node", str(args.nproc), "launch/pretrain.py",
                          "--config", args.config, *[x for s in sets for x in ("--set", s)], "--set",
                          "train.zero_stage=S"])
    lines = [
        "# Measured peak RSS per rank vs the scale planner's estimate (CPU, 2 ranks)", "",
        f"- command: `{prov['command']}`", f"- commit: {prov['commit']}", f"- machine: {prov['machine']}",
        f"- date: {prov['date']}", f"- each run: `OMP_NUM_THREADS=1 {run_cmd}` (every rank started through "
        "`eval/bench_memory.py --as-rank`, which reads its own `getrusage` peak RSS)", "",
        "Estimate = measured runtime baseline (ranks that import torch + DeepSpeed + regulargpt and join the gloo "
        "group, building nothing) + model states + DeepSpeed buffers + activations, all from "
        "`regulargpt.scale_plan` for device \"cpu\". *Training peak* = peak RSS just before the first checkpoint "
        "(build, DeepSpeed init, the steps, the final validation); *exit peak* adds the checkpoint and, on rank 0, "
        "the model.pt export. Peak RSS so far at three earlier points: *built* (model built, before "
        "`deepspeed.initialize`), *engine* (after it), *step 1* (after the first optimizer step). MiB = 2^20 bytes.",
        "",
        "| ZeRO | rank | baseline | weights | grads | optimizer | buffers | activations | estimate | built | engine "
        "| step 1 | training peak | measured ÷ estimate | exit peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['rank']} | " + " | ".join(
            f"{r[k] / MIB:.0f}" for k in ("baseline", "weights", "grads", "optimizer", "buffers", "activations",
                                          "estimate", "before_engine_peak", "engine_peak", "step1_peak",
                                          "train_peak")) + f" | {r['ratio']:.3f} | "
            f"{r['exit_peak'] / MIB:.0f} |")
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
    lines += ["", f"Largest deviation: ZeRO-{worst['stage']} rank {worst['rank']}, measured ÷ estimate "
              f"{worst['ratio']:.3f} ({'within' if abs(worst['ratio'] - 1) <= 0.25 else 'outside'} the 25 % target).",
              ""]
    atomic_write_text(out, "\n".join(lines))


if __name__ == "__main__":
    run(main)
