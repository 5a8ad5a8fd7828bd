"""Where documents come from: source specs → resolved, ordered input files (read by regulargpt/data/documents.py).

A *source spec* is one string (the `--source` of `data_prep/prepare.py`):

- a local file, folder or glob: `*.txt` and any other non-table file = one document per file; `*.jsonl` / `*.json`
  = one document per row (column `--text-field`, default "text"); `*.parquet` likewise;
- `hf:<name>[:<config>]`: the `train` split of a `datasets` hub dataset (needs a reachable hub; never used by tests);
- `python-stdlib`: the `*.py` files of the running interpreter's standard library (no tests, no site-packages),
  one document per file — the embedded default that every machine has;
- `python-packages`: the `*.py` files of every installed package, one document per file, split into train/val/test
  by package (regulargpt/data/python_packages.py: `file_splits` holds each file's split);
- `debian-prose` / `debian-code` / `debian-latex`: text harvested from Debian packages with `apt-get download` +
  `dpkg-deb -x` into a cache folder (no root, no system install), mirroring KERPLE's OpenWebText2/GitHub/ArXiv domains.

Documents are ordered deterministically (sorted paths, or row order); empty ones are dropped, and `max_bytes` keeps
documents in that order, skipping any that would take the total UTF-8 size (the file size, for one-document-per-file
sources) past the limit.

Example:
    >>> src = resolve_source("python-stdlib", max_bytes=100_000)
    >>> src.kind, len(src.files) > 0
    ('text', True)
"""
from __future__ import annotations

import glob
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from regulargpt.data import python_packages
from regulargpt.errors import UserError


SourceKind = Literal["text", "json", "parquet", "hf"]
KNOWN_SOURCES = ("python-stdlib", "python-packages", "debian-prose", "debian-code", "debian-latex")
_STDLIB_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__"})


class DataError(UserError, ValueError):
    """A user-facing data problem; the message names the file/key/value and what was expected."""


@dataclass(frozen=True)
class DebianPart:
    """Files harvested from one Debian package: `root` (inside the package) / `**/*<suffix>`, minus `exclude`."""

    package: str
    root: str
    suffixes: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    def keeps(self, name: str) -> bool:
        """True if a file name is harvested, e.g. `DebianPart("p", "r", (".go",), ("_test.go",)).keeps("a.go")`."""
        return name.endswith(self.suffixes) and not (self.exclude and name.endswith(self.exclude))


DEBIAN_SOURCES: dict[str, tuple[DebianPart, ...]] = {
    "debian-prose": (DebianPart("python3.11-doc", "usr/share/doc/python3.11/html/_sources", (".rst.txt",)),),
    "debian-code": (DebianPart("golang-1.19-src", "usr/share/go-1.19/src", (".go",), ("_test.go",)),),
    "debian-latex": tuple(
        DebianPart(pkg, "usr/share/doc/texlive-doc/latex", (".tex", ".tex.gz"))
        for pkg in ("texlive-publishers-doc", "texlive-science-doc")
    ),
}


@dataclass(frozen=True)
class Source:
    """A resolved source: its kind (how its files are read) and the ordered input files (empty for `hf:`)."""

    spec: str
    kind: SourceKind
    files: tuple[Path, ...] = ()
    root: Path | None = None  # files are named relative to it in the fingerprint (portable across machines)
    hash_content: bool = False  # fingerprint by content (python-stdlib) instead of size + mtime
    hf_name: str = ""
    hf_config: str | None = None
    file_splits: tuple[int, ...] = ()  # a split code per file (0 train, 1 val, 2 test) where the source fixes it
    packages: dict[str, dict] | None = None  # python-packages: {package: {"files", "bytes", "split"}}

    def fingerprint_items(self) -> list[list[str | int]]:
        """What identifies the inputs: `[name, size, mtime_ns]` per file, or `[name, sha256]` when hashing content."""
        items: list[list[str | int]] = []
        for f in self.files:
            name = f.relative_to(self.root).as_posix() if self.root else str(f.resolve())
            if self.hash_content:
                items.append([name, hashlib.sha256(f.read_bytes()).hexdigest()])
            else:
                st = f.stat()
                items.append([name, st.st_size, st.st_mtime_ns])
        return items


def default_cache_dir() -> Path:
    """The Debian cache folder: `$REGULARGPT_CACHE`, else `~/.cache/regulargpt/debian`."""
    return Path(os.environ.get("REGULARGPT_CACHE", "~/.cache/regulargpt/debian")).expanduser()


def select_within(sizes: list[int], max_bytes: int | None) -> list[int]:
    """Indices of the non-empty documents kept under `max_bytes`: in order, skipping any document that would take
    the total past the limit (so one large document does not end the selection).

    Example:
        >>> select_within([5, 0, 20, 4, 1], max_bytes=10)
        [0, 3, 4]
    """
    kept, total = [], 0
    for i, size in enumerate(sizes):
        if size > 0 and (max_bytes is None or total + size <= max_bytes):
            kept.append(i)
            total += size
    return kept


def _prefix_files(files: list[Path], max_bytes: int | None) -> list[Path]:
    return [files[i] for i in select_within([f.stat().st_size for f in files], max_bytes)]


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's `*.py` files, sorted, without test folders, idlelib tests and site-packages."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not _STDLIB_EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1])]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _local_files(spec: str) -> list[Path]:
    if any(ch in spec for ch in "*?["):
        matches = [Path(p) for p in glob.glob(os.path.expanduser(spec), recursive=True)]
        files = sorted(p for p in matches if p.is_file())
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        elif path.is_file():
            files = [path]
        else:
            raise DataError(
                f"source {spec!r}: no such file, folder or glob match, and not a known source "
                f"(expected a path, a glob, 'hf:<name>[:<config>]' or one of {', '.join(KNOWN_SOURCES)})"
            )
    if not files:
        raise DataError(f"source {spec!r} matches no files (expected at least one .txt/.jsonl/.json/.parquet file)")
    return files


