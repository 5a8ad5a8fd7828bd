"""The fused C++ CPU operator against the dense T×T reference (forward and every gradient), in its strided
(B, T, H, Dh) layout, with strided queries (tree mode) against chunk_attention's PyTorch path; determinism,
torch.library's opcheck, the model's eager route to the same extension (`cpu_operator`), the dispatch (no copies
around the call) and the fallback when it cannot be built."""

import itertools
import warnings

import pytest
import torch

from regulargpt.kernels import sliding_dilated_cpp
from regulargpt.kernels.sliding_dilated_cpp import sliding_dilated_cpu
from regulargpt.model import sliding_dilated
from regulargpt.model.cpu_operator import cpu_operator, projection_of
from regulargpt.model.regular_gpt import chunk_attention
from regulargpt.model.sliding_dilated import reference_sliding_dilated_attention, sliding_dilated_attention

pytestmark = pytest.mark.skipif(sliding_dilated_cpp.build_error() is not None, reason="the C++ kernel does not build")


def _packed(b, t, h, dh, c, pad, dtype, expand_pads=False):
    """q, k, v as views of one (B, T, 3, H, Dh) projection (non-contiguous), r (H, C), pads (B, H, Dh) or Nones."""
    qkv = torch.randn(b, t, 3, h, dh, dtype=dtype, requires_grad=True)
    r = (torch.randn(h, c, dtype=torch.promote_types(dtype, torch.float32)) * 0.5).requires_grad_()
    if not pad:
        return qkv, r, None, None
    if expand_pads:  # the model's layout: one pad per head, expand()ed along B (stride 0)
        base = [torch.randn(1, h, dh, dtype=dtype, requires_grad=True) for _ in range(2)]
        return qkv, r, *(x.expand(b, h, dh) for x in base)
    return qkv, r, *(torch.randn(b, h, dh, dtype=dtype, requires_grad=True) for _ in range(2))


def _leaves(qkv, r, pk, pv):
    return [x for x in (qkv, r, pk, pv) if x is not None]


def _check_against_reference(c, dilation, t, pad, dtype, tol, b=2, h=3, dh=8):
    qkv, r, pk, pv = _packed(b, t, h, dh, c, pad, dtype)
    q, k, v = qkv.unbind(2)  # each (B, T, H, Dh), strides (3·H·Dh·T, 3·H·Dh, Dh, 1)
    out = sliding_dilated_cpu(q, k, v, r, dilation, pk, pv)
    ref = reference_sliding_dilated_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), r, dilation,
                                              pk, pv).transpose(1, 2)  # (B, T, H, Dh)
    assert out.shape == (b, t, h, dh) and out.is_contiguous() and out.dtype == dtype
    assert (out - ref).abs().max() < tol, ("out", c, dilation, t, pad)
    weights = torch.randn_like(out)
    got = torch.autograd.grad((out * weights).sum(), _leaves(qkv, r, pk, pv))
    want = torch.autograd.grad((ref * weights).sum(), _leaves(qkv, r, pk, pv))
    for name, g, w in zip(["qkv", "rel_bias", "pad_k", "pad_v"], got, want):
        assert g.dtype == w.dtype and (g - w).abs().max() < tol * max(1.0, w.abs().max().item()), (name, c, dilation, t)


def _cases():
    for c in (2, 3, 4, 8):
        for dilation in sorted({1, c, c * c}):
            for t in sorted({1, c - 1, c + 1, c * c + 1, 3 * c * c - 1}):  # T < D, T not a multiple of D
                yield c, dilation, t


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_fp64_forward_and_every_gradient_match_dense_reference(pad):
    for c, dilation, t in _cases():
        _check_against_reference(c, dilation, t, pad, torch.float64, 1e-10)


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_fp32_within_1e5_of_reference(pad):
    for c, dilation, t in [(2, 1, 300), (3, 9, 100), (4, 16, 70), (8, 8, 300), (8, 64, 100)]:
        _check_against_reference(c, dilation, t, pad, torch.float32, 1e-5, dh=16)


