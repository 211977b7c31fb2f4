"""Human-readable text for results (the one place that formats numbers for people)."""

from __future__ import annotations

import math
from dataclasses import fields

from .axes import order_text
from .result import Evaluation
from .specs import plan_knobs, split_text
from .units import MS, GiB, fmt_gib_against, fmt_time

LISTED = 3
"""Items a note names of those it is about, before saying how many more (``first_of``)."""


CP_EXCHANGE_TEXT = {
    "ring": "a ring: each rank passes its K/V block on while the attention computes on it",
    "allgather": "an all-gather hidden behind the first block's attention, again in the backward",
    "flex_allgather": "an all-gather of the whole K/V before the attention (kept for its "
                      "backward), dK/dV reduce-scattered after it",
    "te_allgather": "Transformer Engine's all-gather (no ring over sliding windows or sinks)"}
"""How each ``StackSpec.cp_exchange_for`` value moves K/V, for the text output."""


MOE_OVERLAP_TEXT = {"none": "not overlapped",
                    "shared": "overlapped with the shared experts",
                    "batch": "overlapped with another micro-batch's compute"}
"""How each ``StackSpec.moe_overlap`` value hides the expert exchange, for the text output."""
CUDA_GRAPHS_TEXT = {"none": "no CUDA graphs", "full_iteration": "one CUDA graph for the whole step",
                    "layers": "CUDA graphs of {}"}
"""What each ``StackSpec.cuda_graphs`` value replays ({}: the graphed modules), for the text."""


def moe_behaviour_text(ev: Evaluation) -> str:
    """How the stack runs the experts, which an MoE plan's time turns on: its dispatcher, what
    hides the exchange, CUDA graphs and the host wait per MoE layer (a MoE trial: plan and
    evaluate had named the stack only, and its catalog nemo runs none of NeMo's MoE recipes'
    dispatchers, overlaps or graphs)."""
    sc, st = ev.scenario, ev.scenario.stack
    graphs = CUDA_GRAPHS_TEXT[st.cuda_graphs].format(
        ", ".join(st.cuda_graph_modules) if st.cuda_graph_modules else "whole layers")
    wait = st.moe_host_wait(sc.training, ev.plan.ep)
    return (f"experts: dispatcher {st.moe_dispatcher}, their exchange "
            f"{MOE_OVERLAP_TEXT[st.moe_overlap]}, {graphs}, "
            + (f"host wait {wait / MS:.1f} ms per MoE layer" if wait else "no host wait")
            + f" (stack {st.name}; README \"Training stacks\" for the others)")


def group_crossings(ev: Evaluation) -> list[tuple[str, int, str]]:
    """Each parallel group of more than one device: its name, size and the highest network level
    it crosses (``Evaluation.group_levels``; the dense gradients' group named dp·cp where CP
    shares it: a user trial read "dp (128)" of dp 16)."""
    named = {"dp": "dp·cp"} if ev.plan.cp > 1 else {}
    return [(named.get(axis, axis), n, level or "none")
            for axis, (n, level) in ev.group_levels.items()]


def first_of(items: list[str]) -> str:
    """The first ``LISTED`` of ``items`` and how many more, for a note: "a, b, c and 4 more"."""
    rest = len(items) - LISTED
    return ", ".join(items[:LISTED]) + (f" and {rest} more" if rest > 0 else "")


def seconds(x: float) -> str:
    """A measured or predicted time in seconds: four decimals, and at least three significant
    digits below 10 ms (a layer's 40 µs had shown as 0.0000)."""
    if x >= 0.01 or x <= 0:
        return f"{x:.4f}"
    return f"{x:.{2 - math.floor(math.log10(x))}f}"


def plan_line(ev: Evaluation) -> str:
    return " ".join(plan_knobs(ev.scenario.model, ev.plan))


def block_range(a: int, b: int) -> str:
    """Blocks [a, b) as people write them: ``3-7``, ``5`` for one, ``none`` for none."""
    return "none" if b <= a else str(a) if b == a + 1 else f"{a}-{b - 1}"


