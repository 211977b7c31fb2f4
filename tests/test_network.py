"""Placement of groups on levels, and collective costs over them."""

import dataclasses
import json

import pytest

from nestplan.axes import Axis
from nestplan.catalog import get_accelerator, get_cluster, get_model
from nestplan.cost.network import collective_time, level_bandwidth, p2p_time
from nestplan.graph import CollKind
from nestplan.placement import GroupLayout, layouts, stage_devices
from nestplan.specs import ClusterSpec, Level, Parallelism

H100 = get_cluster("dgx-h100-ndr")


def two_level(bw0=400e9, bw1=50e9, over=1.0, lat=0.0) -> ClusterSpec:
    return ClusterSpec(name="t", accelerator=H100.accelerator, levels=(
        Level(name="node", size=8, bandwidth=bw0, latency=lat),
        Level(name="net", size=None, bandwidth=bw1, latency=lat, oversubscription=over)))


def test_megatron_order_puts_tp_inside_a_node():
    lay = layouts(Parallelism(tp=8, pp=4, dp=4), H100, 128)
    assert lay.tp.k[0] == 8 and lay.tp.top == 0
    assert lay.dp.k[0] == 1 and lay.dp.top >= 1
    assert all(b.level >= 1 for b in lay.pp)
    assert stage_devices(Parallelism(tp=8, pp=4, dp=4))[0] == tuple(range(32))


def test_rank_order_moves_groups_across_levels():
    par = Parallelism(tp=2, pp=1, dp=8, rank_order=(Axis.DP, Axis.TP, Axis.CP, Axis.PP))
    lay = layouts(par, H100, 16)
    assert lay.dp.k[0] == 8  # dp innermost: all 8 replicas share a node
    assert lay.tp.top == 1  # tp now spans two nodes


def test_each_group_names_the_highest_level_it_crosses():
    """What evaluate prints and --json gives (``groups``): a user trial could not tell which
    level of a network design a plan's groups cross. DGX H100: 8 GPUs per NVLink node, 32
    nodes per leaf; Megatron's order puts TP inside a node, DP across nodes, the pipeline's
    stages 256 GPUs apart across the spine."""
    from nestplan.evaluate import evaluate, scenario_from_names
    from nestplan.placement import group_levels

    par = Parallelism(tp=8, pp=4, dp=32)
    assert group_levels(par, H100, 1024, experts=False) == {
        "tp": (8, "nvlink"), "dp": (32, "leaf"), "pp": (4, "spine")}
    moe = Parallelism(tp=2, pp=1, dp=4, ep=8, etp=1, sp=True)  # 8 GPUs: one node
    assert group_levels(moe, H100, 8, experts=True) == {
        "tp": (2, "nvlink"), "dp": (4, "nvlink"), "ep": (8, "nvlink")}
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 1024, seq_len=4096, global_batch=1024)
    js = evaluate(sc, par).to_json()
    assert js["groups"] == {"tp": {"size": 8, "top_level": "nvlink"},
                            "cp": {"size": 1, "top_level": None},  # every axis, one device too
                            "dp": {"size": 32, "top_level": "leaf"},
                            "pp": {"size": 4, "top_level": "spine"}}
    moe = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    got = evaluate(moe, Parallelism(tp=1, pp=1, dp=8, ep=8, etp=1)).to_json()["groups"]
    assert list(got) == ["tp", "cp", "dp", "ep", "etp", "edp", "pp"]
    assert got["ep"] == {"size": 8, "top_level": "nvlink"} and got["etp"]["top_level"] is None


def test_flat_ring_matches_textbook_formula():
    c = two_level()
    g = GroupLayout(4, (4, 4))
    m = 1e9
    assert collective_time(CollKind.ALL_REDUCE, m, g, c) == pytest.approx(2 * m * 3 / 4 / 400e9)
    assert collective_time(CollKind.ALL_GATHER, m, g, c) == pytest.approx(m * 3 / 4 / 400e9)


def test_node_links_carry_a_ring_across_nodes_in_parallel():
    c = two_level()
    m = 1e9
    spread = GroupLayout(16, (8, 16))  # 2 nodes x 8 members: 8 NICs share the inter-node traffic
    single = GroupLayout(16, (1, 16))  # one member per node: one NIC carries it all
    t_spread = collective_time(CollKind.ALL_REDUCE, m, spread, c)
    t_single = collective_time(CollKind.ALL_REDUCE, m, single, c)
    assert t_single == pytest.approx(2 * m * 15 / 16 / 50e9)
    assert t_spread < t_single / 4
    assert collective_time(CollKind.ALL_REDUCE, m, spread, c, flat=True) == pytest.approx(t_single)


def test_oversubscription_slows_traffic_that_crosses_it():
    g = GroupLayout(16, (1, 16))
    fast = collective_time(CollKind.ALL_GATHER, 1e9, g, two_level(over=1.0))
    slow = collective_time(CollKind.ALL_GATHER, 1e9, g, two_level(over=7.0))
    assert slow == pytest.approx(7 * fast)
    inside = GroupLayout(8, (8, 8))
    assert collective_time(CollKind.ALL_GATHER, 1e9, inside, two_level(over=7.0)) == pytest.approx(
        collective_time(CollKind.ALL_GATHER, 1e9, inside, two_level(over=1.0)))


