"""One optimizer step of the language-model trainer, and validation, with one host read per step.

    steps = StepRunner(cfg, engine, optimizer, scheduler, sampler, val_sampler, rank, world, dist)
    loss, skipped, signalled, orphaned = steps.run(step, stop)   # grad_accum micro-batches → engine.step()
    steps.grad_norm                                              # that step's global gradient norm (device) or None
    val_loss = steps.validate()                                  # eval_batches fixed val batches, rank mean
    steps.validate_corpora(corpora, val_samplers)                # + val_loss/<corpus> for a mixture (data.paths)
    steps.drawn(corpora)                                         # a mixture's sequences/<corpus> so far, all ranks

A step sums its micro-batch losses on the device; after the last backward the count of non-finite losses (and, for
ZeRO-0 fp32, where DeepSpeed keeps no norm, a non-finite gradient norm) and the two stop requests (a signal; a
launcher gone) are all-reduced as one device tensor, which :class:`~regulargpt.train.engine.GuardedAdamW` reads,
with the DeepSpeed wrapper's global-norm verdict, when DeepSpeed calls its ``step``: it skips the update when any is
set (the step reads the tensor itself when a DeepSpeed wrapper skipped that call). A skipped step changes no weight
and no optimizer state, and the LR schedule still advances with the step count.
"""

from __future__ import annotations

from typing import Any

import torch

from regulargpt.config import Config
from regulargpt.train.faults import nan_plan, poison
from regulargpt.train.lm_data import Corpus
from regulargpt.train.lm_loss import lm_loss
from regulargpt.train.stopping import StopRequest

__all__ = ["StepRunner"]


class StepRunner:
    """Optimizer steps and validation on one rank of `world`, through the DeepSpeed `engine`."""

    def __init__(self, cfg: Config, engine: Any, optimizer: Any, scheduler: Any, sampler: Any, val_sampler: Any,
                 rank: int, world: int, dist: Any) -> None:
        self.cfg, self.engine, self.optimizer, self.scheduler = cfg, engine, optimizer, scheduler
        self.sampler, self.val_sampler, self.world, self.dist = sampler, val_sampler, world, dist
        self.device = engine.device
        # ZeRO-0 fp32 hands DeepSpeed our torch AdamW unwrapped; DeepSpeed then clips without keeping the norm.
        self._plain_optimizer = optimizer.wrapper is None
        self.grad_norm: torch.Tensor | float | None = None
        self.nan_plan = nan_plan(rank, world)  # test-only fault injection; {} unless REGULARGPT_INJECT_NAN

    def _loss(self, batch: torch.Tensor, fault: str | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy of one micro-batch; `fault` is the test-only NaN injection (faults.py)."""
        if self.device.type == "cuda":
            batch = batch.pin_memory()  # a copy from pageable memory would wait for the device
        batch = batch.to(self.device, non_blocking=True)
        logits, factor = poison(fault, self.engine(batch[:, :-1]))  # (B, T, V)
        return factor * lm_loss(logits, batch[:, 1:])

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over the ranks, in place, on this rank's device (no host round trip); returns it."""
        if self.world > 1:
            self.dist.all_reduce(t)
        return t

    def _flag(self, value: bool) -> torch.Tensor:
        return torch.full((), float(value), device=self.device)  # a fill on the device, not a host copy

    @torch.no_grad()
    def validate(self, sampler: Any = None) -> float:
        """Mean loss of the first ``eval_batches`` batches of `sampler` (default: the val sampler), over ranks."""
        sampler = self.val_sampler if sampler is None else sampler
        self.engine.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for i in range(self.cfg.train.eval_batches):
            total += self._loss(sampler.batch(i)).to(torch.float64)
        self.engine.train()
        return self.reduce(total).item() / (self.cfg.train.eval_batches * self.world)

    def validate_corpora(self, corpora: list[Corpus], samplers: list[Any]) -> dict[str, float]:
        """{"val_loss": :meth:`validate`}; for a mixture also ``val_loss/<corpus>`` (`samplers[k]` over corpus k's
        val split) and val_loss = Σ w_k · val_loss_k, e.g. 0.75 · 5.93 + 0.25 · 5.98 = 5.94."""
        if len(corpora) == 1:
            return {"val_loss": self.validate(samplers[0])}
        losses = {c.name: self.validate(s) for c, s in zip(corpora, samplers)}
        return {"val_loss": sum(c.weight * losses[c.name] for c in corpora),
                **{f"val_loss/{name}": v for name, v in losses.items()}}

    def drawn(self, corpora: list[Corpus]) -> dict[str, int]:
        """A mixture's sequences drawn from each corpus since the run began, over all ranks (every rank calls it:
        one all-reduce), as metrics keys ``sequences/<corpus>``, also kept for the next checkpoint
        (MixtureSampler.record_totals); {} for one folder."""
        if len(corpora) == 1:
            return {}
        local = torch.as_tensor(self.sampler.drawn, dtype=torch.int64).to(self.device)
        totals = self.sampler.record_totals(self.reduce(local).tolist())
        return {f"sequences/{c.name}": n for c, n in zip(corpora, totals)}

    def run(self, step: int, stop: StopRequest) -> tuple[torch.Tensor, bool, bool, bool]:
        """Optimizer step `step` + 1 (grad_accum micro-batches; `step` steps are done) → (this rank's mean loss, a
        device scalar; whether the step was skipped; whether a rank was signalled to stop; whether a rank's launcher
        is gone), the last three agreed by every rank. One host read (see the module docstring).

        Sets ``self.grad_norm`` (a device scalar, DeepSpeed's value, or None). A skipped step changes no weight and
        no optimizer state.
        """
        accum, opt = self.cfg.train.grad_accum, self.optimizer
        fault = self.nan_plan.get(step + 1)
        lr_epoch = self.scheduler.last_epoch
        opt.fired, opt.read, self.grad_norm = False, None, None
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(accum):
            loss = self._loss(self.sampler.batch(step, micro), fault if micro == 0 else None)
            loss_sum = loss_sum + loss.detach().float()
            self.engine.backward(loss)
            if micro == accum - 1:
                bad = (~torch.isfinite(loss_sum)).float()
                if self._plain_optimizer:  # DeepSpeed records no norm here: take it pre-clipping (grads all-reduced)
                    grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
                    self.grad_norm = torch.nn.utils.get_total_norm(grads) if grads else None
                    if self.grad_norm is not None:  # the same on every rank
                        bad = bad + (~torch.isfinite(self.grad_norm)).float()
                requested, by_signal = stop.requested, stop.by_signal  # (a signal may arrive later: next step)
                opt.flags = self.reduce(torch.stack([bad, self._flag(requested and by_signal),
                                                     self._flag(requested and not by_signal)]))
            self.engine.step()
        flags = opt.read if opt.read is not None else opt.flags.tolist()  # read by opt.step unless DeepSpeed skipped it
        opt.flags = None
        bad_ranks, signalled, orphaned = flags[:3]
        if not self._plain_optimizer and not bad_ranks:
            self.grad_norm = self.engine.get_global_grad_norm()
        skipped = bad_ranks > 0 or opt.fired or not self.engine.was_step_applied()
        if skipped and self.scheduler.last_epoch == lr_epoch:
            self.scheduler.step()  # DeepSpeed steps the schedule only after an applied update; keep lr = f(step)
        return loss_sum / accum, skipped, signalled > 0, orphaned > 0
