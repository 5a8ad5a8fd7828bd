"""Benchmark: per-token decode time and memory against context length, RegularGPT's rings against ALiBi's KV cache.

For every (model, width, batch) a fresh subprocess builds the model (untrained weights: decode time does not depend
on them) and, for each context length T in ascending order, fills the decoder's caches as after T − n tokens
(`fill_random`: random keys and values, every ring and cache at the size a real prefill leaves, sized once for T
positions), then decodes n = `--warmup` untimed + `--steps` timed tokens, the last at position T − 1; the per-token
time is the median of the timed steps. With `--rounds R` the whole list runs R times and every point keeps its
fastest round, so that a slow spell of a shared machine does not land on one model only.
Memory: the caches' bytes (exact, from the decoder) and the process's peak RSS over the fill and the steps (VmHWM,
reset before each context through /proc/self/clear_refs). A context whose predicted cache exceeds `--memory-gb`
is skipped (and says so).

Models: RegularGPT with depth_policy=train (constant rings) and per_position (full receptive field), and ALiBi with a
per-layer KV cache; widths tiny (configs/tiny/regular_gpt.json, configs/tiny/alibi.json) and base (configs/base.json,
configs/baselines/alibi.json).

    python eval/bench_generate.py --out results/bench_generate.md
    python eval/bench_generate.py --widths tiny --batches 1 --contexts 256,1024,16384 --out /tmp/gen.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`

from regulargpt.cli import positive_float, positive_int  # noqa: E402
from regulargpt.config import Config  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402

WIDTHS = {"tiny": ("configs/tiny/regular_gpt.json", "configs/tiny/alibi.json"),
          "base": ("configs/base.json", "configs/baselines/alibi.json")}
MODELS = ("RegularGPT train", "RegularGPT per_position", "ALiBi")


def _model_spec(model: str, width: str) -> tuple[str, list[str]]:
    """(config file, --set overrides) of a benchmarked model at a width."""
    regular, alibi = WIDTHS[width]
    if model == "ALiBi":
        return alibi, []
    return regular, [f"model.depth_policy={model.split()[1]}"]


def predicted_cache_bytes(cfg: Config, length: int, batch: int, itemsize: int = 4) -> int:
    """Cache bytes after `length` tokens: dense 2·layers·B·T·d; RegularGPT 2·K·B·d·Σ_l min(W_l, T) over its depth
    steps, plus B·T·d final states under per_position."""
    from regulargpt.generation import ring_window
    from regulargpt.model import adaptive_depth

    m = cfg.model
    if m.architecture != "regular_gpt":
        return 2 * m.n_layers * batch * length * m.d_model * itemsize
    depth = adaptive_depth(m.train_length if m.depth_policy == "train" else length, m.chunk_size)
    slots = sum(min(ring_window(m.chunk_size, level), length) for level in range(depth))
    history = length if m.depth_policy == "per_position" else 0
    return (2 * m.thickness * slots + history) * batch * m.d_model * itemsize


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def worker(spec: dict) -> None:
    """One (model, width, batch): a JSON line per context."""
    import torch

    from regulargpt.config import load_config
    from regulargpt.generation import make_decoder
    from regulargpt.model import build_model

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    cfg = load_config(ROOT / spec["config"], spec["sets"])
    model = build_model(cfg.model).eval()
    batch = spec["batch"]
    token = torch.zeros(batch, dtype=torch.long)
    for length in spec["contexts"]:
        row = {k: spec[k] for k in ("model", "width", "batch")} | {"context": length}
        predicted = predicted_cache_bytes(cfg, length, batch)
        if predicted > spec["memory_gb"] * 2**30:
            print(json.dumps(row | {"skipped": f"cache {predicted / 2**30:.1f} GiB > --memory-gb"}), flush=True)
            continue
        decoder = make_decoder(model)
        reset = _reset_peak_rss()
        decoder.fill_random(length - spec["warmup"] - spec["steps"], batch, reserve=length)
        times = []
        for i in range(spec["warmup"] + spec["steps"]):
            start = time.perf_counter()
            decoder.step(token)
            if i >= spec["warmup"]:
                times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        print(json.dumps(row | {"ms_per_token": seconds * 1e3, "tokens_per_s": batch / seconds,
                                "cache_mib": decoder.cache_bytes / 2**20, "predicted_cache_mib": predicted / 2**20,
                                "peak_rss_mib": _peak_rss_mib() if reset else None,
                                "params": sum(p.numel() for p in model.parameters())}), flush=True)
        del decoder


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _row(rows: list[dict], model: str, width: str, batch: int, context: int) -> dict | None:
    return next((r for r in rows if (r["model"], r["width"], r["batch"], r["context"]) == (model, width, batch, context)
                 and "ms_per_token" in r), None)


def headline(rows: list[dict], width: str, batch: int, short: int = 1024, long: int = 16384) -> str | None:
    """RegularGPT (train) time at `long` over `short`, its cache at both, and its tokens/s over ALiBi's at `long`."""
    a, b = _row(rows, "RegularGPT train", width, batch, short), _row(rows, "RegularGPT train", width, batch, long)
    alibi = _row(rows, "ALiBi", width, batch, long)
    if a is None or b is None:
        return None
    growth = b["ms_per_token"] / a["ms_per_token"]
    text = (f"{width}, batch {batch}: RegularGPT (train) {a['ms_per_token']:.1f} ms/token at {short} → "
            f"{b['ms_per_token']:.1f} ms at {long} ({growth:.2f}×, target ≤ 1.5×: "
            f"{'met' if growth <= 1.5 else 'missed'}), cache {a['cache_mib']:.2f} → {b['cache_mib']:.2f} MiB")
    if alibi is not None:
        speedup = b["tokens_per_s"] / alibi["tokens_per_s"]
        text += (f"; ALiBi {alibi['ms_per_token']:.1f} ms/token with a {alibi['cache_mib']:.0f} MiB cache at {long}: "
                 f"RegularGPT decodes **{speedup:.1f}×** ALiBi's tokens/s (target ≥ 5×: "
                 f"{'met' if speedup >= 5 else 'missed'})")
    return text