def test_segments_longer_than_a_work_unit_and_wide_heads():
    """T = 600 at D = 1 spans three 256-row work units (dk/dv gathered across their boundaries); wide heads: Dh = 40
    is five steps of the fp64 dot product's two 4-lane accumulators."""
    for c, pad in itertools.product((2, 8), (True, False)):
        _check_against_reference(c, 1, 600, pad, torch.float64, 1e-10, b=1, h=2, dh=40)


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_keys_taken_four_at_a_time_and_rings_that_differ_between_forward_and_backward(pad):
    """The scores take the keys four at a time (sdvec::dots): C = 5 leaves one key to a single dot product, C = 16
    is four groups, and a chain's first steps have fewer keys (mask) than C. Rows of H·Dh = 256 fp64 (2 KiB): at
    C = 16 the forward's ring holds G = 4 chains, the backward's G = 1, so the two passes tile differently."""
    for c, dilation, t in [(5, 1, 301), (5, 5, 97), (5, 25, 130), (16, 1, 300), (16, 16, 301), (16, 256, 300)]:
        _check_against_reference(c, dilation, t, pad, torch.float64, 1e-10, b=1, h=2, dh=12)
    _check_against_reference(16, 16, 700, pad, torch.float64, 1e-10, b=1, h=4, dh=64)
    _check_against_reference(16, 16, 700, pad, torch.float32, 1e-5, b=1, h=4, dh=64)


@pytest.mark.parametrize("dh", [12, 20])
def test_head_dims_that_leave_a_partial_vector(dh):
    """Dh = 12, 20: 8 fp32 lanes leave a 4-wide tail in every load, dot, combine and store. T = 700 spans several
    work units and tiles (G neighbouring chains per tile; D = 3 and 16 leave a last step that straddles T; D = 16
    splits the chains over tiles of unequal width); the first C - 1 steps of each chain read the pad or end early."""
    for c, dilation, pad in [(2, 1, True), (3, 3, False), (4, 16, True), (8, 3, False)]:
        _check_against_reference(c, dilation, 700, pad, torch.float64, 1e-10, b=1, h=2, dh=dh)
        _check_against_reference(c, dilation, 700, pad, torch.float32, 1e-5, b=1, h=2, dh=dh)
    qkv, r, pk, pv = _packed(1, 130, 2, dh, 4, True, torch.float32)  # bf16 rows widened with a partial tail
    low = [x.detach().to(torch.bfloat16) for x in (qkv, pk, pv)]
    out = sliding_dilated_cpu(*low[0].unbind(2), r, 4, low[1], low[2])
    want = sliding_dilated_cpu(*low[0].float().unbind(2), r, 4, low[1].float(), low[2].float())
    assert out.dtype == torch.bfloat16 and (out.float() - want).abs().max() < 2e-2


