"""Search driver: enumerate configurations in order of their lower bound, run the stage DP on
each until no remaining configuration can enter the top K, and score the winners with
``evaluate`` on the real cluster.

The same driver serves NEST and the DP-based baselines: a baseline passes a *view* of the
scenario (a flattened network, say) that the search optimises, and the plans it finds are then
scored on the real scenario.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

import numpy as np

from ..axes import MEGATRON_ORDER
from ..caching import cached
from ..cost import device as D
from ..cost import memory as M
from ..errors import InfeasibleError, SpecError
from ..evaluate import evaluate, with_default_split
from ..graph import BLOCK_KINDS, routed_expert_params, total_params
from ..result import Evaluation
from ..specs import (MIN_CP_CHUNK, Parallelism, Scenario, check_plan, cp_splits, divisors,
                     multiples_near, plan_knobs, uneven_chunks)
from ..stack import StackSpec
from ..units import GiB, fmt_gib
from . import dp as DP
from . import space
from .constraints import Constraints, check_constraints, constraints_text, refuse_unsearchable
from . import tables as T

SHORTFALL_MEASURED = 64
"""When nothing fits, how many configurations over the limit by their memory floors (lower bounds)
are measured exactly at most, least floor first, for the closest plan; where more floors were
below its shortfall, the message says so and gives the least of them."""

STEP_TIE_S = 1e-9
"""Seconds within which two found plans' steps count as equal (listed then by peak memory)."""
PROGRESS_EVERY_S = 0.5
"""Seconds between a search's calls of its ``progress`` (the command line shows fewer)."""

Progress = Callable[..., None]
"""``progress(done, total, seconds)``: configurations solved of those in the space (``examined=``:
and those whose memory floors and bounds were checked, most never solved; a method that
counts something else names it, ``progress(done, total, seconds, of="steps")``; ``bounded=``:
the plan shapes whose bounds the search has computed, before it examines any)."""


@dataclass
class SearchResult:
    """What a method found: its best plans (scored on the real scenario) and how it searched."""

    method: str
    plans: list[Evaluation]
    seconds: float
    configurations: int
    """Configurations in the space."""
    solved: int
    """Configurations whose stage DP ran (the others were pruned by their lower bound)."""
    objective: float
    """The best plan's value in the method's own view (equals its step time for NEST)."""
    notes: list[str] = field(default_factory=list)

    @property
    def best(self) -> Evaluation:
        return self.plans[0]


@dataclass(order=True)
class _Found:
    """A plan found, ordered worst first (a min-heap of the top K): by step time, then among
    equal times the later found first, so that ties go to the plan found first whatever K is
    (with K = 1 a tie cannot displace it: only strictly better plans are sought)."""

    key: float
    """Minus what it is ranked by: the DP's objective, plus the schedule's excess where its chunks
    are unequal (``_uneven_evaluation``), or the step of the default split that replaced it
    (``_default_split_if_faster``)."""
    later: int
    """Minus the order in which it was found."""
    par: Parallelism = field(compare=False)
    ev: Evaluation | None = field(default=None, compare=False)
    """Its evaluation on the real scenario, where the search made one (``_uneven_evaluation``)."""


def plan_from_solution(model, model_stack, par: Parallelism,
                       sol: DP.Solution) -> Parallelism:
    """The full plan of a DP solution: blocks per chunk (model order) and policies."""
    units = [s.end - s.start for s in sol.stages]
    return par.with_(stage_layers=space.chunk_sizes(model, par.pp, par.vp, units, par.pipeline),
                     recompute=tuple(model_stack.recompute[s.policy].name for s in sol.stages))


class _Floor(NamedTuple):
    """What ``_states_floor`` and ``_positions_fit`` need of a configuration (bytes), computed
    once for all its policy sets."""

    states: float
    """The average device's model states."""
    saved: np.ndarray
    """Per recompute policy, the least bytes a block keeps per micro-batch."""
    transient: np.ndarray
    """Per recompute policy, the least working memory of a block's backward."""
    blocks_held: float
    """Blocks' worth of activations (in micro-batches) the average device holds at least."""
    stack: StackSpec
    block: tuple[float, ...]
    """For each count n of blocks, 0 to the model's, the least model states n blocks hold: the
    n lightest blocks'."""
    heaviest: float
    """The heaviest block's model states (bytes)."""
    lighter: int
    """Blocks lighter than the heaviest (a model's dense blocks among its MoE ones): all devices
    together hold no more of them."""
    held: tuple[tuple[tuple[int, ...], int], ...]
    """The micro-batches each chunk of a device holds at its peak, with how many devices hold
    alike (devices holding alike share every per-device floor)."""


def _floor_parts(sc: Scenario, par: Parallelism) -> _Floor:
    """The configuration's ``_Floor``."""
    dense, expert, saved, transient, weights, blocks_held, light, held = _floor_shared(
        sc, space._keys(par)[1])
    st = sc.stack
    w, g, o = M.model_states(dense, expert, par.zero, par.dp * par.cp, par.expert_dp, st, par.pp)
    if par.zero >= 3:  # the gathered weights of the block in use and the next one
        transient = transient + 2 * M.COMPUTE_BYTES * weights
    return _Floor(w + g + o, saved, transient, blocks_held, st,
                  *_lightest_blocks(light, par.zero, par.dp * par.cp, par.expert_dp, st, par.pp),
                  held)


