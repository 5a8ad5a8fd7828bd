"""Training windows from a weighted mixture of prepared folders (``data.paths`` + ``data.weights``, as GPT-NeoX's
``train_data_weights``): every sequence of a micro-batch comes from corpus k with probability w_k, and its window
within corpus k is drawn as :class:`~regulargpt.data.sampler.WindowSampler` draws one.

Example:

    w = normalise_weights([3, 1], tokens=[10_000, 500])                  # [0.75, 0.25]
    sampler = MixtureSampler([web_train, code_train], w, seq_len=512, micro_batch_size=8, seed=0, rank=0,
                             world_size=2)
    batch = sampler.batch(step=10, micro_step=0)     # (8, 513) int64, each row wholly inside one corpus
    sampler.drawn                                    # sequences this process drew from each corpus, e.g. [6, 2]

Like the single-folder sampler it has no state beyond the step: sequence i of micro-batch (step, micro_step) on
`rank` is a pure function of (seed, step, micro_step, rank, i), so a resumed run draws exactly what an
uninterrupted one draws. What a checkpoint keeps (:meth:`MixtureSampler.settings`) is the settings that define the
order, compared on resume, and the count of sequences drawn from each corpus over all ranks, continued on resume.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from regulargpt.data.sampler import WindowSampler, read_windows
from regulargpt.data.sources import DataError
from regulargpt.data.token_split import TokenSplit

if TYPE_CHECKING:
    import torch

__all__ = ["MixtureSampler", "normalise_weights"]

_CHOICE_STREAM = 0  # the RNG key's last entry for the corpus choice; corpus k's windows use k + 1


def normalise_weights(weights: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """w_k = weights[k] / Σ weights, or tokens[k] / Σ tokens when `weights` is empty (the config validated both:
    weights > 0, one per corpus). E.g. [3, 1] → [0.75, 0.25]; [] with tokens [100, 300] → [0.25, 0.75]."""
    raw = [float(w) for w in weights] if weights else [float(t) for t in tokens]
    total = sum(raw)
    return [w / total for w in raw]


class MixtureSampler:
    """Windows of `seq_len + 1` tokens, sequence i of each micro-batch from corpus k_i with P(k_i = k) = w_k.

    Corpus of sequence i: ``u = np.random.default_rng([seed, step, micro_step, rank, 0]).random(micro_batch_size)``,
    k_i = #{j < K − 1 : c_j <= u_i} with c_j = w_0 + … + w_j (so k_i = 0 when u_i < w_0). Its start: entry i of
    corpus k_i's ``default_rng([seed, step, micro_step, rank, k_i + 1]).integers(0, len_k − seq_len,
    micro_batch_size)`` (a :class:`WindowSampler` on stream (k + 1,)). E.g. weights [0.75, 0.25] and u_i = 0.8 →
    corpus 1. `weights` are normalised (:func:`normalise_weights`); every split holds >= seq_len + 1 tokens
    (WindowSampler checks).
    """

    def __init__(self, splits: Sequence[TokenSplit], weights: Sequence[float], seq_len: int, micro_batch_size: int,
                 seed: int, rank: int = 0, world_size: int = 1, vocab_size: int | None = None) -> None:
        if len(splits) != len(weights) or len(splits) < 2:
            raise DataError(f"MixtureSampler: {len(splits)} splits and {len(weights)} weights; expected one weight "
                            f"per split and >= 2 splits")
        self.parts = [WindowSampler(split, seq_len, micro_batch_size, seed, rank, world_size, vocab_size,
                                    stream=(k + 1,)) for k, split in enumerate(splits)]
        self.weights = [float(w) for w in weights]
        self.edges = np.cumsum(self.weights)[:-1]  # c_0 .. c_{K-2}
        self.seq_len, self.micro_batch_size, self.seed = seq_len, micro_batch_size, seed
        self.rank, self.world_size, self.vocab_size = rank, world_size, vocab_size
        self.drawn = np.zeros(len(splits), dtype=np.int64)  # sequences this process drew, per corpus
        self.drawn_before = [0] * len(splits)  # over all ranks, before this process (from the checkpoint)
        self.totals = list(self.drawn_before)  # over all ranks, as of the last record_totals
        self.consumed_steps = 0

    def corpora(self, step: int, micro_step: int = 0) -> np.ndarray:
        """The corpus index (micro_batch_size,) of each sequence of one micro-batch."""
        if step < 0 or micro_step < 0:
            raise DataError(f"MixtureSampler: step {step} and micro_step {micro_step} must be >= 0")
        rng = np.random.default_rng([self.seed, step, micro_step, self.rank, _CHOICE_STREAM])
        u = rng.random(self.micro_batch_size)  # (B,)
        return np.searchsorted(self.edges, u, side="right")

    def batch(self, step: int, micro_step: int = 0) -> torch.Tensor:
        """LongTensor (micro_batch_size, seq_len + 1): inputs are `[:, :-1]`, next-token targets `[:, 1:]`."""
        import torch

        ks = self.corpora(step, micro_step)
        rows = np.empty((self.micro_batch_size, self.seq_len + 1), dtype=np.int64)  # (B, T+1)
        for k, part in enumerate(self.parts):
            chosen = ks == k
            if chosen.any():
                rows[chosen] = read_windows(part.split, part.starts(step, micro_step)[chosen], self.seq_len + 1,
                                            self.vocab_size)
        self.drawn += np.bincount(ks, minlength=len(self.parts))
        self.consumed_steps = max(self.consumed_steps, step + 1)
        return torch.from_numpy(rows)

    def record_totals(self, drawn_all_ranks: Sequence[int]) -> list[int]:
        """Sequences drawn from each corpus over all ranks since the run began: the checkpoint's count plus
        `drawn_all_ranks` (every rank's :attr:`drawn`, summed by the caller); kept for :meth:`settings`."""
        self.totals = [int(a) + int(b) for a, b in zip(self.drawn_before, drawn_all_ranks)]
        return self.totals

    def settings(self) -> dict[str, Any]:
        """What a checkpoint records: the settings that define the data order (those of WindowSampler plus the
        weights) and ``drawn``, the per-corpus counts of the last :meth:`record_totals`."""
        return {"seed": self.seed, "seq_len": self.seq_len, "micro_batch_size": self.micro_batch_size,
                "rank": self.rank, "world_size": self.world_size, "consumed_steps": self.consumed_steps,
                "weights": self.weights, "drawn": self.totals}

    def check_resume(self, saved: dict[str, Any]) -> None:
        """DataError naming the key unless a checkpoint's :meth:`settings` define the same data order; then continue
        its counts (`drawn`, `consumed_steps`)."""
        self.parts[0].check_resume(saved)  # seed, seq_len, micro_batch_size, world_size
        weights = saved.get("weights")
        if not isinstance(weights, list) or len(weights) != len(self.weights) or not np.allclose(
                weights, self.weights, rtol=1e-12, atol=0.0):
            raise DataError(f"resume mismatch: the checkpoint's sampler has weights={weights!r}, this run has "
                            f"weights={self.weights!r}; resume with the same data.paths and data.weights (or start "
                            f"a new run directory)")
        drawn = saved.get("drawn")
        self.drawn_before = [int(x) for x in drawn] if isinstance(drawn, list) and len(drawn) == len(self.weights) \
            else [0] * len(self.weights)
        self.totals = list(self.drawn_before)
        self.drawn[:] = 0
        self.consumed_steps = int(saved.get("consumed_steps", 0))
