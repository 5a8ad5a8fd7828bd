"""Fault injection (issue 7): crash-safe checkpoints, exact resume after kill -9 at random moments, SIGTERM/SIGUSR1,
NaN/Inf steps, evaluations that survive kill -9, and bad input → one line, exit 2, nothing on disk changed.

docs/RELIABILITY.md names the test behind every guarantee. CPU only, tiny models, OMP_NUM_THREADS=1 in every
subprocess. The pretraining fixtures (`data_dir`, `zero3_run`) are shared with test_pretrain.py (conftest.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    ROOT,
    TINY,
    ZERO3,
    Crash,
    CrashingTask,
    fake_data_folder,
    formal_losses,
    kill_tree,
    latest_step,
    pretrain,
    pretrain_args,
    pretrain_cmd,
    read_losses,
    read_metrics,
    run_env,
    snapshot,
    tiny_cfg,
    tiny_raw,
    wait_for,
)

from regulargpt.checkpoint import save_model_file
from regulargpt.config import ConfigError, FormalConfig, formal_config_from_saved, load_config_dict
from regulargpt.files import read_jsonl
from regulargpt.model import build_model
from regulargpt.train import TrainError
from regulargpt import run_directory as rd
from regulargpt.train.formal_trainer import formal_task, train_formal


def _tensors(obj: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor inside nested dicts/lists/tuples, keyed by its path."""
    if isinstance(obj, torch.Tensor):
        return {prefix: obj}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else []
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(_tensors(value, f"{prefix}/{key}"))
    return out


def _checkpoint_tensors(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """All tensors of a DeepSpeed checkpoint folder (weights, fp32 masters, optimizer state incl. step counts)."""
    out = {}
    for path in sorted((run_dir / f"global_step{step}").glob("*.pt")):
        if not path.name.startswith("rng_rank"):
            with rd.safe_loading():
                out.update(_tensors(torch.load(path, map_location="cpu", weights_only=True), path.name))
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "error" in line.lower()]


# ------------------------------------------------------------------------------- checkpoint validation (unit)


def _fake_checkpoint(run_dir: Path, step: int, seal: bool = True) -> Path:
    folder = run_dir / f"global_step{step}"
    folder.mkdir(parents=True)
    (folder / "mp_rank_00_model_states.pt").write_bytes(bytes(range(256)) * 4 + bytes([step]))
    rd.write_trainer_state(run_dir, step, {"step": step})
    if seal:
        rd.write_checksums(run_dir, step)
    return folder


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    for step in (3, 6, 9):
        _fake_checkpoint(tmp_path, step)
    _fake_checkpoint(tmp_path, 12, seal=False)  # a save killed before `latest`
    rd.mark_latest(tmp_path, 9)
    assert rd.resume_step(tmp_path) == (9, []) and not (tmp_path / "global_step12").exists()

    data = tmp_path / "global_step9" / "mp_rank_00_model_states.pt"
    data.write_bytes(data.read_bytes()[:100])  # truncated
    step, warnings = rd.resume_step(tmp_path)
    assert step == 6 and len(warnings) == 1
    assert "global_step9 is corrupt" in warnings[0] and "resuming from global_step6" in warnings[0]
    assert "mp_rank_00_model_states.pt has 100 bytes" in warnings[0]
    assert (tmp_path / "latest").read_text() == "global_step6" and (tmp_path / "global_step9.corrupt").is_dir()

    flipped = tmp_path / "global_step6" / "mp_rank_00_model_states.pt"  # same size, one byte changed
    flipped.write_bytes(b"\xff" + flipped.read_bytes()[1:])
    assert "does not match its sha256" in rd.verify_checkpoint(tmp_path, 6)
    (tmp_path / "global_step3" / "trainer_state.json").unlink()
    with pytest.raises(TrainError, match=r"no intact checkpoint.*global_step6: .*sha256.*global_step3: .*missing"):
        rd.resume_step(tmp_path)
    assert (tmp_path / "global_step6").is_dir()  # nothing is set aside when there is nothing to resume from

    legacy = tmp_path / "legacy"  # written before checksums existed: accepted when `latest` names it
    _fake_checkpoint(legacy, 5, seal=False)
    rd.mark_latest(legacy, 5)
    assert rd.resume_step(legacy) == (5, [])
    assert rd.prune_checkpoints(legacy, keep=1) == [] and not list(legacy.glob(".deleting-*"))


