"""Crash consistency of every job, in the spirit of SQLite's crash tests and ALICE: kill it with SIGKILL at random
moments, rerun the same command, and check that the outputs equal an uninterrupted run's.

For each job (prepare, pretrain, evaluate, export) the harness first runs the command uninterrupted in a fresh
workspace (the reference, timing it: T seconds); then, for each of --kills-per-job kill points, starts the same
command in another fresh workspace, sends SIGKILL to its whole process group at a moment drawn uniformly from
[0.2 T, T] (seeded by --seed), reruns the command, and checks the invariants:

* the rerun exits 0;
* its outputs equal the reference's: prepare, the same bytes in every file of the data folder (token shards,
  tokenizer, manifest); pretrain, bit-equal final weights (every tensor of model.pt) and the same loss at every
  logged step; evaluate, the same results.jsonl rows (timing fields aside), none twice; export, bit-equal weights;
* nothing the user had before is lost: a file the user keeps in (or, for prepare, beside) the output folder.

Every job is tiny (configs/tiny/regular_gpt.json at d_model 32 on 400 kB of the Python stdlib, one CPU process,
OMP_NUM_THREADS=1), so the whole is deterministic on CPU. Example (the committed results/crash_consistency.md):

    OMP_NUM_THREADS=1 python eval/crash_consistency.py --jobs prepare,pretrain,evaluate,export --kills-per-job 5 \\
        --seed 0 --out results/crash_consistency.md

Exit status 0 when every invariant holds, 1 otherwise (the report says which).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOBS = ("prepare", "pretrain", "evaluate", "export")
_TINY = ["model.vocab_size=512", "model.d_model=32", "model.n_heads=2", "model.chunk_size=4", "model.thickness=2",
         "data.seq_len=32", "train.batch_size=4", "train.steps=6", "train.lr=0.003", "train.log_every=1",
         "train.eval_every=3", "train.eval_batches=2", "train.save_every=2", "train.keep_last=2",
         "logging.progress=false"]
_USER_FILE = "notes.md"  # what the user had in the output folder before
_VOLATILE = ("seconds", "time", "date", "host", "tokens_per_s", "elapsed")  # row fields that differ run to run


@dataclass
class Job:
    """One job: its command in workspace `w`, where its output is, and what about it must equal the reference."""

    command: Callable[[Path], list[str]]
    output: Callable[[Path], Path]
    fingerprint: Callable[[Path], object]
    user_folder: Callable[[Path], Path]


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", PYTHONPATH=path, DS_ACCELERATOR="cpu")


def _files(folder: Path) -> dict[str, object]:
    """Every file of a data folder by relative path (lock files aside): its bytes; the manifest without the fields
    that say when, by which command and how fast it was made (``created_at``, ``command``, every ``seconds``)."""
    files: dict[str, object] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.endswith(".lock"):
            files[str(path.relative_to(folder))] = path.read_bytes()
    if "manifest.json" in files:
        files["manifest.json"] = _timeless(json.loads(files["manifest.json"]))  # type: ignore[arg-type]
    return files


def _timeless(value: object) -> object:
    """`value` without the keys that say when, by which command and how fast (created_at, command, seconds)."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in ("created_at", "command", "seconds")}
    return [_timeless(v) for v in value] if isinstance(value, list) else value


def _weights(model_file: Path) -> dict[str, bytes]:
    import torch

    state = torch.load(model_file, map_location="cpu", weights_only=True)["state_dict"]
    return {name: tensor.numpy().tobytes() for name, tensor in state.items()}


def _rows(results: Path) -> list[str]:
    """The rows of results.jsonl without their timing fields, sorted; a row twice appears twice."""
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    return sorted(json.dumps({k: v for k, v in r.items() if not any(t in k for t in _VOLATILE)}, sort_keys=True)
                  for r in rows)


def _run_fingerprint(run_dir: Path) -> object:
    losses = [(r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
              if "loss" in r]
    return {"weights": _weights(run_dir / "model.pt"), "losses": losses}


def jobs(data: Path, run: Path) -> dict[str, Job]:
    """The four jobs; evaluate and export read the reference training run `run` and data folder `data`."""
    py = sys.executable
    prepare = lambda w: [py, "data_prep/prepare.py", "--source", "python-stdlib", "--out", str(w / "data"),  # noqa
                         "--vocab-size", "512", "--max-bytes", "400000", "--val-fraction", "0.2", "--num-proc", "1"]
    sets = [a for item in [f"data.path={data}", *_TINY] for a in ("--set", item)]
    pretrain = lambda w: [py, "launch/pretrain.py", "--config", "configs/tiny/regular_gpt.json",  # noqa: E731
                          "--run-dir", str(w / "run"), *sets]
    evaluate = lambda w: [py, "eval/extrapolate.py", "--runs", str(run), "--data", str(data), "--lengths",  # noqa
                          "32,64,128,256", "--tokens", "4096", "--no-progress", "--out", str(w / "out")]
    export = lambda w: [py, "launch/export.py", str(run), "--out", str(w / "out" / "model.pt")]  # noqa: E731
    return {
        "prepare": Job(prepare, lambda w: w / "data", _files, lambda w: w),
        "pretrain": Job(pretrain, lambda w: w / "run", _run_fingerprint, lambda w: w),
        "evaluate": Job(evaluate, lambda w: w / "out", lambda o: _rows(o / "results.jsonl"), lambda w: w / "out"),
        "export": Job(export, lambda w: w / "out" / "model.pt", _weights, lambda w: w / "out"),
    }


def _workspace(root: Path, name: str, job: Job) -> Path:
    w = root / name
    job.user_folder(w).mkdir(parents=True, exist_ok=True)
    (job.user_folder(w) / _USER_FILE).write_text("the user's notes\n")
    return w


def _run(cmd: list[str], kill_after: float | None = None) -> tuple[int, float, str]:
    """Run `cmd` (its own process group) → (exit status, seconds, last output); SIGKILL it after `kill_after` s."""
    started = time.time()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=kill_after if kill_after is not None else 600)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    return proc.returncode, time.time() - started, out.decode(errors="replace")[-2000:]


