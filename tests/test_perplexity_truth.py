"""Perplexity against independent truth: window plans against hand-written enumerations, per-token NLL of a
stub model with known non-uniform logits computed with math.log in the test, the token-weighted mean (not a mean
over positions) on unequal tokens per position, and the sweep's default sliding stride and score at every length
against a per-target enumeration of which window scores each target."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from regulargpt.evaluation.length_sweep import result_row, sweep
from regulargpt.evaluation.perplexity import plan_tokens, plan_windows, score_windows
from regulargpt.model import build_model
from regulargpt.config import Config, DataConfig, ModelConfig
from test_extrapolate import STREAM, TRAIN_LEN, VOCAB, _run, data  # noqa: F401 (data: the module's fixture)


@pytest.mark.parametrize("tokens,length,protocol,stride,starts,score_from", [
    # sliding, S = 3: targets 1-4 | 5-7 | 8-10 | 11 (the last window ends at N = 11 and scores what is left)
    (11, 4, "sliding", 3, [0, 3, 6, 7], [0, 1, 1, 3]),
    (12, 6, "sliding", 0, [0, 3, 6], [0, 3, 3]),  # default stride L // 2 = 3
    (7, 3, "sliding", 0, [0, 1, 2, 3, 4], [0, 2, 2, 2, 2]),  # L // 2 = 1
    (9, 3, "sliding", 3, [0, 3, 6], [0, 0, 0]),  # S = L is non-overlapping
    (12, 4, "nonoverlapping", 0, [0, 4, 8], [0, 0, 0]),
    (10, 4, "nonoverlapping", 2, [0, 4], [0, 0]),  # the stride is ignored; ⌊10/4⌋ whole windows
])
def test_window_plans_equal_the_hand_enumeration(tokens, length, protocol, stride, starts, score_from) -> None:
    plan = plan_windows(tokens, length, protocol, stride)
    assert plan.starts.tolist() == starts and plan.score_from.tolist() == score_from
    assert plan.stride == (length if protocol == "nonoverlapping" else stride or length // 2)


def test_plan_tokens_rounds_to_whole_windows_of_every_length() -> None:
    assert plan_tokens(101, [4, 6]) == {4: 96, 6: 96}  # 100 targets, lcm 12 → 96
    assert plan_tokens(101, [4, 6], requested=50) == {4: 48, 6: 48}
    assert plan_tokens(30, [4, 7]) == {4: 28, 7: 28}  # lcm 28
    # n tokens hold n − 1 targets: a window of L needs L + 1 tokens
    assert plan_tokens(65, [64]) == {64: 64} and plan_tokens(64, [64]) == {64: 0}
    assert plan_tokens(12, [4, 6]) == {4: 4, 6: 6}  # 11 targets < lcm 12: N = ⌊11/6⌋·6 = 6, ⌊6/L⌋·L each


class _TableModel(nn.Module):
    """logits[b, p, v] = table[x_p, v] + 0.5·p·(v == 0): non-uniform, position-dependent."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits = self.table[ids].clone()
        logits[..., 0] += 0.5 * torch.arange(ids.shape[1])
        return logits


def _nll(table: list[list[float]], token: int, position: int, target: int) -> float:
    row = [x + (0.5 * position if v == 0 else 0.0) for v, x in enumerate(table[token])]
    return math.log(sum(math.exp(x) for x in row)) - row[target]


@pytest.mark.parametrize("protocol,stride", [("nonoverlapping", 0), ("sliding", 2), ("sliding", 3)])
def test_score_windows_sums_each_scored_targets_nll_by_position(protocol: str, stride: int) -> None:
    rng = np.random.default_rng(3)
    table = rng.normal(size=(5, 5)).round(2).tolist()
    stream = rng.integers(0, 5, 14)
    length, tokens = 4, 12
    plan = plan_windows(tokens, length, protocol, stride)
    nll_sum, counts = score_windows(_TableModel(torch.tensor(table)), stream, plan, batch_size=2)
    want_sum, want_counts = [0.0] * length, [0] * length
    for start, first in zip(plan.starts.tolist(), plan.score_from.tolist()):  # (checked against literals above)
        for p in range(first, length):
            want_sum[p] += _nll(table, int(stream[start + p]), p, int(stream[start + p + 1]))
            want_counts[p] += 1
    assert counts.tolist() == want_counts and sum(want_counts) == tokens
    assert nll_sum.tolist() == pytest.approx(want_sum, rel=1e-6)


