"""Token shards: corpus → split → tokenizer → flat `<split>.bin` token streams + `manifest.json` (read back by
regulargpt/data/token_split.py).

A prepared data folder holds `tokenizer.model`, `train.bin`, `val.bin`, `test.bin` (each document's tokens followed by
the tokenizer's eos id, concatenated; uint16 when the vocabulary fits, else uint32) and `manifest.json`.

Preparation streams, in bounded memory and without a copy of the corpus:

1. **sample** (when training a tokenizer): read the documents once, keep a reproducible sample of the train split
   within `sample_bytes` (regulargpt/data/tokenizer_sample.py);
2. **tokenizer**: train sentencepiece BPE on the sample;
3. **encode**: read the documents again, in batches of about `BATCH_CHARS` characters, encoded by worker processes
   (regulargpt/data/encoding.py) and appended to the split files, checkpointed every `CHECKPOINT_SECONDS`
   (regulargpt/data/split_writer.py: a killed preparation resumes there);
4. **finish**: checksums, manifest, and the work folder replaces the old folder in one step
   (regulargpt/data/rebuild.py: a kill at any moment leaves the old folder or the new one).

Example:

    manifest = prepare("python-stdlib", "data/stdlib", vocab_size=8000)
    split = open_split("data/stdlib", "val", vocab_size=8000)
    assert len(split) == manifest["splits"]["val"]["tokens"]
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from regulargpt.data.documents import DocumentReader
from regulargpt.data.encoding import EncoderPool, split_code, unit_hash
from regulargpt.data.integrity import block_checksums
from regulargpt.data.rebuild import claim_work_folder, replace_folder
from regulargpt.data.sources import DataError, Source, resolve_source
from regulargpt.data.split_writer import SplitWriter, fill_empty_splits, read_state, write_state
from regulargpt.data.tokenizer import TRAINER_SETTINGS, Tokenizer, train_tokenizer
from regulargpt.data.tokenizer_replacement import check_replacement
from regulargpt.data.tokenizer_sample import DEFAULT_SAMPLE_BYTES, TokenizerSample
from regulargpt.data.token_split import FORMAT_VERSION, MANIFEST, SPLITS, TOKENIZER_FILE, load_manifest
from regulargpt.files import atomic_write_bytes, sha256_file
from regulargpt.write_errors import explain_write_error

# A split shorter than one training window of configs/base.json (T = 512, plus the target) is worth a warning:
# training refuses a split shorter than data.seq_len + 1, and evaluation scores no window longer than it.
TYPICAL_WINDOW = 512 + 1
BATCH_CHARS = 1 << 20
"""Characters of text per encoding batch (the unit of work of a worker, and of resuming)."""
CHECKPOINT_SECONDS = 2.0
MIN_VOCAB = 260  # 256 byte pieces + unk/bos/eos/pad


def dtype_for(vocab_size: int) -> str:
    """Smallest stored dtype for ids < vocab_size: `dtype_for(8000) == "uint16"`, `dtype_for(100_000) == "uint32"`."""
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


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
    u = np.array([unit_hash(seed, i) for i in range(num_documents)])
    codes = np.array([split_code(x, val_fraction, test_fraction) for x in u], dtype=np.int8)
    fill_empty_splits(codes, lambda idx: u[idx], val_fraction, test_fraction)
    return codes


# ---------------------------------------------------------------------------------------------------- checks
def _fingerprint(source: Source, options: dict[str, object], tokenizer_sha: str | None) -> str:
    """sha256 of everything the outputs depend on (see docs/DATA.md, `input_fingerprint`)."""
    material = {
        "format_version": FORMAT_VERSION, "source": source.spec, "kind": source.kind, "options": options,
        "inputs": [source.hf_name, source.hf_config] if source.kind == "hf" else source.fingerprint_items(),
        "tokenizer": tokenizer_sha or {"trainer": TRAINER_SETTINGS},
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def _up_to_date(out: Path, fingerprint: str) -> dict | None:
    """The existing manifest if it has this fingerprint and its files are all there with the right sizes."""
    manifest = _finished_manifest(out)
    if manifest is None or manifest.get("input_fingerprint") != fingerprint:
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


def _current_tokenizer(out: Path) -> dict | None:
    """What `out` holds: its manifest, or for a folder with a tokenizer and no manifest (an interrupted or damaged
    folder) a stand-in naming that tokenizer, so that it is not replaced without --force either."""
    manifest = _finished_manifest(out)
    if manifest is None and (out / TOKENIZER_FILE).is_file():
        return {"tokenizer": {"file": TOKENIZER_FILE, "sha256": sha256_file(out / TOKENIZER_FILE)}}
    return manifest


def _check_options(vocab_size: int | None, tokenizer: Tokenizer | None, max_bytes: int | None,
                   val_fraction: float, test_fraction: float, sample_bytes: int) -> None:
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DataError(f"--val-fraction {val_fraction} and --test-fraction {test_fraction}: expected each in (0, 1) "
                        f"and their sum below 1")
    if max_bytes is not None and max_bytes <= 0:
        raise DataError(f"--max-bytes {max_bytes}: expected a positive number of bytes")
    if sample_bytes <= 0:
        raise DataError(f"--tokenizer-sample-bytes {sample_bytes}: expected a positive number of bytes")
    if tokenizer is None and vocab_size is not None and vocab_size < MIN_VOCAB:
        raise DataError(f"--vocab-size {vocab_size}: expected >= {MIN_VOCAB} (256 byte pieces + unk/bos/eos/pad)")
    if tokenizer is not None and vocab_size is not None and vocab_size != tokenizer.vocab_size:
        raise DataError(f"--vocab-size {vocab_size} disagrees with --tokenizer {tokenizer.path} "
                        f"(vocab_size {tokenizer.vocab_size}); drop --vocab-size or pass {tokenizer.vocab_size}")


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} is a file; expected a data folder (new, or one prepared before)")


def _train(texts: list[str], vocab_size: int, seed: int) -> Tokenizer:
    """train_tokenizer, with sentencepiece's "vocabulary too small" turned into the minimum it needs."""
    try:
        return train_tokenizer(texts, vocab_size, seed=seed)
    except DataError as err:
        need = re.search(r"(\d+) vs (\d+)|Please set it to a value >= (\d+)", str(err.__cause__))
        if need:
            minimum = need.group(3) or max(int(need.group(1)), int(need.group(2)))
            raise DataError(f"--vocab-size {vocab_size} is too small for this text: sentencepiece needs at least "
                            f"{minimum} pieces (256 byte pieces, 4 special ids and every character it must keep); "
                            f"pass --vocab-size {minimum} or more") from None
        raise