def plan_short(p, moe: bool = False) -> str:
    """A plan in a table cell (``t8 p16 d64 e8 v2 sp z1 full b1``): the degrees above 1 beyond
    tp, pp and dp, for an MoE model its expert degree (``e``) and an expert-tensor degree other
    than tp (``et``), ZeRO stage, recomputation, micro-batch. The long form is ``plan_line``."""
    extra = [f"{name}{v}" for name, v, show in (
        ("c", p.cp, p.cp > 1), ("e", p.ep, moe and p.ep > 1),
        ("et", p.expert_tp, moe and p.expert_tp != p.tp), ("v", p.vp, p.vp > 1)) if show]
    return " ".join([f"t{p.tp}", f"p{p.pp}", f"d{p.dp}", *extra, *(["sp"] if p.sp else []),
                     f"z{p.zero}", p.recompute_text, f"b{p.mbs}"])


def mtp_text(depths: int) -> str:
    """``2 MTP depths``: multi-token-prediction depths as every output names them."""
    return f"{depths} MTP depth{'s' if depths > 1 else ''}"


def workload_parts(sc) -> list[str]:
    """What a scenario trains beyond its sizes, as the flags set it, in words: attention within
    packed documents, the MoE load imbalance and capacity factor where given, and the
    multi-token-prediction depths."""
    tr, parts = sc.training, []
    if tr.document_span:
        parts.append(f"attention within documents of {tr.document_span:,} tokens")
    if sc.model.moe is not None and tr.moe_imbalance != 1.0:
        parts.append(f"MoE imbalance {tr.moe_imbalance:g}")
    if sc.model.moe is not None and tr.moe_capacity is not None:
        parts.append(f"capacity factor {tr.moe_capacity:g}")
    if sc.model.mtp_layers:
        parts.append(mtp_text(sc.model.mtp_layers))
    return parts


def _rounds(ev: Evaluation) -> str:
    """The interleaved rounds where they are not of pp micro-batches (``schedule.rounds_text``)."""
    from .schedule import rounds_text

    par = ev.plan
    if par.pipeline.rounds_of(par.pp, par.vp, ev.micro_batches) is None:
        return ""
    text = rounds_text(par.pp, ev.micro_batches)
    return f", {text}" if text else ""


SIMULATED_GAP = 0.02
"""How much longer than the closed form (a share of it) the simulated schedule of an interleaved
plan whose chunks differ in size may run before evaluate, plan and the exports say so."""


def simulated_schedule_text(ev: Evaluation) -> str | None:
    """What to say when an interleaved plan's chunks hold different numbers of blocks (by one:
    the search's splits and ``--vp`` that does not divide a device's blocks) and, simulated with
    each chunk's own time, its schedule ends more than ``SIMULATED_GAP`` later than the closed
    form, which spreads each device's blocks evenly over its chunks (``Evaluation.uneven_chunks``,
    which the step includes; the report draws the schedule; a user trial: Llama 3 70B at vp 8,
    chunks of 1 and 2 blocks, 3.524 s spread evenly, 3.713 s simulated; at vp 5 and 10 the two
    agree); else None."""
    from .specs import blocks_per_chunk

    even = ev.step_time - ev.uneven_chunks
    if ev.uneven_chunks <= even * SIMULATED_GAP:
        return None
    par = ev.plan
    per = par.pipeline.per_device(blocks_per_chunk(ev.scenario.model, par), par.pp, par.vp)
    sizes = sorted({n for chunks in per for n in chunks})
    return (f"the model chunks hold {' or '.join(map(str, sizes))} blocks: simulated with each "
            f"chunk's own time, the schedule ends {fmt_time(ev.uneven_chunks)} later than with "
            f"each device's blocks spread evenly over its chunks as costed, which the step of "
            f"{fmt_time(ev.step_time)} includes ({ev.step_time / even - 1:+.1%} on "
            f"{fmt_time(even)}; the report draws the schedule); a vp that divides each device's "
            "blocks runs without that")


