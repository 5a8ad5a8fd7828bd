"""The C++ operator's head sweep (sliding_dilated_cpu_sweep.h, on AVX-512 or AVX2 lanes; its backward with lanes
across chains, sliding_dilated_cpu_chain_lanes.h, on AVX2 at D >= 8) against the dense T×T
fp64 reference: every C and Dh it takes, dilations that make whole-step rings (G = D) and chain groups (G < D),
work-unit boundaries (2,048 positions at D = 1), the pads' gradients, bf16 / fp16 rows widened into the rings, and
the tiled kernel it replaces, forced on the same inputs."""

import itertools

import pytest
import torch

from regulargpt.kernels import sliding_dilated_cpp
from regulargpt.kernels.sliding_dilated_cpp import (chain_lanes, head_sweep, head_sweep_available, one_chain,
                                                    sliding_dilated_cpu, step_pairs)
from regulargpt.model.sliding_dilated import reference_sliding_dilated_attention

pytestmark = [
    pytest.mark.skipif(sliding_dilated_cpp.build_error() is not None, reason="the C++ kernel does not build"),
    pytest.mark.skipif(sliding_dilated_cpp.build_error() is None and not head_sweep_available(),
                       reason="this CPU has neither AVX-512 nor AVX2 + FMA + F16C: the operator runs the tiled kernel only"),
]


def _case(b, t, h, dh, c, pad, seed=0):
    """fp64 q, k, v (B, T, H, Dh) as views of one projection, r (H, C), pads (B, H, Dh) or Nones, dout."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, 3, h, dh, dtype=torch.float64, generator=g)
    r = torch.randn(h, c, dtype=torch.float64, generator=g) * 0.5
    pads = [torch.randn(b, h, dh, dtype=torch.float64, generator=g) for _ in range(2)] if pad else [None, None]
    return qkv, r, pads, torch.randn(b, t, h, dh, dtype=torch.float64, generator=g)


def _reference(qkv, r, pads, dout, dilation):
    """out and the gradients of (out · dout).sum() for qkv, r, pads (fp64, dense T×T softmax)."""
    leaves = [x.clone().requires_grad_() for x in (qkv, r, *pads) if x is not None]
    q, k, v = leaves[0].unbind(2)
    pk, pv = leaves[2:] if pads[0] is not None else (None, None)
    out = reference_sliding_dilated_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), leaves[1],
                                              dilation, pk, pv).transpose(1, 2)
    return [out.detach(), *torch.autograd.grad((out * dout).sum(), leaves)]


def _operator(qkv, r, pads, dout, dilation, dtype, head_major=False):
    """The same through the C++ operator with q, k, v, pads, dout in `dtype` and r in fp32; head_major: q, k, v
    stored (B, H, T, Dh), each head's rows adjacent (passed as (B, T, H, Dh) views), instead of one projection."""
    low = [x.detach().to(dtype) for x in (qkv, *pads) if x is not None]
    if head_major:
        low[0] = low[0].permute(0, 2, 3, 1, 4).contiguous()  # (B, T, 3, H, Dh) -> (B, 3, H, T, Dh)
    low = [x.requires_grad_() for x in low]
    r32 = r.float().requires_grad_()
    q, k, v = (x.transpose(1, 2) for x in low[0].unbind(1)) if head_major else low[0].unbind(2)
    assert q.stride(1) == (q.shape[-1] if head_major else 3 * q.shape[2] * q.shape[3])
    pk, pv = low[1:] if pads[0] is not None else (None, None)
    out = sliding_dilated_cpu(q, k, v, r32, dilation, pk, pv)
    assert out.dtype == dtype and out.shape == dout.shape
    grads = list(torch.autograd.grad((out.double() * dout).sum(), [low[0], r32, *low[1:]]))
    if head_major:
        grads[0] = grads[0].permute(0, 3, 1, 2, 4)  # back to (B, T, 3, H, Dh)
    return [out.detach(), *grads]


def _assert_close(got, want, tol, label):
    for name, g, w in zip(["out", "qkv", "rel_bias", "pad_k", "pad_v"], got, want):
        err = (g.double() - w).abs().max().item() / max(1.0, w.abs().max().item())
        assert err < tol, (label, name, err)


@pytest.mark.parametrize("c", [2, 4, 8, 16])
def test_fp32_every_chunk_and_head_dim_against_dense_reference(c):
    """Dh = 16, 32, 64, 128 (NV = 1, 2, 4, 8 vectors per row); D = 1 (one chain), 3 (T not a multiple of D),
    C (whole-step rings at C <= 8, chain groups at C = 16) and C² (chain groups: the rings hold G < D chains, the
    last group narrower); T = 1 and T < D (keys absent everywhere); pads and masks."""
    for dh, dilation, t, pad in itertools.product((16, 32, 64, 128), sorted({1, 3, c, c * c}), (1, 5, 301),
                                                   (True, False)):
        if dh in (32, 128) and dilation not in (1, c):
            continue  # the wide and narrow rows at the two common dilations keep the test short
        case = _case(1, t, 2, dh, c, pad, seed=t + dh)
        _assert_close(_operator(*case, dilation, torch.float32), _reference(*case, dilation), 1e-5,
                      (c, dh, dilation, t, pad))


