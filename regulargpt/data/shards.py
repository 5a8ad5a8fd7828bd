"""Token shards: corpus → split → tokenizer → flat `<split>.bin` token streams + `manifest.json` (read back by
regulargpt/data/token_split.py).

A prepared data folder holds `tokenizer.model`, `train.bin`, `val.bin`, `test.bin` (each document's tokens followed by
the tokenizer's eos id, concatenated; uint16 when the vocabulary fits, else uint32) and `manifest.json`, written last.
Every file is written under a temporary name in the same folder, flushed, fsynced and renamed.

Example:

    manifest = prepare("python-stdlib", "data/stdlib", vocab_size=8000)
    split = open_split("data/stdlib", "val", vocab_size=8000)
    assert len(split) == manifest["splits"]["val"]["tokens"]
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import numpy as np
from tqdm.auto import tqdm

from regulargpt.data.integrity import block_checksums
from regulargpt.data.sources import DataError, Source, load_documents, resolve_source
from regulargpt.data.tokenizer import TRAINER_SETTINGS, Tokenizer, train_tokenizer
from regulargpt.data.tokenizer_replacement import check_replacement
from regulargpt.data.token_split import FORMAT_VERSION, MANIFEST, SPLITS, TOKENIZER_FILE, load_manifest
from regulargpt.files import atomic_open, sha256_file

if TYPE_CHECKING:
    import datasets

# A split shorter than one training window of configs/base.json (T = 512, plus the target) is worth a warning:
# training refuses a split shorter than data.seq_len + 1, and evaluation scores no window longer than it.
TYPICAL_WINDOW = 512 + 1


def dtype_for(vocab_size: int) -> str:
    """Smallest stored dtype for ids < vocab_size: `dtype_for(8000) == "uint16"`, `dtype_for(100_000) == "uint32"`."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def _clean_stale(out: Path) -> None:
    """Remove leftovers of a killed run: `.*.tmp` files and `.work-*` folders (names only this module uses)."""
    for p in out.glob(".*.tmp"):
        p.unlink(missing_ok=True)
    for p in out.glob(".work-*"):
        shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- splitting
def _unit_hash(seed: int, index: int) -> float:
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_splits(num_documents: int, seed: int, val_fraction: float, test_fraction: float) -> np.ndarray:
    """Split code per document (0 train, 1 val, 2 test) from a hash of (seed, document index).

    Document i goes to test if u_i < test_fraction, to val if u_i < test_fraction + val_fraction, else to train,
    with u_i = sha256(f"{seed}:{i}") mapped to [0, 1): it does not depend on the other documents. An empty split
    then takes the document nearest to its interval from the largest split, so each split is non-empty.

    Example:
        >>> assign_splits(5, seed=0, val_fraction=0.05, test_fraction=0.05).tolist()
        [0, 0, 0, 1, 2]
    """
    if num_documents < 3:
        raise DataError(f"need at least 3 documents to make train/val/test splits, got {num_documents}")
    u = np.array([_unit_hash(seed, i) for i in range(num_documents)])
    cut = test_fraction + val_fraction
    bounds = {2: (0.0, test_fraction), 1: (test_fraction, cut), 0: (cut, 1.0)}
    codes = np.where(u < test_fraction, 2, np.where(u < cut, 1, 0)).astype(np.int8)
    for code, (lo, hi) in bounds.items():
        if not (codes == code).any():
            donor = int(np.argmax(np.bincount(codes, minlength=3)))
            candidates = np.flatnonzero(codes == donor)
            distance = np.maximum(np.maximum(lo - u[candidates], u[candidates] - hi), 0.0)
            codes[candidates[int(np.argmin(distance))]] = code
    return codes


# ---------------------------------------------------------------------------------------------------- preparing
class _Encoder:
    """`datasets.map` function: text → token ids + eos, stored in the shard dtype."""

    def __init__(self, tokenizer: Tokenizer, dtype: str) -> None:
        self.tokenizer, self.dtype = tokenizer, dtype

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        eos = self.tokenizer.eos_id
        ids = [np.asarray(x + [eos], dtype=self.dtype) for x in self.tokenizer.encode_batch(batch["text"])]
        return {"ids": ids, "ntokens": [len(x) for x in ids]}


def _write_tokens(f: BinaryIO, batches: Iterator[np.ndarray], bar: tqdm) -> str:
    """Write token arrays to an open file; returns the sha256 of what was written."""
    h = hashlib.sha256()
    for arr in batches:
        data = arr.tobytes()
        f.write(data)
        h.update(data)
        bar.update(len(arr))
    return h.hexdigest()


