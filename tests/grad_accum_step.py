"""One optimizer step with grad_accum = 4 against one step on the 4× micro-batch, through DeepSpeed on CPU.

    python tests/grad_accum_step.py ZERO_STAGE [ZERO_STAGE ...]   → one JSON line per stage

Both runs start from the same weights and see the same 8 sequences: the accumulated run as 4 micro-batches of 2
(`StepRunner.run` draws micro-batch i from ``sampler.batch(step, i)``), the plain run as one batch of 8. DeepSpeed
divides each micro-batch loss by grad_accum, so Σ_i ∇(loss_i / 4) = ∇ mean over the 8 sequences, and the two
updates (AdamW, one step) must agree to float rounding. The line reports the largest weight difference, the
largest update (a scale for it), both step losses and both gradient norms; the accumulated run's validation loss
next to F.cross_entropy of its val batch computed here; and a step whose loss is made NaN
(REGULARGPT_INJECT_NAN=loss@1): whether it was skipped, whether any weight moved, and how far the LR schedule
advanced (1: lr stays a function of the step count). Run by tests/test_grad_accum.py (one process: one
``deepspeed`` import for every stage).
"""

from __future__ import annotations

import json
import os
import sys

import torch

SEQUENCES, ACCUM, LENGTH, VOCAB = 8, 4, 12, 37


class FixedSampler:
    """``batch(step, micro)`` → the micro-th slice of `per_step` rows of a fixed (SEQUENCES, LENGTH + 1) batch."""

    def __init__(self, data: torch.Tensor, per_step: int) -> None:
        self.data, self.per_step = data, per_step

    def batch(self, step: int, micro: int = 0) -> torch.Tensor:
        return self.data[micro * self.per_step:(micro + 1) * self.per_step].clone()


def one_step(stage: int, accum: int, data: torch.Tensor, nan: bool = False) -> dict:
    from regulargpt.config import load_config
    from regulargpt.model import build_model
    from regulargpt.train.engine import build_engine
    from regulargpt.train.lm_step import StepRunner
    from regulargpt.train.stopping import StopRequest

    import torch.distributed as dist

    per_step = SEQUENCES // accum
    cfg = load_config("configs/tiny/regular_gpt.json", [
        f"model.vocab_size={VOCAB}", "model.d_model=16", "model.n_heads=2", "model.chunk_size=2",
        "model.thickness=2", f"data.seq_len={LENGTH}", f"train.batch_size={per_step}", f"train.grad_accum={accum}",
        f"train.zero_stage={stage}", "train.lr=0.01", "train.grad_clip=1000.0"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    engine, scheduler, _, optimizer = build_engine(cfg, model, world_size=1)
    sampler = FixedSampler(data, per_step)
    if nan:
        os.environ["REGULARGPT_INJECT_NAN"] = "loss@1"
    steps = StepRunner(cfg, engine, optimizer, scheduler, sampler, sampler, 0, 1, dist)
    os.environ.pop("REGULARGPT_INJECT_NAN", None)
    epoch = scheduler.last_epoch
    loss, skipped, *_ = steps.run(0, StopRequest())
    out = {"weights": {name: p.detach().clone() for name, p in engine.module.named_parameters()},
           "loss": float(loss), "skipped": bool(skipped), "lr_steps": scheduler.last_epoch - epoch,
           "grad_norm": None if steps.grad_norm is None else float(steps.grad_norm)}
    if not nan:
        out["val"] = steps.validate()
        with torch.no_grad():
            batch = data[:per_step]
            out["val_expected"] = float(torch.nn.functional.cross_entropy(
                engine.module(batch[:, :-1]).flatten(0, 1).float(), batch[:, 1:].flatten()))
    return out


def main(stages: list[int]) -> None:
    os.environ.update(DS_ACCELERATOR="cpu", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
    from helpers import free_port
    from regulargpt.train.engine import skip_shm_build

    os.environ["MASTER_PORT"] = str(free_port())
    skip_shm_build()
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    torch.manual_seed(1)
    data = torch.randint(0, VOCAB, (SEQUENCES, LENGTH + 1))
    for stage in stages:
        torch.manual_seed(0)
        initial = {n: p.detach().clone() for n, p in _initial_model().named_parameters()}
        accumulated, whole = one_step(stage, ACCUM, data), one_step(stage, 1, data)
        poisoned = one_step(stage, ACCUM, data, nan=True)
        a, w = accumulated["weights"], whole["weights"]
        print(json.dumps({
            "stage": stage, "max_diff": max((a[n] - w[n]).abs().max().item() for n in w),
            "max_update": max((w[n] - initial[n]).abs().max().item() for n in w),
            "loss_accum": accumulated["loss"], "loss_whole": whole["loss"],
            "grad_norm_accum": accumulated["grad_norm"], "grad_norm_whole": whole["grad_norm"],
            "val": accumulated["val"], "val_expected": accumulated["val_expected"],
            "nan_skipped": poisoned["skipped"], "nan_lr_steps": poisoned["lr_steps"],
            "nan_moved": max((poisoned["weights"][n] - initial[n]).abs().max().item() for n in w)}), flush=True)


def _initial_model() -> torch.nn.Module:
    from regulargpt.config import load_config
    from regulargpt.model import build_model

    cfg = load_config("configs/tiny/regular_gpt.json", [
        f"model.vocab_size={VOCAB}", "model.d_model=16", "model.n_heads=2", "model.chunk_size=2",
        "model.thickness=2", f"data.seq_len={LENGTH}"])
    return build_model(cfg.model)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main([int(a) for a in sys.argv[1:]])
