"""JSON without duplicate keys: Python's ``json`` keeps the last of two equal keys silently, so
``{"train": {"steps": 5}, "train": {"lr": 5.0}}`` would mean ``{"train": {"lr": 5.0}}``. Every JSON object this
project reads (configs, saved run configs, checkpoint state, manifests: :func:`regulargpt.files.read_json_object`)
goes through :func:`loads_strict`, which refuses a repeated key, naming its path and both lines::

    loads_strict('{"train": {"lr": 0.001,\\n "lr": 10.0}}')
    # DuplicateKeyError: duplicate key train.lr (lines 1 and 2); each key may appear once

The check costs nothing extra on a file without duplicates (an ``object_pairs_hook`` that compares each object's
key count with its dict's); only when it fires is the text walked again to find the path and the lines.
"""

from __future__ import annotations

import json
from json.decoder import scanstring
from typing import Any

__all__ = ["DuplicateKeyError", "loads_strict"]

_SPACE = " \t\n\r"


class DuplicateKeyError(ValueError):
    """A JSON object with a key twice; the message names the key path and both line numbers (1-based)."""

    def __init__(self, path: str, first_line: int, second_line: int) -> None:
        self.path, self.first_line, self.second_line = path, first_line, second_line
        super().__init__(f"duplicate key {path} (lines {first_line} and {second_line}); each key may appear once")


class _Repeated(Exception):
    """Raised by the pairs hook: some object holds a key twice (where is found by :func:`_locate`)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Repeated
    return out


def loads_strict(text: str | bytes) -> Any:
    """``json.loads(text)``, but a key repeated within one object raises :class:`DuplicateKeyError` (a subclass of
    ValueError, like ``json.JSONDecodeError``, which malformed text still raises)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except _Repeated:
        source = text.decode("utf-8") if isinstance(text, bytes) else text
        raise _locate(source) from None


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _SPACE:
        i += 1
    return i


def _locate(text: str) -> DuplicateKeyError:
    """Walk valid JSON `text` (recursive descent; scalars by the standard decoder) to its first repeated key."""
    decoder = json.JSONDecoder()

    def value(i: int, path: str) -> int:  # → the index after the value starting at (or after blanks from) i
        i = _skip(text, i)
        if text[i] == "{":
            seen: dict[str, int] = {}
            i = _skip(text, i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                key_at = _skip(text, i)
                key, i = scanstring(text, key_at + 1)
                where = f"{path}.{key}" if path else key
                if key in seen:
                    raise DuplicateKeyError(where, _line(text, seen[key]), _line(text, key_at))
                seen[key] = key_at
                i = value(_skip(text, i) + 1, where)  # past the ':'
                i = _skip(text, i)
                if text[i] == "}":
                    return i + 1
                i += 1  # ','
        if text[i] == "[":
            i, index = _skip(text, i + 1), 0
            if text[i] == "]":
                return i + 1
            while True:
                i = _skip(text, value(i, f"{path}[{index}]"))
                if text[i] == "]":
                    return i + 1
                i, index = i + 1, index + 1
        return decoder.raw_decode(text, i)[1]

    try:
        value(0, "")
    except DuplicateKeyError as err:
        return err
    raise AssertionError("loads_strict: a repeated key was reported but not found")  # unreachable for valid JSON