@cached(maxsize=16384)
def _lightest_blocks(light, zero: int, dp: int, edp: int, stack: StackSpec,
                     pp: int) -> tuple[tuple[float, ...], float, int]:
    """``_Floor.block``, ``heaviest`` and ``lighter`` from the block kinds' (count, dense,
    expert parameters), whose counts add up to the model's blocks; ``pp``: as
    ``memory.model_states``."""
    per = sorted((sum(M.model_states(p, e, zero, dp, edp, stack, pp)), n)
                 for n, p, e in light)
    heaviest = per[-1][0]
    states = [s for s, n in per for _ in range(n)]
    return (tuple(np.concatenate(([0.0], np.cumsum(states))).tolist()), heaviest,
            sum(n for s, n in per if s < heaviest))


@cached(maxsize=16384)
def _floor_shared(sc: Scenario, par: Parallelism):
    """``_floor_parts`` of a plan without its ZeRO stage: the average device's dense and expert
    parameters, the least kept and working bytes per policy, the fewest weights one ZeRO-3
    gather brings in, the blocks' worth of activations held, each block kind's (dense, expert)
    parameters, and the micro-batches each chunk of each kind of device holds (``_Floor.held``).
    No byte depends on where the
    ranks sit: the plans of every rank order share one (``_floor_of``)."""
    from ..evaluate import local_strategy

    return _floor_of(sc, local_strategy(sc.model, par, sc.training, sc.stack), par.pp, par.vp,
                     par.pipeline.name, par.dp, par.head_beside_embedding)


@cached(maxsize=16384)
def _floor_of(sc: Scenario, local, pp: int, vp: int, schedule: str, dp: int, beside: bool):
    """``_floor_shared`` of the plans with this local strategy and pipeline."""
    from ..graph import build

    mg = build(sc.model, local)
    layers = mg.counts(beside)
    dense = sum(n * layer.params for n, layer in layers)
    expert = sum(n * layer.expert_params for n, layer in layers)
    saved, transient, weights = _least_kept(mg, sc.stack.recompute, sc.stack.gather_whole_block)
    micro = sc.training.micro_batches(local.mbs, dp)
    held = _chunks_held(schedule, pp, vp, micro)
    least = [min(h) for h in held]
    spare = max(sc.model.layers - vp * pp, 0)
    blocks_held = (vp * sum(least) + spare * min(least)) / pp
    light = tuple((n, layer.params, layer.expert_params) for n, layer in layers
                  if layer.kind in BLOCK_KINDS)
    return (dense / pp, expert / pp, saved, transient, weights, blocks_held, light,
            tuple(Counter(held).items()))


@cached(maxsize=4096)
def _least_kept(mg, policies, whole_block: bool) -> tuple[np.ndarray, np.ndarray, float]:
    """Of a model graph's block kinds, per recompute policy: the least bytes a block keeps for
    backward, the least working memory of a block's backward; and the fewest weights a ZeRO-3
    gather brings in for one block (the whole block in FSDP units, else its largest operator)."""
    from ..recompute import effect

    kinds = [mg.dense] + ([mg.moe] if mg.n_moe else [])
    effects = [[effect(p, k) for k in kinds] for p in policies]
    return (np.array([min(e.saved for e in row) for row in effects]),
            np.array([min(e.transient for e in row) for row in effects]),
            min(k.params + k.expert_params if whole_block else k.largest_weight for k in kinds))


@cached(maxsize=4096)
def _chunks_held(schedule: str, pp: int, vp: int, micro: int) -> tuple[tuple[int, ...], ...]:
    """Per pipeline device, the micro-batches each of its chunks holds at its peak."""
    from ..schedule import SCHEDULES

    return tuple(tuple(SCHEDULES[schedule].held(i, pp, vp, micro)) for i in range(pp))


@cached(maxsize=4096)
def _held_weight(held: tuple[int, ...], blocks: int) -> np.ndarray:
    """Micro-batch-blocks of activations a device with ``held`` per chunk keeps when it holds
    0 to ``blocks`` blocks: each block times the micro-batches its chunk holds (read-only)."""
    out = space.chunk_counts(np.arange(blocks + 1), len(held)) @ np.asarray(held, dtype=float)
    out.flags.writeable = False
    return out


def _states_floor(parts, policies) -> float:
    """Bytes the most loaded device holds at least, whatever the split, when its blocks run
    any mix of ``policies`` (indices): the average device's model states, its activations with
    the blocks where the schedule holds the fewest micro-batches and each keeping the least any
    of the policies keeps, one block's least working memory, and the reserve these imply
    (``memory.reserve``, increasing in both). The most loaded device holds at least the
    average."""
    acts = min(parts.saved[p] for p in policies) * parts.blocks_held
    work = min(parts.transient[p] for p in policies)
    return parts.states + M.reserve(acts, work, parts.stack) + acts + work


