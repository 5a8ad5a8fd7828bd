"""Catching a diverged language-model run, and which checkpoint it can resume from.

**The guard.** A language model's loss starts near ln V, the cross-entropy of a uniform prediction over the V
tokens of its vocabulary (ln 2048 = 7.62), and only falls from there. A recorded training loss above
``train.divergence_factor`` × ln V (default 2: 15.2 for V = 2048, 12.5 for V = 512) means the weights have blown
up (lr 1.0 on the tiny config: 6.2 → 27.5 at step 2); the run stops with exit status 2 instead of training on and
exporting a useless model (``train.divergence_factor=0`` turns the guard off). Non-finite steps are the other
guard (skipped, at most ``train.max_bad_steps``: :mod:`regulargpt.train.loop`), and a run whose last step has a
non-finite loss never writes ``model.pt``.

**The last good checkpoint.** The weights saved at step s are first used by step s + 1, so a checkpoint is only
known good once a later record shows a finite loss within the limit (:meth:`DivergenceGuard.seen`). Until then it
is *unverified*; the newest good one is kept through ``keep_last`` pruning (:attr:`DivergenceGuard.good_step`).
When the run stops, the unverified checkpoints (saved after the weights went bad) are set aside as
``global_step<N>.diverged`` and ``latest`` names the good one, or is removed when there is none, so the advised
command resumes from good weights, or starts again::

    guard = DivergenceGuard(2.0, vocab_size=512, start_step=0)
    guard.saved(3); guard.seen(5.9)      # checkpoint 3 is good: a loss after it was 5.9 < 12.48
    guard.saved(6); guard.diverged(27.5) # True: the advice resumes from global_step3; global_step6 is set aside

**The advice** (:func:`lower_lr_command`): the command that started the run, plus ``--set train.lr=X
--allow-changed train.lr`` with X a tenth of the rate that diverged and at most 3e-4 (the rate of GPT-2-sized
Adam runs): the resume takes the optimizer's rate from the config, and ``changes.jsonl`` records the change.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from regulargpt import run_directory as rd

__all__ = ["SAFE_LR", "DivergenceGuard", "lower_lr_command", "keep_good_checkpoints"]

SAFE_LR = 3e-4  # the highest rate the advice suggests


class DivergenceGuard:
    """The loss limit and the newest checkpoint known good (see the module doc)."""

    def __init__(self, factor: float, vocab_size: int, start_step: int) -> None:
        self.factor, self.uniform = factor, math.log(vocab_size)
        self.limit = factor * self.uniform if factor > 0 else math.inf
        self.good_step: int | None = start_step if start_step > 0 else None  # a resumed run starts from good weights
        self.unverified: list[int] = []

    def saved(self, step: int) -> None:
        """A checkpoint of step `step` was written; nothing has been trained on its weights yet."""
        self.unverified.append(step)

    def seen(self, loss: float) -> None:
        """A record's window loss: finite and within the limit, it vouches for every checkpoint saved before it."""
        if math.isfinite(loss) and loss <= self.limit and self.unverified:
            self.good_step, self.unverified = self.unverified[-1], []

    def diverged(self, loss: float) -> bool:
        return math.isfinite(loss) and loss > self.limit

    def describe(self, loss: float) -> str:
        """e.g. ``training loss 27.52 is above 2 × ln V = 12.48 (train.divergence_factor=2; ln V = ln 512 is the
        loss of a uniform prediction)``."""
        return (f"training loss {loss:.2f} is above {self.factor:g} × ln V = {self.limit:.2f} "
                f"(train.divergence_factor={self.factor:g}; ln V = ln {round(math.exp(self.uniform))} is the loss "
                f"of a uniform prediction)")


def keep_good_checkpoints(run_dir: Path, good_step: int | None) -> str:
    """Set aside every checkpoint newer than `good_step` as ``global_step<N>.diverged`` and point ``latest`` at
    `good_step` (remove it when None) → one clause for the stop message, e.g. "the last good checkpoint is
    global_step3 in runs/a (global_step6 set aside as global_step6.diverged)"."""
    aside = []
    for step in rd.checkpoint_steps(run_dir):
        if good_step is None or step > good_step:
            aside.append(rd.set_aside(run_dir / f"global_step{step}", suffix="diverged").name)
    if good_step is not None:
        rd.mark_latest(run_dir, good_step)
    else:
        (run_dir / "latest").unlink(missing_ok=True)
    moved = f" ({', '.join(aside)} set aside: saved after the weights went bad)" if aside else ""
    if good_step is None:
        return f"no checkpoint of {run_dir} predates the divergence{moved}, so the run starts again from step 0"
    return f"the last good checkpoint is global_step{good_step} in {run_dir}{moved}"


def lower_lr_command(command: str, lr: float) -> str:
    """`command` (as :func:`regulargpt.train.stopping.launch_command` gives it) with a lower rate: ``--set
    train.lr=X --allow-changed train.lr``, X = min(lr / 10, :data:`SAFE_LR`) printed to 3 significant digits,
    e.g. lr 1.0 → 0.0003, lr 0.001 → 0.0001."""
    lower = min(lr / 10, SAFE_LR)
    return f"{command} " + shlex.join(["--set", f"train.lr={lower:.3g}", "--allow-changed", "train.lr"])