def test_work_unit_boundaries_and_batches():
    """T = 4,500 at D = 1 spans three units of 2,048 steps (dk, dv of a unit's last keys gathered from queries it
    recomputes; dr and the pads summed over units in order); D = 8 at C = 8 and D = 16 at C = 16 across units of
    256 and 1,024 steps; B = 2 (the pads' gradients per batch)."""
    for c, dilation, t, b in [(4, 1, 4500, 1), (8, 8, 2100, 2), (16, 16, 2100, 1)]:
        case = _case(b, t, 1, 16, c, True, seed=c)
        _assert_close(_operator(*case, dilation, torch.float32), _reference(*case, dilation), 1e-5, (c, dilation, t))


@pytest.mark.parametrize("pad", [True, False])
def test_backward_lanes_across_chains_partial_panels_and_groups(pad):
    """At D >= 8 on AVX2 the backward puts 8 chains in the lanes of a vector (sliding_dilated_cpu_chain_lanes.h):
    D = 12 leaves a second panel of 4 chains; T not a multiple of D leaves the last step's lanes past T (zero rows,
    and keys whose last queries lie past T gathered at the end); D = 128 at C = 8 and D = 16 at C = 16 split the
    chains into groups of 16 and 8; D = 40 at C = 2 has 5 panels; T = 2100 at D = 8 crosses a unit boundary."""
    for c, dilation, t, dh in [(8, 12, 301, 64), (4, 8, 333, 32), (2, 40, 500, 16), (8, 128, 1500, 64),
                               (16, 16, 700, 64), (8, 8, 2100, 16)]:
        case = _case(1, t, 2, dh, c, pad, seed=t + c)
        _assert_close(_operator(*case, dilation, torch.float32), _reference(*case, dilation), 1e-5,
                      (c, dilation, t, dh))


@pytest.mark.parametrize("pad", [True, False])
def test_forward_step_pairs_match_the_reference_and_the_lone_queries_bit_for_bit(pad):
    """The forward takes a chain's queries at steps u and u + 1 together (scores_pair, combine_pair) once all their
    keys are present: the first C - 1 steps and a unit's odd last step run alone, and at T = 700, D = 16 the last
    step's chains past T leave step u's queries without a partner; T = 2100 at D = 1 crosses a unit boundary (2048
    positions), whose warm-up steps hold keys only. Outputs match the dense reference and, bit for bit, the forward
    with `step_pairs(False)` (the same sums in the same order)."""
    for c, dilation, t, dh in [(4, 3, 301, 32), (16, 16, 700, 64), (8, 1, 2100, 16), (2, 5, 99, 64), (8, 8, 517, 128)]:
        case = _case(1, t, 2, dh, c, pad, seed=t + c)
        paired = _operator(*case, dilation, torch.float32)
        _assert_close(paired, _reference(*case, dilation), 1e-5, (c, dilation, t, dh))
        with step_pairs(False):
            alone = _operator(*case, dilation, torch.float32)
        assert torch.equal(paired[0], alone[0]), (c, dilation, t, dh)


