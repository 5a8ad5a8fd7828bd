"""Position biases against hand-computed values and their constraints."""

import math

import pytest
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


# ------------------------------------------------------------------ the bias modules against the paper's formulas


def test_alibi_slopes_at_1_4_and_12_heads_written_out():
    assert alibi_slopes(1).tolist() == [2.0**-8]  # n = 1: 2^(-8·1/1)
    assert alibi_slopes(4).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]
    # 12: p = 8 → 2^-1..2^-8, then the 16-head schedule 2^(-i/2) at i = 1, 3, 5, 7
    want = [2.0**-i for i in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    assert alibi_slopes(12).tolist() == pytest.approx(want, rel=1e-7, abs=0)


def test_alibi_bias_is_minus_slope_times_distance():
    """b[h, q, k] = −m_h·(q − k), hand-written for 4 heads at (q, k) = (5, 5), (5, 2), (5, 0): a sign flip or a
    transposed distance fails."""
    from regulargpt.model import AlibiBias

    out = AlibiBias(4)(torch.tensor([5]), torch.tensor([5, 2, 0]))
    want = [[[0.0, -3 / 4, -5 / 4]], [[0.0, -3 / 16, -5 / 16]], [[0.0, -3 / 64, -5 / 64]],
            [[0.0, -3 / 256, -5 / 256]]]
    assert out.tolist() == want
    far = AlibiBias(2)(torch.tensor([100]), torch.arange(101))[:, 0]  # (H, Tk): more negative further back
    assert (far[:, :-1] < far[:, 1:]).all()


def test_t5_bias_uses_the_bucket_of_query_minus_key():
    bias = T5Bias(n_heads=2)
    with torch.no_grad():
        bias.table.copy_(torch.arange(64, dtype=torch.float32).view(32, 2))  # table[b, h] = 2b + h
    # Δ = 0, 5, 19, 40 → buckets 0, 5, 16 + floor(16·log(19/16)/log 8) = 17, 16 + floor(16·log(40/16)/log 8) = 23
    out = bias(torch.tensor([40]), torch.tensor([40, 35, 21, 0]))
    assert out[:, 0].tolist() == [[0.0, 10.0, 34.0, 46.0], [1.0, 11.0, 35.0, 47.0]]


def _kerple(cls, r1: list[float], r2: list[float]):
    module = cls(n_heads=len(r1))
    with torch.no_grad():
        module.r1.copy_(torch.tensor(r1))
        module.r2.copy_(torch.tensor(r2))
    return module


def test_kerple_log_roles_of_r1_and_r2():
    """−r1·log(1 + r2·Δ) with r1 ≠ r2 per head: swapping their roles, or dropping the 1 +, changes every value."""
    module = _kerple(KerpleLogBias, [1.5, 0.25], [0.5, 3.0])
    out = module(torch.tensor([4]), torch.tensor([4, 3, 0]))[:, 0]  # Δ = 0, 1, 4
    want = [[-1.5 * math.log(1 + 0.5 * d) for d in (0, 1, 4)], [-0.25 * math.log(1 + 3.0 * d) for d in (0, 1, 4)]]
    assert torch.allclose(out, torch.tensor(want), rtol=1e-6, atol=0)


def test_kerple_power_roles_of_r1_and_r2():
    """−r1·Δ^r2: r1 multiplies, r2 is the exponent (r1 = 0.5, r2 = 1.5 and r1 = 2, r2 = 0.5, hand values)."""
    module = _kerple(KerplePowerBias, [0.5, 2.0], [1.5, 0.5])
    out = module(torch.tensor([9]), torch.tensor([9, 8, 5, 0]))[:, 0]  # Δ = 0, 1, 4, 9
    want = torch.tensor([[0.0, -0.5, -0.5 * 8.0, -0.5 * 27.0], [0.0, -2.0, -2.0 * 2.0, -2.0 * 3.0]])
    assert torch.allclose(out, want, rtol=1e-6, atol=0)
    clamped = _kerple(KerplePowerBias, [1.0], [5.0])(torch.tensor([3]), torch.tensor([0]))  # r2 capped at 2
    assert clamped.item() == pytest.approx(-9.0)


def test_rope_rotates_a_known_vector_by_position_times_frequency():
    """Dh = 4, base 100: pair 0 turns by p rad, pair 1 by p/10 rad. (1, 0, 0, 1) at p = 2 → (cos 2, sin 2,
    −sin 0.2, cos 0.2)."""
    rope = RotaryEmbedding(4, base=100.0)
    x = torch.tensor([1.0, 0.0, 0.0, 1.0]).view(1, 1, 1, 4)
    out = rope(x, torch.tensor([2]))[0, 0, 0]
    want = torch.tensor([math.cos(2.0), math.sin(2.0), -math.sin(0.2), math.cos(0.2)])
    assert torch.allclose(out, want, atol=1e-6)
    assert torch.equal(rope(x, torch.tensor([0])), x)  # position 0: no rotation


def test_sinusoidal_table_frequencies_at_dim_6():
    table = sinusoidal_table(torch.tensor([3]), 6)[0]  # ω = 1, 10000^(-1/3), 10000^(-2/3)
    w = [1.0, 10000 ** (-1 / 3), 10000 ** (-2 / 3)]
    want = [math.sin(3 * x) for x in w] + [math.cos(3 * x) for x in w]
    assert table.tolist() == pytest.approx(want, abs=1e-6)


def test_learned_positions_run_up_to_max_positions_and_refuse_one_more():
    from regulargpt.model.position import LearnedPositions

    table = LearnedPositions(max_positions=8, dim=4)
    assert torch.equal(table(8), table.table[:8])  # exactly max_positions: allowed
    with pytest.raises(ValueError, match="input length 9 exceeds model.max_positions=8"):
        table(9)