def partial_domain_text(cluster, gpus: int) -> str | None:
    """What to say when the cluster's scale-up domains (its innermost level: NVLink nodes or
    racks) do not divide a job of ``gpus``: ranks fill devices in order, so groups straddle
    domains, as a launcher that leaves some devices of each domain idle would not have them, and
    the last domain's few devices carry a whole domain's share of the traffic between domains (a
    user trial's sweep of 72-GPU racks ran 1,024 GPUs slower per GPU than 2,048, and the sweep
    did not say why); None where they divide it, or it fits in one."""
    if not cluster.straddled_by(gpus):
        return None
    level = cluster.levels[0]
    return (f"the cluster's {level.name} domains hold {level.size} devices, which do not divide "
            f"the {gpus:,} of the job ({gpus // level.size:,} whole and {gpus % level.size} of "
            "another): ranks fill devices in order, so groups straddle domains and the last "
            "one's devices carry a whole domain's share of the traffic between them; to use "
            f"fewer devices of each (NeMo's launcher takes 64 of an NVL72's 72), give "
            f"{level.name}'s size as the devices used per domain in a cluster file")


def headroom_verdict(ev) -> str:
    """Whether a plan that fits (an Evaluation) leaves the memory headroom: what ``plan``
    recommends, in the words every output uses."""
    return ("leaves the headroom" if ev.within_headroom
            else "less than the headroom: not recommended")


def memory_verdict(ev) -> str:
    """Whether a plan (an Evaluation) fits, and if so whether it leaves the headroom, as notes
    and exports say it (an export's "fits" had hidden a plan evaluate calls not recommended: a
    user trial's)."""
    return f"fits, {headroom_verdict(ev)}" if ev.fits else "does NOT fit"


def _policies_text(ev: Evaluation) -> list[str]:
    """The line naming what the plan's partial recompute policies recompute on its stack (a name
    means what its stack says: a MoE trial read "selective" alike on stacks that recompute
    core_attn, mla_up_proj or layernorm and moe_act by it); none where every policy is none or
    full."""
    from .evaluate import layer_graph

    sc = ev.scenario
    st = sc.stack
    partial = [n for n in dict.fromkeys(ev.plan.recompute)
               if st.policy(n).kind not in ("none", "full")]
    if not partial:
        return []
    present = layer_graph(sc.model, ev.plan, sc.training, st).modules

    def rule(name: str) -> str:
        """The policy's rule, its modules the model's graph lacks on this stack said apart (a
        hardware trial read "mla_up_proj" of Qwen3's plan, which has no MLA, as a mistake; a
        norm the stack fuses into the next linear layer is not one either: a review's)."""
        policy = st.policy(name)
        text, mods = str(policy.rule), policy.modules
        if not mods:
            return text
        absent = [m for m in mods if m not in present]
        kept = [m for m in mods if m in present]
        if not absent or not kept:
            return text
        return (f"modules:{','.join(kept)} ({', '.join(absent)}: not an operator of "
                f"{sc.model.name} on stack {st.name})")

    return ["recompute        " + "; ".join(f"{n} = {rule(n)}" for n in partial)
            + f" (stack {st.name}'s policies)"]


