"""Collective and point-to-point times over the levels a group spans (alpha-beta per level).

Bandwidth available to one device for traffic that crosses level ``l`` (leaves its level-``l-1``
block) is limited by every level it climbs through::

    bw(l) = min over j <= l of  bandwidth_j · efficiency_j / max(1, oversubscription_j · share_j)

where ``share_j`` is the fraction of a block's devices sending across level ``j`` at the same time
(1 for collectives: every device is in some group of the axis and all groups run together).

Algorithms (the cheapest is used, as NCCL's tuner does):

* ring, ordered by topology with one channel per member NIC: each level's links carry the ring's
  traffic divided by the members that share a lower block (their NICs carry separate channels);
  levels run pipelined, so the slowest level sets the time; one latency per ring step.
* hierarchical (all-reduce only): reduce-scatter inside each level from the innermost out, then
  all-gather back; each phase moves only the shard left by the phases below it; phases add up.
* tree (all-reduce only): pipelined binary trees between blocks, latency logarithmic in the
  number of blocks.

Reduce-scatter and all-gather run as rings only: NCCL runs them as Ring, or PAT (one rank per
node), NVLS (NVLink SHARP) or CollNetDirect (in-network reduction), and no tree or hierarchy
(``ncclTopoTuneModel``, src/graph/tuning.cc @ NVIDIA/nccl 5067397c26, its loop over algorithms
per collective). Costing them hierarchically had made a group spread over two levels cheaper
than the same group inside one larger level (fewer latency steps), so that a larger switch
domain slowed a plan (a datacenter trial's); no scored row moved by more than 1.1 points.

Where groups that fit a scale-up domain alternate between whole ones and ones split over two
domains (the domain's size not a multiple of theirs), the last two are costed for each kind and
the slowest sets the time (``_phases``).
"""

from __future__ import annotations

import math

from ..caching import cached
from ..graph import CollKind
from ..placement import GroupLayout
from ..specs import ClusterSpec


@cached(maxsize=65536)
def level_bandwidth(cluster: ClusterSpec, level: int, share: tuple[float, ...] = ()) -> float:
    """Bytes/s one device gets for traffic crossing ``level`` (see the module docstring).

    ``share[j]``: fraction of a level-``j-1`` block's devices crossing level ``j`` at once
    (missing entries count as 1: every device).
    """
    best = math.inf
    for j in range(level + 1):
        lv = cluster.levels[j]
        s = share[j] if j < len(share) else 1.0
        best = min(best, lv.bandwidth * lv.efficiency / max(1.0, lv.oversubscription * s))
    return best


def _fan_in(g: GroupLayout, lvl: int) -> int:
    """Blocks of the level below that one block of ``lvl`` gathers for the group: the most any
    block holds members of (``GroupLayout.fan``), or its lower blocks over its blocks when the
    group fills them evenly."""
    if g.fan:
        return g.fan[lvl]
    return max(1, round(g.count(lvl - 1) / g.count(lvl)))


def _ring(kind: CollKind, g: GroupLayout, cluster: ClusterSpec) -> tuple[float, float]:
    n = g.size
    traversals = 2 if kind is CollKind.ALL_REDUCE else 1
    per_byte, latency, prev = 0.0, 0.0, 1
    for lvl, kl in enumerate(g.k):
        if kl > prev:
            # the fewest members of a block (``prev``) carry the ring's crossing flow
            share = traversals * (n - 1) / n / prev
            per_byte = max(per_byte, share / level_bandwidth(cluster, lvl, g.share))
            # ring steps whose hop crosses exactly this level, per traversal
            steps = g.count(lvl - 1) - g.count(lvl)
            latency += steps * cluster.levels[lvl].latency
        prev = kl
    return traversals * latency, per_byte


def _phases(g: GroupLayout) -> list[list[tuple[int, int, int]]]:
    """The phases of a hierarchical collective, (level, lower blocks one block gathers, members
    in each lower block), for each kind of group the axis has; the slowest sets the time.

    One chain in general: at each level the most lower blocks a block gathers and the fewest
    members in a lower block. Where an axis's groups fit a scale-up domain but the domain's size
    is not a multiple of theirs (TP 16 on 72-GPU NVLink domains), whole groups inside a domain
    alternate with groups split over two: that chain would take the whole groups' gather at the
    bottom and the split groups' climb above it, a group that does not exist (a user trial's
    NVL72 costed slower than NVL8). The two kinds are costed apart there: a split group gathers
    its larger part inside a domain (``size`` less its fewest, ``k[0]``) and the two domains at
    its top level; a whole group gathers all of its members inside one."""
    if g.fan and g.blocks and g.fan[0] >= g.size > g.k[0] and g.blocks[0] == 2:
        larger = g.size - g.k[0]
        split = ([(0, larger, 1)] if larger > 1 else []) + [(g.top, 2, g.k[0])]
        return [split, [(0, g.size, 1)]]
    chain, prev = [], 1
    for lvl, kl in enumerate(g.k):
        if kl > prev:
            chain.append((lvl, _fan_in(g, lvl), prev))
        prev = kl
    return [chain]


