"""Content checks of a prepared split file that are cheap enough to run at every open.

A full sha256 of a 100 GB split takes minutes, so preparation also records *block checksums*: the sha256 of
`BLOCKS` blocks of `BLOCK_BYTES` bytes at fixed, evenly spaced offsets (the first block starts at 0, the last ends at
the end of the file). Reading them back costs at most BLOCKS × BLOCK_BYTES = 4 MiB whatever the file's size.

Worked example: a 10 MiB file (10,485,760 bytes) gets 64 blocks of 64 KiB whose offsets are
round(i · (10,485,760 − 65,536) / 63) for i = 0..63, i.e. 0, 165,400, 330,801, …, 10,420,224.
A file no larger than BLOCKS × BLOCK_BYTES is covered whole (its blocks tile it, the last one shorter).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

BLOCKS = 64
BLOCK_BYTES = 1 << 16


def block_offsets(size: int, blocks: int = BLOCKS, block_bytes: int = BLOCK_BYTES) -> list[int]:
    """Start offsets of the checksummed blocks of a `size`-byte file (see the module docstring); [] for size 0."""
    if size <= 0:
        return []
    if size <= blocks * block_bytes:
        return list(range(0, size, block_bytes))
    last = size - block_bytes
    return [round(i * last / (blocks - 1)) for i in range(blocks)]


def block_checksums(path: str | Path, blocks: int = BLOCKS, block_bytes: int = BLOCK_BYTES) -> dict:
    """The manifest record of `path`'s block checksums:
    {"block_bytes": B, "offsets": [o_0, …], "sha256": [sha256(file[o_i : o_i + B]) hex, …]}."""
    path = Path(path)
    offsets = block_offsets(path.stat().st_size, blocks, block_bytes)
    digests = []
    with open(path, "rb") as handle:
        for offset in offsets:
            handle.seek(offset)
            digests.append(hashlib.sha256(handle.read(block_bytes)).hexdigest())
    return {"block_bytes": block_bytes, "offsets": offsets, "sha256": digests}
