"""NEST and the baselines, behind one interface: ``run_method(name, scenario, constraints)``.

Each baseline searches with its own view of the world and its plans are then scored with the
full cost model on the real cluster (``evaluate``):

* ``nest``: the network- and memory-aware DP over the whole space (``driver.run``).
* ``manual``: Megatron-style rules: TP = the GPUs of a node, at most 8 (``MANUAL_MAX_TP``;
  capped by the heads), SP with TP,
  the smallest PP that fits with uniform stages, full recomputation, distributed optimizer,
  micro-batch 1, DP for the rest, Megatron's rank order.
* ``phaze``: the same stage DP, network-agnostic (every link has the outermost level's
  bandwidth and latency), without ZeRO and choosing per stage only between no and full
  recomputation.
* ``alpa``: a two-level mesh view (inside a node vs. the network); searches as if memory were
  unlimited, then fixes plans that do not fit by sharding more (ZeRO-3 and full recomputation).
* ``mist``: memory-aware (ZeRO, recomputation per stage) but on a flat network.
* ``mcmc``: FlexFlow-style Markov-chain Monte Carlo over the same plan space, fixed seed and
  budget, starting from the manual plan.
* ``exhaustive``: brute force over the whole space (small instances only): the oracle.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import random
import time

from ..errors import InfeasibleError, SpecError
from ..evaluate import evaluate
from ..recompute import names_text
from ..schedule import SCHEDULES
from ..specs import (Level, Parallelism, Scenario, check_plan, kv_heads_refusal,
                     model_axis_refusal)
from . import driver, space
from .constraints import METHODS, Constraints, check_constraints, refuse_unsearchable
from .driver import SearchResult

MCMC_BUDGET = 1500
MCMC_SEED = 0
EXHAUSTIVE_LIMIT = 50_000
"""Plans the brute force evaluates at most: each is a whole evaluation, about 1.2 ms on one core
of our 2-core host (850 plans/s measured on GPT 1.7B's 45,240 plans over 8 H100, 2026-12-02), so
a minute at most; 200,000 took four minutes."""


def flat_view(sc: Scenario) -> Scenario:
    """Every link with the outermost level's bandwidth and latency, no oversubscription."""
    top = sc.cluster.levels[-1]
    levels = tuple(dataclasses.replace(lv, bandwidth=top.bandwidth, latency=top.latency,
                                       efficiency=top.efficiency, oversubscription=1.0)
                   for lv in sc.cluster.levels)
    return dataclasses.replace(sc, cluster=dataclasses.replace(sc.cluster, levels=levels))


def two_level_view(sc: Scenario) -> Scenario:
    """Alpa's mesh: a node, and one network level with the outermost level's figures. Its hosts
    are the cluster's where they lie within a node, else one host per node (hosts of several
    nodes, which the view's levels cannot tile): either way the node spans hosts as it does on
    the cluster, so the view's plans are the cluster's (DeepEP's backend; the view had dropped
    the host size, and a 16-GPU NVSwitch host had been searched as a multi-host NVLink domain)."""
    lv = sc.cluster.levels
    if len(lv) == 1:
        return sc
    net = Level(name="network", size=None, bandwidth=lv[-1].bandwidth, latency=lv[-1].latency,
                efficiency=lv[-1].efficiency)
    host = sc.cluster.devices_per_host
    if host is not None and lv[0].size % host:
        host = lv[0].size
    return dataclasses.replace(sc, cluster=dataclasses.replace(
        sc.cluster, levels=(lv[0], net), devices_per_host=host))


def _rescore(method: str, found: SearchResult, start: float) -> SearchResult:
    """A baseline's plans ranked by their step on the real scenario, as ``driver.run`` evaluated
    them there (its ``view`` only steered the search)."""
    plans = sorted(found.plans, key=lambda e: e.step_time)
    return SearchResult(method=method, plans=plans, seconds=time.perf_counter() - start,
                        configurations=found.configurations, solved=found.solved,
                        objective=found.objective, notes=found.notes)


def nest(sc: Scenario, con: Constraints, top: int, progress=None) -> SearchResult:
    return driver.run(sc, con, method="nest", top=top, progress=progress)


def mist(sc: Scenario, con: Constraints, top: int, progress=None) -> SearchResult:
    start = time.perf_counter()
    found = driver.run(sc, con, method="mist", top=top, view=flat_view(sc), progress=progress)
    return _rescore("mist", found, start)


def phaze(sc: Scenario, con: Constraints, top: int, progress=None) -> SearchResult:
    start = time.perf_counter()
    own_zero = con.zero is None  # phaze's own ZeRO-0, not the user's
    con = dataclasses.replace(con, zero=0 if con.zero is None else con.zero)
    try:
        found = driver.run(sc, con, method="phaze", top=top, view=flat_view(sc),
                           policies=sc.stack.policies_of("none") + sc.stack.policies_of("full"),
                           progress=progress)
    except InfeasibleError as e:
        raise InfeasibleError(f"phaze (no ZeRO, no selective recomputation): {e}") from None
    except SpecError as e:  # the user's knobs passed (run_method); ZeRO-0 with them does not
        if not own_zero:
            raise
        raise InfeasibleError(f"phaze (no ZeRO, no selective recomputation): {e}") from None
    return _rescore("phaze", found, start)


def _most_saving(sc: Scenario, con: Constraints) -> tuple[str, ...]:
    """The recompute policies a fixed plan takes: the constraints', else the stack's most saving
    one (``StackSpec.most_saving``)."""
    return con.recompute or (sc.stack.most_saving,)


def _sharded_more(sc: Scenario, con: Constraints, par: Parallelism) -> Parallelism | None:
    """``par`` with the most sharding and recomputation the stack offers and the constraints
    leave free (a fixed ZeRO stage or recompute policy stays); None when that changes nothing
    or the stack cannot run it."""
    recompute = _most_saving(sc, con)
    zeros = [con.zero] if con.zero is not None else sorted(sc.stack.zero_stages, reverse=True)
    for zero in zeros:
        more = par.with_(zero=zero, recompute=recompute)
        if more == par:
            return None
        try:
            check_plan(sc, more)
        except SpecError:
            continue  # e.g. a ZeRO stage the stack does not run with pipelining
        return more
    return None


def alpa(sc: Scenario, con: Constraints, top: int, progress=None) -> SearchResult:
    start = time.perf_counter()
    found = driver.run(sc, con, method="alpa", top=max(top, 20), view=two_level_view(sc),
                       memory_aware=False, progress=progress)
    fixed = []
    for real in found.plans:  # (evaluated on the real cluster: ``driver.run``)
        if not real.within_headroom:
            more = _sharded_more(sc, con, real.plan)
            if more is None:
                continue
            real = evaluate(sc, more)
        if real.within_headroom:
            fixed.append(real)
    if not fixed:
        raise InfeasibleError("alpa: none of its plans fits even after sharding more (the "
                              "highest ZeRO stage and the most saving recomputation the stack "
                              "and the constraints allow)")
    fixed.sort(key=lambda e: e.step_time)
    return SearchResult(method="alpa", plans=fixed[:top], seconds=time.perf_counter() - start,
                        configurations=found.configurations, solved=found.solved,
                        objective=found.objective)


def _allowed(name, fixed, values):
    return [fixed] if fixed is not None else values


MANUAL_MAX_TP = 8
"""The largest TP a hand-made plan takes, whatever the NVLink domain: Megatron's rule is "TP up
to the GPUs of a server" for 8-GPU servers (Narayanan et al. 2021, arXiv 2104.04473, takeaway
#1), and no Megatron or NeMo run in shared/data or tests/data uses more than 8, on NVL72 racks
either (a 72-GPU domain would otherwise give TP 64)."""


def manual_plan(sc: Scenario, con: Constraints) -> Parallelism:
    """Megatron's rules of thumb (see the module docstring)."""
    m, gpus = sc.model, sc.gpus
    node = min(sc.cluster.devices_per_node, MANUAL_MAX_TP)
    pipelined = con.schedule is not None or (con.vp or 1) > 1  # fixed: two stages or more
    fixed = (con.cp or 1) * (con.pp or (2 if pipelined else 1)) * (con.dp or 1)  # TP leaves room
    tps = [t for t in range(min(node, m.heads, gpus), 0, -1)
           if gpus % (t * fixed) == 0 and m.heads % t == 0 and m.ffn_hidden % t == 0
           and kv_heads_refusal(m, sc.stack, t) is None
           and (t == 1 or sc.stack.offers("tp"))]
    if not tps and con.tp is None:
        raise InfeasibleError(f"manual: no tensor-parallel degree leaves room for the fixed "
                              f"cp·pp·dp = {fixed} on {gpus} devices")
    tp = con.tp or tps[0]
    cp = con.cp or 1
    rest = gpus // (tp * cp)
    pps = [p for p in range(1, min(rest, m.layers) + 1) if rest % p == 0
           and (p == 1 or sc.stack.offers("pp")) and model_axis_refusal(m, sc.stack, "pp", p) is None]
    last_error = None
    sched = SCHEDULES.get(con.schedule) if con.schedule else None
    vp = con.vp or (sched.least_vp if sched is not None else 1)
    recompute = _most_saving(sc, con)
    for pp in _allowed("pp", con.pp, pps):
        dp = rest // pp
        if (pp == 1 and pipelined) or (con.dp is not None and dp != con.dp):
            continue
        ep = con.ep or (max((e for e in range(1, m.moe.experts + 1)
                             if m.moe.experts % e == 0 and (dp * cp) % e == 0), default=1)
                        if m.moe is not None else 1)
        zeros = space.zero_stages(sc, con, Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep))
        # the manual rules follow Megatron's practice: SP with any TP, whatever the stack's
        # launchers default to (StackSpec.sp_for is what a run that does not say gets)
        sp = con.sp if con.sp is not None else (tp > 1 and sc.stack.offers("sp"))
        etp = con.etp if con.etp is not None or m.moe is None else _manual_etp(sc, tp, ep, cp * dp)
        par = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp,
                          vp=vp if pp > 1 else 1, schedule=con.schedule if pp > 1 else None,
                          sp=sp,
                          zero=_manual_zero(zeros, con.zero),
                          recompute=recompute,
                          mbs=con.mbs or 1, **({"rank_order": con.rank_order}
                                               if con.rank_order else {}))
        try:
            if evaluate(sc, par).within_headroom:
                return par
        except SpecError as e:
            last_error = e
    given = f" and dp={con.dp}" if con.dp is not None else ""
    # (the policy it tried, and the headroom: a DeepSeek-V3 trial's fine-grained plan, on a stack
    # without full recomputation, was said to fail "with full recomputation", where it missed
    # the headroom alone)
    raise InfeasibleError(f"manual: no pipeline length fits with tp={tp}{given} and recompute "
                          f"{names_text(recompute)} within the memory headroom "
                          f"({sc.memory_headroom:.0%} of HBM; --memory-headroom sets it)"
                          + (f" ({last_error})" if last_error else ""))


