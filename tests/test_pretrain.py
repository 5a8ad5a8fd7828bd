"""Pretraining end to end on CPU: ZeRO 1/2/3 with two processes (gloo), exact resume after a kill and after
SIGTERM, export from ZeRO-3, keep-last-k, wandb offline, and the setup errors a user can hit.

Runs use launch/pretrain.py as a subprocess (helpers.py: torchrun, the deepspeed launcher, or plain python) with
OMP_NUM_THREADS=1, which makes CPU training bit-for-bit deterministic for a fixed number of processes. The DeepSpeed
shm op is never compiled (launch/pretrain.py skips it on CPU). The fixtures `data_dir` and `zero3_run` are in
conftest.py (tests/test_faults.py uses them too).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    ROOT,
    TINY,
    ZERO3,
    checkpoint_dirs,
    free_port,
    interrupt,
    pretrain,
    pretrain_args,
    pretrain_cmd,
    read_losses,
    read_metrics,
    run_env,
)

# --------------------------------------------------------------------------------- two processes, ZeRO 1/2/3


def _assert_loss_falls(run_dir: Path) -> None:
    losses = [r["loss"] for r in read_metrics(run_dir)]
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses


@pytest.mark.slow
@pytest.mark.parametrize("stage,precision,launcher", [(1, "fp32", "deepspeed"), (2, "bf16", "torchrun")])
def test_two_process_zero_loss_falls(data_dir, tmp_path, stage, precision, launcher):
    run_dir = tmp_path / "run"
    proc = pretrain(data_dir, run_dir, f"train.zero_stage={stage}", f"train.precision={precision}", nproc=2,
                    launcher=launcher)
    assert "2 process(es)" in proc.stderr and f"ZeRO {stage}" in proc.stderr
    _assert_loss_falls(run_dir)
    rec = read_metrics(run_dir)[-1]
    assert {"loss", "lr", "tokens_per_s", "mfu", "grad_norm", "val_loss"} <= set(rec)
    assert rec["tokens"] == 12 * 4 * 32 * 2
    assert (run_dir / "model.pt").is_file()


@pytest.mark.slow
def test_zero3_loss_falls_keeps_last_k_and_exports_a_loadable_model(zero3_run, data_dir, tmp_path):
    from regulargpt.checkpoint import load_model_file
    from regulargpt.config import load_config
    from regulargpt.data import load_manifest
    from regulargpt.model import build_model

    _assert_loss_falls(zero3_run)
    assert checkpoint_dirs(zero3_run) == ["global_step12", "global_step9"]  # keep_last=2 of 3, 6, 9, 12
    assert (zero3_run / "latest").read_text() == "global_step12"
    assert (zero3_run / "config.resolved.json").is_file()

    tokenizer_sha = load_manifest(data_dir)["tokenizer"]["sha256"]
    out = tmp_path / "step9.pt"  # the export command, from a ZeRO-3 checkpoint other than the latest
    proc = subprocess.run([sys.executable, str(ROOT / "launch/export.py"), str(zero3_run), "--step", "9", "--out",
                           str(out)], cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for path, step in ((zero3_run / "model.pt", 12), (out, 9)):
        payload = torch.load(path, weights_only=True)
        cfg = load_config(ROOT / "configs/tiny/regular_gpt.json", [f"data.path={zero3_run}", *TINY])
        fresh = build_model(cfg.model)
        fresh.load_state_dict(payload["state_dict"], strict=True)
        assert all(v.dtype == torch.float32 for v in payload["state_dict"].values() if v.is_floating_point())
        assert payload["meta"]["step"] == step
        assert payload["meta"]["tokenizer_sha256"] == tokenizer_sha  # what evaluation checks its data against
        _, model, _ = load_model_file(path)
        with torch.no_grad():
            assert torch.isfinite(model(torch.randint(0, 512, (1, 40)))).all()
    a = torch.load(zero3_run / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(out, weights_only=True)["state_dict"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # step 9 and 12 differ


# ---------------------------------------------------------------------------------------------- one process


@pytest.mark.slow
def test_sigkill_then_resume_reproduces_the_uninterrupted_losses(data_dir, tmp_path):
    ref = tmp_path / "ref"
    done = pretrain(data_dir, ref).stderr
    last = read_metrics(ref)[-1]  # the summary: 12 steps x 4 windows x 32 tokens, the last logged losses
    assert (f"{ref}: steps 0 → 12 of 12 in " in done and "(1,536 tokens, " in done
            and f"last train loss {last['loss']:.4f}, val loss {last['val_loss']:.4f}" in done)
    assert f"checkpoint {ref}/global_step12, model {ref}/model.pt\nnext: python eval/extrapolate.py --runs {ref} " \
           f"--data {data_dir} --out results/lm\n      python launch/generate.py {ref}" in done
    run_dir = tmp_path / "killed"
    proc = interrupt(pretrain_cmd(1) + pretrain_args(data_dir, run_dir), run_dir, signal.SIGKILL, after_latest=3)
    assert proc.returncode == -signal.SIGKILL
    partial = run_dir / "global_step99"  # as if a save had been killed half-way: not named by `latest`
    partial.mkdir()
    again = pretrain(data_dir, run_dir)
    assert "resuming at step" in again.stderr
    assert not partial.exists()
    assert read_losses(run_dir) == read_losses(ref) and len(read_losses(ref)) == 12
    a = torch.load(ref / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(run_dir / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    bad = subprocess.run(pretrain_cmd(1) + pretrain_args(data_dir, run_dir, "train.lr=0.01"), cwd=ROOT,
                         env=run_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "train.lr: run has 0.003, now 0.01" in bad.stderr


def _kernel_cache() -> dict[str, str]:
    """TORCH_EXTENSIONS_DIR holding the C++ kernel this process loaded (built by `make install`), for a subprocess
    whose HOME is elsewhere: without it, that process would compile the kernel again under its own HOME (about a
    CPU-minute). Empty when the kernel does not build here."""
    from regulargpt.kernels import sliding_dilated_cpp

    if sliding_dilated_cpp.build_error() is not None:
        return {}
    return {"TORCH_EXTENSIONS_DIR": str(Path(sliding_dilated_cpp.extension().__file__).parents[1])}  # <root>/<name>/


@pytest.mark.slow
def test_wandb_offline_without_key_or_network(data_dir, tmp_path):
    run_dir = tmp_path / "run"
    env = run_env(HOME=str(tmp_path), WANDB_SILENT="true", **_kernel_cache())  # no ~/.netrc, no wandb settings
    for key in ("WANDB_MODE", "WANDB_API_KEY"):
        env.pop(key, None)
    pretrain(data_dir, run_dir, "logging.wandb=true", "train.steps=2", "train.save_every=0", env=env)
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


# --------------------------------------------------------------------------------------- errors, in process


@pytest.fixture
def quiet_env(monkeypatch):
    """What train() sets for a plain process, restored after the test."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port()), "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(key, value)


