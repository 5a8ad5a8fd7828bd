"""Data pipeline: prepare (txt, jsonl, python-stdlib), manifest, tokenizer round trip, splits, atomic writes,
reading errors and WindowSampler. CPU, offline, no downloads (Debian fetching is monkeypatched)."""
from __future__ import annotations

import doctest
import json
import errno
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import fake_data_folder

import regulargpt.data.sampler as sampler_mod
import regulargpt.data.shards as shards
import regulargpt.data.sources as sources
import regulargpt.data.split_writer as split_writer
import regulargpt.data.tokenizer as tokenizer_mod
from regulargpt.data import (
    DataError,
    Tokenizer,
    TokenSplit,
    WindowSampler,
    load_manifest,
    open_split,
    prepare,
)
from regulargpt.data.shards import assign_splits
from regulargpt.files import atomic_open, sha256_file
from regulargpt.write_errors import DiskFullError, explain_write_error

PY_SNIPPET = 'def f(x, y=2):\n\tif x  >  10_000:  # tab, two spaces\n        return "é ∑ 日本"\n\n\n    return y   \n'
PROSE = "The quick brown fox jumps over the lazy dog.  Two spaces here;\n\n  indented line, ünïcode, 3.14159!\n"
WORDS = ("alpha beta gamma delta epsilon zeta theta lambda sigma omega token window sampler manifest split "
         "train valid test corpus shard memory mapped deterministic").split()


def _doc(i: int) -> str:
    """A small deterministic document mixing prose and code."""
    rng = np.random.default_rng(i)
    prose = " ".join(WORDS[j] for j in rng.integers(0, len(WORDS), 60))
    return f"# document {i}\n{prose}.\n\ndef f_{i}(x):\n    return x * {i} + {i * 7}\n"


def _quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def stdlib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("stdlib") / "data"
    prepare("python-stdlib", out, vocab_size=512, max_bytes=300_000, num_proc=2, log=_quiet)
    return out


@pytest.fixture(scope="module")
def txt_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    folder = tmp_path_factory.mktemp("txt")
    docs = [_doc(i) for i in range(12)]
    for i, text in enumerate(docs):
        (folder / f"doc{i:02d}.txt").write_text(text)
    (folder / "empty.txt").write_text("")  # dropped
    return folder, docs


def _expected_stream(docs: list[str], codes: np.ndarray, code: int, tok: Tokenizer) -> list[int]:
    return [t for d, c in zip(docs, codes) if c == code for t in tok.encode(d) + [tok.eos_id]]


def test_prepare_txt_corpus_layout_and_token_stream(txt_corpus: tuple[Path, list[str]], tmp_path: Path) -> None:
    folder, docs = txt_corpus
    m = prepare(str(folder / "*.txt"), tmp_path / "d", vocab_size=400, seed=3, num_proc=1, log=_quiet)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["manifest.json", "test.bin", "tokenizer.model",
                                                                   "train.bin", "val.bin"]
    for key in ("format_version", "dtype", "vocab_size", "tokenizer", "splits", "source", "options",
                "input_fingerprint", "created_at", "command"):
        assert key in m
    assert m == load_manifest(tmp_path / "d")
    assert (m["dtype"], m["vocab_size"], m["source"]["documents"], m["source"]["files"]) == ("uint16", 400, 12, 12)
    assert m["tokenizer"]["sha256"] == sha256_file(tmp_path / "d" / "tokenizer.model")
    assert sum(s["documents"] for s in m["splits"].values()) == 12
    assert all(s["documents"] >= 1 for s in m["splits"].values())
    tok = Tokenizer.load(tmp_path / "d" / "tokenizer.model")
    assert (tok.eos_id, tok.bos_id, tok.pad_id, tok.sp.unk_id()) == (2, 1, 3, 0)
    codes = assign_splits(12, 3, 0.05, 0.05)
    for code, name in enumerate(shards.SPLITS):
        split = open_split(tmp_path / "d", name, vocab_size=400)
        assert split.tokens.dtype == np.uint16 and len(split) == m["splits"][name]["tokens"]
        assert split.tokens.tolist() == _expected_stream(docs, codes, code, tok)  # order, eos, disjointness
        assert os.path.getsize(split.path) == 2 * len(split)
        split.check_token_range()
    assert sum(s["tokens"] for s in m["splits"].values()) == sum(len(tok.encode(d)) + 1 for d in docs)


