"""The `Task` interface and `DfaMembershipTask`, the shared sampler of every membership task.

A task maps a batch of token strings (B, T) to one class per string (B,). `sample` draws strings and their labels;
`label` computes the labels of any given strings, so analyses can label strings they built themselves.
"""
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence

import numpy as np
import torch


class Task(ABC):
    """A sequence-classification task over strings of token ids in [0, input_vocab_size)."""

    name: str
    input_vocab_size: int
    num_classes: int
    is_membership: bool = False

    def sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Draws `batch_size` strings and their labels: LongTensors (B, T) and (B,), deterministic given `generator`.

        T is `length` except where a task documents otherwise (modular arithmetic keeps expressions odd).
        """
        if length < 1:
            raise ValueError(f"{self.name}: length must be >= 1, got {length}")
        if batch_size < 1:
            raise ValueError(f"{self.name}: batch_size must be >= 1, got {batch_size}")
        return self._sample(batch_size, length, generator)

    @abstractmethod
    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """`sample` after its argument checks."""

    @abstractmethod
    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        """Labels of the strings `inputs` (B, T) as a LongTensor (B,), on the device of `inputs`."""

    def _check_tokens(self, inputs: torch.Tensor) -> None:
        if inputs.dim() != 2:
            raise ValueError(f"{self.name}: inputs must have shape (B, T), got {tuple(inputs.shape)}")
        if inputs.numel() and (int(inputs.min()) < 0 or int(inputs.max()) >= self.input_vocab_size):
            raise ValueError(f"{self.name}: token ids must lie in [0, {self.input_vocab_size})")


class DfaMembershipTask(Task):
    """Membership in the regular language of a DFA: label 1 iff the string is accepted.

    Sampling: B // 2 positives and the rest negatives, at random positions (all negatives when no string of the length
    is accepted, all positives when every string is). Positives are uniform over the accepted strings of the length,
    negatives uniform over the rejected ones: with N_k(q) the number of length-k suffixes that take state q to
    the target set (accepting, or rejecting for negatives), the next symbol a is drawn with probability
    N_{k-1}(delta(q, a)) / N_k(q). Counts are exact Python ints, so long strings cannot overflow.

    Example: the DFA transitions [[0, 1], [1, 1]] with accepting {0} is 0*; "000" -> class 1, "010" -> class 0.
    """

    is_membership = True
    num_classes = 2

    def __init__(self, name: str, transitions: Sequence[Sequence[int]], accepting: Iterable[int]) -> None:
        """`transitions[q][a]` is the state after reading symbol a in state q; the start state is 0."""
        table = np.asarray(transitions, dtype=np.int64)  # (S, A)
        if table.ndim != 2 or table.size == 0 or table.min() < 0 or table.max() >= table.shape[0]:
            raise ValueError(f"{name}: transitions must be a non-empty (states x symbols) table of state ids")
        num_states, num_symbols = table.shape
        accept = np.zeros(num_states, dtype=bool)
        accept[list(accepting)] = True
        self.name = name
        self.input_vocab_size = num_symbols
        self._transitions = table
        self._accepting = accept
        # `label` reads W symbols per step: _word_moves[q * A^W + code] is the state after the word `code` from q.
        self._word_len = next(w for w in range(8, 0, -1) if num_symbols**w <= 256)
        codes = np.arange(num_symbols**self._word_len)  # (A^W,) first symbol most significant
        ends = np.repeat(np.arange(num_states)[:, None], len(codes), axis=1)  # (S, A^W)
        for i in range(self._word_len - 1, -1, -1):
            ends = table[ends, codes // num_symbols**i % num_symbols]
        self._word_moves = ends.reshape(-1)  # (S * A^W,)
        self._counts = np.empty((0, 2, num_states), dtype=object)  # [k, target, q]: # length-k suffixes into target
        self._cuts = np.empty((0, num_symbols - 1))  # [(k, target, q), a]: P(next symbol <= a), a < A-1

    def label(self, inputs: torch.Tensor) -> torch.Tensor:
        """Runs the DFA over each row, W = 8 binary symbols per step (a table of word moves); 1 = accepted."""
        self._check_tokens(inputs)
        batch, length = inputs.shape
        num_symbols, w, device = self.input_vocab_size, self._word_len, inputs.device
        word_moves = torch.as_tensor(self._word_moves, device=device)  # (S * A^W,)
        moves = torch.as_tensor(self._transitions.reshape(-1), device=device)  # (S * A,)
        powers = num_symbols ** torch.arange(w - 1, -1, -1, device=device)  # (W,)
        whole = length // w * w
        codes = (inputs[:, :whole].reshape(batch, length // w, w) * powers).sum(dim=2)  # (B, T // W)
        state = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
        for j in range(codes.shape[1]):
            state = word_moves[state * num_symbols**w + codes[:, j]]
        for t in range(whole, length):
            state = moves[state * num_symbols + inputs[:, t]]
        return torch.as_tensor(self._accepting, device=device)[state].long()

    def num_strings(self, length: int) -> tuple[int, int]:
        """(number of rejected, number of accepted) strings of `length` symbols."""
        self._extend_tables(length)
        rejected, accepted = self._counts[length][:, 0]
        return int(rejected), int(accepted)

    def _sample(self, batch_size: int, length: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        rejected, accepted = self.num_strings(length)
        if accepted == 0 or rejected == 0:
            labels = torch.full((batch_size,), int(accepted > 0), dtype=torch.long)
        else:
            labels = (torch.randperm(batch_size, generator=generator) < batch_size // 2).long()
        num_states, num_symbols = self._transitions.shape
        moves = self._transitions.reshape(-1)  # (S * A,)
        uniform = torch.rand((length, batch_size), generator=generator, dtype=torch.float64).numpy()  # (T, B)
        row = labels.numpy() * num_states  # (B,) offset of each string's target set
        state = np.zeros(batch_size, dtype=np.int64)  # (B,)
        tokens = np.empty((length, batch_size), dtype=np.int64)  # (T, B)
        for t in range(length):
            cut = self._cuts[(length - t) * 2 * num_states + row + state]  # (B, A-1)
            tokens[t] = (uniform[t, :, None] >= cut).sum(axis=1)  # inverse-CDF draw of the next symbol
            state = moves[state * num_symbols + tokens[t]]
        return torch.from_numpy(np.ascontiguousarray(tokens.T)), labels

    def _extend_tables(self, length: int) -> None:
        """Grows the suffix counts and symbol CDFs to cover `length` (amortised by doubling)."""
        if length < len(self._counts):
            return
        start = np.array([~self._accepting, self._accepting]).astype(int).astype(object)  # (2, S): length-0 suffixes
        counts = list(self._counts) or [start]
        while len(counts) <= max(length, 2 * len(self._counts)):
            counts.append(counts[-1][:, self._transitions].sum(axis=2))  # (2, S): sum over the next symbol
        self._counts = np.stack(counts)  # (K, 2, S) exact Python ints
        after = self._counts[:-1][..., self._transitions]  # (K-1, 2, S, A): suffixes left after each next symbol
        running = np.cumsum(after[..., :-1], axis=-1)  # (K-1, 2, S, A-1); the last symbol's CDF is always 1
        total = self._counts[1:, :, :, None]  # (K-1, 2, S, 1)
        inside = (running < total).astype(bool)  # False from the last symbol that can still reach the target
        cuts = np.where(inside, running / np.where(total == 0, 1, total), np.inf).astype(np.float64)
        cuts = np.concatenate([np.full((1, *cuts.shape[1:]), np.inf), cuts])  # (K, 2, S, A-1); row k=0 unused
        self._cuts = cuts.reshape(math.prod(cuts.shape[:3]), cuts.shape[3])  # (K * 2 * S, A-1)
