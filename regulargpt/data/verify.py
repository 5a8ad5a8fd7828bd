"""Checking a split file against its manifest entry when a job opens it, at one of three levels.

=========  =====================================================================  ==================================
level      checks                                                                 reads
=========  =====================================================================  ==================================
size       the file exists and holds exactly ``tokens × itemsize`` bytes           one stat
blocks     size, and the sha256 of the 64 blocks of 64 KiB recorded at             at most 4 MiB, whatever the size
(default)  preparation (:mod:`regulargpt.data.integrity`)
full       blocks, and the sha256 of the whole file vs the manifest's ``sha256``  the whole file, once per file
                                                                                  version (:mod:`.digest_cache`)
=========  =====================================================================  ==================================

A mismatch is a :class:`DataError` in one line naming the file, the check, the expected and actual values and the
command that rebuilds the folder with its own tokenizer, e.g.

    token file data/tiny/test.bin fails its block check: block at offset 0 (65536 bytes): sha256 expected
    <12 hex digits>… got <12 hex digits>…; the file changed after data/tiny/manifest.json was written (damaged,
    truncated or rewritten in place); re-prepare the folder: python data_prep/prepare.py --source python-stdlib
    --out data/tiny --tokenizer data/tiny/tokenizer.model --text-field text --max-bytes 300000 --seed 0
    --val-fraction 0.05 --test-fraction 0.05 --force

A manifest written before block checksums were recorded (no ``blocks``) is checked as far as it allows; the
returned note says so and how to add them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from regulargpt.data.digest_cache import file_sha256
from regulargpt.data.sources import DataError

__all__ = ["DEFAULT_LEVEL", "LEVELS", "VerifyLevel", "verify_split_file"]

VerifyLevel = Literal["size", "blocks", "full"]
LEVELS: tuple[str, ...] = get_args(VerifyLevel)
DEFAULT_LEVEL: VerifyLevel = "blocks"


def _short(digest: str) -> str:
    return f"{digest[:12]}…"


class _Check:
    """One split file and what a failure message needs: its manifest and the re-prepare command."""

    def __init__(self, path: Path, manifest_path: Path, fix: str) -> None:
        self.path, self.manifest_path, self.fix = path, manifest_path, fix

    def fail(self, check: str, detail: str) -> DataError:
        return DataError(f"token file {self.path} fails its {check} check: {detail}; the file changed after "
                         f"{self.manifest_path} was written (damaged, truncated or rewritten in place); re-prepare "
                         f"the folder: {self.fix}")

    def size(self, tokens: int, dtype: np.dtype) -> None:
        if not self.path.is_file():
            raise DataError(f"token file {self.path} does not exist (listed in {self.manifest_path}); re-prepare the "
                            f"folder: {self.fix}")
        size, itemsize = self.path.stat().st_size, dtype.itemsize
        if size % itemsize:
            raise self.fail("size", f"{self.path.name} has {size} bytes, not a multiple of {itemsize} ({dtype.name})")
        if size != tokens * itemsize:
            raise self.fail("size", f"{self.path.name} holds {size // itemsize} tokens ({size} bytes) but "
                                    f"{self.manifest_path.name} expects {tokens} tokens ({tokens * itemsize} bytes)")

    def blocks(self, record: Any) -> None:
        try:
            block_bytes, offsets, digests = int(record["block_bytes"]), list(record["offsets"]), list(record["sha256"])
            if len(offsets) != len(digests) or block_bytes <= 0:
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise DataError(f"{self.manifest_path}: splits entry of {self.path.name}: key 'blocks' is not a "
                            f"{{block_bytes, offsets, sha256}} record of equal-length lists; re-prepare the "
                            f"folder: {self.fix}") from None
        bad = []
        with open(self.path, "rb") as handle:
            for offset, expected in zip(offsets, digests):
                handle.seek(offset)
                got = hashlib.sha256(handle.read(block_bytes)).hexdigest()
                if got != expected:
                    bad.append((offset, expected, got))
        if bad:
            offset, expected, got = bad[0]
            more = f" ({len(bad)} of {len(offsets)} blocks differ)" if len(bad) > 1 else ""
            raise self.fail("block", f"block at offset {offset} ({block_bytes} bytes): sha256 expected "
                                     f"{_short(expected)} got {_short(got)}{more}")

    def full(self, expected: str) -> None:
        got, _ = file_sha256(self.path)
        if got != expected:
            raise self.fail("full sha256", f"sha256 of the whole file expected {_short(expected)} got {_short(got)}")


def verify_split_file(path: Path, info: dict[str, Any], dtype: np.dtype, level: str, manifest_path: Path,
                      fix: str) -> tuple[VerifyLevel, str | None]:
    """Check the split file `path` against its manifest entry `info` ({tokens, blocks?, sha256?}) at `level`.

    → (the level actually verified, a note when the manifest lacks what `level` needs, else None). `fix` is the
    re-prepare command the messages end with. Example: an entry without ``blocks`` at level ``blocks`` →
    ``("size", "data/old/manifest.json records no block checksums …")``.
    """
    if level not in LEVELS:
        raise DataError(f"verification level {level!r} is not one of {', '.join(LEVELS)}")
    check = _Check(path, manifest_path, fix)
    check.size(int(info["tokens"]), dtype)
    if level == "size":
        return "size", None
    has_blocks, has_sha = "blocks" in info, isinstance(info.get("sha256"), str)
    if has_blocks:
        check.blocks(info["blocks"])
    if level == "full" and has_sha:
        check.full(info["sha256"])
        return "full", None
    if level == "blocks" and has_blocks:
        return "blocks", None
    missing = " and no ".join(what for what, there in (("block checksums", has_blocks),
                                                      ("sha256", level != "full" or has_sha)) if not there)
    done: VerifyLevel = "blocks" if has_blocks else "size"
    return done, (f"{manifest_path} records no {missing} for its splits (prepared before they were recorded): "
                  f"checked up to level {done!r} only; to add them, re-prepare the folder: {fix}")