def _cfg(data_dir: Path, *sets: str):
    from regulargpt.config import load_config

    return load_config(ROOT / "configs/tiny/regular_gpt.json", [f"data.path={data_dir}", *TINY, *sets])


def test_fp16_on_cpu_is_a_clear_error(data_dir, tmp_path, quiet_env):
    from regulargpt.train import TrainError, train

    with pytest.raises(TrainError, match=r"train.precision='fp16' needs a CUDA GPU.*bf16 or fp32"):
        train(_cfg(data_dir, "train.precision=fp16"), tmp_path / "run")


def test_compile_with_zero3_and_bf16_is_refused_before_torch_2_13(data_dir, tmp_path, quiet_env, monkeypatch):
    """torch 2.11 trained this combination with wrong gradients (issue 39 §4): refused in one line naming the
    versions, before any data is read; the other stages, fp32 and torch 2.13 pass the check."""
    from regulargpt.train import TrainError, train
    from regulargpt.train.engine import check_compile

    risky = ("train.compile=true", "train.zero_stage=3", "train.precision=bf16")
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    with pytest.raises(TrainError, match=r"train.compile=true with train.zero_stage=3 .* torch 2.11.0\+cu130 .*"
                                         r"torch >= 2.13"):
        train(_cfg(data_dir, *risky), tmp_path / "run")
    assert not (tmp_path / "run").exists()
    for version, sets in (("2.13.0", risky), ("2.14.1+cu130", risky), ("2.11.0", (*risky[:2], "train.precision=fp32")),
                          ("2.11.0", (risky[0], "train.zero_stage=2", risky[2])), ("2.12.0", risky[1:])):
        check_compile(_cfg(data_dir, *sets), version)  # no error
    with pytest.raises(TrainError, match="torch 2.12.0"):
        check_compile(_cfg(data_dir, *risky), "2.12.0")


def test_vocab_mismatch_is_a_clear_error(data_dir, tmp_path, quiet_env):
    from regulargpt.train import TrainError, train

    with pytest.raises(TrainError, match=r"model.vocab_size=2048 .*vocab_size=512"):
        train(_cfg(data_dir, "model.vocab_size=2048"), tmp_path / "run")
    with pytest.raises(TrainError, match="data.path is empty"):
        train(_cfg(data_dir, "data.path="), tmp_path / "run")


