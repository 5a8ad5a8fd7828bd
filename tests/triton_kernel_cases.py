"""The Triton kernel against the dense T×T reference: forward and every gradient, strided and bf16 inputs, tree mode
against `chunk_attention`, determinism.

Not collected by `pytest tests` (no test_ prefix): TRITON_INTERPRET=1 must be set before triton is first imported
(regulargpt/kernels/sliding_dilated_triton.py says why), so tests/test_kernel_triton.py runs this file in a child
process with it set, on CPU tensors. On a CUDA machine, `python -m pytest tests/triton_kernel_cases.py` runs the same
cases compiled on the GPU. Interpreted shapes are tiny (every tl op is a numpy call per program): B·H = 2, Dh = 4,
T <= 13 with 8 queries per program (so most cases span two blocks, the last one ragged).
"""

import os

import pytest
import torch

from regulargpt.kernels.sliding_dilated_triton import triton_sliding_dilated_attention
from regulargpt.model.regular_gpt import chunk_attention
from regulargpt.model.sliding_dilated import reference_sliding_dilated_attention

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRETED and not torch.cuda.is_available():
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 set before triton's import (tests/test_kernel_triton.py does it)",
                allow_module_level=True)
DEVICE = "cpu" if INTERPRETED else "cuda"


def _leaves(b: int, t: int, h: int, dh: int, c: int, pad: bool, dtype: torch.dtype = torch.float32) -> list:
    """q, k, v (B, T, H, Dh), r (H, C), pad_k, pad_v (B, H, Dh) or None; leaves that require grad."""
    def make(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype).to(DEVICE).requires_grad_()

    pads = [make(b, h, dh), make(b, h, dh)] if pad else [None, None]
    return [make(b, t, h, dh), make(b, t, h, dh), make(b, t, h, dh), make(h, c), *pads]


def _reference(q, k, v, r, dilation, pk, pv):
    """The dense reference in fp64 on the (B, H, T, Dh) layout, returned in the kernel's (B, T, H, Dh)."""
    up = [None if x is None else x.double() for x in (q, k, v, r, pk, pv)]
    bhtd = [x.transpose(1, 2) for x in up[:3]]
    return reference_sliding_dilated_attention(*bhtd, up[3], dilation, up[4], up[5]).transpose(1, 2)


def _outputs_and_grads(fn, leaves: list, dout: torch.Tensor) -> list[torch.Tensor]:
    for x in leaves:
        if x is not None:
            x.grad = None
    out = fn()
    out.backward(dout.to(out.dtype))
    return [out.detach()] + [x.grad for x in leaves if x is not None]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], tol: float,
                  names: tuple[str, ...] = ("out", "dq", "dk", "dv", "dr", "dpad_k", "dpad_v")) -> None:
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        torch.testing.assert_close(a.double(), b.double(), atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}")


# T = 13, 11: two blocks of 8 queries, the last ragged, T not a multiple of D = C; T = 7 < D = C² from C = 3 on
CASES = [(c, d, t) for c in (2, 3, 4, 8) for d, t in ((1, 13), (c, 11), (c * c, 7))]


@pytest.mark.parametrize("pad", [True, False], ids=["pad", "mask"])
@pytest.mark.parametrize(("c", "dilation", "t"), CASES, ids=[f"C{c}-D{d}-T{t}" for c, d, t in CASES])
def test_forward_and_every_gradient_match_the_dense_reference(c: int, dilation: int, t: int, pad: bool) -> None:
    leaves = _leaves(1, t, 2, 4, c, pad)
    dout = torch.randn(1, t, 2, 4, device=DEVICE)
    got = _outputs_and_grads(lambda: triton_sliding_dilated_attention(*leaves[:4], dilation, *leaves[4:]), leaves, dout)
    want = _outputs_and_grads(lambda: _reference(*leaves[:4], dilation, *leaves[4:]), leaves, dout)
    assert got[0].dtype == torch.float32 and got[0].is_contiguous()
    _assert_close(got, want, 1e-5)


