"""Fitting a stack's calibration to measured runs (``nestplan calibrate``).

The fitted values are multipliers of the base stack, found by damped Gauss-Newton on the log
errors of the rows' step times (each of width ``NOISE``), regularised toward the base (a prior on
log(multiplier) of width ``PRIOR``), so that a parameter the rows barely constrain stays near the
base value. The
rows' plans stay as loaded (a row whose micro-batch or recomputation was filled in by the model
keeps the base stack's choice). What is fitted depends on how many step-time rows there are,
never more parameters than rows:

* 1-2 rows: one compute scale (matmul, attention and memory-bound efficiencies together);
* 3-5 rows: the three efficiencies separately;
* 6 or more: also the per-step host time and the per-kernel launch overhead.

Rows with a measured peak memory also fit the allocator overhead (closed form: the mean
unexplained share of activations and transient memory, clipped at 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from .errors import SpecError
from .stack import MAX_ALLOCATOR_OVERHEAD, StackSpec
from .units import US

NOISE = 0.05
"""Width of a row's log error: how far a measured run scatters around a model that is right for
its group (the catalog stacks' mean |error| on their own runs is 3.8-9.9 %, README "Accuracy")."""
PRIOR = 0.5
"""Width of the prior on each log-multiplier: a multiplier of e^0.5 = 1.65 costs as much as one
row off by NOISE (5 %), so one row moves a multiplier almost all the way to it."""
PRIOR_KERNEL_US = 5.0
"""Width of the prior on the added per-kernel overhead, microseconds."""
MAX_ITER = 100


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
    """Leave-one-out error of every row (fitted on the others), when there are >= 3 rows."""
    memory_before: list[float | None]
    memory_after: list[float | None]


def _names(n_rows: int) -> tuple[str, ...]:
    if n_rows <= 2:
        return ("compute_scale",)
    if n_rows <= 5:
        return ("matmul_scale", "attention_scale", "memory_scale")
    return ("matmul_scale", "attention_scale", "memory_scale", "step_overhead_s",
            "kernel_overhead_us")


def _apply(base: StackSpec, names, x) -> StackSpec:
    kw = {}
    for name, v in zip(names, x):
        if name == "compute_scale":
            kw.update(matmul_scale=base.matmul_scale * math.exp(v),
                      attention_scale=base.attention_scale * math.exp(v),
                      memory_scale=base.memory_scale * math.exp(v))
        elif name == "step_overhead_s":
            kw["step_overhead"] = base.step_overhead * math.exp(v)
        elif name == "kernel_overhead_us":  # additive, in microseconds
            kw["kernel_overhead"] = max(0.0, base.kernel_overhead + v * US)
        else:
            kw[name] = getattr(base, name) * math.exp(v)
    return replace(base, **kw)


def _predict(cases, stack: StackSpec) -> tuple[np.ndarray, list]:
    """Predicted seconds of every case with ``stack``, and each evaluation (None: layer rows)."""
    from .validation import predict

    pairs = [predict(c, stack) for c in cases]
    return np.array([t for t, _ in pairs]), [ev for _, ev in pairs]


def _solve(cases, base: StackSpec, names) -> np.ndarray:
    """Log-multipliers minimising sum((log error / NOISE)^2) + sum((x / PRIOR)^2)."""
    measured = np.log([c.measured for c in cases])
    x = np.zeros(len(names))
    widths = np.array([PRIOR_KERNEL_US if n == "kernel_overhead_us" else PRIOR for n in names])
    # the added kernel overhead cannot take the base's below zero: iterates stay inside
    lower = np.array([-base.kernel_overhead / US if n == "kernel_overhead_us" else -np.inf
                      for n in names])

    def residuals(x):
        t, _ = _predict(cases, _apply(base, names, x))
        return np.concatenate([(np.log(t) - measured) / NOISE, x / widths])

    r = residuals(x)
    damping = 1e-3
    for _ in range(MAX_ITER):
        step = 1e-2
        jac = np.stack([(residuals(x + step * e) - r) / step for e in np.eye(len(x))], axis=1)
        a = jac.T @ jac
        g = jac.T @ r
        cost = r @ r
        while True:
            dx = -np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), g)
            dx = np.maximum(x + np.clip(dx, -0.5, 0.5), lower) - x
            trial = residuals(x + dx)
            if trial @ trial < cost:
                x, r = x + dx, trial
                damping = max(damping / 10, 1e-6)
                break
            damping *= 10
            if damping > 1e6:
                return x
        # converged: the step is tiny, or it no longer lowers the objective measurably
        if np.max(np.abs(dx)) < 1e-4 or cost - r @ r < 1e-9 * cost:
            return x
    raise SpecError("calibrate", f"{len(cases)} rows", f"the fit did not converge in {MAX_ITER} "
                    "iterations; check the rows for inconsistent measurements")