def _positions_fit(parts, policies, cap: float, blocks: int, least: int) -> bool:
    """Whether some split of ``blocks`` blocks, at least ``least`` per device, could fit every
    device in ``cap`` bytes when each device runs one of ``policies`` on all its blocks (the
    plans' rule: one policy per pipeline device). Device ``i`` holding ``n`` blocks under policy
    ``p`` needs at least the ``n`` lightest blocks' model states, the least bytes a block keeps
    per micro-batch under ``p`` times the micro-batches each block's chunk holds (its blocks
    spread over its chunks as the plan space spreads them: ``space.chunk_counts``), one block's
    least working memory under ``p``, and the reserve on these (linear: ``memory.reserve``); the
    most blocks each device can hold under its best policy must add up to ``blocks``. A device
    that holds ``k`` of the model's lighter blocks (``_Floor.lighter``) holds at most ``k`` more
    than it could of the heaviest alone (its heaviest ones alone would fit), so the devices
    together hold at most that many more than their counts of the heaviest. The embedding's and
    the head's states are left out (they only add)."""
    states = np.asarray(parts.block[:blocks + 1])
    heaviest = np.arange(blocks + 1) * parts.heaviest
    rooms = [(_room(parts.stack, float(parts.transient[p]), cap), float(parts.saved[p]))
             for p in policies]
    total = heavy = 0
    for held, mult in parts.held:
        weight = _held_weight(held, blocks)
        # a device runs one of the policies on all its blocks: the most it can hold under any
        most = most_heavy = -1
        for (room, share), saved in rooms:
            kept = share * saved * weight
            a, b = (int(np.searchsorted(s + kept, room * (1 + 1e-12), side="right")) - 1
                    for s in (states, heaviest))  # (both nondecreasing)
            most, most_heavy = max(most, a), max(most_heavy, b)
        if most < least:
            return False
        total += mult * min(most, most_heavy + parts.lighter)
        heavy += mult * most_heavy
    return total >= blocks and heavy + parts.lighter >= blocks


def _room(stack: StackSpec, work: float, cap: float) -> tuple[float, float]:
    """Bytes a device has for its blocks' states and kept activations once one block's working
    memory ``work`` and the reserve on it are taken from ``cap``, and the factor the caching
    allocator puts on activations (``memory.reserve``: linear in both)."""
    return cap - M.reserve(0.0, work, stack) - work, 1.0 + stack.allocator_overhead


def _memory_top(parts: _Floor, policies, cap: float, blocks: int, least: int, work: float,
                rcs) -> float:
    """Per-micro-batch work the busiest device has at least when memory forces recomputation:
    device ``i`` holding ``n`` blocks of at least ``work`` seconds each fits in ``cap`` only if
    what its blocks keep, each block's bytes per micro-batch times the micro-batches its chunk
    holds (``_positions_fit``'s floor), stays within its room; the least recompute of ``n``
    blocks doing so is that of the cheapest policy (least kept bytes, least recompute ``rcs``)
    that fits, a device's blocks all running its one policy (``_least_recompute``). So a
    device can hold ``n`` blocks within ``T`` only if ``n·work + R_i(n) <= T``; the least ``T``
    at which those counts (at least ``least`` each) add up to ``blocks`` bounds the busiest
    device (inf when no split fits)."""
    return _least_top_under_memory(
        tuple((float(parts.saved[p]), rcs[p]) for p in policies), parts.held, parts.block,
        min(float(parts.transient[p]) for p in policies), parts.stack, cap, blocks, least, work)


def _least_recompute(points, held: tuple[int, ...], blocks: int,
                     allowed: np.ndarray) -> np.ndarray:
    """For each count ``n`` from 0 to ``blocks``, the least recompute seconds of a device holding
    ``n`` blocks whose kept bytes, each block's weighted by the micro-batches its chunk holds
    (``held``), total at most ``allowed``: a plan runs one policy on all of a device's blocks,
    so the cheapest of the policies (``points``: bytes kept and recompute seconds per block and
    micro-batch, each the least of any block) that fits; inf when none does."""
    n = np.arange(blocks + 1)
    weight = _held_weight(held, blocks)
    out = np.full(n.shape, np.inf)
    for kept, rc in points:
        fits = weight * kept <= allowed * (1 + 1e-12)
        out = np.where(fits, np.minimum(out, n * rc), out)
    return out


@cached(maxsize=65536)
def _least_top_under_memory(points, held, block: tuple, work_mem: float, stack, cap: float,
                            blocks: int, least: int, work: float) -> float:
    """``_memory_top`` from hashable parts (configurations of one shape share them): ``points``
    per policy (bytes kept per block and micro-batch, recompute seconds per block and
    micro-batch), ``held`` (``_Floor.held``: micro-batches per chunk of each kind of device, with
    its count), ``block`` (``_Floor.block``), ``work_mem`` and ``cap`` bytes,
    ``work`` seconds per block and micro-batch."""
    room, share = _room(stack, work_mem, cap)
    n = np.arange(blocks + 1)
    curves = []
    for h, mult in held:  # devices holding alike share a curve
        budget = room - np.asarray(block[:blocks + 1])
        rec = _least_recompute(points, h, blocks, budget / share)
        cost = n * work + rec
        cost[budget < 0] = np.inf
        cost[0] = 0.0
        # the least cost of holding n or more blocks: nondecreasing in n
        curves.append((np.minimum.accumulate(cost[::-1])[::-1], mult))
    candidates = np.unique(np.concatenate([c[np.isfinite(c)] for c, _ in curves]))
    # at each candidate T, the most blocks each device can hold (a nondecreasing curve's count
    # of values <= T, less the n = 0 entry), all candidates at once
    total = np.zeros(candidates.size, dtype=np.int64)
    enough = np.ones(candidates.size, dtype=bool)
    for c, mult in curves:
        most = np.searchsorted(c, candidates, side="right") - 1
        total += mult * most
        enough &= most >= least
    holds = np.flatnonzero(enough & (total >= blocks))
    return float(candidates[holds[0]]) if holds.size else np.inf


