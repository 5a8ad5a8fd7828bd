"""The `python-packages` source: the `*.py` files of every installed package, split into train/val/test *by package*.

A *package* is one top-level entry of a site-packages folder of the running interpreter (`site.getsitepackages()`
and the user site): a folder (`torch/`, with every `*.py` below it, `__pycache__` aside) or a top-level module file
(`six.py`). Every file of a package goes to the same split, so no file and no package straddles splits, and a model
is scored on code of packages it never saw.

The split rule works on bytes, not on documents, because package sizes differ by four orders of magnitude
(transformers ~54 MB of `.py`, most packages < 1 MB): packages are visited in the order of u = sha256(f"{seed}:{name}")
and each goes to test while test stays within `test_fraction` of the total bytes, else to val while val stays within
`val_fraction`, else to train. A split left empty takes the smallest package of train. `max_bytes` keeps whole
packages in the same order, skipping any that would take the total past the limit.

Example (sizes in bytes; the visiting order depends on the seed):

    >>> codes = assign_package_splits({"a": 90, "b": 5, "c": 5}, seed=0, val_fraction=0.05, test_fraction=0.05)
    >>> codes["a"], sorted(codes.values())  # a is too big for val or test (5 bytes each); b and c fill them
    (0, [0, 1, 2])
"""
from __future__ import annotations

import hashlib
import site
from pathlib import Path

from regulargpt.errors import UserError

SPEC = "python-packages"
_SKIPPED_DIRS = frozenset({"__pycache__"})


class PackageSplitError(UserError, ValueError):
    """Too few packages (or too little text) to make three splits."""


def package_hash(seed: int, name: str) -> float:
    """u = sha256(f"{seed}:{name}") as a number in [0, 1): the order in which packages are split and kept."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def site_package_dirs() -> list[Path]:
    """The interpreter's site-packages folders that exist, each once (by real path), in `site`'s order."""
    seen, dirs = set(), []
    for entry in [*site.getsitepackages(), site.getusersitepackages()]:
        path = Path(entry)
        if path.is_dir() and path.resolve() not in seen:
            seen.add(path.resolve())
            dirs.append(path)
    return dirs


def package_files(dirs: list[Path] | None = None) -> dict[str, list[Path]]:
    """{package: its non-empty `*.py` files, sorted by relative path}. A package name met in two site folders keeps
    the first folder's files (the one Python imports)."""
    packages: dict[str, list[Path]] = {}
    for root in site_package_dirs() if dirs is None else dirs:
        found: dict[str, list[Path]] = {}
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if _SKIPPED_DIRS.intersection(rel.parts[:-1]) or not path.is_file() or path.stat().st_size == 0:
                continue
            name = rel.parts[0].removesuffix(".py") if len(rel.parts) == 1 else rel.parts[0]
            found.setdefault(name, []).append(path)
        for name, files in found.items():
            if name not in packages:
                packages[name] = sorted(files, key=lambda p: p.relative_to(root).as_posix())
    return packages


def select_packages(sizes: dict[str, int], seed: int, max_bytes: int | None) -> list[str]:
    """The packages kept under `max_bytes`, whole, in hash order, skipping any that would pass the limit.

    Example:
        >>> select_packages({"a": 6, "b": 6, "c": 3}, seed=0, max_bytes=None)
        ['a', 'b', 'c']
        >>> len(select_packages({"a": 6, "b": 6, "c": 3}, seed=0, max_bytes=9))  # one 6-byte package and c
        2
    """
    order = sorted(sizes, key=lambda name: (package_hash(seed, name), name))
    kept, total = [], 0
    for name in order:
        if max_bytes is None or total + sizes[name] <= max_bytes:
            kept.append(name)
            total += sizes[name]
    return sorted(kept)


def assign_package_splits(sizes: dict[str, int], seed: int, val_fraction: float,
                          test_fraction: float) -> dict[str, int]:
    """Split code per package (0 train, 1 val, 2 test) by the byte-filling rule of the module docstring."""
    if len(sizes) < 3:
        raise PackageSplitError(f"source {SPEC!r}: {len(sizes)} package(s) with .py files; need at least 3 to make "
                                f"train/val/test splits by package")
    total = sum(sizes.values())
    targets = {2: test_fraction * total, 1: val_fraction * total}
    filled = {2: 0, 1: 0}
    codes: dict[str, int] = {}
    for name in sorted(sizes, key=lambda n: (package_hash(seed, n), n)):
        code = next((c for c in (2, 1) if filled[c] + sizes[name] <= targets[c]), 0)
        codes[name] = code
        if code:
            filled[code] += sizes[name]
    for code in (2, 1):
        if code not in codes.values():
            train = [n for n, c in codes.items() if c == 0]
            codes[min(train, key=lambda n: (sizes[n], n))] = code
    return codes


def resolve_python_packages(max_bytes: int | None, seed: int, val_fraction: float, test_fraction: float,
                            dirs: list[Path] | None = None) -> tuple[list[Path], list[int], dict[str, dict]]:
    """→ (files, split code per file, {package: {"files", "bytes", "split"}}): the kept packages' files in package
    order, each with its package's split code."""
    packages = package_files(dirs)
    sizes = {name: sum(f.stat().st_size for f in files) for name, files in packages.items()}
    kept = select_packages(sizes, seed, max_bytes)
    if not kept:
        raise PackageSplitError(f"source {SPEC!r}: no package fits in --max-bytes {max_bytes} (the smallest has "
                                f"{min(sizes.values(), default=0):,} bytes of .py files)")
    codes = assign_package_splits({name: sizes[name] for name in kept}, seed, val_fraction, test_fraction)
    files = [f for name in kept for f in packages[name]]
    file_codes = [codes[name] for name in kept for _ in packages[name]]
    summary = {name: {"files": len(packages[name]), "bytes": sizes[name], "split": codes[name]} for name in kept}
    return files, file_codes, summary