def _manual_etp(sc: Scenario, tp: int, ep: int, cp_dp: int) -> int | None:
    """The expert-TP degree of a hand-made plan: the stack's default (experts follow TP where it
    lets them) when the expert grid then folds over the attention grid's ranks, else the first
    degree it runs that lets EP span the TP ranks (Megatron-Core's MoE parallel folding, which
    its MoE recipes use with ETP 1); the default again if none folds (``check`` says why)."""
    biased = sc.model.biased_experts
    first = sc.stack.default_etp(tp, ep, biased=biased)
    for etp in (first, *sc.stack.expert_tps(tp, ep, biased=biased)):
        if (tp * cp_dp) % ((etp or tp) * ep) == 0:
            return etp
    return first


def _manual_zero(offered: list[int], fixed: int | None) -> int:
    """The distributed optimizer (ZeRO-1) where the stack has it, else its lightest sharding
    (FSDP stacks: ZeRO-3, their default), else none."""
    if fixed is not None:
        return fixed
    for z in (1, 3, 2, 0):
        if z in offered:
            return z
    return 0


def manual(sc: Scenario, con: Constraints, top: int, progress=None) -> SearchResult:
    start = time.perf_counter()
    ev = evaluate(sc, manual_plan(sc, con))
    return SearchResult(method="manual", plans=[ev], seconds=time.perf_counter() - start,
                        configurations=1, solved=1, objective=ev.step_time)


