"""Benchmark: training tokens/s, MFU and peak memory of RegularGPT against the dense baselines.

Each config runs in a fresh subprocess: build the model from the config, then `--steps` timed optimizer steps
(forward, backward, AdamW) on random tokens of the config's training length, after `--warmup` untimed steps. MFU =
flops_per_token(T) × tokens/s ÷ peak, with the peak FLOP/s the higher of two readings, before and after the runs
(the best of square matmuls over 3 s in the same dtype and threads, `bench_attention.matmul_peak_gflops`). Every
model is measured in `--rounds` passes over the whole list and keeps its fastest.
RegularGPT (K·ceil(log_C T) applications of K layers of weights) is compared with every dense baseline
(`--baselines`) built from the same config with, by `--match`: as many layers as RegularGPT has layer applications
(`applications`, the default: equal work per token, ~K·L/K = L times RegularGPT's layer weights), as many layers as
it has layers of weights (`parameters`: equal parameters, L times less work), or both. Each step is timed in two
parts, forward + backward and the optimizer step, so the share of a speed-up that comes from updating fewer
parameters is visible.

    python eval/bench_train.py --out results/bench_train.md
    python eval/bench_train.py --configs configs/tiny/regular_gpt.json --baselines alibi,rope --steps 5
    python eval/bench_train.py --configs configs/base.json --baselines alibi --match both --out /tmp/b.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_attention import matmul_peak_gflops  # noqa: E402  (sibling script)

from regulargpt.cli import positive_int  # noqa: E402
from regulargpt.config import load_config  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.provenance import git_commit, machine, utc_date  # noqa: E402

_WORKER = textwrap.dedent(
    """
    import json, sys, time, torch
    import torch.nn.functional as F
    from regulargpt.config import load_config
    from regulargpt.model import build_model, adaptive_depth, ATTENTION_BIASES
    from regulargpt.model.sliding_dilated import choose_algorithm
    from regulargpt.model.dense_attention import attention_backend
    path, steps, warmup, batch, threads, dtype = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
    overrides, device, compile_model = json.loads(sys.argv[7]), sys.argv[8], sys.argv[9] == "1"
    cuda = device == "cuda"
    def sync():
        if cuda:
            torch.cuda.synchronize()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = load_config(path, overrides)
    model = build_model(cfg.model).to(device)
    if compile_model:
        model.compile()  # as train.compile; the warm-up steps compile
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t, vocab = cfg.data.seq_len, cfg.model.vocab_size
    amp = dtype == "bf16"
    def status_kib(field):
        return int(next(l for l in open("/proc/self/status") if l.startswith(field + ":")).split()[1])
    def step():
        # one optimizer step -> (forward + backward seconds, optimizer seconds)
        tokens = torch.randint(0, vocab, (batch, t + 1), device=device)
        sync()
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
            logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sync()
        middle = time.perf_counter()
        opt.step()
        sync()
        return middle - start, time.perf_counter() - middle
    for _ in range(warmup):
        step()
    times = [step() for _ in range(steps)]
    fwd_bwd_s, optimizer_s = (sum(x) / steps for x in zip(*times))
    seconds = fwd_bwd_s + optimizer_s
    memory_mib = torch.cuda.max_memory_allocated() / 2**20 if cuda else status_kib("VmHWM") / 1024
    m = cfg.model
    apps = m.thickness * adaptive_depth(t, m.chunk_size) if m.architecture == "regular_gpt" else m.n_layers
    tok_s = batch * t / seconds
    if m.architecture == "regular_gpt":  # the kernel `auto` picks at each depth step (dilation C**l)
        kinds = sorted({choose_algorithm(m.chunk_size, m.chunk_size**l, t, torch.bfloat16 if amp else torch.float32,
                                         device) for l in range(adaptive_depth(t, m.chunk_size))})
        attention = "sliding-dilated " + "+".join(kinds)
    else:
        attention = attention_backend(torch.device(device), t, t, m.position in ATTENTION_BIASES)
    print(json.dumps({"config": path + "".join(" --set " + o for o in overrides), "model": m.architecture + ("" if m.architecture == "regular_gpt" else "/" + m.position),
                      "T": t, "batch": batch, "layer_applications": apps, "params": model.num_parameters(),
                      "step_s": seconds, "fwd_bwd_s": fwd_bwd_s, "optimizer_s": optimizer_s, "tokens_per_s": tok_s,
                      "flops_per_token": model.flops_per_token(t), "attention": attention,
                      "peak_memory_mib": memory_mib}))
    """
)

BASELINES = ("alibi", "t5", "kerple_log", "kerple_power", "rope", "none", "sinusoidal")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="configs/tiny/regular_gpt.json,configs/base.json",
                        help="comma-separated config files (default: %(default)s)")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help="positions of the dense baselines run beside every RegularGPT config, with as many "
                             "layers as its layer applications; '' for none (default: %(default)s)")
    parser.add_argument("--match", choices=["applications", "parameters", "both"], default="applications",
                        help="dense baselines get RegularGPT's number of layer applications, of layers of weights "
                             "(K), or one of each (default: %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=5, help="timed steps per config (default: 5)")
    parser.add_argument("--warmup", type=positive_int, default=2, help="untimed steps first (default: 2)")
    parser.add_argument("--batch", type=positive_int, default=8, help="sequences per step for tiny configs (default: 8)")
    parser.add_argument("--base-batch", type=positive_int, default=1, help="sequences per step for configs with d >= 512")
    parser.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16", help="autocast dtype (default: bf16)")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the attention runs FlexAttention (algorithm auto); memory = peak allocated")
    parser.add_argument("--compile", action="store_true",
                        help="compile every model (nn.Module.compile, as train.compile) before its warm-up steps")
    parser.add_argument("--rounds", type=positive_int, default=2,
                        help="run the whole list this many times and keep each model's fastest round, so that a slow "
                             "spell of a shared machine does not land on one model only (default: 2)")
    parser.add_argument("--out", type=Path, default=Path("results/bench_train.md"))
    args = parser.parse_args()

    peaks = [matmul_peak_gflops(args.device, args.dtype, args.threads)]
    print(f"matmul peak: {peaks[0]:.0f} GFLOP/s ({args.dtype}, {args.threads} threads)", flush=True)
    rows: list[dict] = []  # one per model: its fastest round

    def run(path: str, overrides: list[str], basis: str = "-") -> dict | None:
        big = load_config(path).model.d_model >= 512
        batch = args.base_batch if big else args.batch
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        cmd = [sys.executable, "-c", _WORKER, path, str(args.steps), str(args.warmup), str(batch), str(args.threads),
               args.dtype, json.dumps(overrides), args.device, "1" if args.compile else "0"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"{path}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
            return None
        row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "basis": basis, "source": path}
        print(json.dumps(row), flush=True)
        same = next((i for i, r in enumerate(rows) if r["config"] == row["config"]), None)
        if same is None:
            rows.append(row)
        elif row["tokens_per_s"] > rows[same]["tokens_per_s"]:
            rows[same] = row
        return row

    for _ in range(args.rounds):
        for path in args.configs.split(","):
            row = run(path, [])
            if row and row["model"] == "regular_gpt":  # each baseline at equal applications and/or parameters
                layers = {"applications": row["layer_applications"], "parameters": load_config(path).model.thickness}
                for basis in (["applications", "parameters"] if args.match == "both" else [args.match]):
                    for position in filter(None, args.baselines.split(",")):
                        run(path, ["model.architecture=transformer", f"model.position={position}",
                                   f"model.n_layers={layers[basis]}"], basis)
    peaks.append(matmul_peak_gflops(args.device, args.dtype, args.threads))
    peak = max(peaks)

    def regular_gpt_over(row: dict) -> str:
        """RegularGPT's tokens/s over this row's: the RegularGPT config this baseline was built from."""
        ref = next((r for r in rows if r["model"] == "regular_gpt" and r["source"] == row["source"]), None)
        return f"{ref['tokens_per_s'] / row['tokens_per_s']:.2f}" if ref else "-"

    lines = [
        f"# Training throughput ({args.dtype} autocast, AdamW, plain torch step{', compiled' if args.compile else ''})",
        "",
        f"Command: `python {' '.join(sys.argv)}`  ",
        f"Git commit: {git_commit()}  ",
        f"Machine: {machine()}, torch threads {args.threads}, device {args.device}  ",
        f"Date: {utc_date()}  ",
        f"{args.steps} timed steps after {args.warmup} warm-up steps, random tokens; each model's fastest of "
        f"{args.rounds} rounds over the whole list. MFU against the {args.dtype} matmul peak, **{peak:.3g} GFLOP/s** "
        f"(the higher of {peaks[0]:.3g} measured before and {peaks[1]:.3g} after the runs). "
        "Peak memory: RSS (VmHWM) on CPU, allocated on CUDA. "
        "'RegularGPT / this' = RegularGPT's tokens/s over this model's (the RegularGPT row of the same config). "
        "'equal' says what the baseline shares with RegularGPT: `applications` = as many layers as RegularGPT's "
        "K·ceil(log_C T) layer applications (the same work per token, ceil(log_C T)× its layer weights: AdamW "
        "updates that many more parameters); `parameters` = K layers (its weights, 1/ceil(log_C T) of its work). Step = "
        "forward + backward (with zero_grad) + optimizer step, each timed on its own.",
        "",
        "| config | model | equal | T | batch | layer applications | params | step (s) | fwd+bwd (s) | optimizer (s) "
        "| tokens/s | MFU | peak memory (MiB) | RegularGPT / this |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['config']} | {r['model']} | {r['basis']} | {r['T']} | {r['batch']} | "
                     f"{r['layer_applications']} | {r['params'] / 1e6:.2f}M | {r['step_s']:.3f} | "
                     f"{r['fwd_bwd_s']:.3f} | {r['optimizer_s']:.3f} | {r['tokens_per_s']:.0f} | "
                     f"{r['flops_per_token'] * r['tokens_per_s'] / (peak * 1e9):.1%} | "
                     f"{r['peak_memory_mib']:.0f} | {regular_gpt_over(r)} |")
    atomic_write_text(args.out, "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