def _set_bounds(sc: Scenario, par: Parallelism, sets, single: bool, parts: _Floor | None,
                cap: float) -> list[float]:
    """The configuration's bound for each policy set (``space.config_bound``, one computation
    for all): with one policy in every block (``single``), its least per-micro-batch recompute
    time joins it; with ``parts`` (memory-aware), the busiest device's least work when memory
    forces recomputation (``_memory_top``; inf when no split fits)."""
    times = _recompute_times(sc, space._keys(par)[0])
    rcs = tuple(cheapest for _, cheapest in times)
    layers = sc.model.layers
    tops = []
    for s in sets:
        free = tuple(p for p in s if rcs[p] == 0.0)
        if parts is None or (free and _positions_fit(parts, free, cap, layers, par.vp)):
            tops.append(0.0)  # a split that recomputes nothing may fit: nothing forced
        else:
            tops.append(_memory_top(parts, s, cap, layers, par.vp,
                                    space.least_block_work(sc, par), rcs))
    bounds = space.policy_bounds(sc, par, [times[s[0]] if single else (0.0, 0.0) for s in sets],
                                 [t if np.isfinite(t) else 0.0 for t in tops])
    return [b if np.isfinite(t) else np.inf for b, t in zip(bounds, tops)]


@cached(maxsize=16384)
def _recompute_times(sc: Scenario, par: Parallelism) -> tuple[tuple[float, float], ...]:
    """Per recompute policy, seconds per micro-batch: the recomputed operators' compute over
    all blocks and of the cheapest block (``space._recomputed``, without the collectives they
    repeat). Depends only on the plan's local strategy: pass it without vp, ZeRO and schedule."""
    from ..cost.hardware import effective
    from ..evaluate import layer_graph

    g = layer_graph(sc.model, par, sc.training, sc.stack)
    acc, prec = effective(sc.cluster, sc.stack).accelerator, sc.training.precision
    blocks = [(n, k) for n, k in ((len(g.kinds) - g.n_moe, g.dense), (g.n_moe, g.moe)) if n]
    out = []
    for policy in sc.stack.recompute:
        rc = [(n, space._recomputed(k, acc, prec, policy)) for n, k in blocks]
        out.append((sum(n * r for n, r in rc), min(r for _, r in rc)))
    return tuple(out)