@pytest.mark.parametrize("pad", [True, False])
def test_backward_step_pairs_match_the_reference_and_the_lone_queries_bit_for_bit(pad):
    """The row backward (chain lanes off, as on AVX-512) takes steps u and u + 1 together once their keys are
    present: their dP, dq and the gathers of keys u - C + 1, u - C + 2 share rows, and step u + 1's dS joins dr after
    step u's. At T = 2100, D = 1 a pair would span a unit's last owned step and the recomputed ones after it (it
    runs alone); T = 700 at D = 16 ends in a partial step; a unit's first paired step gathers only its second key.
    Every gradient matches the dense reference and, bit for bit, the backward with `step_pairs(False)`."""
    for c, dilation, t, dh in [(4, 3, 301, 32), (16, 16, 700, 64), (8, 1, 2100, 16), (2, 5, 99, 64), (8, 8, 517, 128),
                               (4, 1, 4200, 16)]:
        case = _case(2, t, 2, dh, c, pad, seed=t + c)
        with chain_lanes(False):
            paired = _operator(*case, dilation, torch.float32)
            with step_pairs(False):
                alone = _operator(*case, dilation, torch.float32)
        _assert_close(paired, _reference(*case, dilation), 1e-5, (c, dilation, t, dh))
        for name, got, want in zip(["out", "qkv", "rel_bias", "pad_k", "pad_v"], paired, alone):
            assert torch.equal(got, want), (c, dilation, t, dh, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_one_chain_units_match_the_reference_and_the_ring_rules_units(dtype):
    """The one-chain units (on AVX-512 the forward at C = 16, both directions at C = 2, 4, 8 in a projection's layout)
    against the fp64 reference and against `one_chain(False)`, whose units take G chains by the rings' budget: each
    query's sums are the same, so out, dq, dk, dv are equal bit for bit; dr and the pads' gradients are sums over
    other units (close)."""
    cases = [(16, 16, 700, 64), (8, 8, 517, 64), (4, 3, 301, 32), (16, 256, 900, 16), (2, 5, 333, 64)]
    for c, dilation, t, dh in cases:
        qkv, r, pads, dout = _case(2, t, 2, dh, c, True, seed=c + dilation)
        rounded = [x.to(dtype).double() for x in (qkv, *pads)]
        case = (rounded[0], r.float().double(), rounded[1:], dout)
        got = _operator(*case, dilation, dtype)
        with one_chain(False):
            ring_rule = _operator(*case, dilation, dtype)
        _assert_close(got, _reference(*case, dilation), 2e-2 if dtype == torch.bfloat16 else 1e-5, (c, dilation))
        for name, a, b in zip(["out", "qkv"], got[:2], ring_rule[:2]):
            assert torch.equal(a, b), (c, dilation, name)
        for a, b in zip(got[2:], ring_rule[2:]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head_major", [False, True], ids=["projection", "head-major"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_rows_against_the_reference_of_their_rounded_values(dtype, head_major):
    """bf16 / fp16 rows are widened exactly into the fp32 rings; outputs are rounded once. Against the fp64
    reference of the same rounded inputs the error is the output rounding (2^-8 relative for bf16) and fp32 sums.
    Both layouts: on AVX-512 the backward at C = 2, 4, 8 walks one chain per unit in the projection's and whole steps
    where each head's rows are adjacent (head-major)."""
    for c, dilation, dh in [(2, 1, 64), (2, 7, 64), (4, 4, 64), (8, 8, 64), (16, 16, 32), (8, 64, 16), (4, 3, 32)]:
        qkv, r, pads, dout = _case(1, 300, 2, dh, c, True, seed=c)
        rounded = [x.to(dtype).double() for x in (qkv, *pads)]
        case = (rounded[0], r.float().double(), rounded[1:], dout)
        tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
        _assert_close(_operator(*case, dilation, dtype, head_major), _reference(*case, dilation), tol,
                      (c, dilation, dtype, head_major))


def test_tiled_kernel_forced_on_the_sweeps_geometries():
    """`head_sweep(False)` runs the tiled kernel on inputs the sweep would take: both match the reference, and the
    switch is back on after the block."""
    case = _case(1, 700, 2, 64, 8, True)
    want = _reference(*case, 8)
    with head_sweep(False):
        _assert_close(_operator(*case, 8, torch.float32), want, 1e-5, "tiles")
    _assert_close(_operator(*case, 8, torch.float32), want, 1e-5, "sweep")


@pytest.mark.parametrize("sweep", [True, False], ids=["head-sweep", "tiles"])
@pytest.mark.parametrize("pad", [True, False])
def test_saved_probabilities_are_per_head_rows_of_the_softmax(sweep, pad):
    """The forward's second output, the P the backward reads, is (B, H, Tq, C): P[b, h, i, j] the softmax weight of
    key i - j·D, from a per-(query, head) loop over the keys; an absent key (i - j·D < 0) scores the pad row, or has
    weight 0 without pads. Both implementations, which must agree on the layout the backward reads."""
    b, t, h, dh, c, dilation = 2, 37, 3, 16, 4, 3
    qkv, r, pads, _ = _case(b, t, h, dh, c, pad, seed=5)
    q, k, v = (x.float() for x in qkv.unbind(2))
    pk, pv = (x.float() if x is not None else None for x in pads)
    with head_sweep(sweep):
        _, probs = sliding_dilated_cpp.extension().forward(q, k, v, r.float(), pk, pv, dilation, 0, 1)
    assert probs.shape == (b, h, t, c) and probs.dtype == torch.float32
    want = torch.zeros(b, h, t, c, dtype=torch.float64)
    for bi, hi, i in itertools.product(range(b), range(h), range(t)):
        scores = []
        for j in range(c):
            key = k[bi, i - j * dilation, hi] if i - j * dilation >= 0 else (pk[bi, hi] if pad else None)
            scores.append(float(q[bi, i, hi].double() @ key.double()) / dh**0.5 + float(r[hi, j]) if key is not None
                          else float("-inf"))
        want[bi, hi, i] = torch.tensor(scores, dtype=torch.float64).softmax(0)
    torch.testing.assert_close(probs.double(), want, atol=1e-5, rtol=0)