def test_result_row_is_the_token_weighted_mean() -> None:
    """Position 0 scores 3 tokens (NLL sum 6), position 1 one token (NLL 1): the mean is 7/4, not (2 + 1)/2."""
    cfg = SimpleNamespace(data=SimpleNamespace(seq_len=2), model=SimpleNamespace(rope_scaling=None))
    info = SimpleNamespace(run="r", depth_override=None, label="m", seed=0, step=1, weights_sha256="0", variant={},
                           cfg=cfg, params=1)
    plan = plan_windows(4, 2, "sliding", 1)
    row = result_row(info, "d", "test", plan, "sliding", np.array([6.0, 1.0]), np.array([3, 1]), 0.0)
    assert row["tokens"] == 4 and row["nll"] == pytest.approx(1.75) and row["ppl"] == pytest.approx(math.exp(1.75))
    assert [(b["tokens"], b["nll"]) for b in row["per_position"]] == [(3, 2.0), (1, 1.0)]


def _scoring_window(target: int, length: int, stride: int, tokens: int) -> int:
    """Start of the window that scores target t (1-based) under the sliding protocol: the first window covers
    targets 1..L; target t > L is scored by the window ending at min(N, L + S·⌈(t − L)/S⌉)."""
    if target <= length:
        return 0
    return min(tokens, length + stride * -(-(target - length) // stride)) - length


def test_sweep_default_stride_and_score_at_each_length(data: Path, tmp_path: Path) -> None:
    run = _run(tmp_path / "alibi", data, seed=4)
    rows = sweep([run], data, "test", [8, 16, 32], tmp_path / "out", protocol="sliding", progress=False)
    torch.manual_seed(4)
    cfg = Config(model=ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_layers=2, ffn_mult=2, chunk_size=2,
                                   thickness=1, architecture="transformer", position="alibi"),
                 data=DataConfig(path=str(data), seq_len=TRAIN_LEN))
    model = build_model(cfg.model).eval()
    stream = np.fromfile(data / "test.bin", dtype=np.uint16).astype(np.int64)
    tokens = (STREAM - 1) // 32 * 32
    for row, length in zip(rows, [8, 16, 32]):
        stride = length // 2
        assert (row["length"], row["stride"], row["tokens"]) == (length, stride, tokens)
        starts = sorted({_scoring_window(t, length, stride, tokens) for t in range(1, tokens + 1)})
        with torch.no_grad():
            ids = torch.from_numpy(np.stack([stream[a:a + length + 1] for a in starts]))
            logp = model(ids[:, :-1]).log_softmax(-1).double()
        nll = {a: -logp[w].gather(-1, ids[w, 1:, None]).squeeze(-1) for w, a in enumerate(starts)}
        total = sum(float(nll[_scoring_window(t, length, stride, tokens)][t - 1 - _scoring_window(t, length, stride,
                                                                                                  tokens)])
                    for t in range(1, tokens + 1))
        assert row["windows"] == len(starts)
        assert row["nll"] == pytest.approx(total / tokens, rel=1e-6)


@pytest.mark.parametrize("fields,want", [
    # per token (d = 16, ffn 2, V = 61): 16·(2·2 + 8) + 3·61 = 375 values; 4 B × 375 × L 32 × B 3 = 144,000 bytes
    ({"position": "none"}, 144_000 + 4_000),  # fused kernel: no score block; + 4 B × 1,000 weights
    # an additive bias: one query row 12·B·H·L = 2,304 B, all L rows 73,728 (under the budget) + bias 4·H·L² = 8,192
    ({"position": "alibi"}, 144_000 + 73_728 + 8_192 + 4_000),
    ({"position": "alibi", "window": 8}, 4 * (375 + 3 * 2 * 16) * 32 * 3 + 4_000),  # band: 3·H·2W per token
    ({"architecture": "regular_gpt", "position": "none", "chunk_size": 4}, 4 * (375 + 4 * 2 * 4) * 32 * 3 + 4_000),
])
def test_memory_estimate_by_hand(fields: dict, want: int) -> None:
    from regulargpt.evaluation.perplexity import estimate_memory

    base = {"vocab_size": VOCAB, "d_model": 16, "n_heads": 2, "ffn_mult": 2, "architecture": "transformer"}
    assert estimate_memory(ModelConfig(**{**base, **fields}), length=32, batch=3, params=1000) == want
    if fields == {"position": "alibi"}:  # L = 512 under a 1 MiB budget: score rows and bias blocks capped at 1 MiB each
        capped = ModelConfig(**{**base, **fields, "attention_memory_mb": 1})
        assert estimate_memory(capped, length=512, batch=3, params=1000) == 4 * 375 * 512 * 3 + 2 * 2**20 + 4_000
