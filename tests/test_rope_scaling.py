"""RoPE scaling at inference: our frequencies and attention factors against transformers' own rope initialisation
functions (``ROPE_INIT_FUNCTIONS``, the independent truth), NTK-aware by hand, and the bad inputs."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from regulargpt.config import ConfigError, ModelConfig
from regulargpt.config.rope_scaling import RopeScalingError, check_rope_scaling, describe_rope_scaling
from regulargpt.model.rotary import RotaryEmbedding, rope_frequencies

HEAD_DIM, HEADS, BASE, TRAINED = 16, 4, 10000.0, 64


def _hf(params: dict, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """transformers' (inv_freq, attention_factor) for a Llama-shaped config with head dim 16, trained length 64."""
    cfg = LlamaConfig(hidden_size=HEAD_DIM * HEADS, num_attention_heads=HEADS, max_position_embeddings=TRAINED,
                      rope_parameters={"rope_theta": BASE, **params})
    return ROPE_INIT_FUNCTIONS[params["rope_type"]](cfg, "cpu", seq_len=seq_len)


CASES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": TRAINED, "beta_fast": 16.0,
     "beta_slow": 2.0, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED, "attention_factor": 1.3},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": TRAINED, "mscale": 1.0,
     "mscale_all_dim": 0.5},
]


@pytest.mark.parametrize("scaling", CASES, ids=lambda c: describe_rope_scaling(c))
def test_frequencies_and_attention_factor_match_transformers(scaling: dict):
    want, want_factor = _hf(scaling)
    got, factor = rope_frequencies(HEAD_DIM, BASE, check_rope_scaling(scaling))
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(want_factor, rel=1e-12)


@pytest.mark.parametrize("length", [32, 64, 65, 200, 1000])
def test_dynamic_ntk_matches_transformers_at_each_sequence_length(length: int):
    scaling = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": TRAINED}
    want, want_factor = _hf(scaling, seq_len=length)
    rope = RotaryEmbedding(HEAD_DIM, BASE, check_rope_scaling(scaling))
    got, factor = rope.frequencies(length)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert factor == want_factor == 1.0 and rope.length_dependent


def test_ntk_aware_fixed_base_by_hand():
    """NTK-aware (bloc97): base' = base · f^(d/(d−2)); d = 4, base 100, f = 4: base' = 100·4^2 = 1600, θ = 1, 1/40."""
    theta, factor = rope_frequencies(4, 100.0, {"rope_type": "ntk", "factor": 4.0})
    assert theta.tolist() == pytest.approx([1.0, 1 / 40]) and factor == 1.0


def test_yarn_attention_factor_multiplies_the_rotated_vectors():
    """transformers multiplies cos and sin by the attention factor: |rot(x)| = a·|x| (a = 0.1·ln 4 + 1 here)."""
    scaling = check_rope_scaling({"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64})
    x = torch.randn(1, 1, 3, HEAD_DIM)
    out = RotaryEmbedding(HEAD_DIM, BASE, scaling)(x, torch.tensor([0, 5, 9]))
    torch.testing.assert_close(out.norm(dim=-1), (0.1 * math.log(4) + 1) * x.norm(dim=-1))


@pytest.mark.parametrize("raw,match", [
    ({"rope_type": "longrope", "factor": 2},
     r"rope_type: 'longrope' is not accepted.*'linear', 'ntk', 'dynamic', 'yarn'"),
    ({"type": "linear", "factor": 2}, r"rope_type: None is not accepted \(rope_type, not the older key 'type'\)"),
    ({"rope_type": "linear"}, r"rope_scaling\.factor: missing; rope_type 'linear' needs factor"),
    ({"rope_type": "yarn", "factor": 2}, r"original_max_position_embeddings: missing"),
    ({"rope_type": "linear", "factor": 0.5}, r"factor: 0\.5 is not accepted; expected a number >= 1"),
    ({"rope_type": "linear", "factor": 2, "beta_fast": 3}, r"beta_fast: not a key of rope_type 'linear'"),
    ({"rope_type": "dynamic", "factor": 2, "original_max_position_embeddings": 6.5}, r"expected an integer"),
    ("yarn", r"is not a JSON object"),
])
def test_bad_scalings_name_the_key_value_and_what_is_accepted(raw, match):
    with pytest.raises(RopeScalingError, match=match):
        check_rope_scaling(raw)
    if isinstance(raw, dict):  # the same message through the model config, under model.rope_scaling
        with pytest.raises(ConfigError, match="model.rope_scaling"):
            ModelConfig(architecture="transformer", position="rope", rope_scaling=raw)


def test_normalised_scaling_and_label():
    cfg = ModelConfig(architecture="transformer", position="rope",
                      rope_scaling={"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 64,
                                    "attention_factor": None})
    assert cfg.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    assert describe_rope_scaling(cfg.rope_scaling) == "yarn×4 from 64"
    same = ModelConfig(architecture="transformer", position="rope",
                       rope_scaling={"original_max_position_embeddings": 64, "factor": 4.0, "rope_type": "yarn"})
    assert same == cfg and hash(same) == hash(cfg)  # hashable like the other model configs


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 4, "original_max_position_embeddings": 6},
                                     {"rope_type": "yarn", "factor": 4, "original_max_position_embeddings": 6}])
@pytest.mark.parametrize("window", [0, 5])
def test_cached_decoding_of_a_scaled_rope_equals_a_full_forward_of_each_prefix(scaling: dict, window: int):
    """Dynamic NTK rotates by the frequencies of the current length: the decoder re-rotates its cached keys, so each
    step's logits are those of a full forward of the prefix so far (fp64 weights, fp32 rotation: 1e-5), windowed or
    not; caching keys rotated at an earlier length is off by ~1e-1 here."""
    from regulargpt.generation import DenseDecoder
    from regulargpt.model import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(architecture="transformer", position="rope", rope_scaling=scaling, vocab_size=13, d_model=16,
                      n_heads=2, n_layers=2, window=window)
    model = build_model(cfg).double().eval()
    tokens = torch.randint(0, 13, (2, 20))
    decoder = DenseDecoder(model)
    with torch.no_grad():
        close = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(decoder.prefill(tokens[:, :4]), model(tokens[:, :4]), **close)
        for t in range(4, 20):
            torch.testing.assert_close(decoder.step(tokens[:, t]), model(tokens[:, :t + 1])[:, -1], **close)