def _allocator(cases, evs, stack: StackSpec) -> float | None:
    """Allocator overhead that makes the memory rows right on average (None without such rows)."""
    shares = []
    for c, ev in zip(cases, evs):
        if c.memory is None or ev is None:
            continue
        st = max(ev.stages, key=lambda s: s.memory.total)
        m = st.memory
        base = m.total - m.reserved + stack.reserved_bytes
        work = m.activations + m.transient
        if work > 0:
            shares.append((c.memory - base) / work)
    if not shares:
        return None
    share = max(0.0, float(np.mean(shares)))
    if share > MAX_ALLOCATOR_OVERHEAD:
        raise SpecError("peak_memory_gib", ", ".join(c.id for c in cases if c.memory is not None),
                        f"these runs' peaks exceed the predicted tensors by {share:.1f}x their "
                        f"activations (an allocator overhead above {MAX_ALLOCATOR_OVERHEAD:g}): "
                        "the memory model does not describe them; check the rows' plans")
    return share


def _errors(cases, stack: StackSpec):
    t, evs = _predict(cases, stack)
    err = [float(p / c.measured - 1) for p, c in zip(t, cases)]
    mem = [(ev.peak_memory / c.memory - 1) if (c.memory is not None and ev is not None) else None
           for c, ev in zip(cases, evs)]
    return err, mem, evs


def fit(cases, base: StackSpec, *, name: str = "calibrated", leave_one_out: bool = True) -> Fit:
    """Fit ``base``'s calibration to ``cases`` (from ``validation.load_cases``)."""
    if not cases:
        raise SpecError("calibrate", "0 rows", "needs at least one measured run")
    names = _names(len(cases))
    x = _solve(cases, base, names)
    stack = _apply(base, names, x)
    before, mem_before, _ = _errors(cases, base)
    after, _, evs = _errors(cases, stack)
    alloc = _allocator(cases, evs, stack)
    if alloc is not None:
        stack = replace(stack, allocator_overhead=alloc)
    _, mem_after, _ = _errors(cases, stack)
    ids = tuple(c.id for c in cases)
    stack = replace(stack, name=name, fitted_on=ids,
                    description=f"{base.name} calibrated on {len(cases)} measured runs")
    # multipliers of the base, and the two overheads as fitted values
    params = {n: math.exp(v) for n, v in zip(names, x)
              if n not in ("step_overhead_s", "kernel_overhead_us")}
    if "step_overhead_s" in names:
        params["step_overhead_s"] = stack.step_overhead
    if "kernel_overhead_us" in names:
        params["kernel_overhead_us"] = stack.kernel_overhead / US
    if alloc is not None:
        params["allocator_overhead"] = alloc
    loo = None
    if leave_one_out and len(cases) >= 3:
        loo = []
        for i in range(len(cases)):
            rest = cases[:i] + cases[i + 1:]
            xi = _solve(rest, base, _names(len(rest)))
            t, _ = _predict([cases[i]], _apply(base, _names(len(rest)), xi))
            loo.append(float(t[0] / cases[i].measured - 1))
    return Fit(stack, params, before, after, loo, mem_before, mem_after)
