"""Placement: which devices form each parallel group, and which network levels a group spans.

Ranks are laid out by the plan's rank order (innermost axis = consecutive ranks) and rank ``r``
runs on device ``r``; devices fill the cluster's levels in order (device ``d`` sits in block
``d // B_l`` of level ``l``, where ``B_l`` is the number of devices under one level-``l`` group).
Every statement about which link a group uses goes through :func:`layouts` — no formula elsewhere
assumes a node size.

Invariants of a :class:`GroupLayout` with ``n`` members over levels ``0..L-1``:
``1 <= k[0] <= k[1] <= ... <= k[L-1] = n``, where ``k[l]`` is the largest number of members that
share one level-``l`` block. The group's traffic crosses level ``l`` when ``k[l] > k[l-1]``
(``k[-1] = 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .axes import Axis
from .specs import ClusterSpec, Parallelism


@dataclass(frozen=True)
class GroupLayout:
    """How one group (TP, CP, EP, DP, ...) of ``size`` devices spreads over the levels."""

    size: int
    k: tuple[int, ...]
    """Members of the group inside one block of each level (the last entry is ``size``)."""
    share: tuple[float, ...] = ()
    """Per level, the fraction of a lower block's devices whose traffic crosses this level at once
    (1.0 for collectives, where every device is in some group; empty = all 1.0)."""

    @property
    def top(self) -> int:
        """Highest level the group's traffic crosses (0 = stays inside a node; -1 = single device)."""
        prev, top = 1, -1
        for lvl, kl in enumerate(self.k):
            if kl > prev:
                top = lvl
            prev = kl
        return top


@dataclass(frozen=True)
class Boundary:
    """A pipeline boundary: send/recv between consecutive stages (or model chunks)."""

    level: int
    """Highest level the transfer crosses (-1 when both ends are the same device)."""
    share: tuple[float, ...]
    """Per level, fraction of a lower block's devices sending across it in the steady state."""


@dataclass(frozen=True)
class Layouts:
    """Every group of a plan on a cluster."""

    tp: GroupLayout
    cp: GroupLayout
    dp: GroupLayout
    """Dense-gradient reduction group: the data- and context-parallel ranks (dp·cp)."""
    ep: GroupLayout
    etp: GroupLayout
    edp: GroupLayout
    """Expert-gradient reduction group (expert data parallelism)."""
    pp: tuple[Boundary, ...]
    """Boundary after each physical stage; with virtual stages the last one wraps to stage 0."""
    embedding: GroupLayout
    """First and last stage (tied-embedding gradient all-reduce)."""


def _block_sizes(cluster: ClusterSpec, gpus: int) -> tuple[int, ...]:
    """Devices under one block of each level; the outermost block holds every device."""
    return (*cluster.block_sizes(), max(gpus, 1))


def _group_k(groups: np.ndarray, blocks: tuple[int, ...]) -> tuple[int, ...]:
    """k per level for groups given as rows of device ids (worst row: most blocks touched)."""
    n = groups.shape[1]
    ks = []
    for b in blocks:
        ids = np.sort(groups // b, axis=1)
        distinct = 1 + (np.diff(ids, axis=1) != 0).sum(axis=1)
        ks.append(-(-n // int(distinct.max())))
    ks[-1] = n
    # a block of a higher level holds at least the members of the lower block
    for i in range(1, len(ks)):
        ks[i] = max(ks[i], ks[i - 1])
    return tuple(ks)


def rank_grid(par: Parallelism) -> np.ndarray:
    """Device id of every rank, indexed ``[pp, dp, cp, tp]``."""
    sizes = {Axis.TP: par.tp, Axis.CP: par.cp, Axis.DP: par.dp, Axis.PP: par.pp}
    stride, strides = 1, {}
    for ax in par.rank_order:
        strides[ax] = stride
        stride *= sizes[ax]
    idx = np.ix_(*(np.arange(sizes[a]) for a in (Axis.PP, Axis.DP, Axis.CP, Axis.TP)))
    return (idx[0] * strides[Axis.PP] + idx[1] * strides[Axis.DP] + idx[2] * strides[Axis.CP]
            + idx[3] * strides[Axis.TP])


def _expert_grid(grid: np.ndarray, par: Parallelism) -> np.ndarray:
    """Device ids per stage as ``[pp, edp, ep, etp]``.

    The expert mesh re-splits each stage's dense ranks taken in the logical order tp, cp, dp
    (tp fastest) into (etp, ep, edp), etp fastest: Megatron-Core's expert rank generator over
    its dense numbering, and torchtitan's (etp = 1) ``efsdp × ep`` over ``dp_shard × cp × tp``.
    The rank order moves these groups over the devices only through the dense grid.
    """
    etp, ep = par.expert_tp, par.ep
    return grid.reshape(par.pp, -1, ep, etp)


def _rows(arr: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(arr, axis, -1).reshape(-1, arr.shape[axis])


def layouts(par: Parallelism, cluster: ClusterSpec, gpus: int) -> Layouts:
    """Group layouts of ``par`` when its ranks fill ``gpus`` devices of ``cluster`` in order."""
    return _layouts((par.tp, par.pp, par.dp, par.cp, par.ep, par.expert_tp, par.vp,
                     par.rank_order), cluster, gpus)


@lru_cache(maxsize=8192)
def _layouts(key: tuple, cluster: ClusterSpec, gpus: int) -> Layouts:
    tp, pp, dp, cp, ep, etp, vp, order = key
    par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vp=vp, rank_order=order)
    blocks = _block_sizes(cluster, gpus)
    grid = rank_grid(par)
    egrid = _expert_grid(grid, par)

    def lay(rows: np.ndarray) -> GroupLayout:
        return GroupLayout(rows.shape[1], _group_k(rows, blocks))

    dp_rows = grid.transpose(0, 3, 1, 2).reshape(-1, par.dp * par.cp)
    boundaries = []
    total = gpus
    pairs = [(i, i + 1) for i in range(par.pp - 1)]
    if par.vp > 1:
        pairs.append((par.pp - 1, 0))
    # steady-state sharing: fraction of each block's devices whose next stage lies outside it
    src = grid[:-1].ravel() if par.pp > 1 else np.zeros(0, dtype=int)
    dst = grid[1:].ravel() if par.pp > 1 else np.zeros(0, dtype=int)
    share = tuple(float(np.count_nonzero(src // b != dst // b)) / total if total else 0.0
                  for b in (1, *blocks[:-1]))
    for i, j in pairs:
        a, b = grid[i].ravel(), grid[j].ravel()
        level = -1
        for lvl, bs in enumerate((1, *blocks[:-1])):
            if np.any(a // bs != b // bs):
                level = lvl
        boundaries.append(Boundary(level, share))
    emb = np.stack([grid[0].ravel(), grid[-1].ravel()], axis=1)
    return Layouts(
        tp=lay(_rows(grid, 3)),
        cp=lay(_rows(grid, 2)),
        dp=lay(dp_rows),
        ep=lay(_rows(egrid, 2)),
        etp=lay(_rows(egrid, 3)),
        edp=lay(_rows(egrid, 1)),
        pp=tuple(boundaries),
        embedding=lay(emb) if par.pp > 1 else GroupLayout(1, tuple(1 for _ in blocks)),
    )


def stage_devices(par: Parallelism) -> tuple[tuple[int, ...], ...]:
    """Device ids of every pipeline stage (all replicas and TP/CP ranks), in stage order."""
    grid = rank_grid(par)
    return tuple(tuple(np.sort(grid[i].ravel()).tolist()) for i in range(par.pp))
