"""Operations (issue 14): the shared peak meter, extending a finished run, submitting sweeps, and stopping a run under
every launcher (plain python, torchrun, the deepspeed runner, Ctrl-C to the process group).

The bad inputs of the same issue (submit.py's validation included) are cases of tests/test_faults.py::
test_bad_input_is_one_line_exit_2_and_changes_nothing; the LR formula is tests/test_pretrain.py::
test_lr_schedule_and_deepspeed_config.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import torch
from helpers import (
    ROOT,
    TINY,
    ZERO3,
    free_port,
    kill_tree,
    latest_step,
    pretrain,
    pretrain_args,
    pretrain_cmd,
    read_losses,
    read_metrics,
    run_env,
    wait_for,
)

from regulargpt import peak
from regulargpt import run_directory as rd

# ------------------------------------------------------------------------------------------------ peak meter


def test_peak_is_measured_once_per_machine_then_cached_and_only_raised(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("REGULARGPT_PEAK_CACHE", str(cache))
    monkeypatch.delenv(peak.PEAK_ENV, raising=False)
    flops, how = peak.cached_peak("cpu", "fp32", threads=1, seconds=0.05)
    assert flops > 0 and how.startswith("measured over 0.05 s")
    key = peak.machine_key("cpu", "fp32", 1)
    assert "| cpu | fp32 | 1 threads" in key and json.loads(cache.read_text())[key]["flops"] == flops
    monkeypatch.setattr(peak, "_measure", lambda *a: pytest.fail("measured again instead of using the cache"))
    assert peak.cached_peak("cpu", "fp32", threads=1) == (flops, f"cached in {cache}")
    peak.raise_peak(key, flops / 2, "slower")  # never lowered
    peak.raise_peak(key, flops * 2, "faster")
    assert peak.cached_peak("cpu", "fp32", threads=1)[0] == flops * 2
    monkeypatch.setenv(peak.PEAK_ENV, "5e9")
    assert peak.cached_peak("cpu", "fp32", threads=1) == (5e9, peak.PEAK_ENV)


def test_the_peak_measurement_is_bounded_in_time_on_a_slow_matmul() -> None:
    """issue 39 §7: bf16 on an AVX2-only CPU ran a few GFLOP/s, and the first 2048² triple alone took minutes. A fake
    matmul at 1 GFLOP/s (a 2048² triple: 3·2·2048³/1e9 = 52 s) is measured within the budget, at the size whose
    triple fits a quarter of it (1 s: 3·2·n³/1e9 ≤ 0.25 → n = 256; 512 would take 0.8 s), at the fake's rate."""
    rate = 1e9

    def slow(a: torch.Tensor, b: torch.Tensor) -> None:
        time.sleep(2 * a.shape[0] ** 3 / rate)

    start = time.perf_counter()
    flops, n = peak._measure("cpu", "bf16", 1, 1.0, slow)
    elapsed = time.perf_counter() - start
    assert n == 256 and elapsed < 1.6, (n, elapsed)
    assert 0.7 * rate < flops <= rate  # sleep overshoots a little, never undershoots
    fast_n = peak._measure("cpu", "fp32", 1, 1.0, lambda a, b: None)[1]
    assert fast_n == 2048  # a fast product is still measured at the full size


def test_the_peak_is_measured_past_launch_overhead_at_the_full_size() -> None:
    """First contact with an H200: predicting every size from one cold 256² product (library start-up included)
    stopped at 256², where launch overhead dominates, and cached 2.8 TFLOP/s. A fake GPU: 50 ms start-up on the first
    product, 1 ms per launch, then 2n³ FLOP at 2e11 FLOP/s. At 2048² a product takes 1 + 85.9 ms: the rate measured
    there is ≥ 0.95 · 2e11 (at 256²: 3.4e7 FLOP in 1.17 ms, 0.14 of it)."""
    rate, calls = 2e11, []

    def launch_bound(a: torch.Tensor, b: torch.Tensor) -> None:
        time.sleep((0.05 if not calls else 0.0) + 1e-3 + 2 * a.shape[0] ** 3 / rate)
        calls.append(a.shape[0])

    flops, n = peak._measure("cpu", "bf16", 1, 2.0, launch_bound)
    assert n == 2048, (n, calls)
    assert 0.9 * rate < flops <= rate


