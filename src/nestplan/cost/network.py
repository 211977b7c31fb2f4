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
* hierarchical: reduce-scatter inside each level from the innermost out, then all-gather back;
  each phase moves only the shard left by the phases below it; phases add up.
* tree (all-reduce only): pipelined binary trees between blocks, latency logarithmic in the
  number of blocks.
"""

from __future__ import annotations

import math

from ..graph import CollKind
from ..placement import GroupLayout
from ..specs import ClusterSpec


def level_bandwidth(cluster: ClusterSpec, level: int, share=None) -> float:
    """Bytes/s one device gets for traffic crossing ``level`` (see the module docstring)."""
    best = math.inf
    for j in range(level + 1):
        lv = cluster.levels[j]
        s = 1.0 if share is None else share(j)
        best = min(best, lv.bandwidth * lv.efficiency / max(1.0, lv.oversubscription * s))
    return best


def _ring(kind: CollKind, nbytes: float, g: GroupLayout, cluster: ClusterSpec) -> float:
    n = g.size
    traversals = 2 if kind is CollKind.ALL_REDUCE else 1
    volume = traversals * nbytes * (n - 1) / n
    bw_time = 0.0
    latency = 0.0
    prev = 1
    for lvl, kl in enumerate(g.k):
        if kl > prev:
            bw_time = max(bw_time, volume / prev / level_bandwidth(cluster, lvl, g.share_at))
            # ring steps whose hop crosses exactly this level, per traversal
            steps = n / prev - (n / kl if kl < n else 1)
            latency += steps * cluster.levels[lvl].latency
        prev = kl
    return bw_time + traversals * latency


def _hierarchical(kind: CollKind, nbytes: float, g: GroupLayout, cluster: ClusterSpec) -> float:
    traversals = 2 if kind is CollKind.ALL_REDUCE else 1
    total = 0.0
    prev = 1
    for lvl, kl in enumerate(g.k):
        if kl > prev:
            r = kl // prev
            shard = nbytes / prev
            bw = level_bandwidth(cluster, lvl, g.share_at)
            total += traversals * (shard * (r - 1) / r / bw + (r - 1) * cluster.levels[lvl].latency)
        prev = kl
    return total


def _tree(nbytes: float, g: GroupLayout, cluster: ClusterSpec) -> float:
    bw_time, latency, prev = 0.0, 0.0, 1
    for lvl, kl in enumerate(g.k):
        if kl > prev:
            r = kl // prev
            bw_time = max(bw_time, 2 * nbytes / prev / level_bandwidth(cluster, lvl, g.share_at))
            latency += 2 * math.ceil(math.log2(r)) * cluster.levels[lvl].latency
        prev = kl
    return bw_time + latency


def _flat_ring(kind: CollKind, nbytes: float, g: GroupLayout, cluster: ClusterSpec) -> float:
    """A ring that sends everything over each device's own link at the group's top level."""
    n, top = g.size, g.top
    traversals = 2 if kind is CollKind.ALL_REDUCE else 1
    bw = level_bandwidth(cluster, top, g.share_at)
    return traversals * ((nbytes * (n - 1) / n) / bw + (n - 1) * cluster.levels[top].latency)


def collective_time(kind: CollKind, nbytes: float, g: GroupLayout, cluster: ClusterSpec,
                    flat: bool = False) -> float:
    """Seconds for one collective of ``nbytes`` (see :class:`~nestplan.graph.CollKind`) on ``g``.

    ``flat``: force a flat ring at the top level (no aggregation of a node's links).
    """
    n = g.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    top = g.top
    if flat and kind in (CollKind.ALL_REDUCE, CollKind.ALL_GATHER, CollKind.REDUCE_SCATTER):
        return _flat_ring(kind, nbytes, g, cluster)
    if kind is CollKind.ALL_TO_ALL:
        # every device sends (n-1)/n of its data, each over its own links (no NIC aggregation)
        t, prev = 0.0, 1
        for lvl, kl in enumerate(g.k):
            if kl > prev:
                outside = (n - prev) / n
                t = max(t, nbytes * outside / level_bandwidth(cluster, lvl, g.share_at))
            prev = kl
        return t + 2 * cluster.levels[top].latency
    if kind is CollKind.RING_EXCHANGE:
        step = nbytes / level_bandwidth(cluster, top, g.share_at) + cluster.levels[top].latency
        return (n - 1) * step
    if kind is CollKind.SEND_RECV:
        return nbytes / level_bandwidth(cluster, top, g.share_at) + cluster.levels[top].latency
    best = min(_ring(kind, nbytes, g, cluster), _hierarchical(kind, nbytes, g, cluster))
    if kind is CollKind.ALL_REDUCE:
        best = min(best, _tree(nbytes, g, cluster))
    return best


def p2p_time(nbytes: float, level: int, share, cluster: ClusterSpec) -> float:
    """Send/recv of ``nbytes`` across ``level`` (-1: same device, free)."""
    if level < 0 or nbytes <= 0:
        return 0.0
    return nbytes / level_bandwidth(cluster, level, share) + cluster.levels[level].latency
