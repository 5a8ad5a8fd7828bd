"""Tree mode computing every distinct chunk once (K = 1): the same states as the per-position loop, less work.

With thickness K = 1, the state a depth step keeps for a chunk is a function of that chunk's C input states alone
(queries, keys and values come from those rows, every other op is row-wise) and of how many of its slots are pads,
which only the first chunk of a sequence has (all sequences of a batch share one length). So a batch of sequences
is carried as a table of distinct states and an index into it, x = states[ids], and each step runs the layer once
per distinct chunk:

    step over ids (B, t) into states (n, d), nc = ceil(t/C), first = t − (nc−1)·C real positions in chunk 0:
      learned pad: the pad is table row n, chunk 0 is left-filled with it → one group (B·nc, C)
      mask mode:   chunk 0 = ids[:, :first] (B, first) and chunks 1.. = ids[:, first:] as (B·(nc−1), C)
      distinct chunks of each group (`distinct_rows`) → the layer once per distinct chunk (q, k, v once per
      table row) → new states (Σm, d), new ids (B, nc)

Worked example (parity, vocabulary {0, 1}, C = 2, batch 128, T = 40): the 5,120 input rows are 2 distinct
states; step 0 meets at most 4 distinct chunks (instead of 2,560 rows), step 1 at most 16, step 2 at most 256 (of
640 rows); once the distinct chunks exceed `MEMO_MAX_FRACTION` of the rows the sequences are materialised,
x = states[ids], and the remaining steps run per position (`RegularGPTStack._tree_step`).

Exact: each distinct chunk goes through the same layer code on the same values (gradients of repeated chunks are
summed by the gathers' backward instead of inside the weight matmuls: equal up to fp32 summation order). Valid
whenever equal inputs give equal outputs, so not under active dropout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["MEMO_MAX_FRACTION", "distinct_rows", "memoized_tree"]

# Distinct chunks / rows above which the remaining steps run per position. Weight FLOPs of one step, C = 2, in
# units of d²: per position 28·B·nc (k, v at 2·nc rows; q, output projection, FFN at nc), memoised 6·n + 18·m
# (q, k, v per table row; the rest per distinct chunk), so with a table of n ≈ 2·B·nc rows memoising pays up to
# m ≈ 0.9·B·nc; 0.8 leaves room for its extra gathers.
MEMO_MAX_FRACTION = 0.8
_DENSE_KEYS = 4  # `distinct_rows` counts keys in a table when their range is at most this many × the rows (+ 1024)


def distinct_rows(rows: Tensor, base: int) -> tuple[Tensor, Tensor]:
    """The distinct rows of `rows` (N, w), integers in [0, base): (distinct (m, w), inverse (N,)) with
    rows == distinct[inverse], distinct in increasing order of the key Σ_j rows[:, j]·base^(w−1−j).

    Each row is one int64 key (compacted to its rank whenever the next digit could overflow); keys in a small range
    are counted in a table (no sort), others go through `torch.unique`. Example: rows [[1, 0], [0, 1], [1, 0]],
    base 2 → keys 2, 1, 2 → distinct [[0, 1], [1, 0]], inverse [1, 0, 1].
    """
    n, w = rows.shape
    key, bound = rows[:, 0], base
    for j in range(1, w):
        if bound * base >= 2**62:
            key, bound = torch.unique(key, return_inverse=True)[1], n
        key, bound = key * base + rows[:, j], bound * base
    if bound <= _DENSE_KEYS * n + 1024:
        present = torch.zeros(bound, dtype=torch.bool, device=rows.device)
        present[key] = True
        rank = present.cumsum(0) - 1  # key → its index among the present keys
        inverse = rank[key]
        m = int(rank[-1]) + 1
    else:
        _, inverse = torch.unique(key, return_inverse=True)
        m = int(inverse.max()) + 1
    first = torch.empty(m, dtype=torch.long, device=rows.device).scatter_(0, inverse, torch.arange(n, device=rows.device))
    return rows[first], inverse  # any row of a class will do: they are equal


def memoized_tree(states: Tensor, ids: Tensor, depth: int, chunk_size: int, pad: Tensor | None,
                  chunk_step: Callable[[Tensor, Tensor], Tensor],
                  per_position_rest: Callable[[Tensor, int], Tensor]) -> Tensor:
    """Tree mode over the sequences x = states[ids]: states (n, d), ids (B, T) → the last state (B, d).

    `chunk_step(table, rows)` runs one depth step on the chunk sequences table[rows] (rows (m, t'), t' <= C, ids
    into table (n', d)) and returns their kept (last) states (m, d). With a learned `pad` (d,) the pad is one more
    row of the table (id n) and chunk 0 is left-filled with it, so every chunk has C slots; without (mask mode)
    chunk 0 is a group of shorter sequences whose missing slots the step masks. `per_position_rest(x, steps)` runs
    the last `steps` depth steps per position on x (B, t, d) → (B, d), once the distinct chunks stop paying.
    """
    b = ids.shape[0]
    for done in range(depth):
        n, t = states.shape[0], ids.shape[1]
        nc = -(-t // chunk_size)
        first = t - (nc - 1) * chunk_size  # real positions in chunk 0
        table = states if pad is None or first == chunk_size else torch.cat([states, pad[None]])  # (n or n + 1, d)
        if first == chunk_size:
            groups = [ids.reshape(b * nc, chunk_size)]
        elif pad is not None:
            groups = [F.pad(ids, (chunk_size - first, 0), value=n).view(b * nc, chunk_size)]
        else:
            groups = [ids[:, :first]] + ([ids[:, first:].reshape(b * (nc - 1), chunk_size)] if nc > 1 else [])
        found = [distinct_rows(g, n + 1) for g in groups]
        if sum(rows.shape[0] for rows, _ in found) > MEMO_MAX_FRACTION * b * nc:
            return per_position_rest(F.embedding(ids, states), depth - done)  # from x (B, t, d)
        new_states, new_ids, offset = [], [], 0
        for rows, inverse in found:  # rows (m, t') of table ids → the m kept states
            new_states.append(chunk_step(table, rows))  # (m, d)
            new_ids.append(inverse.view(b, -1) + offset)
            offset += rows.shape[0]
        states, ids = torch.cat(new_states), torch.cat(new_ids, dim=1)  # (Σm, d), (B, nc)
    return F.embedding(ids[:, 0], states)  # (B, d)
