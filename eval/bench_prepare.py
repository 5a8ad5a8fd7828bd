"""Benchmark data_prep/prepare.py at corpus scale against the tokenizer's own speed → results/bench_prepare.md.

For each size (MB of jsonl text built from the UTF-8 text files under /usr/share and /usr/lib/python3*, one file per
row, the file list repeated with a "# copy k" first line once it is used up):

- **floor**: the tokenizer's own rate on the same text with all cores: a plain multiprocessing loop (one process per
  core, each loading the model once) of sentencepiece `encode` over the lines of `--floor-mb` blocks of 1 MB
  spread evenly through the corpus, read and parsed from the jsonl once (MB of text per second);
- **prepare**: `python data_prep/prepare.py --source corpus.jsonl --out DIR` (tokenizer trained on the default
  sample, then encoding), sampled every 0.5 s: RSS summed over the process and its children, bytes in DIR.

Reported: wall, MB/s (text bytes / wall), the encode phase's MB/s and its ratio to the floor, tokens/s, peak RSS
(summed), peak extra disk (peak bytes in DIR minus the final folder), final folder size.

Each mode rewrites its own `##` section of `--out` and keeps the others:

    python eval/bench_prepare.py --sizes 250 1000 4000 --work /tmp/bench_prepare    # the corpus-size table
    python eval/bench_prepare.py --sizes 250 --same-conditions 30                     # floor vs prepare, back to back
    python eval/bench_prepare.py --sizes 250 --single-line 200                        # one 200 MB line vs its lines
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout without `pip install -e .`
from regulargpt.files import atomic_write_text  # noqa: E402
_SP: list[spm.SentencePieceProcessor] = []


def text_files() -> list[Path]:
    roots = [Path("/usr/share"), *sorted(Path("/usr/lib").glob("python3*"))]
    return sorted(p for r in roots for p in r.rglob("*") if p.is_file() and not p.is_symlink())


def build_corpus(path: Path, megabytes: int) -> int:
    """Write `megabytes` MB of jsonl rows {"text": file content}; returns the text bytes written."""
    if path.is_file():
        return json.loads(path.with_suffix(".info").read_text())["text_bytes"]
    files, target, total, copy = text_files(), megabytes * 1_000_000, 0, 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as out:
        while total < target:
            for f in files:
                try:
                    data = f.read_bytes()
                    text = data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                if not text.strip() or "\x00" in text:
                    continue
                text = (f"# copy {copy}\n" if copy else "") + text
                out.write(json.dumps({"text": text}) + "\n")
                total += len(text.encode())
                if total >= target:
                    break
            copy += 1
    tmp.rename(path)
    path.with_suffix(".info").write_text(json.dumps({"text_bytes": total, "copies": copy}))
    return total


def _init(model: str) -> None:
    _SP.append(spm.SentencePieceProcessor(model_file=model))


def _encode_lines(lines: list[str]) -> int:
    return sum(len(x) for x in _SP[0].encode(lines, num_threads=1))


def floor_rate(corpus: Path, model: str, megabytes: int) -> dict:
    """MB/s and tokens/s of a plain Pool(cores) loop of sentencepiece encode over lines (reading included), on
    `megabytes` blocks of 1 MB of rows spread evenly through the corpus: the same mix of text that prepare.py
    encodes (the first MB of a corpus built file by file is one kind of text, and encodes at its own speed)."""
    def batches():
        size, lines = 0, []
        total = corpus.stat().st_size
        with open(corpus, "rb") as f:
            for block in range(megabytes):
                f.seek(block * total // megabytes)
                if block:
                    f.readline()  # to the start of the next row
                got = 0
                while got < 1_000_000:
                    row = f.readline()
                    if not row:
                        break
                    text = json.loads(row)["text"]
                    lines.extend(text.splitlines(keepends=True))
                    got += len(text.encode())
                    if len(lines) > 20_000:
                        yield lines
                        lines = []
                size += got
        yield lines
        stats["bytes"] = size

    stats: dict = {}
    t0 = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(os.cpu_count(), _init, (model,)) as pool:
        t_start = time.perf_counter()
        tokens = sum(pool.imap(_encode_lines, batches()))
    wall = time.perf_counter() - t_start
    return {"mb_s": stats["bytes"] / wall / 1e6, "tok_s": tokens / wall, "mb": stats["bytes"] / 1e6,
            "startup_s": t_start - t0}


def folder_bytes(path: Path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def run_prepare(args: list[str], seconds: float | None = None) -> dict:
    """Run prepare.py, sampling summed RSS and the output folder's bytes every 0.5 s (stopped after `seconds`)."""
    out = Path(args[args.index("--out") + 1])
    proc = subprocess.Popen([sys.executable, str(ROOT / "data_prep/prepare.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    peak = {"rss": 0, "disk": 0}
    done = threading.Event()

    def sample() -> None:
        parent = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                procs = [parent, *parent.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in procs if p.is_running())
            except psutil.Error:
                rss = 0
            peak["rss"] = max(peak["rss"], rss)
            peak["disk"] = max(peak["disk"], folder_bytes(out))
            done.wait(0.5)

    thread = threading.Thread(target=sample, daemon=True)
    t0 = time.perf_counter()
    thread.start()
    try:
        log = proc.communicate(timeout=seconds)[0]
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate()
        done.set()
        thread.join()
        return {"wall": time.perf_counter() - t0, "peak_rss": peak["rss"]}
    wall = time.perf_counter() - t0
    done.set()
    thread.join()
    if proc.returncode != 0:
        raise SystemExit(f"prepare.py failed ({proc.returncode}):\n{log[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    final = folder_bytes(out)
    return {"wall": wall, "manifest": manifest, "peak_rss": peak["rss"], "peak_extra": max(0, peak["disk"] - final),
            "final": final}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[250, 1000, 4000], help="corpus sizes in MB")
    p.add_argument("--work", default="/tmp/bench_prepare")
    p.add_argument("--floor-mb", type=int, default=60, help="MB of text the floor is measured on")
    p.add_argument("--out", default=str(ROOT / "results/bench_prepare.md"))
    p.add_argument("--same-conditions", type=int, metavar="MB",
                   help="instead: floor and encode-only prepare.py alternately (twice) on the first MB of the first "
                        "size's corpus, with the tokenizer of its data folder; and the encode phase's peak RSS over "
                        "its first 120 s on every size's corpus")
    p.add_argument("--single-line", type=int, metavar="MB",
                   help="instead: prepare.py (tokenizer trained, then encoding) on the first MB of the first size's "
                        "corpus as one document, once with its newlines and once with every newline replaced by a "
                        "space (one line of MB): wall and phases of each")
    p.add_argument("--peak-within", type=float, metavar="SECONDS",
                   help="instead: peak RSS (summed) of prepare.py training a tokenizer and encoding, over its first "
                        "SECONDS, on every size's corpus (its run is then stopped)")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.peak_within:
        print(f"| corpus | peak RSS (summed), first {args.peak_within:.0f} s (sample, tokenizer, encoding) |\n|---|---|")
        for size in args.sizes:
            res = run_prepare(["--source", str(work / f"corpus_{size}.jsonl"), "--out", str(work / f"peak_{size}"),
                               "--force"], seconds=args.peak_within)
            print(f"| {size} MB | {res['peak_rss'] / 1e9:.2f} GB |", flush=True)
        return
    if args.same_conditions:
        same_conditions(work, args.sizes, args.same_conditions, Path(args.out))
        return
    if args.single_line:
        single_line(work, args.sizes[0], args.single_line, Path(args.out))
        return
    rows = []
    for size in args.sizes:
        corpus = work / f"corpus_{size}.jsonl"
        text_bytes = build_corpus(corpus, size)
        out = work / f"data_{size}"
        # a first preparation: over an existing folder prepare.py keeps the old one until the swap (1× the output)
        shutil.rmtree(out, ignore_errors=True)
        load = os.getloadavg()[0]
        res = run_prepare(["--source", str(corpus), "--out", str(out)])
        m = res["manifest"]
        floor = floor_rate(corpus, str(out / "tokenizer.model"), args.floor_mb)
        tokens = sum(s["tokens"] for s in m["splits"].values())
        enc_s = m["stats"]["seconds"]["tokenise"]
        rows.append({"size": size, "text_mb": text_bytes / 1e6, "wall": res["wall"], "mb_s": text_bytes / res["wall"] / 1e6,
                     "enc_mb_s": text_bytes / enc_s / 1e6, "tok_s": tokens / enc_s, "floor_mb_s": floor["mb_s"],
                     "floor_tok_s": floor["tok_s"], "peak_rss_gb": res["peak_rss"] / 1e9,
                     "peak_extra_mb": res["peak_extra"] / 1e6, "final_mb": res["final"] / 1e6, "load": load,
                     "seconds": m["stats"]["seconds"], "sample": m["tokenizer"]["sample"]})
        print(json.dumps(rows[-1]), flush=True)
        write_table(Path(args.out), rows, args.floor_mb)


def _slice(work: Path, size: int, megabytes: int) -> tuple[Path, int]:
    """The first `megabytes` MB (text bytes, whole rows) of corpus_<size>.jsonl as slice_<megabytes>.jsonl."""
    part = work / f"slice_{megabytes}.jsonl"
    with open(work / f"corpus_{size}.jsonl") as src, open(part, "w") as dst:
        total = 0
        for row in src:
            dst.write(row)
            total += len(json.loads(row)["text"].encode())
            if total >= megabytes * 1_000_000:
                break
    return part, total


def same_conditions(work: Path, sizes: list[int], megabytes: int, report: Path) -> None:
    """Section: floor vs encode-only prepare.py back to back; encode-phase RSS per corpus size."""
    tok = str(work / f"data_{sizes[0]}" / "tokenizer.model")
    part, total = _slice(work, sizes[0], megabytes)
    lines = [f"Command: `python eval/bench_prepare.py --sizes {' '.join(map(str, sizes))} --same-conditions "
             f"{megabytes}` ({megabytes} MB of the {sizes[0]} MB corpus, tokenizer of `data_{sizes[0]}`, `--tokenizer` "
             "given: encode only; floor and prepare.py alternate, twice).", "",
             "| run | load | floor MB/s | prepare.py encode MB/s (wall MB/s) | encode / floor |", "|---|---|---|---|---|"]
    for k in range(2):
        floor = floor_rate(part, tok, megabytes + 1)
        load = os.getloadavg()[0]
        res = run_prepare(["--source", str(part), "--out", str(work / "slice_out"), "--tokenizer", tok, "--force"])
        enc = total / res["manifest"]["stats"]["seconds"]["tokenise"] / 1e6
        lines.append(f"| {k + 1} | {load:.1f} | {floor['mb_s']:.2f} | {enc:.2f} ({total / res['wall'] / 1e6:.2f}) | "
                     f"{enc / floor['mb_s']:.2f}× |")
        print(lines[-1], flush=True)
    lines += ["", "| corpus | encode-phase peak RSS (summed), first 120 s |", "|---|---|"]
    for size in sizes:
        res = run_prepare(["--source", str(work / f"corpus_{size}.jsonl"), "--out", str(work / f"rss_{size}"),
                           "--tokenizer", tok, "--force"], seconds=120)
        lines.append(f"| {size} MB | {res['peak_rss'] / 1e9:.2f} GB |")
        print(lines[-1], flush=True)
    write_section(report, "Floor and prepare.py back to back (same conditions)", lines)


def single_line(work: Path, size: int, megabytes: int, report: Path) -> None:
    """Section: one document of `megabytes` MB prepared with its newlines, then as a single line (newlines → spaces).

    The training-sentence cutter and the encoder's exact cuts must be linear in line length, so the two walls should
    be close; a cutter that copied the rest of the line per chunk made the single line quadratic."""
    build_corpus(work / f"corpus_{size}.jsonl", size)
    part, _ = _slice(work, size, megabytes)
    text = "".join(json.loads(row)["text"] for row in open(part))
    lines = [f"Command: `python eval/bench_prepare.py --sizes {size} --single-line {megabytes}` (the first "
             f"{megabytes} MB of the {size} MB corpus as one jsonl row, beside rows of 2 kB that fill the val and "
             f"test splits; tokenizer trained by prepare.py, then encoding).",
             "", f"| document | load | wall | seconds: read+sample / tokenizer / encode / finish | peak RSS (summed) |",
             "|---|---|---|---|---|"]
    for name, doc in (("with its newlines", text), ("one line (newlines → spaces)", text.replace("\n", " "))):
        src = work / "single_doc.jsonl"
        src.write_text("".join(json.dumps({"text": t}) + "\n" for t in _around_train_document(doc, text)))
        load = os.getloadavg()[0]
        res = run_prepare(["--source", str(src), "--out", str(work / "single_out"), "--force"])
        s = res["manifest"]["stats"]["seconds"]
        lines.append(f"| {len(doc.encode()) / 1e6:.0f} MB, {name} | {load:.1f} | {res['wall']:.1f} s | "
                     f"{s['read']:.1f} / {s['tokenizer']:.1f} / {s['tokenise']:.1f} / {s['write']:.1f} | "
                     f"{res['peak_rss'] / 1e9:.2f} GB |")
        print(lines[-1], flush=True)
    write_section(report, "One long line", lines)


def _around_train_document(doc: str, text: str) -> list[str]:
    """`doc` at the first index the document split (seed 0, 5 % val, 5 % test) sends to train, and 2 kB documents of
    `text` at every other index up to the first of each split, so that val and test are not empty."""
    from regulargpt.data.encoding import split_code, unit_hash

    codes = [split_code(unit_hash(0, i), 0.05, 0.05) for i in range(1000)]
    first = {code: codes.index(code) for code in (0, 1, 2)}
    return [doc if i == first[0] else text[2000 * i:2000 * (i + 1)] for i in range(max(first.values()) + 1)]


def write_section(path: Path, heading: str, lines: list[str]) -> None:
    """Replace (or append) the `## heading` section of the report at `path`, keeping the others."""
    text = path.read_text() if path.exists() else "# prepare.py at corpus scale\n"
    parts = text.split("\n## ")
    body = "\n".join([heading, "", *lines]).rstrip() + "\n"
    for i, part in enumerate(parts[1:], 1):
        if part.split("\n", 1)[0] == heading:
            parts[i] = body
            break
    else:
        parts.append(body)
    parts = [parts[0].rstrip() + "\n", *(p.rstrip() + "\n" for p in parts[1:])]
    atomic_write_text(path, "\n## ".join(parts))


def write_table(path: Path, rows: list[dict], floor_mb: int = 60) -> None:
    cores = os.cpu_count()
    lines = [
        f"Machine: {cores} cores shared with other jobs (1-min load average at each run's start in the table), "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB. Corpora: jsonl of the UTF-8 text files under /usr/share "
        f"and /usr/lib/python3* (repeated with a `# copy k` line when used up). Tokenizer: trained by prepare.py "
        f"(vocab 8000, default sample); floor: a plain Pool({cores}) loop of sentencepiece encode over the lines of "
        f"{floor_mb} blocks of 1 MB spread evenly through the same corpus, with the same tokenizer, reading "
        f"included, measured right after.",
        "",
        "Command: `python eval/bench_prepare.py --sizes " + " ".join(str(r["size"]) for r in rows) + "`",
        "",
        "| corpus | load | wall | MB/s (all phases) | encode MB/s | floor MB/s | encode / floor | tokens/s (encode) "
        "| peak RSS (summed) | peak extra disk | final folder | seconds: read+sample / tokenizer / encode / finish |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        s = r["seconds"]
        lines.append(
            f"| {r['text_mb']:.0f} MB | {r['load']:.1f} | {r['wall']:.0f} s | {r['mb_s']:.2f} | {r['enc_mb_s']:.2f} | "
            f"{r['floor_mb_s']:.2f} | {r['enc_mb_s'] / r['floor_mb_s']:.2f}× | {r['tok_s'] / 1e6:.2f} M | "
            f"{r['peak_rss_gb']:.2f} GB | {r['peak_extra_mb']:.0f} MB ({r['peak_extra_mb'] / r['final_mb']:.2f}× "
            f"the output) | {r['final_mb']:.0f} MB | {s['read']:.0f} / {s['tokenizer']:.0f} / {s['tokenise']:.0f} / "
            f"{s['write']:.0f} |")
    write_section(path, "Corpus sizes", lines)


if __name__ == "__main__":
    main()
