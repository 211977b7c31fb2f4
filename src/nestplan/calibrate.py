"""Fitting a stack's calibration to measured runs (``nestplan calibrate``).

The fitted values are multipliers of the base stack, found by damped Gauss-Newton on the log
errors of the rows' step times (each of width ``NOISE``), regularised toward the base (a prior on
log(multiplier) of width ``PRIOR``), so that a parameter the rows barely constrain stays near the
base value. The step times are only piecewise smooth in the multipliers (rooflines, overlap, the
efficiency cap of 1), so where the linear step fails the fit moves by probes (``_solve``). A row
whose micro-batch or recomputation the model fills in (the fastest that fits) has them chosen
again under the fitted stack, as ``validate --stack`` of the result chooses them, and the fit is
made again until the choices hold (``fit_choosing``). What is fitted depends on how many
distinct step-time rows there are (a plan measured twice counts once), never more parameters
than rows:

* 1-2 rows: one compute scale (matmul, attention and memory-bound efficiencies together, and
  for MoE rows on a stack whose MoE layers wait on the host, that wait: every per-layer time);
* 3-5 rows: the three efficiencies separately, and for such MoE rows the host wait (its
  factor second, after the GEMMs': a user trial's host-bound MoE rows, 37 % of a step on the
  wait, had fitted the GEMMs at 0.58x with nothing else to move), at most one per row;
* 6 or more: also the per-step host time and the per-kernel launch overhead.

Rows with a measured peak memory also fit the allocator overhead (closed form: the mean
unexplained share of activations and transient memory, clipped at 0).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .catalog import DEFAULT_STACK
from .errors import SpecError, UsageError
from .stack import FITTED_KINDS, MAX_ALLOCATOR_OVERHEAD, StackSpec, fitted_kind
from .units import GiB, US, counted

NOISE = 0.05
"""Width of a row's log error: how far a measured run scatters around a model that is right for
its group (the catalog stacks' mean |error| on their own runs is 3.8-9.9 %, README "Accuracy")."""
PRIOR = 0.5
"""Width of the prior on each log-multiplier: a multiplier of e^0.5 = 1.65 costs as much as one
row off by NOISE (5 %), so one row moves a multiplier almost all the way to it."""
PRIOR_KERNEL_US = 5.0
"""Width of the prior on the added per-kernel overhead, microseconds."""
MAX_ITER = 100
FARTHEST = 10.0
"""A row the base stack predicts this many times too fast or too slow is refused: the catalog
stacks' worst rows are within 2x (README "Accuracy"), and a multiplier that bridged 10x would
describe no hardware."""
SETTLED = 1e-3
"""A step whose gain in the objective (squared errors in units of ``NOISE`` plus the prior; one row
off by 5 % adds 1) is below this ends the fit: far below what rows scattering by ``NOISE`` can
tell apart. (At 0.01 the leave-one-out fits, which start from the fit on all rows, mostly stayed
there.)"""
DAMPING_TRIES = 4
"""Levenberg-Marquardt dampings (each ten times the last) tried before a fit step falls back on
the best of its Jacobian's probes and of one step of each multiplier against its gradient."""
PROBE = 1e-2
"""A probe step of a log-multiplier (1 %); other parameters are probed by the same share of
their prior's width (0.1 µs for the added per-kernel overhead, whose prior is 5 µs wide)."""
LONGEST_DOUBLING = 8
"""A probe step that gains is doubled while it keeps gaining, up to 2^8 probe steps (2.56 in a
log-multiplier)."""


@dataclass(frozen=True)
class Fit:
    """A fitted stack and how well it does."""

    stack: StackSpec
    params: dict[str, float]
    """Fitted multipliers (and host time, s), by name."""
    before: list[float]
    """Step-time error of every row with the base stack."""
    after: list[float]
    """... and with the fitted one."""
    loo: list[float] | None
    """Leave-one-out error of every row (fitted on the other plans' rows: a plan measured several
    times is left out whole), from 3 rows of 2 or more plans."""
    memory_before: list[float | None]
    memory_after: list[float | None]
    peaks: list[float | None]
    """Every row's predicted peak bytes with the fitted stack (None: a layer row)."""


def _key(case) -> tuple:
    """What makes two rows one measurement: the same plan on the same scenario."""
    return case.scenario, case.plan, case.metric


def distinct_rows(cases) -> int:
    """Rows that can tell parameters apart: runs of one plan on one scenario count once,
    however many times they were measured."""
    return len({_key(c) for c in cases})


def _weights(cases) -> np.ndarray:
    """Each row's weight in the fit, 1/sqrt(copies) on its squared residual's root: a plan
    measured k times counts as one row (its mean), not k."""
    copies = Counter(_key(c) for c in cases)
    return np.array([1 / math.sqrt(copies[_key(c)]) for c in cases])


def waits_per_moe_layer(cases, base: StackSpec) -> bool:
    """The rows are MoE and ``base``'s MoE layers wait on the host (``moe_layer_host``): the wait
    is then part of what calibrating them fits (``_names``)."""
    return base.moe_layer_host > 0 and any(c.scenario.model.moe is not None for c in cases)


def _names(cases, base: StackSpec) -> tuple[str, ...]:
    """The parameters the rows can identify: one compute scale from 1-2 distinct rows; the GEMM,
    attention and memory efficiencies from 3-5, the attention's only where the rows' sequences
    (or packed spans) differ (at one length its share still varies with the models' widths,
    about s/6h, but too little for rows that scatter by ``NOISE`` to tell it from the GEMMs'),
    and the MoE layers' host wait after the GEMMs' where it is part of the rows' steps
    (``waits_per_moe_layer``), in that order (GEMMs, wait, attention, memory) never more than the
    rows, so three MoE rows at two lengths fit no memory efficiency; also the host and kernel
    overheads from 6."""
    n = distinct_rows(cases)
    if n <= 2:
        return ("compute_scale",)
    spans = {c.scenario.training.attention_span or c.scenario.training.seq_len for c in cases}
    names = [p for p in PARAMETERS[:3 if n <= 5 else None]
             if p != "attention_scale" or len(spans) > 1]
    if waits_per_moe_layer(cases, base):
        names.insert(1, "moe_host_scale")
    return tuple(names[:n])


PARAMETERS = ("matmul_scale", "attention_scale", "memory_scale", "step_overhead_s",
              "kernel_overhead_us")
"""Everything calibrate fits from six distinct rows (``_names``), beside the one compute scale
of fewer than three (and ``moe_host_scale``, the factor on the MoE layers' host wait, for MoE
rows that wait)."""
FITTED_VALUES = ("step_overhead_s", "kernel_overhead_us", "allocator_overhead")
"""``Fit.params`` that are fitted values (s, µs, a share of activations); the others are factors on
the base's multipliers."""


def _apply(base: StackSpec, names, x, moe_wait: bool = False) -> StackSpec:
    """``base`` with the fitted log-values ``x`` of ``names``; ``moe_wait``: the rows'
    ``waits_per_moe_layer``, under which the one compute scale speeds the host wait too."""
    kw = {}
    for name, v in zip(names, x):
        if name == "compute_scale":
            kw.update(matmul_scale=base.matmul_scale * math.exp(v),
                      attention_scale=base.attention_scale * math.exp(v),
                      memory_scale=base.memory_scale * math.exp(v))
            if moe_wait:  # (faster kernels, a shorter wait: the whole layer at one pace)
                kw["moe_layer_host"] = base.moe_layer_host * math.exp(-v)
        elif name == "moe_host_scale":  # a factor on the wait (up: slower)
            kw["moe_layer_host"] = base.moe_layer_host * math.exp(v)
        elif name == "step_overhead_s":
            kw["step_overhead"] = base.step_overhead * math.exp(v)
        elif name == "kernel_overhead_us":  # additive, in microseconds
            kw["kernel_overhead"] = max(0.0, base.kernel_overhead + v * US)
        else:
            kw[name] = getattr(base, name) * math.exp(v)
    try:
        return replace(base, **kw)
    except SpecError as e:  # the fit's value, not the user's file: say so
        raise SpecError(f"calibrate ({e.field})", e.value, f"the fit would take it there, and it "
                        f"{e.allowed}: the rows are beyond what calibrating {base.name} "
                        "explains; check their step times and plans") from None


class _Predictions:
    """Predicted seconds of cases under stacks, each computed once: the leave-one-out fits start
    where the fit on every row ended, so their first residuals and Jacobian are already known."""

    def __init__(self):
        self.seconds: dict[tuple[int, StackSpec], float] = {}

    def __call__(self, cases, stack: StackSpec) -> np.ndarray:
        from .validation import predict

        out = []
        for c in cases:
            key = (id(c), stack)
            if key not in self.seconds:
                self.seconds[key] = predict(c, stack)[0]
            out.append(self.seconds[key])
        return np.array(out)


def _solve(cases, base: StackSpec, names, predictions: _Predictions,
           start: np.ndarray | None = None, iteration=None) -> np.ndarray:
    """Log-multipliers minimising sum((log error / NOISE)^2) + sum((x / PRIOR)^2), from ``start``
    (default: the base); ``iteration(k)`` hears of each iteration."""
    measured = np.log([c.measured for c in cases])
    weights = _weights(cases)
    rows = len(cases)
    x = np.zeros(len(names)) if start is None else start.copy()
    widths = np.array([PRIOR_KERNEL_US if n == "kernel_overhead_us" else PRIOR for n in names])
    # the added kernel overhead cannot take the base's below zero: iterates stay inside
    lower = np.array([-base.kernel_overhead / US if n == "kernel_overhead_us" else -np.inf
                      for n in names])
    steps = PROBE * widths / PRIOR

    wait = waits_per_moe_layer(cases, base)

    def residuals(x):
        t = predictions(cases, _apply(base, names, x, wait))
        return np.concatenate([weights * (np.log(t) - measured) / NOISE, x / widths])

    r = residuals(x)
    damping = 1e-3
    idle: dict[int, float] = {}  # parameters no row moved with, either way, at the value kept
    for k in range(MAX_ITER):
        if iteration:
            iteration(k)
        cost = r @ r
        moves, probes = _probes(residuals, x, r, rows, lower, steps, idle)
        jac = np.stack([(p - r) / m.sum() for p, m in zip(probes, moves)], axis=1)
        a = jac.T @ jac
        g = jac.T @ r
        # a parameter at its bound that the gradient pushes further out is held there (a step
        # clipped to the bound would make the linear model's gain negative)
        free = ~((x <= lower) & (g > 0))
        new = None
        for _ in range(DAMPING_TRIES if free.any() else 0):
            dx = np.zeros_like(x)
            af = a[np.ix_(free, free)]
            dx[free] = -np.linalg.solve(af + damping * np.diag(np.diag(af) + 1e-12), g[free])
            dx = np.maximum(x + np.clip(dx, -0.5, 0.5), lower) - x
            linear = r + jac @ dx
            gain = cost - linear @ linear
            if 0 <= gain < SETTLED:  # nothing left to gain, as far as it can tell
                break
            if gain > 0:
                trial = residuals(x + dx)
                if trial @ trial < cost:
                    new = x + dx, trial
                    damping = max(damping / 10, 1e-6)
                    break
            damping *= 10
        if new is None:
            new = _probe_step(residuals, x, cost, g, lower, steps, moves, probes)
            damping = 1e-3  # the linear model failed here, not everywhere
        if new is None or cost - new[1] @ new[1] < SETTLED:
            return x if new is None else new[0]
        x, r = new
    ids = ", ".join(c.id for c in cases)
    raise SpecError("RUNS.csv", ids, f"the fit on these {len(cases)} rows did not converge in "
                    f"{MAX_ITER} iterations; check them for inconsistent measurements")


def _probes(residuals, x, r, rows: int, lower, steps, idle: dict[int, float]):
    """One probe step of each parameter (``steps``) from ``x`` (residuals ``r``, the first
    ``rows`` of them the rows'): the moves and the residuals there. A parameter no row moves
    with upward (an efficiency capped at 1, say) is probed downward; one no row moves with
    either way is marked ``idle`` at its value and, while it stays there, only its prior
    moves."""
    moves, probes = [], []
    for i, e in enumerate(np.eye(len(x))):
        move = steps * e
        if idle.get(i) == x[i]:  # attention in a stack that materialises it; an efficiency
            p = r.copy()         # above its cap until the prior brings it back
            p[rows + i] += PROBE / PRIOR  # its prior term (x / width) moves by this
            moves.append(move)
            probes.append(p)
            continue
        p = residuals(x + move)
        back = np.maximum(x - move, lower) - x
        if np.array_equal(p[:rows], r[:rows]) and back.any():
            move, p = back, residuals(x + back)
            if np.array_equal(p[:rows], r[:rows]):
                idle[i] = x[i]
        moves.append(move)
        probes.append(p)
    return moves, probes


def _probe_step(residuals, x, cost: float, g, lower, steps, moves, probes):
    """Where the linear step failed (the step times are only piecewise smooth in the multipliers:
    rooflines, overlap), the best of the Jacobian's probes and of one probe step of each parameter
    against its gradient, doubled while it keeps gaining: (new x, its residuals), or None."""
    tried = list(zip(moves, probes))
    for i, e in enumerate(np.eye(len(x))):
        against = np.maximum(x - np.sign(g[i]) * steps * e, lower) - x
        if against.any() and not np.array_equal(against, moves[i]):
            tried.append((against, residuals(x + against)))
    move, p = min(tried, key=lambda t: t[1] @ t[1])
    if p @ p >= cost:
        return None
    for _ in range(LONGEST_DOUBLING):
        further = np.maximum(x + 2 * move, lower) - x
        if np.array_equal(further, move):
            break
        q = residuals(x + further)
        if q @ q >= p @ p:
            break
        move, p = further, q
    return x + move, p


def _allocator(cases, evs, stack: StackSpec) -> float | None:
    """Allocator overhead s with the least squared relative errors of the memory rows' peaks,
    each predicted as base + s·work (tensors and reserve, and the activations and working memory
    the allocator's share grows with), a plan measured k times counting once; None without
    such rows. (A mean of the rows' own shares had let rows of little activation memory, whose
    share a small error swings, set it.)"""
    num = den = 0.0
    copies = Counter(_key(c) for c in cases if c.memory is not None)  # (its memory rows)
    for c, ev in zip(cases, evs):
        if c.memory is None or ev is None:
            continue
        st = max(ev.stages, key=lambda s: s.memory.total)
        m = st.memory
        base = m.total - m.reserved + stack.reserved_bytes
        a, b = (m.activations + m.transient) / c.memory, 1 - base / c.memory
        num += a * b / copies[_key(c)]
        den += a * a / copies[_key(c)]
    if den == 0:
        return None
    share = max(0.0, num / den)
    if share > MAX_ALLOCATOR_OVERHEAD:
        peaks = [c for c in cases if c.memory is not None]
        raise SpecError(f"{peaks[0].where.rpartition(' line ')[0] or 'RUNS.csv'} peak_memory_gib",
                        ", ".join(f"{c.id}: {c.memory / GiB:g}" for c in peaks),
                        f"these runs' peaks exceed the predicted tensors by {share:.1f}x their "
                        f"activations (an allocator overhead above {MAX_ALLOCATOR_OVERHEAD:g}): "
                        "the memory model does not describe them; check the rows' plans")
    return share


def _errors(cases, stack: StackSpec, predictions: _Predictions):
    """Step-time and memory errors of every case with ``stack``, and its evaluations (None:
    layer rows); the step times join ``predictions``."""
    from .validation import predict

    t, evs = zip(*(predict(c, stack) for c in cases))
    predictions.seconds.update(((id(c), stack), s) for c, s in zip(cases, t))
    err = [float(p / c.measured - 1) for p, c in zip(t, cases)]
    mem = [(ev.peak_memory / c.memory - 1) if (c.memory is not None and ev is not None) else None
           for c, ev in zip(cases, evs)]
    return err, mem, evs


def base_of(runs: Path, given: str | None) -> str:
    """The stack to calibrate, as ``--stack`` names it: ``given``, else the one stack the rows ran
    on (``validation.stacks_named``). Rows of several stacks without ``given`` are refused (one
    fit per stack); with it, the rows' own stacks are set aside with a note."""
    from .validation import note_set_aside, stacks_named

    named = stacks_named(runs, "RUNS.csv", missing_ok=given is not None)
    if given is None:
        if len(named) > 1:
            raise UsageError(f"--stack is needed: the rows ran on several stacks "
                             f"({', '.join(named)}) and calibrate fits one; give --stack, or "
                             "one CSV per stack")
        return named[0] if named else DEFAULT_STACK
    note_set_aside(stacks_named(runs, "RUNS.csv", missing_ok=True, stated_only=True), given,
                   "fitted")
    return given


def _others(far: list) -> str:
    """The rows beyond the first of ``far`` ((case, error) pairs), for a refusal that names it."""
    return f", as are {', '.join(c.id for c, _ in far[1:])}" if len(far) > 1 else ""


def fit(cases, base: StackSpec, *, name: str = "calibrated", leave_one_out: bool = True,
        progress=None) -> Fit:
    """Fit ``base``'s calibration to ``cases`` (from ``validation.load_cases``); ``progress(done,
    total, seconds, of=...)`` hears of the fit's iterations and of the leave-one-out fits."""
    from .validation import check_ran

    if not cases:
        raise SpecError("calibrate", "0 rows", "needs at least one measured run")
    start = time.perf_counter()
    predictions = _Predictions()
    # a row no calibration bridges is refused first
    before, mem_before, evs = _errors(cases, base, predictions)
    for c, ev in zip(cases, evs):  # a plan that cannot have run is refused, as validate does
        check_ran(c, ev)
    far = [(c, e) for c, e in zip(cases, before) if not 1 / FARTHEST < 1 + e < FARTHEST]
    if far:  # (named by the first such row's file and line: a user trial's had named neither)
        c, e = far[0]
        raise SpecError(f"{c.where or c.id}.step_time_s", f"{c.measured:g} s",
                        f"{FARTHEST:g} or more times from what the base stack predicts "
                        f"({c.measured * (1 + e):.3g} s){_others(far)}; no calibration bridges "
                        "that: check the step times and plans")
    far = [(c, e) for c, e in zip(cases, mem_before)
           if e is not None and not 1 / FARTHEST < 1 + e < FARTHEST]
    if far:  # (a predicted peak is at most 2x HBM, check_ran; a measured one at most HBM)
        c, e = far[0]
        raise SpecError(f"{c.where or c.id}.peak_memory_gib", f"{c.memory / GiB:g} GiB",
                        f"{FARTHEST:g} or more times from what the base stack predicts "
                        f"({c.memory * (1 + e) / GiB:.3g} GiB){_others(far)}; no allocator share "
                        "bridges that: check the peaks")
    names = _names(cases, base)
    x = _solve(cases, base, names, predictions, iteration=progress and (lambda k: progress(
        k, MAX_ITER, time.perf_counter() - start, of="iterations of the fit on every row")))
    stack = _apply(base, names, x, waits_per_moe_layer(cases, base))
    after, _, evs = _errors(cases, stack, predictions)
    alloc = _allocator(cases, evs, stack)
    if alloc is not None:
        stack = replace(stack, allocator_overhead=alloc)
    _, mem_after, evs = _errors(cases, stack, predictions)
    ids = tuple(c.id for c in cases)
    lengths = [c.scenario.training.seq_len for c in cases]
    stack = replace(stack, name=name, fitted_on=ids,
                    fitted_seq_len=(min(lengths), max(lengths)),
                    fitted_accelerators=tuple(sorted({c.scenario.cluster.accelerator.name
                                                      for c in cases})),
                    fitted_gpus=(min(c.scenario.gpus for c in cases),
                                 max(c.scenario.gpus for c in cases)),
                    fitted_kinds=tuple(k for k in FITTED_KINDS if k in {
                        fitted_kind(c.scenario.model) for c in cases}),
                    description=f"{base.name} calibrated on "
                    f"{counted(len(cases), 'measured run')}")
    # multipliers of the base, and the two overheads as fitted values
    params = {n: math.exp(v) for n, v in zip(names, x)
              if n not in FITTED_VALUES}
    if "step_overhead_s" in names:
        params["step_overhead_s"] = stack.step_overhead
    if "kernel_overhead_us" in names:
        params["kernel_overhead_us"] = stack.kernel_overhead / US
    if alloc is not None:
        params["allocator_overhead"] = alloc
    loo = None
    groups: dict = {}
    for i, c in enumerate(cases):
        groups.setdefault(_key(c), []).append(i)
    if leave_one_out and len(cases) >= 3 and len(groups) >= 2:  # (each plan with its copies)
        loo = [0.0] * len(cases)
        for g, out in enumerate(groups.values()):
            if progress:
                progress(g, len(groups), time.perf_counter() - start, of="leave-one-out fits")
            rest = [c for i, c in enumerate(cases) if i not in out]
            fewer = _names(rest, base)
            xi = _solve(rest, base, fewer, predictions,
                        start=x if fewer == names else None)
            t = predictions([cases[i] for i in out],
                            _apply(base, fewer, xi, waits_per_moe_layer(rest, base)))
            for i, ti in zip(out, t):
                loo[i] = float(ti / cases[i].measured - 1)
    return Fit(stack, params, before, after, loo, mem_before, mem_after,
               [None if ev is None else ev.peak_memory for ev in evs])


MAX_REPLANS = 4
"""Fits ``fit_choosing`` makes again after the first, the plans chosen anew each time."""


def fit_choosing(load, base: StackSpec, *, name: str = "calibrated", progress=None):
    """Fit ``base`` to the rows ``load(stack)`` reads with that stack (``validation.load_cases``),
    where the model chooses a row's unstated micro-batch or recomputation (the fastest that fits:
    ``validation._tuned``) under the stack it is given: chosen under the base first, then again
    under each fitted stack, and fitted again on the new choices until they hold, so that the
    errors after the fit are what ``validate --stack`` of the result prints (a user trial: a row
    fitted as the base chose it, selective at micro-batch 2, was validated with the fitted file
    at none and 1, its memory error +9 % then +24 %). The fit's ``before`` stays the base's own,
    its plans as the base chose them (what validate prints with it). Returns the fit, the rows
    as fitted and the ids whose choice moved; choices still moving after ``MAX_REPLANS`` fits
    are refused."""
    first_cases = cases = load(base)
    first = result = fit(cases, base, name=name, progress=progress)
    for _ in range(MAX_REPLANS):
        again = load(result.stack)
        if [c.plan for c in again] == [c.plan for c in cases]:
            break
        cases = again
        result = fit(cases, base, name=name, progress=progress)
    else:
        moving = [c.id for c, a in zip(cases, load(result.stack)) if c.plan != a.plan]
        raise SpecError("calibrate", ", ".join(moving), "the micro-batch or recomputation the "
                        f"model chooses for these rows still changed after {MAX_REPLANS + 1} fits "
                        "(each fit moves the fastest plan that fits): state them in the runs "
                        "CSV's micro_batch and recompute columns")
    moved = [c.id for c, f in zip(cases, first_cases) if c.plan != f.plan]
    return replace(result, before=first.before, memory_before=first.memory_before), cases, moved