def _cost(sc: Scenario, par: Parallelism) -> float:
    """MCMC energy: the step time, inflated by memory overshoot (infeasible plans are
    visited but never returned)."""
    ev = evaluate(sc, par)
    over = max(0.0, ev.peak_memory / ev.capacity - 1.0)
    return ev.step_time * (1.0 + 10.0 * over)


def _neighbour(sc: Scenario, par: Parallelism, con: Constraints, rng: random.Random,
               shapes: list[space.Shape]) -> Parallelism:
    move = rng.random()
    if move < 0.3:  # a different shape (degrees and micro-batch); split reset to even
        s = rng.choice(shapes)
        order = rng.choice(space.rank_orders(con, s))
        vps = [v for v in space.virtual_stages(sc, con, s) if space.schedules(sc, con, s, v)]
        vp = rng.choice(vps)
        return s.parallelism(order, vp, par.zero).with_(
            recompute=con.recompute or par.recompute[:1],  # a given per-stage list stays
            schedule=rng.choice(space.schedules(sc, con, s, vp)))
    if move < 0.45:
        return par.with_(zero=rng.choice(space.zero_stages(sc, con, par) or [par.zero]))
    if move < 0.55:
        s = space.Shape.of(par)
        return par.with_(rank_order=rng.choice(space.rank_orders(con, s)))
    if move < 0.75 and con.recompute is None:  # one stage's recomputation
        rec = list(par.recompute) * (par.pp if len(par.recompute) == 1 else 1)
        offered = sc.stack.recompute
        if sc.stack.recompute_per_stage:
            rec[rng.randrange(par.pp)] = rng.choice(offered).name
        else:
            rec = [rng.choice(offered).name]
        return par.with_(recompute=tuple(rec))
    # move one unit of the split between neighbouring devices (space.split_units)
    if par.pp < 2:
        return par
    units = space.device_units(sc.model, par)
    least = space.split_units(sc.model, par.vp)[1]
    i = rng.randrange(par.pp - 1)
    a, b = (i, i + 1) if rng.random() < 0.5 else (i + 1, i)
    if units[a] <= least:
        return par
    units[a] -= 1
    units[b] += 1
    return par.with_(stage_layers=space.chunk_sizes(sc.model, par.pp, par.vp, units,
                                                    par.pipeline))