def _token_batches(ds: datasets.Dataset, dtype: str) -> Iterator[np.ndarray]:
    """Flat token arrays of a Dataset with an "ids" column, a batch of documents at a time."""
    for table in ds.with_format("arrow").iter(batch_size=1024):
        for chunk in table.column("ids").chunks:
            yield chunk.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _fingerprint(source: Source, options: dict[str, object], tokenizer_sha: str | None,
                 hf_fingerprint: str | None) -> str:
    """sha256 of everything the outputs depend on (see docs/DATA.md, `input_fingerprint`)."""
    material = {
        "format_version": FORMAT_VERSION, "source": source.spec, "kind": source.kind, "options": options,
        "inputs": hf_fingerprint if source.kind == "hf" else source.fingerprint_items(),
        "tokenizer": tokenizer_sha or {"trainer": TRAINER_SETTINGS},
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _up_to_date(out: Path, fingerprint: str) -> dict | None:
    """The existing manifest if it has this fingerprint and its files are all there with the right sizes."""
    try:
        manifest = load_manifest(out)
    except DataError:
        return None
    if manifest.get("input_fingerprint") != fingerprint:
        return None
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for info in manifest["splits"].values():
        path = out / info["file"]
        if not path.is_file() or path.stat().st_size != info["tokens"] * itemsize:
            return None
    tok = out / manifest["tokenizer"]["file"]
    return manifest if tok.is_file() and sha256_file(tok) == manifest["tokenizer"]["sha256"] else None


def _finished_manifest(out: Path) -> dict | None:
    try:
        return load_manifest(out)
    except DataError:
        return None


def _total(splits: dict[str, dict]) -> dict[str, int]:
    return {key: sum(int(v[key]) for v in splits.values()) for key in ("tokens", "documents", "chars")}


def _chars_per_token(info: dict) -> float:
    """Characters per token, not counting the eos token that ends each document."""
    return round(int(info["chars"]) / max(1, int(info["tokens"]) - int(info["documents"])), 3)


def _check_options(vocab_size: int | None, tokenizer: Tokenizer | None, max_bytes: int | None,
                   val_fraction: float, test_fraction: float) -> None:
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DataError(f"--val-fraction {val_fraction} and --test-fraction {test_fraction}: expected each in (0, 1) "
                        f"and their sum below 1")
    if max_bytes is not None and max_bytes <= 0:
        raise DataError(f"--max-bytes {max_bytes}: expected a positive number of bytes")
    if tokenizer is None and vocab_size is not None and vocab_size < 260:
        raise DataError(f"--vocab-size {vocab_size}: expected >= 260 (256 byte pieces + unk/bos/eos/pad)")
    if tokenizer is not None and vocab_size is not None and vocab_size != tokenizer.vocab_size:
        raise DataError(f"--vocab-size {vocab_size} disagrees with --tokenizer {tokenizer.path} "
                        f"(vocab_size {tokenizer.vocab_size}); drop --vocab-size or pass {tokenizer.vocab_size}")


def _write_splits(out: Path, encoded: datasets.Dataset, codes: np.ndarray, nchars: np.ndarray,
                  dtype: str) -> dict[str, dict]:
    """Write `<split>.bin` for every split (documents in corpus order); returns the manifest's `splits`."""
    ntokens = np.asarray(encoded["ntokens"], dtype=np.int64)
    splits: dict[str, dict] = {}
    for code, name in enumerate(SPLITS):
        index = np.flatnonzero(codes == code)
        total = int(ntokens[index].sum())
        with atomic_open(out / f"{name}.bin") as f, \
                tqdm(total=total, unit="tok", desc=f"writing {name}.bin", file=sys.stderr) as bar:
            sha = _write_tokens(f, _token_batches(encoded.select(index), dtype), bar)
        splits[name] = {"tokens": total, "documents": len(index), "chars": int(nchars[index].sum()),
                        "file": f"{name}.bin", "sha256": sha, "blocks": block_checksums(out / f"{name}.bin")}
    return splits


def prepare(source: str, out: str | Path, *, vocab_size: int | None = None, tokenizer: str | Path | None = None,
            max_bytes: int | None = None, seed: int = 0, val_fraction: float = 0.05, test_fraction: float = 0.05,
            text_field: str = "text", num_proc: int | None = None, cache_dir: str | Path | None = None,
            force: bool = False, command: str | None = None, log: Callable[[str], None] = print) -> dict:
    """Build (or confirm up to date) a data folder from a source spec; returns the manifest.

    Trains a BPE tokenizer with `vocab_size` (default 8000) on the train split, or reuses `tokenizer` (a .model).

    Example:

        m = prepare("python-stdlib", "data/tiny", vocab_size=512, max_bytes=300_000)
        m["splits"]["train"]["tokens"], m["stats"]["chars_per_token"]
    """
    given = Tokenizer.load(tokenizer) if tokenizer is not None else None
    _check_options(vocab_size, given, max_bytes, val_fraction, test_fraction)
    vocab_size = vocab_size or 8000
    out = Path(out)
    t0 = time.perf_counter()
    src = resolve_source(source, max_bytes=max_bytes, cache_dir=cache_dir)  # a bad source: nothing is created
    created = _first_missing(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        _clean_stale(out)
        options = {"text_field": text_field, "max_bytes": max_bytes, "seed": seed, "val_fraction": val_fraction,
                   "test_fraction": test_fraction, "vocab_size": None if given else vocab_size}
        with tempfile.TemporaryDirectory(dir=out, prefix=".work-") as work:
            def load() -> datasets.Dataset:
                return load_documents(src, text_field=text_field, max_bytes=max_bytes, cache_dir=work)

            docs = load() if src.kind == "hf" else None  # a hub dataset is identified by its datasets fingerprint
            fingerprint = _fingerprint(src, options, given.sha256 if given else None,
                                       docs._fingerprint if docs else None)
            if not force and (manifest := _up_to_date(out, fingerprint)) is not None:
                log(f"{out} is up to date (input fingerprint {fingerprint[:12]}); nothing to do")
                return manifest
            check_replacement(out, _finished_manifest(out), given, force, log)
            (out / MANIFEST).unlink(missing_ok=True)  # while files are replaced the folder has no (stale) manifest
            docs = docs if docs is not None else load()
            if len(docs) < 3:
                raise DataError(f"source {source!r} gave {len(docs)} non-empty document(s)"
                                + (f" within --max-bytes {max_bytes}" if max_bytes else "")
                                + "; need at least 3 documents to make train/val/test splits")
            codes = assign_splits(len(docs), seed, val_fraction, test_fraction)
            t_read = time.perf_counter()
            if given is None:
                train_docs = docs.select(np.flatnonzero(codes == 0))
                log(f"training a {vocab_size}-piece BPE tokenizer on {len(train_docs)} train documents")
                texts = (t for batch in train_docs.iter(batch_size=256) for t in batch["text"])
                tok = train_tokenizer(texts, vocab_size, seed=seed)
            else:
                tok = given
            t_tok = time.perf_counter()
            dtype = dtype_for(tok.vocab_size)
            procs = min(num_proc or os.cpu_count() or 1, len(docs))
            encoded = docs.map(_Encoder(tok, dtype), batched=True, batch_size=64, num_proc=procs if procs > 1 else None,
                               remove_columns=["text"], desc="tokenising")
            t_enc = time.perf_counter()
            nchars, nbytes = np.asarray(docs["nchars"], dtype=np.int64), np.asarray(docs["nbytes"], dtype=np.int64)
            splits = _write_splits(out, encoded, codes, nchars, dtype)
            with atomic_open(out / TOKENIZER_FILE) as f:
                f.write(tok.model_proto)
            t_end = time.perf_counter()
            cpt = {k: _chars_per_token(v) for k, v in [*splits.items(), ("all", _total(splits))]}
            manifest = {
                "format_version": FORMAT_VERSION, "dtype": dtype, "vocab_size": tok.vocab_size,
                "eos_id": tok.eos_id, "bos_id": tok.bos_id, "pad_id": tok.pad_id,
                "tokenizer": {"file": TOKENIZER_FILE, "sha256": tok.sha256, "trained": given is None,
                              "given": str(tokenizer) if given else None, "trainer": TRAINER_SETTINGS},
                "splits": splits,
                "source": {"spec": source, "kind": src.kind, "files": len(src.files), "documents": len(docs),
                           "bytes": int(nbytes.sum()), "chars": int(nchars.sum())},
                "options": options, "input_fingerprint": fingerprint,
                "stats": {"chars_per_token": cpt, "num_proc": procs,
                          "seconds": {"read": round(t_read - t0, 2), "tokenizer": round(t_tok - t_read, 2),
                                      "tokenise": round(t_enc - t_tok, 2), "write": round(t_end - t_enc, 2)}},
                "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": command or " ".join(sys.argv),
            }
            with atomic_open(out / MANIFEST) as f:
                f.write((json.dumps(manifest, indent=2) + "\n").encode())
        log(f"wrote {out}: "
            + ", ".join(f"{k} {v['tokens']:,} tokens / {v['documents']} docs" for k, v in splits.items())
            + f"; vocab {tok.vocab_size}; chars/token {cpt['all']} (val {cpt['val']}); {t_end - t0:.1f} s")
        for name, info in splits.items():
            if info["tokens"] < TYPICAL_WINDOW:
                log(f"warning: the {name} split has {info['tokens']:,} tokens, fewer than one window of "
                    f"configs/base.json ({TYPICAL_WINDOW:,} = T 512 + 1): training refuses a split shorter than "
                    f"data.seq_len + 1 and evaluation scores no longer window; raise --max-bytes"
                    + ("" if name == "train" else f" or --{name}-fraction"))
        return manifest
    except BaseException:
        if created is not None:  # a failed first build (e.g. a vocabulary too large for the corpus) leaves nothing
            shutil.rmtree(created, ignore_errors=True)
        raise


def _first_missing(path: Path) -> Path | None:
    """The outermost of `path` and its ancestors that does not exist yet (what mkdir(parents=True) creates)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing
