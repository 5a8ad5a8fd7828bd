"""Position biases against hand-computed values and their constraints."""

import math

import torch

from regulargpt.model import KerpleLogBias, KerplePowerBias, T5Bias, alibi_slopes, t5_relative_bucket
from regulargpt.model.position import RotaryEmbedding, sinusoidal_table


def test_alibi_slopes_match_published_schedule():
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    assert torch.allclose(alibi_slopes(16), torch.tensor([2.0 ** (-0.5 * i) for i in range(1, 17)]))
    # 12 heads: the 8-head schedule, then every other slope of the 16-head schedule: 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
    want12 = [2.0**-i for i in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(want12))


def test_t5_buckets_at_reference_distances():
    distance = torch.tensor([0, 15, 16, 19, 112, 113, 127, 128, 10000])
    assert t5_relative_bucket(distance).tolist() == [0, 15, 16, 17, 30, 31, 31, 31, 31]
    # first distance of each log bucket (fp64 worked values)
    firsts = {16: 16, 17: 19, 18: 21, 19: 24, 20: 27, 21: 31, 22: 35, 23: 40, 24: 46, 25: 52, 26: 59, 27: 67,
              28: 77, 29: 87, 30: 99, 31: 113}
    buckets = t5_relative_bucket(torch.arange(0, 200)).tolist()
    for bucket, first in firsts.items():
        assert buckets.index(bucket) == first
    assert t5_relative_bucket(torch.tensor([-5])).tolist() == [0]  # future keys (masked anyway)


def test_t5_bias_reads_the_table():
    bias = T5Bias(n_heads=2)
    out = bias(torch.arange(20), torch.arange(20))
    assert out.shape == (2, 20, 20)
    assert torch.equal(out[:, 19, 0], bias.table[t5_relative_bucket(torch.tensor(19))])


def _push_negative(module: torch.nn.Module) -> None:
    """One optimizer step whose gradient drives every KERPLE parameter far below zero."""
    opt = torch.optim.SGD(module.parameters(), lr=100.0)
    for p in module.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert all((p < 0).all() for p in module.parameters())


def test_kerple_biases_nonpositive_monotone_and_constrained_after_bad_step():
    pos = torch.arange(300)
    for cls in (KerpleLogBias, KerplePowerBias):
        module = cls(n_heads=4)
        for stage in ("init", "after"):
            bias = module(pos, pos)[:, -1, :].flip(-1)  # (H, Δ = 0..299)
            assert (bias <= 0).all(), (cls.__name__, stage)
            assert (bias[:, 1:] <= bias[:, :-1] + 1e-6).all(), (cls.__name__, stage)
            r1, r2 = module.effective()
            assert (r1 >= 0.01).all() and (r2 >= 0.01).all()
            if cls is KerplePowerBias:
                assert (r2 <= 2.0).all()
            _push_negative(module)
        # after the bad step the effective parameters sit on the boundary
        r1, r2 = module.effective()
        assert torch.allclose(r1, torch.full_like(r1, 0.01)) and torch.allclose(r2, torch.full_like(r2, 0.01))


def test_kerple_gradient_is_not_dead_outside_the_box():
    module = KerpleLogBias(n_heads=2)
    with torch.no_grad():
        module.r1.fill_(-1.0)
    module(torch.arange(10), torch.arange(10)).sum().backward()
    assert module.r1.grad.abs().sum() > 0


def test_kerple_log_hand_value():
    module = KerpleLogBias(n_heads=1)
    with torch.no_grad():
        module.r1.fill_(1.5)
        module.r2.fill_(0.5)
    b = module(torch.tensor([10]), torch.tensor([0, 6, 10]))
    assert torch.allclose(b[0, 0], torch.tensor([-1.5 * math.log(6.0), -1.5 * math.log(3.0), 0.0]))


def test_rope_preserves_norm_and_depends_on_relative_position():
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    rot = lambda x, p: rope(x, torch.tensor([p]))
    assert torch.allclose(rot(q, 5).norm(), q.norm())
    a = (rot(q, 7) * rot(k, 3)).sum()
    b = (rot(q, 104) * rot(k, 100)).sum()
    assert torch.allclose(a, b, atol=1e-5)


def test_sinusoidal_table_values():
    table = sinusoidal_table(torch.tensor([0, 1]), 4)
    assert torch.allclose(table[0], torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.allclose(table[1], torch.tensor([math.sin(1.0), math.sin(0.01), math.cos(1.0), math.cos(0.01)]))
