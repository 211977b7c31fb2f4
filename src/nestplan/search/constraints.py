"""What a user may fix of a search (``plan``'s flags, a sweep file's ``[constraints]``): the
knobs, their one parser, and the checks against a scenario that need no search. Kept apart from
the plan space so that a command refuses a bad flag before it loads the search."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

from ..axes import Axis, order_text
from ..errors import SpecError
from ..recompute import runs_text
from ..schedule import SCHEDULES, is_default
from ..specs import (Scenario, batch_refusal, cp_refusal, dense_etp, etp_refusal, interleaves,
                     kv_heads_refusal, moe_tp_without_sp, no_pipeline_schedule, schedule_refusal,
                     model_axis_refusal, sinks_cp_refusal, unfoldable)


METHODS = ("nest", "manual", "phaze", "alpa", "mist", "mcmc", "exhaustive")
"""The search methods a user may name (``methods.run_method`` runs them)."""
MAX_VP = 8
"""Most virtual stages (model chunks) per device the search considers unless ``--vp`` fixes more
(16 finds plans 0.02 % faster on the benchmarks' three searches, in 40-80 % more time)."""


def candidate_vps(con: "Constraints") -> range:
    """Chunk counts above one the search tries: up to ``MAX_VP``, or the one the user fixed,
    whatever its size (Megatron runs any count that leaves each chunk a block)."""
    if con.vp is not None:
        return range(con.vp, con.vp + 1) if con.vp > 1 else range(0)
    return range(2, MAX_VP + 1)


def refuse_unsearchable(con: "Constraints") -> None:
    """The searches (every method but ``manual``, which evaluates the plan its rules make)
    cannot run a mirrored schedule: refuse a constraint that fixes one (SpecError naming it)."""
    if con.schedule is not None and con.schedule in SCHEDULES and SCHEDULES[con.schedule].mirrored:
        raise SpecError("schedule", con.schedule, "the search does not run it (it costs what "
                        "dualpipev on half the ranks with twice the replicas costs, but for its "
                        "network); evaluate a plan with it, or plan with --method manual")


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """Knobs the user fixed (None = searched)."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    vp: int | None = None
    sp: bool | None = None
    zero: int | None = None
    recompute: tuple[str, ...] | None = None
    """Recompute policy names (the stack's), one or one per stage."""
    mbs: int | None = None
    rank_order: tuple[Axis, ...] | None = None
    schedule: str | None = None
    """Pipeline schedule by name (``schedule.SCHEDULES``)."""
    tp_within_node: bool = False
    extra: dict = field(default_factory=dict, compare=False)


KNOBS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "zero", "mbs")
"""The integer knobs a search may have fixed."""

SWITCHES = ("sp", "recompute", "rank_order", "schedule", "tp_within_node")
"""The other constraints both ``plan``'s flags and a sweep file's ``[constraints]`` take."""


def constraints_text(con: Constraints) -> str:
    """The knobs ``con`` fixes as ``plan``'s flags (``--tp 8 --sp --vp 11``), or "(none)"."""
    out = []
    for key in (*KNOBS, *SWITCHES):
        value = getattr(con, key)
        flag = "--" + key.replace("_", "-")
        if value is None or value is False and key == "tp_within_node":
            continue
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{key}")
        elif key == "recompute":
            out.append(f"{flag} {runs_text(value)}")
        elif key == "rank_order":
            out.append(f"{flag} {order_text(value)}")
        else:
            out.append(f"{flag} {value}")
    return " ".join(out) or "(none)"


def constraints_from(values: dict, name=lambda key: key) -> Constraints:
    """The one parser of fixed search knobs, from ``plan``'s flags or a sweep file's
    ``[constraints]``: ``values`` maps Constraints fields to what the user gave; a SpecError
    names the knob as ``name(field)`` (the flag, or the file's key)."""
    from ..axes import parse_order
    from ..recompute import parse_names

    kw: dict = {}
    for key, value in values.items():
        where = name(key)
        if key in KNOBS:
            if isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(where, value, "must be an integer")
            if key == "zero" and value not in (0, 1, 2, 3):
                raise SpecError(where, value, "allowed: 0, 1, 2, 3")
            if key != "zero" and value <= 0:
                raise SpecError(where, value, "must be an integer > 0")
            kw[key] = value
        elif key in ("sp", "tp_within_node"):
            if not isinstance(value, bool):
                raise SpecError(where, value, "must be true or false")
            kw[key] = value
        elif key == "recompute":
            kw[key] = parse_names(where, value)
        elif key in ("rank_order", "schedule"):
            if not isinstance(value, str):
                raise SpecError(where, value, "must be a string" + (
                    " like 'tp-cp-dp-pp'" if key == "rank_order" else ""))
            if key == "rank_order":
                try:
                    value = parse_order(value)
                except SpecError as e:
                    raise SpecError(where, e.value, e.allowed) from None
            kw[key] = value
        else:
            raise SpecError(where, value, "not a search constraint")
    return Constraints(**kw)


def check_constraints(sc: Scenario, con: Constraints) -> None:
    """Reject fixed knobs that no plan of this scenario can have (SpecError naming them)."""
    m, tr, gpus = sc.model, sc.training, sc.gpus
    fixed = SCHEDULES.get(con.schedule)  # None when not fixed (an unknown name is refused below)
    if fixed is not None and fixed.v_shape and not interleaves(m, 2, fixed):  # mixed blocks
        raise SpecError("schedule", con.schedule, "places model chunks in a V, which the search "
                        "runs only for models whose blocks are all alike (these differ: dense "
                        "and MoE)")
    if fixed is not None and fixed.chunks == "many" and con.vp is None and not any(
            interleaves(m, v, fixed) for v in candidate_vps(con)):
        larger = [v for v in range(MAX_VP + 1, m.layers // 2 + 1) if interleaves(m, v, fixed)]
        raise SpecError("schedule", con.schedule, f"runs 2 or more chunks per device, and the "
                        f"search splits a model whose blocks differ (dense and MoE) only into "
                        f"chunk counts that divide its {m.layers} layers: none up to {MAX_VP} ("
                        + (f"fix one of {', '.join(map(str, larger))} with --vp" if larger else
                           "evaluate takes any split with --stage-layers") + ")")
    rules = [
        ("tp", con.tp, lambda v: gpus % v == 0 and m.heads % v == 0 and v <= m.heads,
         f"must divide gpus = {gpus} and heads = {m.heads}"),
        ("pp", con.pp, lambda v: gpus % v == 0 and v <= m.layers,
         f"must divide gpus = {gpus} and be at most layers = {m.layers}"),
        ("dp", con.dp, lambda v: gpus % v == 0 and tr.global_batch % v == 0,
         f"must divide gpus = {gpus} and global_batch = {tr.global_batch}"),
        ("cp", con.cp, lambda v: gpus % v == 0, f"must divide gpus = {gpus}"),
        # (a length it does not divide, as evaluate says it: a trial read "gpus and seq_len"
        # as blaming the GPUs)
        ("cp", con.cp, lambda v: tr.seq_len % v == 0, f"must divide seq_len = {tr.seq_len}"),
        ("mbs", con.mbs, lambda v: tr.global_batch % v == 0,
         f"must divide global_batch = {tr.global_batch}"),
        # (pp·vp against the layers when both are fixed: below)
        ("vp", con.vp, lambda v: (v == 1 or 2 * v <= m.layers) and interleaves(m, v),
         (f"must be at most layers / 2 = {m.layers // 2} (two pipeline devices or more, each "
          "chunk a block or more)" if m.homogeneous else
          f"must be 1 or a divisor of layers = {m.layers} (its blocks differ: dense and MoE) "
          f"of at most {m.layers // 2}, for the search's split rule; evaluate takes any split "
          "with --stage-layers")),
        ("ep", con.ep, lambda v: v == 1 or (m.moe is not None and m.moe.experts % v == 0),
         f"must divide the {m.moe.experts} experts of {m.name}" if m.moe is not None
         else f"{m.name} has no experts; use ep = 1"),
    ]
    for name, value, ok, rule in rules:
        if value is not None and (value <= 0 or not ok(value)):
            raise SpecError(name, value, rule)
    if con.tp is not None and (rule := kv_heads_refusal(m, sc.stack, con.tp)) is not None:
        raise SpecError("tp", con.tp, rule)  # (as evaluate says it; the search found nothing)
    for axis in ("pp", "cp"):
        fixed = getattr(con, axis)
        if fixed is not None and (rule := model_axis_refusal(m, sc.stack, axis, fixed)):
            raise SpecError(axis, fixed, rule)
    if con.tp is not None and con.cp is not None and (
            rule := sinks_cp_refusal(m, sc.stack, con.tp, con.cp)):
        raise SpecError("cp", con.cp, rule)  # (as evaluate says it; the search found nothing)
    piped = [(k, v) for k, v in (("schedule", con.schedule), ("vp", con.vp))
             if v is not None and (k == "schedule" or v > 1)]  # (asking for a pipeline: a review's)
    if con.pp is None and piped and (rule := model_axis_refusal(m, sc.stack, "pp", 2)):
        raise SpecError(*piped[0], rule.replace("use pp = 1", f"leave out --{piped[0][0]}"))
    # knobs that are each possible but contradict each other or the hardware
    fixed = {k: getattr(con, k) for k in ("tp", "pp", "dp", "cp") if getattr(con, k) is not None}
    product = math.prod(fixed.values())
    if gpus % product or (len(fixed) == 4 and product != gpus):
        names = "·".join(fixed)
        values = "·".join(str(v) for v in fixed.values())
        last = list(fixed)[-1]
        raise SpecError(last, fixed[last], f"{names} = {values} = {product} must "
                        f"{'equal' if len(fixed) == 4 else 'divide'} gpus = {gpus}")
    node = sc.cluster.devices_per_node
    if con.tp_within_node and con.tp is not None and node % con.tp:
        raise SpecError("tp", con.tp, f"--tp-within-node keeps tensor parallelism inside a node "
                        f"of {node} devices: tp must divide {node}")
    if (con.vp or 1) > 1 and con.pp == 1:
        raise SpecError("vp", con.vp, "virtual stages interleave a pipeline: they need pp > 1")
    if con.vp is not None and con.pp is not None and con.vp * con.pp > m.layers:
        raise SpecError("vp", con.vp, f"pp·vp = {con.pp}·{con.vp} chunks need at least as many "
                        f"blocks; {m.name} has {m.layers}")
    if con.vp == 1 and (con.pp or 1) > 1 and (con.ep or 1) > 1 \
            and sc.stack.interleaving_required(con.ep, con.pp):
        raise SpecError("vp", 1, f"stack {sc.stack.name} overlaps the expert exchange with another "
                        "micro-batch, which Megatron-Core does with pipelining only under an "
                        "interleaved schedule", "use vp > 1")
    if m.moe is None and con.etp is not None and con.etp != con.tp:
        raise dense_etp(m, con.etp)
    if con.sp and con.tp == 1:
        raise SpecError("sp", True, "sequence parallelism needs tp > 1")
    # what the stack does not run at all (the search would find nothing and say less)
    degrees = SimpleNamespace(tp=con.tp or 1, cp=con.cp or 1, ep=con.ep or 1, pp=con.pp or 1,
                              sp=bool(con.sp))
    missing = sc.stack.missing_axis(degrees)
    if missing is not None:
        raise SpecError(*missing)
    if m.moe is not None and (con.tp or 1) > 1 and "sp" not in sc.stack.axes:
        raise moe_tp_without_sp(sc.stack.name, con.tp)
    if con.sp is False and m.moe is not None and (con.tp or 1) > 1:
        raise SpecError("sp", False, "MoE layers with tp > 1 need sequence parallelism")
    if m.moe is not None and (con.etp is not None or con.ep is not None):
        # the ranks the expert grid folds over: tp·cp·dp, known when they are all fixed, gpus /
        # pp when the pipeline is, and at most gpus (ep 1 where it is not fixed, etp 1 at least:
        # a fixed ep alone that no fold holds had searched nothing and listed every rule: a
        # torchtitan MoE user's trial)
        ep, etp = con.ep or 1, con.etp or 1
        room, how = gpus, None
        if con.tp is not None and con.cp is not None and con.dp is not None:
            room, how = con.tp * con.cp * con.dp, ""
        elif con.pp is not None:
            room, how = gpus // con.pp, f" (gpus / pp = {gpus}/{con.pp})"
        if room % (etp * ep):
            if con.etp is not None:
                raise unfoldable(etp, ep, room, how or "", gpus=how is None)
            ranks = (f"tp·cp·dp, a divisor of gpus = {room}" if how is None
                     else f"tp·cp·dp = {room}{how}")  # (no expert TP folds it: ep alone)
            raise SpecError("ep", ep, f"must divide {ranks}, the ranks the expert grid folds "
                            "over")
        if con.etp is not None and (why := etp_refusal(m.moe, con.etp)) is not None:
            raise why
    sc.cluster.accelerator.peak_flops(tr.precision)  # an accelerator without fp8 says so
    if con.recompute is not None and len(con.recompute) > 1:
        if con.pp is None or con.pp != len(con.recompute):
            n = len(con.recompute)
            raise SpecError("recompute", runs_text(con.recompute), (
                f"{n} policies, one per pipeline stage, need --pp {n}" if con.pp is None else
                f"{n} policies for --pp {con.pp}: give one, or one per stage"))
    for name in con.recompute or ():
        sc.stack.policy(name)  # names the stack's policies when it is not one of them
    if con.schedule is not None:
        if con.schedule not in SCHEDULES:
            raise SpecError("schedule", con.schedule, "allowed: " + ", ".join(SCHEDULES))
        if con.schedule not in sc.stack.schedules:
            raise SpecError("schedule", con.schedule,
                            f"stack {sc.stack.name} runs " + ", ".join(sc.stack.schedules))
        if con.pp == 1:
            raise no_pipeline_schedule(con.schedule, "--pp")
        if con.vp is not None and (why := SCHEDULES[con.schedule].check(con.pp or 2,
                                                                        con.vp)) is not None:
            raise SpecError(*why)
    if con.zero is not None and con.zero not in sc.stack.zero_stages:
        raise SpecError("zero", con.zero, f"stack {sc.stack.name} runs ZeRO stages "
                        + ", ".join(map(str, sc.stack.zero_stages)))
    if con.zero is not None and (con.pp or 1) > 1 and con.zero > sc.stack.max_zero_with_pp:
        raise SpecError("zero", con.zero, f"stack {sc.stack.name} runs at most "
                        f"ZeRO-{sc.stack.max_zero_with_pp} with pipeline parallelism")
    if (con.vp or 1) > 1 and not sc.stack.interleaves:
        raise SpecError("vp", con.vp, f"stack {sc.stack.name} has no interleaved pipeline "
                        "schedule", "use vp = 1")
    if m.moe is not None and con.etp is not None:
        if con.ep is not None and (con.ep > 1 or con.tp is not None):  # (with EP, needs no tp)
            why = sc.stack.expert_tp_refusal(con.tp or 1, con.ep, con.etp,
                                           biased=m.biased_experts)
        else:  # the bias rule alone, whatever tp and ep turn out to be
            why = sc.stack.bias_refusal(con.etp, biased=m.biased_experts)
        if why is not None:
            raise SpecError(*why)
    if m.moe is not None and con.ep == 1 and (etp := con.etp or con.tp) is not None \
            and (why := sc.stack.dispatcher_refusal(etp, 1, sc.cluster)) is not None:
        raise SpecError(*why)
    if m.moe is not None and con.etp is None and con.tp is not None and con.ep is not None \
            and not sc.stack.expert_tps(con.tp, con.ep, biased=m.biased_experts):
        # no degree left for these experts: without expert parallelism they follow TP, and the
        # stack runs experts with biases at expert TP 1 only
        raise SpecError("tp", con.tp, f"stack {sc.stack.name} runs experts that carry biases at "
                        "expert TP 1 only, and without expert parallelism its experts follow tp",
                        "use tp = 1 or ep > 1")
    if None not in (con.zero, con.ep, con.tp, con.cp):
        why = sc.stack.replicas_refusal(SimpleNamespace(zero=con.zero, ep=con.ep, tp=con.tp,
                                                        cp=con.cp))
        if why is not None:
            raise SpecError(*why)
    if con.recompute is not None and len(set(con.recompute)) > 1 \
            and not sc.stack.recompute_per_stage:
        raise SpecError("recompute", runs_text(con.recompute),
                        f"stack {sc.stack.name} applies one policy to every stage")
    # knobs each possible alone whose sequence or batch does not divide, as evaluate says it of
    # one plan (last: a knob the stack or the model refuses outright is the first thing to fix)
    if con.cp is not None and (why := cp_refusal(tr.seq_len, con.cp)) is not None:
        raise why
    dp, how = con.dp, ""
    if dp is None and len(fixed) == 3 and "dp" not in fixed:
        dp = gpus // product
        how = f" (dp = gpus / (tp·pp·cp) = {gpus}/{product})"
    if dp is not None and (why := batch_refusal(tr.global_batch, con.mbs, dp, how)) is not None:
        raise why
    sched = SCHEDULES.get(con.schedule)
    vp = con.vp or (sched.implied_vp if sched is not None else None)
    if None not in (dp, con.mbs, con.pp, vp) and con.pp > 1 \
            and con.schedule in (None, *sc.stack.schedules):
        # every schedule the stack could give these degrees refuses their micro-batches
        names = [con.schedule] if con.schedule else [
            n for n in sc.stack.schedules if SCHEDULES[n].check(con.pp, vp) is None]
        names.sort(key=lambda n: not is_default(n, vp))  # the default's reason first
        why = [schedule_refusal(sc, n, con.pp, vp, con.mbs, dp) for n in names]
        if why and all(why):
            raise why[0]
