"""The CUDA-only branches of the dense baselines' attention (regulargpt/model/dense_attention.py) compute the same
function as the CPU paths, checked on CPU: FlexAttention's forward (torch's eager implementation, which runs on CPU
without gradients) against the query-chunked path, and the gradients of the score_mod formulation (the distance
table the kernel indexes) against the full bias in fp64, for every registered attention bias."""

from __future__ import annotations

import math

import pytest
import torch

from regulargpt.model import ATTENTION_BIASES
from regulargpt.model.dense_attention import (
    attention_backend,
    causal_attention,
    distance_table,
    flex_causal_attention,
)

BIASES = sorted(ATTENTION_BIASES)


def _bias(name: str, heads: int) -> torch.nn.Module:
    torch.manual_seed(1)
    module = ATTENTION_BIASES[name](heads)
    with torch.no_grad():  # learned parameters away from their initial values
        for p in module.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return module.double()


def test_dispatch():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert attention_backend(cpu, 64, 64, True) == "chunked" and attention_backend(cpu, 64, 64, False) == "sdpa-causal"
    assert attention_backend(cuda, 64, 64, False) == "sdpa-causal"  # RoPE, NoPE: SDPA's flash kernel in bf16
    assert attention_backend(cuda, 1, 64, True) == "chunked" and attention_backend(cuda, 1, 64, False) == "sdpa-mask"
    from regulargpt.model.flex_sliding import flex_available

    assert attention_backend(cuda, 64, 64, True) == ("flex" if flex_available() else "chunked")


