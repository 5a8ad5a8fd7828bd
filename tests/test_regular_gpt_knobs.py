"""RegularGPT's language-model knobs: depth policy (adaptive / train / per_position), window-scalar init, depth-scaled
init, and the fan_in initialisation scheme. Checked against independent truth: the adaptive model at equal depth,
hand-computed depths and values, and logits of prefixes (length consistency)."""
from __future__ import annotations

import math

import pytest
import torch

from regulargpt.config import ConfigError, ModelConfig, load_config_dict
from regulargpt.model import RegularGPT, adaptive_depth, alibi_slopes, build_model



def _model(c: int, k: int = 2, policy: str = "adaptive", train_length: int = 16, pad: str = "learned",
           seed: int = 0) -> RegularGPT:
    cfg = ModelConfig(vocab_size=23, d_model=16, n_heads=2, ffn_mult=2, chunk_size=c, thickness=k, pad=pad,
                      depth_policy=policy, train_length=train_length)
    torch.manual_seed(seed)
    model = build_model(cfg).double().eval()
    with torch.no_grad():  # window scalars large enough that the positions they weight matter
        for sub in model.stack.sublayers:
            sub.rel_bias.normal_(0.0, 1.0)
    return model


def _same_weights(src: RegularGPT, policy: str) -> RegularGPT:
    cfg = ModelConfig(**{**src.config.__dict__, "depth_policy": policy})
    dst = build_model(cfg).double().eval()
    dst.load_state_dict(src.state_dict())
    return dst


@pytest.mark.parametrize("c", [2, 3, pytest.param(4, marks=pytest.mark.slow)])
def test_train_policy_equals_adaptive_where_the_depths_agree(c: int) -> None:
    train_length = c**2 + 1  # adaptive depth 3
    adaptive = _model(c, train_length=train_length)
    train = _same_weights(adaptive, "train")
    tokens = torch.randint(0, 23, (2, 3 * c**3))
    for length in range(1, tokens.shape[1] + 1):
        same = adaptive_depth(length, c) == adaptive_depth(train_length, c)
        assert same == torch.equal(adaptive(tokens[:, :length]), train(tokens[:, :length])), length
    assert torch.equal(adaptive(tokens[:, :train_length]), train(tokens[:, :train_length]))  # the training length


@pytest.mark.parametrize("pad", ["learned", "mask"])
@pytest.mark.parametrize("policy", ["train", "per_position"])
@pytest.mark.parametrize("c", [2, 3, 4])
def test_appending_tokens_never_changes_earlier_logits(c: int, policy: str, pad: str) -> None:
    model = _model(c, policy=policy, train_length=c + 1, pad=pad)
    tokens = torch.randint(0, 23, (2, 2 * c**3 + 3))
    full = model(tokens)
    for length in (1, 2, c, c + 1, c**2, c**2 + 1, c**3 - 1, c**3 + 2):
        torch.testing.assert_close(model(tokens[:, :length]), full[:, :length], rtol=1e-10, atol=1e-10)


def test_adaptive_policy_is_not_length_consistent() -> None:
    """The control for the test above: under the paper's adaptive depth, earlier logits change as text grows."""
    model = _model(2)
    tokens = torch.randint(0, 23, (1, 9))
    assert not torch.allclose(model(tokens[:, :4]), model(tokens)[:, :4])