# ---------------------------------------------------------------------------------------------------- phases
def _bar(desc: str, total: int | None) -> tqdm:
    return tqdm(total=total or None, unit="B", unit_scale=True, desc=desc, file=sys.stderr, dynamic_ncols=True)


def _sample_and_train(reader: DocumentReader, work: Path, vocab_size: int, sample_bytes: int, seed: int,
                      fractions: tuple[float, float], log: Callable[[str], None]) -> tuple[Tokenizer, dict]:
    """Phases 1–2 (or their result from an interrupted run): the sample, and the tokenizer trained on it."""
    state = read_state(work)
    if "sample" in state and (work / TOKENIZER_FILE).is_file():
        return Tokenizer.load(work / TOKENIZER_FILE), state["sample"]
    sample, codes, train_bytes = TokenizerSample(sample_bytes, seed), bytearray(), 0
    t0 = time.perf_counter()
    with _bar("sample (read)", reader.input_bytes) as bar:
        for index, text in enumerate(reader):
            code = reader.split_of(index, seed, *fractions)
            codes.append(code)
            if code == 0:
                sample.add(index, text)
                train_bytes += len(text)
            bar.update(reader.bytes_read - bar.n)
    _check_count(reader)
    final = np.frombuffer(codes, dtype=np.int8).copy()
    moved = fill_empty_splits(final, lambda idx: [unit_hash(seed, int(i)) for i in idx], *fractions)
    for index, donor, _ in moved:
        if donor == 0:
            sample.discard(index)
    texts = [text for _, text in sample.texts()]
    info = {"documents": len(texts), "bytes": sample.bytes, "budget": sample_bytes,
            "train_documents": int((final == 0).sum()), "seconds": round(time.perf_counter() - t0, 2)}
    log(f"training a {vocab_size}-piece BPE tokenizer on a sample of {len(texts):,} train documents "
        f"({sample.bytes / 1e6:.1f} MB of ~{train_bytes / 1e6:.1f} M characters; --tokenizer-sample-bytes "
        f"{sample_bytes:,})")
    tok = _train(texts, vocab_size, seed)
    del texts, sample
    with explain_write_error(work / TOKENIZER_FILE, "the tokenizer"):
        atomic_write_bytes(work / TOKENIZER_FILE, tok.model_proto)
    write_state(work, {"sample": info})
    return tok, info


