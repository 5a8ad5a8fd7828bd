"""The CPU-scale length-extrapolation comparison: RegularGPT against ALiBi, T5, KERPLE-log/power, RoPE and NoPE.

Stages (each resumable; rerun the same command after an interruption):
  1. data: data_prep/prepare.py for every dataset (BPE vocab 2048, --max-bytes cap) into DATA_ROOT/<dataset>;
  2. parameter budget: every model of configs/tiny/ within ±10% of RegularGPT's count (checked, printed);
  3. training: launch/pretrain.py per (dataset, model, seed) into OUT/runs/<dataset>/<model>-seed<k>; runs with a
     model.pt are skipped; every run trains on the same number of tokens (steps × batch × 64);
  4. evaluation: eval/extrapolate.py per dataset (non-overlapping windows, 64 … 32×64, the same tokens at every
     length) into OUT/<dataset>/ (results.jsonl, table.md, ppl_vs_length.png, loss_vs_position.png);
  5. OUT/README.md: commands, git commit, machine, date, parameter counts, tokens, tables, and where RegularGPT
     wins or loses (every number read from the result files).

Examples:
    OMP_NUM_THREADS=1 nohup python eval/lm_comparison.py > results/lm_cpu/comparison.log 2>&1 &   # ~75 min, 1 core
    python eval/lm_comparison.py --demo                          # 1 seed, 4 models, up to 16x: a few minutes
    python eval/lm_comparison.py --report-only                   # rewrite OUT/README.md from the results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import positive_float, positive_int
from regulargpt.evaluation.lm_report import (
    aggregate,
    load_rows,
    markdown_table,
    provenance,
)
from regulargpt.evaluation.perplexity import model_label
from regulargpt.files import atomic_write_text

MODELS = ("regular_gpt", "alibi", "t5", "kerple_log", "kerple_power", "rope", "nope")  # configs/tiny/<name>.json
DATASETS = ("python-stdlib", "debian-prose", "debian-code", "debian-latex")
VOCAB = 2048


@dataclass(frozen=True)
class Variant:
    """One trained row of a study: configs/tiny/<config>.json with `sets` overrides, run as OUT/runs/<dataset>/
    <name>-seed<k>. `depth_policies`: extra evaluation-time depth policies its weights are also scored with;
    `datasets`: where it is trained (empty = every dataset of the plan); `seeds`: which of the plan's seeds it is
    trained with (empty = all of them), e.g. an ablation row with seeds=(0,) beside 3-seed headline rows."""

    name: str
    config: str
    sets: tuple[str, ...] = ()
    depth_policies: tuple[str, ...] = ()
    datasets: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()


@dataclass
class Plan:
    """What one invocation runs. FULL is the first comparison, V2 the committed study, DEMO the `make demo` version."""

    out: Path
    datasets: tuple[str, ...]
    models: tuple[Variant, ...]
    seeds: dict[str, tuple[int, ...]]
    steps: int
    batch_size: int
    multiples: int  # evaluate lengths train_length · 2^i up to train_length · multiples
    eval_tokens: int
    max_bytes: int = 4_000_000
    data_root: Path = field(default_factory=lambda: ROOT / "data" / "lm_cpu")
    sliding_check: tuple[str, ...] = ()  # variants also scored with the sliding protocol (stride 32), seed 0
    sliding_lengths: tuple[int, ...] = (64, 256, 1024)
    train_length: int = 64  # data.seq_len of every training run
    superseded_by: str = ""  # a later study that replaces this one (said at the top of its README)

    @property
    def lengths(self) -> list[int]:
        return [self.train_length << i for i in range(self.multiples.bit_length()) if 1 << i <= self.multiples]

    @property
    def train_tokens(self) -> int:
        return self.steps * self.batch_size * self.train_length

    @property
    def is_ablation(self) -> bool:
        """A study with RegularGPT variants scored under several depth policies (v2)."""
        return any(m.depth_policies for m in self.models)

    def trainings(self) -> list[tuple[str, Variant, int]]:
        """(dataset, variant, seed), seed-major within each dataset so that every row gets its first seed first."""
        return [(d, m, s) for d in self.datasets for s in self.seeds[d] for m in self.models
                if (not m.datasets or d in m.datasets) and (not m.seeds or s in m.seeds)]

    def seed_summary(self) -> str:
        """Which rows get which seeds, e.g. 'python-stdlib: regular_gpt, alibi 3 seeds; rg_pad_mask 1 seed'."""
        parts = []
        for d in self.datasets:
            counts: dict[int, list[str]] = {}
            for m in self.models:
                n = len({s for dd, mm, s in self.trainings() if dd == d and mm is m})
                if n:
                    counts.setdefault(n, []).append(m.name)
            parts.append(f"{d}: " + "; ".join(f"{', '.join(names)} {n} seed{'s' if n > 1 else ''}"
                                             for n, names in sorted(counts.items(), reverse=True)))
        return " · ".join(parts)

    def run_dir(self, dataset: str, model: Variant, seed: int) -> Path:
        return self.out / "runs" / dataset / f"{model.name}-seed{seed}"


def _plain(*names: str) -> tuple[Variant, ...]:
    return tuple(Variant(n, n) for n in names)


FULL = Plan(out=ROOT / "results" / "lm_cpu", datasets=DATASETS, models=_plain(*MODELS),
            seeds={"python-stdlib": (0, 1, 2), **{d: (0,) for d in DATASETS[1:]}},
            steps=300, batch_size=16, multiples=32, eval_tokens=16384,
            superseded_by="results/lm_cpu_v2/README.md")
DEMO = Plan(out=ROOT / "results" / "demo" / "lm", datasets=("python-stdlib",),
            models=_plain("regular_gpt", "alibi", "kerple_log", "nope"), seeds={"python-stdlib": (0,)},
            steps=200, batch_size=16, multiples=16, eval_tokens=8192)
_POLICIES = ("train", "per_position")  # scored besides each RegularGPT's own adaptive depth
V2 = Plan(
    out=ROOT / "results" / "lm_cpu_v2", datasets=("python-stdlib", "debian-prose"),
    models=(
        Variant("regular_gpt", "regular_gpt", (), _POLICIES),  # the paper's settings: C 4, K 4, learned pad, r ~ N(0, 0.02)
        Variant("alibi", "alibi"),
        # one-knob ablations and the all-knobs row: python-stdlib, seed 0 only (the CPU budget); C = 8, the best
        # of them at seed 0, gets every seed and the second corpus
        Variant("rg_recency", "regular_gpt", ("model.rel_bias_init=recency",), _POLICIES, ("python-stdlib",), (0,)),
        Variant("rg_depth_init", "regular_gpt", ("model.depth_scaled_init=true",), _POLICIES, ("python-stdlib",), (0,)),
        Variant("rg_pad_mask", "regular_gpt", ("model.pad=mask",), _POLICIES, ("python-stdlib",), (0,)),
        Variant("rg_c8", "regular_gpt", ("model.chunk_size=8",), _POLICIES),
        Variant("rg_all", "regular_gpt", ("model.rel_bias_init=recency", "model.depth_scaled_init=true",
                                          "model.pad=mask"), _POLICIES, ("python-stdlib",), (0,)),
        # C = T = 64: one depth step of full causal attention with a learned scalar per offset (no dilation at
        # the training length): what the sparse tree costs at 1×, added after C = 8 beat C = 4 by 11%
        Variant("rg_c64", "regular_gpt", ("model.chunk_size=64",), _POLICIES, ("python-stdlib",), (0,)),
        # the baselines besides ALiBi: one seed per corpus
        *(Variant(n, n, seeds=(0,)) for n in ("kerple_log", "kerple_power", "t5", "rope", "nope")),
    ),
    seeds={"python-stdlib": (0, 1, 2), "debian-prose": (0,)},
    steps=1200, batch_size=16, multiples=32, eval_tokens=16384,
    sliding_check=("regular_gpt", "alibi"),
)
# The longer-training-length check of v2 (issue 11, "if the budget allows"): the best RegularGPT variant of v2 at 1×
# (C = 8) against ALiBi, trained at T = 256 on the same 1.2M tokens (300 steps), evaluated to 32× = 8192.
V2_T256 = Plan(
    out=ROOT / "results" / "lm_cpu_v2_t256", datasets=("python-stdlib",),
    models=(Variant("rg_c8", "regular_gpt", ("model.chunk_size=8",), _POLICIES), Variant("alibi", "alibi")),
    seeds={"python-stdlib": (0,)}, steps=300, batch_size=16, multiples=32, eval_tokens=16384, train_length=256,
)
STUDIES = {"v1": FULL, "v2": V2, "v2-t256": V2_T256}


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _run(cmd: list[str], log: Path | None = None) -> int:
    """Run a command from the repository root; output to `log` (appended) or to this process's stdout."""
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if log is None:
        return subprocess.run(cmd, cwd=ROOT, check=False).returncode
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        return subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False).returncode


