"""Receptive field by cumulative normalised input gradients (Chi et al. 2022b's tool, RegularGPT paper Figure 4).

For each sequence b of length T, with g_{b,t} = ‖∂ℓ_b/∂e_{b,t}‖₂ the gradient norm of the final prediction's loss
at input position t (:func:`regulargpt.evaluation.probes.input_gradient_norms`):

    n_{b,t} = g_{b,t} / Σ_s g_{b,s}                (normalised: sums to 1 over the sequence)
    c_{b,t} = Σ_{s ≥ t} n_{b,s}                    (accumulated from the last token backwards; c_{b,0} = 1)

and the curves are the batch means n̄_t, c̄_t. A steep slope of c̄ at t means the last prediction depends strongly
on position t. Example: a model that reads only its last 2 tokens equally has n̄ = (0, …, 0, ½, ½) and
c̄ = (1, …, 1, 1, ½). Covering the whole input (as regular languages need) is a straight line from (T−1, 1/T)
up to (0, 1); a local-window language model is a curve that reaches 1 within the window.

Inputs: a formal-language run gets task strings with their true labels; a language-model run gets random windows
of length T+1 from a data split (the first T tokens are the input, the last one the next-token target at the
final position), or uniform random tokens.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from regulargpt.config import Config, FormalConfig
from regulargpt.evaluation.probes import input_gradient_norms
from regulargpt.evaluation.plotting import pyplot
from regulargpt.files import atomic_savefig, atomic_write_text
from regulargpt.tasks import make_task

__all__ = ["ReceptiveField", "formal_batch", "lm_batch", "plot_receptive_field", "receptive_field", "write_csv"]


@dataclass(frozen=True)
class ReceptiveField:
    """Batch-mean curves over input positions 0..T−1 (numpy, float64)."""

    grad_norm: np.ndarray  # (T,) mean g_t (unnormalised)
    normalised: np.ndarray  # (T,) mean n_t; sums to 1
    cumulative: np.ndarray  # (T,) mean c_t; c[0] = 1, c[T−1] = normalised[T−1]
    sequences: int

    def reach(self, mass: float) -> int:
        """The fewest most-recent tokens that hold `mass` of the normalised gradient: min w with c[T−w] ≥ mass."""
        t = len(self.cumulative)
        return next(w for w in range(1, t + 1) if self.cumulative[t - w] >= mass - 1e-12)


def formal_batch(cfg: FormalConfig, length: int, samples: int, seed: int) -> tuple[Tensor, Tensor]:
    """`samples` strings of `length` from the run's task and their labels: (B, T), (B,)."""
    task = make_task(cfg.data.task, **cfg.data.task_options)
    return task.sample(samples, length, torch.Generator().manual_seed(seed))


def lm_batch(cfg: Config, length: int, samples: int, seed: int, split: str = "test", data_path: str | None = None,
             random_tokens: bool = False) -> tuple[Tensor, Tensor]:
    """Windows of length+1 tokens → (inputs (B, T), next-token targets at the last position (B,)).

    Windows start at uniform random offsets of the split (the run's data folder, a mixture's first, unless
    `data_path`), or are uniform random tokens in [0, vocab_size) when `random_tokens`.
    """
    rng = np.random.default_rng(seed)
    if random_tokens:
        windows = rng.integers(0, cfg.model.vocab_size, size=(samples, length + 1))  # (B, T+1)
    else:
        from regulargpt.data import open_split

        tokens = open_split(data_path or (cfg.data.folders or [""])[0], split, cfg.model.vocab_size).tokens
        if len(tokens) < length + 1:
            raise ValueError(f"split {split!r} has {len(tokens)} tokens; a window needs {length + 1}")
        starts = rng.integers(0, len(tokens) - length, size=samples)
        windows = np.stack([np.asarray(tokens[s:s + length + 1], dtype=np.int64) for s in starts])  # (B, T+1)
    windows_t = torch.from_numpy(windows).long()
    return windows_t[:, :-1], windows_t[:, -1]


def receptive_field(model: nn.Module, tokens: Tensor, targets: Tensor, batch_size: int = 64) -> ReceptiveField:
    """Mean normalised and cumulative gradient curves of `tokens` (B, T) / `targets` (B,), in micro-batches."""
    norms = torch.cat([input_gradient_norms(model, tokens[i:i + batch_size], targets[i:i + batch_size]).double()
                       for i in range(0, tokens.shape[0], batch_size)])  # (B, T)
    totals = norms.sum(dim=1, keepdim=True)  # (B, 1)
    if bool((totals == 0).any()):
        raise ValueError("a sequence has an all-zero input gradient (its loss is saturated); cannot normalise")
    normalised = norms / totals  # (B, T)
    cumulative = normalised.flip(1).cumsum(dim=1).flip(1)  # (B, T): c_t = Σ_{s ≥ t} n_s
    return ReceptiveField(norms.mean(0).numpy(), normalised.mean(0).numpy(), cumulative.mean(0).numpy(),
                          tokens.shape[0])


def write_csv(rf: ReceptiveField, path: str | Path) -> None:
    """Columns: position, distance (T−1−position), grad_norm, normalised, cumulative."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["position", "distance", "grad_norm", "normalised", "cumulative"])
    t = len(rf.cumulative)
    for pos in range(t):
        writer.writerow([pos, t - 1 - pos, f"{rf.grad_norm[pos]:.6g}", f"{rf.normalised[pos]:.6g}",
                         f"{rf.cumulative[pos]:.6g}"])
    atomic_write_text(path, buffer.getvalue())


def plot_receptive_field(rf: ReceptiveField, path: str | Path, title: str) -> None:
    """Two panels over input position: the cumulative curve c̄ (with the diagonal of uniform dependence) and n̄."""
    plt = pyplot(path)
    if plt is None:
        return

    t = len(rf.cumulative)
    pos = np.arange(t)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(pos, rf.cumulative, label="cumulative normalised gradient")
    left.plot([0, t - 1], [1.0, 1.0 / t], "--", color="grey", lw=0.8, label="uniform dependence")
    left.set(xlabel="input position", ylabel=r"$\sum_{s \geq t}$ normalised gradient", ylim=(0, 1.05))
    left.legend(fontsize=8)
    right.plot(pos, rf.normalised, lw=0.8)
    right.set(xlabel="input position", ylabel="normalised gradient norm", yscale="log")
    fig.suptitle(f"{title} (T={t}, {rf.sequences} sequences)")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