def test_prepare_jsonl_and_parquet(tmp_path: Path) -> None:
    rows = [{"id": i, "content": _doc(i)} for i in range(8)] + [{"id": 99, "content": ""}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = prepare(str(path), tmp_path / "d", vocab_size=400, text_field="content", num_proc=1, log=_quiet)
    assert (m["source"]["kind"], m["source"]["documents"]) == ("json", 8)
    assert m["source"]["bytes"] == sum(len(_doc(i).encode()) for i in range(8))
    with pytest.raises(DataError, match="no text field 'text'.*content"):
        prepare(str(path), tmp_path / "e", vocab_size=400, num_proc=1, log=_quiet)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [_doc(i) for i in range(6)]}), tmp_path / "corpus.parquet")
    m = prepare(str(tmp_path / "*.parquet"), tmp_path / "p", vocab_size=400, num_proc=1, log=_quiet)
    assert (m["source"]["kind"], m["source"]["documents"]) == ("parquet", 6)


def test_stdlib_source_and_tokenizer_round_trip(stdlib_dir: Path) -> None:
    m = load_manifest(stdlib_dir)
    assert m["source"]["spec"] == "python-stdlib" and 250_000 < m["source"]["bytes"] <= 300_000
    assert m["stats"]["num_proc"] == 2
    tok = Tokenizer.load(stdlib_dir / "tokenizer.model")
    for text in (PY_SNIPPET, PROSE, "", "\n", "  \t \n", "x" * 5000):
        assert tok.decode(tok.encode(text)) == text
    assert m["stats"]["chars_per_token"]["all"] > 1.5  # vocab 512 only; 8000 gives ~4 (docs/DATA.md)
    src = sources.resolve_source("python-stdlib")
    rel = [f.relative_to(src.root) for f in src.files]
    assert rel == sorted(rel, key=lambda p: p.as_posix()) and all(f.stat().st_size > 0 for f in src.files)
    assert not any({"test", "tests", "idle_test", "site-packages"} & set(p.parts[:-1]) for p in rel)


def test_split_assignment_deterministic_and_non_empty() -> None:
    a = assign_splits(1000, 7, 0.05, 0.05)
    assert np.array_equal(a, assign_splits(1000, 7, 0.05, 0.05))
    assert not np.array_equal(a, assign_splits(1000, 8, 0.05, 0.05))
    assert np.array_equal(a[:500], assign_splits(500, 7, 0.05, 0.05))  # a document's split ignores the others
    assert 20 < (a == 1).sum() < 80 and 20 < (a == 2).sum() < 80
    for n in range(3, 40):
        assert set(assign_splits(n, 0, 0.05, 0.05).tolist()) == {0, 1, 2}
    with pytest.raises(DataError, match="at least 3 documents .*got 2"):
        assign_splits(2, 0, 0.05, 0.05)


def test_rerun_is_up_to_date_and_changes_are_noticed(txt_corpus: tuple[Path, list[str]], tmp_path: Path) -> None:
    folder, _ = txt_corpus
    out = tmp_path / "d"
    first = prepare(str(folder), out, vocab_size=400, num_proc=1, log=_quiet)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    messages: list[str] = []
    t0 = time.perf_counter()
    again = prepare(str(folder), out, vocab_size=400, num_proc=1, log=messages.append)
    assert time.perf_counter() - t0 < 1.0 and again == first
    assert "up to date" in messages[0]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    changed = prepare(str(folder), out, vocab_size=400, seed=1, num_proc=1, log=messages.append, force=True)
    assert changed["input_fingerprint"] != first["input_fingerprint"] and "up to date" not in messages[-1]


