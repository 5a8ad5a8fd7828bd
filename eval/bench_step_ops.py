"""Count the ATen calls of one training step (forward + loss + backward + AdamW step), as eval/bench_train.py steps.

A `TorchDispatchMode` sees every ATen op the step dispatches; the bench reports the total, the top-20 ops and the
issue-50 targets (T = 512, base config): ≤ 16 aten.cat, ≤ 1 aten.clone, 0 slice_backward, ≤ 1,800 ATen calls.
Op counts depend on depth, T, chunk size and algorithm, not on width or batch, so `--set model.d_model=64` and
`--batch 1` give the base config's counts on a CPU. The attention runs `auto`, which on CPU is the fused C++
operator (`cpp`) and AdamW runs foreach as on CUDA: like CUDA's Triton kernel, one fused op per forward and per backward call, so the op structure
matches the CUDA path. Worked example: a module doing `torch.cat([a, b]).clone().clone()` counts cat 1, clone 2.

    python eval/bench_step_ops.py --set model.d_model=64 --set model.n_heads=2 --out results/bench_step_ops.md
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from regulargpt.files import atomic_write_text  # noqa: E402
from regulargpt.train.lm_loss import lm_loss  # noqa: E402

TARGETS = {"aten.cat": 16, "aten.clone": 1, "aten.slice_backward": 0, "total": 1800}


class OpCounter(TorchDispatchMode):
    """Counts ATen overload packets dispatched inside the `with` block: counts["aten.cat"] etc."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.counts[str(func.overloadpacket).replace("aten::", "aten.")] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], Any]) -> collections.Counter[str]:
    """ATen op counts of one call of `fn`."""
    with OpCounter() as counter:
        fn()
    return counter.counts


def forward_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The trainer's loss (regulargpt.train.lm_loss) of `tokens` (B, T + 1)."""
    return lm_loss(model(tokens[:, :-1]), tokens[:, 1:])


def training_step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> Callable[[], None]:
    """One step as the trainer takes it: forward, its loss, zero_grad, backward, optimizer step."""
    def step() -> None:
        loss = forward_loss(model, tokens)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def main() -> None:
    from regulargpt.config import load_config
    from regulargpt.model import build_model
    from regulargpt.provenance import git_commit
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/base.json")
    parser.add_argument("--set", action="append", default=[], help="key=value override")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--graph-breaks", action="store_true", help="also torch._dynamo.explain the forward + loss")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    overrides = list(args.set) + ([f"data.seq_len={args.seq_len}"] if args.seq_len else [])
    cfg = load_config(args.config, overrides)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)  # as engine.py on CUDA
    tokens = torch.randint(0, cfg.model.vocab_size, (args.batch, cfg.data.seq_len + 1))
    step = training_step(model, opt, tokens)
    step()  # warm-up: AdamW state allocation is not a per-step cost
    counts = count_ops(step)
    total = sum(counts.values())
    measured = {"aten.cat": counts["aten.cat"], "aten.clone": counts["aten.clone"],
                "aten.slice_backward": counts["aten.slice_backward"], "total": total}
    lines = ["# ATen calls of one training step", "", f"Command: `python {' '.join(sys.argv)}`  ",
             f"Git commit: {git_commit()}  ", f"T = {cfg.data.seq_len}, batch {args.batch}, attention `auto` "
             "(CPU: fused C++ operator, the same one-op-per-call structure as CUDA's Triton kernel)", "",
             "| count | measured | target | met |", "|---|---|---|---|"]
    lines += [f"| {k} | {v} | ≤ {TARGETS[k]} | {'met' if v <= TARGETS[k] else 'not met'} |" for k, v in measured.items()]
    if args.graph_breaks:
        from torch import _dynamo

        explained = _dynamo.explain(lambda t: forward_loss(model, t))(tokens)
        reasons = "; ".join(str(r.reason) for r in explained.break_reasons) or "none"
        lines += [f"| graph breaks (forward + loss, torch._dynamo.explain) | {explained.graph_break_count} | 0 | "
                  f"{'met' if explained.graph_break_count == 0 else 'not met'}: {reasons} |"]
    lines += [f"| aten.copy_ | {counts['aten.copy_']} | - | - |", "", "| op | calls |", "|---|---|"]
    lines += [f"| {op} | {n} |" for op, n in counts.most_common(20)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
