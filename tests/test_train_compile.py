"""train.compile: build_engine compiles the model in place (same module, parameter names and state dict) iff set."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from helpers import ZERO3
from torch import nn

from regulargpt.config import load_config
from regulargpt.model import build_model
from regulargpt.train.engine import build_engine


@pytest.mark.parametrize("compile_model", [False, True])
def test_build_engine_compiles_in_place_only_when_asked(monkeypatch, compile_model):
    compiled: list[nn.Module] = []
    monkeypatch.setattr(nn.Module, "compile", lambda self, *a, **k: compiled.append(self))
    fake = types.SimpleNamespace(initialize=lambda model, optimizer, lr_scheduler, **_: (model, optimizer, None,
                                                                                          lr_scheduler))
    monkeypatch.setitem(sys.modules, "deepspeed", fake)  # the engine itself is not under test here
    cfg = load_config("configs/tiny/regular_gpt.json", [f"train.compile={str(compile_model).lower()}"])
    model = build_model(cfg.model)
    names = [n for n, _ in model.named_parameters()]
    engine, *_ = build_engine(cfg, model, world_size=1)
    assert engine is model and compiled == ([model] if compile_model else [])
    assert [n for n, _ in engine.named_parameters()] == names and isinstance(engine.state_dict(), dict)
    assert torch.is_tensor(next(iter(engine.state_dict().values())))


@pytest.mark.slow
@pytest.mark.parametrize("sets", [["train.zero_stage=2", "train.precision=bf16", "train.activation_checkpointing=true"],
                                  ["train.zero_stage=0", "train.precision=fp32"],
                                  # ZeRO-3's hooks split the graph at every module: T = 16 (2 depth steps) keeps the
                                  # recompilations few
                                  [*ZERO3, "data.seq_len=16"]],
                         ids=["zero2-bf16-ckpt", "zero0-fp32", "zero3-bf16-ckpt"])
def test_compiled_deepspeed_training_matches_eager(data_dir, tmp_path, sets):
    """A real run through the DeepSpeed engine compiled (dynamo + AOT autograd: REGULARGPT_COMPILE_BACKEND=aot_eager,
    as inductor's C++ code generation takes minutes here) gives eager's losses and gradient norms, with the fused
    C++ attention operator (``auto`` on CPU). Under ZeRO-3 this needs the pad vector registered as an external
    parameter (engine.compile_engine); without it the compiled forward fails on the pad's empty partition."""
    from helpers import pretrain, read_metrics, run_env

    short = ["train.steps=2", "train.eval_every=0", "train.save_every=0", *sets]
    rows = {}
    for compiled in (False, True):
        proc = pretrain(data_dir, tmp_path / str(compiled), *short, f"train.compile={str(compiled).lower()}",
                        env=run_env(REGULARGPT_COMPILE_BACKEND="aot_eager"))
        assert ("torch.compile on" in proc.stderr) == compiled
        rows[compiled] = [r[key] for r in read_metrics(tmp_path / str(compiled)) for key in ("loss", "grad_norm")]
    assert len(rows[True]) == 4 and rows[True] == pytest.approx(rows[False], rel=1e-5)