def test_partial_share_relieves_oversubscription():
    c = two_level(over=4.0)
    assert level_bandwidth(c, 1) == pytest.approx(50e9 / 4)
    assert level_bandwidth(c, 1, (1.0, 0.25)) == pytest.approx(50e9)


def test_latency_grows_with_ring_steps():
    c = two_level(lat=10e-6)
    small = GroupLayout(16, (1, 16))
    big = GroupLayout(64, (1, 64))
    t_small = collective_time(CollKind.ALL_GATHER, 1.0, small, c)
    t_big = collective_time(CollKind.ALL_GATHER, 1.0, big, c)
    assert t_big == pytest.approx(63 * 10e-6, rel=1e-3)
    assert t_small == pytest.approx(15 * 10e-6, rel=1e-3)


def test_all_to_all_uses_each_devices_own_link():
    c = two_level()
    g = GroupLayout(16, (8, 16))
    t = collective_time(CollKind.ALL_TO_ALL, 1e9, g, c)
    assert t == pytest.approx(1e9 * 8 / 16 / 50e9, rel=1e-3)


def test_p2p_costs_the_crossed_level():
    c = two_level(lat=1e-6)
    assert p2p_time(1e9, -1, (), c) == 0.0
    assert p2p_time(1e9, 0, (), c) == pytest.approx(1e9 / 400e9 + 1e-6)
    assert p2p_time(1e9, 1, (), c) == pytest.approx(1e9 / 50e9 + 1e-6)


def test_pipeline_boundaries_know_their_level():
    # pp innermost: stages 0..7 of one replica sit in one node; their boundaries use NVLink
    par = Parallelism(tp=1, pp=8, dp=2, rank_order=(Axis.PP, Axis.TP, Axis.CP, Axis.DP))
    lay = layouts(par, H100, 16)
    assert [b.level for b in lay.pp] == [0] * 7
    par2 = dataclasses.replace(par, rank_order=(Axis.TP, Axis.CP, Axis.DP, Axis.PP))
    lay2 = layouts(par2, H100, 16)
    assert [b.level for b in lay2.pp] == [0, 0, 0, 1, 0, 0, 0]


def test_a_pipeline_through_an_oversubscribed_level_pays_for_its_busiest_block():
    """Two stages of 256 devices, each a whole leaf: every device of leaf 0 sends across the
    spine at once (and of leaf 1 back), so a 2:1 spine halves their bandwidth and 4:1 costs what
    a quarter of the spine's does. The share had been averaged over every device, (pp - 1)/pp:
    2:1 had cost nothing (a user trial's)."""
    from nestplan.evaluate import evaluate, scenario_from_names

    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 512, seq_len=4096, global_batch=1024)
    par = Parallelism(tp=8, pp=2, dp=32, sp=True, zero=1, mbs=1, recompute=("full",))
    assert layouts(par, H100, 512).pp[0].level == 2  # (the spine: leaves of 256)

    def pp_time(**spine) -> float:
        levels = list(H100.levels)
        levels[2] = dataclasses.replace(levels[2], **spine)
        cluster = dataclasses.replace(H100, name="spine-varied", levels=tuple(levels))
        return evaluate(dataclasses.replace(sc, cluster=cluster), par).link_time["pp"]

    spine = H100.levels[2]
    base, twice, four = (pp_time(oversubscription=o) for o in (1.0, 2.0, 4.0))
    assert twice > 1.9 * base and four == pytest.approx(pp_time(bandwidth=spine.bandwidth / 4))


def test_only_looped_schedules_send_from_the_last_stage_to_the_first():
    """Interleaved 1F1B's last stage sends its chunk's output on to stage 0, which the busiest
    block's share counts; a V (ZB-V) turns at the ends and never wraps, so it shares its
    boundaries as 1F1B does (a reviewer's: every plan with virtual stages had been counted
    as wrapping)."""
    order = (Axis.TP, Axis.PP, Axis.DP, Axis.CP)
    plain, looped, v = (layouts(Parallelism(tp=2, pp=8, dp=4, vp=vp, schedule=sched,
                                            rank_order=order), H100, 64).pp[0].share
                        for vp, sched in ((1, None), (2, None), (2, "zbv")))
    assert plain[1] == v[1] == 0.25 and looped[1] == 0.5  # (the node level: 8 devices)