def test_bf16_and_fp16_inputs_against_fp32():
    for dtype, c, dilation in itertools.product((torch.bfloat16, torch.float16), (2, 8), (1, 8)):
        qkv, r, pk, pv = _packed(2, 130, 2, 16, c, True, torch.float32)
        low = [x.detach().to(dtype).requires_grad_() for x in (qkv, pk, pv)]
        q, k, v = low[0].unbind(2)
        out = sliding_dilated_cpu(q, k, v, r, dilation, low[1], low[2])
        assert out.dtype == dtype
        want = sliding_dilated_cpu(*(x.float() for x in low[0].unbind(2)), r, dilation, low[1].float(), low[2].float())
        assert (out.float() - want).abs().max() < 2e-2
        weights = torch.randn_like(want)
        got = torch.autograd.grad((out.float() * weights).sum(), [*low, r])
        ref = torch.autograd.grad((want * weights).sum(), [*low, r])
        for g, w in zip(got, ref):
            assert (g.float() - w).abs().max() < 3e-2 * max(1.0, w.abs().max().item())


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_strided_queries_match_chunk_attention_torch_path(pad):
    """Tree mode: queries at (t−1) % C + i·C against chunk_attention's chunked einsums, forward and gradients."""
    for c, t in [(2, 1), (2, 7), (3, 9), (4, 13), (8, 40)]:
        nc = -(-t // c)
        q = torch.randn(2, 3, nc, 8, dtype=torch.float64, requires_grad=True)
        k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        r = torch.randn(3, c, dtype=torch.float64, requires_grad=True)
        pads = [torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True) for _ in range(2)] if pad else [None] * 2
        leaves = [x for x in (q, k, v, r, *pads) if x is not None]
        out = chunk_attention(q, k, v, r, *pads, algorithm="cpp")
        ref = chunk_attention(q, k, v, r, *pads, algorithm="torch")
        assert out.shape == ref.shape == (2, 3, nc, 8) and (out - ref).abs().max() < 1e-10, (c, t)
        weights = torch.randn_like(ref)
        for g, w in zip(torch.autograd.grad((out * weights).sum(), leaves),  # no pad read when C divides t:
                        torch.autograd.grad((ref * weights).sum(), leaves, materialize_grads=True)):  # zeros
            assert (g - w).abs().max() < 1e-10, (c, t)


def _all_outputs(c, dilation, threads):
    torch.manual_seed(1)
    qkv, r, pk, pv = _packed(2, 700, 2, 16, c, True, torch.float32, expand_pads=True)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = sliding_dilated_cpu(*qkv.unbind(2), r, dilation, pk, pv)
        grads = torch.autograd.grad((out * torch.randn_like(out)).sum(), _leaves(qkv, r, pk, pv))
    finally:
        torch.set_num_threads(previous)
    return [out, *grads]


def test_bit_identical_rerun_and_across_thread_counts():
    """dr and dpad are per-unit partial sums reduced in a fixed order: nothing depends on the scheduling."""
    for c, dilation in [(2, 1), (4, 4), (8, 64)]:
        first, again, two = (_all_outputs(c, dilation, n) for n in (1, 1, 2))
        for a, b, d in zip(first, again, two):
            assert torch.equal(a, b) and torch.equal(a, d), (c, dilation)


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_opcheck(pad):
    qkv, r, pk, pv = _packed(2, 11, 2, 4, 3, pad, torch.float64)
    q, k, v = qkv.unbind(2)
    torch.library.opcheck(torch.ops.regulargpt.sliding_dilated_cpu.default, (q, k, v, r, pk, pv, 3, 0, 1))
    q = torch.randn(2, 4, 2, 4, dtype=torch.float64, requires_grad=True)  # tree mode: 4 queries, step 3
    torch.library.opcheck(torch.ops.regulargpt.sliding_dilated_cpu.default, (q, k, v, r, pk, pv, 1, 1, 3))
    # (B, H, T, Dh) tensors seen as (B, T, H, Dh): dense, so the gradients come in that layout
    q, k, v = (torch.randn(2, 2, 11, 4, dtype=torch.float64).transpose(1, 2).requires_grad_() for _ in range(3))
    torch.library.opcheck(torch.ops.regulargpt.sliding_dilated_cpu.default, (q, k, v, r, pk, pv, 2, 0, 1))
    dq, dk, dv, *_ = torch.autograd.grad(sliding_dilated_cpu(q, k, v, r, 2, pk, pv).sum(), [q, k, v])
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_eager_route_equals_the_registered_operator_bit_for_bit(pad):
    """`cpu_operator` in eager mode calls the extension through its own autograd.Function: forward and every
    gradient equal the registered operator's, bit for bit, at a dilation and with strided (tree-mode) queries."""
    for dilation, query_start, query_step in [(4, 0, 1), (1, 1, 3)]:  # T = 11, C = 3: queries 1, 4, 7, 10
        qkv, r, pk, pv = _packed(2, 11, 3, 8, 3, pad, torch.float32, expand_pads=True)
        q, k, v = qkv.unbind(2)
        q = q[:, query_start::query_step]
        outs = [op(q, k, v, r, dilation, pk, pv, query_start, query_step) for op in (cpu_operator, sliding_dilated_cpu)]
        weights = torch.randn_like(outs[0])
        grads = [torch.autograd.grad((out * weights).sum(), _leaves(qkv, r, pk, pv)) for out in outs]
        assert torch.equal(outs[0], outs[1]) and outs[0].shape == (2, q.shape[1], 3, 8)
        assert all(torch.equal(a, b) for a, b in zip(*grads)), (dilation, query_step)


