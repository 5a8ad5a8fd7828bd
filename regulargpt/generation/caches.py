"""Storage for cached decoding: growing tensors, append-only KV caches (dense attention), ring buffers (RegularGPT).

Storage grows geometrically (doubling), so appending one position costs amortised O(1) copies instead of a
concatenation of the whole cache per token. Keys and values are (B, H, slots, Dh) tensors.

* :class:`GrowingTensor`: one tensor that grows along one axis (token ids, hidden states).
* :class:`KVCache`: every position 0..n−1, for attention that reads all earlier keys (ALiBi, T5, KERPLE, RoPE, …).
* :class:`RingCache`: the last `window` positions only; position p lives in slot p mod window. Storage grows with
  the positions written until it reaches `window` slots, then stays there. Worked example, window = 4: after
  positions 0..5 the slots hold positions [4, 5, 2, 3]; position 6 then overwrites slot 2.
* :class:`WindowKVCache`: :class:`KVCache`'s interface over a ring, for sliding-window attention (``model.window``):
  `append` returns only the keys the new positions can see.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["GrowingTensor", "KVCache", "RingCache", "WindowKVCache"]

_MIN_SLOTS = 16


def _grown(buffer: Tensor | None, like: Tensor, dim: int, slots: int, used: int) -> Tensor:
    """A buffer shaped and typed like `like` with `slots` entries along `dim`, holding the first `used` of `buffer`."""
    shape = list(like.shape)
    shape[dim] = slots
    out = like.new_empty(shape)
    if buffer is not None and used:
        out.narrow(dim, 0, used).copy_(buffer.narrow(dim, 0, used))
    return out


class GrowingTensor:
    """A tensor that grows along `dim` by appending; storage doubles when full. E.g. token ids (B, T), dim 1.

    `reserve`: entries to allocate at the first append (the final length, when known), so that no doubling
    ever happens."""

    def __init__(self, dim: int, reserve: int = 0) -> None:
        self.dim, self.reserve = dim, reserve
        self.data: Tensor | None = None
        self.length = 0

    def append(self, x: Tensor) -> Tensor:
        """Append x (its size along `dim` is the number of new entries) → a view of every entry so far."""
        n = x.shape[self.dim]
        end = self.length + n
        if self.data is None or end > self.data.shape[self.dim]:
            current = 0 if self.data is None else self.data.shape[self.dim]
            slots = max(_MIN_SLOTS, end, 2 * current if current else self.reserve)
            self.data = _grown(self.data, x, self.dim, slots, self.length)
        self.data.narrow(self.dim, self.length, n).copy_(x)
        self.length = end
        return self.view()

    def view(self) -> Tensor:
        """Every entry appended so far (a view of the storage)."""
        assert self.data is not None, "nothing appended yet"
        return self.data.narrow(self.dim, 0, self.length)

    @property
    def nbytes(self) -> int:
        """Bytes of storage held (capacity, not only the filled part)."""
        return 0 if self.data is None else self.data.nbytes


class KVCache:
    """Keys and values of positions 0..length−1 of one dense layer; `append` returns views of all of them."""

    def __init__(self, reserve: int = 0) -> None:
        self.k, self.v = GrowingTensor(dim=2, reserve=reserve), GrowingTensor(dim=2, reserve=reserve)

    @property
    def length(self) -> int:
        return self.k.length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (B, H, n, Dh) for positions length..length+n−1 → keys and values (B, H, length, Dh) so far."""
        return self.k.append(k), self.v.append(v)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class RingCache:
    """Keys and values of the last `window` positions written; position p is stored in slot p mod window.

    Positions must be written in increasing order without gaps (several at once is fine), from position `start`
    on. Reads name absolute positions, which must be among the last `window` written. `reserve`: positions to
    allocate at the first write (the final length, when known; at most `window` are ever allocated).
    """

    def __init__(self, window: int, start: int = 0, reserve: int = 0) -> None:
        if window < 1:
            raise ValueError(f"RingCache: window must be >= 1, got {window}")
        self.window, self.start, self.reserve = window, start, reserve
        self.k: Tensor | None = None
        self.v: Tensor | None = None
        self.length = start  # the next write is position `length`

    def write(self, k: Tensor, v: Tensor) -> None:
        """Store k, v (B, H, n, Dh) of positions length..length+n−1; only the last `window` of them are kept."""
        n = k.shape[2]
        keep = min(n, self.window)
        first = self.length + n - keep  # oldest position that stays
        end = self.length + n
        slots_needed = min(self.window, end)
        if self.k is None or slots_needed > self.k.shape[2]:
            current = 0 if self.k is None else self.k.shape[2]
            slots = min(self.window, max(_MIN_SLOTS, slots_needed, 2 * current if current else self.reserve))
            used = min(self.length, current)  # not wrapped yet: position p < length sits in slot p
            self.k = _grown(self.k, k, 2, slots, used)
            self.v = _grown(self.v, v, 2, slots, used)
        assert self.v is not None
        k, v = k[:, :, n - keep:], v[:, :, n - keep:]
        slot = first % self.window
        head = min(keep, self.window - slot)  # positions up to the end of the ring, then wrap to slot 0
        self.k[:, :, slot:slot + head] = k[:, :, :head]
        self.v[:, :, slot:slot + head] = v[:, :, :head]
        if head < keep:
            self.k[:, :, :keep - head] = k[:, :, head:]
            self.v[:, :, :keep - head] = v[:, :, head:]
        self.length = end

    def read(self, positions: list[int]) -> tuple[Tensor, Tensor]:
        """Keys and values (B, H, len(positions), Dh) of the given absolute positions, in the order given."""
        assert self.k is not None and self.v is not None, "read before any write"
        oldest = max(self.start, self.length - self.window)
        if any(p < oldest or p >= self.length for p in positions):
            raise IndexError(f"RingCache: positions {positions} not among the last {self.window} of {self.length}")
        if len(positions) == 1:  # a view, no gather
            slot = positions[0] % self.window
            return self.k[:, :, slot:slot + 1], self.v[:, :, slot:slot + 1]
        slots = torch.tensor([p % self.window for p in positions], device=self.k.device)
        return self.k.index_select(2, slots), self.v.index_select(2, slots)

    @property
    def nbytes(self) -> int:
        """Bytes of storage held (at most 2 · B · H · window · Dh · itemsize)."""
        return 0 if self.k is None or self.v is None else self.k.nbytes + self.v.nbytes


class WindowKVCache:
    """Keys and values of one sliding-window layer (window W): a W-slot :class:`RingCache`, constant memory.

    `append(k, v)` of n new positions t..t+n−1 returns the keys/values of positions max(0, t−W+1)..t+n−1 (the
    W − 1 older ones the newest window reaches back to, then the new ones), in position order: what
    ``sliding_window_attention`` needs for the new queries. E.g. W = 4 after positions 0..8: appending position 9
    returns positions 6..9, and the ring then holds 6..9.
    """

    def __init__(self, window: int, reserve: int = 0) -> None:
        self.ring = RingCache(window, reserve=reserve)

    @property
    def length(self) -> int:
        return self.ring.length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (B, H, n, Dh) → keys and values (B, H, w + n, Dh), w = min(W − 1, length) older positions."""
        start = self.ring.length
        older = list(range(max(0, start - self.ring.window + 1), start))
        if older:
            old_k, old_v = self.ring.read(older)  # (B, H, w, Dh)
            keys, values = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        else:
            keys, values = k, v
        self.ring.write(k, v)
        return keys, values

    @property
    def nbytes(self) -> int:
        """Bytes of storage held: at most 2 · B · H · W · Dh · itemsize."""
        return self.ring.nbytes