def _per_row(groups, *divisors):
    """For every row of ``groups`` (device ids) and every distinct tuple of its members' ids
    floor-divided by ``divisors``: (row, tuple) keys and how many members share them."""
    import numpy as np

    g = np.asarray(groups, dtype=np.int64)
    m = int(g.max()) + 1
    code = np.broadcast_to(np.arange(len(g))[:, None], g.shape).ravel()
    for d in divisors:  # one integer per (row, tuple): a number in base m
        code = code * m + (g // d).ravel()
    codes, counts = np.unique(code, return_counts=True)
    keys = []
    for _ in divisors:
        codes, digit = np.divmod(codes, m)
        keys.append(digit)
    return np.stack([codes, *reversed(keys)], axis=1), counts


def _brute_touched(groups, blocks) -> tuple[int, ...]:
    """Blocks of each level the groups touch, at most, by counting every row (the last is 1)."""
    import numpy as np

    touched = [int(np.bincount(_per_row(groups, b)[0][:, 0]).max()) for b in blocks]
    touched[-1] = 1
    for i in range(len(touched) - 2, -1, -1):
        touched[i] = max(touched[i], touched[i + 1])
    return tuple(touched)


def _brute_counts(layout, groups, blocks) -> bool:
    """The layout's block counts per level equal a count over every row."""
    return tuple(layout.count(i) for i in range(len(blocks))) == _brute_touched(groups, blocks)


def _brute_k(groups, blocks) -> tuple[int, ...]:
    """k per level of the groups (rows of device ids), by counting, for every row and every
    block it touches, its members in that block: the fewest anywhere."""
    n = groups.shape[1]
    ks = [int(_per_row(groups, b)[1].min()) for b in blocks]
    ks[-1] = n
    for i in range(1, len(ks)):
        ks[i] = max(ks[i], ks[i - 1])
    return tuple(ks)


def _brute_fan(groups, blocks) -> tuple[int, ...]:
    """Per level, the most blocks of the level below (devices below level 0) that one block
    holds members of, over every row and every block it touches."""
    import numpy as np

    below = (1, *blocks[:-1])
    fan = []
    for b, c in zip(blocks, below):
        keys = _per_row(groups, b, c)[0]  # (row, block, lower block) with members
        fan.append(int(np.unique(keys[:, :2], axis=0, return_counts=True)[1].max()))
    return tuple(fan)


def _brute_layout(layout, groups, blocks) -> bool:
    """The layout's members per block and blocks per level equal a count over every row, and so
    does its fan-in at every level its traffic crosses (where the hierarchical and tree
    collectives read it)."""
    from nestplan.cost.network import _fan_in

    fan = _brute_fan(groups, blocks)
    crossed = [i for i, k in enumerate(layout.k) if k > (layout.k[i - 1] if i else 1)]
    return (layout.k == _brute_k(groups, blocks) and _brute_counts(layout, groups, blocks)
            and all(_fan_in(layout, i) == fan[i] for i in crossed))


def _random_cluster(rng) -> ClusterSpec:
    node, pod = rng.choice([2, 3, 4, 8]), rng.choice([2, 3, 5, 32])
    return ClusterSpec(name="c", accelerator=H100.accelerator, levels=(
        Level(name="n", size=node, bandwidth=400e9, latency=1e-6),
        Level(name="p", size=pod, bandwidth=50e9, latency=5e-6),
        Level(name="t", size=None, bandwidth=25e9, latency=9e-6)))


def test_group_levels_equal_a_count_over_every_row():
    """The dense groups (counted from the axes' strides and the residues of their first members,
    without listing them) and the expert groups (``_group_layout`` over their rows) equal counting the
    blocks every row touches, for grids of random degrees and rank orders, on block sizes that
    are and are not powers of two, with enough rows for the residues' convolution to run."""
    import itertools
    import random

    import numpy as np

    from nestplan.axes import Axis
    from nestplan.placement import _dense_groups, expert_grid, _group_layout, _rows, rank_grid
    from nestplan.specs import ClusterSpec, Level, Parallelism

    rng = random.Random(11)
    orders = list(itertools.permutations([Axis.TP, Axis.CP, Axis.DP, Axis.PP]))
    for _ in range(120):
        tp, pp, dp, cp = (rng.choice([1, 2, 3, 4, 8, 16]) for _ in range(4))
        ep = rng.choice([1, 2, 4])
        if (tp * cp * dp) % ep:
            ep = 1
        order = rng.choice(orders)
        par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=1, rank_order=order)
        grid = rank_grid(par)
        sizes = (rng.choice([2, 3, 4, 8]), rng.choice([6, 16, 32, 96]), rng.choice([64, 1000]))
        cluster = ClusterSpec(name="c", accelerator=H100.accelerator, levels=(
            *(Level(name=f"l{i}", size=sz, bandwidth=400e9, latency=1e-6)
              for i, sz in enumerate((sizes[0], sizes[1] // sizes[0] or 1,
                                      sizes[2] // sizes[1] or 1))),
            Level(name="top", size=None, bandwidth=25e9, latency=9e-6)))
        blocks = (*cluster.block_sizes(), par.devices)
        rows = [_rows(grid, 3), _rows(grid, 2), grid.transpose(0, 3, 1, 2).reshape(-1, dp * cp)]
        if pp > 1:
            rows.append(np.stack([grid[0].ravel(), grid[-1].ravel()], axis=1))
        got = _dense_groups((tp, pp, dp, cp, order), cluster, par.devices)
        for layout, r in zip(got, rows):
            assert _brute_layout(layout, r, blocks), (par, blocks)
        if pp == 1:
            assert got[3].k == tuple(1 for _ in blocks)
        egrid = expert_grid(grid, par)
        for r in [_rows(egrid, a) for a in (1, 2, 3)]:
            assert _brute_layout(_group_layout(r, blocks), r, blocks), (par, blocks)
        assert np.array_equal(np.sort(grid.ravel()), np.arange(par.devices))


def test_pipeline_boundaries_equal_a_count_over_every_device():
    """``_boundaries`` (window sums over stage 0's residues) equals visiting every device of
    every stage: the level each boundary crosses and the largest share of one block's devices
    sending outside it, either way (and from the last stage to the first, for interleaved
    schedules), for random degrees and rank orders on block sizes that are and are not powers
    of two."""
    import itertools
    import random

    import numpy as np

    from nestplan.placement import _block_sizes, _boundaries, _wrap, rank_grid
    from nestplan.specs import ClusterSpec, Level

    rng = random.Random(5)
    orders = list(itertools.permutations([Axis.TP, Axis.CP, Axis.DP, Axis.PP]))
    for _ in range(300):
        tp, pp, dp, cp = (rng.choice([1, 2, 3, 4, 8, 16]) for _ in range(4))
        pp = max(pp, 2)
        gpus = tp * pp * dp * cp
        node, pod = rng.choice([2, 3, 4, 8]), rng.choice([2, 3, 5, 32])
        cluster = ClusterSpec(name="c", accelerator=H100.accelerator, levels=(
            Level(name="n", size=node, bandwidth=400e9, latency=1e-6),
            Level(name="p", size=pod, bandwidth=50e9, latency=5e-6),
            Level(name="t", size=None, bandwidth=25e9, latency=9e-6)))
        order = rng.choice(orders)
        par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, rank_order=order)
        levels, share = _boundaries((tp, pp, dp, cp, order), cluster, gpus)
        grid = rank_grid(par)
        sizes = (1, *_block_sizes(cluster, gpus)[:-1])
        def busiest(b: int, looped: bool) -> float:  # most of one block's devices sending out
            pairs = [(grid[:-1], grid[1:]), (grid[1:], grid[:-1])]
            if looped:
                pairs += [(grid[-1:], grid[:1]), (grid[:1], grid[-1:])]
            out = np.unique(np.concatenate([src[src // b != dst // b] for src, dst in pairs]))
            return int(np.bincount(out // b).max()) / b if out.size else 0.0

        for looped in (False, True):
            got = _boundaries((tp, pp, dp, cp, order), cluster, gpus, looped)[1]
            assert got == pytest.approx(tuple(busiest(b, looped) for b in sizes)), (par, looped)
        want = tuple(max((lvl for lvl, b in enumerate(sizes)
                          if np.any(grid[i].ravel() // b != grid[i + 1].ravel() // b)),
                         default=-1) for i in range(pp - 1))
        assert levels == want, (par, levels, want)
        wrap = max((lvl for lvl, b in enumerate(sizes)
                    if np.any(grid[-1].ravel() // b != grid[0].ravel() // b)), default=-1)
        assert _wrap((tp, pp, dp, cp, order), cluster, gpus) == wrap


def test_a_dualpipe_fold_lays_its_groups_over_the_real_ranks():
    """A DualPipe plan's fold (``specs.fold``: DualPipeV on half the ranks, twice the replicas)
    keeps the real plan's TP and CP groups; its gradient group is a stage's replicas on the two
    ranks farthest apart that hold it (rank 0 and rank pp - 1), its expert-DP group likewise;
    its boundary q is the farther of real boundaries q and pp - 2 - q, and the V's turn is the
    real middle boundary. Counted over the real grid's rows, random degrees, orders, clusters."""
    import itertools
    import random

    import numpy as np

    from nestplan.placement import _block_sizes, expert_grid, _rows, rank_grid
    from nestplan.specs import fold

    rng = random.Random(17)
    orders = list(itertools.permutations([Axis.TP, Axis.CP, Axis.DP, Axis.PP]))
    for _ in range(60):
        tp, dp, cp = (rng.choice([1, 2, 3, 4]) for _ in range(3))
        pp = rng.choice([4, 6, 8])
        ep = rng.choice([e for e in (1, 2, 4) if (tp * cp * dp) % e == 0])
        real = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=1, vp=2, schedule="dualpipe",
                           rank_order=rng.choice(orders))
        cluster = _random_cluster(rng)
        gpus = real.devices
        got = layouts(fold(real), cluster, gpus)
        whole = layouts(real.with_(schedule=None, vp=1), cluster, gpus)
        grid = rank_grid(real)
        blocks = (*cluster.block_sizes(), gpus)
        assert (got.tp, got.cp) == (whole.tp, whole.cp)
        ends = np.concatenate([grid[0].transpose(2, 0, 1).reshape(tp, -1),
                               grid[-1].transpose(2, 0, 1).reshape(tp, -1)], axis=1)
        assert got.dp.k == _brute_k(ends, blocks) and _brute_counts(got.dp, ends, blocks), real
        egrid = expert_grid(grid, real)
        pair = np.concatenate([_rows(egrid[:1], 1), _rows(egrid[-1:], 1)], axis=1)
        assert got.edp.k == _brute_k(pair, blocks) and _brute_counts(got.edp, pair, blocks), real
        sizes = (1, *_block_sizes(cluster, gpus)[:-1])

        def level(i):  # the highest level real boundary i crosses
            return max((lvl for lvl, b in enumerate(sizes)
                        if np.any(grid[i].ravel() // b != grid[i + 1].ravel() // b)), default=-1)

        want = [max(level(q), level(pp - 2 - q)) for q in range(pp // 2 - 1)] + [level(pp // 2 - 1)]
        assert [b.level for b in got.pp] == want, real


def test_a_slow_link_between_stages_shows_through_overlapped_sends():
    """Two sites joined by a slow link, the pipeline split across it: overlapped send/recv
    cannot hide behind less compute than the link needs, so the step lasts at least every
    micro-batch's sends over it (one activation per chunk each way), a slower link costs
    proportionally more, and on a fast network nothing shows."""
    from nestplan.catalog import scenario_from_names
    from nestplan.evaluate import evaluate
    from nestplan.loaders import cluster_from_table

    def run(gbps):
        cluster = cluster_from_table({
            "name": "two-sites", "accelerator": "h100-sxm-80gb", "levels": [
                {"name": "nvlink", "size": 8, "bandwidth_GBps": 450, "latency_us": 3},
                {"name": "site", "size": 16, "bandwidth_GBps": 50, "latency_us": 14},
                {"name": "dci", "bandwidth_GBps": gbps, "latency_us": 500}]}, get_accelerator)
        sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=4096,
                                 global_batch=1024)
        par = Parallelism(tp=2, pp=4, dp=16, cp=2, vp=8, sp=True, zero=1, mbs=1,
                          rank_order=(Axis.TP, Axis.CP, Axis.DP, Axis.PP))
        return evaluate(dataclasses.replace(sc, cluster=cluster), par)

    slow, slower, fast = run(0.25), run(0.1), run(50.0)
    send = max(s.send for s in slow.stages)
    assert slow.step_time >= slow.micro_batches * 8 * send  # vp = 8 chunks a micro-batch
    assert slow.time.pp > 0.5 * slow.step_time
    assert slower.step_time > 2 * slow.step_time  # 2.5 times slower link
    assert fast.time.pp < 0.05 * fast.step_time and slow.step_time > 2 * fast.step_time


def test_a_group_split_unevenly_by_a_block_is_costed_for_its_most_exposed_members():
    """Four EP groups of 32 on 72-GPU racks: GPUs 64-95 put 8 members in the first rack and 24
    in the second, so those 8 send three quarters of their all-to-all out of the rack; the
    layout says 8 (not the even 16), and the exchange costs what 8-GPU blocks would."""
    from nestplan.placement import layouts

    def racks(size):
        return ClusterSpec(name="r", accelerator=H100.accelerator, levels=(
            Level(name="nvl", size=size, bandwidth=900e9, latency=2e-6),
            Level(name="ib", size=None, bandwidth=50e9, latency=5e-6)))

    par = Parallelism(tp=1, pp=1, dp=128, ep=32, etp=1)
    lay = layouts(par, racks(72), 128).ep
    assert lay.k == (8, 32) and lay.count(0) == 2  # 8 + 24: two racks, not four of 8
    cost = {size: collective_time(CollKind.ALL_TO_ALL, 64e6, layouts(par, racks(size), 128).ep,
                                  racks(size)) for size in (72, 8)}
    assert cost[72] == pytest.approx(cost[8])
    # DeepEP sends a token once per other rack holding one of its experts: the 8 have one other
    # rack, not three. Against an enumeration on a small split (2 + 6 of 8 ranks, 16 experts,
    # top-3): every choice of 3 experts, crossings of a token on the 2-rank side
    import itertools

    from nestplan.cost.network import crossing_share

    rack_of = [0] * 4 + [1] * 12  # 2 ranks x 2 experts here, 6 ranks x 2 over there
    picks = list(itertools.combinations(range(16), 3))
    enumerated = sum(1 for p in picks if any(rack_of[e] for e in p)) / len(picks) / 3
    assert crossing_share(8, 2, (3, 16), others=1) == pytest.approx(enumerated)
    assert crossing_share(32, 8, (8, 256), others=lay.count(0) - 1) < crossing_share(
        32, 8, (8, 256))  # one other rack is crossed less often than three would be


def test_a_larger_nvlink_domain_is_never_slower_for_groups_it_splits():
    """TP 16 on NVLink domains of 72 (whole groups and groups split 8 + 8 over two racks
    alternate) against domains of 8 (every group split 8 + 8), the network above alike: each
    collective costs what its slowest kind of group costs, so the larger domain is no slower for
    a layer's messages (a user trial: the whole groups' 16-way gather and the split groups' climb had been
    combined into one group that does not exist, 3 % slower than domains of 8, Llama 3 70B's step
    too)."""
    def cluster(domain):
        return ClusterSpec(name=f"nvl{domain}", accelerator=get_accelerator("gb200"), levels=(
            Level(name="nvlink", size=domain, bandwidth=900e9, latency=3.4e-6, efficiency=0.82),
            Level(name="leaf", size=8, bandwidth=50e9, latency=14e-6, efficiency=0.96),
            Level(name="spine", size=None, bandwidth=50e9, latency=15e-6, efficiency=0.96)),
            devices_per_host=4)

    par = Parallelism(tp=16, pp=8, dp=9, sp=True)
    big, small = cluster(72), cluster(8)
    wide, narrow = layouts(par, big, 1152).tp, layouts(par, small, 1152).tp
    assert wide.fan and wide.k[0] == 8 and not narrow.fan  # split unevenly, split evenly
    # (below about 10 MB the whole groups' 16 NVLink steps take longer than 8 and one IB hop)
    for kind in (CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER, CollKind.ALL_REDUCE):
        for nbytes in (3e7, 1e8, 1e9):
            assert collective_time(kind, nbytes, wide, big) <= \
                collective_time(kind, nbytes, narrow, small) * (1 + 1e-12), (kind, nbytes)
    from nestplan.evaluate import evaluate
    from nestplan.specs import Scenario, TrainingSpec

    tr = TrainingSpec(seq_len=8192, global_batch=2304)
    step = [evaluate(Scenario(model=get_model("llama3-70b"), cluster=c, gpus=1152, training=tr),
                     par.with_(mbs=1, recompute=("full",), zero=1)).step_time for c in (big, small)]
    assert step[0] <= step[1]
    # the whole groups alone, inside one domain of 72, are cheaper still
    whole = layouts(Parallelism(tp=16, pp=8, dp=8, sp=True), cluster(128), 1024).tp
    assert collective_time(CollKind.ALL_GATHER, 1e8, whole, cluster(128)) < \
        collective_time(CollKind.ALL_GATHER, 1e8, wide, big)


def test_groups_split_by_a_domain_they_do_not_divide_are_noted(tmp_path):
    """TP 16 on 72-GPU NVLink domains: some groups straddle two racks and cross the leaf, which
    evaluate now says (a user trial saw only "tp (16) leaf"); TP 8, which divides 72, is quiet;
    CP groups are judged by the devices they reach over."""
    from console import cli

    path = tmp_path / "nvl72.toml"
    path.write_text('name = "nvl72"\naccelerator = "gb200"\ndevices_per_host = 4\n'
                    '[[levels]]\nname = "nvlink"\nsize = 72\nbandwidth_GBps = 900\nlatency_us = 3.4\n'
                    '[[levels]]\nname = "leaf"\nbandwidth_GBps = 50\nlatency_us = 14\n')
    run = ["evaluate", "--model", "llama3-70b", "--cluster", path, "--gpus", 1152,
           "--mbs", 1, "--global-batch", 2304, "--seq-len", 8192, "--recompute", "full"]
    code, _, err = cli(*run, "--tp", 16, "--pp", 8)
    assert code == 0 and "nvlink domains hold 72 devices, which tp groups of 16 do not divide" \
        in err and "cross the leaf" in err, err
    code, _, err = cli(*run, "--tp", 8, "--pp", 8)
    assert code == 0 and "do not divide" not in err, err
    # CP groups reach over tp·cp devices (Megatron's order): 8·4 = 32 does not divide 72 either
    # (a review's: CP 4, which divides 72, had been let through)
    code, _, err = cli(*run, "--tp", 8, "--cp", 4, "--pp", 4)
    assert code == 0 and "cp groups of 4 (each over 32 devices) do not divide" in err, err


def test_bandwidths_no_network_has_are_noted(tmp_path):
    """A cluster file's bandwidth that reads as a unit slip is noted, by plan and evaluate and by
    a sweep of the file (a datacenter trial's NVLink of 0.45 "GB/s", meant as TB/s, and leaf of
    400 "GB/s", meant as Gb/s, were costed without a word); the catalog's clusters, whose
    figures are sourced (the TPU v4 pod's 429 GB/s beyond a rack), are not."""
    from console import cli

    from nestplan.catalog import list_names
    from nestplan.notes.scenario import unlikely_bandwidths

    assert not [n for n in list_names("clusters") if unlikely_bandwidths(get_cluster(n))]
    assert unlikely_bandwidths(two_level(bw0=0.45e9)).startswith(
        "t: level node gives a device 0.45 GB/s, 111 times less than level net beyond it")
    assert unlikely_bandwidths(two_level(bw0=50e9 / 3.9)) is None  # (slower, not 4 times)
    assert "4 times less than level net" in unlikely_bandwidths(two_level(bw0=50e9 / 4))
    fast = unlikely_bandwidths(two_level(bw1=400e9))
    assert "level net gives a device 400 GB/s, more than any scale-out network" in fast
    # (no key a cluster file refuses: a datacenter trial was pointed to bandwidth_Gbps)
    assert "divide gigabits by 8" in fast and "Gbps" not in fast
    # every such level at once (a datacenter trial fixed the leaf and met the spine's next)
    three = ClusterSpec(name="t", accelerator=H100.accelerator, levels=(
        Level(name="node", size=8, bandwidth=400e9, latency=0.0),
        Level(name="leaf", size=64, bandwidth=400e9, latency=0.0),
        Level(name="spine", size=None, bandwidth=300e9, latency=0.0)))
    assert unlikely_bandwidths(three).startswith(
        "t: levels leaf and spine give a device 400 and 300 GB/s, more than any scale-out")
    assert unlikely_bandwidths(two_level()) is None
    code, out, _ = cli("list", "clusters", "dgx-h100-ndr")
    assert code == 0
    (tmp_path / "c.toml").write_text(out.replace('name = "dgx-h100-ndr"', 'name = "mine"').replace(
        "bandwidth_GBps = 50.0", "bandwidth_GBps = 400.0", 1))
    args = ["--model", "llama3-8b", "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1,
            "--global-batch", 8, "--seq-len", 2048]
    code, out, err = cli("evaluate", "--cluster", tmp_path / "c.toml", *args)
    assert code == 0 and "note: mine: level leaf gives a device 400 GB/s" in err, err
    code, out, err = cli("evaluate", "--cluster", "nest-tpuv4-fattree", *args)
    assert code == 0 and "scale-out" not in err, err  # (it ran: the note had its chance)
    (tmp_path / "s.toml").write_text(f'[grid]\nmodel = ["llama3-8b"]\ncluster = ["{tmp_path}/c.toml"]'
                                     '\ngpus = [8]\n')
    code, out, err = cli("sweep", tmp_path / "s.toml", "--dry-run")
    assert code == 0 and "note: grid: mine: level leaf gives a device 400 GB/s" in err, err


def cluster_file(path, listed: str):
    """A cluster file from ``list clusters``' output, without its levels' efficiencies."""
    path.write_text("\n".join(line for line in listed.splitlines()
                              if not line.startswith("efficiency")))
    return path


def test_levels_without_an_efficiency_and_a_plan_moved_to_a_slipped_cluster_are_noted(tmp_path):
    """A cluster file whose levels give no efficiency is costed at their line rate, which a note
    says (a Megatron user's own file for the catalog's network ran 1.8 % faster than it, without
    a word); a file that gives every level its efficiency, and the catalog's, get none; the
    unit-slip note comes with a saved plan moved to such a file too (it had come only when the
    file was given with the plan's flags)."""
    from console import cli

    from nestplan.catalog import list_names
    from nestplan.notes.scenario import unstated_efficiencies

    assert not [n for n in list_names("clusters") if unstated_efficiencies(get_cluster(n))]
    code, out, _ = cli("list", "clusters", "dgx-h100-ndr")
    stated = out.replace('name = "dgx-h100-ndr"', 'name = "mine"')
    (tmp_path / "stated.toml").write_text(stated)
    assert unstated_efficiencies(get_cluster(str(tmp_path / "stated.toml"))) is None
    bare = "\n".join(line for line in stated.splitlines() if not line.startswith("efficiency"))
    (tmp_path / "bare.toml").write_text(bare)
    text = unstated_efficiencies(get_cluster(str(tmp_path / "bare.toml")))
    assert text.startswith("mine: levels nvlink, leaf, spine, core give no efficiency")
    args = ["--model", "llama3-8b", "--gpus", 16, "--tp", 8, "--pp", 1, "--mbs", 1,
            "--global-batch", 16, "--seq-len", 2048]
    code, out, err = cli("evaluate", "--cluster", tmp_path / "bare.toml", *args, "--save",
                         tmp_path / "p.json")
    assert code == 0 and f"note: {text}" in err, err
    step = float(out.split("step time")[1].split()[0])
    code, out, err = cli("evaluate", "--cluster", "dgx-h100-ndr", *args)
    assert "give no efficiency" not in err
    assert float(out.split("step time")[1].split()[0]) > step  # (line rate: faster)
    (tmp_path / "slip.toml").write_text(stated.replace("bandwidth_GBps = 50.0",
                                                       "bandwidth_GBps = 400.0", 1))
    code, out, err = cli("evaluate", "--plan", tmp_path / "p.json", "--cluster",
                         tmp_path / "slip.toml")
    assert code == 0 and "note: mine: level leaf gives a device 400 GB/s" in err, err
    # said where a user checks the file too; the figures named are those of a catalog cluster
    # of the file's accelerator (a DeepSpeed trial's A100 file had been told H100's)
    code, out, err = cli("list", "clusters", tmp_path / "bare.toml")
    assert code == 0 and f"note: {text}" in err and "devices under one block" in out
    assert 'name = "mine"' in out and "give no efficiency" not in out  # (the file, not a note)
    code, out, _ = cli("list", "clusters", "selene-a100-hdr")
    cluster_file(tmp_path / "a100.toml", out.replace('name = "selene-a100-hdr"', 'name = "a100s"'))
    code, out, err = cli("list", "clusters", tmp_path / "a100.toml")
    assert "the catalog's selene-a100-hdr, on a100-sxm-80gb too, gives nvlink 0.77" in err, err
    assert "the catalog's dgx-h100-ndr, on h100-sxm-80gb too, gives nvlink 0.82" in text
    # the NEST paper's clusters, at its artifact's efficiency 1.0, are no reference (a review's)
    code, out, _ = cli("list", "clusters", "nest-tpuv4-fattree")
    tpu = cluster_file(tmp_path / "tpu.toml", out.replace('name = "nest-tpuv4-fattree"',
                                                          'name = "tpu"'))
    said = unstated_efficiencies(get_cluster(str(tpu)))
    assert said and "the catalog's dgx-h100-ndr, gives nvlink 0.82" in said, said


def test_the_embedding_copies_all_reduce_is_a_group_of_its_own():
    """A tied output weight on the last stage all-reduces its gradient with the embedding's on
    the first: its traffic and the level it crosses are named apart from dp's (a datacenter
    trial read spine traffic as dp's, whose groups stayed under a leaf); a V, which holds both
    on device 0, has no such group, nor does a model without a copy."""
    from nestplan.catalog import scenario_from_names
    from nestplan.evaluate import evaluate

    sc = scenario_from_names("gpt-7p5b", "dgx-h100-ndr", 512, seq_len=2048, global_batch=512)
    par = Parallelism(tp=8, pp=16, dp=4, mbs=1, zero=1)
    ev = evaluate(sc, par)
    assert ev.group_levels["dp"][1] == "leaf" and ev.group_levels["embedding"] == (2, "spine")
    assert ev.link_time["embedding"] > 0
    assert ev.to_json()["groups"]["embedding"] == {"size": 2, "top_level": "spine"}
    # what shows of each reduction is at most its time on the links, and they share the tail
    assert 0 < ev.time.embedding <= ev.link_time["embedding"]
    assert 0 < ev.time.dp <= ev.link_time["dp"]
    assert ev.to_json()["time_s"]["embedding"] == ev.time.embedding
    for schedule in ("zbv", "dualpipe"):  # the head beside the embedding: nothing all-reduced
        v = evaluate(sc, par.with_(vp=2, schedule=schedule), stack_offers=False)
        assert "embedding" not in v.group_levels
        assert v.link_time["embedding"] == v.time.embedding == 0
    # DualPipe's dp group is its fold's: a stage's replicas on both of its ranks (a review: it
    # had been named as the unfolded plan's, in a leaf, for a reduction over twice the ranks)
    dual = evaluate(sc, par.with_(vp=2, schedule="dualpipe"), stack_offers=False)
    assert ev.group_levels["dp"] == (4, "leaf")
    assert dual.group_levels["dp"] == (8, "spine") and dual.group_levels["pp"][0] == 16
    untied = evaluate(scenario_from_names("llama3-8b", "dgx-h100-ndr", 512, seq_len=2048,
                                          global_batch=512), par)
    assert "embedding" not in untied.group_levels and untied.link_time["embedding"] == 0


def test_a_job_straddling_its_racks_is_told_what_fewer_devices_of_each_would_give(tmp_path):
    """NVL72 racks given whole (size 72) under 2,048 GPUs: the plan's 64-rank expert groups
    straddle racks, and the note says what it takes with 64 of each rack's 72 used, as NeMo's
    launcher places them (a datacenter trial had found it only by editing the file); with 64 a
    rack given, nothing to say."""
    from console import cli

    code, out, _ = cli("list", "clusters", "gb200-nvl72-ndr")
    lines = out.replace('name = "gb200-nvl72-ndr"', 'name = "racks72"').splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("size = "))
    lines[first] = "size = 72"
    (tmp_path / "r72.toml").write_text("\n".join(lines) + "\n")
    args = ["--model", "deepseek-v3", "--gpus", 2048, "--tp", 1, "--pp", 16, "--ep", 64, "--etp",
            1, "--mbs", 1, "--global-batch", 4096, "--seq-len", 4096, "--recompute", "full",
            "--json"]
    code, out, err = cli("evaluate", "--cluster", tmp_path / "r72.toml", *args)
    assert code == 0, err
    code, ref, _ = cli("evaluate", "--cluster", "gb200-nvl72-ndr", *args)
    step, at64 = json.loads(out)["step_time_s"], json.loads(ref)["step_time_s"]
    assert at64 < 0.97 * step
    from nestplan.units import fmt_time

    assert (f"note: with 64 of each nvlink domain's 72 devices used (a cluster file with nvlink's "
            f"size 64, as NeMo's launcher places NVL72 racks, every domain then filled alike), "
            f"this plan takes {fmt_time(at64)} ({at64 / step - 1:+.0%})") in err, err
    code, out, err = cli("evaluate", "--cluster", "gb200-nvl72-ndr", *args)
    assert code == 0 and "devices used (a cluster file" not in err, err


_FAT_TREE = """\
name = "ft"
accelerator = "h100-sxm-80gb"

[[levels]]
name = "nvlink"
bandwidth_GBps = 450.0
latency_us = 3.4
efficiency = 0.82
size = 8

[[levels]]
name = "leaf"
bandwidth_GBps = 50.0
latency_us = 14.0
efficiency = 0.96
size = 32

[[levels]]
name = "spine"
bandwidth_GBps = 50.0
latency_us = 15.0
oversubscription = {over}
efficiency = 0.96
size = 16
"""
"""A datacenter trial's 4,096-GPU two-tier fat tree, its spine oversubscribed ``over``:1."""


def test_an_oversubscription_that_slows_nothing_is_said_so(tmp_path):
    """A plan whose groups cross an oversubscribed spine and that takes the same step at 1:1 is
    told why (a datacenter trial's 1:1, 2:1 and 4:1 spines gave one step, its data-parallel ring
    shown crossing the spine: here 32 of its 512 members share each leaf's one crossing); one the
    spine slows (its pipeline's sends cross it) is not."""
    from console import cli

    def run(over, *plan):
        path = tmp_path / f"ft{over}.toml"
        path.write_text(_FAT_TREE.format(over=over))
        code, out, err = cli("evaluate", "--model", "llama3-70b", "--cluster", path, "--gpus",
                             4096, "--tp", 8, "--mbs", 1, "--global-batch", 2048, "--seq-len",
                             8192, *plan, "--json")
        assert code == 0, err
        return json.loads(out)["step_time_s"], err

    ring = ("--pp", 1, "--recompute", "full")
    (flat, said), (over, noted) = run(1, *ring), run(4, *ring)
    assert flat == over
    assert "level spine's 4:1 oversubscription does not slow this plan" in noted
    assert "(dp) send across it" in noted and "oversubscription" not in said
    (flat, _), (over, noted) = run(1, "--pp", 4), run(4, "--pp", 4)
    assert over > flat and "oversubscription does not slow" not in noted