def check(name: str, job: Job, root: Path, kills: int, rng: random.Random, log: Callable[[str], None]) -> list[dict]:
    """The reference run of `name`, then `kills` killed-and-rerun trials → one dict per trial."""
    ref = _workspace(root, f"{name}-reference", job)
    status, seconds, out = _run(job.command(ref))
    if status != 0:
        raise RuntimeError(f"{name}: the uninterrupted run failed ({status}): {out}")
    expected = job.fingerprint(job.output(ref))
    trials = []
    for k in range(kills):
        w = _workspace(root, f"{name}-kill{k}", job)
        moment = rng.uniform(0.2 * seconds, seconds)
        killed_status, _, _ = _run(job.command(w), kill_after=moment)
        rerun, _, out = _run(job.command(w))
        problems = []
        if rerun != 0:
            problems.append(f"the rerun exited {rerun}: {out[-300:]!r}")
        elif job.fingerprint(job.output(w)) != expected:
            problems.append("its outputs differ from the uninterrupted run's")
        if (job.user_folder(w) / _USER_FILE).read_text() != "the user's notes\n":
            problems.append(f"the user's {_USER_FILE} was lost")
        trials.append({"job": name, "kill": k, "at_s": moment, "of_s": seconds,
                       "killed": killed_status == -signal.SIGKILL, "problems": problems})
        log(f"{name} kill {k}: SIGKILL at {moment:.1f} of {seconds:.1f} s "
            f"({'killed' if killed_status == -signal.SIGKILL else 'had finished'}): "
            f"{'; '.join(problems) or 'rerun equals the uninterrupted run'}")
    return trials


def report(trials: list[dict], command: str, cpu_s: float) -> str:
    failed = [t for t in trials if t["problems"]]
    lines = ["# Crash consistency: SIGKILL at random moments, then the same command again", "",
             f"Command: `{command}`", "",
             f"{len(trials)} kill points, {sum(t['killed'] for t in trials)} of them mid-run (the others came after "
             f"the job had finished), {len(failed)} with a broken invariant; {cpu_s:.0f} CPU-seconds of the jobs.",
             "", "| job | kill | SIGKILL at (s) | uninterrupted run (s) | killed mid-run | invariants |",
             "|---|---:|---:|---:|---|---|"]
    lines += [f"| {t['job']} | {t['kill']} | {t['at_s']:.1f} | {t['of_s']:.1f} | {'yes' if t['killed'] else 'no'} | "
              f"{'; '.join(t['problems']) or 'hold'} |" for t in trials]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of {', '.join(JOBS)} (default all)")
    p.add_argument("--kills-per-job", type=int, default=3, help="kill points per job (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill moments (default 0)")
    p.add_argument("--out", help="write the report (markdown) here, e.g. --out results/crash_consistency.md")
    p.add_argument("--workdir", help="keep the workspaces here (default: a temporary folder, removed)")
    args = p.parse_args(argv)
    names = [n for n in args.jobs.split(",") if n]
    if unknown := sorted(set(names) - set(JOBS)):
        p.error(f"--jobs: unknown {', '.join(unknown)}; expected some of {', '.join(JOBS)}")
    if args.kills_per_job < 1:
        p.error("--kills-per-job: expected an integer >= 1")
    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="crash-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    cpu = os.times()
    try:
        base = _workspace(root, "base", Job(lambda w: [], lambda w: w, lambda o: o, lambda w: w))
        reference = jobs(base / "data", base / "run")
        for name in ("prepare", "pretrain"):  # the data and run evaluate and export read
            status, _, out = _run(reference[name].command(base))
            if status != 0:
                raise RuntimeError(f"setting up: {name} failed: {out}")
        trials = [t for n in names for t in check(n, reference[n], root, args.kills_per_job, rng, print)]
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    used = os.times()
    cpu_s = used.children_user + used.children_system - cpu.children_user - cpu.children_system
    command = shlex.join(["python", "eval/crash_consistency.py", *(sys.argv[1:] if argv is None else argv)])
    text = report(trials, command, cpu_s)
    if args.out:
        from regulargpt.files import atomic_write_text

        atomic_write_text(args.out, text)
    print(text)
    return 1 if any(t["problems"] for t in trials) else 0


if __name__ == "__main__":
    sys.exit(main())
