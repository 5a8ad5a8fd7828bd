"""The python-packages source (regulargpt/data/python_packages.py): every file of a package lands in one split, the
byte-filling split rule by hand, max_bytes keeping whole packages, and the errors. Truth: fake site-packages folders
whose every file carries its package's marker; the prepared splits are decoded and searched for the markers."""
from __future__ import annotations

import numpy as np
import pytest

from regulargpt.data import python_packages, shards
from regulargpt.data.sources import DataError
from regulargpt.data.tokenizer import Tokenizer

SIZES = {"alpha": 6, "beta": 3, "gamma": 1, "delta": 1, "eps": 2, "zeta": 1, "eta": 1, "theta": 4}


def _site(root, sizes=SIZES, extra=True):
    """A site-packages folder: package NAME has `n` files (folder packages) or is a module file (one file), every
    line reading `NAME_marker = <k>`; plus a __pycache__ file, an empty file and a *.dist-info folder (all skipped)."""
    root.mkdir(parents=True)
    for name, n in sizes.items():
        if n == 1 and name.endswith("a"):  # a top-level module file
            (root / f"{name}.py").write_text("".join(f"MARK_{name}_END = {k}\n" for k in range(40)))
            continue
        for i in range(n):
            path = root / name / ("sub" if i % 2 else "") / f"m{i}.py"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"MARK_{name}_END = {k}\n" for k in range(40 * (i + 1))))
    if extra:
        (root / "alpha" / "__pycache__").mkdir()
        (root / "alpha" / "__pycache__" / "m0.py").write_text("pycache_marker = 1\n")
        (root / "beta" / "empty.py").write_text("")
        (root / "pkg-1.0.dist-info").mkdir()
        (root / "pkg-1.0.dist-info" / "RECORD").write_text("x")
    return root


def test_every_package_lands_whole_in_one_split(tmp_path, monkeypatch):
    site = _site(tmp_path / "site")
    shadow = _site(tmp_path / "user", {"alpha": 1}, extra=False)  # a second alpha: the first folder's is used
    monkeypatch.setattr(python_packages, "site_package_dirs", lambda: [site, shadow])
    manifest = shards.prepare("python-packages", tmp_path / "data", vocab_size=300, num_proc=1, seed=3,
                              val_fraction=0.15, test_fraction=0.15, log=lambda _: None)
    packages = manifest["source"]["packages"]
    assert sorted(packages) == sorted(SIZES)
    assert packages["alpha"]["files"] == 6 and packages["beta"]["files"] == 3  # pycache and the empty file left out
    tok = Tokenizer.load(tmp_path / "data" / "tokenizer.model")
    seen = {}
    for code, split in enumerate(("train", "val", "test")):
        ids = np.fromfile(tmp_path / "data" / f"{split}.bin", dtype=manifest["dtype"])
        text = tok.decode(ids.tolist())
        assert "pycache_marker" not in text
        for name in SIZES:
            if f"MARK_{name}_END" in text:
                seen.setdefault(name, []).append(split)
                assert packages[name]["split"] == code
    assert all(len(splits) == 1 for splits in seen.values()) and sorted(seen) == sorted(SIZES)
    assert {splits[0] for splits in seen.values()} == {"train", "val", "test"}
    alpha_lines = sum(40 * (i + 1) for i in range(6))  # every line of the first folder's alpha, none of the shadow's
    split = ("train", "val", "test")[packages["alpha"]["split"]]
    text = tok.decode(np.fromfile(tmp_path / "data" / f"{split}.bin", dtype=manifest["dtype"]).tolist())
    assert text.count("MARK_alpha_END = ") == alpha_lines


def test_the_split_rule_fills_test_then_val_by_bytes_in_hash_order():
    """By hand, in the rule's visiting order: test and val each take 10 % of 100 bytes."""
    sizes = {"a": 50, "b": 8, "c": 8, "d": 30, "e": 2, "f": 2}
    order = sorted(sizes, key=lambda n: python_packages.package_hash(0, n))
    filled, want = {2: 0, 1: 0}, {}
    for name in order:
        code = 2 if filled[2] + sizes[name] <= 10 else 1 if filled[1] + sizes[name] <= 10 else 0
        want[name] = code
        if code:
            filled[code] += sizes[name]
    assert python_packages.assign_package_splits(sizes, 0, 0.1, 0.1) == want
    assert want["a"] == want["d"] == 0
    lone = python_packages.assign_package_splits({"x": 50, "y": 40, "z": 30}, 0, 0.05, 0.05)  # none fits: smallest
    assert sorted(lone.values()) == [0, 1, 2] and lone["x"] == 0


def test_max_bytes_keeps_whole_packages(tmp_path):
    site = _site(tmp_path / "site", extra=False)
    files, codes, summary = python_packages.resolve_python_packages(None, 0, 0.1, 0.1, dirs=[site])
    total = sum(info["bytes"] for info in summary.values())
    files_cut, _, kept = python_packages.resolve_python_packages(total // 2, 0, 0.1, 0.1, dirs=[site])
    assert sum(info["bytes"] for info in kept.values()) <= total // 2
    by_package = python_packages.package_files([site])
    assert set(files_cut) == {f for name in kept for f in by_package[name]}  # whole packages only
    assert len(codes) == len(files)


def test_too_few_packages_is_a_clear_error(tmp_path, monkeypatch):
    site = _site(tmp_path / "site", {"alpha": 2, "beta": 2}, extra=False)
    monkeypatch.setattr(python_packages, "site_package_dirs", lambda: [site])
    with pytest.raises(DataError, match="2 package\\(s\\) with .py files; need at least 3"):
        shards.prepare("python-packages", tmp_path / "data", vocab_size=300, num_proc=1, log=lambda _: None)
    assert not (tmp_path / "data").exists()
    with pytest.raises(DataError, match="no package fits in --max-bytes 10"):
        shards.prepare("python-packages", tmp_path / "data", vocab_size=300, max_bytes=10, num_proc=1,
                       log=lambda _: None)
