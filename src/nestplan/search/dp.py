"""The stage dynamic program: a pure function over dense arrays, with back-pointers.

Problem (one plan configuration fixed: degrees, rank order, micro-batch, ZeRO, virtual stages).
Choose for every pipeline device ``i = 0..p-1`` how many blocks ``n_i >= 1`` it holds per model
chunk (the ``n_i`` sum to ``N``, the blocks of one round of chunks) and its recompute policy
``r_i``, so that every device fits in memory and

    objective = max over forms (a·max X_i + b·sum Y_i) + max E_i + const

is smallest (one form, ``a = m - 1/v`` and ``b = 1/v``; with fewer micro-batches than devices
also ``(m - 1)/v`` and 1: ``schedule.span_forms``), where ``X_i`` (per-micro-batch time),
``Y_i`` (its share of the schedule's span beyond the bottleneck: ``X_i`` unless the schedule
defers weight gradients, ``schedule.py``) and ``E_i`` (end-of-step time) depend only on device
``i``'s position class, the blocks it holds and its policy.

State layout. A device holding units ``[l, l2)`` of the split is one cell ``cost[l2, l, r]`` of
an ``(N+1, N+1, K)`` array (K recompute policies), or ``cost[l2 - l, r]`` of an ``(N+1, K)`` array
when only the number of units matters, as for models whose blocks are all alike (``inf`` where
not allowed: too few or too many units, over memory, or over a threshold). ``D_i[l]`` is the
best value of devices ``0..i-1`` covering ``[0, l)``; one relaxation step gives
``D_{i+1}[l2] = min over (l, r) of D_i[l] (op) cost_i[l2, l, r]`` with
``op`` = ``max`` (bottleneck) or ``+`` (sum), and stores ``argmin (l, r)`` as the back-pointer.

Exactness. For a plan whose maxima are ``t`` and ``e`` the objective is
``max(a·t + b·S) + e + const`` with ``S = sum Y``, increasing in ``t`` and ``e``. So the
optimum is the best, over thresholds ``t`` (a value some ``X`` takes) and ``e`` (a value some
``E`` takes), of the chain of least ``S`` under ``X <= t, E <= e``. Thresholds are visited in increasing
order and abandoned once the bound ``max(a·t + b·S_min) + e_min + const`` cannot beat the best
plan found; the value of every plan found is recomputed from its actual maxima.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..caching import cached
from ..schedule import span, span_forms

INF = np.inf


@dataclass(frozen=True)
class Stage:
    """One device of a solution: blocks ``[start, end)`` of every round, and its policy."""

    start: int
    end: int
    policy: int


@dataclass(frozen=True)
class Solution:
    objective: float
    stages: tuple[Stage, ...]


@cached(maxsize=4096)
def _back_index(n1: int, lo: int, hi: int) -> np.ndarray:
    """Indices into ``[inf]*(n1-1) + prev`` that give ``prev[l2 - n]`` at ``[l2, n - lo]``."""
    l2 = np.arange(n1)[:, None]
    n = np.arange(lo, hi)[None, :]
    return l2 - n + n1 - 1


def _relax(prev: np.ndarray, cost: np.ndarray, op, band: tuple[int, int] | None = None
           ) -> tuple[np.ndarray, np.ndarray]:
    if cost.ndim == 2:  # by count: cost[n, r] for a device of n units, wherever it starts
        n1 = prev.shape[0]
        if band is None:
            rows = np.flatnonzero(np.isfinite(cost).any(axis=1))
            band = (rows[0], rows[-1] + 1) if rows.size else (0, 0)
        lo, hi = band  # the counts that can be used at all
        if hi <= lo:
            return np.full(n1, INF), np.zeros(n1, dtype=int)
        # both ops are monotone in the device's cost, so its best policy for each count can
        # be chosen first: min over (n, r) of op(prev[l2 - n], cost[n, r]) is the min over n
        # of op(prev[l2 - n], min over r of cost[n, r])
        band_cost = cost[lo:hi]
        best_r = band_cost.argmin(axis=1)
        best = band_cost[np.arange(hi - lo), best_r]
        pad = np.concatenate([np.full(n1 - 1, INF), prev])
        shifted = pad[_back_index(n1, lo, hi)]  # shifted[l2, n - lo] = prev[l2 - n]
        flat = op(shifted, best[None, :])
        n = flat.argmin(axis=1)
        k = cost.shape[1]
        # back-pointer (n, r) as n·k + r
        return flat[np.arange(n1), n], (n + lo) * k + best_r[n]
    else:  # cost[l2, l, r]
        n1 = cost.shape[0]
        flat = op(prev[None, :, None], cost).reshape(n1, -1)  # [l2, (l, r)]
    idx = flat.argmin(axis=1)
    return flat[np.arange(n1), idx], idx


def chain(costs: list[np.ndarray], op, bands: list | None = None
          ) -> tuple[float, list[np.ndarray]]:
    """Best chain value through all devices and the back-pointers of every step.

    ``costs[i]`` is ``[end, start, policy]`` or, when a device's cost depends only on how many
    units it holds, ``[count, policy]``; ``bands[i]``, for the latter, a range of counts outside
    which ``costs[i]`` is all ``inf`` (found when not given).
    """
    n1 = costs[0].shape[0]
    d = np.full(n1, INF)
    d[0] = 0.0
    back = []
    for i, c in enumerate(costs):
        d, idx = _relax(d, c, op, bands[i] if bands else None)
        back.append(idx)
    return float(d[-1]), back


def _bands(costs: list[np.ndarray]) -> list | None:
    """The range of usable counts of each by-count cost array (None for the other layout)."""
    if costs[0].ndim != 2:
        return None
    out = []
    for c in costs:
        rows = np.flatnonzero(np.isfinite(c).any(axis=1))
        out.append((int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 0))
    return out


def backtrack(back: list[np.ndarray], by_count: bool, policies: int) -> tuple[Stage, ...]:
    """The stages of the chain ending at the last unit (``policies``: length of the policy
    axis)."""
    end = back[0].shape[0] - 1
    out = []
    for idx in reversed(back):
        k, policy = divmod(int(idx[end]), policies)
        start = end - k if by_count else k
        out.append(Stage(start, end, policy))
        end = start
    return tuple(reversed(out))


def objective(x: list[float], y: list[float], e: list[float], micro: int, vp: int,
              const: float) -> float:
    """The pipeline objective of one solution (same arithmetic as ``evaluate.step_time``)."""
    return span(x, y, micro, vp) + const + max(e)


def solve(x: list[np.ndarray], e: list[np.ndarray], ok: list[np.ndarray], micro: int, vp: int,
          const: float, bound: float = INF, y: list[np.ndarray] | None = None) -> Solution | None:
    """The optimal stage split and policies, or None if nothing fits (or beats ``bound``).

    ``x[i]``, ``y[i]``, ``e[i]``: per-device arrays of X, Y (``x`` when not given) and E,
    ``(N+1, N+1, K)`` indexed ``[end, start, policy]``, or ``(N+1, K)`` indexed ``[count,
    policy]`` when only the number of units matters (``inf`` where not allowed); ``ok[i]``:
    False where device ``i`` would not fit.
    """
    p = len(x)
    y = x if y is None else y
    by_count = x[0].ndim == 2
    xs = [np.where(ok[i], x[i], INF) for i in range(p)]
    ys = [np.where(ok[i], y[i], INF) for i in range(p)]
    es = [np.where(ok[i], e[i], INF) for i in range(p)]
    bands = _bands(xs)  # ys, es and every masked copy are inf at least where xs is
    t0, _ = chain(xs, np.maximum, bands)
    if not np.isfinite(t0):
        return None
    s_min, _ = chain(ys, np.add, bands)
    e_min, _ = chain(es, np.maximum, bands)
    forms = span_forms(p, vp, micro)

    def lead(t, s):  # the span's forms at thresholds t (max X) and s (sum Y)
        return max(a * t + b * s for a, b in forms)

    best: Solution | None = None
    best_val = bound

    def cell(a, s):
        return float(a[s.end - s.start, s.policy] if by_count else a[s.end, s.start, s.policy])

    def value(stages):
        xv = [cell(x[i], s) for i, s in enumerate(stages)]
        yv = [cell(y[i], s) for i, s in enumerate(stages)]
        ev = [cell(e[i], s) for i, s in enumerate(stages)]
        return objective(xv, yv, ev, micro, vp, const)

    t_values = np.unique(np.concatenate([a[np.isfinite(a)] for a in xs]))
    if all(a == 0 for a, _ in forms):  # one micro-batch, one chunk: X is not in the objective,
        t_values = t_values[-1:]  # so its largest threshold gives every solution the others do
    for t in t_values[t_values >= t0]:
        if lead(t, s_min) + e_min + const >= best_val:
            break
        under_t = [a <= t for a in xs]
        yt = [np.where(m, a, INF) for m, a in zip(under_t, ys)]
        st, _ = chain(yt, np.add, bands)
        at_t = lead(t, st) + const if np.isfinite(st) else INF
        if at_t + e_min >= best_val:
            continue
        et = [np.where(m, a, INF) for m, a in zip(under_t, es)]
        e_t, _ = chain(et, np.maximum, bands)
        e_values = np.unique(np.concatenate([a[np.isfinite(a)] for a in et]))
        for ev in e_values[e_values >= e_t]:
            if at_t + ev >= best_val:
                break
            costs = [np.where(b <= ev, a, INF) for a, b in zip(yt, et)]
            s, back = chain(costs, np.add, bands)
            if not np.isfinite(s):
                continue
            stages = backtrack(back, by_count, x[0].shape[-1])
            val = value(stages)
            if val < best_val:
                best_val, best = val, Solution(val, stages)
    return best


def least_peak(mem: list[np.ndarray], allowed: list[np.ndarray]):
    """Smallest achievable largest device memory over all splits (bytes), each table's cells
    limited to where its ``allowed`` mask is true, and the back-pointers to the split and the
    policies that reach it (``backtrack``); what a search that found nothing quotes."""
    costs = [np.where(ok, m, INF) for ok, m in zip(allowed, mem, strict=True)]
    return chain(costs, np.maximum)
