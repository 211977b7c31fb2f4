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

import math
from dataclasses import dataclass, replace

import numpy as np

from .caching import cached
from .axes import RANK_AXES, Axis
from .specs import ClusterSpec, Parallelism, fold


@dataclass(frozen=True)
class GroupLayout:
    """How one group (TP, CP, EP, DP, ...) of ``size`` devices spreads over the levels."""

    size: int
    k: tuple[int, ...]
    """Members of the group inside one block of each level (the last entry is ``size``): for a
    group a block boundary splits unevenly, the fewest it has in one block (its most exposed
    members, whose traffic leaves the block the most)."""
    share: tuple[float, ...] = ()
    """Per level, the largest fraction of one lower block's devices whose traffic crosses this
    level at once (1.0 for collectives, where every device is in some group; empty = all 1.0)."""
    blocks: tuple[int, ...] = ()
    """Blocks of each level that a group touches, at most (the last entry is 1; empty: ``size``
    over ``k``, a group that fills its blocks evenly)."""
    fan: tuple[int, ...] = ()
    """Per level, the most blocks of the level below (devices below level 0) that one block of
    this level holds members of: what a hierarchical collective gathers there (empty: a group
    that fills its blocks evenly, ``count(level - 1) / count(level)``)."""
    runs: tuple[bool, ...] = ()
    """Per bounded level, whether every block holds a run of consecutive members by the group's
    own index (an EP group's: consecutive EP ranks hold consecutive experts, so a node then
    holds whole router groups); empty: not known (groups other than EP)."""

    def consecutive(self, level: int) -> bool:
        """Blocks of ``level`` hold runs of consecutive members (``runs``; True when unknown)."""
        return not self.runs or level >= len(self.runs) or self.runs[level]

    def count(self, level: int) -> int:
        """Blocks of ``level`` the group touches (-1: its devices)."""
        if level < 0:
            return self.size
        return self.blocks[level] if self.blocks else max(1, self.size // self.k[level])

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
    """Per level, the largest fraction of one lower block's devices sending across it at once in
    the steady state (``_busiest_block``)."""


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


def _alone(blocks: tuple[int, ...]) -> GroupLayout:
    """A group of one device (nothing crosses any level)."""
    return GroupLayout(1, tuple(1 for _ in blocks))


def _block_sizes(cluster: ClusterSpec, gpus: int) -> tuple[int, ...]:
    """Devices under one block of each level; the outermost block holds every device."""
    return (*cluster.block_sizes(), max(gpus, 1))


def _starts(rows: np.ndarray, b: int) -> np.ndarray:
    """Over sorted rows of device ids: where a row enters a new block of size ``b``."""
    blk = rows // b
    starts = np.ones(blk.shape, dtype=bool)
    starts[:, 1:] = blk[:, 1:] != blk[:, :-1]
    return starts


Level = tuple[int, int, int, int]
"""A group's pattern at one level: (fewest members in a block it touches, most blocks a row
touches, most blocks of the level below that one block holds members of, most members in a
block)."""


def _fewest_in_a_block(rows: np.ndarray, b: int, c: int, lower: tuple[int, int] | None
                       ) -> Level:
    """Over sorted rows of device ids: the fewest members any row has in one block of size
    ``b`` that it touches (its most exposed members' company: a group of 32 split 8 + 24 by a
    rack boundary sends three quarters of its all-to-all across it from the 8, not a half), the
    most blocks a row touches, the most blocks of size ``c`` (the level below; ``c`` divides
    ``b``) that one block holds members of (the 24 span three nodes of 8), and the most members
    in one block. ``lower``: the level below's fewest and most members per block (None: not
    known), which spares the count when every block at both levels holds as many."""
    starts = _starts(rows, b)
    idx = np.flatnonzero(starts.ravel())
    runs = np.diff(np.append(idx, rows.size))  # lengths of the runs of equal blocks, row by row
    fewest, most = int(runs.min()), int(runs.max())
    fan = _known_fan(fewest, most, c, lower)
    if fan is None:  # lower blocks entered within each run (its first member enters one)
        fan = int(np.add.reduceat(_starts(rows, c).ravel().astype(np.int64), idx).max())
    return fewest, int(starts.sum(axis=1).max()), fan, most


def _known_fan(fewest: int, most: int, c: int, lower: tuple[int, int] | None) -> int | None:
    """The lower blocks one block holds members of, when the members per block tell it: below
    level 0 (``c`` = 1) the members themselves; when every block a group touches holds as many
    members, and every block of the level below too (``lower``: its fewest and most), their
    ratio. None otherwise (or when ``lower`` is not known)."""
    if c == 1:
        return most
    if lower is None or fewest != most or lower[0] != lower[1]:
        return None
    return most // lower[1]


def _layout(n: int, per_level: list[Level]) -> GroupLayout:
    """A group of ``n`` from its ``Level`` per bounded level; the outermost block holds it
    whole."""
    ks = _nested([lv[0] for lv in per_level] + [n])
    touched = [lv[1] for lv in per_level] + [1]
    for i in range(len(touched) - 2, -1, -1):  # a higher level's blocks hold the lower ones
        touched[i] = max(touched[i], touched[i + 1])
    below = [n, *touched[:-1]]  # blocks of the level below a row touches (devices below 0)
    fan = [min(lv[2], b) for lv, b in zip(per_level, below)] + [below[-1]]
    # even: every row has k members in each of t blocks, k / k_below lower blocks in each (the
    # fewest members times the most blocks alone can be n while rows differ: 4 in one rack
    # beside 2 + 2 over two)
    even = all(k * t == n for k, t in zip(ks, touched)) and all(
        f * lower == k for f, k, lower in zip(fan, ks, (1, *ks[:-1])))
    return GroupLayout(n, ks, blocks=() if even else tuple(touched),
                       fan=() if even else tuple(fan))


def _group_layout(groups: np.ndarray, blocks: tuple[int, ...]) -> GroupLayout:
    """The layout of groups given as rows of device ids: per level, the fewest members any row
    has in one block it touches and the most blocks a row touches (``_fewest_in_a_block``).

    When the rows are translates of one pattern (checked), a row's blocks depend only on its
    first id modulo b (``_pattern_layout``); else every row is counted.
    """
    n = groups.shape[1]
    first = groups[0]
    rows = groups if n == 1 or (first[1:] > first[:-1]).all() else groups[
        :, np.argsort(first, kind="stable")]
    pattern = rows[0] - rows[0, 0]
    if bool((rows - rows[:, :1] == pattern).all()) and (
            n == 1 or bool((pattern[1:] > pattern[:-1]).all())):
        return _pattern_layout(pattern, lambda b: _first_residues(rows[:, 0], b), blocks)
    rows = np.sort(groups, axis=1)
    return _layout(n, _levels(blocks, lambda b, c, lower: _fewest_in_a_block(rows, b, c, lower)))


def _first_residues(first: np.ndarray, b: int) -> np.ndarray:
    """The distinct values of ``first % b``, sorted (``np.unique``'s; a bitmap of the ``b``
    residues where that is no larger than a few times the values, several times faster)."""
    if b > 16 * first.size:
        return np.unique(first % b)
    seen = np.zeros(b, dtype=bool)
    seen[first % b] = True
    return np.flatnonzero(seen)


def _levels(blocks: tuple[int, ...], level) -> list[Level]:
    """``level(b, c, lower)`` for every bounded level (block size ``b``, the level below's
    ``c``, and that level's fewest and most members per block: devices below level 0)."""
    out, lower = [], (1, 1)
    for b, c in zip(blocks[:-1], (1, *blocks[:-2])):
        lv = level(b, c, lower)
        out.append(lv)
        lower = (lv[0], lv[3])
    return out


def _pattern_layout(pattern: np.ndarray, residues, blocks: tuple[int, ...]) -> GroupLayout:
    """The layout of groups ``first + pattern`` (``pattern`` sorted, from 0) whose first
    members take the residues ``residues(b)`` modulo each block size ``b``: a row lies in the
    blocks as any row whose first member has its residue does."""
    n = pattern.size

    def level(b: int, c: int, lower: tuple[int, int]) -> Level:
        if b >= blocks[-1]:  # a block as large as the devices used holds every group whole
            return n, 1, n, n  # its fan: capped by the level below (``_layout``)
        return _fewest_in_blocks_of_pattern(pattern, residues(b), b, c, lower)
    return _layout(n, _levels(blocks, level))


def _fewest_in_blocks_of_pattern(pattern: np.ndarray, residues: np.ndarray, b: int, c: int,
                                 lower: tuple[int, int] | None) -> Level:
    """``_fewest_in_a_block`` of the rows ``r + pattern`` for the residues ``r``, from the
    members before each block boundary (a search in the sorted pattern): work in proportion to
    the blocks the rows span where that is less than rows times members (a group of 65,536 over
    a million devices, 4,096 residues of a pod: 268 million ids listed). The lower blocks in a
    block are counted only for a group that fills some blocks unevenly."""
    n = pattern.size
    last = int(residues.max()) + int(pattern[-1])
    if last // b + 2 >= n:  # as many boundaries as members: listing the rows costs no more
        return _fewest_in_a_block(residues[:, None] + pattern[None, :], b, c, lower)
    counts = _block_counts(pattern, residues, b, last)
    touched = counts > 0
    fewest, most = int(counts[touched].min()), int(counts.max())
    fan = _known_fan(fewest, most, c, lower)
    if fan is None and last // c + 2 >= n:
        fan = _fewest_in_a_block(residues[:, None] + pattern[None, :], b, c, lower)[2]
    elif fan is None:  # the lower blocks each block holds members of (b // c per block)
        held = _block_counts(pattern, residues, c, last) > 0
        fan = int(np.add.reduceat(held, np.arange(0, held.shape[1], b // c), axis=1).max())
    return fewest, int(touched.sum(axis=1).max()), fan, most


def _block_counts(pattern: np.ndarray, residues: np.ndarray, b: int, last: int) -> np.ndarray:
    """Members of each row ``r + pattern`` in each block of size ``b`` up to device ``last``
    (rows by residue, columns by block), from the members below each block boundary."""
    n = pattern.size
    bounds = np.arange(1, last // b + 1) * b  # block boundaries the rows can cross
    before = np.searchsorted(pattern, bounds[None, :] - residues[:, None])  # members below each
    edges = np.concatenate([np.zeros((residues.size, 1), dtype=before.dtype), before,
                            np.full((residues.size, 1), n, dtype=before.dtype)], axis=1)
    return np.diff(edges, axis=1)


def _nested(ks: list[int]) -> tuple[int, ...]:
    """k per level, each at least the level below's (a block of a higher level holds the
    members of a lower one)."""
    for i in range(1, len(ks)):
        ks[i] = max(ks[i], ks[i - 1])
    return tuple(ks)


def _strides(key: tuple) -> dict[Axis, tuple[int, int]]:
    """(size, stride) of every axis of the degrees ``key`` = (tp, pp, dp, cp, rank order): rank
    ids are the sum of each axis's index times its stride, the first axis of the order fastest."""
    tp, pp, dp, cp, order = key
    sizes = {Axis.TP: tp, Axis.CP: cp, Axis.DP: dp, Axis.PP: pp}
    stride, out = 1, {}
    for ax in order:
        out[ax] = (sizes[ax], stride)
        stride *= sizes[ax]
    return out


def reach(par: Parallelism, axis: Axis) -> int:
    """Consecutive devices one group of ``axis`` (TP, CP, DP or PP) lies within: its size times
    its stride in the rank order (``tp`` for TP, ``tp·cp`` for CP in Megatron's order)."""
    size, stride = _strides((par.tp, par.pp, par.dp, par.cp, par.rank_order))[axis]
    return size * stride


def rank_grid(par: Parallelism) -> np.ndarray:
    """Device id of every rank, indexed ``[pp, dp, cp, tp]``."""
    axes = _strides((par.tp, par.pp, par.dp, par.cp, par.rank_order))
    idx = np.ix_(*(np.arange(axes[a][0]) for a in (Axis.PP, Axis.DP, Axis.CP, Axis.TP)))
    return sum(i * axes[a][1] for i, a in zip(idx, (Axis.PP, Axis.DP, Axis.CP, Axis.TP)))


@cached(maxsize=1024)
def _ids(axes: tuple[tuple[int, int], ...]) -> np.ndarray:
    """Every id ``sum j·stride`` (``j < size``) of the (size, stride) axes, sorted."""
    ids = np.zeros(1, dtype=np.int64)
    for size, stride in axes:
        ids = np.add.outer(ids, np.arange(size, dtype=np.int64) * stride).ravel()
    ids.sort()
    ids.flags.writeable = False  # cached: shared by every caller
    return ids


@cached(maxsize=4096)
def _residues(axes: tuple[tuple[int, int], ...], b: int) -> np.ndarray:
    """How many ids ``sum j·stride`` of the (size, stride) axes fall on each residue mod ``b``.

    Without listing the ids: one axis's residues repeat with period ``b / gcd(stride, b)``, and
    the histogram of a sum of axes is the cyclic convolution of theirs (by FFT; the counts are
    integers below 2**31, far inside float64's exact range for the transform's rounding).
    """
    count = math.prod(size for size, _ in axes)
    if count <= max(4 * b, 1 << 14):  # listing them is cheaper than the transforms
        out = np.bincount(_ids(axes) % b, minlength=b)
        out.flags.writeable = False  # cached: shared by every caller
        return out
    hist = np.zeros(b)
    hist[0] = 1.0
    for size, stride in axes:
        period = b // math.gcd(stride, b)
        steps = np.arange(period, dtype=np.int64) * stride % b
        one = (np.bincount(steps, minlength=b) * (size // period)
               + np.bincount(steps[:size % period], minlength=b))
        hist = np.fft.irfft(np.fft.rfft(hist) * np.fft.rfft(one), n=b)
    out = np.rint(hist).astype(np.int64)
    assert int(out.sum()) == count and np.abs(hist - out).max() < 0.25
    out.flags.writeable = False  # cached: shared by every caller
    return out


def _affine_layout(pattern: np.ndarray, bases: tuple[tuple[int, int], ...],
                   blocks: tuple[int, ...]) -> GroupLayout:
    """The layout of the groups ``base + pattern`` for every base ``sum j·stride`` of the
    (size, stride) axes ``bases``: the groups along axes of a rank grid, counted from the
    residues of their first members (``_residues``) without listing them."""
    return _pattern_layout(pattern, lambda b: np.flatnonzero(_residues(bases, b)), blocks)


def expert_grid(grid: np.ndarray, par: Parallelism) -> np.ndarray:
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


def group_levels(par: Parallelism, cluster: ClusterSpec, gpus: int, experts: bool,
                 embedding: bool = False, *, every: bool = False
                 ) -> dict[str, tuple[int, str | None]]:
    """For each parallel group of more than one device (with ``every``, of one too, as
    ``(1, None)``: ``--json``'s groups): its size and the highest network level
    its traffic crosses (None: it stays on one device), by axis: ``tp``, ``cp``, ``dp`` (the
    dense gradients' group, dp·cp ranks), ``pp`` (the farthest send between stages), with
    ``experts`` ``ep``, ``etp`` and ``edp``, and with ``embedding`` (``specs.embedding_copies``)
    ``embedding``, the first and last stage that all-reduce the embedding's gradient. What a
    network design changes for a plan: a level no group crosses cannot slow it. A DualPipe
    plan's groups are those its fold runs (``specs.fold``: a stage's gradients reduce over its
    replicas on both of its ranks), its pipeline the real one's ``pp`` ranks (a review: its dp
    group had been named as the unfolded plan's, inside a leaf, while the reduction costed
    crossed the spine)."""
    pp = par.pp
    par = fold(par)
    lay = layouts(par, cluster, gpus)

    def name(level: int) -> str | None:
        return cluster.levels[level].name if level >= 0 else None

    out = {}
    for axis in ("tp", "cp", "dp", *(("ep", "etp", "edp") if experts else ()), "pp",
                 *(("embedding",) if embedding else ())):
        if axis == "pp":
            size, top = pp, max(b.level for b in lay.pp) if pp > 1 else -1
        else:
            group = getattr(lay, axis)
            size, top = group.size, group.top
        if size > 1 or every:  # (a group of one device crosses no level: top -1, None)
            out[axis] = (size, name(top))
    return out


def layouts(par: Parallelism, cluster: ClusterSpec, gpus: int) -> Layouts:
    """Group layouts of ``par`` when its ranks fill ``gpus`` devices of ``cluster`` in order."""
    key = (par.tp, par.pp, par.dp, par.cp, par.ep, par.expert_tp, par.vp, par.rank_order)
    if par.mirror:
        return _mirror_layouts(key, cluster, gpus)
    # the last stage sends on to the first only in looped schedules (a V's chunks turn at the
    # ends and never wrap: Schedule.hops)
    return _layouts(key, cluster, gpus, par.vp > 1 and not par.pipeline.v_shape)


@cached(maxsize=256)
def _mirror_layouts(key: tuple, cluster: ClusterSpec, gpus: int) -> Layouts:
    """The groups of a DualPipe plan's fold (``specs.fold``: ``pp`` positions, ``dp`` replicas
    of which half are the mirror ranks), laid over the real plan's ranks (``2·pp`` ranks,
    ``dp/2`` replicas): a stage's gradients reduce over its replicas on rank ``h`` and on rank
    ``2·pp - 1 - h``, counted for the pair farthest apart (``h = 0``, the ends; the step waits for
    the slowest reduction); the fold's boundary ``q`` carries rank ``q``'s sends and those of its
    mirror boundary ``2·pp - 2 - q``, the farther of the two; the turn from stage ``pp - 1`` to
    ``pp`` crosses the real boundary between ranks ``pp - 1`` and ``pp`` (index ``pp - 1``)."""
    tp, pp, dp, cp, ep, etp, vp, order = key
    ranks, replicas = 2 * pp, dp // 2
    real = (tp, ranks, replicas, cp, order)
    blocks = _block_sizes(cluster, gpus)
    tp_lay, cp_lay, _, _ = _dense_groups(real, cluster, gpus)
    axes = _strides(real)
    far = (ranks - 1) * axes[Axis.PP][1]
    pattern = _ids((axes[Axis.DP], axes[Axis.CP]))
    both = np.sort(np.concatenate([pattern, pattern + far]))
    dp_lay = _affine_layout(both, (axes[Axis.TP],), blocks)
    if ep == 1 and etp == tp:
        expert = (_alone(blocks), tp_lay, dp_lay)
    else:
        ep_lay, etp_lay, _ = _expert_groups((tp, ranks, replicas, cp, ep, etp, order), cluster,
                                            gpus)
        _, grid = _grid(real)
        egrid = expert_grid(grid, Parallelism(tp=tp, pp=ranks, dp=replicas, cp=cp, ep=ep,
                                               etp=etp, rank_order=order))
        pair = np.concatenate([_rows(egrid[:1], 1), _rows(egrid[-1:], 1)], axis=1)
        expert = (ep_lay, etp_lay, _group_layout(pair, blocks))
    levels, share = _boundaries(real, cluster, gpus)
    folded = tuple(max(levels[q], levels[ranks - 2 - q]) for q in range(pp - 1))
    return Layouts(tp=tp_lay, cp=cp_lay, dp=dp_lay, ep=expert[0], etp=expert[1], edp=expert[2],
                   pp=tuple(Boundary(level, share) for level in (*folded, levels[pp - 1])),
                   embedding=_alone(blocks))


@cached(maxsize=8192)
def _layouts(key: tuple, cluster: ClusterSpec, gpus: int, looped: bool) -> Layouts:
    tp, pp, dp, cp, ep, etp, vp, order = key
    dense = _dense_groups((tp, pp, dp, cp, order), cluster, gpus)
    if ep == 1 and etp == tp:  # the expert grid is the dense one: expert DP = DP·CP, ETP = TP
        blocks = _block_sizes(cluster, gpus)
        expert = (_alone(blocks), dense[0], dense[2])
    else:
        expert = _expert_groups((tp, pp, dp, cp, ep, etp, order), cluster, gpus)
    boundaries, share = _boundaries((tp, pp, dp, cp, order), cluster, gpus, looped)
    if vp > 1:
        boundaries += (_wrap((tp, pp, dp, cp, order), cluster, gpus),)
    return Layouts(tp=dense[0], cp=dense[1], dp=dense[2], ep=expert[0], etp=expert[1],
                   edp=expert[2], pp=tuple(Boundary(level, share) for level in boundaries),
                   embedding=dense[3])


@cached(maxsize=16)
def _grid(key: tuple) -> tuple[Parallelism, np.ndarray]:
    """The plan of degrees ``key`` = (tp, pp, dp, cp, rank order) and its rank grid."""
    tp, pp, dp, cp, order = key
    par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, rank_order=order)
    return par, rank_grid(par)


@cached(maxsize=4096)
def _dense_groups(key: tuple, cluster: ClusterSpec, gpus: int) -> tuple[GroupLayout, ...]:
    """tp, cp, dp·cp and first-and-last-stage groups (independent of vp and of the experts),
    from the axes' strides: a group along some axes is a pattern (its members' offsets) placed
    at every base the other axes form."""
    axes = _strides(key)
    blocks = _block_sizes(cluster, gpus)

    def along(*group: Axis) -> GroupLayout:
        pattern = _ids(tuple(axes[a] for a in group))
        others = tuple(axes[a] for a in RANK_AXES if a not in group)
        return _affine_layout(pattern, others, blocks)

    size, stride = axes[Axis.PP]
    if size > 1:
        others = tuple(axes[a] for a in (Axis.DP, Axis.CP, Axis.TP))
        emb = _affine_layout(np.array([0, (size - 1) * stride]), others, blocks)
    else:
        emb = _alone(blocks)
    return along(Axis.TP), along(Axis.CP), along(Axis.DP, Axis.CP), emb


@cached(maxsize=4096)
def _expert_groups(key: tuple, cluster: ClusterSpec, gpus: int) -> tuple[GroupLayout, ...]:
    """ep, expert-tp and expert-dp groups of the folded expert grid."""
    tp, pp, dp, cp, ep, etp, order = key
    _, grid = _grid((tp, pp, dp, cp, order))
    par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, rank_order=order)
    blocks = _block_sizes(cluster, gpus)
    egrid = expert_grid(grid, par)
    ep_rows = _rows(egrid, 2)  # each EP group's devices in EP-rank order
    ordered = np.sort(ep_rows, axis=1)
    ep_lay = replace(_group_layout(ep_rows, blocks),
                     runs=tuple(_in_runs(ep_rows, ordered, b) for b in blocks[:-1]))
    return (ep_lay, *(_group_layout(_rows(egrid, axis), blocks) for axis in (3, 1)))


def _in_runs(rows: np.ndarray, ordered: np.ndarray, b: int) -> bool:
    """Every row (device ids in the group's own order; ``ordered``: each row sorted) meets each
    block of size ``b`` in one run of consecutive members: it changes blocks as often as it has
    blocks, less one."""
    blk = rows // b
    changes = (blk[:, 1:] != blk[:, :-1]).sum(axis=1)
    sblk = ordered // b  # (sorted ids give sorted blocks)
    distinct = (sblk[:, 1:] != sblk[:, :-1]).sum(axis=1)
    return bool((changes == distinct).all())


@cached(maxsize=4096)
def _boundaries(key: tuple, cluster: ClusterSpec, gpus: int, looped: bool = False
                ) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The level each stage-to-next-stage boundary crosses, and the steady-state sharing: the
    largest fraction of one block's devices that send out of it at once (``_busiest_block``;
    ``looped``: the last stage sends on to the first too, as interleaved schedules do).

    Stage ``i + 1``'s devices are stage ``i``'s shifted by the pipeline stride ``s`` (an affine
    rank grid), and a device ``a`` sends across a block of ``b`` devices when ``s >= b`` or
    ``a mod b >= b - s``; counting stage 0's devices by residue (a histogram of ``b`` bins, from
    the other axes' strides) then gives every stage's count as a window sum, without visiting
    every device of every stage.
    """
    axes = _strides(key)
    pp, s = axes[Axis.PP]
    sizes = (1, *_block_sizes(cluster, gpus)[:-1])
    if pp == 1:
        return (), tuple(0.0 for _ in sizes)
    stage0 = tuple(axes[a] for a in RANK_AXES if a is not Axis.PP)
    per_stage = math.prod(size for size, _ in stage0)
    stages = np.arange(pp - 1)
    crossing = []  # per level, devices of each boundary's stage that send outside their block
    for b in sizes:
        if s >= b:
            crossing.append(np.full(pp - 1, per_stage))
            continue
        if b >= gpus:  # one block holds every device used
            crossing.append(np.zeros(pp - 1, dtype=int))
            continue
        prefix = np.concatenate([[0], np.cumsum(_residues(stage0, b))])
        lo = (b - s - stages * s) % b  # residues r with (r + i·s) mod b in [b - s, b)
        hi = lo + s
        inside = prefix[np.minimum(hi, b)] - prefix[lo]
        wrapped = prefix[np.maximum(hi - b, 0)]  # the window's part past b, from residue 0
        crossing.append(inside + np.where(hi > b, wrapped, 0))
    share = tuple(_busiest_block(pp, s, b, gpus, looped) if c.any() or looped else 0.0
                  for b, c in zip(sizes, crossing))
    levels = tuple(max((lvl for lvl, c in enumerate(crossing) if c[i] > 0), default=-1)
                   for i in range(pp - 1))
    return levels, share


def _busiest_block(pp: int, s: int, b: int, gpus: int, looped: bool) -> float:
    """The largest fraction of one block's ``b`` devices that send out of it at once: to the
    next stage, back to the previous one (1F1B's steady state runs both), and with ``looped``
    from the last stage to the first and back. Those sends leave by the block's uplinks
    together, and the block that sends the most sets their pace. An average over every device
    (as this had been) counted blocks that send nothing, and a 2:1 uplink under a two-stage
    pipeline whose stages fill blocks cost nothing (a user trial's).

    Every id below ``gpus`` is a device (the strides are mixed-radix), of stage ``(a // s) %
    pp``: runs of ``s`` ids, stage by stage. A block inside one stage (``s`` a multiple of
    ``b``) sends with all its devices. A block of whole runs sends with the runs whose partner
    run lies in another block, counted run by run over one period of the pattern (``lcm(b / s,
    pp)`` runs, far fewer than the devices). Otherwise the devices are
    counted over one period, ``lcm(b, s·pp)`` ids. (A partial last block holds a part of some
    whole block's devices, so it cannot send more.)"""
    if s % b == 0:
        return 1.0
    if b % s == 0:  # whole runs: one element per run of s devices
        size, unit = b // s, s
        ids = np.arange(min(gpus // s, math.lcm(size, pp)), dtype=np.int64)
        stride = 1
    else:
        size, unit = b, 1
        ids = np.arange(min(gpus, math.lcm(b, s * pp)), dtype=np.int64)
        stride = s
    stage = ids // stride % pp
    block = ids // size
    out = ((stage < pp - 1) & ((ids + stride) // size != block)) | (
        (stage > 0) & ((ids - stride) // size != block))
    if looped:  # the wrap, both ways
        far = (pp - 1) * stride
        out |= ((stage == pp - 1) & ((ids - far) // size != block)) | (
            (stage == 0) & ((ids + far) // size != block))
    sending = block[out]
    return int(np.bincount(sending).max()) * unit / b if sending.size else 0.0


@cached(maxsize=4096)
def _wrap(key: tuple, cluster: ClusterSpec, gpus: int) -> int:
    """The level the last stage's send to stage 0 crosses (interleaved schedules): a device
    ``a`` of stage 0 and its partner ``a + (pp - 1)·s`` share a block of ``b`` devices unless
    ``a mod b + (pp - 1)·s >= b``, so stage 0's largest residue decides."""
    axes = _strides(key)
    pp, s = axes[Axis.PP]
    stage0 = tuple(axes[a] for a in RANK_AXES if a is not Axis.PP)
    level = -1
    for lvl, b in enumerate((1, *_block_sizes(cluster, gpus)[:-1])):
        if b < gpus and int(np.flatnonzero(_residues(stage0, b)).max()) + (pp - 1) * s >= b:
            level = lvl
    return level


def stage_devices(par: Parallelism) -> tuple[tuple[int, ...], ...]:
    """Device ids of every pipeline stage (all replicas and TP/CP ranks), in stage order."""
    grid = rank_grid(par)
    return tuple(tuple(np.sort(grid[i].ravel()).tolist()) for i in range(par.pp))