def run(sc: Scenario, con: Constraints, *, method: str = "nest", top: int = 5,
        view: Scenario | None = None, policies: tuple[int, ...] | None = None,
        memory_aware: bool = True, progress: Progress | None = None) -> SearchResult:
    """Best ``top`` plans of the space under ``con``, optimised in ``view`` (default: ``sc``).

    Best-first branch and bound, each node with a lower bound on the step time: a shape
    (degrees, micro-batch) bounded by its compute; with a rank order, by its compute and exposed
    intra-layer communication; with virtual stages, also by its pipeline fill; with a ZeRO stage,
    also by its data-parallel traffic — and then solved exactly by the stage DP. A node is
    dropped once its bound cannot beat the K-th best plan found. ``policies`` restricts the
    recompute policies per stage; ``memory_aware=False`` searches as if memory were unlimited
    (baselines that check memory afterwards).
    """
    start = time.perf_counter()
    check_constraints(sc, con)
    refuse_unsearchable(con)
    world = view or sc
    cap = world.memory_limit
    if memory_aware and world.stack.reserved_bytes >= cap:  # before searching for nothing
        raise InfeasibleError(f"{method}: no plan fits in {fmt_gib(cap)} GiB per device: "
                              + _reserve_fills(world))
    sets = space.policy_sets(world, con)
    per_stage = con.recompute if con.recompute is not None and len(con.recompute) > 1 else None
    if policies is not None:  # a baseline's own restriction, within what the stack offers
        sets = [tuple(p for p in s if p in policies) for s in sets]
        sets = [s for s in sets if s]
    if not sets:
        names = ", ".join(world.stack.recompute[p].name for p in (policies or ()))
        raise InfeasibleError(f"{method} searches only the recompute policies {names}; "
                              "the constraints allow none of them")
    single = all(len(s) == 1 for s in sets)  # one policy in every block of a plan
    fixed = tuple(s[0] for s in sets) if single else None
    heap: list = []
    tick = 0
    size = 0
    spaced = []  # (shape, its virtual stages)
    for shape in space.shapes(world, con):
        vps = space.virtual_stages(world, con, shape)
        if not vps:  # a fixed vp this shape cannot take
            continue
        variants = sum(len(space.schedules(world, con, shape, v)) for v in vps)
        if not variants:  # a fixed schedule this shape cannot run
            continue
        orders = space.rank_orders(con, shape)
        zeros = space.zero_stages(world, con, shape.parallelism())
        size += variants * len(orders) * len(zeros)
        spaced.append((shape, vps))
    found: list[_Found] = []  # the top K so far, as a heap on the negated objective
    unfit: list[Parallelism] = []  # no split fits (``_positions_fit``), or no plan came of it
    solved = found_count = examined = bounded = 0
    shortfall = Shortfall(cap)
    # no floor within the limit anywhere: the search would only time what cannot fit
    everywhere = memory_aware and _floored_everywhere(
        world, con, spaced, sets, cap,
        progress and (lambda n: progress(0, size, time.perf_counter() - start, examined=n)))
    # (floor over the limit, tick, configuration, its _Floor): none fits
    floored: list = everywhere or []
    if everywhere:
        examined = size
    else:
        last_report = start
        for tick, (shape, vps) in enumerate(spaced):
            heapq.heappush(heap, (space.compute_bound(world, shape, max(vps), fixed), tick, 0,
                                  shape))
            bounded += 1
            if progress and time.perf_counter() - last_report > PROGRESS_EVERY_S:
                last_report = time.perf_counter()
                progress(0, size, last_report - start, examined=0, bounded=bounded)
        tick = len(spaced)
    last_report = start
    while heap:
        lb, _, level, item = heapq.heappop(heap)
        bound = -found[0].key if len(found) >= top else np.inf
        if lb >= bound:
            break
        now = time.perf_counter()
        if progress and now - last_report > PROGRESS_EVERY_S:
            progress(solved, size, now - start, examined=examined, bounded=bounded)
            last_report = now
        if level == 0:  # shape -> rank orders
            vps = space.virtual_stages(world, con, item)
            for order in space.rank_orders(con, item):
                par = item.parallelism(order)
                b = max(lb, space.network_bound(world, par, max(vps)))
                heapq.heappush(heap, (b, tick, 1, (par, vps)))
                tick += 1
                bounded += 1  # (what progress counts before any is examined: a pipeline
                # engineer's MoE search had read "0 examined" for 14 s)
            continue
        if level == 1:  # rank order -> virtual stages
            base, vps = item
            for par, zeros in _variants(world, con, base, vps):
                heapq.heappush(heap, (max(lb, space.network_bound(world, par)), tick, 2,
                                      (par, zeros)))
                tick += 1
                bounded += 1
            continue
        if level == 2:  # virtual stages -> ZeRO stage
            par, zeros = item
            for zero, b in zip(zeros, space.config_bounds(world, par, zeros)):
                b = max(lb, b)  # the parent's bound holds for its children too
                if b < bound:  # else it could never be popped before the search ends
                    heapq.heappush(heap, (b, tick, 3, par.with_(zero=zero)))
                    tick += 1
            continue
        if level == 3:  # configuration -> the recompute policy sets that may fit, with bounds
            par = item
            examined += 1
            if memory_aware:
                parts = _floor_parts(world, par)
                floors = {s: _states_floor(parts, s) for s in sets}
                least = min(floors.values())
                if least > cap:  # the floor bounds its shortfall from below
                    floored.append((least - cap, tick, par, parts))
                    tick += 1
                    continue
                # each device holds one block per chunk at least
                room = {s: floors[s] <= cap
                        and _positions_fit(parts, s, cap, world.model.layers, par.vp)
                        for s in sets}
                if not any(room.values()):  # solved only if nothing fits, for the shortfall
                    unfit.append(par)
                    continue
            tried = [s for s in sets if not memory_aware or room[s]]
            keep = list(zip(_set_bounds(world, par, tried, single,
                                        parts if memory_aware else None, cap), tried))
            keep = sorted((max(lb, b), s) for b, s in keep if b < bound)
            if not keep:
                continue
            if keep[0][0] > lb:  # wait for its turn
                heapq.heappush(heap, (keep[0][0], tick, 4, (par, keep)))
                tick += 1
                continue
        else:
            par, keep = item
        cc = D.config_costs(world, par)
        tb = T.build(cc)
        if tb is None:
            continue
        solved += 1
        base_ok = tb.ok if memory_aware else [np.ones_like(o) for o in tb.ok]
        for set_bound, allowed in keep:
            bound = -found[0].key if len(found) >= top else np.inf
            if set_bound >= bound:
                break
            allow = _policy_mask(world.stack, allowed)
            ok = [o & allow for o in base_ok]
            if per_stage:  # one fixed policy per pipeline device
                ok = [o & (np.arange(len(allow)) == world.stack.policy_index(per_stage[i]))
                      for i, o in enumerate(ok)]
            sol = DP.solve(tb.x, tb.e, ok, cc.micro, par.vp, tb.const, bound=bound, y=tb.y)
            if sol is None:
                continue
            found_count += 1
            plan = plan_from_solution(world.model, world.stack, par, sol)
            # (a baseline's view is ranked by its closed form, as that baseline ranks)
            ev = _uneven_evaluation(sc, plan) if view is None else None
            key = -sol.objective - (ev.uneven_chunks if ev is not None else 0.0)
            if ev is not None:
                even = _default_split_if_faster(sc, ev)
                if even is not None:  # (never above the DP's objective: see the helper)
                    ev, plan, key = even, even.plan, -max(even.step_time, sol.objective)
            entry = _Found(key, -found_count, plan, ev)
            if len(found) < top:
                heapq.heappush(found, entry)
            else:
                heapq.heappushpop(found, entry)
        if memory_aware and not found:  # measured at the end, if nothing is found at all
            unfit.append(par)
    if not found:
        # how far the allowed policies are from fitting the whole model: measured for the
        # configurations no split could fit and those no plan came from (a cell of a few blocks
        # may fit where no split of all of them does), then for those whose memory floor was over
        # the limit, least floor first, until a floor (a lower bound) cannot beat the closest;
        # one whose blocks could not fit in the closest's peak either is passed over unmeasured
        for par in _one_order(unfit):
            _measure_shortfall(world, par, sets, per_stage, shortfall)
        if not everywhere:  # the search floored each configuration at every order it popped
            floored = _one_order(floored, lambda entry: entry[2])
        heapq.heapify(floored)
        first = floored[0] if floored else None
        measured = 0
        while floored and floored[0][0] < shortfall.gap:
            if measured == SHORTFALL_MEASURED:
                shortfall.unproven(cap + floored[0][0], len(unfit) + measured)
                break
            _, _, par, parts = heapq.heappop(floored)
            if any(_positions_fit(parts, s, cap + shortfall.gap, world.model.layers, par.vp)
                   for s in sets):
                _measure_shortfall(world, par, sets, per_stage, shortfall)
                measured += 1
        if shortfall.plan is None and first:  # no table to measure: the floor, a lower bound
            shortfall.add(cap + first[0], first[2], floor=True)
    if progress:
        progress(solved, size, time.perf_counter() - start, examined=examined, bounded=bounded)
    if not found:
        raise InfeasibleError(why_nothing_fits(sc, con, shortfall, size, method),
                              closest_details(sc, shortfall))
    best = sorted(found, reverse=True)  # best first
    # of equal steps the one holding least memory first, then the first found (a DeepSpeed
    # trial's ZeRO-0 pipeline, at 69.7 GiB, was listed above the same step's ZeRO-1 at 51.8)
    plans = sorted((f.ev or evaluate(sc, f.par) for f in best),
                   key=lambda e: (round(e.step_time / STEP_TIE_S), e.peak_memory))
    return SearchResult(method=method, plans=plans, seconds=time.perf_counter() - start,
                        configurations=size, solved=solved, objective=-best[0].key)


