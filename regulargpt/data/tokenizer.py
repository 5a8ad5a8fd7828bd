"""A thin sentencepiece wrapper, and BPE training with settings that round-trip code exactly.

Example (with a prepared data folder):

    tok = Tokenizer.load("data/stdlib/tokenizer.model")
    code = "def f(x):\\n\\treturn x  # two spaces\\n"
    assert tok.decode(tok.encode(code)) == code
"""
from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece as spm

from regulargpt.data.sources import DataError

TRAIN_CHUNK_CHARS = 2048
"""Training "sentences" are runs of whole lines of at most this many characters (newlines included)."""

TRAIN_SENTENCE_CAP = 200_000
"""sentencepiece samples at most this many training sentences (~300 MB of text) to bound time and memory."""

TRAINER_SETTINGS: dict[str, object] = {
    "model_type": "bpe",
    "byte_fallback": True,  # any byte round-trips; rare characters become <0x..> pieces, never <unk>
    "character_coverage": 0.9995,
    "normalization_rule_name": "identity",  # no NFKC: decode(encode(x)) == x
    "remove_extra_whitespaces": False,  # keep indentation and runs of spaces
    "add_dummy_prefix": False,  # no invented leading space
    "allow_whitespace_only_pieces": True,  # "▁▁▁▁" (indentation) is one piece
    "split_by_whitespace": False,  # pieces may span spaces and newlines: "):\n▁▁▁▁" — code is ~3.9 chars/token
    "split_digits": True,  # numbers are spelled digit by digit (no arbitrary number pieces)
    "required_chars": "\n\t",  # newline and tab are always real pieces that can merge ("\n▁▁▁▁#")
    "max_sentencepiece_length": 32,  # 32 spaces of indentation, or a long identifier, can be one piece
    "max_sentence_length": 4 * TRAIN_CHUNK_CHARS,  # bytes; a chunk of TRAIN_CHUNK_CHARS characters always fits
    "input_sentence_size": TRAIN_SENTENCE_CAP,
    "shuffle_input_sentence": True,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "pad_id": 3,
    "minloglevel": 2,
}
"""sentencepiece trainer options (besides vocab_size/num_threads); part of the data fingerprint."""


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of bytes, e.g. `sha256_bytes(b"")[:8] == "e3b0c442"`."""
    return hashlib.sha256(data).hexdigest()


class Tokenizer:
    """A loaded sentencepiece model: `encode`, `decode`, `vocab_size`, `eos_id`, `sha256` (of the model bytes).

    Example (with a prepared data folder):

        tok = Tokenizer.load("data/stdlib/tokenizer.model")
        doc_ids = tok.encode("x = 1\\n") + [tok.eos_id]  # how a document is stored in a .bin file
    """

    def __init__(self, model_proto: bytes, path: Path | None = None) -> None:
        self.model_proto = model_proto
        self.path = path
        self.sha256 = sha256_bytes(model_proto)
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        if self.sp.eos_id() < 0:
            raise DataError(f"tokenizer {path or '<memory>'} defines no eos id; expected a model trained with "
                            f"eos_id >= 0")

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a `.model` file; DataError if it is missing or not a sentencepiece model."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"tokenizer file {path} does not exist (expected a sentencepiece .model file)")
        try:
            return cls(path.read_bytes(), path)
        except RuntimeError as e:
            raise DataError(f"tokenizer file {path} is not a valid sentencepiece model: {e}") from e

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def eos_id(self) -> int:
        return self.sp.eos_id()

    @property
    def bos_id(self) -> int:
        return self.sp.bos_id()

    @property
    def pad_id(self) -> int:
        return self.sp.pad_id()

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no bos/eos added)."""
        return self.sp.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of several texts (sentencepiece's own loop, no Python per-text overhead)."""
        return self.sp.encode(texts)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids; `decode(encode(x)) == x` for models trained with TRAINER_SETTINGS."""
        return self.sp.decode([int(i) for i in ids])

    def __getstate__(self) -> dict[str, object]:  # picklable for datasets.map(num_proc=...)
        return {"model_proto": self.model_proto, "path": self.path}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["model_proto"], state["path"])  # type: ignore[arg-type]


def training_sentences(texts: Iterable[str], max_chars: int = TRAIN_CHUNK_CHARS) -> Iterator[str]:
    """Cut documents into runs of whole lines of at most `max_chars` characters (longer lines are cut hard).

    Newlines stay inside the sentences so that pieces like "):\\n▁▁▁▁" can be learned. Linear in the text's length:
    every character is copied once, whatever the line lengths (a 20 MB line is 10,240 slices of 2,048 characters).

    Example:
        >>> list(training_sentences(["a\\nbb\\nccc\\n"], max_chars=5))
        ['a\\nbb\\n', 'ccc\\n']
        >>> list(training_sentences(["abcdefg\\nh"], max_chars=3))
        ['abc', 'def', 'g\\nh']
    """
    for text in texts:
        start = pos = 0  # the pending sentence is text[start:pos], whole lines (or a line's tail) of <= max_chars
        while pos < len(text):
            end = text.find("\n", pos) + 1 or len(text)  # the next line is text[pos:end]
            if end - start > max_chars and pos > start:
                yield text[start:pos]
                start = pos
            while end - start > max_chars:  # a line longer than max_chars: cut hard
                yield text[start:start + max_chars]
                start += max_chars
            pos = end
        if pos > start:
            yield text[start:pos]


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, num_threads: int | None = None,
                    seed: int = 0) -> Tokenizer:
    """Train a byte-fallback BPE model with TRAINER_SETTINGS on documents; returns it in memory (`model_proto`).

    Example:

        tok = train_tokenizer(["def f(x):\\n    return x\\n"] * 50, vocab_size=300)
        Path("tokenizer.model").write_bytes(tok.model_proto)
    """
    out = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=training_sentences(texts), model_writer=out, vocab_size=vocab_size,
            num_threads=num_threads or os.cpu_count() or 1, **TRAINER_SETTINGS)
    except RuntimeError as e:  # e.g. "Vocabulary size too high (N). Please set it to a value <= M."
        raise DataError(f"sentencepiece could not train a BPE model with --vocab-size {vocab_size} "
                        f"(use a smaller --vocab-size or more text): {e}") from e
    return Tokenizer(out.getvalue())
