"""Preparation at corpus scale (#42) and rebuilds that lose nothing (#37 §3): identical tokens to the previous
implementation, exact chunked encoding, the reproducible tokenizer sample, the linear sentence cutter, data
problems as one line, a real SIGKILL mid-preparation (old folder whole, no orphaned workers, resume)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from regulargpt.data import DataError, Tokenizer, load_manifest, prepare
from regulargpt.data.encoding import SafeCuts
from regulargpt.data.shards import assign_splits
from regulargpt.data.rebuild import claim_work_folder, process_start
from regulargpt.data.sources import stdlib_files
from regulargpt.data.tokenizer import training_sentences
from regulargpt.data.tokenizer_sample import TokenizerSample

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "c6fd899"  # the last commit with the datasets-based preparation


def _quiet(_: str) -> None:
    pass


def _docs() -> list[str]:
    """Real text with CRLF, tabs, unicode and a long line: 40 stdlib files, modified."""
    _, files = stdlib_files()
    docs = [f.read_text() for f in files[:12]]
    docs[3] = docs[3].replace("\n", "\r\n")
    docs[5] = "é∑日本 \t\t" + docs[5] + "x" * 9000
    return docs


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "d"
    prepare("python-stdlib", out, vocab_size=600, max_bytes=400_000, num_proc=1, log=_quiet)
    return out / "tokenizer.model"


def test_tokens_identical_to_the_previous_preparation(tokenizer: Path, tmp_path: Path) -> None:
    """A folder prepared with the datasets-based code of BEFORE and one prepared now, from the same text files
    (CRLF, unicode, a long line) and tokenizer, hold the same bytes in every split."""
    old_tree = tmp_path / "old"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "regulargpt", "data_prep"],
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {BEFORE} not available: {archive.stderr.decode()[:200]}")
    old_tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(old_tree)], input=archive.stdout, check=True)
    docs = _docs()
    (tmp_path / "txt").mkdir()
    for i, text in enumerate(docs):
        (tmp_path / "txt" / f"{i:03d}.txt").write_bytes(text.encode())
    for spec in (str(tmp_path / "txt"),):
        name = Path(spec).stem
        subprocess.run([sys.executable, str(old_tree / "data_prep/prepare.py"), "--source", spec, "--out",
                        str(tmp_path / f"old-{name}"), "--tokenizer", str(tokenizer), "--num-proc", "1"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(old_tree)})
        prepare(spec, tmp_path / f"new-{name}", tokenizer=tokenizer, num_proc=2, log=_quiet)
        for split in ("train", "val", "test"):
            old = (tmp_path / f"old-{name}" / f"{split}.bin").read_bytes()
            assert old and (tmp_path / f"new-{name}" / f"{split}.bin").read_bytes() == old, (name, split)


def test_exact_cuts_encode_like_whole_documents(tokenizer: Path) -> None:
    tok = Tokenizer.load(tokenizer)
    cuts = SafeCuts(tok.sp)
    docs = [*_docs(), "a" * 50_000, ("def f():\n    return 1\n" * 3000)]
    for doc in docs:
        chunks = cuts.chunks(doc, chunk_chars=256)
        assert "".join(chunks) == doc
        assert [i for c in chunks for i in tok.encode(c)] == tok.encode(doc)
    doc = docs[0]
    assert len(cuts.chunks(doc, 256)) > 10
    naive = [doc[i:i + 256] for i in range(0, len(doc), 256)]  # cutting anywhere changes the ids
    assert [i for c in naive for i in tok.encode(c)] != tok.encode(doc)


def test_tokenizer_sample_is_the_smallest_keys_within_the_budget_in_any_order() -> None:
    rng = np.random.default_rng(0)
    docs = [f"{i} " + "word " * int(n) for i, n in enumerate(rng.integers(1, 400, 300))]
    budget = 40_000
    brute = TokenizerSample(budget, seed=3)
    ranked = sorted(range(len(docs)), key=lambda i: brute.key(docs[i]))
    expected, total = [], 0
    for i in ranked:  # the longest run in key order within the budget
        if total + len(docs[i]) > budget:
            break
        expected.append(i)
        total += len(docs[i])
    for order in (range(len(docs)), rng.permutation(len(docs)), reversed(range(len(docs)))):
        sample = TokenizerSample(budget, seed=3)
        for i in order:
            sample.add(int(i), docs[int(i)])
        assert [i for i, _ in sample.texts()] == expected
    capped = TokenizerSample(budget, seed=3)
    capped.add(0, "z" * 10_000)  # more than budget / 16 = 2,500 bytes: its first 2,500 only
    assert [len(t) for _, t in capped.texts()] == [2_500]
    other = TokenizerSample(budget, seed=4)
    for i, d in enumerate(docs):
        other.add(i, d)
    assert [i for i, _ in other.texts()] != expected


def test_sampled_tokenizer_is_reproducible_and_recorded(tmp_path: Path) -> None:
    a = prepare("python-stdlib", tmp_path / "a", vocab_size=400, max_bytes=300_000, sample_bytes=6_000,
                num_proc=1, log=_quiet)
    b = prepare("python-stdlib", tmp_path / "b", vocab_size=400, max_bytes=300_000, sample_bytes=6_000,
                num_proc=2, log=_quiet)
    assert (tmp_path / "a/tokenizer.model").read_bytes() == (tmp_path / "b/tokenizer.model").read_bytes()
    sample, again = a["tokenizer"]["sample"], b["tokenizer"]["sample"]
    assert 3_000 < sample["bytes"] <= 6_000 and sample["budget"] == 6_000  # at most 375 bytes per document
    assert {**sample, "seconds": 0} == {**again, "seconds": 0}
    assert sample["documents"] < sample["train_documents"] == a["splits"]["train"]["documents"]


def test_sentence_cutter_is_linear_in_line_length() -> None:
    def seconds(n: int) -> float:
        text = "x" * n
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            sum(1 for _ in training_sentences([text]))
            best = min(best, time.perf_counter() - t0)
        return best

    small, large = seconds(2_000_000), seconds(8_000_000)
    assert large < 8 * small + 0.05, (small, large)  # quadratic copying: 16×
    assert [len(s) for s in training_sentences(["y" * 5000 + "\nz"], max_chars=2048)] == [2048, 2048, 906]


# ------------------------------------------------------------------------------------------------ data problems
def test_data_problems_are_one_line(tmp_path: Path, tokenizer: Path) -> None:
    rows = [{"text": f"document {i}\n" * 20} for i in range(10)] + [{"text": None}, {"body": "x"}]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"a.jsonl line 11: text field 'text' is null; .*--skip-bad-rows"):
        prepare(str(tmp_path / "a.jsonl"), tmp_path / "d", tokenizer=tokenizer, num_proc=1, log=_quiet)
    assert not (tmp_path / "d").exists()  # a failed first build leaves nothing
    m = prepare(str(tmp_path / "a.jsonl"), tmp_path / "d", tokenizer=tokenizer, skip_bad_rows=True, num_proc=1,
                log=_quiet)
    assert m["source"]["documents"] == 10 and m["source"]["skipped"] == {
        "text field 'text' is null": 1, "no text field 'text'; its keys are ['body'] (--text-field NAME names another)": 1}
    (tmp_path / "b.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c\n')
    with pytest.raises(DataError, match=r"b.jsonl line 3: malformed JSON at column 12 \(Invalid control character\); "):
        prepare(str(tmp_path / "b.jsonl"), tmp_path / "e", tokenizer=tokenizer, num_proc=1, log=_quiet)
    (tmp_path / "latin").mkdir()
    for i in range(3):
        (tmp_path / "latin" / f"{i}.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"0.txt: byte 0xe9 at offset 3 is not UTF-8 \(Latin-1 text\?"):
        prepare(str(tmp_path / "latin"), tmp_path / "e", tokenizer=tokenizer, num_proc=1, log=_quiet)
    (tmp_path / "tar").mkdir()
    with tarfile.open(tmp_path / "tar" / "corpus.txt", "w") as tar:
        tar.add(tmp_path / "a.jsonl", arcname="a.jsonl")
    with pytest.raises(DataError, match=r"corpus.txt: binary content \(NUL bytes: an archive"):
        prepare(str(tmp_path / "tar"), tmp_path / "e", tokenizer=tokenizer, num_proc=1, log=_quiet)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataError, match=r"--out .*file is a file; expected a data folder"):
        prepare(str(tmp_path / "a.jsonl"), tmp_path / "file", tokenizer=tokenizer, skip_bad_rows=True, log=_quiet)
    with pytest.raises(DataError, match=r"--vocab-size 300 is too small for this text: sentencepiece needs at least "
                                        r"(\d+) .*pass --vocab-size \1 or more"):
        prepare("python-stdlib", tmp_path / "e", vocab_size=300, max_bytes=200_000, num_proc=1, log=_quiet)
    assert not (tmp_path / "e").exists()


def test_cli_malformed_row_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "b.jsonl").write_text('{"text": "a"}\n{"text": \n')
    proc = subprocess.run([sys.executable, str(ROOT / "data_prep/prepare.py"), "--source", str(tmp_path / "b.jsonl"),
                           "--out", str(tmp_path / "d"), "--vocab-size", "300"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "b.jsonl line 2: malformed JSON" in errors[0] and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------- rebuilds (#37 §3)
def test_folder_with_a_tokenizer_and_no_manifest_keeps_it(tmp_path: Path, tokenizer: Path) -> None:
    (tmp_path / "c").mkdir()
    for i in range(6):
        (tmp_path / "c" / f"{i}.txt").write_text(f"line {i}\n" * 30)
    out = tmp_path / "d"
    prepare(str(tmp_path / "c"), out, tokenizer=tokenizer, num_proc=1, log=_quiet)
    (out / "manifest.json").unlink()  # an interrupted old-style rebuild
    old = (out / "tokenizer.model").read_bytes()
    with pytest.raises(DataError, match=r"already holds data tokenised with .*tokenizer.model .*--force"):
        prepare(str(tmp_path / "c"), out, vocab_size=300, num_proc=1, log=_quiet)
    assert (out / "tokenizer.model").read_bytes() == old
    m = prepare(str(tmp_path / "c"), out, tokenizer=out / "tokenizer.model", force=True, num_proc=1, log=_quiet)
    assert (out / "tokenizer.model").read_bytes() == old and m["tokenizer"]["sha256"] == load_manifest(out)[
        "tokenizer"]["sha256"]
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "test.bin", "tokenizer.model", "train.bin",
                                                     "val.bin"]


def test_stale_work_folders_are_removed_and_a_live_one_refuses(tmp_path: Path) -> None:
    out = tmp_path / "d"
    (out / ".work-dead").mkdir(parents=True)
    (out / ".work-dead" / "owner.json").write_text(json.dumps({"pid": 999_999_999, "start": "1"}))
    (out / ".train.bin.999999999.tmp").write_bytes(b"x")
    claim_work_folder(out, ".work-mine")
    assert sorted(p.name for p in out.iterdir()) == [".work-mine"]
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / ".work-live").mkdir()
        (out / ".work-live" / "owner.json").write_text(json.dumps({"pid": live.pid, "start": process_start(live.pid)}))
        with pytest.raises(DataError, match=rf"being prepared by another process \(pid {live.pid}"):
            claim_work_folder(out, ".work-mine")
    finally:
        live.kill()
        live.wait()


def test_sigkill_mid_preparation_keeps_the_old_folder_leaves_no_workers_and_resumes(tmp_path: Path,
                                                                                     tokenizer: Path) -> None:
    """A real SIGKILL of prepare.py while it encodes a rebuild: the old folder is untouched (manifest and all), its
    workers exit, and the same command then resumes after the last checkpoint and gives the right tokens."""
    corpus = tmp_path / "corpus.jsonl"
    _, files = stdlib_files()
    docs, size = [], 0
    for f in files:  # about 4 MB: several 1 MB batches
        docs.append(f.read_text())
        size += len(docs[-1])
        if size > 4_000_000:
            break
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    out = tmp_path / "d"
    prepare(str(corpus), out, tokenizer=tokenizer, max_bytes=30_000, num_proc=1, log=_quiet)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    command = [sys.executable, str(ROOT / "data_prep/prepare.py"), "--source", str(corpus), "--out", str(out),
               "--tokenizer", str(out / "tokenizer.model"), "--num-proc", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, workers = time.monotonic() + 120, []
    while time.monotonic() < deadline and proc.poll() is None:
        states = list(out.glob(".work-*/state.json"))
        if states and json.loads(states[0].read_text()).get("documents", 0) > 0:
            workers = psutil.Process(proc.pid).children(recursive=True)
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "prepare.py finished before its first checkpoint"
    assert {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".work-")} == before
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert len(workers) >= 2 and not alive
    resumed = subprocess.run(command, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from document" in resumed.stdout
    m = load_manifest(out)
    tok = Tokenizer.load(out / "tokenizer.model")
    kept = [d for d in docs if d]
    codes = assign_splits(len(kept), 0, 0.05, 0.05)
    for code, split in enumerate(("train", "val", "test")):
        stream = np.fromfile(out / f"{split}.bin", dtype=np.uint16).tolist()
        expected = [t for d, c in zip(kept, codes) if c == code for t in tok.encode(d) + [tok.eos_id]]
        assert stream == expected, split
    assert m["source"]["documents"] == len(kept) and not list(out.glob(".work-*"))


def test_evaluation_defaults_to_a_token_budget_and_says_what_it_scores() -> None:
    from regulargpt.config.sections import EvalConfig
    from regulargpt.evaluation.length_sweep import _estimate
    from regulargpt.evaluation.perplexity import plan_tokens

    assert EvalConfig().tokens == 2_097_152
    counts = plan_tokens(300_000_000, [512, 1024, 16384], EvalConfig().tokens)  # a large test split: the budget
    assert counts == {512: 2_097_152, 1024: 2_097_152, 16384: 2_097_152}
    line = _estimate(["a", "b"], [512, 1024, 16384], counts, 300_000_000, 2_097_152)
    assert line.startswith("scoring 12,582,912 tokens: 2 run(s) × 3 length(s) × up to 2,097,152 tokens")
    assert "the whole split" in _estimate(["a"], [512], {512: 1024}, 1025, 0)
