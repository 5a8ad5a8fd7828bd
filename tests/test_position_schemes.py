"""FIRE, xPos and Sandwich against their papers' formulas, computed by hand or by a few lines of numpy written from
the formula (never the modules' own output); plus length consistency and bounded numerics at long lengths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from regulargpt.config import ConfigError, ModelConfig
from regulargpt.model import build_model
from regulargpt.model.fire import FireBias
from regulargpt.model.position import SandwichBias, XPosEmbedding

# --------------------------------------------------------------------------------------------------------- Sandwich


def test_sandwich_hand_value_at_dim_2():
    """d' = 2, H = 8: head 1 divides by 8·1/8 = 1, so b(Δ) = cos(Δ/10000^(2/2)) − 1 = cos(Δ/10000) − 1; head 8 by 8."""
    bias = SandwichBias(8, dim=2)(torch.tensor([5000]), torch.tensor([0, 5000]))
    assert bias[0, 0].tolist() == pytest.approx([math.cos(0.5) - 1.0, 0.0], abs=1e-7)
    assert bias[7, 0, 0].item() == pytest.approx((math.cos(0.5) - 1.0) / 8, abs=1e-7)


def test_sandwich_against_numpy_inner_product_of_sinusoidal_vectors():
    """b_h(m, n) = (p_m·p_n − d'/2) / (8h/H) with p = [sin(p·ω_i), cos(p·ω_i)], ω_i = 10000^(−2i/d'), i = 1..d'/2."""
    heads, dim = 3, 16
    q, k = np.arange(90, 100), np.arange(0, 100)
    omega = 10000.0 ** (-2.0 * np.arange(1, dim // 2 + 1) / dim)

    def emb(p: np.ndarray) -> np.ndarray:
        return np.concatenate([np.sin(p[:, None] * omega), np.cos(p[:, None] * omega)], axis=1)

    inner = emb(q) @ emb(k).T - dim / 2  # (Tq, Tk)
    want = np.stack([inner / (8 * h / heads) for h in range(1, heads + 1)])
    got = SandwichBias(heads, dim)(torch.tensor(q), torch.tensor(k)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)
    causal = got[:, q[:, None] >= k[None, :]]
    assert causal.max() <= 1e-6  # <= 0 on every visible key, 0 at Δ = 0


# ------------------------------------------------------------------------------------------------------------- FIRE


def test_fire_hand_values_with_an_identity_mlp():
    """c = 1, L = 2, f_θ(x) = relu(x): query 3, keys 0/2/3 → ψ(3)/ψ(3) = 1, ψ(1)/ψ(3) = log 2/log 4 = 0.5, 0;
    query 1, key 0 → ψ(1)/ψ(max(2, 1)) = log 2 / log 3 (below the threshold the normaliser is ψ(L))."""
    fire = FireBias(1, width=1, init_c=1.0, init_threshold=2.0)
    with torch.no_grad():
        for layer in (fire.mlp[0], fire.mlp[2]):
            layer.weight.fill_(1.0)
            layer.bias.zero_()
    b = fire(torch.tensor([1, 3]), torch.tensor([0, 2, 3]))[0]
    assert b[1].tolist() == pytest.approx([1.0, 0.5, 0.0], abs=1e-5)
    assert b[0, 0].item() == pytest.approx(math.log(2) / math.log(3), abs=1e-5)


def test_fire_against_numpy_formula_with_random_weights():
    """b_h(i, j) = W2·relu(W1·x + b1) + b2 at x = log(1 + c(i − j)) / log(1 + c·max(L, i)), read off the weights."""
    torch.manual_seed(0)
    fire = FireBias(4, width=32, init_c=0.3, init_threshold=20.0)
    with torch.no_grad():
        fire.threshold_scale.fill_(1.5)  # L = 30
    q, k = np.arange(0, 64), np.arange(0, 64)
    w1, b1 = fire.mlp[0].weight.detach().numpy()[:, 0], fire.mlp[0].bias.detach().numpy()
    w2, b2 = fire.mlp[2].weight.detach().numpy(), fire.mlp[2].bias.detach().numpy()
    rel = np.abs(0.3 * (q[:, None] - k[None, :]))
    x = np.log1p(rel) / (np.log1p(0.3 * np.maximum(q, 30.0))[:, None] + 1e-6)  # (Tq, Tk)
    hidden = np.maximum(x[..., None] * w1 + b1, 0.0)  # (Tq, Tk, 32)
    want = np.einsum("qkw,hw->hqk", hidden, w2) + b2[:, None, None]
    got = fire(torch.tensor(q), torch.tensor(k)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_fire_gradient_reaches_c_threshold_and_mlp():
    fire = FireBias(2, init_threshold=4.0)
    fire(torch.arange(10), torch.arange(10)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in fire.parameters())


# ------------------------------------------------------------------------------------------------------------- xPos


def _xpos_logits_numpy(q: np.ndarray, k: np.ndarray, n: np.ndarray, m: np.ndarray, base: float = 10000.0,
                       gamma: float = 0.4, scale_base: float = 512.0) -> np.ndarray:
    """Σ_i ζ_i^((n−m)/B) · [(q0 k0 + q1 k1) cos((n−m)θ_i) + (q0 k1 − q1 k0) sin((n−m)θ_i)], pairs (2i, 2i+1)."""
    d = q.shape[-1]
    i = np.arange(d // 2)
    theta, zeta = base ** (-2.0 * i / d), (2.0 * i / d + gamma) / (1 + gamma)
    delta = (n[:, None] - m[None, :]).astype(np.float64)  # (Tq, Tk)
    q0, q1, k0, k1 = q[:, 0::2], q[:, 1::2], k[:, 0::2], k[:, 1::2]  # (T, d/2)
    dot = np.einsum("qi,ki->qki", q0, k0) + np.einsum("qi,ki->qki", q1, k1)
    cross = np.einsum("qi,ki->qki", q0, k1) - np.einsum("qi,ki->qki", q1, k0)
    angle = delta[..., None] * theta
    return (zeta ** (delta[..., None] / scale_base) * (dot * np.cos(angle) + cross * np.sin(angle))).sum(-1)


@pytest.mark.parametrize("key_start", [0, 3000])
def test_xpos_logits_against_numpy_formula(key_start: int):
    """The centre of each call cancels: keys at key_start.., any offset, give the paper's ζ^((n−m)/B) logits."""
    torch.manual_seed(0)
    d, tk, tq = 8, 40, 7
    q, k = torch.randn(1, 1, tq, d, dtype=torch.float64), torch.randn(1, 1, tk, d, dtype=torch.float64)
    rq, rk = XPosEmbedding(d, scale_base=16.0).rotate_pair(q, k, key_start)
    got = (rq[0, 0] @ rk[0, 0].T).numpy()
    pos = np.arange(key_start, key_start + tk)
    want = _xpos_logits_numpy(q[0, 0].numpy(), k[0, 0].numpy(), pos[-tq:], pos, scale_base=16.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_xpos_zeta_by_hand_and_finite_at_long_lengths():
    """d = 4, γ = 0.4: ζ = (0 + 0.4)/1.4, (0.5 + 0.4)/1.4. At T = 32768 with B = 512 the scaled q and k stay finite
    in fp32 and bf16 (centring keeps |exponent| <= T/(2B) = 32)."""
    xpos = XPosEmbedding(4)
    assert xpos.zeta.tolist() == pytest.approx([0.4 / 1.4, 0.9 / 1.4])
    t = 32768
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.ones(1, 1, t, 4, dtype=dtype)
        rq, rk = xpos.rotate_pair(x[:, :, -4:], x, 0)
        assert torch.isfinite(rq).all() and torch.isfinite(rk).all()


def test_rope_scaling_only_with_rope_and_fire_without_window():
    with pytest.raises(ConfigError, match=r"model\.rope_scaling.*position 'rope'"):
        ModelConfig(architecture="transformer", position="alibi", rope_scaling={"rope_type": "linear", "factor": 2})
    with pytest.raises(ConfigError, match=r"model\.window.*'fire'"):
        ModelConfig(architecture="transformer", position="fire", window=8)
    with pytest.raises(ConfigError, match="xpos.*even head dimension"):
        ModelConfig(architecture="transformer", position="xpos", d_model=12, n_heads=4)


# ------------------------------------------------------------------------------------------ the LM with each scheme


@pytest.mark.parametrize("position", ["fire", "xpos", "sandwich"])
def test_logits_of_a_prefix_do_not_depend_on_what_follows(position: str):
    """Length consistency: the first 20 logits of a 57-token input equal the logits of its 20-token prefix (fp64)."""
    torch.manual_seed(0)
    cfg = ModelConfig(architecture="transformer", position=position, vocab_size=11, d_model=16, n_heads=2,
                      n_layers=2, xpos_scale_base=8.0, fire_init_threshold=8.0, sandwich_dim=8,
                      attention_memory_mb=1)
    model = build_model(cfg).double().eval()
    tokens = torch.randint(0, 11, (2, 57))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:, :20]), model(tokens)[:, :20], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position", ["fire", "xpos", "sandwich"])
def test_no_parameter_is_0_dim_so_deepspeed_can_broadcast_it(position: str):
    """DeepSpeed's engine broadcasts every parameter as p.data.view(torch.uint8) at start-up, which a 0-dim float
    tensor refuses ("self.dim() cannot be 0"): FIRE's c and λ made launch/pretrain.py fail before its first step."""
    cfg = ModelConfig(architecture="transformer", position=position, vocab_size=11, d_model=16, n_heads=2,
                      n_layers=2, sandwich_dim=8)
    for name, p in build_model(cfg).named_parameters():
        assert p.dim() >= 1 and p.data.view(torch.uint8).numel() == 4 * p.numel(), name


@pytest.mark.parametrize("name", ["fire", "sandwich"])
def test_chunked_attention_with_the_bias_equals_a_dense_softmax_and_fire_never_takes_the_distance_table(name: str):
    """Queries in chunks (memory_mb=1 → several) against softmax(q·k/√d + b + causal mask) written out densely
    (fp64); FIRE's bias reads the query position, so the backend never picks FlexAttention's per-distance table."""
    from regulargpt.model.dense_attention import attention_backend, causal_attention

    torch.manual_seed(0)
    heads, t, d = 2, 300, 8
    bias = FireBias(heads, init_threshold=16.0) if name == "fire" else SandwichBias(heads, 16)
    q, k, v = (torch.randn(1, heads, t, d, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(t)
    with torch.no_grad():
        scores = q @ k.transpose(-1, -2) / math.sqrt(d) + bias(pos, pos).double()
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        want = scores.softmax(-1) @ v
        torch.testing.assert_close(causal_attention(q, k, v, bias, memory_mb=1), want)
    cuda = torch.device("cuda")
    assert attention_backend(cuda, t, t, True, getattr(bias, "distance_only", True)) == (
        "chunked" if name == "fire" else attention_backend(cuda, t, t, True))