def evaluation(ev: Evaluation) -> str:
    """The default output of ``nestplan evaluate``."""
    # (not at import: cli checks flags first)
    from .evaluate import logged_flops_said

    sc = ev.scenario
    tr = sc.training
    peak, capacity = fmt_gib_against(ev.peak_memory, ev.capacity)
    logged = logged_flops_said(ev, sc.stack.export_format)
    out = [
        f"{sc.model.name} on {sc.gpus} x {sc.cluster.accelerator.name} ({sc.cluster.name}), "
        f"seq {tr.seq_len}, global batch {tr.global_batch}, {tr.precision.value}, "
        f"stack {ev.scenario.stack.name}{''.join(f', {p}' for p in workload_parts(sc))}",
        f"plan: {plan_line(ev)}  ({ev.micro_batches} micro-batch"
        f"{'es' if ev.micro_batches != 1 else ''} per replica{_rounds(ev)})",
        *_policies_text(ev),
        "",
        f"step time        {fmt_time(ev.step_time)}",
        f"tokens/s         {ev.tokens_per_s:,.0f}  ({ev.tokens_per_s_per_gpu:,.0f} per GPU)",
        f"model TFLOP/s    {ev.model_tflops_per_gpu:.1f} per GPU" + (
            f" ({logged.tflops_per_gpu:.1f} as {logged.log.name} counts them: "
            f"{logged.differences})"
            if logged else ""),
        f"MFU              {ev.mfu * 100:.1f}% of {tr.precision.value} peak (HFU "
        f"{ev.hfu * 100:.1f}%: model FLOP count attention unmasked, hardware FLOP as run)",
        f"peak memory      {peak} GiB of {capacity} GiB (stage {ev.worst_stage.index})  "
        f"{'fits' if ev.fits else 'DOES NOT FIT'}",
    ]
    if not ev.fits:
        out.append(f"  why: {ev.why_not}")
    else:
        out.append(f"memory margin    {ev.margin / GiB:.1f} GiB free; headroom "
                   f"{ev.headroom / GiB:.1f} GiB ({ev.scenario.memory_headroom:.0%} of HBM): "
                   f"{headroom_verdict(ev)}")
    from . import accuracy  # (its table, read when a plan is shown, not when this loads)

    measured = accuracy.text(sc)
    if measured:
        out.append(f"measured error   {measured}")
    where = ""
    if ev.plan.pp > 1:  # (which stage each part is of: a datacenter trial's dp time moved as the
        # stage changed between network designs, unnamed)
        k, j = ev.slowest_stage, ev.last_stage
        where = (f"; stage {k}'s, the slowest per micro-batch and the last to end" if j == k else
                 f"; stage {k}'s, the slowest per micro-batch, but dp, embedding and optimizer: "
                 f"stage {j}'s, whose step ends last")
    out += ["", f"time per step (exposed{where}):"]
    total = ev.step_time
    for f in fields(ev.time):
        v = getattr(ev.time, f.name)
        if abs(v) > 1e-9:
            out.append(f"  {f.name:10s} {fmt_time(v):>12s}  {v / total * 100:5.1f}%")
        if f.name == "compute" and ev.eager_kernels > 1e-9:
            from .graph import eager_split

            st = ev.scenario.stack
            ran = eager_split(ev.scenario.model, st.eager_ops, st.eager_code)[0]
            out.append(f"    of which eager kernels {fmt_time(ev.eager_kernels)} "
                       f"({', '.join(ran)})")
    link = {k: v for k, v in ev.link_time.items() if v > 1e-9}
    if link:
        out.append("communication on the links (hidden or not): "
                   + ", ".join(f"{k} {fmt_time(v)}" for k, v in link.items())
                   + ("; pp over its busiest boundary (the exposed pp above also waits on the "
                      "fill's and drain's sends over the others)" if "pp" in link else ""))
    if ev.plan.cp > 1:  # (named nowhere in the output before: a long-context trial's)
        sc = ev.scenario
        out.append(f"context parallelism exchanges K/V as "
                   f"{CP_EXCHANGE_TEXT[sc.stack.cp_exchange_for(sc.model)]} "
                   f"(stack {sc.stack.name})")
    if ev.scenario.model.moe is not None:
        out.append(moe_behaviour_text(ev))
    crossings = group_crossings(ev)
    if crossings:
        out.append("highest network level each group crosses: " + ", ".join(
            f"{axis} ({n:,}) {level}" for axis, n, level in crossings))
    worst = ev.worst_stage.memory
    out += ["", f"memory on the most loaded device (stage {ev.worst_stage.index}):"]
    for f in fields(worst):
        out.append(f"  {f.name:12s} {getattr(worst, f.name) / GiB:8.2f} GiB")
    out.append(f"  {'total':12s} {worst.total / GiB:8.2f} GiB")
    if len(ev.stages) > 1:
        out += ["", "stages:"]
        mtp = ev.scenario.model.mtp_layers
        for s in ev.stages:
            blocks = ", ".join(block_range(a, b) for a, b in s.blocks)
            extra = (" +embedding" if s.has_embedding else "") + (" +head" if s.has_head else "") \
                + (f" +{mtp_text(mtp)}" if s.has_head and mtp else "")
            out.append(f"  {s.index:3d}  blocks {blocks}{extra}  {fmt_time(s.time_per_microbatch)}"
                       f"/micro-batch  {s.memory.total / GiB:6.1f} GiB  recompute {s.recompute}")
    return "\n".join(out)


