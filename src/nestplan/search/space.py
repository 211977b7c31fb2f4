"""The plan space: every configuration the search may pick, and a cheap lower bound for each.

A configuration fixes everything but the stage split and the per-stage recomputation (which the
DP chooses): TP (with or without SP), CP, EP and expert-TP, PP, DP, virtual stages, ZeRO stage,
micro-batch size and the rank order. Ranges searched (documented limits):

* tp: divides gpus and heads, fits kv-heads (divides or is a multiple), divides the FFN width;
  dividing the GPUs of a node when ``tp_within_node`` (so that no group straddles two);
* cp: 1, or divides the sequence into chunks of at least ``specs.MIN_CP_CHUNK`` tokens (any fixed
  value check_plan takes);
* ep: divides the experts, and etp·ep divides tp·cp·dp (the expert grid folds over the
  attention grid's ranks, as Megatron-Core's MoE parallel folding); expert-TP is 1 or tp (any
  degree fixed; every one within a node gained 0.3 % once in 12 MoE searches, README);
* pp: divides the rest, at most the layers; vp: 1, or up to ``MAX_VP`` chunks per device (any
  count the user fixes) with
  a micro-batch count one of the stack's schedules runs with them (``Schedule.check``: rounds
  of pp when looped, at least 2·pp in a V) and at least one block per chunk (``split_units``: each
  device's blocks spread evenly over its chunks; a model whose blocks differ needs vp to divide
  the layers and repeats one split in every round);
* zero 0-3 (the stack's; the lowest alone where nothing is sharded: the others run the same
  step and keep as much or more); mbs: divisors of the per-replica batch up to ``MAX_MBS`` (or
  the fixed one);
* rank orders: tensor parallelism innermost, then every order of the other axes of size > 1
  (axes of size 1 move nothing).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..caching import cached
from .. import graph as G
from ..axes import RANK_AXES, Axis
from ..cost.compute import op_time
from ..cost.hardware import effective
from ..errors import SpecError
from ..evaluate import layer_graph
from ..schedule import SCHEDULES, is_default, span_forms
from .constraints import Constraints, candidate_vps
from ..specs import (Parallelism, Scenario, check_plan, chunks_from_totals, cp_offered,
                     default_split, divisors, interleaves, kv_heads_refusal, spread,
                     model_axis_refusal, sinks_cp_refusal)

MAX_MBS = 16


@cached(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(divisors(n))


def _pick(fixed, values):
    if fixed is None:
        return values
    return [fixed] if fixed in values else []


@dataclass(frozen=True)
class Shape:
    """A configuration without its rank order, virtual stages and ZeRO stage."""

    tp: int
    sp: bool
    cp: int
    ep: int
    etp: int | None
    pp: int
    dp: int
    mbs: int

    @classmethod
    def of(cls, par: Parallelism) -> "Shape":
        """The shape of a plan."""
        return cls(par.tp, par.sp, par.cp, par.ep, par.etp, par.pp, par.dp, par.mbs)

    def parallelism(self, order=None, vp: int = 1, zero: int = 0) -> Parallelism:
        return Parallelism(tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep,
                           etp=self.etp, vp=vp, sp=self.sp, zero=zero, mbs=self.mbs,
                           **({"rank_order": order} if order is not None else {}))


def shapes(sc: Scenario, con: Constraints):
    """Yield every valid shape (degrees and micro-batch size) of the space."""
    m, tr, gpus = sc.model, sc.training, sc.gpus
    node = sc.cluster.devices_per_node
    biased = m.biased_experts
    pipelines = model_axis_refusal(m, sc.stack, "pp", 2) is None  # (the same for every pp > 1)
    tps = [t for t in _divisors(gpus) if t <= m.heads and m.heads % t == 0
           and kv_heads_refusal(m, sc.stack, t) is None and m.ffn_hidden % t == 0
           and (not con.tp_within_node or node % t == 0)]  # (t <= node alone let a 16 of
    # a 72-GPU node's groups straddle two nodes: a hardware trial's)
    for tp in _pick(con.tp, tps):
        sps = [False] if tp == 1 else ([True] if m.moe is not None else [False, True])
        # the search's floors on chunks and micro-batches hold a fixed value to check_plan
        cps = [c for c in _divisors(gpus // tp) if cp_offered(tr.seq_len, c, con.cp)
               and model_axis_refusal(m, sc.stack, "cp", c) is None
               and sinks_cp_refusal(m, sc.stack, tp, c) is None]
        for sp in _pick(con.sp, sps):
            for cp in _pick(con.cp, cps):
                if sp and tp > 1 and (tr.seq_len // cp) % tp:
                    continue
                rest = gpus // (tp * cp)
                if rest * tp * cp != gpus:
                    continue
                for pp in _pick(con.pp, [p for p in _divisors(rest) if p <= m.layers
                                         and (p == 1 or pipelines)]):
                    dp = rest // pp
                    if (con.dp is not None and con.dp != dp) or tr.global_batch % dp:
                        continue
                    per_replica = tr.global_batch // dp
                    mbss = [b for b in _divisors(per_replica) if b <= MAX_MBS or b == con.mbs]
                    # folded expert grid: etp·ep divides tp·cp·dp (checked per etp below)
                    eps = [1] if m.moe is None else [
                        e for e in _divisors(m.moe.experts) if (tp * cp * dp) % e == 0]
                    for ep in _pick(con.ep, eps):
                        etps = [None] if m.moe is None else [
                            e for e in sc.stack.expert_tps(tp, ep, biased=biased)
                            if sc.stack.dispatcher_refusal(e, ep, sc.cluster) is None]
                        for etp in ([con.etp] if con.etp is not None else etps):
                            for mbs in _pick(con.mbs, mbss):
                                shape = Shape(tp, sp, cp, ep, etp, pp, dp, mbs)
                                try:
                                    check_plan(sc, shape.parallelism(), stack=False)
                                except SpecError:
                                    continue
                                if sc.stack.missing_axis(shape) is None:
                                    yield shape


def zero_stages(sc: Scenario, con: Constraints, par: Parallelism) -> list[int]:
    """The ZeRO stages the stack runs with this pipeline depth (or the one fixed); where nothing
    is sharded (one data-parallel rank, and one expert-data-parallel rank) only the lowest: the
    others run the same step and keep as much or more (ZeRO-3 its gathered weights)."""
    stages = sc.stack.zeros_for(par)
    if con.zero is None and stages and par.dp * par.cp == 1 and (
            sc.model.moe is None or par.expert_dp == 1):
        stages = [min(stages)]
    return _pick(con.zero, stages)


def policy_sets(sc: Scenario, con: Constraints) -> list[tuple[int, ...]]:
    """Recompute policies (indices into the stack's ``recompute``) the stage DP may mix in one
    plan: every policy the stack offers at once when stages may differ, else one run per policy.
    A fixed constraint narrows them."""
    idx = tuple(i for i, p in enumerate(sc.stack.recompute)
                if con.recompute is None or p.name in con.recompute)
    if sc.stack.recompute_per_stage and (con.recompute is None or len(set(con.recompute)) > 1):
        return [idx] if idx else []
    return [(i,) for i in idx]


def chunk_counts(n, chunks: int):
    """Blocks in each chunk of a device holding ``n`` blocks (an integer array: one row per
    count): ``specs.spread`` for many counts at once (an interleaved model whose blocks differ
    holds a multiple of ``chunks``: the same in each)."""
    import numpy as np

    return n[:, None] // chunks + (np.arange(chunks)[None, :] >= chunks - (n[:, None] % chunks))


def split_units(model, vp: int) -> tuple[int, int]:
    """What the stage DP splits among the devices, as (units, least units per device).

    The plan space's split rule: each device holds a number of blocks spread over its ``vp``
    chunks as evenly as possible (``specs.spread``) — the units are blocks, at least
    one per chunk. Interleaved models whose blocks differ (some dense, some MoE) instead repeat
    one split of ``layers / vp`` blocks in every round of chunks, so that every chunk's blocks are
    known from its position.
    """
    if vp == 1 or model.homogeneous:
        return model.layers, vp
    return model.layers // vp, 1


def splits(model, pp: int, vp: int, schedule=None) -> bool:
    """Whether the split rule places ``model`` on ``pp`` devices of ``vp`` chunks each
    (``interleaves``), every device holding its least share of the units (``split_units``)."""
    units, least = split_units(model, vp)
    return interleaves(model, vp, schedule) and units >= pp * least


def chunk_sizes(model, pp: int, vp: int, per_device, schedule=None) -> tuple[int, ...]:
    """Blocks per chunk (model order) from the DP's units per device; ``schedule`` places the
    chunks (looped when not given; a V only for models whose blocks are all alike)."""
    if schedule is not None and schedule.v_shape:
        return schedule.model_order([spread(t, vp) for t in per_device], pp, vp)
    if vp == 1 or model.homogeneous:
        return chunks_from_totals(tuple(per_device), vp)
    return tuple(per_device) * vp


def device_units(model, par: Parallelism) -> list[int]:
    """The units per device of a plan that follows the split rule."""
    schedule = par.pipeline
    sizes = par.stage_layers or default_split(model, par.pp, par.vp, schedule)
    if par.vp == 1 or model.homogeneous:
        return [sum(held) for held in schedule.per_device(sizes, par.pp, par.vp)]
    return list(sizes[:par.pp])


def virtual_stages(sc: Scenario, con: Constraints, shape: Shape) -> list[int]:
    micro = sc.training.micro_batches(shape.mbs, shape.dp)
    model = sc.model
    vps = [1]
    if not sc.stack.interleaves or shape.pp == 1:
        return _pick(con.vp, vps)
    # a chunk count some searched schedule of the stack runs with these micro-batches (looped
    # interleaving in the rounds the stack runs, a V with enough of them:
    # ``StackSpec.schedule_refusal``) and the split rule places (``splits``)
    searched = [n for n in sc.stack.schedules if not SCHEDULES[n].mirrored]
    for v in candidate_vps(con):
        if any(sc.stack.schedule_refusal(n, shape.pp, v, micro) is None
               and splits(model, shape.pp, v, SCHEDULES[n]) for n in searched):
            vps.append(v)
    return _pick(con.vp, vps)


def schedules(sc: Scenario, con: Constraints, shape, vp: int) -> list[str | None]:
    """Pipeline schedules the stack runs for ``shape`` (a Shape or Parallelism: its pp, mbs and
    dp) with ``vp`` chunks per device (None: the default for ``vp``, Megatron's 1F1B or
    interleaved 1F1B); without pipelining one entry, or none when the user fixed a schedule (a
    plan with a schedule is a pipelined one)."""
    pp = shape.pp
    if pp == 1:
        return [None] if con.schedule is None else []
    micro = sc.training.micro_batches(shape.mbs, shape.dp)
    offered = sc.stack.schedules
    names = [n for n in offered
             if SCHEDULES[n].check(pp, vp) is None
             and sc.stack.micro_refusal(n, pp, micro) is None
             and (con.schedule is None or n == con.schedule)
             # the split rule places a V's chunks only for models whose blocks are all alike
             and splits(sc.model, pp, vp, SCHEDULES[n])
             # DualPipe is evaluated, not searched (README, "Pipeline schedules")
             and not SCHEDULES[n].mirrored
             # GPipe has 1F1B's span and holds more (m >= p - i micro-batches on every stage):
             # a plan under it is never better than the same plan under 1F1B, where the stack
             # runs 1F1B with these micro-batches
             and not (n == "gpipe" and con.schedule is None and "1f1b" in offered
                      and sc.stack.micro_refusal("1f1b", pp, micro) is None)]
    return [None if is_default(n, vp) else n for n in names]


def rank_orders(con: Constraints, shape: Shape) -> list[tuple[Axis, ...]]:
    """Orders of the axes with size > 1; tensor parallelism stays innermost (its per-layer
    collectives are the heaviest traffic: Megatron, Llama 3 and the NEST paper all keep it so)."""
    if con.rank_order is not None:
        return [con.rank_order]
    sizes = {Axis.TP: shape.tp, Axis.CP: shape.cp, Axis.DP: shape.dp, Axis.PP: shape.pp}
    big = [a for a in RANK_AXES if sizes[a] > 1 and a is not Axis.TP]
    small = [a for a in RANK_AXES if sizes[a] == 1 and a is not Axis.TP]
    return [(Axis.TP, *p, *small) for p in itertools.permutations(big)]


def configurations(sc: Scenario, con: Constraints):
    """Every configuration of the space, as a Parallelism without split or recompute."""
    for shape in shapes(sc, con):
        for order in rank_orders(con, shape):
            for vp in virtual_stages(sc, con, shape):
                for sched in schedules(sc, con, shape, vp):
                    for zero in zero_stages(sc, con, shape.parallelism()):
                        par = shape.parallelism(order, vp, zero).with_(schedule=sched)
                        try:
                            check_plan(sc, par)
                        except SpecError:
                            continue
                        yield par


def _factor(micro: int, pp: int, vp: int, split: bool = False) -> float:
    """How per-micro-batch work spread over p devices becomes a step at least, and what adding
    work to it adds at least: ``a/p + b`` under schedules that run whole backwards (``T >= a·max
    X + b·sum X`` for each form of ``schedule.span_forms``: ``(m - 1/v)/p + 1/v`` from ``p``
    micro-batches on; below, the least of the forms', as the average form takes the largest),
    ``m/p`` under those that defer weight gradients (every device runs its ``m·X_i`` inside the
    step)."""
    if split:
        return micro / pp
    return min(a / pp + b for a, b in span_forms(pp, vp, micro))


def _rules(sc: Scenario, par: Parallelism | None = None) -> set[str]:
    """The rules of the plan's schedule, or (no plan yet) of every schedule the stack runs."""
    if par is not None:
        return {par.pipeline.bubble} if par.pp > 1 else {"whole"}
    return {SCHEDULES[n].bubble for n in sc.stack.schedules} | {"whole"}


def _spread(work: float, wgrad: float, b_in: float, micro: int, pp: int, vp: int,
            rules: set[str], busiest: float = 0.0, end=(), eff: float = 0.0) -> float:
    """Least step time of per-micro-batch work ``work`` (of which ``wgrad`` weight gradients and
    at least ``b_in`` input-gradient backward) over ``pp`` devices, under the least favourable of
    ``rules``. With ``T >= a·max X + b·sum Y + max tail`` for each of the span's forms
    (``schedule.span_forms``: ``m - 1/v`` and ``1/v`` from ``p`` micro-batches on; the largest
    form's bound is taken) and ``max X`` at least both the
    average ``sum X / p`` and ``busiest`` (the work some device must hold: ``_busiest``): whole
    backwards have ``Y = X``; deferred weight gradients ``Y >= X - 2W``; ZB-V ``Y >= B``; and
    every device runs its ``m·X_i`` inside the step. ``end``: what the tail is at least, as
    forms ``(c, R)``: some device ``k`` ends its step with ``c`` plus a gradient reduction of
    ``R`` or more seconds, of which ``eff`` (``overlap_efficiency``) of its overlap with the
    device's last backward hides: ``R - eff·min(R, B_k)``, ``B_k <= X_k <= max X``. It joins
    the forms built on ``a·max X``, not ``m·X_i``, which already spends the busiest device's own
    tail (its deferred weight gradients run there) and need not exceed an average device's.
    Since ``a·max(most, x) - eff·min(R, x)`` is least at ``x = most`` when ``a >= eff``, the
    window is at most ``most`` there (else at most ``R``)."""
    most = max(work / pp, busiest)
    best = 0.0
    for a, b in span_forms(pp, vp, micro):
        window = most if a >= eff else math.inf
        tail = 0.0
        for c, r in end:  # a loop, not max() over a generator: the search calls this ~10^5 times
            shown = c + r - eff * (r if r < window else window)
            if shown > tail:
                tail = shown
        lead = a * most + tail
        out = []
        for r in rules:
            if r == "whole":
                out.append(lead + b * work)
            elif r == "deferred":
                out.append(max(micro * most, lead + b * (work - 2 * wgrad)))
            else:  # "input"
                out.append(max(micro * most, lead + b * b_in))
        best = max(best, min(out))
    return best


def _busiest(model, pp: int, per_block, ends: tuple[float, float] = (0.0, 0.0),
             least: int = 1, beside: bool | None = None) -> float:
    """Per-micro-batch work that the busiest of ``pp`` devices holds at least, whatever the
    split, chunks or V. Each block costs at least ``a``, the cheapest block kind's ``per_block``
    work (pass the kinds' works). Two forms, the larger holds:

    * pigeonhole: some device holds ``ceil(L / p)`` of the ``L`` blocks;
    * the ends: the devices holding the embedding and the head (``ends``: their works; one
      device when ``beside``, two when not, the lesser of both when None) also hold ``least``
      blocks or more. If every device's work is at most ``T``, a device with extra work ``e``
      holds at most ``floor((T - e)/a)`` blocks, and those caps must add up to ``L``; the least
      such ``T`` (``_least_top``) bounds the busiest device.
    """
    return max(_forms(model.layers, pp, min(per_block), ends, least, beside))


@cached(maxsize=65536)
def _forms(layers: int, pp: int, a: float, ends: tuple[float, float], least: int,
           beside: bool | None) -> tuple[float, float]:
    """``_busiest``'s two forms (pigeonhole, ends) for blocks of least work ``a``."""
    if pp == 1:
        return 0.0, 0.0
    emb, head = ends
    arrangements = {True: [(emb + head,)], False: [(emb, head)]}.get(
        beside, [(emb + head,), (emb, head)])
    return (-(-layers // pp) * a,
            min(_least_top(a, extra, pp, layers, least) for extra in arrangements))


def _least_top(a: float, extra: tuple[float, ...], pp: int, blocks: int, least: int) -> float:
    """The least ``T`` at which ``pp`` devices, those listed in ``extra`` with that much extra
    work, each holding ``least`` or more blocks of work ``a``, can hold ``blocks`` blocks with no
    device's work above ``T``. A device with extra ``e`` holds at most ``floor((T - e)/a)``
    blocks; ``T`` is at least ``lo``, the larger of the ends' least work and the average. At
    ``lo + a`` the caps add up to at least ``(pp·lo - sum e)/a >= blocks``, so the answer lies in
    ``[lo, lo + a]``, at ``lo`` or where some ``T - e`` is a multiple of ``a`` (where a cap
    grows). A slack of 1e-9 in the floors keeps rounding on the side of a smaller ``T``."""
    if a <= 0.0:
        return max(extra) + 0.0
    others = pp - len(extra)

    def fits(t: float) -> bool:
        caps = [max(0, math.floor((t - e) / a + 1e-9)) for e in extra]
        return sum(caps) + others * math.floor(t / a + 1e-9) >= blocks

    lo = max(a * least + max(extra), (a * blocks + sum(extra)) / pp)
    points = sorted(a * j + e for e in (0.0, *extra)
                    for j in range(max(0, math.floor((lo - e) / a)), math.ceil((lo - e) / a) + 2))
    for t in [lo, *(t for t in points if lo < t <= lo + a)]:
        if fits(t):
            return t
    return lo  # not reached: at lo + a the caps hold every block


def _splits(par: Parallelism) -> bool:
    """Whether the plan's schedule defers weight gradients."""
    return par.pp > 1 and par.pipeline.split_backward


@cached(maxsize=65536)
def _parts(layer: G.LayerGraph, acc, prec) -> tuple[float, float, float]:
    """Forward + backward compute of a layer, its weight-gradient part, and the rest of its
    backward (the cost model's own op times and weight-gradient share)."""
    from ..cost.compute import _wgrad_share

    total = wgrad = bwd = 0.0
    for o in layer.ops:
        b = op_time(o, acc, prec, True)
        total += op_time(o, acc, prec, False) + b
        bwd += b
        wgrad += _wgrad_share(o) * b
    return total, wgrad, bwd - wgrad


def compute_bound(sc: Scenario, shape: Shape, vp: int,
                  policies: tuple[int, ...] | None = None) -> float:
    """A step time no configuration of ``shape`` with ``vp`` or more virtual stages can beat:
    its compute alone, spread evenly over the devices by the least favourable schedule the
    stack runs (``_spread``). ``policies``: when every plan runs one of these recompute policies
    in all its blocks, the least of their recomputed forward compute joins the work."""
    tr, acc = sc.training, effective(sc.cluster, sc.stack).accelerator
    mg = layer_graph(sc.model, shape.parallelism(), tr, sc.stack)
    micro = tr.micro_batches(shape.mbs, shape.dp)
    out = []
    for p in policies if policies is not None else (None,):
        work = wgrad = b_in = 0.0
        blocks, ends = [], {}
        for n, layer in mg.counts(shape.pp == 1):
            t, w, b = _parts(layer, acc, tr.precision)
            if p is not None and layer.kind in G.BLOCK_KINDS:
                r = _recomputed(layer, acc, tr.precision, sc.stack.recompute[p])
                t, b = t + r, b + r
            work, wgrad, b_in = work + n * t, wgrad + n * w, b_in + n * b
            if layer.kind in G.BLOCK_KINDS:
                blocks.append(t)
            else:
                ends[layer.kind] = t
        ends[G.LayerKind.HEAD] = min(ends[G.LayerKind.HEAD],
                                     _parts(mg.head_shared, acc, tr.precision)[0])
        out.append(_spread(work, wgrad, b_in, micro, shape.pp, vp, _rules(sc),
                           _busiest(sc.model, shape.pp, blocks, _ends(ends))))
    return min(out) + sc.stack.step_overhead


@cached(maxsize=65536)
def _recomputed(layer: G.LayerGraph, acc, prec, policy) -> float:
    """Forward compute a block runs again in backward under ``policy`` (its operators' op
    times; the collectives it repeats left out: a lower bound of ``device.recompute_time``)."""
    from ..recompute import effect

    eff = effect(policy, layer)
    fwd = [op_time(o, acc, prec, False) for o in layer.ops]
    return eff.full * sum(fwd) + sum(s * t for s, t in zip(eff.shares, fwd))


@cached(maxsize=65536)
def _network_parts(sc: Scenario, par: Parallelism) -> tuple[
        float, float, float, tuple[float, ...], int, tuple[float, tuple[float, float]]]:
    """Per-micro-batch work with exposed intra-layer communication, its weight-gradient part
    and the rest of its backward, the send/recv time of each pipeline boundary, the
    micro-batch count and the busiest device's least work (independent of vp and ZeRO)."""
    from ..cost.compute import layer_cost
    from ..cost.network import p2p_time
    from ..placement import layouts

    tr, st = sc.training, sc.stack
    cluster = effective(sc.cluster, st)
    mg = layer_graph(sc.model, par, tr, st)
    lay = layouts(par.with_(vp=2 if par.pp > 1 else 1), cluster, sc.gpus)
    work = wgrad = b_in = 0.0
    blocks, ends = [], {}
    for n, layer in mg.counts(par.pp == 1):
        c = layer_cost(layer, cluster.accelerator, cluster, lay, tr, st)
        work, wgrad, b_in = (work + n * (c.fwd + c.bwd), wgrad + n * c.wgrad,
                             b_in + n * (c.bwd - c.wgrad))
        if layer.kind in G.BLOCK_KINDS:
            blocks.append(c.fwd + c.bwd)
        else:
            ends[layer.kind] = c.fwd + c.bwd
    shared = layer_cost(mg.head_shared, cluster.accelerator, cluster, lay, tr, st)
    ends[G.LayerKind.HEAD] = min(ends[G.LayerKind.HEAD], shared.fwd + shared.bwd)
    nbytes = G.E * par.mbs * (tr.seq_len // par.cp) * sc.model.hidden / (par.tp if par.sp else 1)
    boundary = [p2p_time(nbytes, bd.level, bd.share, cluster) for bd in lay.pp]
    if par.pp > 1:  # without interleaving no wrap-around send shares the links: the lesser of
        # the two bounds every vp (a hypothesis example: the interleaved layout's contention
        # had put the bound of a vp-1 plan above its step, and the search missed it)
        one = layouts(par.with_(vp=1), cluster, sc.gpus).pp
        boundary = [min(t, p2p_time(nbytes, bd.level, bd.share, cluster))
                    for t, bd in zip(boundary, one)] + boundary[len(one):]
    boundary = tuple(boundary)
    return (work, wgrad, b_in, boundary, tr.micro_batches(par.mbs, par.dp),
            (min(blocks), _ends(ends)))


def _ends(works: dict) -> tuple[float, float]:
    """(embedding, head) work from per-kind works (the head's the lesser with and without its
    own weight: it sits beside the embedding in a V)."""
    return works[G.LayerKind.EMBEDDING], works[G.LayerKind.HEAD]


def network_bound(sc: Scenario, par: Parallelism, vp: int | None = None) -> float:
    """Like ``compute_bound`` but with the exposed intra-layer communication of the rank order
    and the pipeline's fill and drain; ``vp`` overrides the plan's virtual stages (the bound of
    the most interleaved variant, over every schedule the stack runs, uses the least fill)."""
    parts = _network_parts(sc, _keys(par)[0])
    rules = _rules(sc) if vp is not None else _rules(sc, par)
    return _spans(sc, par, parts, vp or par.vp, rules, (0.0, 0.0), _fill(par, parts), (0.0,))[0]


def _fill(par: Parallelism, parts) -> float:
    """Send/recv on the pipeline's fill path, from ``_network_parts``' per-boundary times."""
    return sum(parts[3][h] for h in par.hops())


def _spans(sc: Scenario, par: Parallelism, parts, v: int, rules, rc, fill: float,
           busies, ends=None, top: float = 0.0) -> list[float]:
    """The span bound from ``_network_parts`` for each ``busy`` of ``busies``: what the busiest
    device carries at least beyond its blocks' work (its blocks' ZeRO traffic), or None for the
    average form alone (to which per-device traffic the busiest device need not carry can be
    added: ``_bounds``). ``rc``: when every block runs one recompute policy, its per-micro-batch
    recompute time over all blocks and of the cheapest block (backward work on the block's
    device). ``ends``: the end-of-step forms joining each (none when not given: ``_spread``).
    ``top``: what some device's per-micro-batch work is at least besides (the memory's
    ``driver._memory_top``); it joins the busiest device's forms."""
    work, wgrad, b_in, _, micro, (block, works) = parts
    total, cheapest = rc
    base = 2 * fill + sc.stack.step_overhead
    forms = None
    if par.pp > 1 and any(b is not None for b in busies):
        # ``v`` differs from the plan's vp only for the bound of every variant of a rank order
        # (``network_bound``'s override): then neither the least blocks nor the V are known
        known = v == par.vp
        forms = _forms(sc.model.layers, par.pp, block + cheapest, works, v if known else 1,
                       par.head_beside_embedding if known else None)
    out = []
    eff = sc.stack.overlap_efficiency
    for busy, end in zip(busies, ends or [()] * len(busies)):
        if busy is None:  # the average form
            most = 0.0
        elif forms is None:  # no pipeline: the one device holds every block
            most = top
        else:
            most = max(forms[0] + busy, forms[1], top)
        out.append(_spread(work + total, wgrad, b_in + total, micro, par.pp, v, rules, most, end,
                           eff) + base)
    return out


def config_bound(sc: Scenario, par: Parallelism) -> float:
    """``network_bound`` plus what the ZeRO stage costs at least: per-micro-batch ZeRO-2/3
    traffic and the end-of-step reduction and optimizer step of an average device. Overlap
    hides at most the stack's ``overlap_efficiency`` of any communication; collective times are
    subadditive in bytes and increasing, so the whole model's traffic and the average device
    bound the per-chunk and the largest device's. The whole model's per-micro-batch traffic
    joins the average form of the span; the busiest device's form gets the traffic of the
    blocks it holds at least (it need not hold the embedding's share); the larger is the bound."""
    return config_bounds(sc, par, (par.zero,))[0]


def config_bounds(sc: Scenario, par: Parallelism, zeros) -> list[float]:
    """``config_bound`` of ``par`` with each ZeRO stage of ``zeros`` (shared work done once)."""
    return _bounds(sc, par, zeros, ((0.0, 0.0),))[0]


def policy_bounds(sc: Scenario, par: Parallelism, rcs, tops=None) -> list[float]:
    """``config_bound`` of ``par`` with each recompute time ``rc`` of ``rcs`` (one per policy
    run in every block, as ``_spans`` takes it, or (0, 0)) and the matching entry of ``tops``:
    what the busiest device's per-micro-batch work is at least besides (``_spans``; none when
    not given). Shared work done once."""
    return [row[0] for row in _bounds(sc, par, (par.zero,), rcs, tops)]


def least_block_work(sc: Scenario, par: Parallelism) -> float:
    """Per-micro-batch forward + backward of the cheapest block, with its exposed intra-layer
    communication (what ``_busiest`` counts a block as)."""
    return _network_parts(sc, _keys(par)[0])[5][0]


def _bounds(sc: Scenario, par: Parallelism, zeros, rcs, tops=None) -> list[list[float]]:
    """``config_bound`` per recompute time of ``rcs`` (with the busiest device's least work of
    ``tops``) and ZeRO stage of ``zeros``."""
    net_key = _keys(par)[0]
    parts = _network_parts(sc, net_key)
    rules = _rules(sc, par)
    costs = _zero_costs(sc, net_key, par.head_beside_embedding)
    shown = 1.0 - sc.stack.overlap_efficiency
    # the ZeRO traffic is in X, not in W: its share of a split schedule's span is at least the
    # floor (m/p), which keeps the average form plus this a bound (that form is linear in work)
    factor = _factor(parts[4], par.pp, par.vp, _splits(par))
    fill = _fill(par, parts)
    out = []
    for rc, top in zip(rcs, tops or [0.0] * len(rcs)):
        # per ZeRO stage: the busiest device's form with its blocks' traffic, and the average
        # form with the whole model's (in both, the end joins only the ``(m - 1/v)·max X``
        # forms: ``_spread``)
        nets = _spans(sc, par, parts, par.vp, rules, rc, fill,
                      [shown * costs[z][1] for z in zeros], [costs[z][2] for z in zeros], top)
        averages = _spans(sc, par, parts, par.vp, rules, rc, fill, [None] * len(zeros),
                          [costs[z][2] for z in zeros])
        out.append([max(net, average + shown * costs[z][0] * factor)
                    for z, net, average in zip(zeros, nets, averages)])
    return out


@cached(maxsize=65536)
def _keys(par: Parallelism) -> tuple[Parallelism, Parallelism]:
    """The keys shared parts of a plan are looked up by, made once per plan: the plan without
    vp, ZeRO and schedule (``config_bounds``' network and ZeRO parts), and without ZeRO (the
    driver's memory floor)."""
    return par.with_(vp=1, zero=0, schedule=None), par.with_(zero=0)


@cached(maxsize=16384)
def _zero_costs(sc: Scenario, par: Parallelism, beside: bool) -> tuple[tuple, ...]:
    """Per ZeRO stage 0-3 of ``par`` (its own stage, vp and schedule ignored: pass the head's
    place, ``Parallelism.head_beside_embedding``, as ``beside``), seconds: the whole model's
    per-micro-batch ZeRO traffic on the links, the least of it the busiest device carries (the
    ``ceil(L/p)`` blocks it holds at least, each at least the lightest block's bytes) — both
    before overlap, which the caller applies — and what the most loaded device's exposed end of
    step is at least (gradient reduction, parameter gather, optimizer step; from the average
    bytes of each quantity, below), as ``_spread``'s end forms ``(c, R)``: ``c`` what shows
    whatever the overlap, ``R`` a gradient reduction the device's last backward may hide."""
    from ..cost import device as D
    from ..cost import memory as M
    from ..cost.network import coeff_time, collective_coeffs
    from ..placement import layouts

    tr, st = sc.training, sc.stack
    cluster = effective(sc.cluster, st)
    mg = layer_graph(sc.model, par, tr, st)
    lay = layouts(par, cluster, sc.gpus)
    # what shows of the optimizer's gather after the step: the share the next forward does not
    # hide, or all of it where the step waits for it (``device``)
    gather_shown = 1.0 - st.overlap_efficiency if D.hides_optimizer_gather(st) else 1.0
    layers = mg.counts(beside)
    params = sum(n * layer.params for n, layer in layers)
    eparams = sum(n * layer.expert_params for n, layer in layers)
    blocks = [layer for _, layer in layers if layer.kind in G.BLOCK_KINDS]
    most = -(-sc.model.layers // par.pp) if par.pp > 1 else 0
    least_p = most * min(layer.params for layer in blocks)
    least_e = most * min(layer.expert_params for layer in blocks)

    def gathers(z: int) -> tuple[float, float, float, float, bool]:
        """Bytes the ZeRO-``z`` all-gathers move (``memory.gather_bytes``: fp8 ones may
        depend on the stage): dense and experts', the least stage's, and one byte size for
        every kind."""
        each = [(n, layer, M.gather_bytes(layer, st, tr.precision, z)) for n, layer in layers]
        e_bytes = M.expert_gather_bytes(st, tr.precision, z)
        least = most * min(layer.params * M.gather_bytes(layer, st, tr.precision, z)
                           for layer in blocks)
        return (sum(n * layer.params * b for n, layer, b in each), eparams * e_bytes, least,
                least_e * e_bytes, len({b for _, _, b in each}) == 1)
    flat = st.flat_dp_collectives

    def dense(kind, nbytes):
        return coeff_time(collective_coeffs(kind, lay.dp, cluster, flat), nbytes)

    def experts(kind, nbytes):
        return coeff_time(collective_coeffs(kind, lay.edp, cluster, flat), nbytes)

    def dp(kind, p_bytes, e_bytes):
        return dense(kind, p_bytes) + experts(kind, e_bytes)

    avg_p, avg_e = params / par.pp, eparams / par.pp
    acc = cluster.accelerator
    per_byte = D.optimizer_traffic(st) / (acc.hbm_bandwidth * acc.memory_efficiency)
    # the end of step bounds the most loaded device's by the average device's bytes of each
    # quantity, but one device need not carry the most of every quantity (a device of dense
    # blocks holds no experts; the embedding's weights may gather at other bytes per weight):
    # the device with the most dense weights has at least the average dense reduction and
    # optimizer work, and the one with the most experts the expert part; the gathers join the
    # dense part only when every kind gathers at the same bytes per weight
    micro = tr.micro_batches(par.mbs, par.dp)
    out = []
    for z in range(4):
        gathered, egathered, least_g, least_eg, uniform = gathers(z)
        zero = busy = 0.0
        deferred = st.defers_grad_sync(par.pp, z)
        sharded = st.optimizer_sharded(par.pp, z)
        sync = D.grad_sync_kind(z, st)
        if z >= 2 and not deferred:
            zero += dp(sync, params * st.grad_bytes, eparams * st.grad_bytes)
            busy += dp(sync, least_p * st.grad_bytes, least_e * st.grad_bytes) if most else 0.0
        if z >= 3:  # the backward's gather and the forward's
            n = 1.0 + D.least_zero3_forward_gathers(st, par.pp, z, micro)
            zero += n * dp(G.CollKind.ALL_GATHER, gathered, egathered)
            busy += n * dp(G.CollKind.ALL_GATHER, least_g, least_eg) if most else 0.0
        d_end = avg_p / (lay.dp.size if sharded else 1) * per_byte
        e_end = avg_e / (lay.edp.size if sharded else 1) * per_byte
        g_end = d_sync = e_sync = 0.0
        if z < 2 or deferred:  # reduced after the last backward, which may hide some of it
            d_sync = dense(sync, avg_p * st.grad_bytes)
            e_sync = experts(sync, avg_e * st.grad_bytes)
            if not st.overlap_grad_reduce or deferred:  # nothing hides it (``device``)
                d_end, e_end, d_sync, e_sync = d_end + d_sync, e_end + e_sync, 0.0, 0.0
        if sharded and z < 3:  # the updated weights gathered after the step (``device``)
            g_end = gather_shown * dense(G.CollKind.ALL_GATHER, gathered / par.pp)
            e_end += gather_shown * experts(G.CollKind.ALL_GATHER, egathered / par.pp)
        d_end, g_end = (d_end + g_end, 0.0) if uniform else (d_end, g_end)
        out.append((zero, busy, ((d_end, d_sync), (g_end, 0.0), (e_end, e_sync))))
    return tuple(out)


def compositions(total: int, parts: int, least: int = 1):
    """Every way to write ``total`` as ``parts`` integers of at least ``least`` (brute force)."""
    spare = total - parts * (least - 1)
    for cuts in itertools.combinations(range(1, spare), parts - 1):
        edges = (0, *cuts, spare)
        yield tuple(b - a + least - 1 for a, b in zip(edges, edges[1:]))


def n_compositions(total: int, parts: int, least: int = 1) -> int:
    spare = total - parts * (least - 1)
    return math.comb(spare - 1, parts - 1) if parts <= spare else 0