def _check_count(reader: DocumentReader) -> None:
    if reader.documents < 3:
        within = f" within --max-bytes {reader.max_bytes}" if reader.max_bytes else ""
        raise DataError(f"source {reader.source.spec!r} gave {reader.documents} non-empty document(s){within}; "
                        f"need at least 3 documents to make train/val/test splits")


def _batches(reader: DocumentReader, skip: int, seed: int, fractions: tuple[float, float]
             ) -> Iterator[tuple[int, list[str], list[int] | None]]:
    """(index of the first document, texts, their split codes where the source fixes them, else None) of about
    BATCH_CHARS characters each, after the first `skip`."""
    index, texts, chars = skip, [], 0
    fixed = bool(reader.source.file_splits)

    def batch() -> tuple[int, list[str], list[int] | None]:
        codes = [reader.split_of(index + k, seed, *fractions) for k in range(len(texts))] if fixed else None
        return index, texts, codes

    for text in itertools.islice(reader, skip, None):
        texts.append(text)
        chars += len(text)
        if chars >= BATCH_CHARS:
            yield batch()
            index, texts, chars = index + len(texts), [], 0
    if texts:
        yield batch()


def _encode(reader: DocumentReader, work: Path, tok: Tokenizer, dtype: str, procs: int, seed: int,
            fractions: tuple[float, float], log: Callable[[str], None]) -> dict[str, dict[str, int]]:
    """Phase 3: stream the documents through the workers into the split files → {split: tokens/documents/chars}."""
    writer = SplitWriter(work, dtype)
    if writer.documents:
        log(f"resuming from document {writer.documents:,} (work folder {work})")
    options = {"dtype": dtype, "seed": seed, "val_fraction": fractions[0], "test_fraction": fractions[1]}
    last = -CHECKPOINT_SECONDS  # the first batch is checkpointed at once, then every CHECKPOINT_SECONDS
    try:
        with EncoderPool(tok.model_proto, options, procs) as pool, _bar("encode (read)", reader.input_bytes) as bar:
            for result in pool.map(_batches(reader, writer.documents, seed, fractions)):
                writer.append(*result)
                bar.update(reader.bytes_read - bar.n)
                if time.monotonic() - last > CHECKPOINT_SECONDS:
                    writer.checkpoint()
                    last = time.monotonic()
        _check_count(reader)
        return writer.finish(seed, *fractions)
    finally:
        writer.close()


def _chars_per_token(info: dict) -> float:
    """Characters per token, not counting the eos token that ends each document."""
    return round(int(info["chars"]) / max(1, int(info["tokens"]) - int(info["documents"])), 3)


def _total(splits: dict[str, dict]) -> dict[str, int]:
    return {key: sum(int(v[key]) for v in splits.values()) for key in ("tokens", "documents", "chars")}