def mcmc(sc: Scenario, con: Constraints, top: int, progress=None,
         budget: int = MCMC_BUDGET, seed: int = MCMC_SEED) -> SearchResult:
    start = time.perf_counter()
    rng = random.Random(seed)
    shapes = [s for s in space.shapes(sc, con)
              if any(space.schedules(sc, con, s, v) for v in space.virtual_stages(sc, con, s))]
    if not shapes:
        raise InfeasibleError(f"mcmc: {driver.unsatisfiable(sc, con)}")
    try:
        cur = manual_plan(sc, con)
    except InfeasibleError:
        s = shapes[0]
        vp = next(v for v in space.virtual_stages(sc, con, s) if space.schedules(sc, con, s, v))
        cur = s.parallelism(space.rank_orders(con, s)[0], vp).with_(
            schedule=space.schedules(sc, con, s, vp)[0],
            **({"recompute": con.recompute} if con.recompute else {}))
    cur_cost = _cost(sc, cur)
    seen: dict[Parallelism, float] = {cur: cur_cost}
    beta = 20.0
    for step in range(budget):
        cand = _neighbour(sc, cur, con, rng, shapes)
        try:
            check_plan(sc, cand)
            c = seen.get(cand)
            if c is None:
                c = seen[cand] = _cost(sc, cand)
        except SpecError:
            continue
        if c <= cur_cost or rng.random() < math.exp(-beta * (c - cur_cost) / cur_cost):
            cur, cur_cost = cand, c
        if progress and step % 200 == 0:
            progress(step, budget, time.perf_counter() - start, of="steps")
    feasible = []
    closest = driver.Shortfall(sc.memory_limit)
    for par in sorted(seen, key=seen.get):
        ev = evaluate(sc, par)
        if ev.within_headroom:
            feasible.append(ev)
        closest.add(ev.peak_memory, ev.plan)
        if len(feasible) >= top:
            break
    if not feasible:
        raise InfeasibleError(f"mcmc: of the plans visited, "
                              f"{driver.why_nothing_fits(sc, con, closest, len(shapes))}")
    visited = {space.Shape.of(p) for p in seen}
    return SearchResult(method="mcmc", plans=feasible, seconds=time.perf_counter() - start,
                        configurations=len(shapes), solved=len(visited),
                        objective=feasible[0].step_time)


