"""Appending encoded documents to the split files of a work folder, resumably, and the final split fix-up.

The work folder holds `<split>.bin` (the tokens so far), one record per document (`docs.codes` int8 split code,
`docs.ntokens` and `docs.nchars` int64) and `state.json`, written at each checkpoint after the files are fsynced:
{"documents": n, "sizes": {split: bytes}, ...}. Reopening a work folder truncates every file to its checkpoint, so a
killed preparation resumes after its last checkpointed batch (the documents before it are read again but not
re-encoded).

`finish` applies the split rule's last step (shards.assign_splits): an empty split takes the document nearest to
its interval from the largest split; that document's tokens are moved between the files.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from regulargpt.data.encoding import unit_hash
from regulargpt.data.token_split import SPLITS
from regulargpt.files import atomic_write_text, read_json_object
from regulargpt.write_errors import explain_write_error

STATE = "state.json"
_RECORDS = {"codes": np.int8, "ntokens": np.int64, "nchars": np.int64}


def read_state(work: Path) -> dict[str, Any]:
    """The last checkpoint of a work folder ({} if none)."""
    return read_json_object(work / STATE) if (work / STATE).is_file() else {}


def write_state(work: Path, state: dict[str, Any]) -> None:
    atomic_write_text(work / STATE, json.dumps(state))


def fill_empty_splits(codes: np.ndarray, u_of: Any, val_fraction: float, test_fraction: float) -> list[tuple]:
    """Give each empty split the document nearest to its interval of u from the largest split (in place).

    `u_of(indices)` → the documents' u values. Returns the moves [(document, from code, to code)], in order.
    Example (fractions 0.05/0.05): codes [0, 0, 0] with u [0.5, 0.07, 0.2]: test, interval [0, 0.05), takes
    document 1 (distance 0.02); then val, interval [0.05, 0.1), takes document 2 (distance 0.1 < 0.4):
    moves [(1, 0, 2), (2, 0, 1)].
    """
    cut = test_fraction + val_fraction
    bounds = {2: (0.0, test_fraction), 1: (test_fraction, cut), 0: (cut, 1.0)}
    moves = []
    for code, (lo, hi) in bounds.items():
        if not (codes == code).any():
            donor = int(np.argmax(np.bincount(codes, minlength=3)))
            candidates = np.flatnonzero(codes == donor)
            u = np.asarray(u_of(candidates), dtype=np.float64)
            distance = np.maximum(np.maximum(lo - u, u - hi), 0.0)
            index = int(candidates[int(np.argmin(distance))])
            codes[index] = code
            moves.append((index, donor, code))
    return moves


class SplitWriter:
    """Appends `encoding.encode_batch` results to `work` (see the module docstring)."""

    def __init__(self, work: Path, dtype: str) -> None:
        self.work, self.itemsize = work, np.dtype(dtype).itemsize
        state = read_state(work)
        self.documents = int(state.get("documents", 0))
        sizes = state.get("sizes", {})
        self.handles: dict[str, BinaryIO] = {}
        for name in SPLITS:
            self.handles[name] = self._open(work / f"{name}.bin", int(sizes.get(name, 0)))
        for name, kind in _RECORDS.items():
            self.handles[name] = self._open(work / f"docs.{name}", self.documents * np.dtype(kind).itemsize)

    @staticmethod
    def _open(path: Path, size: int) -> BinaryIO:
        with explain_write_error(path, "the split file"):
            handle = open(path, "r+b" if path.exists() else "w+b")
        handle.truncate(size)
        handle.seek(size)
        return handle

    def append(self, codes: np.ndarray, ntokens: np.ndarray, nchars: np.ndarray, data: list[bytes]) -> None:
        for name, chunk in zip(SPLITS, data):
            with explain_write_error(self.work / f"{name}.bin", "the split file", len(chunk)):
                self.handles[name].write(chunk)
        for name, array in (("codes", codes), ("ntokens", ntokens), ("nchars", nchars)):
            with explain_write_error(self.work / f"docs.{name}", "the document records", array.size * 8):
                self.handles[name].write(array.astype(_RECORDS[name], copy=False).tobytes())
        self.documents += len(codes)

    def checkpoint(self, extra: dict[str, Any] | None = None) -> None:
        """Make everything appended so far durable and the resume point (`extra` is kept in the state)."""
        for handle in self.handles.values():
            with explain_write_error(Path(handle.name), "the split file"):
                handle.flush()
                os.fsync(handle.fileno())
        state = {**read_state(self.work), **(extra or {}), "documents": self.documents,
                 "sizes": {name: self.handles[name].tell() for name in SPLITS}}
        write_state(self.work, state)

    def close(self) -> None:
        for handle in self.handles.values():
            handle.close()

    def finish(self, seed: int, val_fraction: float, test_fraction: float) -> dict[str, dict[str, int]]:
        """Close, fix empty splits (moving tokens), delete the per-document records → {split: {tokens, documents,
        chars}}."""
        self.checkpoint()
        self.close()
        records = {name: np.fromfile(self.work / f"docs.{name}", dtype=kind) for name, kind in _RECORDS.items()}
        codes, ntokens = records["codes"], records["ntokens"]
        before = codes.copy()
        moves = fill_empty_splits(codes, lambda idx: [unit_hash(seed, int(i)) for i in idx], val_fraction,
                                  test_fraction)
        for index, donor, code in moves:
            self._move(before, ntokens, index, SPLITS[donor], SPLITS[code])
            before[index] = code
        for name in _RECORDS:
            (self.work / f"docs.{name}").unlink()
        return {name: {"tokens": int(ntokens[codes == c].sum()), "documents": int((codes == c).sum()),
                       "chars": int(records["nchars"][codes == c].sum())} for c, name in enumerate(SPLITS)}

    def _move(self, codes: np.ndarray, ntokens: np.ndarray, index: int, source: str, target: str) -> None:
        """Move document `index`'s tokens from `source`.bin (where `codes` places it) to the end of `target`.bin."""
        start = int(ntokens[:index][codes[:index] == codes[index]].sum()) * self.itemsize
        size = int(ntokens[index]) * self.itemsize
        src, tmp = self.work / f"{source}.bin", self.work / f".{source}.bin.move"
        with open(src, "rb") as old, open(tmp, "wb") as new, open(self.work / f"{target}.bin", "ab") as dest:
            shutil.copyfileobj(_Range(old, 0, start), new)
            dest.write(_Range(old, start, size).read())
            shutil.copyfileobj(_Range(old, start + size, None), new)
        os.replace(tmp, src)


class _Range:
    """A read-only window [start, start + size) of an open file (size None: to the end), for copyfileobj."""

    def __init__(self, handle: BinaryIO, start: int, size: int | None) -> None:
        self.handle, self.left = handle, size
        handle.seek(start)

    def read(self, n: int = -1) -> bytes:
        if self.left is None:
            return self.handle.read(n)
        n = self.left if n < 0 else min(n, self.left)
        data = self.handle.read(n)
        self.left -= len(data)
        return data
