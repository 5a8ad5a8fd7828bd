"""A rebuild of a data folder that would replace its tokenizer needs ``--force``, and says what it replaces.

Data folders prepared with ``--tokenizer <out>/tokenizer.model`` and runs trained on a folder record its tokenizer's
sha256; evaluation and generation compare it and refuse a mismatch. A silent replacement would strand them, so
``data_prep/prepare.py`` into a finished folder with options that train a new tokenizer (or name another one) stops
before anything is touched::

    error: data/stdlib-2k already holds data tokenised with data/stdlib-2k/tokenizer.model (sha256 1e4ebea2856d…;
    also used by data/notes); rebuilding it with these options means training a new tokenizer, … Pass --force to
    replace it, or --out another folder (--tokenizer data/stdlib-2k/tokenizer.model keeps the old one)

Reusing the folder's own tokenizer (same sha256) needs no ``--force``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regulargpt.data.sources import DataError
from regulargpt.data.tokenizer import Tokenizer

__all__ = ["check_replacement", "tokenizer_users"]

_MANIFEST, _TOKENIZER_FILE = "manifest.json", "tokenizer.model"


def tokenizer_users(out: Path, sha: str) -> list[str]:
    """The data folders beside `out` whose manifest names the tokenizer `sha` (e.g. prepared with --tokenizer)."""
    users = []
    for manifest in sorted(out.resolve().parent.glob(f"*/{_MANIFEST}")):
        if manifest.parent.resolve() == out.resolve():
            continue
        try:
            if json.loads(manifest.read_text()).get("tokenizer", {}).get("sha256") == sha:
                users.append(str(manifest.parent))
        except (OSError, ValueError, AttributeError):
            continue
    return users


def check_replacement(out: Path, manifest: dict[str, Any] | None, given: Tokenizer | None, force: bool,
                      log: Callable[[str], None]) -> None:
    """`out`'s finished `manifest` (None: nothing to replace) is about to be rebuilt with `given` (None: a newly
    trained tokenizer). DataError naming the old tokenizer, the folders beside `out` that use it and the ways on,
    unless the tokenizer stays the same or `force` (then one `log` line says what is replaced)."""
    old = manifest.get("tokenizer") if isinstance(manifest, dict) else None
    if not isinstance(old, dict) or (given is not None and given.sha256 == old.get("sha256")):
        return
    users = tokenizer_users(out, str(old.get("sha256", "")))
    file = f"{out}/{old.get('file', _TOKENIZER_FILE)}"
    also = f"; also used by {', '.join(users)}" if users else ""
    what = f"{file} (sha256 {str(old.get('sha256'))[:12]}…{also})"
    new = f"--tokenizer {given.path}" if given is not None else "training a new tokenizer"
    if force:
        log(f"--force: replacing tokenizer {what} by {new}; runs trained on the old one no longer match {out}")
        return
    raise DataError(f"{out} already holds data tokenised with {what}; rebuilding it with these options means "
                    f"{new}, and data folders prepared with the old one and runs trained on it would no longer "
                    f"match it. Pass --force to replace it, or --out another folder (--tokenizer {file} keeps the "
                    f"old one)")