# ------------------------------------------------------------------------------------------------------ stages


def prepare_data(plan: Plan) -> None:
    for dataset in plan.datasets:
        cmd = [sys.executable, "data_prep/prepare.py", "--source", dataset, "--out", _rel(plan.data_root / dataset),
               "--vocab-size", str(VOCAB), "--max-bytes", str(plan.max_bytes), "--num-proc", "1"]
        if _run(cmd) != 0:
            raise SystemExit(f"error: data preparation for {dataset} failed (see above)")


def train_overrides(plan: Plan, dataset: str, seed: int, variant: Variant | None = None) -> list[str]:
    return [*(variant.sets if variant else ()), f"data.path={_rel(plan.data_root / dataset)}",
            f"data.seq_len={plan.train_length}", f"model.vocab_size={VOCAB}",
            f"train.seed={seed}", f"train.steps={plan.steps}", f"train.batch_size={plan.batch_size}",
            "train.eval_every=0", "train.save_every=0", "train.keep_last=1", "logging.progress=false",
            "logging.wandb=false"]


def parameter_counts(plan: Plan) -> dict[str, int]:
    """Parameters of every model; SystemExit when one is more than 10% away from RegularGPT's."""
    from regulargpt.config import load_config
    from regulargpt.model import build_model

    counts = {}
    for model in plan.models:
        cfg = load_config(ROOT / "configs" / "tiny" / f"{model.config}.json",
                          train_overrides(plan, plan.datasets[0], 0, model))
        counts[model.name] = build_model(cfg.model).num_parameters()
    reference = counts.get("regular_gpt", next(iter(counts.values())))
    print("parameters (budget: RegularGPT ±10%):", flush=True)
    for model, n in counts.items():
        print(f"  {model:13s} {n:>10,}  ({(n / reference - 1) * 100:+.2f}%)", flush=True)
    far = [m for m, n in counts.items() if abs(n / reference - 1) > 0.10]
    if far:
        raise SystemExit(f"error: {far} are more than 10% away from RegularGPT's {reference:,} parameters")
    return counts