def test_compiled_code_calls_the_registered_operator():
    """Under torch.compile `cpu_operator` is the registered operator: one whole graph (fullgraph fails on a break,
    which tracing into the eager route's extension call would be), with the operator's values."""
    qkv, r, pk, pv = _packed(2, 9, 2, 4, 2, True, torch.float32)
    q, k, v = (x.detach() for x in qkv.unbind(2))
    compiled = torch.compile(lambda *xs: cpu_operator(*xs, 2, pk.detach(), pv.detach()), backend="eager",
                             fullgraph=True)
    assert torch.equal(compiled(q, k, v, r.detach()), sliding_dilated_cpu(q, k, v, r.detach(), 2, pk, pv))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_projection_chunks_get_their_gradient_whole_with_no_cat(dtype):
    """q, k, v as the model splits its (B, T, 3·H·Dh) projection (last-dim chunks): the eager route writes dq, dk, dv
    into one buffer and hands it to the projection whole (no aten::cat in the backward), with the bits of the same
    operator on separate copies of q, k, v, whose gradients autograd concatenates. Other layouts are not taken."""
    b, t, h, dh, c = 2, 300, 2, 32, 4
    qkv = torch.randn(b, t, 3 * h * dh, dtype=dtype, requires_grad=True)
    r = (torch.randn(h, c) * 0.5).requires_grad_()
    pk, pv = (torch.randn(b, h, dh, dtype=dtype, requires_grad=True) for _ in range(2))
    dout = torch.randn(b, t, h, dh, dtype=dtype)
    q, k, v = (x.view(b, t, h, dh) for x in qkv.chunk(3, dim=-1))
    assert projection_of(q, k, v) is qkv
    out = cpu_operator(q, k, v, r, c, pk, pv)
    with torch.profiler.profile() as prof:
        got = torch.autograd.grad((out * dout).sum(), [qkv, r, pk, pv])
    assert "aten::cat" not in {e.name for e in prof.events()}
    copy = qkv.detach().clone().requires_grad_()
    q2, k2, v2 = (x.view(b, t, h, dh).clone() for x in copy.chunk(3, dim=-1))
    assert projection_of(q2, k2, v2) is None
    out2 = cpu_operator(q2, k2, v2, r, c, pk, pv)
    want = torch.autograd.grad((out2 * dout).sum(), [copy, r, pk, pv])
    assert torch.equal(out, out2) and got[0].shape == qkv.shape
    for name, g, w in zip(["qkv", "rel_bias", "pad_k", "pad_v"], got, want):
        assert torch.equal(g, w), name
    assert projection_of(k, q, v) is None and projection_of(q, k, k) is None  # chunks out of order or repeated
    assert projection_of(*(x[:, 1:] for x in (q, k, v))) is None  # not the whole projection