@pytest.mark.parametrize("name", BIASES)
def test_distance_table_is_the_bias_and_carries_its_gradient(name):
    """table[h, m − n] = bias(m, n)[h] for every m >= n, and Σ w·bias over the causal triangle has the same
    parameter gradient through the table (the biases depend on the distance only)."""
    t, heads = 23, 3
    bias = _bias(name, heads)
    positions = torch.arange(t)
    full = bias(positions, positions)  # (H, T, T)
    table = distance_table(bias, t, torch.device("cpu"))  # (H, T)
    distance = (positions[:, None] - positions[None, :]).clamp(min=0)
    causal = positions[:, None] >= positions[None, :]
    gathered = table[:, distance]  # (H, T, T)
    assert torch.allclose(gathered[:, causal], full[:, causal].float(), rtol=1e-6, atol=1e-6)
    params = list(bias.parameters())
    if params:
        w = torch.randn(heads, t, t, dtype=torch.float64)
        want = torch.autograd.grad((full * w)[:, causal].sum(), params)
        got = torch.autograd.grad((table.double()[:, distance] * w)[:, causal].sum(), params)
        for g1, g2 in zip(got, want):
            assert torch.allclose(g1, g2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", BIASES)
def test_flex_forward_on_cpu_matches_the_chunked_path(name):
    t, heads = 37, 2
    bias = _bias(name, heads).float()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, heads, t, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        want = causal_attention(q, k, v, bias, memory_mb=1)  # several query chunks
        got = flex_causal_attention(q, k, v, bias, compiled=False)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("name", BIASES)
def test_score_mod_gradients_match_the_explicit_path_in_fp64(name):
    """The function FlexAttention differentiates on CUDA — softmax(q·k/√Dh + table[h, m − n]) under the causal mask
    — written out in fp64: its gradients (q, k, v, the bias parameters) equal the chunked path's."""
    t, heads = 19, 2
    bias = _bias(name, heads)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, heads, t, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    positions = torch.arange(t)
    distance = (positions[:, None] - positions[None, :]).clamp(min=0)
    future = positions[None, :] > positions[:, None]
    table = distance_table(bias, t, torch.device("cpu")).double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(8) + table[:, distance]
    flex_like = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
    explicit = causal_attention(q, k, v, bias, memory_mb=1)
    leaves = [q, k, v, *bias.parameters()]
    w = torch.randn_like(explicit)
    got = torch.autograd.grad((flex_like * w).sum(), leaves)
    want = torch.autograd.grad((explicit * w).sum(), leaves)
    assert torch.allclose(flex_like, explicit, rtol=1e-6, atol=1e-6)
    for g1, g2 in zip(got, want):
        assert torch.allclose(g1, g2, rtol=1e-5, atol=1e-6)


def test_a_flex_build_failure_under_an_outer_compile_is_retried_with_small_tiles(monkeypatch):
    """issue 39 §6: under train.compile the biased baselines' FlexAttention call sat inside the outer compiled graph,
    so a kernel that failed to build (Triton shared memory on an H200) was raised by the outer compile, past the
    except and the small-tile retry. A backend that refuses flex_attention with the default tiles ("out of
    resource", as inductor did) compiles both the outer function and FlexAttention: the outer graph must not hold
    the flex call, the retry must take the small tiles, and the output must equal the chunked path."""
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention.flex_attention import flex_attention

    from regulargpt.model import dense_attention, flex_sliding

    seen: list[object] = []

    def picky(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        for node in gm.graph.nodes:
            if node.target is flex_hop:
                options = next(a for a in node.args if isinstance(a, dict))  # kernel_options (with torch's defaults)
                seen.append(options.get("BLOCK_M"))
                if options.get("BLOCK_M") != flex_sliding._SMALL_TILES["BLOCK_M"]:
                    raise RuntimeError("out of resource: shared memory, Required: 245760 Hardware limit: 232448")
        return gm.forward

    monkeypatch.setattr(flex_sliding, "_kernel_options", None)
    monkeypatch.setattr(flex_sliding, "_compiled_flex", lambda: torch.compile(flex_attention, backend=picky,
                                                                              dynamic=False))
    monkeypatch.setattr(flex_sliding, "_compiled_flex_dynamic",  # the no-gradient (evaluation) compile
                        lambda: torch.compile(flex_attention, backend=picky, dynamic=True))
    monkeypatch.setattr(dense_attention, "attention_backend", lambda *args: "flex")
    monkeypatch.setattr(dense_attention, "_flex_failed", [])
    torch._dynamo.reset()
    bias = _bias("alibi", 2).float()
    q, k, v = torch.randn(3, 1, 2, 16, 8).unbind(0)
    with torch.no_grad():
        out = torch.compile(lambda q, k, v: causal_attention(q, k, v, bias) * 2, backend=picky)(q, k, v)
    monkeypatch.setattr(dense_attention, "attention_backend", lambda *args: "chunked")
    want = causal_attention(q, k, v, bias) * 2
    torch._dynamo.reset()
    assert dense_attention._flex_failed == [] and seen[-1] == 64 and None in seen, (seen, dense_attention._flex_failed)
    assert torch.allclose(out, want, atol=1e-5)


def _explicit_flex(q, k, v, score_mod, block_mask, dynamic=False, return_lse=False, kernel_options=None):
    """FlexAttention's contract written out (causal mask, score_mod on every score, natural-log lse), with
    gradients on CPU: the stand-in for the CUDA kernel in the tests below."""
    b, h, t, dh = q.shape
    heads = torch.arange(h)[:, None, None]
    rows, cols = torch.arange(t)[:, None], torch.arange(t)[None, :]
    scores = score_mod(q @ k.transpose(-1, -2) / math.sqrt(dh), None, heads, rows, cols)
    scores = scores.masked_fill(cols > rows, float("-inf"))
    _explicit_flex.read_detached = not score_mod(torch.zeros(()), None, heads, rows, cols).requires_grad
    out = scores.softmax(-1) @ v
    return (out, torch.logsumexp(scores, -1)) if return_lse else out


@pytest.mark.parametrize("t, buckets, max_distance", [(37, 8, 12), (150, 32, 128), (40, 8, 64)])
def test_t5_gradient_from_the_band_equals_the_chunked_path(monkeypatch, t, buckets, max_distance):
    """T5 through the flex route reads its distance table detached and gets the table's gradient from the band of
    distances < max_distance (near_bias): q, k, v and bucket-table gradients equal the chunked path's in fp64. At
    T <= max_distance (the last case) the table is read with its gradient, as before."""
    from regulargpt.model import flex_sliding
    from regulargpt.model.position import T5Bias

    monkeypatch.setattr(flex_sliding, "run_compiled_flex", _explicit_flex)
    torch.manual_seed(3)
    bias = T5Bias(3, buckets, max_distance, init_std=0.5).double()
    q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    got = flex_causal_attention(q, k, v, bias)
    assert _explicit_flex.read_detached == (t > max_distance)
    want = causal_attention(q, k, v, bias, memory_mb=1)
    leaves = [q, k, v, bias.table]
    w = torch.randn_like(want)
    for g1, g2 in zip(torch.autograd.grad((got * w).sum(), leaves), torch.autograd.grad((want * w).sum(), leaves)):
        # T5Bias reads its table in fp32 (position.py): its gradient sums fp32 terms in another order
        tol = {"rtol": 1e-5, "atol": 1e-6} if g1.shape == bias.table.shape else {"rtol": 1e-9, "atol": 1e-11}
        assert torch.allclose(g1, g2, **tol), (g1 - g2).abs().max()
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-11)


def test_near_bias_gradient_hand_computed():
    """W = 2, one head, T = 3, q = k = 0 (uniform logits but for the bias), v = e_0, dO = e_0: row m's
    probabilities are softmax of the table over its visible distances, dS = P(v_n·e_0 − Σ P v·e_0)."""
    from regulargpt.model.near_bias import near_bias_gradient

    table = torch.tensor([[0.0, math.log(2.0), 5.0]])  # Δ = 0, 1 (and 2: outside the window)
    q = k = torch.zeros(1, 1, 3, 2)
    v = torch.tensor([[[[1.0, 0.0], [0.0, 0.0], [1.0, 0.0]]]])  # v_n · e_0 = 1, 0, 1
    dout = torch.tensor([[[[1.0, 0.0]]]]).expand(1, 1, 3, 2)
    # row 0: P = [1]; row 1: keys 1, 0 at Δ 0, 1: P = [1/3, 2/3]; row 2: keys 2, 1, 0 at Δ 0, 1, 2: P ∝ [1, 2, e^5]
    z = 3.0 + math.exp(5.0)
    lse = torch.tensor([[[0.0, math.log(3.0), math.log(z)]]])
    p2 = torch.tensor([1.0, 2.0, math.exp(5.0)]) / z
    out = torch.tensor([[[[1.0, 0.0], [2 / 3, 0.0], [float(p2[0] + p2[2]), 0.0]]]])
    # dS row 0: 1·(1 − 1) = 0; row 1: Δ0 (key 1, v·e0 = 0): 1/3·(0 − 2/3), Δ1 (key 0, 1): 2/3·(1 − 2/3)
    # row 2: Δ0 (key 2, 1): p·(1 − o), Δ1 (key 1, 0): p·(0 − o), o = out[2]
    o2 = float(p2[0] + p2[2])
    want = torch.tensor([[-2 / 9 + float(p2[0]) * (1 - o2), 2 / 9 + float(p2[1]) * (0 - o2)]])
    got = near_bias_gradient(q, k, v, out, lse, dout, table, 2)
    assert torch.allclose(got, want, atol=1e-6), (got, want)


def test_an_evaluation_sweep_compiles_flex_at_most_twice(monkeypatch):
    """Without gradients the biased baselines' FlexAttention is one shape-generic compile: ALiBi and KERPLE at
    lengths 256 … 640 and batch sizes 1 … 3 (an evaluation sweep's last partial batches) compile it at most twice
    (batch 1 is its own), counted by dynamo's own counters, and every output equals the chunked path. (A length
    of one 128-query block, T <= 128, is a third: dynamo specialises a size-1 block-mask dimension.)"""
    from torch._dynamo.utils import counters

    from regulargpt.model import dense_attention

    monkeypatch.setattr(dense_attention, "attention_backend", lambda *args: "flex")
    monkeypatch.setattr(dense_attention, "_flex_failed", [])
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(4)
    for name in ("alibi", "kerple_log"):
        bias = _bias(name, 2).float()
        for batch, t in [(3, 256), (2, 384), (3, 640), (1, 256), (2, 512), (1, 384)]:
            q, k, v = (torch.randn(batch, 2, t, 16, generator=g) for _ in range(3))
            with torch.no_grad():
                got = causal_attention(q, k, v, bias)
            monkeypatch.setattr(dense_attention, "attention_backend", lambda *args: "chunked")
            with torch.no_grad():
                want = causal_attention(q, k, v, bias)
            monkeypatch.setattr(dense_attention, "attention_backend", lambda *args: "flex")
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), (name, batch, t, (got - want).abs().max())
    compiles = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert dense_attention._flex_failed == []
    assert 1 <= compiles <= 2, compiles
