"""Encoding documents at the tokenizer's speed: exact cuts into chunks, and a pool of worker processes.

**Exact cuts.** sentencepiece BPE is slower on a long text than on the same text in pieces of a few thousand
characters, but pieces must not change the ids. A BPE encoding only ever builds symbols that are pieces of the
vocabulary, so if the two characters (a, b) at a position never occur next to each other inside any piece, no symbol
spans that position and the merges on either side cannot interact: encoding the two halves separately gives the same
ids. `SafeCuts` collects the adjacent character pairs of every piece (about 1,200 pairs for an 8000-piece code
tokenizer; a space is "▁" inside pieces) and cuts a document at the first such free position after every
`CHUNK_CHARS` characters. Example: with pieces {"ab", "b\\n"}, "ab\\nab" may be cut only between "\\n" and "a".

**Workers.** `EncoderPool` runs `encode_batch` in `procs` worker processes (in this process when procs = 1) (spawned, so they do not inherit the
parent's memory; each loads the model once; each asks Linux to kill it when its parent dies,
`prctl(PR_SET_PDEATHSIG)`), with at most 2 × procs batches in flight, results in submission order.
"""
from __future__ import annotations

import ctypes
import hashlib
import itertools
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import sentencepiece as spm

CHUNK_CHARS = 2048
"""Target chunk length (characters) of an exact cut; on Python source 1.5× faster than whole documents."""

_WINDOW = 1 << 20  # characters examined at a time when cutting (bounded memory on a 200 MB one-line document)
_GROUP = 256  # chunks encoded per sentencepiece call (<= ~1 MB of text)