# --------------------------------------------------------------------------- kill -9 at random moments, 2 ranks


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_kill9_at_random_moments_with_two_ranks_resumes_exactly(zero3_run: Path, data_dir: Path,
                                                                 tmp_path: Path) -> None:
    """Three SIGKILLs of torchrun and its 2 ZeRO-3 ranks at seeded random points, each a random
    delay after a step was logged, so some land inside a save; before the last restart the newest checkpoint is
    truncated. The final losses, validation loss and exported weights equal the uninterrupted run's."""
    rng = random.Random(7)
    kill_after = sorted(rng.sample(range(2, 7), 2)) + [rng.randrange(7, 11)]
    run_dir = tmp_path / "run"
    metrics = run_dir / "metrics.jsonl"

    def logged() -> int:
        return max((row["step"] for row in read_jsonl(metrics)), default=0)

    cmd = pretrain_cmd(2) + pretrain_args(data_dir, run_dir, *ZERO3)
    for k in kill_after:
        target = max(k, logged() + 1)  # progress made by this process, not rows left by the killed one
        proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(proc, lambda: logged() >= target)
        time.sleep(rng.uniform(0.0, 0.06))  # about one step: the kill lands before, in or after a save
        assert proc.poll() is None, f"the run ended before its kill point (step {target})"
        kill_tree(proc)  # torchrun and both ranks
    newest = latest_step(run_dir)
    assert newest >= 6, newest  # keep_last=2: an older checkpoint to fall back on
    victim = max((run_dir / f"global_step{newest}").glob("*optim_states.pt"))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    final = pretrain(data_dir, run_dir, *ZERO3, nproc=2)
    assert f"global_step{newest} is corrupt" in final.stderr
    assert f"resuming from global_step{newest - 3} instead" in final.stderr
    assert read_losses(run_dir) == read_losses(zero3_run) and len(read_losses(run_dir)) == 12
    assert read_metrics(run_dir)[-1]["val_loss"] == read_metrics(zero3_run)[-1]["val_loss"]
    a = torch.load(zero3_run / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]
    assert _same(a, b)


# ------------------------------------------------------------------------------------------------- NaN / Inf


@pytest.mark.slow
def test_nan_steps_are_skipped_then_the_limit_stops_the_run(data_dir: Path, tmp_path: Path) -> None:
    """One process, ZeRO-0 fp32 (DeepSpeed calls the torch optimizer directly): a NaN loss at step 3 and NaN
    gradients at step 5, at most 1 bad step. Step 3 changes nothing; step 5 stops the run (exit 2, one line) and
    global_step4 stays the latest checkpoint. Resumed with a higher limit, step 5 is skipped and the run finishes."""
    run_dir = tmp_path / "run"
    sets = ["train.steps=6", "train.save_every=1", "train.keep_last=10", "train.eval_every=0"]
    env = run_env(REGULARGPT_INJECT_NAN="loss@3,grad@5")
    args = pretrain_cmd(1) + pretrain_args(data_dir, run_dir, *sets, "train.max_bad_steps=1")
    stopped = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert stopped.returncode == 2, stopped.stderr[-3000:]
    assert "Traceback" not in stopped.stderr
    assert "warning: step 3: non-finite loss or gradient" in stopped.stderr
    [error] = _error_lines(stopped.stderr)
    assert error.startswith("error: step 5: 2 steps skipped") and "train.max_bad_steps=1" in error
    assert "the last good checkpoint is global_step4" in error
    assert latest_step(run_dir) == 4 and not (run_dir / "global_step5").exists()
    rows = {r["step"]: r for r in read_metrics(run_dir)}
    assert rows[3]["skipped"] is True and rows[3]["loss"] != rows[3]["loss"]  # NaN
    step2, step3, step4 = (_checkpoint_tensors(run_dir, s) for s in (2, 3, 4))
    assert _same(step2, step3)  # weights, Adam moments and step counts untouched by the skipped step
    assert not _same(step3, step4)

    resumed = pretrain(data_dir, run_dir, *sets, "train.max_bad_steps=3", env=env)
    assert "resuming at step 4" in resumed.stderr and "warning: step 5: non-finite" in resumed.stderr
    assert _same(_checkpoint_tensors(run_dir, 4), _checkpoint_tensors(run_dir, 5))
    assert not _same(_checkpoint_tensors(run_dir, 5), _checkpoint_tensors(run_dir, 6))
    assert rd.read_trainer_state(run_dir, 6)["bad_steps"] == 2 and (run_dir / "model.pt").is_file()

    damaged = run_dir / "global_step2" / "mp_rank_00_model_states.pt"  # export refuses a corrupt checkpoint
    damaged.write_bytes(damaged.read_bytes()[:-10])
    before = snapshot(run_dir)
    export = subprocess.run([sys.executable, "launch/export.py", str(run_dir), "--step", "2", "--out",
                             str(tmp_path / "x.pt")], cwd=ROOT, env=run_env(), capture_output=True, text=True)
    assert export.returncode == 2 and "Traceback" not in export.stderr
    assert _error_lines(export.stderr) == [e for e in _error_lines(export.stderr) if "global_step2 is corrupt" in e]
    assert snapshot(run_dir) == before and not (tmp_path / "x.pt").exists()


