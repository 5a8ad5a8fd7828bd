"""The O(T·C) kernel against the dense T×T reference (every output and gradient), adaptive depth, the `auto` rule."""

import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from regulargpt.model import adaptive_depth, reference_sliding_dilated_attention, sliding_dilated_attention
from regulargpt.model.sliding_dilated import choose_band

CHUNKS = [2, 3, 4, 8, 32]


def _cases():
    for c in CHUNKS:
        for dilation in sorted({1, c, c * c}):
            for t in sorted({1, 2, c - 1, c, c * c + 1, 257} - {0}):
                yield c, dilation, t


def _inputs(b, h, t, dh, c, pad, dtype=torch.float64):
    q, k, v = (torch.randn(b, h, t, dh, dtype=dtype, requires_grad=True) for _ in range(3))
    r = (torch.randn(h, c, dtype=dtype) * 0.5).requires_grad_()
    pads = [torch.randn(b, h, dh, dtype=dtype, requires_grad=True) for _ in range(2)] if pad else [None, None]
    return q, k, v, r, pads


@pytest.mark.parametrize(("algorithm", "pad"), [
    pytest.param("shift", True, id="shift-pad"), pytest.param("shift", False, id="shift-mask"),
    pytest.param("blocked", True, id="blocked-pad"),
    pytest.param("blocked", False, id="blocked-mask", marks=pytest.mark.slow),
])
def test_kernel_matches_dense_reference_forward_and_gradients(algorithm, pad):
    for c, dilation, t in _cases():
        q, k, v, r, (pk, pv) = _inputs(2, 2, t, 4, c, pad)
        leaves = [x for x in (q, k, v, r, pk, pv) if x is not None]
        out = sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm)
        ref = reference_sliding_dilated_attention(q, k, v, r, dilation, pk, pv)
        assert out.shape == (2, 2, t, 4)
        assert torch.allclose(out, ref, atol=1e-10, rtol=0), (c, dilation, t)
        weights = torch.randn_like(out)
        got = torch.autograd.grad((out * weights).sum(), leaves)
        want = torch.autograd.grad((ref * weights).sum(), leaves)
        for name, g, w in zip("qkvrPV", got, want):
            assert torch.allclose(g, w, atol=1e-10, rtol=0), (name, c, dilation, t)


@pytest.mark.parametrize("algorithm", ["cpp", "shift", "blocked"])
def test_token_major_layout_matches_the_dense_reference(algorithm):
    """layout="bthd": q, k, v and the output (B, T, H, Dh) — as the model passes views of its projection — equal the
    dense reference on the (B, H, T, Dh) transposes, forward and every gradient; the fused kernel gets the views
    themselves (no copy: the output is contiguous in (B, T, H, Dh))."""
    if algorithm == "cpp":
        from regulargpt.kernels import sliding_dilated_cpp

        if sliding_dilated_cpp.build_error():
            pytest.skip(f"C++ operator did not build: {sliding_dilated_cpp.build_error()}")
    torch.manual_seed(5)
    for c, dilation, t, pad in [(2, 1, 9, True), (3, 3, 20, False), (4, 16, 37, True)]:
        qkv = torch.randn(2, t, 3, 3, 4, dtype=torch.float64, requires_grad=True)  # (B, T, 3, H, Dh): a projection
        q, k, v = qkv.unbind(2)  # (B, T, H, Dh) views, stride(-1) 1
        r = (torch.randn(3, c, dtype=torch.float64) * 0.5).requires_grad_()
        pk, pv = [torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True) for _ in range(2)] if pad else [None] * 2
        out = sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm, layout="bthd")
        ref = reference_sliding_dilated_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), r, dilation,
                                                  pk, pv).transpose(1, 2)
        assert out.shape == (2, t, 3, 4) and torch.allclose(out, ref, atol=1e-10, rtol=0), (algorithm, c, t)
        if algorithm == "cpp":
            assert out.is_contiguous()
        leaves = [x for x in (qkv, r, pk, pv) if x is not None]
        weights = torch.randn_like(out)
        for g, w in zip(torch.autograd.grad((out * weights).sum(), leaves),
                        torch.autograd.grad((ref * weights).sum(), leaves)):
            assert torch.allclose(g, w, atol=1e-10, rtol=0), (algorithm, c, t)
    with pytest.raises(ValueError, match="layout must be 'bhtd'"):
        sliding_dilated_attention(q, k, v, r, 1, layout="bhdt")
    with pytest.raises(ValueError, match=r"rel_bias must be \(H, C\) with H=3"):
        sliding_dilated_attention(q, k, v, torch.zeros(2, 2), 1, layout="bthd")


