"""Dense biased attention (ALiBi, T5, KERPLE): the chunked fast paths against a row-by-row reference, outputs and
gradients; the per-pass bias blocks are computed once and stay within their memory budget."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from regulargpt.config import ModelConfig
from regulargpt.model import build_model
from regulargpt.model.dense_attention import CausalBias, causal_attention
from regulargpt.model.position import ATTENTION_BIASES

BIASES = sorted(ATTENTION_BIASES)


def _bias(name: str, heads: int) -> nn.Module:
    torch.manual_seed(1)
    module = ATTENTION_BIASES[name](heads)
    for p in module.parameters():  # visible, non-trivial learned biases (T5's init is 0.02-small)
        nn.init.uniform_(p, 0.1, 1.5)
    return module


def _reference(q: Tensor, k: Tensor, v: Tensor, bias: nn.Module) -> Tensor:
    """One query row at a time: softmax over keys 0..m of q_m·k_n/sqrt(Dh) + b(m, n), in q's dtype."""
    tq, tk, dh = q.shape[2], k.shape[2], q.shape[3]
    rows = []
    for i in range(tq):
        m = tk - tq + i  # absolute position of query row i
        logits = torch.einsum("bhd,bhnd->bhn", q[:, :, i], k[:, :, : m + 1]) / math.sqrt(dh)
        logits = logits + bias(torch.tensor([m]), torch.arange(m + 1)).to(q.dtype)[:, 0]  # (H, m+1)
        rows.append(torch.einsum("bhn,bhnd->bhd", logits.softmax(-1), v[:, :, : m + 1]))
    return torch.stack(rows, dim=2)


def _grads(fn, q: Tensor, k: Tensor, v: Tensor, bias: nn.Module, weight: Tensor) -> list[Tensor]:
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    bias.zero_grad(set_to_none=True)
    out = fn(*leaves, bias)
    (out * weight).sum().backward()
    return [out.detach(), *(x.grad for x in leaves), *(p.grad for p in bias.parameters())]


