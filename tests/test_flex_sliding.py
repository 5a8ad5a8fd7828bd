"""The FlexAttention formulation (CUDA path) against the dense reference; its block mask against the band rule."""

import itertools
import warnings

import pytest
import torch

from regulargpt.config import ModelConfig
from regulargpt.model import build_model, reference_sliding_dilated_attention, sliding_dilated_attention
from regulargpt.model.flex_sliding import band_block_mask, flex_sliding_dilated_attention
from regulargpt.model.sliding_dilated import choose_algorithm


def _inputs(t, c, pad, dtype, device="cpu", b=2, h=3, dh=8, grad=False):
    g = torch.Generator().manual_seed(t * 131 + c)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_(grad)  # noqa: E731
    q, k, v = make(b, h, t, dh), make(b, h, t, dh), make(b, h, t, dh)
    r = make(h, c)
    pads = (make(b, h, dh), make(b, h, dh)) if pad else (None, None)
    return q, k, v, r, pads


@pytest.mark.parametrize("pad", [pytest.param(True, id="pad", marks=pytest.mark.slow), pytest.param(False, id="mask")])
def test_flex_formulation_matches_reference_eager(pad):
    """FlexAttention's eager implementation applies mask_mod/score_mod to every pair: checks the layout and rule."""
    for c, dilation, t in itertools.product([2, 3, 5], [1, 2, 3, 9], [1, 7, 30]):
        q, k, v, r, (pk, pv) = _inputs(t, c, pad, torch.float64)
        out = flex_sliding_dilated_attention(q, k, v, r, dilation, pk, pv, compile=False)
        ref = reference_sliding_dilated_attention(q, k, v, r, dilation, pk, pv)
        assert torch.allclose(out, ref, atol=1e-10, rtol=0), (c, dilation, t)


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
def test_block_mask_lists_every_visible_pair_and_little_else(pad):
    for c, dilation, t in [(2, 1, 1000), (3, 3, 700), (8, 64, 700), (32, 1, 300), (4, 1024, 1000)]:
        n = -(-t // dilation)
        o = c - 1 if pad else 0
        m = n + o
        blocks = band_block_mask(n, dilation, c, pad, "cpu").to_dense()[0, 0].bool()  # (q_blocks, kv_blocks)
        q_row = torch.arange(dilation * n)[:, None]
        k_row = torch.arange(dilation * m)[None, :]
        j = q_row % n + o - k_row % m
        visible = (q_row // n == k_row // m) & (j >= 0) & (j < c)  # dense (rows_q, rows_k) rule, brute force
        qi, ki = visible.nonzero(as_tuple=True)
        assert blocks[qi // 128, ki // 128].all(), (c, dilation, t)
        needed = torch.zeros_like(blocks)
        needed[qi // 128, ki // 128] = True
        assert blocks.sum() <= needed.sum() + blocks.shape[0], (c, dilation, t)  # at most one spare block per row


def test_block_mask_hand_computed_band():
    """T = 1024, C = 4, D = 1, pads: 3 pad keys in front, each 128-query block needs its own and the next key block."""
    mask = band_block_mask(1024, 1, 4, True, "cpu")
    assert mask.kv_num_blocks[0, 0].tolist() == [2] * 8
    assert mask.kv_indices[0, 0, :, :2].tolist() == [[i, i + 1] for i in range(8)]


@pytest.mark.slow
def test_compiled_flex_on_cpu_matches_reference_for_two_geometries():
    """The block-sparse compiled kernel (forward; CPU has no flex backward) through the public API, twice in one
    process: a stale kernel specialised for the first geometry would fail the second."""
    with torch.no_grad():
        for c, dilation, t, pad in [(3, 3, 700, True), (2, 1, 300, True)]:
            q, k, v, r, (pk, pv) = _inputs(t, c, pad, torch.float32, b=1, h=2, dh=16)
            out = sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm="flex")
            ref = reference_sliding_dilated_attention(q, k, v, r, dilation, pk, pv)
            assert (out - ref).abs().max() < 1e-5, (c, dilation, t)


@pytest.mark.parametrize("pad", ["learned", "mask"])
def test_regular_gpt_through_flex_matches_the_cpu_kernels(monkeypatch, pad):
    """The model's own calls (pads from the pad state, every depth step's dilation) through the flex formulation."""
    from torch.nn.attention.flex_attention import flex_attention

    def eager_flex(*args, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            return flex_attention(*args, **kwargs)

    torch.manual_seed(0)
    cfg = ModelConfig(architecture="regular_gpt", vocab_size=17, d_model=32, n_heads=4, chunk_size=3, thickness=2,
                      pad=pad)
    model = build_model(cfg).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "rel_bias" in name:
                p.normal_()
        tokens = torch.randint(0, 17, (2, 20))  # ceil(log_3 20) = 3 depth steps: dilations 1, 3, 9
        want = model(tokens)
        monkeypatch.setattr("regulargpt.model.sliding_dilated.choose_algorithm", lambda *args: "flex")
        monkeypatch.setattr("regulargpt.model.flex_sliding._compiled_flex", lambda: eager_flex)
        got = model(tokens)
    assert torch.allclose(got, want, atol=1e-10, rtol=0)


def test_flex_retries_with_smaller_tiles_when_the_default_ones_run_out_of_shared_memory(monkeypatch):
    """The H200 failure (inductor: "out of resource ... Required: 245760 Hardware limit: 232448"): one retry with
    `_SMALL_TILES`, kept for the rest of the process; any other error, or a second resource error, reaches the caller."""
    from torch.nn.attention.flex_attention import flex_attention

    from regulargpt.model import flex_sliding

    seen = []

    def compiled(*args, kernel_options=None, **kwargs):
        seen.append(kernel_options)
        if kernel_options is None:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_0")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            return flex_attention(*args, **kwargs)

    monkeypatch.setattr(flex_sliding, "_kernel_options", None)
    monkeypatch.setattr(flex_sliding, "_compiled_flex", lambda: compiled)
    q, k, v, r, (pk, pv) = _inputs(20, 3, True, torch.float64)
    want = reference_sliding_dilated_attention(q, k, v, r, 3, pk, pv)
    for _ in range(2):
        got = sliding_dilated_attention(q, k, v, r, 3, pk, pv, algorithm="flex")
        assert torch.allclose(got, want, atol=1e-10, rtol=0)
    assert seen == [None, flex_sliding._SMALL_TILES, flex_sliding._SMALL_TILES]

    monkeypatch.setattr(flex_sliding, "_kernel_options", None)
    monkeypatch.setattr(flex_sliding, "_compiled_flex", lambda: lambda *a, **kw: (_ for _ in ()).throw(
        RuntimeError("Triton compile error: some other failure")))
    with pytest.raises(RuntimeError, match="some other failure"):
        sliding_dilated_attention(q, k, v, r, 3, pk, pv, algorithm="flex")


def test_flex_on_cpu_refuses_gradients_with_a_clear_error():
    q, k, v, r, (pk, pv) = _inputs(8, 2, True, torch.float32, grad=True)
    with pytest.raises(ValueError, match="no backward on CPU.*shift"):
        sliding_dilated_attention(q, k, v, r, 2, pk, pv, algorithm="flex")


def test_auto_never_picks_flex():
    """Flex runs by name only: on CPU it has no backward, on an H200 it was 7.8x slower than blocked."""
    for c, t in [(2, 512), (8, 64), (8, 16384), (32, 16)]:
        for dtype, device in itertools.product((torch.float32, torch.bfloat16), ("cpu", "cuda")):
            assert choose_algorithm(c, c, t, dtype, device) in ("cpp", "triton", "shift", "blocked")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("algorithm", ["flex", "auto"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 3e-2)])
def test_cuda_algorithms_match_reference_forward_and_gradients(dtype, tol, algorithm):
    """The compiled FlexAttention kernel and `auto` (shift/blocked on CUDA tensors) against the fp64 CPU reference."""
    for c, dilation, t, pad in [(2, 1, 1000, True), (2, 8, 1000, False), (8, 8, 600, True), (4, 256, 600, True)]:
        q, k, v, r, pads = _inputs(t, c, pad, torch.float64, dh=64, grad=True)
        ref_leaves = [x for x in (q, k, v, r, *pads) if x is not None]
        leaves = [x.detach().to("cuda", dtype).requires_grad_() for x in ref_leaves]
        q, k, v, r, *pads = leaves
        pk, pv = pads if pad else (None, None)
        out = sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm)
        ref = reference_sliding_dilated_attention(*ref_leaves[:4], dilation, *(ref_leaves[4:] if pad else (None, None)))
        # scaled like the gradients below: bf16 q/k/v round at 2^-9 relative, and outputs reach |2-3|
        assert (out.double().cpu() - ref).abs().max() < tol * max(1.0, ref.abs().max().item()), (c, dilation, t)
        w = torch.randn_like(ref)
        got = torch.autograd.grad((out.double() * w.cuda()).sum(), leaves)
        want = torch.autograd.grad((ref * w).sum(), ref_leaves)
        for name, g1, g2 in zip("qkvrPV", got, want):
            assert (g1.double().cpu() - g2).abs().max() < tol * max(1.0, g2.abs().max().item()), (name, c, dilation, t)