def _slowest(pairs: list[tuple[float, float]]):
    """One algorithm's coefficients over the groups it runs on: a (latency, per-byte) pair, or
    a tuple of them where groups differ, whose slowest sets the time (``coeff_time``)."""
    return pairs[0] if len(pairs) == 1 else tuple(pairs)


def _hierarchical(kind: CollKind, g: GroupLayout, cluster: ClusterSpec):
    traversals = 2 if kind is CollKind.ALL_REDUCE else 1
    return _slowest([(
        sum(traversals * (r - 1) * cluster.levels[lvl].latency for lvl, r, _ in chain),
        sum(traversals * (r - 1) / r / m / level_bandwidth(cluster, lvl, g.share)
            for lvl, r, m in chain)) for chain in _phases(g)])


def _tree(g: GroupLayout, cluster: ClusterSpec):
    return _slowest([(
        sum(2 * math.ceil(math.log2(r)) * cluster.levels[lvl].latency for lvl, r, _ in chain),
        max((2 / m / level_bandwidth(cluster, lvl, g.share) for lvl, _, m in chain),
            default=0.0)) for chain in _phases(g)])


def _flat_ring(kind: CollKind, g: GroupLayout, cluster: ClusterSpec) -> tuple[float, float]:
    """A ring that sends everything over each device's own link at the group's top level."""
    n, top = g.size, g.top
    traversals = 2 if kind is CollKind.ALL_REDUCE else 1
    bw = level_bandwidth(cluster, top, g.share)
    return traversals * (n - 1) * cluster.levels[top].latency, traversals * (n - 1) / n / bw


Coeffs = tuple
"""Each algorithm's (latency s, seconds per byte), or a tuple of such pairs for an algorithm whose
groups differ (the slowest sets its time): ``collective_coeffs``."""


def crossing_share(n: int, inside: int, dedup: tuple[int, ...] = (0, 0),
                   others: int | None = None) -> float:
    """Share of an all-to-all's data (the routed copies a device holds) that leaves a block of
    ``inside`` of the ``n`` group members, under uniform routing; the other members lie in
    ``others`` other blocks (default: as many as an even fill makes, ``n / inside - 1``;
    ``placement`` gives a group split unevenly by a block boundary the fewest members it has in
    one block: its most exposed members').

    Plain: the copies bound for the other ``n - inside`` members. Deduplicating (``dedup`` =
    (top-k, experts) or (top-k, experts, groups, groups chosen), DeepEP): a token crosses once
    per other block holding at least one of its k experts, so the expected crossings per token
    are others·(1 - the chance that a block misses all k, ``block_missed``) with the other
    members spread evenly over the other blocks, out of the k copies counted in the data.
    """
    k, experts = dedup[:2]
    if k <= 1 or inside <= 1:
        return (n - inside) / n
    others = n // inside - 1 if others is None else others
    if others <= 0:
        return 0.0
    per_block = experts * (n - inside) // (n * others)
    return others * (1 - block_missed(per_block, k, experts, *dedup[2:])) / k


