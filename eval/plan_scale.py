"""Plan a run on a GPU cluster: per-rank memory under ZeRO 0–3, the stage to choose, the longest training length that
fits, and step time / tokens/s / hours at a stated MFU (a projection, not a measurement). Formulas:
regulargpt/scale_plan.py and docs/SCALING.md.

    python eval/plan_scale.py --config configs/base.json --config configs/baselines/alibi.json \\
        --gpus-per-node 8 --gpu-memory-gb 80 --nodes 1 --mfu 0.35 --peak-tflops 312
    python eval/plan_scale.py --config configs/base.json --cluster cluster.json --markdown plan.md

A cluster file is a JSON object with any of gpus_per_node, gpu_memory_gb, nodes, peak_tflops, mfu, reserve_gb;
flags given on the command line win over it. Defaults: 1 node of 8 × 80 GB GPUs at 312 TFLOP/s (A100 80 GB, bf16
dense) and MFU 0.35, no reserve; every output states the values it used.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import positive_int, run  # noqa: E402
from regulargpt.config import Config, ConfigError, build_section, load_config, read_json  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.scale_plan import (  # noqa: E402
    GIB,
    Cluster,
    choose_stage,
    estimate,
    longest_length,
    model_size,
    step_seconds,
)

_FLAGS = ("gpus_per_node", "gpu_memory_gb", "nodes", "peak_tflops", "mfu", "reserve_gb")


def make_cluster(path: str | None, flags: dict[str, float | int | None]) -> Cluster:
    """Cluster from the JSON file (strict keys) overridden by the flags given; errors name the flag or the file key."""
    raw = read_json(Path(path)) if path else {}
    given = {k: v for k, v in flags.items() if v is not None}
    try:
        build_section(Cluster, raw, path or "cluster")  # unknown keys / wrong types in the file, by name
        return Cluster(**{**raw, **given})
    except ConfigError as err:
        text = str(err)
        for name in given:
            if text.startswith(f"{name}:"):
                raise ConfigError(f"--{name.replace('_', '-')}" + text[len(name):]) from None
        raise ConfigError(f"{path}: {text}" if path and not text.startswith(path) else text) from None


def _gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def plan_one(cfg: Config, name: str, cluster: Cluster, batch: int | None) -> tuple[list[str], dict[str, object]]:
    """Lines of the plan of one config, and its summary row."""
    size = model_size(cfg.model)
    t, b, ac = cfg.data.seq_len, cfg.train.batch_size, cfg.train.activation_checkpointing
    lines = [f"## {name}", "",
             f"{cfg.model.architecture} ({cfg.model.position if cfg.model.architecture == 'transformer' else 'C=' + str(cfg.model.chunk_size) + ' K=' + str(cfg.model.thickness)}), "
             f"P = {size.params:,} parameters (largest layer {size.largest_layer:,}), {cfg.train.precision}, "
             f"T = {t}, micro-batch {b}, grad_accum {cfg.train.grad_accum}, activation checkpointing "
             f"{'on' if ac else 'off'}; {cluster.ranks} ranks, {cluster.gpu_memory_gb:g} GB per GPU "
             f"({cluster.usable_bytes / GIB:.2f} GiB usable after a {cluster.reserve_gb:g} GB reserve).", "",
             "| ZeRO | weights | grads | optimizer | buffers | activations | activations (AC) | total | total (AC) |"
             " fits |", "|---|---|---|---|---|---|---|---|---|---|"]
    for stage in (0, 1, 2, 3):
        e = estimate(cfg, cluster.ranks, stage, size=size)
        fits = "yes" if e.total(ac) <= cluster.usable_bytes else "no"
        lines.append(f"| {stage} | {_gib(e.weights)} | {_gib(e.grads)} | {_gib(e.optimizer)} | {_gib(e.buffers)} | "
                     f"{_gib(e.activations)} | {_gib(e.activations_ac)} | {_gib(e.total(False))} | "
                     f"{_gib(e.total(True))} | {fits} |")
    stage, why = choose_stage(cfg, cluster)
    lines += ["", "GiB per rank (2^30 bytes); \"fits\" uses the config's checkpointing setting.", "",
              f"**Stage to choose:** {why}.", ""]
    chosen = 3 if stage is None else stage
    search_batch = b if batch is None else batch
    longest = {ac_: longest_length(cfg, cluster, chosen, ac_, search_batch) for ac_ in (False, True)}
    lines.append(f"**Longest training length that fits** at ZeRO-{chosen}, micro-batch {search_batch}: "
                 f"T = {longest[False]:,} without activation checkpointing, {longest[True]:,} with it.")
    seconds = step_seconds(cfg, cluster)
    tokens = cfg.train.batch_size * cfg.train.grad_accum * t * cluster.ranks
    hours = seconds * cfg.train.steps / 3600
    lines += ["", f"**Projection** (at MFU {cluster.mfu:g} of {cluster.peak_tflops:g} TFLOP/s per GPU, not a "
              f"measurement): {seconds * 1e3:.1f} ms per step, {tokens / seconds:,.0f} tokens/s, "
              f"{cfg.train.steps:,} steps in {hours:.2f} h.", ""]
    return lines, {"name": name, "params": size.params, "stage": stage, "longest": longest[False],
                   "longest_ac": longest[True], "tokens_s": tokens / seconds, "hours": hours}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", required=True,
                   help="config to plan (repeatable), e.g. --config configs/base.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every config (repeatable), e.g. --set train.activation_checkpointing=true")
    p.add_argument("--cluster", help="cluster JSON, e.g. --cluster cluster.json ({\"gpus_per_node\": 8, ...})")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node, e.g. --gpus-per-node 8 (default 8)")
    p.add_argument("--gpu-memory-gb", type=float, help="memory per GPU in GB (1e9 bytes), e.g. 80 (default 80)")
    p.add_argument("--nodes", type=int, help="nodes, e.g. --nodes 2 (default 1)")
    p.add_argument("--peak-tflops", type=float, help="peak TFLOP/s per GPU in the training precision (default 312)")
    p.add_argument("--mfu", type=float, help="assumed model FLOPs utilisation, e.g. --mfu 0.4 (default 0.35)")
    p.add_argument("--reserve-gb", type=float, help="GB per GPU kept back for the CUDA context etc. (default 0)")
    p.add_argument("--batch", type=positive_int, help="micro-batch for the longest-length search (default: the config's)")
    p.add_argument("--markdown", help="also write the plan as markdown, e.g. --markdown plan.md")
    args = p.parse_args(argv)
    cluster = make_cluster(args.cluster, {k: getattr(args, k) for k in _FLAGS})
    prov = provenance(shlex.join(["python", "eval/plan_scale.py", *(sys.argv[1:] if argv is None else argv)]))
    out = [f"# Scale plan: {cluster.nodes} × {cluster.gpus_per_node} GPUs of {cluster.gpu_memory_gb:g} GB", "",
           f"A projection on paper, not a measurement. Command: `{prov['command']}`; commit {prov['commit']}, "
           f"{prov['date']}.", "",
           f"Assumed: peak {cluster.peak_tflops:g} TFLOP/s per GPU, MFU {cluster.mfu:g}, reserve "
           f"{cluster.reserve_gb:g} GB; model states for Adam in mixed precision (weights and grads in the working "
           "precision, 16 bytes of fp32 grads, master and moments per parameter), activations as stored by this "
           "project's kernels on CUDA (docs/SCALING.md).", ""]
    rows = []
    for path in args.config:
        lines, row = plan_one(load_config(path, args.set), path, cluster, args.batch)
        out += lines
        rows.append(row)
    out += ["## Summary", "", "| config | parameters | ZeRO | longest T | longest T (AC) | tokens/s | hours |",
            "|---|---|---|---|---|---|---|"]
    out += [f"| {r['name']} | {r['params']:,} | {r['stage'] if r['stage'] is not None else 'none fits'} | "
            f"{r['longest']:,} | {r['longest_ac']:,} | {r['tokens_s']:,.0f} | {r['hours']:.2f} |" for r in rows]
    text = "\n".join(out) + "\n"
    print(text, end="")
    if args.markdown:
        atomic_write_text(Path(args.markdown), text)
    return 0


assert set(_FLAGS) <= {f.name for f in dataclasses.fields(Cluster)}

if __name__ == "__main__":
    run(main)
