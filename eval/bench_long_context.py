"""Long-context training step: RegularGPT (adaptive depth and depth_policy train) against ALiBi and a causal
flash-attention yardstick at T = 16k, 32k, 64k, timed against the FLOP ratio (docs/LONG_CONTEXT.md).

    python eval/bench_long_context.py --device cuda --lengths 16384,32768,65536 --out X.md --jsonl X.jsonl
    python eval/bench_long_context.py --flops-only                        # the FLOP table, nothing is run
    python eval/bench_long_context.py --device cpu --shrink --lengths 16384 --steps 3   # tiny width, same configs

Every config in --configs-dir whose data.seq_len is one of --lengths is a point; its role comes from the config:
regular_gpt (adaptive depth), regular_gpt_train (depth_policy train), alibi; "flash" is the ALiBi config with
model.position none, i.e. SDPA's causal kernel (FlashAttention-2 on CUDA in bf16). A point builds the model
directly (no DeepSpeed), as the config trains it: weights in the config's precision (bf16: the whole forward in
bf16, as DeepSpeed's bf16 mode), activation checkpointing on the Transformer layers when the config asks, the
chunked fp32 loss (regulargpt.train.lm_loss) and AdamW on fp32 master weights; then --warmup untimed steps and
--steps timed ones (CUDA events, wall clock on CPU), reporting the median. Peak memory is the allocator's peak on
CUDA, the process's high-water RSS (reset per point) on CPU, beside the plan (regulargpt.scale_plan, ZeRO-0, one
GPU). F_step is regulargpt.step_flops.step_flops; "FLOP ratio" = F_step(ALiBi) / F_step(this model), the
advantage at equal FLOP/s; "vs ALiBi" / "vs flash" = their measured step time / this model's; "share" =
vs ALiBi / FLOP ratio (target >= 0.8; and vs ALiBi >= 6 at 64k under depth_policy train).

Points run model by model in --models order, the longest length first, so that a budget cut falls on the shorter
lengths; an error or out-of-memory at one point, a point over --point-limit-s, and the points left when
--budget-s (seconds since start) is spent are rows, not crashes. Both outputs are rewritten after every point.
"""

from __future__ import annotations

import argparse
import gc
import json
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

