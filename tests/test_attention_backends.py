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
