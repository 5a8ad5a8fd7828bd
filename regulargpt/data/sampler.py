"""Reading token splits for training: random windows, resumable from the step alone.

Example:

    split = open_split("data/stdlib", "train")
    sampler = WindowSampler(split, seq_len=512, micro_batch_size=8, seed=1234, rank=0, world_size=2)
    batch = sampler.batch(step=10, micro_step=0)  # (8, 513) int64
    inputs, targets = batch[:, :-1], batch[:, 1:]
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from regulargpt.data.token_split import TokenSplit
from regulargpt.data.sources import DataError

if TYPE_CHECKING:
    import torch


def read_windows(split: TokenSplit, starts: np.ndarray, n: int, vocab_size: int | None = None) -> np.ndarray:
    """The windows ``split.tokens[s:s + n]`` for each start s → (len(starts), n) in the split's dtype. With
    `vocab_size`, an id >= vocab_size is a DataError naming the file and position."""
    rows = np.stack([np.asarray(split.tokens[s:s + n]) for s in starts]) if len(starts) else (
        np.empty((0, n), dtype=split.tokens.dtype))  # (B, n)
    if vocab_size is not None and rows.size and int(rows.max()) >= vocab_size:
        b, t = np.unravel_index(int(np.argmax(rows >= vocab_size)), rows.shape)
        position = int(starts[b]) + int(t)
        raise DataError(f"token file {split.path}: token id {int(rows[b, t])} at position {position} "
                        f"is >= vocab_size {vocab_size} (the folder's manifest.json says ids stay below it: "
                        f"the file is corrupt or from another tokenizer; re-run data_prep/prepare.py)")
    return rows


class WindowSampler:
    """Random windows of `seq_len + 1` tokens, drawn independently for every (seed, step, micro_step, rank).

    The start offsets of `batch(step, micro_step)` are `np.random.default_rng([seed, step, micro_step, rank,
    *stream]).integers(0, len(split) - seq_len, micro_batch_size)` (`stream` is () but in a mixture,
    regulargpt.data.mixture): the data order is reproducible, independent per rank,
    and a resumed run continues exactly without any state beyond the step (:meth:`check_resume` only compares
    settings).
    Windows may cross document boundaries (each document ends with the eos id); draws are with replacement.
    With `vocab_size`, every batch is checked: a token id >= vocab_size is a DataError naming the file and position
    (scanning a whole split up front would cost minutes on a large corpus; a batch costs nothing).
    `seq_len`, `micro_batch_size` and `seed` come from a validated config (data.seq_len >= 1, train.batch_size >= 1,
    train.seed >= 0) and are not checked again here.

    Example:

        s = WindowSampler(split, seq_len=4, micro_batch_size=2, seed=0)
        s.batch(0).shape  # torch.Size([2, 5])
    """

    def __init__(self, split: TokenSplit, seq_len: int, micro_batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1, vocab_size: int | None = None, stream: tuple[int, ...] = ()) -> None:
        if not 0 <= rank < world_size:
            raise DataError(f"WindowSampler: rank {rank} is not in [0, world_size={world_size})")
        if len(split) < seq_len + 1:
            raise DataError(f"split {split.name!r} of {split.data_dir} has {len(split)} tokens, fewer than "
                            f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more data")
        self.split, self.seq_len, self.micro_batch_size = split, seq_len, micro_batch_size
        self.seed, self.rank, self.world_size, self.vocab_size = seed, rank, world_size, vocab_size
        self.stream = stream  # appended to the RNG key: a mixture gives corpus k the stream (k + 1,)
        self.consumed_steps = 0

    def starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Start offsets (micro_batch_size,) of the windows of one micro-batch."""
        if step < 0 or micro_step < 0:
            raise DataError(f"WindowSampler: step {step} and micro_step {micro_step} must be >= 0")
        rng = np.random.default_rng([self.seed, step, micro_step, self.rank, *self.stream])
        return rng.integers(0, len(self.split) - self.seq_len, size=self.micro_batch_size)

    def batch(self, step: int, micro_step: int = 0) -> torch.Tensor:
        """LongTensor (micro_batch_size, seq_len + 1): inputs are `[:, :-1]`, next-token targets `[:, 1:]`."""
        import torch  # here, so that `import regulargpt.data` (and data_prep) does not pay for torch

        rows = read_windows(self.split, self.starts(step, micro_step), self.seq_len + 1, self.vocab_size)
        self.consumed_steps = max(self.consumed_steps, step + 1)
        return torch.from_numpy(rows.astype(np.int64))

    def settings(self) -> dict[str, int]:
        """What a checkpoint records about the sampler. It has no state to save (a batch is a pure function of the
        settings and the step): the settings that define the data order, and `consumed_steps` (1 + the highest step
        served) for information, e.g. ``{"seed": 1, "seq_len": 4, "micro_batch_size": 2, "rank": 0,
        "world_size": 2, "consumed_steps": 4}``."""
        return {"seed": self.seed, "seq_len": self.seq_len, "micro_batch_size": self.micro_batch_size,
                "rank": self.rank, "world_size": self.world_size, "consumed_steps": self.consumed_steps}

    def check_resume(self, saved: dict[str, int]) -> None:
        """DataError naming the key unless a checkpoint's :meth:`settings` define the same data order as this
        sampler's; then continue its `consumed_steps` count.

        `rank` is not compared: the settings hold nothing per rank, so every rank may check rank 0's copy.
        """
        mine = self.settings()
        for key in ("seed", "seq_len", "micro_batch_size", "world_size"):
            if key not in saved:
                raise DataError(f"sampler state has no {key!r} (expected keys {sorted(mine)})")
            if saved[key] != mine[key]:
                raise DataError(f"resume mismatch: the checkpoint's sampler has {key}={saved[key]!r}, this run has "
                                f"{key}={mine[key]!r}; resume with the same {key} (or start a new run directory)")
        self.consumed_steps = int(saved.get("consumed_steps", 0))

