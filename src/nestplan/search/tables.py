"""Cost tables of one configuration: every device position × block range × recompute policy.

Uses the same per-device functions as ``evaluate`` (``cost/device.py``) on arrays, so the DP
optimises exactly the reported step time. Cells are indexed ``[l, l2, r]``: the device holds
blocks ``[l, l2)`` of each round of chunks (round ``k`` covers blocks ``k·N .. (k+1)·N``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import graph as G
from ..cost import device as D
from ..cost.pipeline import chunks_in_flight

INF = np.inf


@dataclass
class Tables:
    x: list[np.ndarray]
    e: list[np.ndarray]
    ok: list[np.ndarray]
    mem: list[np.ndarray]
    valid: np.ndarray
    const: float


def build(cc: D.ConfigCosts) -> Tables | None:
    """Tables for ``cc``; None when the layers cannot be split into pp·vp equal rounds."""
    par, model = cc.par, cc.sc.model
    p, v = par.pp, par.vp
    if model.layers % v:
        return None
    n_round = model.layers // v
    if n_round < p:
        return None
    idx = np.arange(n_round + 1)
    lo, hi = np.meshgrid(idx, idx, indexing="ij")
    n = hi - lo
    valid = (n >= 1) & (n <= n_round - p + 1)
    moe_prefix = np.concatenate([[0], np.cumsum([k is G.LayerKind.MOE for k in cc.graph.kinds])])
    rounds = []
    for k in range(v):
        a, b = k * n_round + lo, k * n_round + np.where(valid, hi, lo)
        moe = (moe_prefix[b] - moe_prefix[a]).astype(float)
        rounds.append((np.where(valid, n, 0) - moe, moe))
    cap = cc.sc.cluster.accelerator.hbm_bytes

    valid3 = valid[..., None]

    def device_class(first: bool, last: bool, stage: int):
        chunks = [D.chunk(cc, d, m, first and k == 0, last and k == v - 1)
                  for k, (d, m) in enumerate(rounds)]
        dev = D.device(cc, chunks, stage)
        return (np.where(valid3, dev.X, INF), np.where(valid3, dev.E, INF),
                D.memory_parts(cc, chunks, stage))

    classes = {}
    x, e, mem, ok = [], [], [], []
    for i in range(p):
        key = ("first" if i == 0 else "") + ("last" if i == p - 1 else "")
        if key not in classes:
            classes[key] = device_class(i == 0, i == p - 1, i)
        xc, ec, parts = classes[key]
        x.append(xc)
        e.append(ec)
        held = chunks_in_flight(i, p, v, cc.micro)
        m_i = np.where(valid3, D.memory_breakdown(parts, held).total, INF)
        mem.append(m_i)
        ok.append(m_i <= cap)
    const = 2 * cc.fill + cc.sc.training.step_overhead
    return Tables(x=x, e=e, ok=ok, mem=mem, valid=valid3, const=const)

