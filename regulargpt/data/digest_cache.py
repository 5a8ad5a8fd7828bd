"""The sha256 of whole files, remembered per file version, so a full verification reads a split once per version.

A version is (resolved path, size, mtime_ns, inode): rewriting a file in place changes its mtime, replacing it
(prepare.py renames a new file over the old) changes its inode, so either makes the next lookup hash it again.
The cache is one small JSON object in ``$XDG_CACHE_HOME/regulargpt/file_sha256.json`` (else
``~/.cache/regulargpt/…``), one entry per resolved path (the latest version hashed), written atomically outside the
data folder (which may be read-only). A cache that cannot be read counts as empty, one that cannot be written is
left as it was: it only ever saves time. Example:

    file_sha256("data/big/train.bin")   # ('9f86d0…', False): the whole file read
    file_sha256("data/big/train.bin")   # ('9f86d0…', True): one stat and one small read
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from regulargpt.files import CorruptFileError, atomic_write_text, read_json_object, sha256_file

__all__ = ["cache_path", "file_sha256"]

CACHE_FILE = "file_sha256.json"


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/regulargpt/file_sha256.json`` (an absolute XDG_CACHE_HOME only, as the spec says), else
    ``~/.cache/regulargpt/file_sha256.json``."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".cache"
    return root / "regulargpt" / CACHE_FILE


def _version(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def _entries() -> dict[str, Any]:
    try:
        return read_json_object(cache_path())
    except (CorruptFileError, OSError):
        return {}


def file_sha256(path: str | Path) -> tuple[str, bool]:
    """(hex sha256 of the file, whether it came from the cache). A file that changed while it was read is hashed
    but not remembered."""
    path = Path(path)
    key, version = str(path.resolve()), _version(path)
    hit = _entries().get(key)
    if isinstance(hit, dict) and isinstance(hit.get("sha256"), str) and all(hit.get(k) == v
                                                                          for k, v in version.items()):
        return hit["sha256"], True
    digest = sha256_file(path)
    if _version(path) == version:
        entries = _entries()  # again: another process may have added entries meanwhile
        entries[key] = {**version, "sha256": digest}
        try:
            atomic_write_text(cache_path(), json.dumps(entries, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass  # read-only or full home: the next full verification reads the file again
    return digest, False
