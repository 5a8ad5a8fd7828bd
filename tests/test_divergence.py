"""Divergence caught, the advice it prints works, and a resume may lower the learning rate (issue 37 §4–§5).

The subprocess tests run the real launcher on the tiny config (vocabulary 512: ln V = 6.238, so the guard's limit
at train.divergence_factor 2 is 12.477) and then run the command the error line advises, exactly as printed.
"""

from __future__ import annotations

import json
import math
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import ROOT, pretrain_args, pretrain_cmd, read_metrics, run_env

from regulargpt import run_directory as rd
from regulargpt.config import ConfigError
from regulargpt.train.divergence import DivergenceGuard, keep_good_checkpoints, lower_lr_command


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env or run_env(), capture_output=True, text=True, timeout=300)


def _error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    return line


def _advice(line: str) -> list[str]:
    """The command after 'with: ' in a stop message, split as a shell would."""
    return shlex.split(line.split(" with: ", 1)[1])


# ----------------------------------------------------------------------------------------------------- unit


def test_a_checkpoint_is_good_only_once_a_later_loss_vouches_for_it() -> None:
    guard = DivergenceGuard(2.0, vocab_size=512, start_step=0)
    assert guard.limit == pytest.approx(2 * 6.238324625, rel=1e-9)  # 2 · ln 512
    guard.saved(3)
    assert guard.good_step is None  # nothing has trained on step 3's weights yet
    guard.seen(float("nan"))  # a skipped step: the weights did not change and are not vouched for
    assert guard.good_step is None
    guard.seen(5.9)
    assert guard.good_step == 3
    guard.saved(6)
    guard.saved(9)
    assert guard.diverged(27.5) and not guard.diverged(12.4) and not guard.diverged(float("nan"))
    guard.seen(27.5)  # above the limit: vouches for nothing
    assert guard.good_step == 3 and guard.unverified == [6, 9]
    assert DivergenceGuard(0.0, 512, 40).good_step == 40 and not DivergenceGuard(0.0, 512, 0).diverged(1e30)


def test_the_stop_sets_aside_what_came_after_the_last_good_checkpoint(tmp_path: Path) -> None:
    for step in (3, 6, 9):
        (tmp_path / f"global_step{step}").mkdir()
    rd.mark_latest(tmp_path, 9)
    clause = keep_good_checkpoints(tmp_path, 3)
    assert clause == (f"the last good checkpoint is global_step3 in {tmp_path} (global_step6.diverged, "
                      f"global_step9.diverged set aside: saved after the weights went bad)")
    assert rd.latest_step(tmp_path) == 3 and rd.checkpoint_steps(tmp_path) == [3]
    assert "starts again from step 0" in keep_good_checkpoints(tmp_path, None)
    assert not (tmp_path / "latest").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "global_step3.diverged", "global_step6.diverged", "global_step9.diverged"]


def test_the_advice_lowers_the_rate_tenfold_at_most_to_3e_4() -> None:
    assert lower_lr_command("python launch/pretrain.py --run-dir 'my runs/a'", 1e6) == (
        "python launch/pretrain.py --run-dir 'my runs/a' --set train.lr=0.0003 --allow-changed train.lr")
    assert lower_lr_command("x", 1e-3).endswith("--set train.lr=0.0001 --allow-changed train.lr")
    assert rd.check_allow_changed(["train.lr,train.beta2", "train.eps"]) == {"train.lr", "train.beta2", "train.eps"}
    with pytest.raises(ConfigError, match=r"--allow-changed train.steps: not a setting.*use --extend-to N"):
        rd.check_allow_changed(["train.steps"])


# ----------------------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_lr_1_stops_with_exit_2_instead_of_training_on(data_dir: Path, tmp_path: Path) -> None:
    """Before the guard: loss 6.2 → 27.5 at step 2 and on to the end, exit 0 and a model.pt."""
    run_dir = tmp_path / "run"
    line = _error(_run(pretrain_cmd(1) + pretrain_args(data_dir, run_dir, "train.lr=1.0")))
    assert line.startswith("error: step 2: training loss ") and "is above 2 × ln V = 12.48" in line
    assert "no checkpoint of" in line and _advice(line)[-4:] == ["--set", "train.lr=0.0003", "--allow-changed",
                                                                  "train.lr"]
    assert not (run_dir / "model.pt").exists() and rd.checkpoint_steps(run_dir) == []
    assert [r["step"] for r in read_metrics(run_dir)] == [1]  # the diverged step is not recorded