def train_all(plan: Plan, after_each: Callable[[], None] | None = None) -> list[str]:
    """Train every missing run (model.pt absent), calling `after_each` after every new run (evaluate + report, so
    results appear as runs finish); → the runs that failed."""
    from tqdm.auto import tqdm

    failed = []
    todo = plan.trainings()
    bar = tqdm(todo, desc="training", unit="run", file=sys.stdout, mininterval=0)
    for dataset, variant, seed in bar:
        run_dir = plan.run_dir(dataset, variant, seed)
        model = variant.name
        bar.set_postfix_str(f"{dataset}/{model}-seed{seed}")
        if (run_dir / "model.pt").is_file():
            continue
        cmd = [sys.executable, "launch/pretrain.py", "--config", f"configs/tiny/{variant.config}.json",
               "--run-dir", _rel(run_dir)]
        for item in train_overrides(plan, dataset, seed, variant):
            cmd += ["--set", item]
        t0, cpu0 = time.perf_counter(), _children_cpu()
        rc = _run(cmd, log=run_dir / "train.log")
        seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if rc != 0 or not (run_dir / "model.pt").is_file():
            failed.append(f"{dataset}/{model}-seed{seed}")
            tail = (run_dir / "train.log").read_text(errors="replace")[-1500:]
            bar.write(f"training {dataset}/{model}-seed{seed} failed (exit {rc}); last lines of its train.log:\n{tail}")
            continue
        atomic_write_text(run_dir / "wall.json",
                          json.dumps({"seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "command": cmd}) + "\n")
        bar.write(f"trained {dataset}/{model}-seed{seed} in {seconds:.0f} s ({cpu:.0f} CPU s)")
        if after_each is not None:
            after_each()
    return failed


def _children_cpu() -> float:
    """CPU seconds (user + system) used so far by finished child processes."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _finished(plan: Plan, dataset: str, names: tuple[str, ...] | None = None,
              policy: str | None = None, seeds: tuple[int, ...] | None = None) -> list[str]:
    """Run directories with a model.pt, in training order; optionally only `names`, variants scored with `policy`,
    or `seeds`."""
    return [_rel(plan.run_dir(d, m, s)) for d, m, s in plan.trainings()
            if d == dataset and (names is None or m.name in names) and (policy is None or policy in m.depth_policies)
            and (seeds is None or s in seeds) and (plan.run_dir(d, m, s) / "model.pt").is_file()]


def evaluate_all(plan: Plan, memory_gb: float) -> None:
    """Every finished run at every length (its own depth policy), RegularGPT runs again with each extra depth policy
    of their variant, and the sliding-protocol check; extrapolate.py skips rows already in the results file."""
    for dataset in plan.datasets:
        base = [sys.executable, "eval/extrapolate.py", "--data", _rel(plan.data_root / dataset), "--split", "test",
                "--tokens", str(plan.eval_tokens), "--out", _rel(plan.out / dataset), "--memory-gb", str(memory_gb),
                "--device", "cpu", "--no-progress"]
        lengths = ["--lengths", ",".join(map(str, plan.lengths))]
        jobs = [(_finished(plan, dataset), lengths)]
        jobs += [(_finished(plan, dataset, policy=p), [*lengths, "--depth-policy", p]) for p in ("train", "per_position")]
        if plan.sliding_check:
            jobs.append((_finished(plan, dataset, plan.sliding_check, seeds=(0,)),
                         ["--lengths", ",".join(map(str, plan.sliding_lengths)), "--protocol", "sliding",
                          "--stride", "32"]))
        for runs, extra in jobs:
            if runs and _run([*base, "--runs", *runs, *extra]) != 0:
                raise SystemExit(f"error: evaluation on {dataset} failed (see above)")


# ------------------------------------------------------------------------------------------------------ README


def _train_stats(plan: Plan) -> dict[str, dict[str, float]]:
    """model → mean training tokens/s and wall seconds over its finished runs, mean CPU seconds over the runs that
    recorded them (metrics.jsonl, wall.json), and the counts."""
    acc: dict[str, list[tuple[float, float, float | None]]] = {}
    for dataset, variant, seed in plan.trainings():
        run_dir = plan.run_dir(dataset, variant, seed)
        model = variant.name
        try:
            last = json.loads((run_dir / "metrics.jsonl").read_text().strip().splitlines()[-1])
            wall = json.loads((run_dir / "wall.json").read_text())
        except (OSError, IndexError, json.JSONDecodeError):
            continue
        acc.setdefault(model, []).append((last["tokens"] / max(last["elapsed_s"], 1e-9), wall["seconds"],
                                          wall.get("cpu_seconds")))
    out = {}
    for m, v in acc.items():
        cpus = [c for _, _, c in v if c is not None]
        out[m] = {"tokens_per_s": sum(a for a, _, _ in v) / len(v), "wall_s": sum(b for _, b, _ in v) / len(v),
                  "cpu_s": sum(cpus) / len(cpus) if cpus else math.nan, "cpu_runs": len(cpus), "runs": len(v)}
    return out


def _findings(group: dict, chunk_size: int) -> list[str]:
    """Sentences computed from one dataset's table: ranks at 1× and at the longest length, who beats RegularGPT and
    whether the gap is larger than the spread over seeds (max − min of either model, when both have 2+ seeds)."""
    lengths = group["lengths"]
    train = min((t for t in group["train_length"] if t), default=lengths[0])

    def mean(m: str, L: int) -> float | None:
        v = group["cells"].get((m, L))
        return sum(v) / len(v) if v else None

    def spread(m: str, L: int) -> float | None:
        v = group["cells"].get((m, L), [])
        return max(v) - min(v) if len(v) > 1 else None

    rg = next((m for m in group["models"] if m.startswith("RegularGPT")), None)
    out = []
    if rg:
        best = [L for L in lengths if mean(rg, L) is not None
                and all(mean(m, L) is None or mean(m, L) >= mean(rg, L) for m in group["models"])]
        out.append(f"RegularGPT has the lowest mean perplexity at L = {', '.join(map(str, best))}." if best
                   else "RegularGPT does not have the lowest mean perplexity at any length.")
    for L in dict.fromkeys((lengths[0], lengths[-1])):
        ranked = sorted((mean(m, L), m) for m in group["models"] if mean(m, L) is not None)
        if not ranked:
            continue
        order = ", ".join(f"{m} {v:.2f}" for v, m in ranked)
        out.append(f"At L = {L} ({L / train:g}× the training length) the order is: {order}.")
        if rg and mean(rg, L) is not None:
            gaps = []
            for v, m in ranked:
                if v >= mean(rg, L):
                    continue
                noise = [x for x in (spread(rg, L), spread(m, L)) if x is not None]
                flag = " (within the seed spread)" if noise and mean(rg, L) - v < max(noise) else ""
                gaps.append(f"{m} by {(mean(rg, L) / v - 1) * 100:.1f}%{flag}")
            if gaps:
                out.append(f"RegularGPT loses at L = {L} to " + ", ".join(gaps) + " (relative ppl).")
    if rg:
        from regulargpt.model import adaptive_depth

        by_depth: dict[int, list[int]] = {}
        for L in lengths:
            if mean(rg, L) is not None:
                by_depth.setdefault(adaptive_depth(L, chunk_size), []).append(L)
        if len(by_depth) > 1:
            out.append(f"RegularGPT perplexity by adaptive depth ceil(log_{chunk_size} L): " + "; ".join(
                f"{d} steps (L = {', '.join(map(str, ls))}) {sum(mean(rg, L) for L in ls) / len(ls):.2f}"
                for d, ls in sorted(by_depth.items())) + ".")
    growth = [(mean(m, lengths[-1]) / mean(m, lengths[0]), m) for m in group["models"]
              if mean(m, lengths[0]) and mean(m, lengths[-1])]
    if growth and len(lengths) > 1:
        out.append(f"Perplexity at L = {lengths[-1]} relative to L = {lengths[0]} (lower = better extrapolation): "
                   + ", ".join(f"{m} {g:.2f}×" for g, m in sorted(growth)) + ".")
    return out


def _what_we_found(plan: Plan) -> list[str]:
    """Per dataset: every (variant, depth policy) at 1× and the longest length, the study's two questions answered,
    and each knob's paired effect (regulargpt.evaluation.lm_findings), from the nonoverlapping results."""
    from regulargpt.evaluation.lm_findings import findings_markdown, position_gaps

    lines = [f"Variants (`{_rel(plan.out)}/runs/<dataset>/<variant>-seed<k>`): "
             + "; ".join(f"**{m.name}** = `configs/tiny/{m.config}.json`"
                         + (" with " + ", ".join(f"`{x}`" for x in m.sets) if m.sets else "")
                         + (f" (scored also with depth policies {', '.join(m.depth_policies)})" if m.depth_policies
                            else "")
                         + (f" (trained on {', '.join(m.datasets)} only)" if m.datasets else "")
                         for m in plan.models) + ".", ""]
    for dataset in plan.datasets:
        path = plan.out / dataset / "results.jsonl"
        lines += [f"### {dataset}", ""]
        if not path.is_file():
            lines += ["not evaluated yet", ""]
            continue
        rows = load_rows(path)
        lines += findings_markdown(rows, dataset, plan.train_length, plan.lengths[-1])
        gaps = position_gaps(rows, dataset, plan.train_length)
        if gaps:
            lines += ["", f"Where in the window each variant loses at 1×: mean NLL minus ALiBi's by window position "
                          f"(nats, paired by seed; > 0 = worse):", "", *gaps]
        lines.append("")
    return lines


def _summary(plan: Plan) -> list[str]:
    """One computed line per dataset: RegularGPT's rank at 1× and at the longest length, and its growth vs the best."""
    out = []
    for dataset in plan.datasets:
        path = plan.out / dataset / "results.jsonl"
        if not path.is_file():
            continue
        for (ds, _, _), g in aggregate(load_rows(path)).items():
            mean = {(m, L): sum(v) / len(v) for (m, L), v in g["cells"].items()}
            rg = next((m for m in g["models"] if m.startswith("RegularGPT")), None)
            first, last = g["lengths"][0], g["lengths"][-1]
            if rg is None or (rg, first) not in mean or (rg, last) not in mean:
                continue

            def rank(L: int, rg: str = rg, mean: dict = mean) -> str:
                values = sorted(v for (m, x), v in mean.items() if x == L)
                return f"{values.index(mean[(rg, L)]) + 1}/{len(values)}"

            growth = {m: mean[(m, last)] / mean[(m, first)] for m in g["models"]
                      if (m, first) in mean and (m, last) in mean}
            best = min(growth, key=growth.get)
            out.append(f"- **{ds}**: RegularGPT ranks {rank(first)} at L = {first} and {rank(last)} at L = {last} "
                       f"(1 = lowest perplexity); its perplexity changes {growth[rg]:.2f}× from L = {first} to "
                       f"{last} (flattest: {best} {growth[best]:.2f}×).")
    return out or ["(no results yet)"]


def write_readme(plan: Plan, counts: dict[str, int], command: str, failed: list[str], started: float | None) -> None:
    prov = provenance(command)
    stats = _train_stats(plan)
    lines = [
        "# Length extrapolation at CPU scale: RegularGPT vs ALiBi, T5, KERPLE, RoPE, NoPE", "",
        *([f"> **Superseded** by [{plan.superseded_by}](../{Path(plan.superseded_by).relative_to('results')}) "
           "(4× the training tokens, rows keyed by run variant, the RegularGPT knob ablation). Kept for reference; "
           "its rows merge runs by model name only.", ""] if plan.superseded_by else []),
        f"- Command: `{prov['command']}`", f"- Git commit: `{prov['commit']}`", f"- Machine: {prov['machine']}",
        f"- Date: {prov['date']}",
    ]
    invocation = plan.out / "invocation.json"
    if started is not None:
        atomic_write_text(invocation, json.dumps({"date": prov["date"], "command": prov["command"],
                                                  "wall_min": round((time.time() - started) / 60, 1),
                                                  "cpu_min": round(_children_cpu() / 60, 1)}) + "\n")
    if invocation.is_file():
        last = json.loads(invocation.read_text())
        lines.append(f"- Last full invocation (`{last['command']}`, {last['date']}): {last['wall_min']} min wall, "
                     f"{last['cpu_min']} min CPU in its child processes (data check, training, evaluation)")
    runs = sum(int(s["runs"]) for s in stats.values())
    if runs:
        wall = sum(s["wall_s"] * s["runs"] for s in stats.values()) / 60
        cpu_runs = sum(int(s["cpu_runs"]) for s in stats.values())
        cpu = sum(s["cpu_s"] * s["cpu_runs"] for s in stats.values() if s["cpu_runs"]) / 60
        lines.append(f"- Training: {runs} runs, {wall:.1f} min wall in total; {cpu:.1f} min CPU over the {cpu_runs} "
                     f"runs that recorded it (OMP_NUM_THREADS=1 per run; on a shared machine wall exceeds CPU)")
    scoring = sum(r.get("seconds", 0.0) for d in plan.datasets if (plan.out / d / "results.jsonl").is_file()
                  for r in load_rows(plan.out / d / "results.jsonl"))
    if scoring:
        lines.append(f"- Evaluation: {scoring / 60:.1f} min wall of scoring in total (the `seconds` of every row)")
    from regulargpt.config import load_config

    rg = load_config(ROOT / "configs" / "tiny" / "regular_gpt.json").model
    dense = load_config(ROOT / "configs" / "tiny" / "alibi.json").model
    overrides = " ".join("--set " + o for o in train_overrides(plan, "<dataset>", 0)).replace("seed=0", "seed=<k>")
    seeds = plan.seed_summary()
    lines += ["", "## What we found" if plan.is_ablation else "## Summary", ""]
    lines += _what_we_found(plan) if plan.is_ablation else _summary(plan)
    lines += [
        "", "## Setup", "",
        (f"- Data: {', '.join(plan.datasets)}, each built with `python data_prep/prepare.py --source <dataset> "
         f"--out {_rel(plan.data_root)}/<dataset> --vocab-size {VOCAB} --max-bytes {plan.max_bytes} --num-proc 1` "
         f"(its own {VOCAB}-piece BPE tokenizer per dataset; document-level train/val/test split)."),
        (f"- Models: `configs/tiny/<model>.json`: d_model {rg.d_model}, {rg.n_heads} heads, FFN ×{rg.ffn_mult}, "
         f"{rg.norm}-LN, {rg.activation.upper()}, {'tied' if rg.tie_embeddings else 'untied'} embeddings; the baselines have "
         f"{dense.n_layers} dense causal layers, RegularGPT one shared block of K = {rg.thickness} sub-layers "
         f"(chunk size C = {rg.chunk_size}) applied at ceil(log_C T) depth steps. Overrides of every run: "
         f"`{overrides}`."),
        (f"- Training: {plan.steps} steps × batch {plan.batch_size} × length {plan.train_length} = "
         f"**{plan.train_tokens:,} tokens per run**, identical for every model; seeds: {seeds}."),
        (f"- Evaluation: `eval/extrapolate.py`, non-overlapping windows (the KERPLE/ALiBi protocol) on the test "
         f"split at L = {', '.join(map(str, plan.lengths))} (1× … {plan.multiples}×), the same {plan.eval_tokens:,} "
         f"tokens scored at every length; the exact command is at the top of each `<dataset>/table.md`."),
        "", "| model | label | parameters | vs RegularGPT | train tokens/s (1 thread, wall) | wall / CPU s per run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    reference = counts.get("regular_gpt", next(iter(counts.values())))
    for variant in plan.models:
        model, n = variant.name, counts[variant.name]
        label = model_label(load_config(ROOT / "configs" / "tiny" / f"{variant.config}.json", list(variant.sets)).model)
        label += "".join(f" {item.split('.', 1)[1]}" for item in variant.sets)
        s = stats.get(model)
        speed = f"{s['tokens_per_s']:,.0f}" if s else "—"
        wall = f"{s['wall_s']:.0f} / " + ("—" if math.isnan(s["cpu_s"]) else f"{s['cpu_s']:.0f}") if s else "—"
        if s and 0 < s["cpu_runs"] < s["runs"]:
            wall += f" (CPU of {s['cpu_runs']} of {s['runs']} runs)"
        lines.append(f"| {model} | {label} | {n:,} | {(n / reference - 1) * 100:+.2f}% | {speed} | {wall} |")
    if failed:
        lines += ["", f"**Failed trainings (not in the tables):** {', '.join(failed)}."]
    lines += ["", "## Results", ""]
    for dataset in plan.datasets:
        path = plan.out / dataset / "results.jsonl"
        if not path.is_file():
            lines += [f"### {dataset}", "", "not evaluated yet", ""]
            continue
        for (ds, split, protocol), group in aggregate(load_rows(path)).items():
            plots = (f"Plots: [{ds}/ppl_vs_length.png]({ds}/ppl_vs_length.png), "
                     f"[{ds}/loss_vs_position.png]({ds}/loss_vs_position.png).")
            lines += [f"### {ds} ({split} split, {protocol})", "", markdown_table(group), "", plots, ""]
            if not plan.is_ablation:  # v1's per-table sentences assume one RegularGPT row
                lines += [f"- {s}" for s in _findings(group, rg.chunk_size)] + [""]
    lines += ["## Discussion", "", discussion(plan, stats)]
    atomic_write_text(plan.out / "README.md", "\n".join(lines).rstrip() + "\n")
    print(f"wrote {_rel(plan.out / 'README.md')}", flush=True)


def discussion(plan: Plan, stats: dict[str, dict[str, float]]) -> str:
    """How to read the findings; the structural numbers come from the RegularGPT config and the measured speeds."""
    from regulargpt.config import load_config
    from regulargpt.model import adaptive_depth

    cfg = load_config(ROOT / "configs" / "tiny" / "regular_gpt.json").model
    c, k, longest = cfg.chunk_size, cfg.thickness, plan.lengths[-1]
    d_train, d_long = adaptive_depth(plan.train_length, c), adaptive_depth(longest, c)
    baseline = load_config(ROOT / "configs" / "tiny" / "alibi.json").model.n_layers
    speeds = [s["tokens_per_s"] for m, s in stats.items() if m != "regular_gpt"]
    seeds = plan.seed_summary()
    measured = (f"; measured: {sum(speeds) / len(speeds) / stats['regular_gpt']['tokens_per_s']:.1f}× slower "
                f"per token" if speeds and "regular_gpt" in stats else "")
    return f"""\
The bullet points under each table are computed from the result files; this section says how to read them.

- **Scale.** These are ~1.3M-parameter models trained on {plan.train_tokens:,} tokens each: far from converged, so
  differences at 1× mostly measure how fast each architecture learns, not its capacity. Seeds:
  {seeds}; a gap marked "within the seed spread" is not significant, and single-seed gaps of a few percent are not
  either.
- **Compute is not matched.** At equal tokens and parameters RegularGPT (C = {c}, K = {k}) applies its {k} shared
  sub-layers at ceil(log_{c} {plan.train_length}) = {d_train} depth steps in training ({k * d_train} layer applications
  against the baselines' {baseline}{measured}). At L = {longest} it applies {d_long} depth steps ({k * d_long}
  applications): {d_long - d_train} more than it ever ran in training, at dilations up to {c}^{d_long - 1} = {c ** (d_long - 1)}.
- **Why RegularGPT can trail a recency-biased baseline.** Each depth step sees exactly C keys at dilation C^l; past
  the training length the new, coarser steps mix in states from far away that the shared weights were never trained
  to read. ALiBi and KERPLE decay attention with distance, which acts as a *local window*: far context is ignored and
  perplexity stays flat. The RegularGPT paper's abstract reports that on natural language RegularGPT "rediscovers the
  local windowed attention effect deemed necessary in prior work for length extrapolation": it extrapolates when its
  learned window scalars and pad states make the extra depth steps behave like near-identity updates. With a budget
  this small that behaviour may or may not have been learned; `loss_vs_position.png` shows whether its loss rises at
  window positions past the training length (a break) or stays flat (windowed behaviour).
- **Depth steps.** The "by adaptive depth" line under each table groups RegularGPT's perplexity by the number of
  depth steps it runs at each length. Flat within a depth and a rise whenever a step is added means the break comes
  from the extra steps, not from the amount of context.
- **NoPE and RoPE** have no recency bias; a rise past the training length is their expected failure (the control).
"""


# ------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--demo", action="store_true", help="the small version: python-stdlib, 1 seed, RegularGPT + ALiBi "
                                                       "+ KERPLE-log + NoPE, 200 steps, up to 16× (out results/demo/lm)")
    p.add_argument("--study", choices=sorted(STUDIES), default="v1",
                   help="which study: v1 (results/lm_cpu, superseded), v2 (results/lm_cpu_v2: 1.2M tokens per run, "
                        "the RegularGPT knob ablation, depth policies) or v2-t256 (results/lm_cpu_v2_t256: RegularGPT "
                        "C8 vs ALiBi trained at T = 256, evaluated to 8192); default v1")
    p.add_argument("--out", help="output folder (default: the study's, or results/demo/lm with --demo)")
    p.add_argument("--steps", type=positive_int, help="training steps per run (default 300; demo 200), e.g. --steps 100")
    p.add_argument("--eval-tokens", type=positive_int, help="tokens scored per length (default 16384; demo 8192)")
    p.add_argument("--memory-gb", type=positive_float, default=4.0, help="evaluation memory budget (default 4)")
    p.add_argument("--report-only", action="store_true", help="only rewrite OUT/README.md from existing results")
    args = p.parse_args(argv)
    plan = DEMO if args.demo else STUDIES[args.study]
    if args.out:
        plan.out = Path(args.out).resolve()
    if args.steps:
        plan.steps = args.steps
    if args.eval_tokens:
        plan.eval_tokens = args.eval_tokens
    command = "python " + " ".join(shlex.quote(a) for a in [_rel(Path(sys.argv[0])), *(argv or sys.argv[1:])])
    started = time.time()
    print(f"comparison: {len(plan.trainings())} trainings of {plan.train_tokens:,} tokens, lengths {plan.lengths}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, out {_rel(plan.out)}", flush=True)
    counts = parameter_counts(plan)
    failed: list[str] = []
    if not args.report_only:
        prepare_data(plan)

        def evaluate_and_report() -> None:
            evaluate_all(plan, args.memory_gb)
            write_readme(plan, counts, command, [], started)

        failed = train_all(plan, evaluate_and_report)
        evaluate_all(plan, args.memory_gb)
    write_readme(plan, counts, command, failed, None if args.report_only else started)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
