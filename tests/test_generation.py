"""Cached decoding (regulargpt.generation) against independent truth: the full forward pass over the same prefix.

Every dense position signal and RegularGPT with C ∈ {2, 3, 4}, K ∈ {1, 2}, both pad modes and all three depth
policies: logits decoded step by step equal the full forward's (fp64, ≤ 1e-9 relative to the largest logit; bf16
within 0.03 of it, the size of bf16's own error against fp32); greedy generation equals repeated argmax over full
forwards; RegularGPT's cache under depth_policy="train" stops growing at the largest ring window; perplexity through
the cached decoder equals eval/extrapolate.py's (the resumable sweep) on the same tokens.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from regulargpt.checkpoint import save_model_file
from regulargpt.config import ModelConfig, load_config_dict
from regulargpt.generation import (
    GenerationError,
    RingCache,
    SamplingConfig,
    check_request,
    generate,
    make_decoder,
    next_token_probs,
    ring_window,
    teacher_forced_logits,
)
from regulargpt.model import build_model

VOCAB = 23
DENSE_POSITIONS = ["none", "sinusoidal", "learned", "rope", "alibi", "t5", "kerple_log", "kerple_power",
                   "xl_relative", "fire", "xpos", "sandwich"]


def _regular(c: int, k: int, pad: str, policy: str, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, ffn_mult=2, chunk_size=c, thickness=k, pad=pad,
                      depth_policy=policy, train_length=c + 1)
    model = build_model(cfg).to(dtype).eval()
    with torch.no_grad():  # window scalars large enough that every offset's weight matters
        for sub in model.stack.sublayers:
            sub.rel_bias.normal_(0.0, 1.0)
    return model


def _dense(position: str, dtype: torch.dtype = torch.float64, norm: str = "pre") -> torch.nn.Module:
    cfg = ModelConfig(architecture="transformer", position=position, vocab_size=VOCAB, d_model=16, n_heads=2,
                      n_layers=2, ffn_mult=2, norm=norm, max_positions=64)
    return build_model(cfg).to(dtype).eval()


@torch.no_grad()
def _prefix_logits(model: torch.nn.Module, tokens: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """The truth: prompt positions from one forward over the prompt, then position t from a forward over t+1 tokens."""
    out = [model(tokens[:, :prompt_length])]
    out += [model(tokens[:, :t + 1])[:, -1:] for t in range(prompt_length, tokens.shape[1])]
    return torch.cat(out, dim=1)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("position", DENSE_POSITIONS)
def test_dense_cached_logits_equal_the_full_forward(position: str, norm: str) -> None:
    model = _dense(position, norm=norm)
    tokens = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        full = model(tokens)  # dense causal models are length-consistent: one forward is every prefix's truth
    for prompt_length in (1, 7):
        got = teacher_forced_logits(make_decoder(model), tokens, prompt_length)
        assert _relative_error(got, full) <= 1e-9, (position, prompt_length)


REGULAR_GRID = list(itertools.product([2, 3, 4], [1, 2], ["learned", "mask"], ["train", "per_position", "adaptive"]))


@pytest.mark.parametrize("c,k,pad,policy", REGULAR_GRID)
def test_regular_gpt_cached_logits_equal_the_full_forward_of_each_prefix(c: int, k: int, pad: str,
                                                                          policy: str) -> None:
    """C³ + 2 tokens: under train (L = 2) every ring wraps; under per_position and adaptive the depth grows
    three times while decoding (steps start at m = C, C², C³)."""
    model = _regular(c, k, pad, policy)
    tokens = torch.randint(0, VOCAB, (2, c**3 + 2))
    want = _prefix_logits(model, tokens, 2)
    got = teacher_forced_logits(make_decoder(model), tokens, 2)
    assert _relative_error(got, want) <= 1e-9


def test_prefill_of_a_long_prompt_then_steps() -> None:
    """A prompt longer than every ring (prefill keeps only each window's tail), and one that starts mid-depth."""
    for policy in ("train", "per_position"):
        model = _regular(3, 2, "learned", policy)
        tokens = torch.randint(0, VOCAB, (1, 60))
        with torch.no_grad():
            full = model(tokens)
        for prompt_length in (29, 40):
            got = teacher_forced_logits(make_decoder(model), tokens, prompt_length)
            assert _relative_error(got, full) <= 1e-9, (policy, prompt_length)


@pytest.mark.parametrize("name", ["regular_gpt", "alibi", "rope"])
def test_bf16_cached_logits_stay_within_bf16_error(name: str) -> None:
    """bf16 tolerance: |cached − full| <= 0.03 · max|full| (both in bf16); measured ≈ 0.01, the same size as the
    full bf16 forward's own error against fp32."""
    torch.manual_seed(1)
    if name == "regular_gpt":
        cfg = ModelConfig(vocab_size=64, d_model=32, n_heads=4, chunk_size=4, thickness=2, depth_policy="train",
                          train_length=16)
    else:
        cfg = ModelConfig(architecture="transformer", position=name, vocab_size=64, d_model=32, n_heads=4, n_layers=2)
    fp32 = build_model(cfg).eval()
    bf16 = build_model(cfg).eval()
    bf16.load_state_dict(fp32.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    tokens = torch.randint(0, 64, (2, 70))
    with torch.no_grad():
        full, exact = bf16(tokens).float(), fp32(tokens)
    got = teacher_forced_logits(make_decoder(bf16), tokens, 3).float()
    assert _relative_error(got, full) <= 0.03
    assert _relative_error(got, exact) <= 2 * _relative_error(full, exact) + 1e-3


@pytest.mark.parametrize("name", ["train", "per_position", "adaptive", "alibi", "learned"])
def test_greedy_generation_equals_repeated_argmax_over_full_forwards(name: str) -> None:
    model = _dense(name) if name in ("alibi", "learned") else _regular(2, 2, "learned", name)
    prompt = [3, 1, 4, 1, 5]
    got = generate(model, prompt, 30, SamplingConfig(greedy=True), num_samples=2)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(30):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    want = ids[0, len(prompt):].tolist()
    assert got == [want, want]


def test_regular_gpt_cache_stops_growing_under_train_depth() -> None:
    """C = 2, train length 8 → L = 3 steps with rings of W = 2, 3, 5 positions: once 5 positions are decoded the
    cache holds exactly 2 (k, v) · K · (2 + 3 + 5) · B · H · Dh values and never grows again. per_position grows."""
    c, k, b = 2, 2, 3
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, chunk_size=c, thickness=k, depth_policy="train",
                      train_length=8)
    model = build_model(cfg).eval()
    assert [ring_window(c, level) for level in range(3)] == [2, 3, 5]
    decoder = make_decoder(model)
    tokens = torch.randint(0, VOCAB, (b, 200))
    sizes = []
    decoder.prefill(tokens[:, :1])
    for t in range(1, tokens.shape[1]):
        decoder.step(tokens[:, t])
        sizes.append(decoder.cache_bytes)
    bounded = 2 * k * (2 + 3 + 5) * b * cfg.n_heads * cfg.head_dim * 4
    assert set(sizes[4:]) == {bounded}
    assert max(sizes) == bounded
    growing = make_decoder(_regular(2, 2, "learned", "per_position", torch.float32))
    growing.prefill(tokens[:, :1])
    for t in range(1, 200):
        growing.step(tokens[:, t])
    assert growing.cache_bytes > 4 * bounded


def test_ring_cache_keeps_the_last_window() -> None:
    """window 4: after positions 0..5 the slots hold [4, 5, 2, 3]; reading position 1 is an error."""
    ring = RingCache(4)
    values = torch.arange(6, dtype=torch.float64).view(1, 1, 6, 1)
    ring.write(values[:, :, :3], values[:, :, :3])
    ring.write(values[:, :, 3:], values[:, :, 3:])
    assert ring.k is not None and ring.k.flatten().tolist() == [4, 5, 2, 3]
    keys, _ = ring.read([5, 3, 2])
    assert keys.flatten().tolist() == [5, 3, 2]
    with pytest.raises(IndexError):
        ring.read([1])


def test_sampling_filters_match_the_worked_example() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()

    def kept(**kw: float) -> list[int]:
        return next_token_probs(logits, SamplingConfig(**kw)).nonzero()[:, 1].tolist()

    assert kept(top_k=2) == [0, 1]
    assert kept(top_p=0.8) == [0, 1]
    assert kept(top_p=0.9) == [0, 1, 2]
    assert kept(top_p=0.01) == [0]
    probs = next_token_probs(logits, SamplingConfig(top_k=3))
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)
    sharp = next_token_probs(logits, SamplingConfig(temperature=0.5))
    torch.testing.assert_close(sharp, logits.mul(2).softmax(-1))