@pytest.mark.parametrize("layout", ["packed", "heads_first"])
def test_strided_views_and_expanded_pads(layout: str) -> None:
    """packed: q, k, v are views of one (B, T, 3, H, Dh) tensor, as the fused qkv projection makes them;
    heads_first: (B, H, T, Dh) tensors transposed, as `sliding_dilated_attention`'s contract hands them over. Pads
    expand()ed along B from (1, H, Dh) with stride 0. Read in place; gradients land in the leaves."""
    b, t, h, dh, c, dilation = 2, 7, 2, 4, 3, 3
    shape = (b, t, 3, h, dh) if layout == "packed" else (3, b, h, t, dh)
    qkv = torch.randn(*shape, device=DEVICE, requires_grad=True)
    r = torch.randn(h, c, device=DEVICE, requires_grad=True)
    pad_k, pad_v = (torch.randn(1, h, dh, device=DEVICE, requires_grad=True) for _ in range(2))
    leaves = [qkv, r, pad_k, pad_v]
    dout = torch.randn(b, t, h, dh, device=DEVICE)

    def run(kernel):
        views = qkv.unbind(2) if layout == "packed" else [x.transpose(1, 2) for x in qkv]  # each (B, T, H, Dh)
        assert not views[0].is_contiguous()
        return kernel(*views, r, dilation, pad_k.expand(b, h, dh), pad_v.expand(b, h, dh))

    got = _outputs_and_grads(lambda: run(triton_sliding_dilated_attention), leaves, dout)
    want = _outputs_and_grads(lambda: run(_reference), leaves, dout)
    _assert_close(got, want, 1e-5, names=("out", "d qkv", "dr", "dpad_k (1, H, Dh)", "dpad_v (1, H, Dh)"))


def test_bf16_inputs_match_the_reference_loosely() -> None:
    """bf16 in and out, fp32 inside: within bf16 rounding of the fp64 reference on the same (rounded) inputs."""
    leaves = _leaves(1, 7, 2, 4, 3, True, dtype=torch.bfloat16)
    dout = torch.randn(1, 7, 2, 4, device=DEVICE)
    got = _outputs_and_grads(lambda: triton_sliding_dilated_attention(*leaves[:4], 3, *leaves[4:]), leaves, dout)
    assert got[0].dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got[1:])
    want = _outputs_and_grads(lambda: _reference(*leaves[:4], 3, *leaves[4:]), leaves, dout)
    _assert_close(got, want, 5e-2)


@pytest.mark.parametrize(("c", "t", "pad"), [(2, 13, True), (3, 17, False), (4, 14, True), (4, 14, False)],
                         ids=["C2-T13-pad", "C3-T17-mask", "C4-T14-pad", "C4-T14-mask"])  # 7, 6, 4 kept positions