def test_replacing_a_tokenizer_needs_force_and_says_what_it_replaces(txt_corpus: tuple[Path, list[str]],
                                                                      tmp_path: Path) -> None:
    """Rebuilding a folder with options that train another tokenizer is refused before anything is touched, naming
    the tokenizer and a sibling folder prepared with it; --force replaces it and says so; reusing the folder's own
    tokenizer needs no --force."""
    folder, _ = txt_corpus
    out, sibling = tmp_path / "d", tmp_path / "other"
    first = prepare(str(folder), out, vocab_size=400, num_proc=1, log=_quiet)
    prepare(str(folder), sibling, tokenizer=out / "tokenizer.model", seed=3, num_proc=1, log=_quiet)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    old = first["tokenizer"]["sha256"][:12]
    with pytest.raises(DataError, match=rf"already holds data tokenised with .*{old}.*also used by .*other.*--force"):
        prepare(str(folder), out, vocab_size=450, num_proc=1, log=_quiet)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    same = prepare(str(folder), out, tokenizer=sibling / "tokenizer.model", seed=2, num_proc=1, log=_quiet)
    assert same["tokenizer"]["sha256"] == first["tokenizer"]["sha256"]
    messages: list[str] = []
    replaced = prepare(str(folder), out, vocab_size=450, num_proc=1, log=messages.append, force=True)
    assert replaced["tokenizer"]["sha256"] != first["tokenizer"]["sha256"]
    assert any(m.startswith(f"--force: replacing tokenizer {out}/tokenizer.model (sha256 {old}") for m in messages)
    assert any(m.startswith("warning: the val split has") for m in messages)  # 12 short documents