def _kind_of(path: Path) -> SourceKind:
    name = path.name.lower()
    if name.endswith((".jsonl", ".json", ".jsonl.gz", ".json.gz")):
        return "json"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def resolve_source(spec: str, *, max_bytes: int | None = None, cache_dir: str | Path | None = None, seed: int = 0,
                   fractions: tuple[float, float] = (0.05, 0.05)) -> Source:
    """Resolve a source spec to ordered input files (fetching Debian packages into `cache_dir` if needed).

    For one-document-per-file sources, `max_bytes` already selects the file prefix here; `python-packages` also
    assigns each file its package's split from `seed` and `fractions` (val, test).

    Example:

        resolve_source("corpus/*.jsonl").kind  # 'json'
    """
    if spec.startswith("hf:"):
        name, _, config = spec[3:].partition(":")
        if not name:
            raise DataError(f"source {spec!r}: expected 'hf:<name>[:<config>]'")
        return Source(spec, "hf", hf_name=name, hf_config=config or None)
    if spec == "python-stdlib":
        root, files = stdlib_files()
        return Source(spec, "text", tuple(_prefix_files(files, max_bytes)), root=root, hash_content=True)
    if spec == python_packages.SPEC:
        try:
            files, splits, packages = python_packages.resolve_python_packages(max_bytes, seed, *fractions)
        except python_packages.PackageSplitError as err:
            raise DataError(str(err)) from None
        return Source(spec, "text", tuple(files), file_splits=tuple(splits), packages=packages)
    if spec in DEBIAN_SOURCES:
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        files = [f for part in DEBIAN_SOURCES[spec] for f in debian_files(part, cache)]
        return Source(spec, "text", tuple(_prefix_files(files, max_bytes)), root=cache)
    files = _local_files(spec)
    kinds = {_kind_of(f) for f in files}
    if len(kinds) > 1:
        raise DataError(f"source {spec!r} mixes file kinds {sorted(kinds)}; expected one kind (text, json or parquet)")
    kind = kinds.pop()
    return Source(spec, kind, tuple(_prefix_files(files, max_bytes) if kind == "text" else files))


def debian_files(part: DebianPart, cache_dir: Path) -> list[Path]:
    """Sorted harvested files of one Debian package, fetching it into `cache_dir/<package>` on first use."""
    root = fetch_debian_package(part, cache_dir) / part.root
    return sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: p.relative_to(root).as_posix())


def _run(cmd: list[str], cwd: Path, package: str) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        raise DataError(f"`{' '.join(cmd)}` could not run for Debian package {package}: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-800:]
        raise DataError(
            f"`{' '.join(cmd)}` failed (exit {proc.returncode}) for Debian package {package} in {cwd}: {tail}\n"
            f"Check that the package exists (`apt-cache policy {package}`) and the Debian mirror is reachable, "
            f"or use --source python-stdlib / local files."
        )


def _harvest(part: DebianPart, tree: Path) -> tuple[int, int]:
    """Keep only the harvested files under `tree` (PDFs and the rest deleted), gunzip `.gz`, re-encode to UTF-8."""
    count = total = 0
    for path in sorted(tree.rglob("*"), reverse=True):  # children before their folders
        rel = path.relative_to(tree).as_posix()
        if path.is_symlink() or (path.is_file() and not (rel.startswith(part.root + "/") and part.keeps(path.name))):
            path.unlink()
        elif path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        else:
            raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                raw = raw.decode("latin-1").encode("utf-8")
            target = path.with_name(path.name.removesuffix(".gz"))
            mtime = path.stat().st_mtime_ns
            target.write_bytes(raw)
            os.utime(target, ns=(mtime, mtime))  # stable fingerprints across re-fetches
            if target != path:
                path.unlink()
            count, total = count + 1, total + len(raw)
    return count, total


def fetch_debian_package(part: DebianPart, cache_dir: Path) -> Path:
    """`apt-get download` + `dpkg-deb -x` one package into `cache_dir/<package>/tree` (once; marked by HARVESTED.json).

    Raises DataError naming the package and the command when `apt-get`/`dpkg-deb` is missing or fails.
    """
    home = cache_dir / part.package
    marker = home / "HARVESTED.json"
    if marker.is_file():
        return home / "tree"
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise DataError(
                f"`{tool}` is not available on this machine; Debian package {part.package} is fetched with "
                f"`apt-get download {part.package} && dpkg-deb -x {part.package}_*.deb DIR` (a Debian/Ubuntu system, "
                f"no root needed). Use --source python-stdlib or local files instead."
            )
    cache_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(home, ignore_errors=True)
    print(f"fetching Debian package {part.package} (apt-get download + dpkg-deb -x) into {home}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=f".{part.package}.") as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", part.package], work, part.package)
        debs = sorted(work.glob("*.deb"))
        if not debs:
            raise DataError(f"`apt-get download {part.package}` produced no .deb file in {work}")
        _run(["dpkg-deb", "-x", debs[0].name, "tree"], work, part.package)
        count, total = _harvest(part, work / "tree")
        if count == 0:
            raise DataError(f"Debian package {part.package} ({debs[0].name}) has no files matching {part.root}/**/"
                            f"{'|'.join(part.suffixes)}; expected its text files there")
        info = {"package": part.package, "deb": debs[0].name, "root": part.root, "files": count, "bytes": total}
        (work / "HARVESTED.json").write_text(json.dumps(info, indent=1))
        debs[0].unlink()
        os.rename(work, home)
        work.mkdir()  # TemporaryDirectory cleans up the (now empty) original name
    return home / "tree"