def _uneven_evaluation(sc: Scenario, par: Parallelism) -> Evaluation | None:
    """A found plan's evaluation where its step may exceed the DP's objective, the closed form,
    else None (the results reuse it): where a device's chunks hold different numbers of blocks,
    by their schedule's excess (``Evaluation.uneven_chunks``; two user trials: the search had
    ranked first a plan whose simulation was 7 % later than the next plan's). Ranking the found
    plans by objective plus excess keeps the pruning
    sound (a configuration's bounds and its DP's are below its closed form, which is below its
    step), but the DP still picks each configuration's split and arrangement by the closed form:
    another of the same configuration can be faster (a review: 2.4 % with vp 8 fixed)."""
    return evaluate(sc, par) if uneven_chunks(sc.model, par) else None


def _default_split_if_faster(sc: Scenario, ev: Evaluation) -> Evaluation | None:
    """The plan of ``ev`` (a found plan whose chunks are unequal) with the default split of the
    blocks (``evaluate.with_default_split``), where that runs faster and fits within the
    headroom: the DP picks a configuration's split by the closed form, which the schedule of
    unequal chunks can exceed (a new user's trial: the best plan took 5 % longer than itself with
    the default split, which the plan's own note said); else None. Its step is at least the DP's
    objective (the default split is one the DP weighs, at its closed form or more), which the
    caller's key keeps in any case, so the pruning bounds hold."""
    even = with_default_split(sc, ev.plan)
    if even is not None and even.step_time < ev.step_time and even.within_headroom:
        return even
    return None


def _one_order(items: list, plan=lambda item: item) -> list:
    """The first of ``items`` of each configuration (``plan(item)``) apart from its rank order:
    no byte of memory depends on where the ranks sit (``_floor_shared``), so a shortfall measured
    at one order holds at every other."""
    seen: set = set()
    out = []
    for item in items:
        key = plan(item).with_(rank_order=MEGATRON_ORDER)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _variants(world: Scenario, con: Constraints, base: Parallelism, vps: list[int]):
    """Yield ``base`` (a shape at one rank order) with each of its virtual stage counts ``vps``
    and the schedules the stack runs them with, and the ZeRO stages it runs each with, the plan
    checked with the first of those (the shape's is 0). None of it depends on the rank order."""
    for vp in vps:
        for sched in space.schedules(world, con, base, vp):
            par = base.with_(vp=vp, schedule=sched)
            zeros = space.zero_stages(world, con, par)
            if not zeros:
                continue
            try:
                check_plan(world, par.with_(zero=zeros[0]))
            except SpecError:
                continue
            yield par, zeros


def _floored_everywhere(world: Scenario, con: Constraints, spaced, sets, cap: float,
                        report: Callable[[int], None] | None = None) -> list | None:
    """When no configuration's memory floor is within ``cap`` (bytes), each one's entry of the
    search's ``floored`` (its floor over the limit, its index, the configuration, its ``_Floor``)
    at the first rank order: no byte depends on where the ranks sit, and which plans the stack
    runs does not either (``_variants``), so one order stands for all (``_floor_shared``). None
    as soon as a floor is within the limit. ``spaced``: the space's (shape, virtual stages); the
    most model-parallel shapes, whose floors are the least, are tried first, so that a search
    with room stops here within a few. ``report(n)``: called with the count floored every half
    second."""
    out: list = []
    last = time.perf_counter()
    for shape, vps in sorted(spaced, key=lambda sv: (-sv[0].tp * sv[0].pp * sv[0].cp * sv[0].ep,
                                                     sv[0].mbs)):
        base = shape.parallelism(space.rank_orders(con, shape)[0])
        for par, zeros in _variants(world, con, base, vps):
            for zero in reversed(zeros):  # the most sharded first
                cfg = par.with_(zero=zero)
                parts = _floor_parts(world, cfg)
                least = min(_states_floor(parts, s) for s in sets)
                if least <= cap:
                    return None
                out.append((least - cap, len(out), cfg, parts))
            if report and time.perf_counter() - last > PROGRESS_EVERY_S:
                report(len(out))
                last = time.perf_counter()
    return out


def _measure_shortfall(world: Scenario, par: Parallelism, sets: list[tuple[int, ...]],
                       per_stage: tuple[str, ...] | None, shortfall: "Shortfall") -> None:
    """Adds configuration ``par``'s least-memory plans to ``shortfall`` (none if it has no
    table)."""
    tb = T.build(D.config_costs(world, par))
    if tb is not None:
        for peak, plan in _least_peaks(world, tb, par, sets, per_stage):
            shortfall.add(peak, plan)


