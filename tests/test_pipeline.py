"""The closed-form schedule times against a discrete-event simulation of the schedules."""

import random

import pytest

from nestplan.schedule import chunks_in_flight, span, warmup_chunks
from nestplan.schedule import makespan
from nestplan.schedule import simulate as ops


def simulate(f, b, micro, vp=1):
    """Makespan with every chunk of device ``i`` taking ``f[i]`` forward and ``b[i]`` backward."""
    return makespan(ops([[x] * vp for x in f], [[x] * vp for x in b], micro))


def schedule_time(x, micro, vp):
    return span(x, x, micro, vp)


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


def test_every_operation_runs_once_in_dependency_order():
    pp, vp, micro = 4, 2, 8
    f = [[1.0, 1.2], [0.9, 1.1], [1.0, 1.0], [1.3, 0.8]]
    b = [[2 * x for x in row] for row in f]
    sends = [0.1, 0.2, 0.3, 0.4]
    schedule = ops(f, b, micro, sends)
    assert len(schedule) == 2 * pp * vp * micro
    at = {(o.kind, o.chunk, o.micro): o for o in schedule}
    assert len(at) == len(schedule)
    for o in schedule:
        if o.kind == "F" and o.chunk > 0:  # waits for the previous chunk plus the transfer
            assert o.start >= at[("F", o.chunk - 1, o.micro)].end + sends[(o.chunk - 1) % pp] - 1e-12
        if o.kind == "B":
            assert o.start >= at[("F", o.chunk, o.micro)].end
            if o.chunk < pp * vp - 1:
                assert o.start >= at[("B", o.chunk + 1, o.micro)].end + sends[o.chunk % pp] - 1e-12
    for s in range(pp):  # a device runs one operation at a time
        mine = sorted((o for o in schedule if o.stage == s), key=lambda o: o.start)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(mine, mine[1:]))


def test_sends_lengthen_fill_and_drain():
    pp, micro = 4, 8
    f, b = [[1.0]] * pp, [[2.0]] * pp
    s = 0.5
    base = makespan(ops(f, b, micro))
    slow = makespan(ops(f, b, micro, [s] * pp))
    # fill and drain each cross the pp - 1 boundaries once; 1F1B has no slack in its steady
    # state, so there a round trip's transfers also delay every micro-batch (by < 2 sends)
    assert base + 2 * (pp - 1) * s < slow < base + 2 * (pp - 1) * s + micro * 2 * s