def exhaustive(sc: Scenario, con: Constraints, top: int, progress=None,
               limit: int = EXHAUSTIVE_LIMIT) -> SearchResult:
    """Every configuration, every split (``space.split_units``) and every per-stage policy."""
    start = time.perf_counter()
    sets = [[sc.stack.recompute[i].name for i in s] for s in space.policy_sets(sc, con)]

    fixed = con.recompute is not None and len(con.recompute) > 1  # one policy per stage, given

    def per_stage(pp):
        if fixed:
            yield tuple(con.recompute)
            return
        for pols in sets:
            yield from _products(pols, pp)

    def mixes(pp):  # how many per_stage yields
        return 1 if fixed else sum(len(s) ** pp for s in sets)

    # the space is counted as it is listed, and the listing stops once it holds more than the
    # limit (listing the configurations of a large MoE space alone takes seconds)
    listing = space.configurations(sc, con)
    configs, size = [], 0
    for par in listing:
        configs.append(par)
        units, least = space.split_units(sc.model, par.vp)
        size += space.n_compositions(units, par.pp, least) * mixes(par.pp)
        if size > limit:
            break
    if not configs:
        raise InfeasibleError(f"exhaustive: {driver.unsatisfiable(sc, con)}")
    if size > limit:
        whole = next(listing, None) is None
        st = sc.stack
        # the knobs this stack and model let vary (a DeepSpeed user's trial was told to fix
        # --tp, --cp and --vp on a stack with none of them)
        varies = {"pp": st.offers("pp"), "vp": st.offers("pp") and st.interleaves,
                  "tp": st.offers("tp"), "cp": st.offers("cp"),
                  "ep": st.offers("ep") and sc.model.moe is not None,
                  "zero": len(st.zero_stages) > 1}
        knobs = ("pp", "recompute", "vp", "tp", "dp", "cp", "ep", "mbs", "zero")
        free = " ".join(f"--{k}" for k in knobs if getattr(con, k) is None
                        and varies.get(k, True))
        count = f"{size:,}" if size < 10**12 else f"about {size:.2g}"
        holds = f"{count} plans, more than {limit:,}" if whole else f"more than {limit:,} plans"
        most = ("pipeline depth and per-stage recomputation multiply it most"
                if st.offers("pp") and st.recompute_per_stage else
                "pipeline depth multiplies it most" if st.offers("pp") else "")
        fix = (f"fix some of {free}" + (f" ({most})" if most else "") if free
               else "use a smaller instance")
        raise SpecError("method", "exhaustive", f"the space holds {holds}; {fix}, or use another "
                        "method")
    found = []  # the best plan of every configuration, as the other methods report
    closest = driver.Shortfall(sc.memory_limit)
    done = 0
    for par in configs:
        units, least = space.split_units(sc.model, par.vp)
        best = None
        for per_device in space.compositions(units, par.pp, least):
            sizes = space.chunk_sizes(sc.model, par.pp, par.vp, per_device, par.pipeline)
            for rec in per_stage(par.pp):
                ev = evaluate(sc, par.with_(stage_layers=sizes, recompute=rec))
                done += 1
                closest.add(ev.peak_memory, ev.plan)
                if progress and done % 500 == 0:
                    progress(done, size, time.perf_counter() - start, of="plans evaluated")
                if ev.within_headroom and (best is None or ev.step_time < best.step_time):
                    best = ev
        if best is not None:
            found.append(best)
    if not found:
        raise InfeasibleError(f"exhaustive: "
                              f"{driver.why_nothing_fits(sc, con, closest, len(configs))}")
    found.sort(key=lambda e: e.step_time)
    return SearchResult(method="exhaustive", plans=found[:top],
                        seconds=time.perf_counter() - start, configurations=len(configs),
                        solved=len(configs), objective=found[0].step_time)