@pytest.mark.parametrize("name", BIASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("tk,tq,memory_mb", [(1, 1, 256), (37, 37, 1), (37, 37, 256), (64, 64, 1), (50, 7, 1),
                                             (50, 1, 256), (129, 129, 1)])
def test_outputs_and_gradients_match_the_row_by_row_reference(name, dtype, tol, tk, tq, memory_mb):
    """Chunks that do not divide T (memory_mb=1: a few rows each), fewer queries than keys (the decoding cache).

    The bias modules compute in fp32 whatever the input dtype, so gradients of their parameters, and for KERPLE-power
    (vectorised fp32 pow over a block vs its scalar tail over a row: 1 ulp of the bias) everything, agree to fp32
    rounding; the rest to `tol`."""
    torch.manual_seed(0)
    bias = _bias(name, 3).to(dtype)
    q = torch.randn(2, 3, tq, 8, dtype=dtype)
    k, v = (torch.randn(2, 3, tk, 8, dtype=dtype) for _ in range(2))
    weight = torch.randn(2, 3, tq, 8, dtype=dtype)
    got = _grads(lambda *a: causal_attention(*a, memory_mb=memory_mb), q, k, v, bias, weight)
    want = _grads(_reference, q, k, v, bias, weight)
    tol = max(tol, 2e-5) if name == "kerple_power" else tol
    for g, w in zip(got[:4], want[:4], strict=True):  # output, dq, dk, dv
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)
    for g, w in zip(got[4:], want[4:], strict=True):  # bias parameters
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", BIASES)
def test_under_autocast_the_mask_stays_fp32(name):
    """bf16 products, fp32 bias and softmax: as close to the fp64 truth as bf16 inputs allow, gradients fp32."""
    torch.manual_seed(0)
    bias = _bias(name, 4)
    q, k, v = (torch.randn(2, 4, 48, 16, requires_grad=True) for _ in range(3))
    truth = _reference(*(x.detach().bfloat16().double() for x in (q, k, v)), bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = causal_attention(q, k, v, bias)
    assert out.dtype == torch.bfloat16
    assert (out.double() - truth).abs().max() < 2e-2  # one bf16 rounding of probabilities and output
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32


class _CountingBias(nn.Module):
    """ALiBi-like b(Δ) = −Δ/2 for every head, counting its calls."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads, self.calls = heads, 0

    def forward(self, query_pos: Tensor, key_pos: Tensor) -> Tensor:
        self.calls += 1
        return -0.5 * (query_pos[:, None] - key_pos[None, :]).float()[None].expand(self.heads, -1, -1)


def test_for_pass_memoises_the_chunks_that_fit_the_budget():
    """memory_mb=1, B=1, H=2, T=800: query chunks of 2^20 // (3·4·2·800) = 54 rows; the fp32 blocks (2, 54, stop)
    are kept while their running total stays within 1 MiB, the later ones are computed on every call."""
    counting = _CountingBias(2)
    cpu = torch.device("cpu")
    blocks = CausalBias.for_pass(counting, 1, 2, 800, 1, cpu, torch.float32)
    kept, used = 0, 0
    for start in range(0, 800, 54):
        used += 2 * (min(800, start + 54) - start) * min(800, start + 54) * 4
        if used > 1 << 20:
            break
        kept += 1
    assert counting.calls == kept and 0 < kept < 15
    first = blocks.block(0, 54, cpu, torch.float32)
    assert blocks.block(0, 54, cpu, torch.float32) is first and counting.calls == kept
    blocks.block(756, 800, cpu, torch.float32)  # past the budget: computed on each call
    blocks.block(756, 800, cpu, torch.float32)
    assert counting.calls == kept + 2


def test_bias_blocks_hand_computed():
    blocks = CausalBias(_CountingBias(1))
    got = blocks.block(2, 4, torch.device("cpu"), torch.float32)[0]
    inf = float("inf")
    assert got.tolist() == [[-1.0, -0.5, 0.0, -inf], [-1.5, -1.0, -0.5, 0.0]]


def _no_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's per-pass CausalBias memoises nothing: each layer computes its own blocks."""
    monkeypatch.setattr(CausalBias, "for_pass", lambda bias, *args: CausalBias(bias))


@pytest.mark.parametrize("budget,calls_per_pass", [(True, 1), (False, 3)])
def test_a_forward_pass_computes_the_bias_once_within_the_budget(monkeypatch, budget, calls_per_pass):
    """Within attention_memory_mb the 3 layers share one bias block; with no budget each layer computes its own."""
    cfg = ModelConfig(architecture="transformer", position="alibi", vocab_size=11, d_model=16, n_heads=2, n_layers=3)
    model = build_model(cfg).double()
    counting = _CountingBias(2)
    model.bias = counting
    if not budget:
        _no_budget(monkeypatch)
    model(torch.randint(0, 11, (2, 20)))
    assert counting.calls == calls_per_pass


def test_shared_blocks_give_the_same_model_gradients_as_per_layer_bias(monkeypatch):
    """KERPLE-log model: memoised blocks (one bias graph, gradients summed over layers) = a fresh bias per layer."""
    cfg = ModelConfig(architecture="transformer", position="kerple_log", vocab_size=11, d_model=16, n_heads=2,
                      n_layers=3)
    torch.manual_seed(0)
    model = build_model(cfg).double()
    tokens = torch.randint(0, 11, (2, 30))

    def grads() -> list[Tensor]:
        model.zero_grad(set_to_none=True)
        model(tokens).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    shared = grads()
    _no_budget(monkeypatch)
    per_layer = grads()
    for (name, _), a, b in zip(model.named_parameters(), shared, per_layer, strict=True):
        tol = 1e-5 if name.startswith("bias.") else 1e-12  # fp32 bias: its gradient summed in another order
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("position", ["alibi", "t5"])
def test_activation_checkpointing_recomputes_with_the_shared_blocks(position):
    """Checkpointed layers re-run attention with the pass's memoised bias blocks: same gradients as without."""
    from regulargpt.train.engine import apply_activation_checkpointing

    cfg = ModelConfig(architecture="transformer", position=position, vocab_size=11, d_model=16, n_heads=2, n_layers=3)
    torch.manual_seed(0)
    plain = build_model(cfg).double()
    checkpointed = build_model(cfg).double()
    checkpointed.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(checkpointed) == 3
    tokens = torch.randint(0, 11, (2, 25))
    for model in (plain, checkpointed):
        model(tokens).square().sum().backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)
