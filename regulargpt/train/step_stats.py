"""The training loss and gradient norm, summed on the device between two metrics records and read once per record.

    stats = StepStats(device)
    stats.add(loss, grad_norm)                 # every optimizer step: device adds, no host read
    loss, norm = stats.read(reduce, world)     # every record: one all-reduce and one host read

``read`` returns the mean over the steps since the previous record and over the ranks::

    loss = Σ_ranks Σ_steps loss(step) / (steps · world)          (non-finite when a step of the window had a NaN loss)
    norm = Σ_ranks Σ_steps norm(step) / (norms · world)          (steps with a norm only; None when there were none)

With ``train.log_every = 1`` this is each step's rank-mean loss, as the loop logged before it stopped reading the
loss every micro-batch. Sums are float64, so a window of fp32 losses adds without rounding of its own.
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["StepStats"]


class StepStats:
    """On-device sums of the window's losses and gradient norms (see the module doc)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._reset()

    def _reset(self) -> None:
        self.sums = torch.zeros(2, dtype=torch.float64, device=self.device)  # (loss sum, norm sum)
        self.steps, self.norms = 0, 0

    def add(self, loss: torch.Tensor, grad_norm: torch.Tensor | float | None) -> None:
        """Add one optimizer step's loss (a device scalar) and, unless None, its global gradient norm."""
        self.sums[0] += loss.detach().to(torch.float64)
        self.steps += 1
        if grad_norm is not None:
            self.sums[1] += grad_norm.detach().to(torch.float64) if torch.is_tensor(grad_norm) else grad_norm
            self.norms += 1

    def read(self, reduce: Callable[[torch.Tensor], torch.Tensor], world: int) -> tuple[float, float | None]:
        """→ (mean loss, mean grad norm or None) of the window over all ranks; starts the next window. Every rank
        calls it at the same step (`reduce` sums a tensor over the ranks in place)."""
        if self.steps == 0:
            raise ValueError("StepStats.read: no step was added since the previous read")
        loss_sum, norm_sum = reduce(self.sums).tolist()  # the record's one host read
        loss = loss_sum / (self.steps * world)
        norm = norm_sum / (self.norms * world) if self.norms else None
        self._reset()
        return loss, norm