def test_fp32_kernel_within_1e5_of_reference():
    for c, dilation, t in [(2, 1, 257), (4, 16, 257), (32, 32, 257), (3, 9, 100)]:
        q, k, v, r, (pk, pv) = _inputs(2, 3, t, 16, c, True, dtype=torch.float32)
        out = sliding_dilated_attention(q, k, v, r, dilation, pk, pv)
        ref = reference_sliding_dilated_attention(q, k, v, r, dilation, pk, pv)
        assert (out - ref).abs().max() < 1e-5


def test_visibility_rule_by_perturbation():
    """Changing key/value at position n changes output m iff n = m − j·D for some j < C (brute force)."""
    c, dilation, t = 3, 2, 15
    q, k, v, r, _ = _inputs(1, 1, t, 4, c, False)
    base = sliding_dilated_attention(q, k, v, r, dilation)
    for n in range(t):
        v2 = v.detach().clone()
        v2[:, :, n] += 1.0
        changed = (sliding_dilated_attention(q, k, v2, r, dilation) - base).abs().sum(-1)[0, 0] > 1e-12
        expected = [any(m - j * dilation == n for j in range(c)) for m in range(t)]
        assert changed.tolist() == expected, n


def test_mask_mode_first_position_attends_only_itself():
    q, k, v, r, _ = _inputs(1, 2, 5, 4, 4, False)
    out = sliding_dilated_attention(q, k, v, r, 1)
    assert torch.allclose(out[:, :, 0], v[:, :, 0])


def test_bad_shapes_are_clear_errors():
    q = torch.zeros(1, 2, 5, 4)
    with pytest.raises(ValueError, match="rel_bias"):
        sliding_dilated_attention(q, q, q, torch.zeros(3, 2), 1)
    with pytest.raises(ValueError, match="dilation"):
        sliding_dilated_attention(q, q, q, torch.zeros(2, 2), 0)
    with pytest.raises(ValueError, match="pad_k"):
        sliding_dilated_attention(q, q, q, torch.zeros(2, 2), 1, torch.zeros(1, 2, 4), None)


def test_adaptive_depth_exact_at_powers():
    for c in range(2, 11):
        for p in range(0, 12 if c < 5 else 7):
            power = c**p
            for t in (power - 1, power, power + 1):
                if t < 1:
                    continue
                want = max(1, next(l for l in itertools.count(0) if c**l >= t))
                assert adaptive_depth(t, c) == want, (t, c)
    assert adaptive_depth(125, 5) == 3  # float log gives ceil(3.0000000000000004) = 4
    with pytest.raises(ValueError):
        adaptive_depth(0, 2)