def test_run_dir_config_check_prune_and_partial_cleanup(data_dir, tmp_path):
    from regulargpt.train import TrainError
    from regulargpt import run_directory as rd

    cfg = _cfg(data_dir)
    rd.check_or_write_config(tmp_path, cfg)
    rd.check_or_write_config(tmp_path, _cfg(data_dir, "train.log_every=5", "logging.wandb=true"))  # free keys
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 6.2}\n')  # it trained: a change is refused
    with pytest.raises(TrainError, match=r"model.d_model: run has 32, now 64"):
        rd.check_or_write_config(tmp_path, _cfg(data_dir, "model.d_model=64"))
    for s in (3, 6, 9, 12):
        (tmp_path / f"global_step{s}").mkdir()
    rd.mark_latest(tmp_path, 9)
    assert rd.remove_partial_checkpoints(tmp_path) == [12]
    assert rd.prune_checkpoints(tmp_path, keep=2) == [3]
    assert checkpoint_dirs(tmp_path) == ["global_step6", "global_step9"]
    assert rd.default_run_dir("configs/tiny/alibi.json", 3) == Path("runs/alibi-seed3")


def test_lr_schedule_and_deepspeed_config(data_dir):
    from regulargpt.train import deepspeed_config, lr_factor

    cfg = _cfg(data_dir, "train.steps=101", "train.warmup_fraction=0.1", "train.schedule=cosine",
               "train.min_lr_ratio=0.1", "train.grad_accum=2", "train.zero_stage=2",
               'deepspeed.zero_optimization={"stage": 2, "overlap_comm": false}')
    assert lr_factor(0, cfg) == pytest.approx(0.1) and lr_factor(9, cfg) == pytest.approx(1.0)  # W = 10
    assert lr_factor(10, cfg) == 1.0 and lr_factor(100, cfg) == pytest.approx(0.1, abs=1e-15)  # the last step: min
    assert lr_factor(55, cfg) == pytest.approx(0.55)  # half way through the cosine (steps 10..100): (1 + 0.1) / 2
    # Extended at step 101 to 201: the first 101 steps unchanged, then from the minimum back up to the peak over
    # round(0.1 · 100) = 10 steps, cosine down to the minimum at step 200.
    ext = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, steps=201, extended_from=[101]))
    assert [lr_factor(s, ext) for s in range(101)] == [lr_factor(s, cfg) for s in range(101)]
    assert lr_factor(101, ext) == pytest.approx(0.1 + 0.9 / 10) and lr_factor(110, ext) == 1.0
    assert lr_factor(200, ext) == pytest.approx(0.1, abs=1e-15)
    flat = dataclasses.replace(ext, train=dataclasses.replace(ext.train, schedule="constant"))
    assert lr_factor(5, flat) == pytest.approx(0.6) and {lr_factor(s, flat) for s in range(10, 201)} == {1.0}
    ds = deepspeed_config(cfg, world_size=4)
    assert ds["train_batch_size"] == 4 * 2 * 4 and ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": False, "contiguous_gradients": True,  # the user's
                                       "reduce_bucket_size": 50_000_000, "allgather_bucket_size": 50_000_000}  # wins
    assert ds["bf16"] == {"enabled": False}


def test_activation_checkpointing_recomputes_every_application_with_identical_gradients(data_dir):
    import torch.nn.functional as F

    from regulargpt.model import build_model
    from regulargpt.train.engine import apply_activation_checkpointing

    for arch in ("architecture=regular_gpt", "architecture=transformer"):
        cfg = _cfg(data_dir, f"model.{arch}", "model.n_layers=2")
        torch.manual_seed(0)
        plain = build_model(cfg.model)
        torch.manual_seed(0)
        wrapped = build_model(cfg.model)
        assert apply_activation_checkpointing(wrapped) == 2  # K=2 shared sub-layers, or 2 dense layers
        assert list(wrapped.state_dict()) == list(plain.state_dict())
        x = torch.randint(0, 512, (2, 33))
        grads = []
        for model in (plain, wrapped):
            loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, 512), x[:, 1:].reshape(-1))
            loss.backward()
            grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-6, rtol=1e-5) for n in grads[0])
        assert all(g.abs().sum() > 0 for n, g in grads[1].items() if "rel_bias" in n or n.endswith("pad"))


def test_activation_checkpointing_counts_one_recompute_per_layer_application(data_dir, monkeypatch):
    from regulargpt.model import build_model
    from regulargpt.model.layers import TransformerLayer
    from regulargpt.train.engine import apply_activation_checkpointing

    calls = []
    original = TransformerLayer.forward
    monkeypatch.setattr(TransformerLayer, "forward", lambda self, x, attend, **kw: calls.append(x.shape[1]) or
                        original(self, x, attend, **kw))
    model = build_model(_cfg(data_dir).model)  # C=4, K=2, T=32: L=3 depth steps, 6 applications (the pad states call no forward)
    apply_activation_checkpointing(model)
    model(torch.randint(0, 512, (1, 32))).sum().backward()
    assert calls.count(32) == 2 * 6  # each sequence application ran twice: forward and recomputation