def test_dispatch_reads_the_projection_in_place_and_merges_heads_as_a_view():
    """auto picks cpp on CPU; from the (B, T, 3, H, Dh) projection's (B, H, T, Dh) views no copy runs around the
    call, and the layer's head merge out.transpose(1, 2).reshape(B, T, H·Dh) is a view of the operator's output."""
    b, t, h, dh = 2, 50, 3, 8
    assert sliding_dilated.choose_algorithm(2, 1, t, torch.float32, "cpu") == "cpp"
    qkv, r, pk, pv = _packed(b, t, h, dh, 2, True, torch.float32)
    q, k, v = qkv.detach().permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, T, Dh) views, as TransformerLayer._heads
    with torch.profiler.profile() as prof:
        out = sliding_dilated_attention(q, k, v, r.detach(), 2, pk.detach(), pv.detach())
    names = {e.name for e in prof.events()}
    assert not names & {"aten::copy_", "aten::clone", "aten::contiguous", "aten::cat"}, names
    merged = out.transpose(1, 2).reshape(b, t, h * dh)
    assert merged.data_ptr() == out.data_ptr() and merged._base is not None
    ref = reference_sliding_dilated_attention(q, k, v, r, 2, pk, pv)
    assert (out - ref).abs().max() < 1e-5


def test_auto_falls_back_with_one_warning_when_the_build_fails(monkeypatch):
    monkeypatch.setattr(sliding_dilated_cpp, "_state", {"error": "building sliding_dilated_cpu.cpp failed: no g++"})
    monkeypatch.setattr(sliding_dilated, "_FUSED_WARNED", set())
    q, k, v = (torch.randn(1, 2, 20, 4) for _ in range(3))
    r = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        picks = [sliding_dilated.choose_algorithm(4, 1, 20, torch.float32, "cpu") for _ in range(3)]
        out = sliding_dilated_attention(q, k, v, r, 4)
    assert picks == ["shift"] * 3
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "falls back to shift/blocked" in messages[0] and "no g++" in messages[0]
    assert (out - reference_sliding_dilated_attention(q, k, v, r, 4)).abs().max() < 1e-5
    with pytest.raises(RuntimeError, match="no g\\+\\+"):
        sliding_dilated_attention(q, k, v, r, 4, algorithm="cpp")


def test_public_api_gradients_in_the_callers_layout():
    """Contiguous (B, H, T, Dh) leaves through `sliding_dilated_attention(algorithm="cpp")`: the gradients the
    operator writes in that dense layout equal the dense reference's."""
    for c, dilation, t in [(2, 2, 37), (3, 9, 20), (8, 1, 300)]:
        q, k, v = (torch.randn(2, 3, t, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        r = torch.randn(3, c, dtype=torch.float64, requires_grad=True)
        pk, pv = (torch.randn(1, 3, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
        pads = (pk.expand(2, 3, 8), pv.expand(2, 3, 8))
        out = sliding_dilated_attention(q, k, v, r, dilation, *pads, algorithm="cpp")
        ref = reference_sliding_dilated_attention(q, k, v, r, dilation, *pads)
        assert (out - ref).abs().max() < 1e-10
        weights = torch.randn_like(ref)
        for g, w in zip(torch.autograd.grad((out * weights).sum(), [q, k, v, r, pk, pv]),
                        torch.autograd.grad((ref * weights).sum(), [q, k, v, r, pk, pv])):
            assert (g - w).abs().max() < 1e-10, (c, dilation, t)


def test_a_build_lock_left_by_a_killed_process_is_cleared_and_a_fresh_one_kept(tmp_path, monkeypatch):
    """torch waits forever on the build folder's `lock` of a process killed mid-build: one older than
    STALE_LOCK_SECONDS is removed with a warning naming it; a younger one (a build in progress) is left alone."""
    import os
    import time

    from regulargpt.kernels import sliding_dilated_cpp

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "ext" / "lock"
    lock.parent.mkdir()
    lock.touch()
    sliding_dilated_cpp._clear_stale_lock("ext")  # fresh: kept
    assert lock.exists()
    old = time.time() - sliding_dilated_cpp.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    with pytest.warns(UserWarning, match="removing a build lock"):
        sliding_dilated_cpp._clear_stale_lock("ext")
    assert not lock.exists()
    sliding_dilated_cpp._clear_stale_lock("ext")  # no lock: nothing to do, no error
