"""RegularGPT's structure against hand computation: the parameter count from a formula (K distinct sub-layers,
reused at every depth step), which sub-layer runs at which dilation (recorded by hooks), the integer depth
ceil(log_C T) at exact powers, and the pad state (the pad run through each sub-layer as a one-token sequence)."""

from __future__ import annotations

import pytest
import torch

from regulargpt.config import ModelConfig
from regulargpt.model import build_model

V, D, H, F = 11, 8, 2, 2  # vocab, d_model, heads, ffn_mult


def _cfg(arch: str, **kw: object) -> ModelConfig:
    base: dict[str, object] = dict(architecture=arch, vocab_size=V, d_model=D, n_heads=H, ffn_mult=F)
    base.update(kw)
    return ModelConfig(**base)


def _layer_params(d: int, f: int) -> int:
    """qkv 3d² + out d² (no biases), two LayerNorms 4d, FFN d→fd→d with biases 2f·d² + f·d + d."""
    return 4 * d * d + 4 * d + 2 * f * d * d + f * d + d


@pytest.mark.parametrize("thickness,chunk", [(1, 2), (2, 2), (3, 4)])
def test_regular_gpt_parameter_count_by_hand(thickness: int, chunk: int) -> None:
    """Embedding V·d + pad d + K·(layer + H·C window scalars) + head LayerNorm 2d + read-out V·d (untied);
    the same at every length (the K sub-layers are reused, not copied per depth step)."""
    model = build_model(_cfg("regular_gpt", position="none", thickness=thickness, chunk_size=chunk))
    want = V * D + D + thickness * (_layer_params(D, F) + H * chunk) + 2 * D + V * D
    assert sum(p.numel() for p in model.parameters()) == want
    assert model.num_parameters() == want
    # layer = 4·64 + 32 + 4·64 + 16 + 8 = 568; K = 1, C = 2: 88 + 8 + 572 + 16 + 88 = 772
    assert want == {(1, 2): 772, (2, 2): 1344, (3, 4): 1928}[(thickness, chunk)]


def test_transformer_parameter_count_by_hand() -> None:
    model = build_model(_cfg("transformer", position="alibi", n_layers=3))
    assert model.num_parameters() == V * D + 3 * _layer_params(D, F) + 2 * D + V * D == 1896


def _calls(model: torch.nn.Module, length: int) -> list[tuple[int, int, int]]:
    """(sub-layer index, id of its module, dilation) of every sub-layer call of one forward, in order."""
    calls: list[tuple[int, int, int]] = []
    hooks = [sub.register_forward_pre_hook(lambda mod, args, k=k: calls.append((k, id(mod), args[2])))
             for k, sub in enumerate(model.stack.sublayers)]
    with torch.no_grad():
        model(torch.randint(0, V, (1, length)))
    for h in hooks:
        h.remove()
    return calls


@pytest.mark.parametrize("chunk,length,depth", [(2, 8, 3), (2, 9, 4), (5, 125, 3), (5, 126, 4), (3, 1, 1),
                                                (3, 3, 1), (3, 4, 2)])
def test_each_depth_step_reuses_the_same_k_sublayers_at_dilation_c_to_the_l(chunk: int, length: int,
                                                                             depth: int) -> None:
    """Depth = the smallest L >= 1 with C^L >= T (C = 5, T = 125: 3, where float log gives 4); step l runs
    sub-layers 0..K−1, the same module objects every step, at dilation C^l."""
    model = build_model(_cfg("regular_gpt", position="none", thickness=2, chunk_size=chunk)).eval()
    ids = [id(sub) for sub in model.stack.sublayers]
    want = [(k, ids[k], chunk**level) for level in range(depth) for k in range(2)]
    assert _calls(model, length) == want


def test_pad_state_is_the_pad_run_through_each_sublayer_as_a_one_token_sequence() -> None:
    """Sub-layer k's pad key/value are its k, v of p_k; p_{k+1} = sub-layer k applied to the one-token sequence
    p_k (which attends only to itself). Computed here with the layer's own projection and a plain forward."""
    torch.manual_seed(0)
    model = build_model(_cfg("regular_gpt", position="none", thickness=3, chunk_size=2, pad="learned")).double()
    with torch.no_grad():
        model.stack.pad.normal_()
        pads = model.stack.pad_states()
        p = model.stack.pad.view(1, 1, D)
        for k, sub in enumerate(model.stack.sublayers):
            layer = sub.layer
            _, key, value = layer.qkv(layer.norm1(p) if layer.pre_norm else p).chunk(3, dim=-1)  # (1, 1, d) each
            assert torch.allclose(pads[k][0], key.view(1, H, D // H), atol=1e-12), k
            assert torch.allclose(pads[k][1], value.view(1, H, D // H), atol=1e-12), k
            p = sub(p, None, 1)  # mask mode: the only key is the token itself
        assert not torch.allclose(pads[0][0], pads[1][0])  # the chain moves: each sub-layer sees a different pad
