"""Streaming the documents of a resolved source, one at a time, in a fixed order, without a copy on disk.

`read_documents(source, ...)` yields the kept documents' texts (empty ones dropped, then `select_within`'s
`max_bytes` rule applied on the fly), reading local files directly: a text file is one document (UTF-8, universal
newlines: "\\r\\n" and "\\r" read as "\\n"), a jsonl/json(.gz) file one document per row, a parquet file one per row
(in batches). Only a hub dataset (`hf:`) is first downloaded into an Arrow cache by `datasets`.

Bad input is one DataError naming the file and the row (line) and what was expected; with `skip_bad_rows` the row
(or file) is skipped instead and counted in `reader.skipped` (reason → count), which the manifest records:

    reader = DocumentReader(resolve_source("corpus/*.jsonl"), text_field="text", skip_bad_rows=True)
    for text in reader:
        ...
    reader.skipped  # e.g. {"text field 'text' is null": 2}
"""
from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from regulargpt.data.encoding import split_code, unit_hash
from regulargpt.data.sources import DataError, Source

_READ_BLOCK = 1 << 20


class DocumentReader:
    """Iterable over the kept documents of `source` (see the module docstring); `bytes_read` is the input bytes
    consumed so far (for progress), `skipped` the counted skips, `documents`/`bytes`/`chars` what was kept."""

    def __init__(self, source: Source, *, text_field: str = "text", max_bytes: int | None = None,
                 skip_bad_rows: bool = False, hf_cache: str | Path | None = None) -> None:
        self.source, self.text_field, self.max_bytes = source, text_field, max_bytes
        self.skip_bad_rows, self.hf_cache = skip_bad_rows, hf_cache
        self.skipped: dict[str, int] = {}
        self.bytes_read = self.documents = self.bytes = self.chars = 0
        self._file = 0  # index of the file the current document comes from
        self._kept_splits: list[int] = []  # source.file_splits of each kept document's file, when the source fixes them

    @property
    def input_bytes(self) -> int:
        """Total size of the input files (the progress bars' 100%); 0 for a hub dataset."""
        return sum(f.stat().st_size for f in self.source.files)

    def __iter__(self) -> Iterator[str]:
        self.skipped, self.bytes_read, self.documents, self.bytes, self.chars = {}, 0, 0, 0, 0
        self._kept_splits = []
        for text in self._raw():
            if not text:
                continue
            size = len(text.encode("utf-8"))
            if self.max_bytes is not None and self.bytes + size > self.max_bytes:
                continue  # select_within: a document past the limit is skipped, later smaller ones still fit
            self.documents, self.bytes, self.chars = self.documents + 1, self.bytes + size, self.chars + len(text)
            if self.source.file_splits:
                self._kept_splits.append(self.source.file_splits[self._file])
            yield text

    def split_of(self, index: int, seed: int, val_fraction: float, test_fraction: float) -> int:
        """Split code (0 train, 1 val, 2 test) of kept document `index` (already read): its file's split where the
        source fixes one (python-packages: by package), else the document rule of shards.assign_splits."""
        if self.source.file_splits:
            return self._kept_splits[index]
        return split_code(unit_hash(seed, index), val_fraction, test_fraction)

    # ------------------------------------------------------------------------------------------ problems
    def _bad(self, reason: str, where: str) -> None:
        """Count a skip (with --skip-bad-rows) or raise one line naming `where` and `reason`."""
        if not self.skip_bad_rows:
            raise DataError(f"{where}: {reason}; fix the input or pass --skip-bad-rows to skip (and count) such rows")
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def _row_text(self, row: object, where: str) -> str | None:
        field = self.text_field
        if not isinstance(row, dict):
            self._bad(f"expected a JSON object with a {field!r} field, got {type(row).__name__}", where)
            return None
        if field not in row:
            self._bad(f"no text field {field!r}; its keys are {sorted(row)[:8]} (--text-field NAME names another)",
                      where)
            return None
        value = row[field]
        if value is None:
            self._bad(f"text field {field!r} is null", where)
            return None
        if not isinstance(value, str):
            self._bad(f"text field {field!r} is a {type(value).__name__}, expected a string", where)
            return None
        return value

    # ------------------------------------------------------------------------------------------ readers
    def _raw(self) -> Iterator[str | None]:
        kind = self.source.kind
        if kind == "hf":
            yield from self._hub()
            return
        for self._file, path in enumerate(self.source.files):
            if kind == "text":
                yield self._text_file(path)
            elif kind == "json":
                yield from self._json_file(path)
            else:
                yield from self._parquet_file(path)

    def _text_file(self, path: Path) -> str | None:
        data = path.read_bytes()
        self.bytes_read += len(data)
        if b"\x00" in data[:_READ_BLOCK] or data[257:262] == b"ustar":
            self._bad("binary content (NUL bytes: an archive or a binary file?); expected UTF-8 text", str(path))
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            self._bad(f"byte 0x{data[err.start]:02x} at offset {err.start} is not UTF-8 (Latin-1 text? convert it "
                      f"with `iconv -f latin1 -t utf-8`)", str(path))
            return None
        return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text  # as open()'s newlines

    def _json_lines(self, path: Path) -> IO[bytes]:
        return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")

    def _json_file(self, path: Path) -> Iterator[str | None]:
        with self._json_lines(path) as handle:
            head = handle.read(_READ_BLOCK)
            handle.seek(0)
            if head.lstrip()[:1] == b"[":  # a JSON array file: read whole (use jsonl for large corpora)
                rows = self._parse(handle.read(), path, None)
                self.bytes_read += path.stat().st_size
                for number, row in enumerate(rows if isinstance(rows, list) else [], start=1):
                    yield self._row_text(row, f"{path} row {number}")
                return
            for number, line in enumerate(handle, start=1):
                self.bytes_read += len(line)
                if not line.strip():
                    continue
                row = self._parse(line, path, number)
                if row is not _SKIP:
                    yield self._row_text(row, f"{path} line {number}")

    def _parse(self, data: bytes, path: Path, number: int | None) -> object:
        where = f"{path} line {number}" if number is not None else str(path)
        try:
            return json.loads(data)
        except UnicodeDecodeError as err:
            self._bad(f"not UTF-8 (byte {err.start})", where)
        except json.JSONDecodeError as err:
            self._bad(f"malformed JSON at column {err.colno} ({err.msg.removesuffix(' at')})", where)
        return _SKIP

    def _parquet_file(self, path: Path) -> Iterator[str | None]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            handle = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise DataError(f"{path}: not a readable parquet file ({err})") from None
        schema = handle.schema_arrow
        if self.text_field not in schema.names:
            raise DataError(f"source {self.source.spec!r} has no text field {self.text_field!r}; its columns are "
                            f"{schema.names} (pass --text-field NAME)")
        kind = schema.field(self.text_field).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise DataError(f"source {self.source.spec!r}: field {self.text_field!r} has type {kind}, expected "
                            f"strings")
        size, rows, number = path.stat().st_size, max(1, handle.metadata.num_rows), 0
        for batch in handle.iter_batches(batch_size=1024, columns=[self.text_field]):
            for value in batch.column(0).to_pylist():
                number += 1
                if value is None:
                    self._bad(f"null text field {self.text_field!r}", f"{path} row {number}")
                yield value
            self.bytes_read += size * batch.num_rows // rows

    def _hub(self) -> Iterator[str | None]:
        import datasets

        src = self.source
        try:
            ds = datasets.load_dataset(src.hf_name, src.hf_config, split="train",
                                       cache_dir=str(self.hf_cache) if self.hf_cache else None)
        except Exception as e:  # offline, unknown name, gated, ...: datasets raises many types
            raise DataError(f"source {src.spec!r}: could not load the 'train' split of hub dataset "
                            f"{src.hf_name!r} (config {src.hf_config!r}): {type(e).__name__}: {e}. "
                            f"hf: sources need access to the Hugging Face hub; use local files otherwise") from e
        if self.text_field not in ds.column_names:
            raise DataError(f"source {src.spec!r} has no text field {self.text_field!r}; its columns are "
                            f"{ds.column_names} (pass --text-field NAME)")
        for number, batch in enumerate(ds.select_columns([self.text_field]).iter(batch_size=1024)):
            for offset, value in enumerate(batch[self.text_field]):
                if value is None:
                    self._bad(f"null text field {self.text_field!r}", f"{src.spec} row {number * 1024 + offset}")
                yield value


_SKIP = object()