def report(rows: list[dict], command: str, threads: int, steps: int, warmup: int, rounds: int) -> str:
    prov = provenance(command)
    lines = ["# Cached decoding: per-token time and memory against context length", "",
             f"Command: `{prov['command']}`  ", f"Git commit: {prov['commit']}  ", f"Machine: {prov['machine']}  ",
             f"Date: {prov['date']}  ",
             f"torch threads {threads}; untrained weights, caches filled with random keys/values, then "
             f"{warmup} warm-up and {steps} timed decode steps (median) up to position T − 1, the fastest of "
             f"{rounds} rounds over the whole list. Cache: bytes the decoder holds at context T. Peak RSS: the whole "
             "process (weights, torch) over the fill and the steps.", "", "## Headline", ""]
    widths = list(dict.fromkeys(r["width"] for r in rows))
    batches = list(dict.fromkeys(r["batch"] for r in rows))
    lines += [f"- {h}" for w in widths for b in batches if (h := headline(rows, w, b))]
    lines += ["", "## All points", "",
              "| width | batch | model | context T | ms / token | tokens / s | cache (MiB) | peak RSS (MiB) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['width']} | {r['batch']} | {r['model']} | {r['context']} | skipped: {r['skipped']} "
                         "| | | |")
            continue
        rss = "-" if r["peak_rss_mib"] is None else f"{r['peak_rss_mib']:.0f}"
        lines.append(f"| {r['width']} | {r['batch']} | {r['model']} | {r['context']} | {r['ms_per_token']:.2f} | "
                     f"{r['tokens_per_s']:.0f} | {r['cache_mib']:.2f} | {rss} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", default="tiny,base", help="comma-separated of tiny, base (default: %(default)s)")
    p.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default: %(default)s)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: %(default)s)")
    p.add_argument("--contexts", default="256,1024,4096,16384,65536",
                   help="comma-separated context lengths T (default: %(default)s)")
    p.add_argument("--steps", type=positive_int, default=7, help="timed decode steps per point (default 7)")
    p.add_argument("--warmup", type=positive_int, default=2, help="untimed decode steps first (default 2)")
    p.add_argument("--rounds", type=positive_int, default=2, help="passes over the whole list; each point keeps its fastest "
                                                         "(default 2)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads (default 1)")
    p.add_argument("--memory-gb", type=positive_float, default=12.0,
                   help="skip a point whose cache would exceed this (default 12)")
    p.add_argument("--out", type=Path, default=Path("results/bench_generate.md"), help="markdown report; the JSONL "
                   "rows go next to it (default %(default)s)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    best: dict[tuple, dict] = {}  # (model, width, batch, context) → the fastest row over the rounds
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "OMP_WAIT_POLICY": "PASSIVE"}
    for _ in range(args.rounds):
        for width in args.widths.split(","):
            for batch in _ints(args.batches):
                for model in args.models.split(","):
                    config, sets = _model_spec(model, width)
                    spec = {"model": model, "width": width, "batch": batch, "config": config, "sets": sets,
                            "contexts": sorted(_ints(args.contexts)), "steps": args.steps, "warmup": args.warmup,
                            "threads": args.threads, "memory_gb": args.memory_gb}
                    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], env=env,
                                          capture_output=True, text=True)
                    for line in proc.stdout.splitlines():
                        print(line, flush=True)
                        row = json.loads(line)
                        key = (row["model"], row["width"], row["batch"], row["context"])
                        fastest = best.get(key, {}).get("ms_per_token", math.inf)
                        if key not in best or row.get("ms_per_token", math.inf) < fastest:
                            best[key] = row
                    if proc.returncode != 0:
                        print(f"{model} {width} batch {batch}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
    rows = list(best.values())
    jsonl = args.out.with_suffix(".jsonl")
    atomic_write_text(jsonl, "".join(json.dumps(r) + "\n" for r in rows))
    atomic_write_text(args.out, report(rows, command, args.threads, args.steps, args.warmup, args.rounds))
    print(f"wrote {jsonl} and {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