class SafeCuts:
    """Exact cut positions of texts for one sentencepiece model (see the module docstring)."""

    def __init__(self, sp: spm.SentencePieceProcessor) -> None:
        pairs: set[tuple[str, str]] = set()
        for i in range(sp.get_piece_size()):
            if sp.is_byte(i) or sp.is_control(i) or sp.is_unknown(i):
                continue
            piece = sp.id_to_piece(i).replace("\u2581", " ")
            pairs.update(zip(piece, piece[1:]))
        chars = sorted({c for pair in pairs for c in pair})
        self.classes = np.zeros(0x110000, dtype=np.int32)  # character → 1 + its index in `chars`; 0 elsewhere
        self.classes[[ord(c) for c in chars]] = np.arange(1, len(chars) + 1, dtype=np.int32)
        self.classes[ord("\u2581")] = self.classes[ord(" ")]  # the normaliser writes a space as "▁"
        self.width = len(chars) + 1
        self.joined = np.zeros(self.width * self.width, dtype=bool)  # (class a, class b) occurs inside a piece
        for a, b in pairs:
            self.joined[self.classes[ord(a)] * self.width + self.classes[ord(b)]] = True

    def free(self, text: str) -> np.ndarray:
        """Positions p (1 <= p < len(text)) where text[p-1], text[p] is no adjacent pair of any piece."""
        found = []
        for lo in range(0, max(len(text) - 1, 0), _WINDOW):
            window = text[lo:lo + _WINDOW + 1]
            cls = self.classes[np.frombuffer(window.encode("utf-32-le"), dtype=np.uint32)]
            found.append(np.flatnonzero(~self.joined[cls[:-1] * self.width + cls[1:]]) + lo + 1)
        return np.concatenate(found) if found else np.empty(0, dtype=np.int64)

    def chunks(self, text: str, chunk_chars: int = CHUNK_CHARS) -> list[str]:
        """`text` cut at the first free position in each `chunk_chars` block; "".join(chunks) == text."""
        if len(text) < 2 * chunk_chars:
            return [text]
        free = self.free(text)
        _, first = np.unique(free // chunk_chars, return_index=True)
        bounds = [0, *free[first].tolist(), len(text)]
        return [text[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


def unit_hash(seed: int, index: int) -> float:
    """u_i = sha256(f"{seed}:{i}") as a number in [0, 1): the document split's coin (see shards.assign_splits)."""
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_code(u: float, val_fraction: float, test_fraction: float) -> int:
    """0 train, 1 val, 2 test: test if u < test_fraction, val if u < test_fraction + val_fraction, else train."""
    return 2 if u < test_fraction else 1 if u < test_fraction + val_fraction else 0


# ------------------------------------------------------------------------------------------------ workers
_STATE: dict[str, Any] = {}


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphaned workers after a SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def _init_worker(model_proto: bytes, options: dict[str, Any], parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    sp = spm.SentencePieceProcessor(model_proto=model_proto)
    _STATE.update(sp=sp, cuts=SafeCuts(sp), **options)


def encode_batch(first_index: int, texts: list[str], codes: list[int] | None = None
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
    """Encode documents first_index, first_index + 1, … → (split codes int8, tokens per document incl. eos int64,
    characters per document int64, the concatenated tokens (+ eos) of each split's documents as bytes). `codes`:
    each document's split where the source fixes it (python-packages), else the hash rule of shards.assign_splits."""
    sp, cuts, dtype = _STATE["sp"], _STATE["cuts"], _STATE["dtype"]
    pieces = [cuts.chunks(t) for t in texts]
    chunks = [c for doc in pieces for c in doc]
    lengths, parts = [], []
    for lo in range(0, len(chunks), _GROUP):  # ids as Python lists cost ~40 bytes a token: a group at a time
        ids = sp.encode(chunks[lo:lo + _GROUP], num_threads=1)
        lengths.extend(len(x) for x in ids)
        parts.append(np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=sum(map(len, ids))))
    per_chunk = np.array(lengths, dtype=np.int64)
    flat = np.concatenate(parts)
    doc_of_chunk = np.repeat(np.arange(len(texts)), [len(p) for p in pieces])
    ntokens = np.bincount(doc_of_chunk, weights=per_chunk, minlength=len(texts)).astype(np.int64)
    flat = np.insert(flat, np.cumsum(ntokens), sp.eos_id()).astype(dtype, copy=False)
    ntokens += 1
    if codes is None:
        codes = [split_code(unit_hash(_STATE["seed"], first_index + k), _STATE["val_fraction"],
                            _STATE["test_fraction"]) for k in range(len(texts))]
    codes = np.array(codes, dtype=np.int8)
    token_codes = np.repeat(codes, ntokens)
    nchars = np.array([len(t) for t in texts], dtype=np.int64)
    return codes, ntokens, nchars, [flat[token_codes == c].tobytes() for c in range(3)]


class EncoderPool:
    """`procs` spawned workers running `encode_batch`; `map(batches)` yields results in order, bounded in flight.

    Example:

        with EncoderPool(tok.model_proto, {"dtype": "uint16", "seed": 0, "val_fraction": .05,
                                           "test_fraction": .05}, procs=2) as pool:
            for codes, ntokens, nchars, data in pool.map(((0, ["a b\\n"]), (1, ["c\\n"]))):
                ...
    """

    def __init__(self, model_proto: bytes, options: dict[str, Any], procs: int) -> None:
        self.procs, self.pool = procs, None
        if procs > 1:
            context = multiprocessing.get_context("spawn")
            self.pool = context.Pool(procs, initializer=_init_worker, initargs=(model_proto, options, os.getpid()))
        else:  # one process: encode in this one (no worker to start)
            _STATE.update(sp=spm.SentencePieceProcessor(model_proto=model_proto), **options)
            _STATE["cuts"] = SafeCuts(_STATE["sp"])

    def map(self, batches: Iterable[tuple[int, list[str]]]) -> Iterator[tuple]:
        if self.pool is None:
            yield from (encode_batch(*batch) for batch in batches)
            return
        pending: deque = deque()
        for batch in batches:
            pending.append(self.pool.apply_async(encode_batch, batch))
            if len(pending) >= 2 * self.procs:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def __enter__(self) -> EncoderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
        _STATE.clear()
