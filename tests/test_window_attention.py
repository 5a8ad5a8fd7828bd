"""The windowed dense baseline (model.window = W): the banded kernel against a dense masked reference (outputs and
gradients, W < T and W >= T), the model against independent truths (a one-layer model at position m equals the
full-attention model on the last W tokens; W >= T is the unwindowed model; the receptive field ends exactly at
n_layers·(W − 1) tokens back), ring-buffer decoding against the full forward, and the config's validation."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import Tensor, nn

from regulargpt.config import ConfigError, ModelConfig
from regulargpt.evaluation.probes import input_gradient_norms
from regulargpt.evaluation.receptive_field import receptive_field
from regulargpt.generation import SamplingConfig, generate, make_decoder, teacher_forced_logits
from regulargpt.model import build_model
from regulargpt.model.position import ATTENTION_BIASES
from regulargpt.model.window_attention import sliding_window_attention

BIASES = [None, *sorted(ATTENTION_BIASES)]
VOCAB = 19
POSITIONS = ["none", "sinusoidal", "learned", "rope", "alibi", "t5", "kerple_log", "kerple_power", "xpos", "sandwich"]
RELATIVE = ["none", "rope", "alibi", "t5", "kerple_log", "kerple_power",
            "sandwich"]  # signals that depend on m − n alone


def _bias(name: str | None, heads: int, dtype: torch.dtype) -> nn.Module | None:
    if name is None:
        return None
    torch.manual_seed(1)
    module = ATTENTION_BIASES[name](heads)
    for p in module.parameters():  # visible learned biases (T5's init is 0.02-small)
        nn.init.uniform_(p, 0.1, 1.5)
    return module.to(dtype)


def _dense_masked(q: Tensor, k: Tensor, v: Tensor, window: int, bias: nn.Module | None) -> Tensor:
    """The whole (Tq, Tk) score matrix, −inf outside first+i − W < n <= first+i; queries are the last Tq."""
    tq, tk = q.shape[2], k.shape[2]
    qpos, kpos = torch.arange(tk - tq, tk), torch.arange(tk)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if bias is not None:
        scores = scores + bias(qpos, kpos).to(scores.dtype)
    delta = qpos[:, None] - kpos[None, :]
    return scores.masked_fill((delta < 0) | (delta >= window), float("-inf")).softmax(-1) @ v


def _outputs_and_grads(fn, q: Tensor, k: Tensor, v: Tensor, bias: nn.Module | None, weight: Tensor) -> list[Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    if bias is not None:
        bias.zero_grad(set_to_none=True)
    out = fn(*leaves, bias)
    (out * weight).sum().backward()
    return [out.detach(), *(x.grad for x in leaves), *(() if bias is None else (p.grad for p in bias.parameters()))]


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("window", [1, 2, 5, 16, 37, 64])
@pytest.mark.parametrize("tk,tq,memory_mb", [(37, 37, 256), (37, 37, 0), (37, 1, 256), (37, 12, 0), (5, 5, 256)])
def test_kernel_equals_the_dense_masked_reference(name, window, tk, tq, memory_mb):
    """fp64, outputs and gradients of q, k, v and the bias's parameters; W < T (banded blocks, the last one padded;
    memory_mb=0: one block per chunk), W >= T (the dense path), fewer queries than keys (decoding, last_only)."""
    torch.manual_seed(0)
    bias = _bias(name, 3, torch.float64)
    q = torch.randn(2, 3, tq, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 3, tk, 8, dtype=torch.float64) for _ in range(2))
    weight = torch.randn(2, 3, tq, 8, dtype=torch.float64)
    got = _outputs_and_grads(lambda *a: sliding_window_attention(*a[:3], window, a[3], memory_mb), q, k, v, bias,
                             weight)
    want = _outputs_and_grads(lambda *a: _dense_masked(*a[:3], window, a[3]), q, k, v, bias, weight)
    # The bias modules compute in fp32 whatever the input: their parameters' gradients (and, for KERPLE-power's
    # vectorised pow, everything) agree to fp32 rounding, the rest to fp64's.
    tol = 2e-5 if name == "kerple_power" else 1e-10
    for g, w in zip(got[:4], want[:4], strict=True):  # output, dq, dk, dv
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    for g, w in zip(got[4:], want[4:], strict=True):
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["alibi", "t5"])
def test_kernel_never_asks_for_more_than_the_band_and_stays_fp32_under_autocast(name):
    """The bias is evaluated on the (W, 2W) band only, never on (T, T); bf16 autocast keeps it fp32 and the result
    within bf16 error of the fp64 truth."""
    torch.manual_seed(0)
    inner = _bias(name, 4, torch.float32)
    assert inner is not None
    shapes = []

    def bias(qp: Tensor, kp: Tensor) -> Tensor:
        out = inner(qp, kp)
        shapes.append((tuple(out.shape), out.dtype))
        return out

    q, k, v = (torch.randn(2, 4, 300, 16) for _ in range(3))
    with torch.no_grad():
        truth = _dense_masked(*(x.bfloat16().double() for x in (q, k, v)), 8, copy.deepcopy(inner).double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sliding_window_attention(q, k, v, 8, bias)
    assert shapes == [((4, 8, 16), torch.float32)]
    assert out.dtype == torch.bfloat16
    assert float((out.detach().double() - truth).abs().max()) < 0.03


def _model(position: str, window: int, n_layers: int = 2, dtype: torch.dtype = torch.float64) -> nn.Module:
    torch.manual_seed(3)
    cfg = ModelConfig(architecture="transformer", position=position, vocab_size=VOCAB, d_model=16, n_heads=2,
                      n_layers=n_layers, ffn_mult=2, max_positions=64, window=window)
    model = build_model(cfg).to(dtype).eval()
    for p in model.bias.parameters() if model.bias is not None else ():  # visible learned biases
        nn.init.uniform_(p, 0.1, 1.5)
    return model


@pytest.mark.parametrize("position", RELATIVE)
def test_one_layer_at_position_m_equals_full_attention_over_the_last_w_tokens(position):
    """A single windowed layer reads tokens m−W+1..m only; with a relative position signal its output there equals
    the full-attention model's last position on exactly those tokens (an independent computation)."""
    window = 6
    windowed, full = _model(position, window, n_layers=1), _model(position, 0, n_layers=1)
    full.load_state_dict(windowed.state_dict())
    tokens = torch.randint(0, VOCAB, (2, 30))
    with torch.no_grad():
        got = windowed(tokens)
        for m in (0, 3, window - 1, window, 17, 29):
            want = full(tokens[:, max(0, m - window + 1):m + 1])[:, -1]
            torch.testing.assert_close(got[:, m], want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position", POSITIONS)
def test_a_window_as_long_as_the_input_is_the_unwindowed_model(position):
    windowed, full = _model(position, 40), _model(position, 0)
    full.load_state_dict(windowed.state_dict())
    tokens = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        assert torch.equal(windowed(tokens), full(tokens))


@pytest.mark.parametrize("n_layers,window", [(1, 4), (3, 4), (2, 7)])
def test_receptive_field_ends_exactly_n_layers_times_w_minus_1_back(n_layers, window):
    """The last prediction depends on the last n_layers·(W − 1) + 1 tokens and on nothing older (gradient exactly
    0), the window analogue of RegularGPT's C^L_train under depth_policy='train'."""
    model = _model("alibi", window, n_layers)
    tokens = torch.randint(0, VOCAB, (3, 40))
    norms = input_gradient_norms(model, tokens, torch.randint(0, VOCAB, (3,)))  # (B, T)
    reach = n_layers * (window - 1) + 1
    assert bool((norms[:, : 40 - reach] == 0).all())
    assert bool((norms[:, 40 - reach:] > 0).all())
    rf = receptive_field(model, tokens, torch.randint(0, VOCAB, (3,)), batch_size=2)  # the analysis itself
    assert rf.reach(1.0) == reach and float(rf.cumulative[40 - reach]) == pytest.approx(1.0)


@pytest.mark.parametrize("position", POSITIONS)
def test_ring_buffer_decoding_equals_the_full_forward(position):
    """Every cached logit equals the full forward's (fp64, 1e-9 of the largest), for a prompt shorter than W and
    one longer (prefill through the banded kernel, then the ring)."""
    model = _model(position, 5)
    tokens = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        full = model(tokens)
    for prompt_length in (1, 3, 23):
        got = teacher_forced_logits(make_decoder(model), tokens, prompt_length)
        assert float((got - full).abs().max() / full.abs().max()) <= 1e-9, (position, prompt_length)


def test_the_cache_is_w_slots_per_layer_whatever_the_length():
    """2 (k, v) · n_layers · B · H · W · Dh fp32 values once W positions are decoded; the unwindowed cache grows.
    Greedy generation equals repeated argmax over full forwards."""
    model, b = _model("rope", 5, dtype=torch.float32), 3
    decoder = make_decoder(model)
    tokens = torch.randint(0, VOCAB, (b, 120))
    decoder.prefill(tokens[:, :1])
    sizes = []
    for t in range(1, 120):
        decoder.step(tokens[:, t])
        sizes.append(decoder.cache_bytes)
    bounded = 2 * 2 * b * 2 * 5 * 8 * 4
    assert set(sizes[4:]) == {bounded} and max(sizes) == bounded
    prompt = [3, 1, 4, 1, 5]
    got = generate(model, prompt, 20, SamplingConfig(greedy=True))
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(20):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert got == [ids[0, len(prompt):].tolist()]


@pytest.mark.parametrize("fields,message", [
    ({"architecture": "transformer", "window": -1}, "model.window: -1"),
    ({"architecture": "regular_gpt", "window": 64}, "model.window: 64 is not allowed; expected 0 for architecture"),
    ({"architecture": "transformer", "position": "xl_relative", "window": 8}, "xl_relative"),
])
def test_config_rejects_a_window_where_it_cannot_apply(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**fields)
    assert ModelConfig(architecture="transformer", position="rope", window=64).window == 64