def id_ranges(ids, limit: int = 60) -> str:
    """Device ids as ranges, e.g. ``0-7,64-71``; cut at ``limit`` characters."""
    parts, start, prev = [], None, None
    for d in sorted(ids):
        if start is None:
            start = prev = d
        elif d == prev + 1:
            prev = d
        else:
            parts.append(block_range(start, prev + 1))
            start = prev = d
    if start is not None:
        parts.append(block_range(start, prev + 1))
    text = ",".join(parts)
    return text if len(text) <= limit else text[:limit].rsplit(",", 1)[0] + f",… ({len(ids)})"


TOP_COLUMNS = ("#", "step (s)", "tokens/s", "MFU", "mem GiB", "tp", "pp", "dp", "cp", "ep",
               "etp", "vp", "sp", "zero", "mbs", "recompute", "order", "schedule", "stage-layers")
"""The columns of ``plan``'s list of plans, everything evaluate needs to reproduce each (etp "-"
for a dense model, sp "-" at tp 1, stage-layers "-" for the even split); the last four are text
(left-aligned)."""


CLOSE_PLANS = 0.03
"""Plans whose steps are within this share of the best are named as too close to call: the
published runs' mean error is 3.8 % (README "Accuracy")."""
ORDER_TIE = 1e-4
"""Plans alike but for their rank order whose steps differ by at most this share are one row."""


def _order_twins(plans) -> list[list[int]]:
    """The indices of ``plans`` grouped where plans next to each other differ in their rank order
    alone and are predicted as fast, within ``ORDER_TIE`` of the group's first (a long-context
    trial's top five were one plan in five orders: placements that cost alike to a few parts in a
    million, which hid the next plans)."""
    groups: list[list[int]] = []
    for i, ev in enumerate(plans):
        if groups:
            first = plans[groups[-1][0]]
            if (first.plan.with_(rank_order=ev.plan.rank_order) == ev.plan
                    and abs(first.step_time - ev.step_time) <= ORDER_TIE * ev.step_time):
                groups[-1].append(i)
                continue
        groups.append([i])
    return groups


def _top_rows(plans, groups) -> list[list[str]]:
    """``plan``'s list: a row per group of ``_order_twins``, its ranks and orders all named."""
    order = TOP_COLUMNS.index("order")
    rows = []
    for g in groups:
        cells = _cells(g[0] + 1, plans[g[0]])
        if len(g) > 1:
            cells[0] = f"{g[0] + 1}-{g[-1] + 1}"
            cells[order] = " ".join(order_text(plans[i].plan.rank_order) for i in g)
        rows.append(cells)
    return rows


def _cells(rank, ev) -> list[str]:
    p = ev.plan
    return [str(rank), f"{ev.step_time:.3f}", f"{ev.tokens_per_s:,.0f}", f"{ev.mfu * 100:.1f}%",
            f"{ev.peak_memory / GiB:.1f}", str(p.tp), str(p.pp), str(p.dp), str(p.cp),
            str(p.ep), str(p.expert_tp) if ev.scenario.model.moe is not None else "-",
            # (sp "-" only where it means nothing, tp 1: an academic read "-" at tp 4 as that)
            str(p.vp), "on" if p.sp else "off" if p.tp > 1 else "-", str(p.zero), str(p.mbs),
            p.recompute_text, order_text(p.rank_order),
            p.pipeline.name if p.pp > 1 else "-", split_text(ev.scenario.model, p) or "-"]