def test_same_seed_same_samples_and_bad_requests() -> None:
    model = _regular(2, 1, "learned", "train", torch.float32)
    cfg = SamplingConfig(temperature=1.5, top_k=10, top_p=0.9)
    first = generate(model, [1, 2], 25, cfg, seed=7, num_samples=3)
    assert first == generate(model, [1, 2], 25, cfg, seed=7, num_samples=3)
    assert first != generate(model, [1, 2], 25, cfg, seed=8, num_samples=3)
    assert len({tuple(s) for s in first}) > 1  # the batch rows are different samples
    with pytest.raises(GenerationError, match="temperature"):
        SamplingConfig(temperature=0.0)
    SamplingConfig(temperature=0.0, greedy=True)
    decoder = make_decoder(model)
    with pytest.raises(GenerationError, match="empty"):
        check_request(decoder, VOCAB, [], 5)
    with pytest.raises(GenerationError, match="vocabulary"):
        check_request(decoder, VOCAB, [1, VOCAB], 5)
    for fresh in (decoder, make_decoder(_dense("alibi"))):
        with pytest.raises(RuntimeError, match="prefill"):
            fresh.step(torch.zeros(1, dtype=torch.long))
    learned = make_decoder(_dense("learned"))  # max_positions 64
    check_request(learned, VOCAB, [1] * 60, 5)  # reads positions 0..63
    with pytest.raises(GenerationError, match="max_positions=64"):
        check_request(learned, VOCAB, [1] * 60, 6)