# ---------------------------------------------------------------------------------------------------- preparing
def prepare(source: str, out: str | Path, *, vocab_size: int | None = None, tokenizer: str | Path | None = None,
            max_bytes: int | None = None, seed: int = 0, val_fraction: float = 0.05, test_fraction: float = 0.05,
            text_field: str = "text", num_proc: int | None = None, cache_dir: str | Path | None = None,
            force: bool = False, skip_bad_rows: bool = False, sample_bytes: int = DEFAULT_SAMPLE_BYTES,
            command: str | None = None, log: Callable[[str], None] = print) -> dict:
    """Build (or confirm up to date, or resume) a data folder from a source spec; returns the manifest.

    Trains a BPE tokenizer with `vocab_size` (default 8000) on a sample of the train split, or reuses `tokenizer` (a
    .model file, read before anything is replaced: it may be `out`'s own).

    Example:

        m = prepare("python-stdlib", "data/tiny", vocab_size=512, max_bytes=300_000)
        m["splits"]["train"]["tokens"], m["stats"]["chars_per_token"]
    """
    given = Tokenizer.load(tokenizer) if tokenizer is not None else None
    _check_options(vocab_size, given, max_bytes, val_fraction, test_fraction, sample_bytes)
    vocab_size = vocab_size or 8000
    out = Path(out)
    _check_out(out)
    t0 = time.perf_counter()
    src = resolve_source(source, max_bytes=max_bytes, cache_dir=cache_dir, seed=seed,  # a bad source: nothing is
                         fractions=(val_fraction, test_fraction))  # created
    options = {"text_field": text_field, "max_bytes": max_bytes, "seed": seed, "val_fraction": val_fraction,
               "test_fraction": test_fraction, "vocab_size": None if given else vocab_size,
               "skip_bad_rows": skip_bad_rows, "tokenizer_sample_bytes": None if given else sample_bytes}
    fingerprint = _fingerprint(src, options, given.sha256 if given else None)
    if not force and (manifest := _up_to_date(out, fingerprint)) is not None:
        log(f"{out} is up to date (input fingerprint {fingerprint[:12]}); nothing to do")
        return manifest
    check_replacement(out, _current_tokenizer(out) if out.is_dir() else None, given, force, log)
    created = _first_missing(out)
    out.mkdir(parents=True, exist_ok=True)
    work = claim_work_folder(out, f".work-{fingerprint[:16]}")
    fractions = (val_fraction, test_fraction)
    try:
        reader = DocumentReader(src, text_field=text_field, max_bytes=max_bytes, skip_bad_rows=skip_bad_rows,
                                hf_cache=work / "hub")
        sample = None
        if given is None:
            tok, sample = _sample_and_train(reader, work, vocab_size, sample_bytes, seed, fractions, log)
        else:
            tok = given
        t_tok = time.perf_counter()
        dtype = dtype_for(tok.vocab_size)
        procs = max(1, num_proc or os.cpu_count() or 1)
        counts = _encode(reader, work, tok, dtype, procs, seed, fractions, log)
        t_enc = time.perf_counter()
        splits = {}
        for name in SPLITS:
            path = work / f"{name}.bin"
            splits[name] = {**counts[name], "file": path.name, "sha256": sha256_file(path),
                            "blocks": block_checksums(path)}
        with explain_write_error(work / TOKENIZER_FILE, "the tokenizer"):
            atomic_write_bytes(work / TOKENIZER_FILE, tok.model_proto)
        cpt = {k: _chars_per_token(v) for k, v in [*splits.items(), ("all", _total(splits))]}
        manifest = {
            "format_version": FORMAT_VERSION, "dtype": dtype, "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id, "bos_id": tok.bos_id, "pad_id": tok.pad_id,
            "tokenizer": {"file": TOKENIZER_FILE, "sha256": tok.sha256, "trained": given is None,
                          "given": str(tokenizer) if given else None, "trainer": TRAINER_SETTINGS,
                          "sample": sample},
            "splits": splits,
            "source": {"spec": source, "kind": src.kind, "files": len(src.files), "documents": reader.documents,
                       "bytes": reader.bytes, "chars": reader.chars, "skipped": reader.skipped,
                       **({"packages": src.packages} if src.packages is not None else {})},
            "options": options, "input_fingerprint": fingerprint,
            "stats": {"chars_per_token": cpt, "num_proc": procs,
                      "seconds": {"read": (sample or {}).get("seconds", 0.0),
                                  "tokenizer": round(t_tok - t0 - (sample or {}).get("seconds", 0.0), 2),
                                  "tokenise": round(t_enc - t_tok, 2),
                                  "write": round(time.perf_counter() - t_enc, 2)}},
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": command or " ".join(sys.argv),
        }
        (work / "state.json").unlink(missing_ok=True)
        shutil.rmtree(work / "hub", ignore_errors=True)
        with explain_write_error(work / MANIFEST, "the manifest"):
            atomic_write_bytes(work / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())
        replace_folder(work, out, {MANIFEST, TOKENIZER_FILE, *(f"{name}.bin" for name in SPLITS)})
    except KeyboardInterrupt:
        log(f"interrupted; rerun the same command to resume ({work.name} keeps the finished batches)")
        raise
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if created is not None:  # a failed first build (e.g. a vocabulary too large for the corpus) leaves nothing
            shutil.rmtree(created, ignore_errors=True)
        raise
    skipped = f"; skipped {sum(reader.skipped.values())} bad rows {reader.skipped}" if reader.skipped else ""
    log(f"wrote {out}: "
        + ", ".join(f"{k} {v['tokens']:,} tokens / {v['documents']} docs" for k, v in splits.items())
        + f"; vocab {tok.vocab_size}; chars/token {cpt['all']} (val {cpt['val']}); "
          f"{time.perf_counter() - t0:.1f} s{skipped}")
    for name, info in splits.items():
        if info["tokens"] < TYPICAL_WINDOW:
            log(f"warning: the {name} split has {info['tokens']:,} tokens, fewer than one window of "
                f"configs/base.json ({TYPICAL_WINDOW:,} = T 512 + 1): training refuses a split shorter than "
                f"data.seq_len + 1 and evaluation scores no longer window; raise --max-bytes"
                + ("" if name == "train" else f" or --{name}-fraction"))
    return manifest


def _first_missing(path: Path) -> Path | None:
    """The outermost of `path` and its ancestors that does not exist yet (what mkdir(parents=True) creates)."""
    missing = None
    for p in (path, *path.parents):
        if p.exists():
            break
        missing = p
    return missing
