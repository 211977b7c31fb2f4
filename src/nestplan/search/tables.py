"""Cost tables of one configuration: every device position × block range × recompute policy.

Uses the same per-device functions as ``evaluate`` (``cost/device.py``) on arrays, so the DP
optimises exactly the reported step time. Cells are indexed ``[hi, lo, policy]`` for a device
holding units ``[lo, hi)`` of the split (``space.split_units``), or ``[count, policy]`` when
the blocks are all alike and only their number matters.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..caching import cached
from .. import graph as G
from ..cost import device as D

INF = np.inf


@dataclass
class Tables:
    x: list[np.ndarray]
    y: list[np.ndarray]
    """Each device's share of the schedule's span beyond the bottleneck (``Device.Y``)."""
    e: list[np.ndarray]
    ok: list[np.ndarray]
    mem: list[np.ndarray]
    valid: np.ndarray
    const: float


def build(cc: D.ConfigCosts) -> Tables | None:
    """Tables for ``cc``, whose units follow ``space.split_units``; None when the units cannot
    give every device its least share."""
    par = cc.par
    schedule = par.pipeline
    # what does not depend on the schedule is shared by every schedule with the same chunk
    # placement (looped, or a V): per device position, X, F, W, the end without deferred weight
    # gradients, and the memory apart from the micro-batches in flight
    canonical = par.with_(schedule="zbv" if schedule.v_shape else None)
    base = _classes(cc if canonical == par else D.config_costs(cc.sc, canonical))
    if base is None:
        return None
    valid, per_device, const = base
    cap = cc.sc.memory_limit
    x, y, e, mem, ok = [], [], [], [], []
    timed: dict = {}  # device class -> its (X, Y, E) cells under this schedule
    for i, cls in enumerate(per_device):
        X, F, W, E, parts = cls
        if id(cls) not in timed:
            timed[id(cls)] = (np.where(valid, X, INF),
                              np.where(valid, schedule.bubble_share(X, F, W), INF),
                              np.where(valid, E + schedule.tail(X, F, W, par.vp), INF))
        xi, yi, ei = timed[id(cls)]
        x.append(xi)
        y.append(yi)
        e.append(ei)
        held = D.held_in_flight(cc, i)
        m_i = np.where(valid, D.memory_breakdown(parts, held).total, INF)
        mem.append(m_i)
        ok.append(m_i <= cap)
    return Tables(x=x, y=y, e=e, ok=ok, mem=mem, valid=valid, const=const)


@cached(maxsize=128)
def _classes(cc: D.ConfigCosts):
    """(valid cells, per device (X, F, W, end of step without deferred weight gradients, memory
    parts), constant) of ``cc``'s plan on its schedule's chunk placement; None when the units
    cannot give every device its least share."""
    from .space import chunk_counts, split_units, splits

    sc, par = cc.sc, cc.par
    model = sc.model
    p, v = par.pp, par.vp
    schedule = par.pipeline
    if not splits(model, p, v, schedule):
        return None
    units, least = split_units(model, v)
    idx = np.arange(units + 1)
    top = units - (p - 1) * least
    if model.homogeneous:
        # a device's cost depends only on how many blocks it holds: tables by count, chunks of
        # n // v blocks with the extras first
        valid = ((idx >= least) & (idx <= top))[:, None]
        all_moe = model.moe is not None
        counts = chunk_counts(idx, v).astype(float)
        rounds = []
        for k in range(v):
            blocks = counts[:, k]
            rounds.append((0.0 * blocks, blocks) if all_moe else (blocks, 0.0 * blocks))
    else:  # blocks [lo, hi) of every round of units (one round without interleaving)
        hi, lo = np.meshgrid(idx, idx, indexing="ij")
        n = hi - lo
        valid = ((n >= least) & (n <= top))[..., None]
        kinds = cc.graph.kinds
        moe_prefix = np.concatenate([[0], np.cumsum([k is G.LayerKind.MOE for k in kinds])])
        rounds = []
        for k in range(v):
            a, b = k * units + lo, k * units + np.where(valid[..., 0], hi, lo)
            moe = (moe_prefix[b] - moe_prefix[a]).astype(float)
            rounds.append((np.where(valid[..., 0], n, 0) - moe, moe))

    built: dict = {}  # (round, embedding, head) -> (chunk, its time): shared by the classes

    def piece(k: int, emb: bool, head: bool):
        if (k, emb, head) not in built:
            ch = D.chunk(cc, *rounds[k], emb, head)
            built[k, emb, head] = ch, D.chunk_time(cc, ch)
        return built[k, emb, head]

    def device_class(flags, stage: int):
        pieces = [piece(k, emb, head) for k, (emb, head) in enumerate(flags)]
        chunks = [c for c, _ in pieces]
        dev = D.device(cc, chunks, stage, times=[t for _, t in pieces], memory=False)
        # the end without the schedule's deferred weight gradients (added per schedule)
        return (dev.X, dev.F, dev.W, dev.tail + dev.opt, D.memory_parts(cc, chunks, stage))

    classes = {}
    per_device = []
    last = p * v - 1
    for i in range(p):
        # devices alike but for the embedding and the head (and the tied-embedding all-reduce
        # of the first and last device) share one class
        flags = tuple((c == 0, c == last) for c in schedule.chunks_of(i, p, v))
        key = (flags, i in (0, p - 1))
        if key not in classes:
            classes[key] = device_class(flags, i)
        per_device.append(classes[key])
    const = 2 * cc.fill + sc.stack.step_overhead
    return valid, per_device, const
