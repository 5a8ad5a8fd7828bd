"""The documents a tokenizer is trained on: a reproducible sample of the train split within a byte budget.

Each train document gets the key k = blake2b(f"{seed}:" + text) (8 bytes, as an integer); the sample is the documents
with keys below a cutoff k*: k* is the smallest key whose document does not fit, i.e. the sample is the longest
run of documents in key order whose UTF-8 sizes sum to at most `budget` bytes (the smallest key ever evicted is k*,
whatever the arrival order), kept in key order.
It depends only on the documents' contents and the seed: not on the file order, and not on the corpus' other
documents beyond their keys. A document contributes at most its first budget / 16 bytes (so that one 80 MB file
cannot be the whole sample). Memory: at most `budget` bytes of text plus one document.

Example (keys are fixed by the content, so the same three documents in any order give the same sample):

    s = TokenizerSample(budget=10, seed=0)
    for i, text in enumerate(["aaaa", "bbbb", "cccc"]):
        s.add(i, text)
    [text for _, text in s.texts()]  # two of the three, in key order
"""
from __future__ import annotations

import hashlib
import heapq

DEFAULT_SAMPLE_BYTES = 32_000_000
"""Default tokenizer sample: 32 MB of train text (an 8000-piece tokenizer trains in about a minute on 2 cores)."""


class TokenizerSample:
    """Bottom-k sample of documents by content key within `budget` UTF-8 bytes (see the module docstring)."""

    def __init__(self, budget: int = DEFAULT_SAMPLE_BYTES, seed: int = 0) -> None:
        self.budget, self.seed = budget, seed
        self._heap: list[tuple[int, int, str, int]] = []  # (-key, index, text, size): the largest key on top
        self.bytes = 0
        self.cutoff = 1 << 64  # the smallest key ever evicted: no later document with a key >= it can be kept

    def key(self, text: str) -> int:
        return int.from_bytes(hashlib.blake2b(f"{self.seed}:{text}".encode(), digest_size=8).digest(), "big")

    def add(self, index: int, text: str) -> None:
        """Offer document `index`; it stays if its key is among the smallest that fit the budget."""
        data = text.encode("utf-8")
        if len(data) > max(1, self.budget // 16):
            text = data[:max(1, self.budget // 16)].decode("utf-8", errors="ignore")
            data = text.encode("utf-8")
        key = self.key(text)
        if key >= self.cutoff:
            return
        heapq.heappush(self._heap, (-key, index, text, len(data)))
        self.bytes += len(data)
        while self.bytes > self.budget:
            evicted = heapq.heappop(self._heap)
            self.bytes -= evicted[3]
            self.cutoff = min(self.cutoff, -evicted[0])

    def discard(self, index: int) -> None:
        """Drop document `index` if kept (it moved out of the train split)."""
        kept = [entry for entry in self._heap if entry[1] != index]
        if len(kept) != len(self._heap):
            self._heap = kept
            heapq.heapify(self._heap)
            self.bytes = sum(entry[3] for entry in kept)

    def texts(self) -> list[tuple[int, str]]:
        """(index, text) of the kept documents, smallest key first."""
        return [(index, text) for _, index, text, _ in sorted(self._heap, reverse=True)]

    def __len__(self) -> int:
        return len(self._heap)