def aligned(header: tuple[str, ...], rows: list[list[str]], right: range | set) -> list[str]:
    """Header and rows with every column as wide as its widest cell: the columns ``right``
    names (numbers) right-aligned, the others left-aligned."""
    widths = [max(len(r[i]) for r in [list(header), *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(header)] + [line(r) for r in rows]


def search_result(res, top: int | None = None) -> str:
    """The default output of ``nestplan plan`` (``top``: the plans it asked for, which a search
    that found fewer did not fill)."""
    best = res.best
    sc = best.scenario
    # (exhaustive tries every split by brute force: a NEST-paper trial read "the stage dynamic
    # program" of it)
    how = ("every split tried by brute force for" if res.method == "exhaustive"
           else "the stage dynamic program solved")
    out = [f"{res.method}: {len(res.plans)} best plan(s) for {sc.model.name} on {sc.gpus} x "
           f"{sc.cluster.accelerator.name} ({sc.cluster.name}); {how} {res.solved:,} of "
           f"{res.configurations:,} configurations in {res.seconds:.1f} s", ""]
    groups = _order_twins(res.plans)
    rows = _top_rows(res.plans, groups)
    out += aligned(TOP_COLUMNS, rows, right=range(TOP_COLUMNS.index("recompute")))
    if len(groups) < len(res.plans):
        out.append(f"(a row of several orders: plans alike but for their rank order, within "
                   f"{ORDER_TIE:.2%} of the first's step, which the row shows; a larger --top "
                   "lists more plans)")
    # every listed plan, a row's other orders too, with how many share the best's row (a new
    # user's trial: "2 other listed plans" had counted the rows of four)
    close = [i for i in range(1, len(res.plans))
             if res.plans[i].step_time <= (1 + CLOSE_PLANS) * best.step_time]
    if close:  # (a MoE trial chose between plans 3 % apart, which the output did not put in
        # proportion to the model's error)
        n = len(close)
        own = len(groups[0]) - 1  # (a row's orders lie within ORDER_TIE, so all are close)
        # the list holds the top plans only: when every other one is close, more may be beyond
        # it (a new user's count went 4, 15, 15 at --top 5, 20, 100)
        beyond = (", and perhaps more beyond the list (a larger --top lists them)"
                  if n == len(res.plans) - 1 and (top is None or len(res.plans) >= top) else "")
        row = (f", {own} of them {'another rank order' if own == 1 else 'other rank orders'} "
               "in its row" if own else "")
        out.append(f"({n} other listed plan{'s' if n > 1 else ''} within "
                   f"{CLOSE_PLANS:.0%} of the best{row}{beyond}: closer than this model's error "
                   f"on measured runs (README \"Accuracy\"), so measure before choosing between "
                   "them)")
    out += ["", "best plan:", evaluation(best), "", "devices per stage:"]
    for st in best.stages:
        out.append(f"  {st.index:3d}  {id_ranges(st.devices)}")
    return "\n".join(out)


def comparison(results: dict, errors: dict) -> str:
    """The output of ``nestplan compare``: methods side by side."""
    manual = results.get("manual")
    ref = manual.best.tokens_per_s if manual else None
    out = [f"{'method':11s} {'tokens/s':>12s} {'vs manual':>9s} {'step (s)':>9s} "
           f"{'peak GiB':>8s} {'search (s)':>10s}  plan"]
    for name, res in results.items():
        ev = res.best
        ratio = f"{ev.tokens_per_s / ref:8.2f}x" if ref else "        -"
        out.append(f"{name:11s} {ev.tokens_per_s:12,.0f} {ratio:>9s} {ev.step_time:9.3f} "
                   f"{ev.peak_memory / GiB:8.1f} {res.seconds:10.2f}  {plan_line(ev)}")
    for name, why in errors.items():
        out.append(f"{name:11s} {'-':>12s} {'-':>9s} {'-':>9s} {'-':>8s} {'-':>10s}  {why}")
    return "\n".join(out)