@pytest.mark.slow
def test_nan_on_one_rank_is_skipped_by_every_rank_zero2_bf16(data_dir: Path, tmp_path: Path) -> None:
    """Two processes, ZeRO-2, bf16: NaN gradients at step 2 and a NaN loss at step 3, injected on rank 1 only.
    Both ranks skip both steps (all-reduced verdict, DeepSpeed's global norm): checkpoints 1, 2, 3 hold identical
    tensors (bf16 weights, fp32 masters, Adam state), step 4 trains."""
    run_dir = tmp_path / "run"
    proc = pretrain(data_dir, run_dir, "train.zero_stage=2", "train.precision=bf16", "train.steps=4",
                    "train.save_every=1", "train.keep_last=10", "train.eval_every=0", nproc=2,
                    env=run_env(REGULARGPT_INJECT_NAN="grad@2,loss@3"))
    assert "warning: step 2: non-finite" in proc.stderr and "warning: step 3: non-finite" in proc.stderr
    first, second, third, fourth = (_checkpoint_tensors(run_dir, s) for s in (1, 2, 3, 4))
    assert _same(first, second) and _same(second, third) and not _same(third, fourth)
    assert [r.get("skipped", False) for r in read_metrics(run_dir)] == [False, True, True, False]


# ---------------------------------------------------------------------------------------------------- signals