def _policy_mask(stack: StackSpec, indices) -> np.ndarray:
    """A mask over the stack's recompute policies, true at ``indices``."""
    mask = np.zeros(len(stack.recompute), dtype=bool)
    mask[sorted(indices)] = True
    return mask


def _least_peaks(world: Scenario, tb, par: Parallelism, sets: list[tuple[int, ...]],
                 per_stage: tuple[str, ...] | None) -> list[tuple[float, Parallelism]]:
    """The plans of configuration ``par`` that need the least memory, one per policy set the
    search may use (``sets``; ``per_stage``: one policy fixed on each pipeline device), each with
    its largest device memory: the split and the per-stage policies are the memory chain's own,
    so that the plan a shortfall names is the one whose memory it quotes."""
    stack = world.stack
    if per_stage:
        groups = [[_policy_mask(stack, [stack.policy_index(name)]) for name in per_stage]]
    else:
        groups = [[_policy_mask(stack, s)] * len(tb.mem) for s in sets]
    out = []
    for masks in groups:
        # (tables.build already puts inf outside the valid cells)
        peak, back = DP.least_peak(tb.mem, masks)
        if np.isfinite(peak):
            stages = DP.backtrack(back, tb.mem[0].ndim == 2, len(stack.recompute))
            out.append((float(peak), plan_from_solution(world.model, stack, par,
                                                         DP.Solution(float(peak), stages))))
    return out


def unsatisfiable(sc: Scenario, con: Constraints) -> str:
    """Why a space with no configuration is empty, naming the fixed knobs, and the global batch
    where it alone empties it: the space at a batch every data-parallel size divides has shapes
    (a user trial's --tp 1 --pp 1 on 64 devices at global batch 100 was told every rule)."""
    fixed = constraints_text(con)
    head = (f"no configuration of {sc.gpus} devices " + (
        "fits the rules" if fixed == "(none)" else f"satisfies the constraints {fixed}")
        + f" for {sc.model.name}")
    gb = sc.training.global_batch
    relaxed = replace(sc, training=replace(sc.training, global_batch=sc.gpus * space.MAX_MBS))
    dps = sorted({shape.dp for shape in space.shapes(relaxed, con)})
    if dps and all(gb % d for d in dps):  # (else another rule empties it: a review's)
        near = " or ".join(f"{n:,}" for n in multiples_near(gb, dps[0]))
        return (f"{head}: global batch {gb:,} is a multiple of none of the data-parallel sizes "
                f"they leave ({', '.join(map(str, dps))}): a multiple of {dps[0]}, such as {near}, "
                "would be")
    # (the CP rule too: a fuzzing trial's --tp 1 --pp 1 --mbs 64 on 8 GPUs at 4,096 tokens
    # needed cp 8, 512 tokens a rank, which the rules it was told allowed; the dispatcher's: a
    # review's flex stack at dp 1 had been told rules its plans met)
    flex = sc.model.moe is not None and sc.stack.dispatcher_refusal(1, 1, sc.cluster) is not None
    return (f"{head} (tp·pp·dp·cp must equal gpus, tp divide the heads, pp·vp not exceed the "
            f"layers, mbs·dp divide the global batch, the micro-batches per replica suit the "
            f"schedule, " + ("stack " + sc.stack.name + "'s DeepEP dispatcher have more than one "
                             "expert-TP x EP rank, " if flex else "")
            + f"and cp leave each rank at least {MIN_CP_CHUNK:,} of the sequence's "
            f"tokens unless --cp fixes it)")


class Shortfall:
    """The plan whose peak memory misses the limit by the least, of those added."""

    def __init__(self, limit: float):
        self.limit = limit
        self.gap, self.plan = np.inf, None  # bytes over the limit, and the plan
        self.floor = False
        # where configurations were left unmeasured whose floors were below the gap: the least
        # of those floors and how many were measured
        self.least, self.measured = None, 0

    def add(self, peak: float, plan: Parallelism, floor: bool = False) -> None:
        """A plan that needs ``peak`` bytes (inf: not measured); ``floor``: ``peak`` is a lower
        bound for its configuration, whatever its split and policies."""
        if 0 < peak - self.limit < self.gap:
            self.gap, self.plan, self.floor = peak - self.limit, plan, floor

    def unproven(self, least: float, measured: int) -> None:
        """Configurations were left unmeasured that need at least ``least`` bytes, less than the
        closest plan of the ``measured`` ones."""
        self.least, self.measured = least, measured


def closest_details(sc: Scenario, shortfall: Shortfall) -> dict:
    """The closest plan as data for ``--json`` (``closest``: its summary as ``plan --json``'s
    ``top`` entries give it, and ``short_gib``, what its peak misses the memory limit by; a user
    scripting the JSON found it only in the reason's prose); none where only a lower bound of a
    configuration is known."""
    if shortfall.plan is None or shortfall.floor:
        return {}
    from ..result import SUMMARY_KEYS

    ev = evaluate(sc, shortfall.plan)
    js = ev.to_json()
    return {"closest": {**{k: js[k] for k in SUMMARY_KEYS}, "etp": js["etp"],
                        "stage_layers": js["stage_layers"],
                        "short_gib": (ev.peak_memory - sc.memory_limit) / GiB}}