def block_missed(held: int, k: int, experts: int, groups: int = 1, chosen: int = 1) -> float:
    """The chance that a block of EP ranks holding ``held`` of the ``experts`` (contiguous, as
    Megatron-Core lays experts over EP ranks) holds none of a token's ``k`` distinct experts.

    Uniform routing: C(E - held, k) / C(E, k). Group-limited routing (``groups`` contiguous
    groups of experts, ``chosen`` of them per token: DeepSeek-V3's node-limited routing,
    Megatron-Core's ``--moe-router-num-groups``/``--moe-router-group-topk``) picks the groups
    by their best k/chosen scores, then the k experts inside them
    (``moe_utils.group_limited_topk``, NVIDIA/Megatron-LM d98e8a64dd), so a chosen group almost
    always receives one (97 % of tokens have all 4 of DeepSeek-V3's chosen groups hit under the
    random scores of a force-balanced run, simulated; the crossings below are checked against
    that code in the tests): a block of
    whole groups is missed when none of them is chosen, C(G - j, g) / C(G, g); a block inside
    one group when that group is not chosen or its k/g experts fall elsewhere in it. A block
    that cuts groups otherwise is taken as uniform routing. Against Megatron-Core's own routing
    (tests): within 1 % where blocks hold whole groups (DeepSeek-V3 with EP over 2, 4 or 8
    nodes); 4-6 % more crossings than it where blocks lie inside groups (16 or 32 nodes), the
    chosen groups' experts not being split evenly."""
    uniform = math.comb(experts - held, k) / math.comb(experts, k)
    if groups <= 1 or chosen >= groups:
        return uniform
    size = experts // groups
    if held % size == 0:
        return math.comb(groups - held // size, chosen) / math.comb(groups, chosen)
    if size % held == 0:
        per_group = max(1, k // chosen)
        inside = math.comb(size - held, per_group) / math.comb(size, per_group)
        return 1 - chosen / groups * (1 - inside)
    return uniform


@cached(maxsize=65536)
def collective_coeffs(kind: CollKind, g: GroupLayout, cluster: ClusterSpec,
                      flat: bool = False, dedup: tuple[int, ...] = (0, 0)) -> Coeffs:
    """(latency s, seconds per byte) of each algorithm that can run the collective on ``g`` (a
    tuple of such pairs for one whose groups differ: ``_phases``).

    The collective's time for ``b > 0`` bytes is the cheapest ``latency + b · per_byte`` (of an
    algorithm with several pairs, their slowest); an empty tuple means it is free (a single
    device). ``flat`` forces the flat ring; ``dedup``:
    an all-to-all that sends a token once per remote block (``crossing_share``) beyond the
    innermost level.
    """
    n = g.size
    if n <= 1:
        return ()
    top = g.top
    lat = cluster.levels[top].latency
    if kind is CollKind.ALL_TO_ALL:
        # each device's data leaving each block, over its own links (no NIC aggregation)
        per_byte, prev = 0.0, 1
        for lvl, kl in enumerate(g.k):
            if kl > prev:
                d = (0, 0)  # inside a node: no deduplication
                if lvl > 0:  # group-limited routing narrows the blocks a token reaches only
                    # where blocks hold runs of consecutive EP ranks (so of experts)
                    d = dedup if g.consecutive(lvl - 1) else dedup[:2]
                share = crossing_share(n, prev, d,
                                       others=g.count(lvl - 1) - 1 if lvl > 0 else None)
                per_byte = max(per_byte, share / level_bandwidth(cluster, lvl, g.share))
            prev = kl
        return ((2 * lat, per_byte),)
    if kind is CollKind.RING_EXCHANGE:  # n - 1 steps of the given bytes
        return (((n - 1) * lat, (n - 1) / level_bandwidth(cluster, top, g.share)),)
    if kind is CollKind.SEND_RECV:
        return ((lat, 1.0 / level_bandwidth(cluster, top, g.share)),)
    if flat:
        return (_flat_ring(kind, g, cluster),)
    if kind is not CollKind.ALL_REDUCE:
        return (_ring(kind, g, cluster),)
    return _ring(kind, g, cluster), _hierarchical(kind, g, cluster), _tree(g, cluster)


def coeff_time(coeffs: Coeffs, nbytes):
    """Time of a collective with ``coeffs`` for ``nbytes`` (a number or a numpy array)."""
    import numpy as np

    if not coeffs:
        return nbytes * 0.0
    t = None
    for algo in coeffs:  # the cheapest algorithm; of one run on differing groups, the slowest
        c = None
        for lat, per_byte in (algo if isinstance(algo[0], tuple) else (algo,)):
            one = lat + per_byte * nbytes
            c = one if c is None else np.maximum(c, one)
        t = c if t is None else np.minimum(t, c)
    return np.where(nbytes > 0, t, 0.0) if isinstance(nbytes, np.ndarray) else (
        float(t) if nbytes > 0 else 0.0)


def collective_time(kind: CollKind, nbytes: float, g: GroupLayout, cluster: ClusterSpec,
                    flat: bool = False, dedup: tuple[int, ...] = (0, 0)) -> float:
    """Seconds for one collective of ``nbytes`` (see :class:`~nestplan.graph.CollKind`) on ``g``.

    ``flat``: force a flat ring at the top level (no aggregation of a node's links); ``dedup``:
    see ``collective_coeffs``.
    """
    return coeff_time(collective_coeffs(kind, g, cluster, flat, dedup), nbytes)


def p2p_time(nbytes: float, level: int, share: tuple[float, ...], cluster: ClusterSpec) -> float:
    """Send/recv of ``nbytes`` across ``level`` (-1: same device, free)."""
    if level < 0 or nbytes <= 0:
        return 0.0
    return nbytes / level_bandwidth(cluster, level, share) + cluster.levels[level].latency