def test_outputs_are_byte_identical_across_runs_and_num_proc(txt_corpus: tuple[Path, list[str]],
                                                              tmp_path: Path) -> None:
    folder, _ = txt_corpus
    for name, procs in (("a", 1), ("b", 2)):
        prepare(str(folder), tmp_path / name, vocab_size=400, num_proc=procs, log=_quiet)
    for name in ("tokenizer.model", "train.bin", "val.bin", "test.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_given_tokenizer_is_reused(stdlib_dir: Path, txt_corpus: tuple[Path, list[str]], tmp_path: Path) -> None:
    folder, docs = txt_corpus
    given = stdlib_dir / "tokenizer.model"
    m = prepare(str(folder), tmp_path / "d", tokenizer=given, num_proc=1, log=_quiet)
    assert m["tokenizer"]["sha256"] == Tokenizer.load(given).sha256 and m["tokenizer"]["trained"] is False
    assert (tmp_path / "d" / "tokenizer.model").read_bytes() == given.read_bytes()
    assert m["vocab_size"] == 512 and m["options"]["vocab_size"] is None
    with pytest.raises(DataError, match="--vocab-size 600 disagrees with --tokenizer .*vocab_size 512"):
        prepare(str(folder), tmp_path / "e", tokenizer=given, vocab_size=600, log=_quiet)
    with pytest.raises(DataError, match="tokenizer file .*nope.model does not exist"):
        prepare(str(folder), tmp_path / "e", tokenizer=tmp_path / "nope.model", log=_quiet)


def test_atomic_write_keeps_previous_file_on_crash(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    with atomic_open(target) as f:
        f.write(b"old")
    with pytest.raises(RuntimeError), atomic_open(target) as f:
        f.write(b"new, half")
        raise RuntimeError("crash")
    assert target.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["x.bin"]


def test_prepare_crash_mid_write_leaves_the_old_folder_whole(txt_corpus: tuple[Path, list[str]], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while a rebuild appends tokens: one line naming the file, and the old folder (manifest included)
    is untouched, with no work folder left behind."""
    folder, _ = txt_corpus
    out = tmp_path / "d"
    prepare(str(folder), out, vocab_size=400, num_proc=1, log=_quiet)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_write = split_writer.SplitWriter.append

    def half_then_full(self, codes, ntokens, nchars, data):  # writes half of the first batch, then the disk is full
        real_write(self, codes[:1], ntokens[:1], nchars[:1], [d[: len(d) // 2] for d in data])
        with explain_write_error(self.work / "train.bin", "the split file", 1000):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(split_writer.SplitWriter, "append", half_then_full)
    with pytest.raises(DiskFullError, match=r"no space left on .* while writing the split file .*train.bin: 0.0 MB"):
        prepare(str(folder), out, vocab_size=400, seed=5, num_proc=1, log=_quiet, force=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert load_manifest(out)["options"]["seed"] == 0


# --------------------------------------------------------------------------------------------- reading errors
def _arange_folder(tmp_path: Path, n: int = 10) -> Path:
    return fake_data_folder(tmp_path / "f", {s: np.arange(n) for s in shards.SPLITS})


def test_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data folder .*nowhere does not exist; run `python data_prep/prepare.py "
                                        r"--source python-stdlib"):
        load_manifest(tmp_path / "nowhere")
    with pytest.raises(DataError, match=r"prepare.py --source debian-prose --out .*debian-prose --vocab-size 8000"):
        load_manifest(tmp_path / "debian-prose", vocab_size=8000)  # the source its name says
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="has no manifest.json"):
        load_manifest(tmp_path / "empty")
    d = _arange_folder(tmp_path)
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(DataError, match=r"manifest\.json: malformed JSON at line 1, column 2: .*; run `python data_prep"):
        load_manifest(d)
    (d / "manifest.json").write_text(json.dumps({"format_version": 1, "dtype": "uint16", "vocab_size": 10}))
    with pytest.raises(DataError, match="missing key 'tokenizer'"):
        load_manifest(d)
    (d / "manifest.json").write_text(json.dumps({"format_version": 1, "dtype": "int8"}))
    with pytest.raises(DataError, match="'dtype' is 'int8', expected 'uint16' or 'uint32'"):
        load_manifest(d)


def test_token_file_errors(tmp_path: Path) -> None:
    d = _arange_folder(tmp_path)
    with pytest.raises(DataError, match="vocab_size 50 does not match .* vocab_size 100"):
        open_split(d, "train", vocab_size=50)
    with pytest.raises(DataError, match="no split 'dev'"):
        open_split(d, "dev")
    with open(d / "val.bin", "ab") as f:
        f.write(b"\x01")
    with pytest.raises(DataError, match=r"val.bin has 21 bytes, not a multiple of 2 \(uint16\)"):
        open_split(d, "val")
    np.arange(12, dtype=np.uint16).tofile(d / "test.bin")
    with pytest.raises(DataError, match="test.bin holds 12 tokens .* expects 10 tokens"):
        open_split(d, "test")
    split = open_split(d, "train")
    split.check_token_range(10)
    with pytest.raises(DataError, match="token id 7 at position 7 is >= vocab_size 7"):
        split.check_token_range(7, chunk=3)


# ------------------------------------------------------------------------------------------------- sampling
def test_window_sampler_determinism_ranks_and_content(tmp_path: Path) -> None:
    split = open_split(fake_data_folder(tmp_path / "s", {s: np.arange(1000) for s in shards.SPLITS}, vocab_size=1000),
                       "train")
    a = WindowSampler(split, seq_len=16, micro_batch_size=4, seed=11, rank=0, world_size=2)
    b = WindowSampler(split, seq_len=16, micro_batch_size=4, seed=11, rank=0, world_size=2)
    other_rank = WindowSampler(split, seq_len=16, micro_batch_size=4, seed=11, rank=1, world_size=2)
    x = a.batch(5, 1)
    assert x.shape == (4, 17) and str(x.dtype) == "torch.int64"
    assert (x[:, 1:] - x[:, :-1] == 1).all()  # windows of consecutive tokens (the split holds 0..999)
    assert np.array_equal(x[:, 0].numpy(), a.starts(5, 1))
    assert np.array_equal(x.numpy(), b.batch(5, 1).numpy())
    assert not np.array_equal(x.numpy(), other_rank.batch(5, 1).numpy())
    assert not np.array_equal(x.numpy(), a.batch(6, 1).numpy()) and not np.array_equal(x.numpy(), a.batch(5, 0).numpy())
    assert int(x.max()) <= 999


def test_window_sampler_settings_resume_check_and_errors(tmp_path: Path) -> None:
    split = open_split(_arange_folder(tmp_path, 10), "train")
    s = WindowSampler(split, seq_len=4, micro_batch_size=2, seed=1, world_size=2)
    s.batch(3)
    state = s.settings()
    assert state == {"seed": 1, "seq_len": 4, "micro_batch_size": 2, "rank": 0, "world_size": 2, "consumed_steps": 4}
    resumed = WindowSampler(split, seq_len=4, micro_batch_size=2, seed=1, rank=1, world_size=2)
    resumed.check_resume(json.loads(json.dumps(state)))  # survives JSON; any rank may check rank 0's copy
    assert resumed.consumed_steps == 4
    with pytest.raises(DataError, match="resume mismatch: .*seq_len=4, this run has seq_len=5"):
        WindowSampler(split, seq_len=5, micro_batch_size=2, seed=1, world_size=2).check_resume(state)
    with pytest.raises(DataError, match="resume mismatch: .*seed=1, this run has seed=2"):
        WindowSampler(split, seq_len=4, micro_batch_size=2, seed=2, world_size=2).check_resume(state)
    with pytest.raises(DataError, match="has 10 tokens, fewer than seq_len \\+ 1 = 11"):
        WindowSampler(split, seq_len=10, micro_batch_size=2, seed=1)
    edge = WindowSampler(split, seq_len=9, micro_batch_size=3, seed=0)  # exactly one possible window
    assert edge.batch(0).tolist() == [list(range(10))] * 3


def test_open_split_of_a_small_vocabulary_is_uint16_tokens(tmp_path: Path) -> None:
    split = open_split(_arange_folder(tmp_path, 10), "val")
    assert isinstance(split, TokenSplit) and split.tokens.dtype == np.uint16 and split.tokens.tolist() == list(range(10))


# --------------------------------------------------------------------------------------------- Debian (offline)
def test_debian_source_without_apt_get(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources.shutil, "which", lambda name: None)
    with pytest.raises(DataError, match=r"`apt-get` is not available.*apt-get download python3.11-doc"):
        sources.resolve_source("debian-prose", cache_dir=tmp_path)
    assert not (tmp_path / "python3.11-doc").exists()


def test_debian_download_failure_names_package_and_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sources.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(sources.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 100, "", "E: Unable to locate package golang-1.19-src"))
    monkeypatch.setenv("REGULARGPT_CACHE", str(tmp_path))
    with pytest.raises(DataError, match=r"`apt-get download golang-1.19-src` failed \(exit 100\).*Unable to locate"):
        sources.resolve_source("debian-code")
    assert not list(tmp_path.iterdir())  # no half-fetched package left in the cache


def test_source_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file, folder or glob match, and not a known source"):
        sources.resolve_source(str(tmp_path / "missing"))
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match=r"mixes file kinds \['json', 'text'\]"):
        sources.resolve_source(str(tmp_path))
    with pytest.raises(DataError, match="--val-fraction 0.6 and --test-fraction 0.5"):
        prepare(str(tmp_path / "a.txt"), tmp_path / "d", val_fraction=0.6, test_fraction=0.5, log=_quiet)
    with pytest.raises(DataError, match="gave 1 non-empty document.*need at least 3 documents"):
        prepare(str(tmp_path / "a.txt"), tmp_path / "d", vocab_size=300, num_proc=1, log=_quiet)


@pytest.mark.parametrize("module", [sources, tokenizer_mod, shards, sampler_mod])
def test_docstring_examples(module: object) -> None:
    assert doctest.testmod(module).failed == 0  # type: ignore[arg-type]


def test_window_sampler_refuses_another_world_size_and_a_token_at_the_vocab_size(tmp_path: Path) -> None:
    split = open_split(_arange_folder(tmp_path, 10), "train")  # tokens 0..9
    state = WindowSampler(split, seq_len=4, micro_batch_size=2, seed=1, world_size=2).settings()
    with pytest.raises(DataError, match="resume mismatch: .*world_size=2, this run has world_size=4"):
        WindowSampler(split, seq_len=4, micro_batch_size=2, seed=1, world_size=4).check_resume(state)
    edge = WindowSampler(split, seq_len=9, micro_batch_size=1, seed=0, vocab_size=9)  # the one window holds id 9
    with pytest.raises(DataError, match="token id 9 at position 9 is >= vocab_size 9"):
        edge.batch(0)
    assert WindowSampler(split, seq_len=9, micro_batch_size=1, seed=0, vocab_size=10).batch(0).tolist() == [list(range(10))]