START = time.monotonic()
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`

import torch  # noqa: E402

from regulargpt.cli import positive_int, run  # noqa: E402
from regulargpt.config import Config, ConfigError, load_config  # noqa: E402
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.model import build_model  # noqa: E402
from regulargpt.model import dense_attention  # noqa: E402
from regulargpt.model.sliding_dilated import choose_algorithm  # noqa: E402
from regulargpt.provenance import provenance  # noqa: E402
from regulargpt.scale_plan import GIB, estimate  # noqa: E402
from regulargpt.step_flops import step_flops  # noqa: E402
from regulargpt.train.engine import apply_activation_checkpointing  # noqa: E402
from regulargpt.train.lm_loss import lm_loss  # noqa: E402

ROLES = ("regular_gpt_train", "regular_gpt", "flash", "alibi")
SHRINK = ["model.d_model=32", "model.n_heads=2", "model.vocab_size=256", "model.n_layers=2", "model.thickness=2"]
FLASH = ["model.position=none"]


class PointTimeout(Exception):
    """Raised by the alarm when a point runs past its limit."""


def role_of(cfg: Config) -> str | None:
    """The bench role of a config, or None for one the bench does not time."""
    m = cfg.model
    if m.architecture == "regular_gpt" and m.head == "lm":
        return {"train": "regular_gpt_train", "adaptive": "regular_gpt"}.get(m.depth_policy)
    if m.architecture == "transformer" and m.head == "lm" and m.position == "alibi" and not m.window:
        return "alibi"
    return None


def discover(configs_dir: Path, lengths: list[int], overrides: list[str]) -> dict[tuple[str, int], tuple[str, Config]]:
    """{(role, T): (source, config)} for the configs of `configs_dir` at the requested lengths; "flash" from ALiBi.
    ConfigError when two files claim one point or a length has no ALiBi config (the ratios need it)."""
    if not configs_dir.is_dir():
        raise ConfigError(f"--configs-dir: {str(configs_dir)!r} is not a folder; expected one like configs/long")
    points: dict[tuple[str, int], tuple[str, Config]] = {}
    for path in sorted(configs_dir.glob("*.json")):
        cfg = load_config(path, overrides)
        role, t = role_of(cfg), cfg.data.seq_len
        if role is None or t not in lengths:
            continue
        if (role, t) in points:
            raise ConfigError(f"{path}: a second {role} config at T = {t} (first: {points[role, t][0]}); keep one")
        points[role, t] = (str(path), cfg)
        if role == "alibi":
            points["flash", t] = (f"{path} --set {FLASH[0]}", load_config(path, [*overrides, *FLASH]))
    for t in lengths:
        if ("alibi", t) not in points:
            raise ConfigError(f"--lengths: no ALiBi config at T = {t} in {configs_dir} (data.seq_len {t}); the FLOP "
                              f"ratios are against it")
    return points


def layer_applications(cfg: Config, length: int) -> int:
    m = cfg.model
    if m.architecture != "regular_gpt":
        return m.n_layers
    with torch.device("meta"):
        return m.thickness * build_model(m).stack.depth(length)


def attention_kind(cfg: Config, device: str) -> str:
    """The attention kernel a point runs: RegularGPT's algorithm at each depth step, else the dense backend."""
    m, t = cfg.model, cfg.data.seq_len
    dtype = torch.bfloat16 if cfg.train.precision == "bf16" else torch.float32
    if m.architecture == "regular_gpt":
        steps = layer_applications(cfg, t) // m.thickness
        kinds = {choose_algorithm(m.chunk_size, m.chunk_size**s, t, dtype, device) for s in range(steps)}
        return "+".join(sorted(kinds))
    backend = dense_attention.attention_backend(torch.device(device), t, t, m.position != "none")
    return "chunked (flex failed)" if backend == "chunked" and device == "cuda" else backend


class MasterAdamW:
    """AdamW on fp32 master copies of low-precision weights (what DeepSpeed's bf16 optimizer keeps): the step
    casts the gradients up, updates the masters and copies them back; fp32 weights are updated in place."""

    def __init__(self, params: list[torch.nn.Parameter], device: torch.device) -> None:
        self.params = params
        self.masters = [p.detach().float() if p.dtype != torch.float32 else p for p in params]
        self.opt = torch.optim.AdamW(self.masters, lr=1e-4, foreach=device.type == "cuda")

    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            if m is not p:
                m.grad = None if p.grad is None else p.grad.float()
        self.opt.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                if m is not p:
                    p.copy_(m)
                p.grad = None


def _reset_peak(cuda: bool) -> None:
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)
    except OSError:
        pass


def _peak_gib(cuda: bool) -> float:
    if cuda:
        return torch.cuda.max_memory_allocated() / GIB
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) * 1024 / GIB


def train_step(model: torch.nn.Module, opt: MasterAdamW, tokens: torch.Tensor) -> None:
    """One optimizer step on `tokens` (B, T + 1): forward, the chunked fp32 loss, backward, AdamW."""
    lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    opt.step()


def time_point(cfg: Config, device: torch.device, steps: int, warmup: int, row: dict[str, Any]) -> None:
    """Build the model of `cfg` and time `steps` training steps after `warmup`, filling `row` as steps finish (a
    point cut by its time limit keeps the steps it timed)."""
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.train.precision, torch.float32)
    model = build_model(cfg.model).to(device=device, dtype=dtype)
    if cfg.train.activation_checkpointing:
        apply_activation_checkpointing(model)
    opt = MasterAdamW(list(model.parameters()), device)
    t, b = cfg.data.seq_len, cfg.train.batch_size
    tokens = torch.randint(0, cfg.model.vocab_size, (b, t + 1), device=device)
    times: list[float] = []
    for _ in range(warmup):
        train_step(model, opt, tokens)
    for _ in range(steps):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            train_step(model, opt, tokens)
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3)
        else:
            begin_s = time.perf_counter()
            train_step(model, opt, tokens)
            times.append(time.perf_counter() - begin_s)
        row.update(steps_timed=len(times), step_s=statistics.median(times),
                   tokens_per_s=b * t / statistics.median(times))


def _on_alarm(signum: int, frame: Any) -> None:
    raise PointTimeout


def point_row(role: str, source: str, cfg: Config, device: str, status: str) -> dict[str, Any]:
    """The fields of a point's row known before it runs: T, batch, layer applications, F_step, the plan (ZeRO-0,
    one GPU: the bench's layout of weights, gradients and fp32 master/Adam states), attention kernel, status."""
    t = cfg.data.seq_len
    plan = estimate(cfg, 1, 0, device=device).total(cfg.train.activation_checkpointing) / GIB
    return {"T": t, "model": role, "config": source, "batch": cfg.train.batch_size,
            "layer_applications": layer_applications(cfg, t), "step_flops": step_flops(cfg), "plan_gib": plan,
            "steps_timed": 0, "attention": attention_kind(cfg, device), "status": status}


def run_point(role: str, source: str, cfg: Config, device: torch.device, steps: int, warmup: int,
              limit_s: float) -> dict[str, Any]:
    """One row: the timing, or the status of a failure, an out-of-memory or a timeout; memory freed after."""
    cuda = device.type == "cuda"
    row = point_row(role, source, cfg, device.type, "ok")
    _reset_peak(cuda)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(limit_s, 1e-3))
    try:
        time_point(cfg, device, steps, warmup, row)
    except PointTimeout:
        row["status"] = f"time limit of {limit_s:.0f} s after {row['steps_timed']} timed steps"
    except torch.OutOfMemoryError as err:
        row["status"] = f"OOM at {_peak_gib(cuda):.1f} GiB peak ({str(err).splitlines()[0][:80]})"
    except Exception as err:  # noqa: BLE001 (one point's failure is a row)
        first = str(err).splitlines()[0][:120] if str(err) else ""
        row["status"] = f"error: {type(err).__name__}: {first}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    row["peak_gib"] = _peak_gib(cuda)
    row["attention"] = attention_kind(cfg, device.type)  # again: a FlexAttention failure switches ALiBi to chunked
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return row


def add_ratios(rows: list[dict[str, Any]], points: dict[tuple[str, int], tuple[str, Config]]) -> None:
    """FLOP ratio against ALiBi at the same T, and the measured ratios against ALiBi and flash where both ran."""
    timed = {(r["model"], r["T"]): r.get("step_s") for r in rows}
    for r in rows:
        alibi_flops = step_flops(points["alibi", r["T"]][1])
        r["flop_ratio"] = alibi_flops / r["step_flops"]
        for name in ("alibi", "flash"):
            other, own = timed.get((name, r["T"])), r.get("step_s")
            r[f"vs_{name}"] = other / own if other and own else None
        r["share"] = r["vs_alibi"] / r["flop_ratio"] if r["vs_alibi"] is not None else None


def _num(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def markdown(rows: list[dict[str, Any]], header: list[str]) -> str:
    """The report: header lines, the table sorted by T and role, and the targets where the rows allow."""
    order = {name: i for i, name in enumerate(("regular_gpt", "regular_gpt_train", "alibi", "flash"))}
    out = [*header, "", "| T | model | batch | layer apps | attention | step ms | tokens/s | peak GiB | plan GiB | "
           "F_step | FLOP ratio | vs ALiBi | share | vs flash | status |", "|" + "---|" * 15]
    for r in sorted(rows, key=lambda r: (r["T"], order[r["model"]])):
        step_ms = None if r.get("step_s") is None else r["step_s"] * 1e3
        out.append(f"| {r['T']:,} | {r['model']} | {r['batch']} | {r['layer_applications']} | {r['attention']} | "
                   f"{_num(step_ms, ',.1f')} | {_num(r.get('tokens_per_s'), ',.0f')} | "
                   f"{_num(r.get('peak_gib'), '.2f')} | {r['plan_gib']:.2f} | {r['step_flops']:.3e} | "
                   f"{r['flop_ratio']:.2f} | {_num(r['vs_alibi'], '.2f')} | {_num(r['share'], '.2f')} | "
                   f"{_num(r['vs_flash'], '.2f')} | {r['status']} |")
    out += ["", "Targets: share >= 0.80 at every T (RegularGPT against ALiBi); vs ALiBi >= 6 at 65,536 under "
            "depth_policy train."]
    for r in sorted(rows, key=lambda r: (r["T"], order[r["model"]])):
        if r["model"].startswith("regular_gpt") and r["share"] is not None:
            met = r["share"] >= 0.8 and (r["model"] != "regular_gpt_train" or r["T"] != 65536 or r["vs_alibi"] >= 6)
            out.append(f"- {r['model']} at T = {r['T']:,}: {r['vs_alibi']:.2f}× ALiBi against a FLOP ratio of "
                       f"{r['flop_ratio']:.2f} (share {r['share']:.2f}): {'met' if met else 'missed'}.")
    return "\n".join(out) + "\n"


def flop_table(points: dict[tuple[str, int], tuple[str, Config]], lengths: list[int]) -> str:
    """F_step per model and length and the FLOP ratio against ALiBi (regulargpt.step_flops), nothing run."""
    out = ["| T | model | batch | layer apps | F_step | FLOP ratio (ALiBi ÷ model) |", "|---|---|---|---|---|---|"]
    for t in lengths:
        alibi = step_flops(points["alibi", t][1])
        for role in ("regular_gpt", "regular_gpt_train", "alibi", "flash"):
            if (role, t) in points:
                cfg = points[role, t][1]
                out.append(f"| {t:,} | {role} | {cfg.train.batch_size} | {layer_applications(cfg, t)} | "
                           f"{step_flops(cfg):.4e} | {alibi / step_flops(cfg):.2f} |")
    return "\n".join(out) + "\n"


def _lengths(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated lengths >= 1, e.g. 16384,32768")
    return values


def _models(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in ROLES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated subset of {', '.join(ROLES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default: cpu)")
    p.add_argument("--lengths", type=_lengths, default=[16384, 32768, 65536],
                   help="training lengths T, comma-separated (default: 16384,32768,65536)")
    p.add_argument("--configs-dir", type=Path, default=ROOT / "configs/long",
                   help="folder of the configs to time (default: configs/long)")
    p.add_argument("--models", type=_models, default=list(ROLES),
                   help=f"roles to run, in run order (default: {','.join(ROLES)})")
    p.add_argument("--steps", type=positive_int, default=3, help="timed steps per point, median (default: 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first, e.g. compilation (default: 1)")
    p.add_argument("--point-limit-s", type=float, default=40.0,
                   help="seconds one point may run before it becomes a 'time limit' row (default: 40)")
    p.add_argument("--budget-s", type=float, default=85.0,
                   help="seconds since start after which the remaining points are skipped rows (default: 85)")
    p.add_argument("--shrink", action="store_true",
                   help="tiny width and depth (" + " ".join(SHRINK) + ") for a CPU run of the same configs")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override for every config, e.g. --set data.seq_len=1024 (repeatable)")
    p.add_argument("--flops-only", action="store_true", help="print the FLOP table and stop (no model is run)")
    p.add_argument("--out", type=Path, help="write the report as markdown, e.g. --out long.md")
    p.add_argument("--jsonl", type=Path, help="write one JSON object per point, e.g. --jsonl long.jsonl")
    args = p.parse_args(argv)
    if args.warmup < 0 or args.point_limit_s <= 0 or args.budget_s < 0:
        raise ConfigError("--warmup must be >= 0, --point-limit-s > 0 and --budget-s >= 0; got "
                          f"{args.warmup}, {args.point_limit_s}, {args.budget_s}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to torch here; use --device cpu")
    points = discover(args.configs_dir, args.lengths, [*(SHRINK if args.shrink else []), *args.set])
    if args.flops_only:
        print(flop_table(points, args.lengths), end="")
        return 0
    device = torch.device(args.device)
    prov = provenance(" ".join(["python", "eval/bench_long_context.py", *(sys.argv[1:] if argv is None else argv)]))
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    header = [f"# Long-context training step ({name})", "", f"Command: `{prov['command']}`; commit {prov['commit']}, "
              f"{prov['date']}. Median of {args.steps} timed steps after {args.warmup} warm-up; budget "
              f"{args.budget_s:g} s, {args.point_limit_s:g} s per point."]
    order = [(role, t) for role in args.models for t in sorted(args.lengths, reverse=True) if (role, t) in points]
    rows: list[dict[str, Any]] = []
    for role, t in order:
        source, cfg = points[role, t]
        left = args.budget_s - (time.monotonic() - START)
        if left < 1.0:
            row = point_row(role, source, cfg, device.type, f"skipped: the {args.budget_s:g} s budget was spent")
        else:
            row = run_point(role, source, cfg, device, args.steps, args.warmup, min(args.point_limit_s, left))
        rows.append(row)
        add_ratios(rows, points)
        print(json.dumps(row), flush=True)
        if args.jsonl:
            atomic_write_text(args.jsonl, "".join(json.dumps(r) + "\n" for r in rows))
        if args.out:
            atomic_write_text(args.out, markdown(rows, header))
    print(markdown(rows, header), end="")
    return 0


if __name__ == "__main__":
    run(main)
