"""train.compile: build_engine compiles the model in place (same module, parameter names and state dict) iff set."""

from __future__ import annotations

import sys
import types

import pytest
import torch
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