@pytest.mark.parametrize("c,length", [(2, 20), (3, 30), (4, 65)])
def test_per_position_steps_match_the_formula(c: int, length: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Position m takes part in max(1, ceil(log_C(m+1))) depth steps: with each step replaced by "add 1", the
    final state of position m is its number of steps (hand-computed: C = 2, m = 3 → 2 steps, m = 4 → 3)."""
    model = _model(c, policy="per_position")
    monkeypatch.setattr(model.stack, "step", lambda x, dilation, pads=None: x + 1)
    steps = model.stack.sliding(torch.zeros(1, length, 1, dtype=torch.float64))[0, :, 0]
    expected = [1] + [next(s for s in range(1, 99) if c**s >= m + 1) for m in range(1, length)]
    assert steps.tolist() == expected
    if c == 2:
        assert expected[:9] == [1, 1, 2, 2, 3, 3, 3, 3, 4]


def test_train_depth_is_saved_with_the_config() -> None:
    raw = {"model": {"architecture": "regular_gpt", "chunk_size": 4}, "data": {"seq_len": 64}}
    assert load_config_dict(raw).model.train_length == 64
    raw["model"]["train_length"] = 256
    assert load_config_dict(raw).model.train_length == 256


def test_depth_policy_is_rejected_where_it_means_nothing() -> None:
    with pytest.raises(ConfigError, match="depth_policy"):
        load_config_dict({"model": {"architecture": "transformer", "depth_policy": "train"}})
    with pytest.raises(ConfigError, match="depth_policy"):
        load_config_dict({"model": {"architecture": "regular_gpt", "head": "classifier", "num_classes": 2,
                                    "depth_policy": "per_position"}})


def test_rel_bias_init_schemes() -> None:
    def r(scheme: str) -> torch.Tensor:
        cfg = ModelConfig(vocab_size=11, d_model=16, n_heads=4, chunk_size=3, thickness=2, rel_bias_init=scheme)
        return torch.stack([s.rel_bias.detach() for s in build_model(cfg).stack.sublayers])

    assert torch.count_nonzero(r("zeros")) == 0
    recency = r("recency")  # −s_h · j with ALiBi's slopes 1/4, 1/16, 1/64, 1/256
    expected = torch.tensor([[0.0, -0.25, -0.5], [0.0, -0.0625, -0.125], [0.0, -1 / 64, -2 / 64],
                             [0.0, -1 / 256, -2 / 256]])
    torch.testing.assert_close(recency[0].float(), expected)
    torch.testing.assert_close(recency[1].float(), expected)
    assert torch.equal(alibi_slopes(4), torch.tensor([0.25, 0.0625, 0.015625, 0.00390625]))
    normal = r("normal")
    assert 0.0 < normal.std() < 0.06


def test_depth_scaled_init_divides_output_projections_by_sqrt_2KL() -> None:
    base = dict(vocab_size=11, d_model=64, n_heads=4, chunk_size=4, thickness=4, train_length=64, init_std=0.02)
    torch.manual_seed(0)
    plain = build_model(ModelConfig(**base))
    torch.manual_seed(0)
    scaled = build_model(ModelConfig(**base, depth_scaled_init=True))
    factor = math.sqrt(2 * 4 * 3)  # K = 4, L_train = ceil(log_4 64) = 3
    for a, b in zip(plain.stack.sublayers, scaled.stack.sublayers):
        torch.testing.assert_close(b.layer.out.weight * factor, a.layer.out.weight)
        torch.testing.assert_close(b.layer.ffn_out.weight * factor, a.layer.ffn_out.weight)
        torch.testing.assert_close(b.layer.qkv.weight, a.layer.qkv.weight)


def test_fan_in_init_is_haikus_truncated_normal() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=2, d_model=256, n_heads=8, chunk_size=2, head="classifier", num_classes=2,
                      init="fan_in", norm="post", activation="relu")
    model = build_model(cfg)
    w = model.stack.sublayers[0].layer.qkv.weight.detach()  # fan_in 256 → std 1/16, |w| <= 2/16/0.8796
    assert abs(float(w.std()) - 1 / 16) < 0.003
    assert float(w.abs().max()) <= 2 / 16 / 0.87962566103423978 + 1e-6
    w2 = model.stack.sublayers[0].layer.ffn_out.weight.detach()  # fan_in 1024 → 1/32
    assert abs(float(w2.std()) - 1 / 32) < 0.002
    assert abs(float(model.embed.table.weight.detach().std()) - 0.02) < 0.01  # embeddings keep init_std


@pytest.mark.parametrize("c, k, train_length", [(4, 4, 64), (8, 4, 64), (4, 1, 64), (2, 3, 16)])
def test_depth_train_reach_is_k_times_the_chain_of_one_step(c: int, k: int, train_length: int) -> None:
    """Under `train` the last prediction of a 400-token input depends on exactly the last K·(C^L − 1) + 1 tokens,
    L = ceil(log_C T_train): each of the K sub-layers of depth step l reads C keys C^l apart, so a step reaches
    K·(C − 1)·C^l back (hand count: C = 4, K = 4, T_train = 64: 4·63 + 1 = 253 tokens, not C^L = 64)."""
    model = _model(c, k, policy="train", train_length=train_length)
    depth = next(n for n in range(1, 20) if c ** n >= train_length)  # ceil(log_C T_train), in integers
    reach = k * (c ** depth - 1) + 1
    emb = model.embed(torch.randint(0, 23, (1, 400))).detach().requires_grad_(True)
    handle = model.embed.register_forward_hook(lambda mod, inp, out: emb)  # the model reads our leaf
    try:
        model(torch.zeros(1, 400, dtype=torch.long))[0, -1].sum().backward()
    finally:
        handle.remove()
    depends = (emb.grad[0].abs().sum(-1) > 0).nonzero().flatten()
    assert int(depends.min()) == 400 - reach and len(depends) == reach, (int(depends.min()), len(depends))
