"""Profile one CPU training step at small T: RegularGPT against the dense baseline with as many layers as its layer
applications, torch.profiler, op counts and the top ops by self time.

One step = forward (bf16 autocast by default, as `eval/bench_train.py`), cross-entropy, backward, AdamW. Per model:
the best wall time of `--repeats` unprofiled steps (interleaved between the models, so both see the same machine
load), then `--steps` profiled steps; "ops per step" counts every `aten::` call the profiler records (nested calls
included, e.g. `aten::linear` and the `aten::addmm` inside it are two) divided by the steps. Step times are CPU time
of this process (`time.process_time`, one torch thread): on a shared machine it leaves out the time spent waiting
for a core, which wall time does not. `--compile` compiles both models (`nn.Module.compile`, as `train.compile`)
and reports their step times (the profile tables are then of the compiled code).

    python eval/profile_small_t.py --out results/profile_small_t.md
    python eval/profile_small_t.py --config configs/tiny/regular_gpt.json --baselines alibi --dtype fp32
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from regulargpt.cli import positive_int  # noqa: E402
from regulargpt.config import load_config  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.model import adaptive_depth, build_model  # noqa: E402


def make_step(config: str, overrides: list[str], batch: int, amp: bool,
              compile_model: bool = False) -> tuple[Callable[[], None], str, int]:
    """(training-step closure, label, parameter count) for the config with `overrides` (`section.key=value`)."""
    torch.manual_seed(0)
    cfg = load_config(config, overrides)
    model = build_model(cfg.model)
    if compile_model:
        model.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t, vocab = cfg.data.seq_len, cfg.model.vocab_size
    tokens = torch.randint(0, vocab, (batch, t + 1))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    m = cfg.model
    label = "RegularGPT" if m.architecture == "regular_gpt" else f"{m.position}, {m.n_layers} layers"
    return step, label, model.num_parameters()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/tiny/regular_gpt.json")
    parser.add_argument("--baselines", default="alibi", help="comma-separated dense positions (default: alibi)")
    parser.add_argument("--batch", type=positive_int, default=8)
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16", help="autocast dtype (default: bf16)")
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=20, help="unprofiled timed steps per model (default: 20)")
    parser.add_argument("--steps", type=positive_int, default=3, help="profiled steps per model (default: 3)")
    parser.add_argument("--top", type=positive_int, default=12, help="ops listed per model (default: 12)")
    parser.add_argument("--compile", action="store_true", help="compile both models first (nn.Module.compile)")
    parser.add_argument("--out", type=Path, default=Path("results/profile_small_t.md"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    amp = args.dtype == "bf16"

    cfg = load_config(args.config)
    apps = cfg.model.thickness * adaptive_depth(cfg.data.seq_len, cfg.model.chunk_size)
    models = [make_step(args.config, [], args.batch, amp, args.compile)]
    for position in filter(None, args.baselines.split(",")):
        models.append(make_step(args.config, ["model.architecture=transformer", f"model.position={position}",
                                              f"model.n_layers={apps}"], args.batch, amp, args.compile))
    for step, _, _ in models:  # warm-up
        step()
        step()
    best = [float("inf")] * len(models)
    for _ in range(args.repeats):  # interleaved: every model sees the same spells of machine load
        for i, (step, _, _) in enumerate(models):
            start = time.process_time()
            step()
            best[i] = min(best[i], time.process_time() - start)

    prov = provenance(shlex.join([sys.executable.rsplit("/", 1)[-1], *sys.argv]))
    lines = [
        f"# One training step at T = {cfg.data.seq_len}: where the time goes ({args.dtype} autocast, AdamW"
        f"{', compiled' if args.compile else ''})",
        "",
        f"Command: `{prov['command']}`  ",
        f"Git commit: {prov['commit']}  ",
        f"Machine: {prov['machine']}, torch threads {args.threads}  ",
        f"Date: {prov['date']}  ",
        f"Config {args.config}, batch {args.batch}; the dense baselines have {apps} layers (RegularGPT's layer "
        f"applications K·ceil(log_C T)). Step = CPU time of the best of {args.repeats} unprofiled steps, "
        "interleaved between the models; ops = `aten::` calls recorded by torch.profiler (nested calls counted too) "
        f"per step, mean of {args.steps} profiled steps.",
        "",
        "| model | params | step, CPU time (ms) | ops per step "
        "| profiler self time per step (ms, wall clock: includes waits for a core) |",
        "|---|---|---|---|---|",
    ]
    tables = []
    for (step, label, params), seconds in zip(models, best):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                step()
        events = prof.key_averages()
        aten = [e for e in events if e.key.startswith("aten::")]
        ops = sum(e.count for e in aten) / args.steps
        total_self_ms = sum(e.self_cpu_time_total for e in events) / 1e3 / args.steps
        lines.append(f"| {label} | {params / 1e6:.2f}M | {seconds * 1e3:.1f} | {ops:.0f} | {total_self_ms:.1f} |")
        top = sorted(aten, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.top]
        rows = [f"### {label}: top {args.top} ops by self CPU time", "",
                "| op | calls per step | self ms per step | share of self time |", "|---|---|---|---|"]
        for e in top:
            rows.append(f"| `{e.key}` | {e.count / args.steps:.0f} | {e.self_cpu_time_total / 1e3 / args.steps:.2f} | "
                        f"{e.self_cpu_time_total / 1e3 / args.steps / total_self_ms:.0%} |")
        tables.append("\n".join(rows))
    ratio = ", ".join(f"{models[i][1]} {best[i] / best[0]:.2f}" for i in range(1, len(models)))
    lines += ["", f"Step time of each baseline over RegularGPT's (> 1: RegularGPT faster): {ratio}.", ""]
    atomic_write_text(args.out, "\n".join(lines) + "\n" + "\n\n".join(tables) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