def _products(values, n):
    import itertools

    return itertools.product(values, repeat=n)


RUNNERS = {"nest": nest, "manual": manual, "phaze": phaze, "alpa": alpa, "mist": mist,
           "mcmc": mcmc, "exhaustive": exhaustive}
assert tuple(RUNNERS) == METHODS, "search/constraints.py's METHODS names these runners"


def run_method(name: str, sc: Scenario, con: Constraints, *, top: int = 5,
               progress=None) -> SearchResult:
    """Run one method; ``name`` is one of ``METHODS``."""
    check_method(name, sc, con)
    return RUNNERS[name](sc, con, top, progress)


def check_method(name: str, sc: Scenario, con: Constraints) -> None:
    """Raise the SpecError ``run_method`` would before it searches: an unknown method, a
    constraint no plan of ``sc`` can have, a schedule the searches do not run."""
    if name not in RUNNERS:  # (a NEST-paper trial's "nets" and "Nest" had got no hint)
        near = difflib.get_close_matches(str(name).lower(), METHODS, n=1, cutoff=0.6)
        raise SpecError("method", name, (f"did you mean '{near[0]}'? " if near else "")
                        + f"allowed: {', '.join(METHODS)}")
    check_constraints(sc, con)  # every method refuses what no plan can have, alike
    if name != "manual":  # one rule-made plan, evaluated; the others search the space
        refuse_unsearchable(con)


def attempt(name: str, sc: Scenario, con: Constraints, top: int,
            progress=None) -> tuple[SearchResult | None, str | None]:
    """One method's result, or (None, why it found none) as ``compare`` lists it."""
    try:
        return run_method(name, sc, con, top=top, progress=progress), None
    except (InfeasibleError, SpecError) as e:
        text = e.allowed if isinstance(e, SpecError) else str(e)  # the rule, whole
        return None, text.removeprefix(f"{name}: ")  # the method names it already


LONGEST_FIRST = ("exhaustive", "nest", "phaze", "alpa", "mcmc", "mist", "manual")
"""The order ``side_by_side`` starts the methods in, so that the longest does not start last:
exhaustive takes up to a minute where it runs at all (``EXHAUSTIVE_LIMIT``) and refuses a larger
space at once; then by search times on a large space (Qwen3-235B on 512 H100: nest 12 s, phaze 7,
alpa 5, mcmc 4, mist 2)."""
assert sorted(LONGEST_FIRST) == sorted(METHODS)


def side_by_side(sc: Scenario, con: Constraints, top: int, workers: int,
                 progress=None) -> dict[str, tuple[SearchResult | None, str | None]]:
    """Every method's ``attempt`` (``METHODS`` order), run in ``workers`` processes at once: each
    search is one process's work and they share nothing. ``progress(done, total, seconds)``
    counts the methods finished."""
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from ..processes import stop_pool, worker_signals

    start = time.perf_counter()
    done = {}
    pool = ProcessPoolExecutor(min(workers, len(METHODS)), initializer=worker_signals)
    try:
        pending = {pool.submit(attempt, name, sc, con, top): name for name in LONGEST_FIRST}
        while pending:
            finished, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for f in finished:
                done[pending.pop(f)] = f.result()
            if progress:
                progress(len(done), len(METHODS), time.perf_counter() - start)
    except BaseException:  # Ctrl-C, SIGTERM or a failure: the other searches stop too
        stop_pool(pool)
        raise
    pool.shutdown()
    return {name: done[name] for name in METHODS}