_MEMORY_SCRIPT = textwrap.dedent(
    """
    import torch
    from regulargpt.model import sliding_dilated_attention
    torch.set_num_threads(1)
    b, h, t, dh, c = 1, 2, 65536, 16, 2
    q, k, v = (torch.randn(b, h, t, dh, requires_grad=True) for _ in range(3))
    r = torch.randn(h, c, requires_grad=True)
    pk, pv = (torch.randn(b, h, dh, requires_grad=True) for _ in range(2))
    # warm up allocator and autograd machinery on a short input, then read the baseline
    sliding_dilated_attention(q[:, :, :64], k[:, :, :64], v[:, :, :64], r, 4, pk, pv).sum().backward()
    def status_kib(field):  # VmHWM is this process's own peak (ru_maxrss would include the forking parent's)
        line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
        return int(line.split()[1])
    base = status_kib("VmRSS")
    out = sliding_dilated_attention(q, k, v, r, 4096, pk, pv)
    out.square().sum().backward()
    print(status_kib("VmHWM") - base)
    """
)


@pytest.mark.slow
def test_memory_is_linear_in_length_at_65536():
    """Forward+backward at T=65536, C=2 in a subprocess. One (B,H,T,Dh) fp32 tensor is 8 MiB; the kernel keeps
    folded copies of q/k/v, padded k/v, one product temporary, the output, and in the backward the gradients of
    those (freed as it goes) plus O(T·C) scores: at most ~20 such tensors live at once (measured: ~8). A T×T score
    matrix would be 32 GiB. Bound: 20 tensors = 160 MiB of peak RSS above the baseline."""
    tensor_kib = 1 * 2 * 65536 * 16 * 4 // 1024
    # A fixed mmap threshold stops glibc from moving big freed blocks onto the heap, so RSS tracks live tensors.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20), "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT], capture_output=True, text=True, check=True, env=env)
    grown_kib = int(result.stdout.strip().splitlines()[-1])
    assert grown_kib < 20 * tensor_kib, f"peak grew by {grown_kib} KiB, bound {20 * tensor_kib} KiB"


@pytest.mark.parametrize("algorithm", ["cpp", "shift", "blocked"])
def test_autocast_runs_the_kernel_in_bf16_and_stays_close_to_fp32(algorithm):
    """Under CPU autocast, fp32 inputs are cast to bf16 (bf16 matmuls); scores stay fp32, gradients reach fp32 leaves."""
    c, dilation, t = 4, 4, 100
    q, k, v, r, (pk, pv) = _inputs(1, 2, t, 16, c, True, dtype=torch.float32)
    ref = reference_sliding_dilated_attention(q, k, v, r, dilation, pk, pv)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sliding_dilated_attention(q, k, v, r, dilation, pk, pv, algorithm=algorithm)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() < 5e-2
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and r.grad is not None and pk.grad is not None


def test_cpu_rule_shape():
    """What the measured rule must do, whatever its thresholds: only the two exact CPU algorithms; shift for tiny
    folded lengths (N <= 4) and the smallest chunk; blocked for the largest; as C grows it switches from shift to
    blocked at most once; bf16 (cheap matmuls) switches no later than fp32; a longer sequence no later either."""
    dtypes, chunks = (torch.float32, torch.bfloat16), range(2, 65)
    for t in (64, 512, 4096, 4097, 16384, 65536):
        for dilation in (1, 2, 16, 1024):
            switch = {}
            for dtype in dtypes:
                picks = [choose_band(c, dilation, t, dtype) for c in chunks]
                assert set(picks) <= {"shift", "blocked"}
                if -(-t // dilation) <= 4:
                    assert set(picks) == {"shift"}, (t, dilation, dtype)
                    continue
                assert picks[0] == "shift" and picks[-1] == "blocked", (t, dilation, dtype)
                first = picks.index("blocked")
                assert set(picks[first:]) == {"blocked"}, (t, dilation, dtype)  # one switch
                switch[dtype] = chunks[first]
            if switch:
                assert switch[torch.bfloat16] <= switch[torch.float32], (t, dilation, switch)
    for dtype in dtypes:
        first_blocked = [next(c for c in chunks if choose_band(c, 1, t, dtype) == "blocked")
                         for t in (512, 4096, 16384, 65536)]
        assert first_blocked == sorted(first_blocked, reverse=True), (dtype, first_blocked)