def test_a_peak_cached_by_an_older_measurement_is_measured_again(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache of version 1 holds H200 peaks of 2.8 TFLOP/s: entries without this version's mark are ignored,
    measured again, and overwritten (also by raise_peak, whatever their value)."""
    cache = tmp_path / "peak.json"
    monkeypatch.setenv("REGULARGPT_PEAK_CACHE", str(cache))
    monkeypatch.delenv(peak.PEAK_ENV, raising=False)
    key = peak.machine_key("cpu", "fp32", 1)
    cache.write_text(json.dumps({key: {"flops": 1e20, "how": "old", "date": "2026-11-30 00:00:00"}}))
    monkeypatch.setattr(peak, "_measure", lambda *a: (3e9, 512))
    assert peak.cached_peak("cpu", "fp32", threads=1) == (3e9, f"measured over 3 s, cached in {cache}")
    assert json.loads(cache.read_text())[key]["flops"] == 3e9
    cache.write_text(json.dumps({key: {"flops": 1e20, "how": "old"}}))
    peak.raise_peak(key, 4e9, "a run")
    assert json.loads(cache.read_text())[key]["flops"] == 4e9


# ---------------------------------------------------------------------------------------------- submitting sweeps


def _submit_module():
    spec = importlib.util.spec_from_file_location("submit", ROOT / "launch" / "submit.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["submit"] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _sweep(data_dir: Path, root: Path, *extra: str) -> list[str]:
    return ["--configs", str(ROOT / "configs/tiny/regular_gpt.json"), str(ROOT / "configs/tiny/alibi.json"),
            "--seeds", "0", "1", "--data", str(data_dir), "--set", "model.vocab_size=512",
            "--runs-root", str(root / "runs"), "--eval-out", str(root / "eval"), *extra]


def test_submit_dry_run_prints_a_summary_and_writes_every_script(data_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    submit = _submit_module()
    finished = tmp_path / "runs" / data_dir.name / "alibi-seed1"
    finished.mkdir(parents=True)
    (finished / "model.pt").write_bytes(b"")  # a finished run: not queued again, still evaluated and compared
    assert submit.main(_sweep(data_dir, tmp_path, "--nodes", "2", "--gpus-per-node", "8", "--dry-run")) == 0
    out, err = capsys.readouterr()
    assert out.count("#!/bin/bash") == 1 and len(out.splitlines()) < 110  # one example script, not eight
    assert "# 4 run(s): 2 config(s) x 2 seed(s) x 1 dataset(s); 1 already finished" in out
    assert "# pretraining: 3 job(s) x 2 node(s) x 8 GPU(s)" in out and "set -- --config" in out
    assert "--dependency=afterok:<pretrain id>" in out and "nothing submitted (--dry-run)" in out
    assert "warning: no --cpus-per-task (SLURM: 1 CPU) for --gpus-per-node 8 gives each rank 0.12 CPUs" in err
    dry = tmp_path / "eval" / "sweep" / "dry-run"
    commands = (dry / "sbatch.txt").read_text().splitlines()
    assert len(commands) == 3 + 4 + 1 and len(list(dry.rglob("*.sbatch"))) == 8
    assert not any("pt-stdlib-alibi-seed1" in c for c in commands)
    assert commands[-1].startswith("sbatch --parsable '--dependency=afterok:<job 2>:<job 4>:<job 6>:<job 7>'")
    assert "eval/compare.py" in (dry / "compare.sbatch").read_text()
    assert not (tmp_path / "runs" / data_dir.name / "alibi-seed0").exists()  # a dry run writes only under dry-run/

    assert submit.main(_sweep(data_dir, tmp_path / "b", "--no-eval", "--gpus-per-node", "4", "--cpus-per-task", "32",
                              "--dry-run")) == 0
    out, err = capsys.readouterr()
    assert "evaluation: none (--no-eval)" in out and "comparison" not in out and "warning" not in err
    assert not list((tmp_path / "b").rglob("evaluate.sbatch")) and not list((tmp_path / "b").rglob("compare.sbatch"))


def test_submit_queues_evaluations_after_training_and_a_comparison_after_all(
        data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A fake `sbatch` on PATH records each call and answers ids 101, 102, …"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sbatch.log"
    (bin_dir / "sbatch").write_text('#!/bin/sh\nn=$(( $(wc -l < "%s" 2>/dev/null || echo 0) + 101 ))\n'
                                    'echo "$n $*" >> "%s"\ncat > /dev/null\necho "$n"\n' % (log, log))
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    assert _submit_module().main(_sweep(data_dir, tmp_path, "--seeds", "0")) == 0  # 2 runs
    calls = log.read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["101", "102", "103", "104", "105"]
    assert "--dependency=afterok:101 " in calls[1] and "--dependency=afterok:103 " in calls[3]
    assert "--dependency=afterok:102:104 " in calls[4] and "--job-name=cmp-sweep" in calls[4]
    jobs = json.loads((tmp_path / "eval" / "sweep" / "jobs.json").read_text())
    assert jobs["comparison"] == {"compare": "105"} and jobs[f"{data_dir.name}-alibi-seed0"]["evaluate"] == "104"
    run_dir = tmp_path / "runs" / data_dir.name / "regular_gpt-seed0"
    assert "set -- --config" in (run_dir / "slurm" / "pretrain.sbatch").read_text()
    assert "comparison: 105 after 2 evaluation(s)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ extending a finished run

COSINE = ["train.steps=8", "train.schedule=cosine", "train.warmup_fraction=0.25", "train.min_lr_ratio=0.1",
          "train.save_every=4", "train.eval_every=4", "train.keep_last=3"]


def test_resuming_reads_the_runs_data_path_unless_one_is_set(tmp_path: Path) -> None:
    from regulargpt.config import load_config, save_config

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trained = load_config(ROOT / "configs/tiny/regular_gpt.json", ["data.path=data/stdlib-2k"])
    save_config(trained, run_dir / "config.resolved.json")
    again = load_config(ROOT / "configs/tiny/regular_gpt.json")  # configs/base.json's data/python-stdlib
    cfg, note = rd.with_saved_data_path(run_dir, again, [])
    assert cfg.data.path == "data/stdlib-2k" and note is not None and "data.path=data/stdlib-2k" in note
    assert cfg == trained
    moved = load_config(ROOT / "configs/tiny/regular_gpt.json", ["data.path=/scratch/stdlib-2k"])
    assert rd.with_saved_data_path(run_dir, moved, ["data.path=/scratch/stdlib-2k"]) == (moved, None)
    assert rd.with_saved_data_path(tmp_path / "fresh", again, []) == (again, None)


@pytest.mark.slow
def test_extend_a_finished_run_replans_the_lr_and_continues_data_and_metrics(data_dir: Path, tmp_path: Path) -> None:
    """8 steps (warmup 2, cosine to 0.1·lr at the last step), then --extend-to 16: the LR goes from the minimum back
    to the peak over round(0.25 · 8) = 2 steps and down to the minimum again at step 16; data and metrics continue."""
    from regulargpt.config import load_config
    from regulargpt.train import TrainError, lr_factor

    run_dir = tmp_path / "run"
    pretrain(data_dir, run_dir, *COSINE)
    first = read_metrics(run_dir)
    lr = 0.003  # TINY's
    assert first[-1]["step"] == 8 and first[-1]["lr"] == pytest.approx(0.1 * lr, rel=1e-12)  # min_lr at the last step

    base = load_config(ROOT / "configs/tiny/regular_gpt.json", [f"data.path={data_dir}", *TINY, *COSINE])
    more = dataclasses.replace(base, train=dataclasses.replace(base.train, steps=16))
    with pytest.raises(TrainError, match=r"train.steps: run has 8, now 16.*pass --extend-to N \(it has 8\)"):
        rd.check_or_write_config(run_dir, more, write=False)  # raising train.steps alone is still refused
    sets = [arg for item in [*TINY, *COSINE] for arg in ("--set", item)]  # no data.path: the run's is used
    cmd = pretrain_cmd(1) + ["--config", str(ROOT / "configs/tiny/regular_gpt.json"), "--run-dir", str(run_dir), *sets]
    extended = subprocess.run(cmd + ["--extend-to", "16"], cwd=ROOT, env=run_env(), capture_output=True, text=True,
                              timeout=240)
    assert extended.returncode == 0, extended.stderr[-3000:]
    assert f"data.path={data_dir} (the run's, from its config.resolved.json" in extended.stderr
    assert "extending the finished run from step 8 to 16 (LR from 0.0003 back to 0.003 over 2 step(s), then " \
           "cosine to 0.0003 at step 16)" in extended.stderr

    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 17)) and rows[:8] == first  # no gap, history kept
    cfg = dataclasses.replace(base, train=dataclasses.replace(base.train, steps=16, extended_from=[8]))
    assert [r["lr"] for r in rows] == [lr * lr_factor(s, cfg) for s in range(16)]
    assert rows[8]["lr"] == pytest.approx(lr * 0.55) and rows[9]["lr"] == lr
    assert rows[15]["lr"] == pytest.approx(0.1 * lr)
    state = rd.read_trainer_state(run_dir, 16)
    assert state["sampler"]["consumed_steps"] == 16 and state["step"] == 16  # the data continued at step 9
    with rd.safe_loading():
        saved = torch.load(run_dir / "global_step16" / "mp_rank_00_model_states.pt", weights_only=True)
    assert saved["lr_scheduler"]["_last_lr"][0] == pytest.approx(lr * lr_factor(16, cfg))  # the new schedule's
    assert torch.load(run_dir / "model.pt", weights_only=True)["meta"]["step"] == 16
    assert torch.load(run_dir / "model_step8.pt", weights_only=True)["meta"]["step"] == 8  # the first export, kept

    assert rd.extension_config(run_dir, base, 16) == cfg  # rerunning the command: the same (finished) extension
    with pytest.raises(TrainError, match=r"--extend-to 12: the run in .* already has train.steps=16"):
        rd.extension_config(run_dir, base, 12)
    (run_dir / "latest").write_text("global_step12")  # as if the extension had stopped at step 12
    with pytest.raises(TrainError, match=r"--extend-to 20: the run in .* is at step 12 of 16; let it finish first"):
        rd.extension_config(run_dir, base, 20)


# ------------------------------------------------------------------------------------------- stopping a run


def _stop(cmd: list[str], run_dir: Path, after: int, send: Callable[[subprocess.Popen], None]) -> str:
    """Start `cmd` in a session of its own, wait for a checkpoint newer than `after`, `send` the stop, and return
    the output once every process it started has ended (none may be left behind)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    wait_for(proc, lambda: latest_step(run_dir) > after)
    assert proc.poll() is None, "the run ended before it was stopped"
    family = psutil.Process(proc.pid).children(recursive=True)  # launcher(s) and both ranks
    send(proc)
    out, _ = proc.communicate(timeout=120)  # returns when every writer of the pipe (each rank) has exited
    _, alive = psutil.wait_procs(family, timeout=60)
    assert not alive, out[-3000:]
    return out


def test_only_a_launcher_is_watched_and_a_rank_orphaned_during_start_up_is_told(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from regulargpt.train.stopping import launch_command, launcher_chain, orphaned

    assert launcher_chain() == []  # pytest's parent is no launcher: nothing to watch
    monkeypatch.setattr(sys, "argv", ["launch/pretrain.py", "--config", "a b.json", "--local_rank=0"])
    (tmp_path / "python").symlink_to(sys.executable)  # `python` on PATH is this interpreter: printed as "python"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert launch_command([]) == "python launch/pretrain.py --config 'a b.json'"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # another (or no) python on PATH: this one's full path
    assert launch_command([]) == f"{sys.executable} launch/pretrain.py --config 'a b.json'"
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("CROSS_RANK", raising=False)
    assert not orphaned(os.getppid() + 1)  # plain python: the parent (a shell) may come and go
    monkeypatch.setenv("CROSS_RANK", "0")  # started by DeepSpeed's launch
    assert orphaned(os.getppid() + 1) and not orphaned(os.getppid()) and not orphaned(None)


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_zero3_stopped_under_each_launcher_and_by_ctrl_c_resumes_exactly(zero3_run: Path, data_dir: Path,
                                                                        tmp_path: Path) -> None:
    """Two ranks, ZeRO-3, stopped three times: SIGTERM to torchrun (it forwards it); SIGTERM to the `deepspeed`
    runner's pid alone (DeepSpeed leaves its launch process and the ranks running: the ranks notice their launcher
    is gone); Ctrl-C, i.e. SIGINT to the runner's whole process group. Each time: a checkpoint, exit, nothing left
    running. Resumed once more under torchrun, the run ends with the uninterrupted run's losses and weights
    (train.save_every=2 instead of 3 only adds checkpoints)."""
    run_dir = tmp_path / "run"
    args = pretrain_args(data_dir, run_dir, *ZERO3, "train.save_every=2", "train.keep_last=3")
    def stopped() -> int:
        step = latest_step(run_dir)
        assert rd.verify_checkpoint(run_dir, step) == "" and not (run_dir / "model.pt").exists()
        return step

    out = _stop(pretrain_cmd(2) + args, run_dir, 0, lambda p: p.send_signal(signal.SIGTERM))
    stops = [stopped()]
    assert "stop requested (signal SIGTERM)" in out and "resume: torchrun --standalone --nproc_per_node 2" in out

    out = _stop(pretrain_cmd(2, "deepspeed") + args, run_dir, stops[-1], lambda p: p.send_signal(signal.SIGTERM))
    stops.append(stopped())
    assert re.search(r"stop requested \((another rank's )?launcher (deepspeed \(pid \d+\) )?is gone\)", out), out[-3000:]
    assert "rerun the same command to resume: deepspeed --num_gpus 2 --master_port" in out

    out = _stop(pretrain_cmd(2, "deepspeed") + args, run_dir, stops[-1], lambda p: os.killpg(p.pid, signal.SIGINT))
    stops.append(stopped())
    assert f"resuming at step {stops[1]}" in out and "stop requested (signal SIGINT)" in out, out[-3000:]
    assert 'pretrain.py", line' not in out  # no rank printed a KeyboardInterrupt traceback (the runner does)

    assert 0 < stops[0] < stops[1] < stops[2] < 12, stops
    final = pretrain(data_dir, run_dir, *ZERO3, nproc=2)
    assert f"resuming at step {stops[2]}" in final.stderr
    assert read_losses(run_dir) == read_losses(zero3_run)
    assert read_metrics(run_dir)[-1]["val_loss"] == read_metrics(zero3_run)[-1]["val_loss"]
    a = torch.load(zero3_run / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------- two nodes, rehearsed


def _two_nodes(args: list[str], port: int,
               started: list[subprocess.Popen]) -> tuple[subprocess.Popen, subprocess.Popen, Path]:
    """Two torchrun agents on this machine as the two nodes of a job, one rank each, c10d rendezvous on 127.0.0.1:
    what launch/slurm/pretrain.sbatch starts with `srun` on each node. Node 0 starts first and hosts the rendezvous
    store, as the first node of an allocation does. Output goes to files next to the run directory; both agents are
    appended to `started` (killed with their ranks when the test ends, whatever happens)."""
    run_dir = Path(args[args.index("--run-dir") + 1])
    agents = []
    for node in (0, 1):
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
               "--rdzv-id", "rehearsal", str(ROOT / "launch" / "pretrain.py"), *args]
        log = open(run_dir.parent / f"node{node}-{len(list(run_dir.parent.glob(f'node{node}-*')))}.log", "w")
        agents.append(subprocess.Popen(cmd, cwd=ROOT, env=run_env(), stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True))
        started.append(agents[-1])
        if node == 0:
            wait_for(agents[0], lambda: _listening(port), timeout=60)
    return agents[0], agents[1], max(run_dir.parent.glob("node0-*.log"), key=lambda p: p.stat().st_mtime)


def _listening(port: int) -> bool:
    return any(c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
               for c in psutil.net_connections("tcp"))


def _family(proc: subprocess.Popen) -> list[psutil.Process]:
    return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]


@pytest.fixture
def agents() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        kill_tree(proc)


@pytest.mark.slow
@pytest.mark.long  # `make test-all` only (pytest.ini)
def test_two_nodes_survive_a_killed_agent_and_a_hung_node_then_resume_exactly(
        zero3_run: Path, data_dir: Path, tmp_path: Path, agents: list[subprocess.Popen]) -> None:
    """Rehearsal of a 2-node job (ZeRO-3, one rank per node). (1) SIGKILL node 1's torchrun agent, then SIGTERM node 0's
    as `srun --kill-on-bad-exit` does when one task of the step dies (else node 0's agent would wait out torchrun's
    300 s exit barrier): rank 1 sees its launcher gone, rank 0 gets the SIGTERM, both agree to stop, write a checkpoint
    and exit; nothing is left running. (2) Resumed on two
    nodes, node 1 then hangs (SIGSTOP of its agent and rank: no socket closes): rank 0's next collective fails after
    train.dist_timeout_s and node 0 ends with one error line naming the newest checkpoint, which is intact. (3) A
    rerun on two nodes finishes with the uninterrupted single-node 2-rank run's losses and weights."""
    timeout_s = 15
    run_dir = tmp_path / "run"
    args = pretrain_args(data_dir, run_dir, *ZERO3, "train.save_every=2", "train.keep_last=3",
                         f"train.dist_timeout_s={timeout_s}")

    node0, node1, _ = _two_nodes(args, free_port(), agents)
    wait_for(node0, lambda: latest_step(run_dir) >= 2)
    assert node0.poll() is None, "the run ended before node 1's agent was killed"
    family = _family(node0) + _family(node1)
    node1.kill()
    node1.wait(timeout=60)
    node0.send_signal(signal.SIGTERM)  # srun --kill-on-bad-exit
    node0.wait(timeout=120)
    _, alive = psutil.wait_procs(family, timeout=60)
    assert not alive
    first = latest_step(run_dir)
    assert 2 <= first < 12 and rd.verify_checkpoint(run_dir, first) == ""
    assert not (run_dir / "model.pt").exists()

    node0, node1, log0 = _two_nodes(args, free_port(), agents)
    wait_for(node0, lambda: latest_step(run_dir) >= first + 2)
    assert node0.poll() is None, "the resumed run ended before node 1 hung"
    hung = _family(node1)
    for proc in hung:
        proc.suspend()
    hung_at = time.monotonic()
    try:
        node0.wait(timeout=timeout_s + 90)
        waited = time.monotonic() - hung_at
    finally:
        for proc in hung:
            proc.kill()
        psutil.wait_procs(hung, timeout=60)
    out = log0.read_text()
    assert f"resuming at step {first}" in out
    assert node0.returncode != 0 and "error: lost contact with another rank at step" in out, out[-3000:]
    assert f"train.dist_timeout_s={timeout_s}" in out and waited < timeout_s + 60, waited
    second = latest_step(run_dir)
    assert first < second < 12 and f"the newest checkpoint is {run_dir / f'global_step{second}'}" in out
    assert rd.verify_checkpoint(run_dir, second) == ""

    node0, node1, log0 = _two_nodes(args, free_port(), agents)
    assert node0.wait(timeout=240) == 0 and node1.wait(timeout=60) == 0, log0.read_text()[-3000:]
    assert f"resuming at step {second}" in log0.read_text()
    assert read_losses(run_dir) == read_losses(zero3_run)
    assert read_metrics(run_dir)[-1]["val_loss"] == read_metrics(zero3_run)[-1]["val_loss"]
    a = torch.load(zero3_run / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