@pytest.mark.slow
def test_sigusr1_saves_a_checkpoint_and_exits_0(data_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(pretrain_cmd(1) + pretrain_args(data_dir, run_dir), cwd=ROOT, env=run_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    wait_for(proc, lambda: metrics.is_file() and len(read_jsonl(metrics)) >= 2)
    proc.send_signal(signal.SIGUSR1)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "stop requested (signal SIGUSR1)" in out and re.search(f"rerun the same command to resume: (python|{re.escape(sys.executable)}) ", out)
    stopped = latest_step(run_dir)
    assert 2 <= stopped < 12 and rd.verify_checkpoint(run_dir, stopped) == ""
    assert not (run_dir / "model.pt").exists()


@pytest.mark.slow
def test_a_second_signal_after_the_grace_period_exits_at_once(tmp_path: Path) -> None:
    script = tmp_path / "signals.py"
    script.write_text(
        "import os, signal, time\n"
        "from regulargpt.train.stopping import StopRequest\n"
        "stop = StopRequest(grace_s=0.5)\n"
        "stop.install()\n"
        "os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.05)\n"
        "assert stop.requested and stop.signum == signal.SIGUSR1\n"
        "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.05)  # within the grace period: the same request\n"
        "os.kill(os.getpid(), signal.SIGINT); time.sleep(0.05)  # Ctrl-C too: no KeyboardInterrupt\n"
        "assert stop.reason == 'signal SIGUSR1'\n"
        "print('still running', flush=True)\n"
        "time.sleep(0.6)\n"
        "os.kill(os.getpid(), signal.SIGINT); time.sleep(5)  # a second Ctrl-C\n"
        "print('not reached', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=run_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()  # after the interpreter's start-up, which a loaded machine can stretch past 5 s
    start = time.perf_counter()
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert (first + rest).split() == ["still", "running"] and time.perf_counter() - start < 5  # not the 5 s sleep


# ------------------------------------------------------------------------------------------ formal languages


def test_formal_corrupt_checkpoint_resumes_from_the_previous_one(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tiny_cfg()  # 8 steps, a checkpoint every 3
    straight = tmp_path / "straight"
    train_formal(cfg, straight)
    run_dir = tmp_path / "run"
    with pytest.raises(Crash):  # dies in step 8: ckpt.pt is step 6, ckpt.prev.pt step 3
        train_formal(cfg, run_dir, task_factory=lambda c: CrashingTask(formal_task(c), crash_at=8))
    assert torch.load(run_dir / "ckpt.prev.pt", weights_only=True)["step"] == 3
    ckpt = run_dir / "ckpt.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:200])
    capsys.readouterr()
    train_formal(cfg, run_dir)
    err = capsys.readouterr().err
    assert "ckpt.pt is corrupt: unreadable" in err and "resuming from" in err and "ckpt.prev.pt (step 3)" in err
    assert (run_dir / "ckpt.pt.corrupt").is_file()
    assert formal_losses(run_dir) == formal_losses(straight)
    a = torch.load(straight / "model.pt", weights_only=True)["state_dict"]
    assert _same(a, torch.load(run_dir / "model.pt", weights_only=True)["state_dict"])


def test_a_formal_run_without_its_config_file_is_checked_against_the_checkpoints_copy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """config.resolved.json deleted after 3 steps: another lr is refused against the copy in ckpt.pt (before: it was
    accepted and recorded while the optimizer state came from the checkpoint); a truncated file is rewritten from
    the copy, with a note, and the run resumes to the end."""
    run_dir = tmp_path / "run"
    assert train_formal(tiny_cfg(), run_dir, stop_at=3) is None
    config = run_dir / "config.resolved.json"
    config.unlink()
    with pytest.raises(ConfigError, match=r"train.lr: run has 0.01, now 0.5"):
        train_formal(tiny_cfg(lr=0.5), run_dir)
    config.write_text('{"model": ')
    assert train_formal(tiny_cfg(), run_dir) == run_dir / "model.pt"
    assert f"note: {config} is unreadable; using the config saved in ckpt.pt" in capsys.readouterr().err
    assert rd.saved_config(run_dir, ConfigError, read=formal_config_from_saved) == tiny_cfg()


def test_formal_nan_step_is_skipped_and_the_limit_stops_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import regulargpt.train.formal_trainer as formal

    weights: list[dict[str, torch.Tensor]] = []

    def nan_at_third_forward(model_cfg: object) -> torch.nn.Module:
        model = build_model(model_cfg)
        model.register_forward_pre_hook(lambda m, args: weights.append(
            {k: v.detach().clone() for k, v in m.state_dict().items()}))
        model.register_forward_hook(lambda m, args, out: out * float("nan") if len(weights) == 3 else out)
        return model

    monkeypatch.setattr(formal, "build_model", nan_at_third_forward)
    train_formal(tiny_cfg(steps=5, max_bad_steps=1), tmp_path / "a")
    assert "warning: step 3: non-finite loss or gradient; step skipped" in capsys.readouterr().err
    assert _same(weights[2], weights[3]) and not _same(weights[1], weights[2])  # step 3 changed nothing
    assert all(torch.isfinite(v).all() for v in weights[-1].values())

    weights.clear()
    with pytest.raises(TrainError, match=r"step 3: 1 steps skipped .*max_bad_steps=0; stopped"):
        train_formal(tiny_cfg(steps=5, max_bad_steps=0, save_every=1), tmp_path / "b")
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["step"] == 2  # the last good checkpoint


def _formal_sweep_setup(root: Path) -> Path:
    configs = root / "configs"
    (configs / "models").mkdir(parents=True)
    (configs / "profiles").mkdir()
    (configs / "parity_check.json").write_text(json.dumps(tiny_raw(steps=150, save_every=25)))
    (configs / "models" / "c2.json").write_text(json.dumps({"model": {"chunk_size": 2}}))
    (configs / "profiles" / "k.json").write_text(json.dumps({
        "name": "k", "description": "kill test", "tasks": ["parity_check"], "models": ["c2"], "seeds": [0, 1],
        "lrs": {"*/*": [0.01]}, "eval_lengths": "1-60", "overrides": {"*/*": {"eval": {"max_length": 60,
                                                                                        "samples_per_length": 256}}}}))
    return configs


@pytest.mark.slow
def test_formal_sweep_survives_kill9_without_duplicate_or_lost_rows(tmp_path: Path) -> None:
    from regulargpt.experiments.formal_sweep import load_profile, plan_runs, run_sweep

    configs = _formal_sweep_setup(tmp_path)
    ref_specs = plan_runs(load_profile("k", configs), tmp_path / "ref", configs_dir=configs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same kernels as the single-threaded subprocess
    try:
        assert [r["error"] for r in run_sweep(ref_specs)] == ["", ""]
    finally:
        torch.set_num_threads(threads)

    out = tmp_path / "runs"
    cmd = [sys.executable, "eval/formal.py", "sweep", "--profile", "k", "--configs", str(configs), "--out", str(out)]
    first, second = (out / "parity_check" / "c2" / f"seed{s}_lr0.01" for s in (0, 1))
    kill_points = [lambda: len(read_jsonl(first / "range.jsonl")) >= 3,  # in the middle of run 0's evaluation
                   lambda: (second / "ckpt.pt").is_file()]  # in the middle of run 1's training
    for i, ready in enumerate(kill_points):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(proc, ready)
        proc.kill()
        assert proc.wait(timeout=60) == -signal.SIGKILL, "the sweep ended before its kill point"
        if i == 0:
            with open(first / "range.jsonl", "ab") as f:
                f.write(b'{"length": 59, "input_len')  # as if the kill had landed in the middle of an append
    done = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for spec in ref_specs:
        run = out / spec.run_dir.relative_to(tmp_path / "ref")
        lines = (run / "range.jsonl").read_text().splitlines()
        assert [json.loads(line)["length"] for line in lines] == list(range(1, 61))  # each length once, none lost
        assert [json.loads(line) for line in lines] == read_jsonl(spec.run_dir / "range.jsonl")
        assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == \
            list(range(1, 151))
        assert formal_losses(run) == formal_losses(spec.run_dir)


@pytest.mark.slow
def test_formal_sweep_workers_stop_when_the_sweep_process_is_killed(tmp_path: Path) -> None:
    """Killing only a `--workers 2` sweep's own process once left both workers training for 10 minutes (2026-12-02):
    each worker now asks Linux for SIGTERM when its parent dies."""
    import psutil

    configs = _formal_sweep_setup(tmp_path)
    out = tmp_path / "runs"
    cmd = [sys.executable, "eval/formal.py", "sweep", "--profile", "k", "--configs", str(configs), "--out", str(out),
           "--workers", "2", "--set", "train.steps=1000000"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = [out / "parity_check" / "c2" / f"seed{s}_lr0.01" for s in (0, 1)]
    workers: list[psutil.Process] = []
    try:
        wait_for(proc, lambda: all((run / "ckpt.pt").is_file() for run in runs))  # both workers are training
        assert proc.poll() is None, "the sweep ended before both runs were training"
        workers = [c for c in psutil.Process(proc.pid).children()
                   if any("spawn_main" in part for part in c.cmdline())]
        assert len(workers) == 2
        proc.kill()
        proc.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=60)
        running = [w.pid for w in alive if _running(w)]
        assert not running, f"workers still running after their sweep was killed: {running}"
    finally:
        kill_tree(proc)
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()


def _running(process: "psutil.Process") -> bool:
    import psutil

    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -------------------------------------------------------------------------------------- eval/extrapolate.py


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_extrapolate_survives_kill9_without_duplicate_or_lost_rows(tmp_path: Path) -> None:
    vocab = 61
    rng = np.random.default_rng(0)
    data = fake_data_folder(tmp_path / "data", {"train": rng.integers(0, vocab, 100), "val": rng.integers(0, vocab, 50),
                                                "test": rng.integers(0, vocab, 3000)}, vocab_size=vocab)
    cfg = load_config_dict({"model": {"architecture": "transformer", "position": "alibi", "vocab_size": vocab,
                                      "d_model": 16, "n_heads": 2, "n_layers": 2, "ffn_mult": 2},
                            "data": {"path": str(data), "seq_len": 16}})
    save_model_file(tmp_path / "run" / "model.pt", cfg, build_model(cfg.model), {"step": 0})
    out = tmp_path / "out"
    lengths = [8, 12, 16, 24, 32, 48, 64]
    cmd = [sys.executable, "eval/extrapolate.py", "--runs", str(tmp_path / "run"), "--data", str(data), "--lengths",
           ",".join(map(str, lengths)), "--protocol", "sliding", "--stride", "1", "--tokens", "1536",
           "--batch-size", "1", "--no-progress", "--device", "cpu", "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(proc, lambda: len(read_jsonl(out / "results.jsonl")) >= 1)
    proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL, "the sweep ended before its kill point"
    before = (out / "results.jsonl").read_bytes()
    done = subprocess.run(cmd, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["length"] for r in rows] == lengths and all(r["ppl"] > 0 for r in rows)
    assert (out / "results.jsonl").read_bytes().startswith(before[: before.rfind(b"\n") + 1])  # kept, not redone


# ------------------------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> dict[str, Path]:
    """Files for the bad-input cases: broken configs, damaged copies of the data folder, odd model files."""
    root = tmp_path_factory.mktemp("bad")
    (root / "malformed.json").write_text('{\n  "extends": "%s",\n  "model": {"d_model": 32,}\n}\n'
                                         % (ROOT / "configs/tiny/regular_gpt.json"))
    (root / "typo.json").write_text(json.dumps({"extends": str(ROOT / "configs/tiny/regular_gpt.json"),
                                                "model": {"chunk_sise": 4}}))
    (root / "formal.json").write_text(json.dumps(tiny_raw(steps=2)))
    wrong_type = tiny_raw(steps=2)
    wrong_type["train"]["lr"] = "fast"
    (root / "formal_wrong_type.json").write_text(json.dumps(wrong_type))
    (root / "profile.json").write_text('{"name": "p", "tasks": ["parity_check"]\n "models": []}')
    for name in ("truncated", "tokenizer"):
        shutil.copytree(data_dir, root / name)
    with open(root / "truncated" / "train.bin", "ab") as f:
        f.write(b"\x01")
    with open(root / "tokenizer" / "tokenizer.model", "ab") as f:
        f.write(b"\x00")
    fake_data_folder(root / "big_ids", {"train": np.full(400, 700), "val": np.zeros(100), "test": np.zeros(100)},
                     vocab_size=512)
    small = tiny_cfg()  # d_model 16; the file gets the weights of a d_model 32 model
    save_model_file(root / "mismatch" / "model.pt", small, build_model(dataclasses.replace(small.model, d_model=32)))
    save_model_file(root / "ok" / "model.pt", small, build_model(small.model))
    learned = tiny_raw()
    learned["model"].update(architecture="transformer", position="learned", max_positions=16, n_layers=1)
    learned_cfg = load_config_dict(learned, kind=FormalConfig)
    save_model_file(root / "learned" / "model.pt", learned_cfg, build_model(learned_cfg.model))
    lm_cfg = load_config_dict({"model": {"vocab_size": 16, "d_model": 16, "n_heads": 2}, "data": {"seq_len": 8}})
    save_model_file(root / "lm" / "model.pt", lm_cfg, build_model(lm_cfg.model))
    (root / "unexported" / "global_step3").mkdir(parents=True)  # trained, model.pt not written yet
    (root / "unexported" / "latest").write_text("global_step3")
    (root / "corpus").mkdir()
    for i in range(4):
        (root / "corpus" / f"{i}.txt").write_text(f"short document number {i}\n" * 3)
    return {"root": root, "data": data_dir}


def _pretrain(config: str, *sets: str, run_dir: str = "{root}/run") -> list[str]:
    args = [sys.executable, "launch/pretrain.py", "--config", config, "--run-dir", run_dir]
    for item in ("logging.progress=false", *sets):
        args += ["--set", item]
    return args


def _submit(data: str, *sets: str) -> list[str]:
    """launch/submit.py (a real submit, not a dry run) of one tiny run; its output would go under {root}/run."""
    args = [sys.executable, "launch/submit.py", "--configs", "configs/tiny/regular_gpt.json", "--data", data,
            "--runs-root", "{root}/run", "--eval-out", "{root}/run"]
    for item in sets:
        args += ["--set", item]
    return args


# name -> (command, every substring the one error line must contain, paths under {root} that must not change).
# None of them may create {root}/run; the token-id case trains into {root}/run-ids (the error comes with a batch).
BAD_INPUT = {
    "malformed-json": (_pretrain("{root}/malformed.json"), ["malformed.json", "malformed JSON at line 3, column 27"],
                       ["malformed.json"]),
    "misspelled-key": (_pretrain("{root}/typo.json"), ["typo.json", "model.chunk_sise: unknown key",
                                                       "did you mean 'chunk_size'"], ["typo.json"]),
    "wrong-type-set": (_pretrain("configs/tiny/regular_gpt.json", "train.lr=fast"),
                       ["--set train.lr=fast", "cannot convert 'fast' to a number"], []),
    "wrong-type-file": ([sys.executable, "launch/train_formal.py", "--config", "{root}/formal_wrong_type.json",
                         "--run-dir", "{root}/run"], ["formal_wrong_type.json", "train.lr: 'fast' has the wrong type",
                                                      "expected a number"], ["formal_wrong_type.json"]),
    "impossible-value": (_pretrain("configs/tiny/regular_gpt.json", "model.chunk_size=1"),
                         ["model.chunk_size: 1 is not allowed", "an integer >= 2"], []),
    "eval-length-below-1": (_pretrain("configs/tiny/regular_gpt.json", "eval.lengths=0,64"),
                            ["eval.lengths: [0, 64] is not allowed", "integers >= 1"], []),
    "missing-data-folder": (_pretrain("configs/tiny/regular_gpt.json", "data.path={root}/nowhere"),
                            ["nowhere does not exist", "data_prep/prepare.py", "--vocab-size 2048"], []),
    "lr-nan": (_pretrain("configs/tiny/regular_gpt.json", "train.lr=nan"),
               ["train.lr: nan is not allowed", "a finite number"], []),
    "lr-infinity": (_pretrain("configs/tiny/regular_gpt.json", "train.lr=Infinity"),
                    ["train.lr: inf is not allowed", "a finite number"], []),
    "lr-negative": (_pretrain("configs/tiny/regular_gpt.json", "train.lr=-0.001"),
                    ["train.lr: -0.001 is not allowed", "a number > 0"], []),
    "eps-not-positive": (_pretrain("configs/tiny/regular_gpt.json", "train.eps=0"),
                         ["train.eps: 0.0 is not allowed", "a number > 0"], []),
    "beta-outside-0-1": (_pretrain("configs/tiny/regular_gpt.json", "train.beta2=1"),
                         ["train.beta2: 1.0 is not allowed", "[0, 1)"], []),
    "deepspeed-shadows-zero-stage": (_pretrain("configs/tiny/regular_gpt.json", "deepspeed.zero_optimization.stage=7"),
                                     ["deepspeed.zero_optimization.stage: 7 contradicts train.zero_stage=0",
                                      "set train.zero_stage instead"], []),
    "deepspeed-train-batch-size": (_pretrain("configs/tiny/regular_gpt.json", "deepspeed.train_batch_size=3"),
                                   ["deepspeed.train_batch_size: 3 is not allowed", "derived"], []),
    "deepspeed-rejects-value": (_pretrain("configs/tiny/regular_gpt.json", "data.path={data}", "model.vocab_size=512",
                                          "deepspeed.zero_optimization.overlap_comm=maybe"),
                                ["deepspeed.zero_optimization.overlap_comm: 'maybe' is not accepted by DeepSpeed",
                                 "valid boolean"], []),
    "negative-threads": ([sys.executable, "launch/train_formal.py", "--config", "{root}/formal.json", "--threads", "-1",
                          "--run-dir", "{root}/run"], ["argument --threads: '-1'", "expected an integer >= 0"],
                         ["formal.json"]),
    "vocab-too-large-for-corpus": ([sys.executable, "data_prep/prepare.py", "--source", "{root}/corpus", "--out",
                                    "{root}/run/data", "--vocab-size", "4000", "--num-proc", "1"],
                                   ["--vocab-size 4000", "Vocabulary size too high"], ["corpus"]),
    "range-on-a-language-model": ([sys.executable, "eval/formal.py", "range", "--run", "{root}/lm", "--out",
                                   "{root}/out.jsonl"], ["--run", "/lm: its model.pt is a language model",
                                                         "not a formal-language classifier", "eval/extrapolate.py"],
                                  ["lm"]),
    "submit-misspelled-key": (_submit("{data}", "train.stpes=10"), ["run stdlib-regular_gpt-seed0", "train.stpes: "
                                                                    "unknown key; did you mean 'steps'"], []),
    "submit-missing-data": (_submit("{root}/nowhere"), ["run nowhere-regular_gpt-seed0", "nowhere does not exist"], []),
    "submit-vocab-mismatch": (_submit("{data}", "model.vocab_size=1024"),
                              ["run stdlib-regular_gpt-seed0", "model.vocab_size=1024 does not match"], []),
    "checkpoints-but-no-model-pt": ([sys.executable, "eval/extrapolate.py", "--runs", "{root}/unexported", "--data",
                                     "{data}", "--out", "{root}/run"], ["unexported has no model.pt but has checkpoints",
                                                                        "python launch/export.py"], ["unexported"]),
    "bin-not-a-multiple-of-dtype": (_pretrain("configs/tiny/regular_gpt.json", "data.path={root}/truncated",
                                              "model.vocab_size=512"),
                                    ["truncated/train.bin", "not a multiple of 2 (uint16)"], ["truncated"]),
    "manifest-vs-tokenizer": (_pretrain("configs/tiny/regular_gpt.json", "data.path={root}/tokenizer",
                                        "model.vocab_size=512"),
                              ["tokenizer/tokenizer.model", "the manifest and the tokenizer disagree"], ["tokenizer"]),
    "manifest-vs-model-vocab": (_pretrain("configs/tiny/regular_gpt.json", "data.path={data}"),
                                ["model.vocab_size=2048 does not match", "vocab_size=512"], []),
    "token-id-beyond-vocab": (_pretrain("configs/tiny/regular_gpt.json", "data.path={root}/big_ids",
                                        "model.vocab_size=512", "data.seq_len=16", "train.batch_size=2",
                                        "model.d_model=32", "model.n_heads=2", run_dir="{root}/run-ids"),
                              ["big_ids/train.bin", "token id 700 at position", ">= vocab_size 512"], ["big_ids"]),
    "checkpoint-of-another-config": ([sys.executable, "eval/formal.py", "range", "--run", "{root}/mismatch", "--out",
                                      "{root}/out.jsonl"], ["mismatch/model.pt", "weights do not match",
                                                            "different model config"], ["mismatch"]),
    "eval-length-spec-below-1": ([sys.executable, "eval/formal.py", "range", "--run", "{root}/ok", "--lengths", "0-5",
                                  "--out", "{root}/out.jsonl"], ["length spec '0-5'", "need 1 <= A <= B"], ["ok"]),
    "beyond-learned-positions": ([sys.executable, "eval/formal.py", "range", "--run", "{root}/learned",
                                  "--max-length", "40", "--out", "{root}/out.jsonl"],
                                 ["evaluation length 40 exceeds model.max_positions=16"], ["learned"]),
    "unknown-task": ([sys.executable, "launch/train_formal.py", "--config", "{root}/formal.json", "--set",
                      "data.task=parity_chek", "--run-dir", "{root}/run"],
                     ["Unknown task 'parity_chek'", "Did you mean 'parity_check'?"], ["formal.json"]),
    "unknown-task-in-sweep": ([sys.executable, "eval/formal.py", "sweep", "--profile", "quick", "--tasks",
                               "parity_chek", "--out", "{root}/run"],
                              ["unknown task config 'parity_chek'", "parity_check"], []),
    "malformed-profile": ([sys.executable, "eval/formal.py", "sweep", "--profile", "{root}/profile.json", "--out",
                           "{root}/run"], ["profile.json", "malformed JSON at line 2, column 2"], ["profile.json"]),
    "unknown-data-source": ([sys.executable, "data_prep/prepare.py", "--source", "{root}/no/such.txt", "--out",
                             "{root}/run"], ["no/such.txt", "no such file, folder or glob match"], []),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_is_one_line_exit_2_and_changes_nothing(case: str, bad_inputs: dict[str, Path]) -> None:
    command, expected, keep = BAD_INPUT[case]
    root = bad_inputs["root"]
    argv = [a.format(root=root, data=bad_inputs["data"]) for a in command]
    before = snapshot(*(root / p for p in keep), bad_inputs["data"])
    proc = subprocess.run(argv, cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = _error_lines(proc.stderr)
    # ours: "error: ..."; a flag's type check (argparse, when parsed): "prog: error: argument --flag: ..."
    assert re.match(r"(\S+: )?error: ", line) and all(text in line for text in expected), line
    assert snapshot(*(root / p for p in keep), bad_inputs["data"]) == before
    assert not (root / "run").exists() and not (root / "out.jsonl").exists()


# ------------------------------------------------------------------------- full disk, memory, quoting (issue 37 §6)


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 1 MB tmpfs (when this process may mount one: root), else None: the tests then inject the OSError a full
    disk raises."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                                                   capture_output=True).returncode == 0
    yield mount if mounted else None
    if mounted:
        subprocess.run(["umount", str(mount)], check=True)


def _fill(folder: Path) -> None:
    """Write zeros into `folder` until its file system is full."""
    with contextlib.suppress(OSError), open(folder / "filler", "wb") as handle:
        for _ in range(64):
            handle.write(bytes(1 << 16))
            handle.flush()


_FULL = r"^no space left on \S+ \(mounted at /\S*\) while writing "


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_save_is_one_line(data_dir: Path, tmp_path: Path, small_disk: Path | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny run's checkpoints (0.8 MB each) on a 1 MB tmpfs: the second one fills it. Before: `RuntimeError: …
    unexpected pos …` from torch.save's zip writer, with its traceback. Without a tmpfs, DeepSpeed's save is made
    to raise that RuntimeError in-process."""
    if small_disk is not None:
        run_dir = small_disk / "run"
        proc = subprocess.run(pretrain_cmd(1) + pretrain_args(data_dir, run_dir), cwd=ROOT, env=run_env(),
                              capture_output=True, text=True, timeout=240)
        line = _error_lines(proc.stderr)[-1]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert re.match(_FULL.replace("^", "^error: ") + rf"the checkpoint {run_dir}/global_step6: 0\.\d MB needed",
                        line), line
        assert latest_step(run_dir) == 3 and rd.verify_checkpoint(run_dir, 3) == ""  # the last one is intact
        return
    from regulargpt.write_errors import DiskFullError
    from regulargpt.train.lm_checkpoint import Checkpoints

    class Engine:
        def save_checkpoint(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 832 vs 768")

    class Sampler:
        def settings(self) -> dict:
            return {}

    cfg = load_config_dict({"data": {"path": str(data_dir)}})
    ckpt = Checkpoints(cfg, tmp_path, Engine(), None, Sampler(), [], {}, 0, 1, None)
    with pytest.raises(DiskFullError, match=_FULL + rf"the checkpoint {tmp_path}/global_step3"):
        ckpt.save(3, 0, 0)


def test_a_full_disk_while_exporting_or_appending_a_result_row_is_one_line(tmp_path: Path, small_disk: Path | None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """model.pt (4 MB of weights) and a results.jsonl row on a full 1 MB tmpfs, or with the OSError injected:
    DiskFullError naming the file and the bytes needed; the row is not counted as written."""
    import errno

    from regulargpt.evaluation import results_file
    from regulargpt.write_errors import DiskFullError
    from regulargpt import checkpoint

    cfg = load_config_dict({"model": {"vocab_size": 8000, "d_model": 64, "n_heads": 2}})
    model = build_model(cfg.model)
    folder = small_disk or tmp_path
    if small_disk is None:
        def full(*args: object, **kwargs: object) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(checkpoint, "atomic_write_bytes", full)
        monkeypatch.setattr(results_file.os, "fsync", full)
    with pytest.raises(DiskFullError, match=_FULL + rf"the model file {folder}/model\.pt: 4\.\d MB needed"):
        save_model_file(folder / "model.pt", cfg, model)
    assert not (folder / "model.pt").exists()
    if small_disk is not None:
        _fill(small_disk)
    results = results_file.ResultsFile(folder / "results.jsonl")
    with pytest.raises(DiskFullError, match=_FULL + rf"a result row to {folder}/results\.jsonl: 0\.0 MB needed"):
        results.append({"run": "r", "ppl": 1.0, "pad": "x" * 10_000})
    assert results.rows == []


def test_a_step_that_cannot_fit_in_memory_is_refused_before_anything_is_written(data_dir: Path,
                                                                                tmp_path: Path) -> None:
    """A micro-batch of 10^6 windows of 32 tokens: the planner's estimate (hundreds of GB of activations) against
    the memory available; and a run directory whose only config was written by a run that never trained (no
    checkpoint, no metrics row) takes the corrected config."""
    import psutil

    from regulargpt.config import load_config
    from regulargpt.train.memory_check import check_memory

    base = [f"data.path={data_dir}", *TINY]
    cfg = load_config(ROOT / "configs/tiny/regular_gpt.json", [*base, "train.batch_size=1000000"])
    with pytest.raises(TrainError) as info:
        check_memory(cfg, 1, 1, torch.device("cpu"))
    need = float(re.search(r"needs about ([0-9.]+) GB", str(info.value)).group(1))
    assert need * 1e9 > psutil.virtual_memory().available and "lower data.seq_len or train.batch_size" in str(
        info.value) and "activation_checkpointing=true" in str(info.value)
    check_memory(load_config(ROOT / "configs/tiny/regular_gpt.json", base), 1, 1, torch.device("cpu"))  # fits

    run_dir = tmp_path / "run"
    rd.check_or_write_config(run_dir, cfg)  # as the trainer did before the out-of-memory crash of its first step
    (run_dir / "metrics.jsonl").touch()
    corrected = load_config(ROOT / "configs/tiny/regular_gpt.json", base)
    assert rd.check_or_write_config(run_dir, corrected) is None  # before: "trained with a different config"
    assert rd.saved_config(run_dir, TrainError) == corrected


def test_next_commands_quote_paths_with_spaces(tmp_path: Path) -> None:
    from regulargpt.commands.pretrain import summary_lines
    from regulargpt.config import load_config

    run_dir = tmp_path / "my runs" / "a b"
    cfg = load_config(ROOT / "configs/tiny/regular_gpt.json", ["data.path=data/my data"])
    summary = {"start_step": 0, "step": 3, "seconds": 1.0, "tokens_per_step": 10, "preempted": False}
    lines = summary_lines(summary, cfg, run_dir)
    export, evaluate = lines[2].removeprefix("next: "), lines[3].strip()
    assert export == f"python launch/export.py '{run_dir}'"
    assert evaluate.split()[:5] == ["python", "eval/extrapolate.py", "--runs", f"'{tmp_path}/my", "runs/a"]
    import shlex

    assert shlex.split(evaluate)[3] == str(run_dir) and shlex.split(evaluate)[5] == "data/my data"