def test_strided_queries_match_tree_mode_chunk_attention(c: int, t: int, pad: bool) -> None:
    """query_start = (t−1) % C, query_step = C, D = 1: the last position of every chunk attends to its chunk."""
    nq = -(-t // c)
    leaves = _leaves(1, t, 2, 4, c, pad)
    q_kept = torch.randn(1, nq, 2, 4, device=DEVICE, requires_grad=True)
    dout = torch.randn(1, nq, 2, 4, device=DEVICE)
    all_leaves = [q_kept, *leaves[1:]]
    _, k, v, r, pk, pv = leaves
    got = _outputs_and_grads(
        lambda: triton_sliding_dilated_attention(q_kept, k, v, r, 1, pk, pv, (t - 1) % c, c), all_leaves, dout)
    want = _outputs_and_grads(lambda: chunk_attention(
        *(x.double().transpose(1, 2) for x in (q_kept, k, v)), r.double(),
        *(None if x is None else x.double() for x in (pk, pv))).transpose(1, 2), all_leaves, dout)
    _assert_close(got, want, 1e-5)


def test_a_rerun_is_bit_identical() -> None:
    """No atomics: dk/dv gathered per key block, dr/dpad summed from per-block partials in a fixed order."""
    leaves = _leaves(1, 11, 1, 4, 2, True)
    dout = torch.randn(1, 11, 1, 4, device=DEVICE)

    def run() -> list[torch.Tensor]:
        return [x.clone() for x in _outputs_and_grads(
            lambda: triton_sliding_dilated_attention(*leaves[:4], 2, *leaves[4:]), leaves, dout)]

    first = run()
    for a, b in zip(first, run(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("change", "message"), [
    ({"pad_v": None}, "both be given"),
    ({"q": "transposed"}, "stride"),
    ({"query_start": 5, "query_step": 4}, "run past T"),
    ({"rel_bias": torch.zeros(3, 2)}, "rel_bias must be"),
])
def test_bad_inputs_get_a_clear_error(change: dict, message: str) -> None:
    q, k, v = (torch.randn(1, 6, 2, 4, device=DEVICE) for _ in range(3))
    args = dict(q=q, k=k, v=v, rel_bias=torch.zeros(2, 2), dilation=2, pad_k=torch.zeros(1, 2, 4),
                pad_v=torch.zeros(1, 2, 4), query_start=0, query_step=1)
    args.update(change)
    if change.get("q") == "transposed":
        args["q"] = q.transpose(2, 3).contiguous().transpose(2, 3)
    args["pad_k"], args["pad_v"] = (None if x is None else x.to(DEVICE) for x in (args["pad_k"], args["pad_v"]))
    args["rel_bias"] = args["rel_bias"].to(DEVICE)
    with pytest.raises(ValueError, match=message):
        triton_sliding_dilated_attention(**args)


@pytest.mark.skipif(INTERPRETED, reason="torch.compile cannot trace an interpreted kernel: wrap_triton hands it back "
                    "unwrapped, so the op's fake implementation would launch it on fake tensors (CUDA only)")
def test_torch_compile_captures_the_operator_and_its_backward() -> None:
    leaves = _leaves(2, 300, 2, 64, 4, True, dtype=torch.bfloat16)
    dout = torch.randn(2, 300, 2, 64, device=DEVICE)

    def attend() -> torch.Tensor:
        return triton_sliding_dilated_attention(*leaves[:4], 4, *leaves[4:])

    eager = _outputs_and_grads(attend, leaves, dout)
    compiled = _outputs_and_grads(torch.compile(attend, fullgraph=True), leaves, dout)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)


def test_public_dispatch_by_name_runs_the_triton_kernel() -> None:
    """sliding_dilated_attention(..., algorithm="triton") on the (B, H, T, Dh) contract equals the dense reference,
    forward and gradients, and refuses fp64 with a message naming the algorithms that take it."""
    from regulargpt.model.sliding_dilated import sliding_dilated_attention

    leaves = _leaves(1, 11, 2, 4, 3, True)
    dout = torch.randn(1, 11, 2, 4, device=DEVICE)

    def public():
        q, k, v = (x.transpose(1, 2) for x in leaves[:3])  # (B, H, T, Dh) views
        return sliding_dilated_attention(q, k, v, leaves[3], 3, *leaves[4:], algorithm="triton").transpose(1, 2)

    got = _outputs_and_grads(public, leaves, dout)
    want = _outputs_and_grads(lambda: _reference(*leaves[:4], 3, *leaves[4:]), leaves, dout)
    _assert_close(got, want, 1e-5)
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, device=DEVICE)
    with pytest.raises(ValueError, match="fp64 runs on 'cpp', 'shift' or 'blocked'"):
        sliding_dilated_attention(q, q, q, torch.zeros(2, 2, device=DEVICE), 1, algorithm="triton")


@pytest.mark.skipif(not INTERPRETED, reason="the interpreted kernel is the one torch 2.11's wrap_triton rejects")
def test_the_kernel_runs_where_wrap_triton_rejects_interpreted_kernels(monkeypatch) -> None:
    """torch 2.11's wrap_triton raises for anything but a JITFunction/Autotuner (issue 39 §5); with it in place the
    interpreted kernel still matches the dense reference (launched directly, as torch 2.13's wrap_triton would)."""
    import triton

    from regulargpt.kernels import sliding_dilated_triton

    def wrap_triton_2_11(kernel):
        if not isinstance(kernel, (triton.JITFunction, triton.runtime.Autotuner)):
            raise RuntimeError("wrap_triton only works on functions annotated with triton.jit or triton.autotune")
        return kernel

    monkeypatch.setattr(sliding_dilated_triton, "wrap_triton", wrap_triton_2_11)
    leaves = _leaves(1, 11, 2, 4, 2, True)
    dout = torch.randn(1, 11, 2, 4, device=DEVICE)
    got = _outputs_and_grads(lambda: triton_sliding_dilated_attention(*leaves[:4], 2, *leaves[4:]), leaves, dout)
    want = _outputs_and_grads(lambda: _reference(*leaves[:4], 2, *leaves[4:]), leaves, dout)
    _assert_close(got, want, 1e-5)
