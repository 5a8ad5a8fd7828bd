"""Reading a prepared data folder (regulargpt/data/shards.py writes it): the manifest, validated key by key, and
each split's flat token stream, memory-mapped read-only.

The folder holds `tokenizer.model`, `train.bin`, `val.bin`, `test.bin` (uint16 when the vocabulary fits, else uint32)
and `manifest.json` (format_version, dtype, vocab_size, eos_id, tokenizer {file, sha256}, splits {tokens, documents,
file, sha256, blocks}; the last two are what regulargpt.data.verify checks a split against when it is opened).
Example:

    split = open_split("data/stdlib", "val", vocab_size=8000)
    len(split) == load_manifest("data/stdlib")["splits"]["val"]["tokens"]  # True
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from regulargpt.data.reprepare import reprepare_command
from regulargpt.data.sources import KNOWN_SOURCES, DataError
from regulargpt.data.verify import DEFAULT_LEVEL, verify_split_file
from regulargpt.files import read_json_object, sha256_file

FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.model"
_DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def _require(mapping: dict, key: str, kind: type | tuple[type, ...], where: str, expected: str) -> object:
    if not isinstance(mapping, dict) or key not in mapping:
        raise DataError(f"{where}: missing key {key!r} (expected {expected})")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
        raise DataError(f"{where}: key {key!r} is {value!r}, expected {expected}")
    return value


def load_manifest(data_dir: str | Path, vocab_size: int | None = None) -> dict:
    """Read and validate `<data_dir>/manifest.json`; DataError naming the folder, file or key otherwise.
    `vocab_size` (the model's) goes into the hint for a missing folder, so following it gives matching data; a
    folder that still holds its tokenizer.model gets a hint that keeps it (:mod:`regulargpt.data.reprepare`).

    Example:

        load_manifest("data/stdlib")["dtype"]  # 'uint16'
    """
    data_dir = Path(data_dir)
    # the source a folder's name suggests (data/debian-prose → debian-prose), else the one every machine has
    source = next((known for known in sorted(KNOWN_SOURCES, key=len, reverse=True) if known in data_dir.name),
                  "python-stdlib")
    # a folder that still holds its tokenizer is rebuilt with it (--tokenizer): its runs were trained with it
    hint = f"run `{reprepare_command(data_dir, None, source, vocab_size)}` (or another --source)"
    if not data_dir.is_dir():
        raise DataError(f"data folder {data_dir} does not exist; {hint}")
    path = data_dir / MANIFEST
    if not path.is_file():
        raise DataError(f"data folder {data_dir} has no {MANIFEST} (not prepared, or a prepare was interrupted); "
                        f"{hint}")
    manifest = read_json_object(path, DataError, hint)
    where = str(path)
    version = _require(manifest, "format_version", int, where, f"an integer, this code reads {FORMAT_VERSION}")
    if version != FORMAT_VERSION:
        raise DataError(f"{where}: format_version {version} is not supported (expected {FORMAT_VERSION}); {hint}")
    if _require(manifest, "dtype", str, where, "'uint16' or 'uint32'") not in _DTYPES:
        raise DataError(f"{where}: key 'dtype' is {manifest['dtype']!r}, expected 'uint16' or 'uint32'")
    if _require(manifest, "vocab_size", int, where, "a positive integer") == 0:
        raise DataError(f"{where}: key 'vocab_size' is 0, expected a positive integer")
    tok = _require(manifest, "tokenizer", dict, where, "an object {file, sha256}")
    for key in ("file", "sha256"):
        _require(tok, key, str, f"{where} tokenizer", "a string")
    splits = _require(manifest, "splits", dict, where, f"an object with keys {list(SPLITS)}")
    for name in SPLITS:
        info = _require(splits, name, dict, f"{where} splits", "an object {tokens, documents, file}")
        for key, kind, expected in (("tokens", int, "a token count >= 0"), ("documents", int, "a document count >= 0"),
                                    ("file", str, "a file name")):
            _require(info, key, kind, f"{where} splits.{name}", expected)
    return manifest


class TokenSplit:
    """One split of a prepared data folder, memory-mapped read-only: `len(split)` tokens in `split.tokens`, checked
    against the manifest at level `verify` (regulargpt.data.verify: size, blocks by default, or full; a mismatch
    is a DataError naming the check and the re-prepare command).

    Example:

        split = TokenSplit("data/stdlib", "train", vocab_size=8000)
        split.tokens[:5], split.manifest["dtype"], split.tokenizer_path  # memmap, 'uint16', data/stdlib/tokenizer.model
    """

    def __init__(self, data_dir: str | Path, split: str, vocab_size: int | None = None,
                 verify: str = DEFAULT_LEVEL) -> None:
        self.data_dir = Path(data_dir)
        self.manifest = load_manifest(self.data_dir)
        self.name = split
        if split not in self.manifest["splits"]:
            raise DataError(f"{self.data_dir / MANIFEST}: no split {split!r} "
                            f"(expected one of {sorted(self.manifest['splits'])})")
        if vocab_size is not None and vocab_size != self.manifest["vocab_size"]:
            raise DataError(f"vocab_size {vocab_size} does not match data folder {self.data_dir}, tokenised with "
                            f"vocab_size {self.manifest['vocab_size']} ({MANIFEST}); set the model's vocab_size to "
                            f"{self.manifest['vocab_size']} or prepare the data with --vocab-size {vocab_size}")
        info = self.manifest["splits"][split]
        self.path = self.data_dir / info["file"]
        self.dtype = np.dtype(_DTYPES[self.manifest["dtype"]])
        self.vocab_size: int = self.manifest["vocab_size"]
        self.eos_id: int | None = self.manifest.get("eos_id")
        self.documents: int = info["documents"]
        self.tokenizer_path = self.data_dir / self.manifest["tokenizer"]["file"]
        # the level reached (a manifest without block checksums allows less), and a note saying so
        self.verified, self.note = verify_split_file(self.path, info, self.dtype, verify, self.data_dir / MANIFEST,
                                                     reprepare_command(self.data_dir, self.manifest))
        self.tokens: np.ndarray = (np.memmap(self.path, dtype=self.dtype, mode="r") if info["tokens"]
                                   else np.empty(0, dtype=self.dtype))

    @property
    def fingerprint(self) -> dict[str, str | int | None]:
        """What identifies the split's content: {"sha256": the manifest's sha256 of the file (None in a manifest
        without it), "tokens": its token count}. Result rows record it (regulargpt.evaluation.length_sweep)."""
        info = self.manifest["splits"][self.name]
        sha = info.get("sha256")
        return {"sha256": sha if isinstance(sha, str) else None, "tokens": info["tokens"]}

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __repr__(self) -> str:
        return f"TokenSplit({str(self.data_dir)!r}, {self.name!r}: {len(self):,} tokens, {self.dtype.name})"

    def check_token_range(self, vocab_size: int | None = None, chunk: int = 1 << 24) -> None:
        """Scan the ids in chunks; DataError naming the first position of an id >= vocab_size (default: manifest's)."""
        limit = self.vocab_size if vocab_size is None else vocab_size
        for start in range(0, len(self), chunk):
            block = np.asarray(self.tokens[start:start + chunk])
            if block.size and int(block.max()) >= limit:
                pos = start + int(np.argmax(block >= limit))
                raise DataError(f"token file {self.path}: token id {int(self.tokens[pos])} at position {pos} is >= "
                                f"vocab_size {limit}")


def check_tokenizer(data_dir: str | Path) -> Path:
    """The data folder's tokenizer file, checked against the sha256 its manifest records → its path.

    DataError when it is missing or differs: the token files were made with another tokenizer than the one there.
    """
    data_dir = Path(data_dir)
    manifest = load_manifest(data_dir)
    path = data_dir / manifest["tokenizer"]["file"]
    if not path.is_file():
        raise DataError(f"tokenizer file {path} does not exist (listed in {data_dir / MANIFEST}); re-run "
                        f"data_prep/prepare.py for {data_dir}")
    digest = sha256_file(path)
    if digest != manifest["tokenizer"]["sha256"]:
        raise DataError(f"tokenizer file {path} has sha256 {digest[:12]}… but {data_dir / MANIFEST} was written "
                        f"for {manifest['tokenizer']['sha256'][:12]}…: the manifest and the tokenizer disagree; "
                        f"re-run data_prep/prepare.py for {data_dir}")
    return path


def open_split(data_dir: str | Path, split: str, vocab_size: int | None = None,
               verify: str = DEFAULT_LEVEL) -> TokenSplit:
    """Open one split of a prepared data folder, checked at level `verify` (size, blocks or full:
    regulargpt.data.verify; TokenSplit); e.g. `open_split("data/stdlib", "val", verify="full")`."""
    return TokenSplit(data_dir, split, vocab_size, verify)
