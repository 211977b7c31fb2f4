"""The closed-form schedule times against a discrete-event simulation of the schedules."""

import random

import pytest
from pipeline_sim import simulate

from nestplan.cost.pipeline import chunks_in_flight, schedule_time, warmup_chunks


def closed(f, b, micro, vp):
    return schedule_time([vp * (fi + bi) for fi, bi in zip(f, b)], micro, vp)


@pytest.mark.parametrize("pp,vp,micro", [(1, 1, 4), (2, 1, 1), (4, 1, 2), (4, 1, 8), (8, 1, 64),
                                         (4, 2, 8), (8, 3, 16), (4, 4, 4), (8, 2, 8)])
def test_equal_stages_match_simulation_exactly(pp, vp, micro):
    f, b = [1.0] * pp, [2.1] * pp
    assert closed(f, b, micro, vp) == pytest.approx(simulate(f, b, micro, vp), rel=1e-12)


def test_equal_stages_bubble_is_p_minus_1_over_v():
    pp, vp, micro, x = 8, 4, 32, 3.0
    t = schedule_time([x] * pp, micro, vp)
    assert t == pytest.approx((micro + (pp - 1) / vp) * x)


def test_unequal_stages_bound_simulation_when_micro_batches_dominate():
    rng = random.Random(7)
    for _ in range(60):
        pp = rng.choice([2, 3, 4, 6])
        vp = rng.choice([1, 2])
        micro = pp * 8
        f = [rng.uniform(0.5, 1.5) for _ in range(pp)]
        b = [2 * x * rng.uniform(0.8, 1.2) for x in f]
        sim = simulate(f, b, micro, vp)
        assert 0.99 * sim <= closed(f, b, micro, vp) <= 1.07 * sim


def test_in_flight_counts_follow_megatron():
    # 1F1B: stage i of p holds p - i micro-batches; never more than exist
    assert [warmup_chunks(i, 4, 1, 100) for i in range(4)] == [4, 3, 2, 1]
    assert warmup_chunks(0, 8, 1, 3) == 3
    # interleaved: 2(p-i-1) + (v-1)p + 1
    assert warmup_chunks(0, 4, 2, 100) == 2 * 3 + 4 + 1
    assert sum(chunks_in_flight(0, 4, 2, 100)) == 11
    assert chunks_in_flight(3, 4, 2, 100) == [4, 1]