def _reserve_fills(sc: Scenario) -> str:
    """What leaves no plan of any size room: the stack's own reserve."""
    return (f"stack {sc.stack.name} reserves {fmt_gib(sc.stack.reserved_bytes)} GiB on every "
            "device (reserved_GiB), which leaves nothing for the model; give the stack less")


def _more_gpus_help(sc: Scenario, con: Constraints) -> bool:
    """Whether more devices could help under these constraints: tensor parallelism, a pipeline
    at the ZeRO stage given, ZeRO-3 or expert parallelism left open to split the weights, or the
    weights the fixed TP, PP and EP leave on a device within the limit (a DeepSpeed trial's ZeRO-2
    on a stack without TP or a ZeRO-2 pipeline had been told to try more GPUs, which keep every
    weight on each; a fixed EP had been left out, and Qwen3-235B-A22B at EP 16 told that every
    device holds all of the weights)."""
    st = sc.stack
    whole = total_params(sc.model) * st.weight_bytes
    tp = con.tp or 1  # (left open, TP splits the weights already: ``splits``)
    if sc.model.moe is not None and con.ep is not None:
        # the experts split over EP and the widest expert TP the stack runs with these degrees
        etps = st.expert_tps(tp, con.ep, biased=sc.model.biased_experts)
        etp = con.etp or max(etps, default=1)
        experts = routed_expert_params(sc.model) * st.weight_bytes
        whole -= experts * (1 - tp / (con.ep * etp))  # (divided by tp below)
    splits = ((st.offers("tp") and con.tp is None and sc.model.heads > 1)
              or (st.offers("pp") and con.pp is None
                  and (con.zero is None or con.zero <= st.max_zero_with_pp))
              or ((con.zero is None or con.zero == 3) and 3 in st.zero_stages)
              or (sc.model.moe is not None and st.offers("ep") and con.ep is None))
    # (fixed TP and PP split it as far as they go; more devices then shard only the gradients and
    # optimizer states, which helps where the weights left on each device fit)
    return splits or whole / (tp * (con.pp or 1)) < sc.memory_limit


def why_nothing_fits(sc: Scenario, con: Constraints, shortfall: Shortfall, n_configs: int,
                     method: str = "nest") -> str:
    """Why a search of ``n_configs`` configurations found nothing: the constraints, or the
    closest plan (``shortfall``) and what would help (to a ``method`` that never shards, not
    ZeRO-3: a DeepSpeed trial's phaze had been told to drop a --zero never given)."""
    if n_configs == 0:
        return unsatisfiable(sc, con)
    gap, par = shortfall.gap, shortfall.plan
    hbm = sc.cluster.accelerator.hbm_bytes
    room = (f"{sc.memory_limit / GiB:.1f} GiB per device ({hbm / GiB:.1f} GiB less "
            f"{sc.memory_headroom:.0%} headroom)" if sc.memory_headroom else
            f"{hbm / GiB:.1f} GiB per device")
    if sc.stack.reserved_bytes >= sc.memory_limit:
        return f"nothing fits in {room}: {_reserve_fills(sc)}"
    if par is None:
        return "no configuration fits in memory"
    more_gpus = _more_gpus_help(sc, con)
    hints = ["more GPUs"] if more_gpus else []
    if con.pp is not None:
        hints.append("a longer pipeline (drop --pp)")
    if con.zero is not None and con.zero < 3 and method != "phaze":
        hints.append("ZeRO-3 (drop --zero)")
    if con.recompute is not None:
        hints.append("full recomputation (drop --recompute)")
    if con.mbs is not None and con.mbs > 1:
        hints.append("a smaller micro-batch (drop --mbs)")
    if con.tp is not None or con.tp_within_node:
        drop = [f for f, given in (("--tp", con.tp is not None),
                                   ("--tp-within-node", con.tp_within_node)) if given]
        hints.append(f"more tensor parallelism (drop {' and '.join(drop)})")
    if con.ep is not None and sc.model.moe is not None:
        hints.append("more expert parallelism (drop --ep)")
    seq = sc.training.seq_len
    if con.cp is None and par.cp == 1 and sc.stack.offers("cp") and sc.gpus > 1 and not any(
            cp_splits(seq, c) for c in divisors(sc.gpus)[1:]):
        # (more GPUs alone had been the hint for an odd length: a long-context trial's)
        hints.append(f"a sequence length context parallelism can split ({seq:,} is a multiple "
                     "of 2·cp for no cp that divides the GPUs: two chunks per rank)")
    if 0 < gap <= sc.memory_headroom * hbm:  # only where giving up headroom could close the gap
        hints.append(f"less headroom (--memory-headroom, now {sc.memory_headroom:.0%})")
    # a floor bounds a configuration's memory from below, whatever its split: "at least"
    what, least = ("configuration", " at least") if shortfall.floor else ("plan", "")
    knobs = " ".join(plan_knobs(sc.model, par, settled=not shortfall.floor))
    unproven = ("" if shortfall.least is None or shortfall.floor else
                f" (the closest of {shortfall.measured:,} measured; none needs less than "
                f"{fmt_gib(shortfall.least)} GiB)")
    tried = f"try {', '.join(hints)}" if hints else "nothing in these flags helps"
    if not more_gpus:
        tried += " (no GPU count does: the weights each device holds under them do not fit)"
    return (f"nothing fits in {room}; the closest {what} ({knobs}) needs{least} "
            f"{fmt_gib(gap + shortfall.limit)} GiB, short by{least} {fmt_gib(gap)} GiB{unproven}; "
            f"{tried}")
