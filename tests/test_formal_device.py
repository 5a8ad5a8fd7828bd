"""The formal trainer's device and stop plumbing (what a SLURM array task on a GPU relies on): a stop request
checkpoints the step it arrives at and a resumed run equals an uninterrupted one; every tensor the models create while
running (tree mode included) is made on their own device, checked on the CPU by flagging factory calls without a
``device`` inside ``forward``; on CUDA (where there is one) training and evaluation run there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import formal_losses, tiny_cfg
from torch import nn
from torch.overrides import TorchFunctionMode

import regulargpt.experiments.formal_sweep as formal_sweep
import regulargpt.train.formal_trainer as formal_trainer
from regulargpt.checkpoint import load_model_file
from regulargpt.experiments.formal_sweep import execute_run, load_profile, plan_runs
from regulargpt.train.formal_trainer import train_formal

CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "formal"
FACTORIES = {torch.arange, torch.zeros, torch.ones, torch.empty, torch.full, torch.tensor, torch.as_tensor,
             torch.rand, torch.randn, torch.randint, torch.eye, torch.linspace, torch.tril_indices,
             torch.triu_indices}


class DevicelessFactories(TorchFunctionMode):
    """Records factory calls without a `device` argument: on a GPU such a tensor would be made on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.forwards = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            self.calls.append(func.__name__)
        return func(*args, **kwargs)


def watch(model: nn.Module, mode: DevicelessFactories) -> nn.Module:
    """Enter `mode` for the duration of every forward of `model` (its outermost call)."""
    depth = [0]

    def enter(*_: object) -> None:
        depth[0] += 1
        if depth[0] == 1:
            mode.forwards += 1
            mode.__enter__()

    def leave(*_: object) -> None:
        depth[0] -= 1
        if depth[0] == 0:
            mode.__exit__(None, None, None)

    model.register_forward_pre_hook(enter)
    model.register_forward_hook(leave)
    return model


def test_the_detector_flags_a_tensor_made_without_a_device_inside_forward() -> None:
    class Bad(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(x.shape[-1])  # on a GPU: a CPU tensor added to a CUDA one

    mode = DevicelessFactories()
    watch(Bad(), mode)(torch.zeros(2, 3))
    assert mode.calls == ["arange"]


@pytest.mark.parametrize("model", ["regular_gpt_c2", "rnn", "lstm", "transformer"])
def test_training_selection_and_evaluation_make_every_tensor_on_the_models_device(tmp_path, monkeypatch,
                                                                                   model) -> None:
    mode = DevicelessFactories()
    build, load = formal_trainer.build_model, formal_sweep.load_model_file
    monkeypatch.setattr(formal_trainer, "build_model", lambda cfg: watch(build(cfg), mode))
    monkeypatch.setattr(formal_sweep, "load_model_file", lambda path: (lambda c, m, meta: (c, watch(m, mode), meta))(
        *load(path)))
    sets = ["train.steps=4", "train.batch_size=4", "train.log_every=1", "eval.samples_per_length=4",
            "eval.max_length=44", "eval.select_last=2", "eval.select_every=2", "model.d_model=16"]
    [spec] = plan_runs(load_profile("quick", CONFIGS), tmp_path, configs_dir=CONFIGS, tasks=["parity_check"],
                       models=[model], seeds=[0], sets=sets)
    spec.eval_lengths = [3, 41, 44]
    result = execute_run(spec, device="cpu")
    assert result["error"] == "" and not result["stopped"], result
    # 4 training steps, then (regular_gpt: in tree mode) the checkpoint rule's fit checks and the range evaluation
    assert mode.forwards > 4 and mode.calls == []


def test_a_stop_request_checkpoints_its_step_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path) -> None:
    cfg = tiny_cfg(steps=9, save_every=3)  # dropout 0.1: the RNG states must resume too
    whole = train_formal(cfg, tmp_path / "whole")
    asked = []
    stop = lambda: asked.append(1) or len(asked) >= 5  # noqa: E731 (True when asked after step 5)
    assert train_formal(cfg, tmp_path / "stopped", stop=stop) is None
    assert not (tmp_path / "stopped" / "model.pt").exists()
    assert torch.load(tmp_path / "stopped" / "ckpt.pt", weights_only=True)["step"] == 5  # not the save_every step 3
    assert [json.loads(x)["step"] for x in (tmp_path / "stopped" / "metrics.jsonl").read_text().splitlines()] == [
        1, 2, 3, 4, 5]
    resumed = train_formal(cfg, tmp_path / "stopped")
    assert formal_losses(tmp_path / "whole") == formal_losses(tmp_path / "stopped")
    a, b = load_model_file(whole)[1].state_dict(), load_model_file(resumed)[1].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_stop_after_training_skips_the_evaluation_and_says_stopped(tmp_path) -> None:
    [spec] = plan_runs(load_profile("quick", CONFIGS), tmp_path, configs_dir=CONFIGS, tasks=["even_pairs"],
                       models=["rnn"], seeds=[0], sets=["train.steps=3", "eval.samples_per_length=4"])
    result = execute_run(spec, stop=lambda: (spec.run_dir / "model.pt").is_file())
    assert result["stopped"] and result["error"] == ""
    assert (spec.run_dir / "model.pt").is_file() and not (spec.run_dir / "range.jsonl").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_tree_mode_trains_like_the_cpu_and_resumes_identically(tmp_path) -> None:
    cfg = tiny_cfg(steps=9, save_every=3)
    cpu = train_formal(cfg, tmp_path / "cpu")
    gpu = train_formal(cfg, tmp_path / "gpu", device="cuda")
    assert formal_losses(tmp_path / "cpu")[0] == pytest.approx(formal_losses(tmp_path / "gpu")[0], abs=1e-4)
    asked = []
    assert train_formal(cfg, tmp_path / "gpu2", device="cuda", stop=lambda: asked.append(1) or len(asked) >= 5) is None
    train_formal(cfg, tmp_path / "gpu2", device="cuda")
    assert formal_losses(tmp_path / "gpu") == formal_losses(tmp_path / "gpu2")  # CUDA dropout RNG resumed
    assert cpu is not None and gpu is not None