def test_generation_stops_at_the_end_of_text_id() -> None:
    model = _regular(2, 1, "learned", "train", torch.float32)
    greedy = SamplingConfig(greedy=True)
    free = generate(model, [1, 2], 12, greedy)[0]
    eos = free[4]
    stopped = generate(model, [1, 2], 12, greedy, eos_id=eos)[0]
    assert stopped == free[:free.index(eos) + 1]


def test_perplexity_through_the_cached_decoder_equals_the_extrapolate_sweep(data_dir: Path, tmp_path: Path) -> None:
    """eval/extrapolate.py's sweep (non-overlapping windows of 32) against the same windows decoded token by token."""
    from regulargpt.evaluation.length_sweep import open_eval_split, sweep

    split = open_eval_split(data_dir, "val")
    for name, model_section in (("rgpt", {"chunk_size": 2, "thickness": 2, "depth_policy": "train"}),
                                ("alibi", {"architecture": "transformer", "position": "alibi", "n_layers": 2})):
        cfg = load_config_dict({"model": {"vocab_size": 512, "d_model": 32, "n_heads": 2, **model_section},
                                "data": {"path": str(data_dir), "seq_len": 16}})
        model = build_model(cfg.model).eval()
        save_model_file(tmp_path / f"{name}.pt", cfg, model)
        row = sweep([tmp_path / f"{name}.pt"], data_dir, "val", [32], tmp_path / f"out-{name}", tokens=96,
                    progress=False)[0]
        stream = torch.from_numpy(split.tokens[:97].astype("int64"))
        windows = stream[:96].view(3, 32), stream[1:97].view(3, 32)  # inputs, targets
        logits = teacher_forced_logits(make_decoder(model), windows[0], 1)  # (3, 32, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), windows[1].flatten()).item()
        assert row["tokens"] == 96
        assert math.isclose(nll, row["nll"], rel_tol=1e-5), (name, nll, row["nll"])


@pytest.mark.parametrize("name", ["train", "per_position", "alibi"])
def test_fill_random_leaves_the_caches_a_real_prefill_leaves(name: str) -> None:
    """The benchmark's shortcut: the same cache sizes as a prefill of as many tokens, and decoding goes on from it."""
    model = _dense("alibi", torch.float32) if name == "alibi" else _regular(3, 2, "learned", name, torch.float32)
    tokens = torch.randint(0, VOCAB, (2, 50))
    real, fake = make_decoder(model), make_decoder(model)
    real.prefill(tokens, reserve=60)
    fake.fill_random(50, 2, reserve=60)
    assert fake.length == real.length == 50 and fake.cache_bytes == real.cache_bytes
    for _ in range(10):
        real.step(tokens[:, 0])
        assert fake.step(tokens[:, 0]).shape == (2, VOCAB)
    assert fake.cache_bytes == real.cache_bytes