@pytest.mark.slow
def test_lr_1e6_never_exits_0_with_a_nan_loss_and_its_advice_finishes(data_dir: Path, tmp_path: Path) -> None:
    """lr 1e6: every step after the first has a NaN loss. Even with train.max_bad_steps raised past the run's
    length the last step's NaN loss stops it (before: exit 0 and a model.pt that predicts NaN); the printed
    command then trains the run from step 0 at 3e-4 to the end."""
    run_dir = tmp_path / "run"
    line = _error(_run(pretrain_cmd(1) + pretrain_args(data_dir, run_dir, "train.lr=1e6", "train.max_bad_steps=100")))
    assert line.startswith("error: step 12: the last step's loss is nan (non-finite)")
    assert "global_step9.diverged" in line and not (run_dir / "model.pt").exists()
    done = _run(_advice(line))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == list(range(1, 13)) and all(math.isfinite(r["loss"]) for r in rows)
    assert rows[0]["lr"] == pytest.approx(3e-4, rel=1e-12)  # step 0 of the cosine schedule: the peak rate
    weights = torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]
    assert all(t.isfinite().all() for t in weights.values() if t.is_floating_point())
    assert [json.loads(x) for x in (run_dir / rd.CHANGES_FILE).read_text().splitlines()] == [
        {"step": 0, "key": "train.lr", "old": 1e6, "new": 3e-4}]


@pytest.mark.slow
def test_a_resume_at_a_lower_rate_is_applied_and_recorded_and_a_lost_config_comes_from_the_checkpoint(
        data_dir: Path, tmp_path: Path) -> None:
    """NaN at step 4 with no bad step allowed: checkpoint 3 was never vouched for (step 4 is its first use), so
    the stop sets it aside and names global_step2. The advised command resumes there at lr 1e-4: the rate the
    optimizer applies (each record's lr, read from its param group) is 0.001 for steps 1–2 and 1e-4 from step 3.
    Then config.resolved.json is deleted: a resume with another lr is still refused, against the checkpoint's copy;
    truncated, it is rewritten from that copy; export reads the copy too."""
    run_dir = tmp_path / "run"
    sets = ["train.steps=6", "train.save_every=1", "train.keep_last=2", "train.schedule=constant",
            "train.lr=0.001", "train.max_bad_steps=0"]
    command = pretrain_cmd(1) + pretrain_args(data_dir, run_dir, *sets)
    line = _error(_run(command, run_env(REGULARGPT_INJECT_NAN="loss@4")))
    assert line.startswith("error: step 4: 1 steps skipped for a non-finite loss or gradient")
    assert f"the last good checkpoint is global_step2 in {run_dir} (global_step3.diverged set aside" in line
    done = _run(_advice(line))
    assert done.returncode == 0 and "resuming at step 2" in done.stderr, done.stderr[-3000:]
    assert "train.lr 0.001 → 0.0001 from step 3 on" in done.stderr
    assert [(r["step"], r["lr"]) for r in read_metrics(run_dir)] == [
        (1, 0.001), (2, 0.001), (3, 1e-4), (4, 1e-4), (5, 1e-4), (6, 1e-4)]
    assert [json.loads(x) for x in (run_dir / rd.CHANGES_FILE).read_text().splitlines()] == [
        {"step": 2, "key": "train.lr", "old": 0.001, "new": 1e-4}]

    config = run_dir / "config.resolved.json"
    saved = json.loads(config.read_text())
    config.unlink()
    refused = _error(_run(command + ["--set", "train.lr=0.01"]))  # before: accepted and recorded
    assert "train.lr: run has 0.0001, now 0.01" in refused and not config.exists()
    config.write_text(json.dumps(saved)[:100])  # truncated
    again = _run(_advice(line))
    assert again.returncode == 0 and "nothing to train" in again.stderr, again.stderr[-3000:]
    assert f"note: {config} is unreadable; using the config saved in global_step6" in again.stderr
    assert json.loads(config.read_text()) == saved

    from regulargpt.train.export import export_model

    config.unlink()
    out = export_model(run_dir, out=tmp_path / "model.pt")
    assert torch.load(out, weights_only=True)["config"]["train"]["lr"] == 1e-4


def test_export_refuses_a_checkpoint_with_non_finite_weights(tmp_path: Path) -> None:
    """A ZeRO-0 checkpoint whose weights hold a NaN and an inf (written by hand): no model.pt, one TrainError."""
    from regulargpt.config import load_config_dict, save_config
    from regulargpt.errors import TrainError
    from regulargpt.model import build_model
    from regulargpt.train.export import export_model

    cfg = load_config_dict({"model": {"vocab_size": 64, "d_model": 16, "n_heads": 2}})
    state = build_model(cfg.model).state_dict()
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name].view(-1)[0], state[name].view(-1)[1] = float("nan"), float("inf")
    (tmp_path / "global_step1").mkdir()
    torch.save({"module": state}, tmp_path / "global_step1" / "mp_rank_00_model_states.pt")
    rd.write_trainer_state(tmp_path, 1, {"step": 1, "zero_stage": 0, "param_names": []})
    rd.write_checksums(tmp_path, 1)
    rd.mark_latest(tmp_path, 1)
    save_config(cfg, tmp_path / "config.resolved.json")
    with pytest.raises(TrainError, match=rf"global_step1: non-finite weights \({name}\): the run diverged"):
        export_model(tmp_path)
    assert not (tmp_path / "model.pt").exists()
