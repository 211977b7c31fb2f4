"""``nestplan report``: one self-contained HTML page about a plan.

Everything is inline (CSS, SVG figures and a few lines of script for highlighting), so the file
opens offline and can be attached to a ticket. Sections: summary, pipeline timeline, placement on
the topology, memory per stage, step-time breakdown, and the methods compared when the plan file
came from ``nestplan compare --save``.
"""

from __future__ import annotations

from dataclasses import fields
from html import escape

from .. import __version__, accuracy
from ..axes import order_text
from ..planfile import PlanFile
from ..result import Evaluation
from ..textfmt import (block_range, group_crossings, id_ranges, mtp_text, plan_line,
                       workload_parts)
from ..units import GiB, fmt_time
from . import figures

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;margin:0;
 background:#fafafa}
main{max-width:1120px;margin:0 auto;padding:16px 20px 48px}
h1{font-size:22px;margin:8px 0 2px} h2{font-size:17px;margin:28px 0 6px}
.sub{color:#555;margin:0 0 12px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:130px}
.card b{display:block;font-size:19px} .card span{color:#666;font-size:12px}
.bad{color:#B00} figure{margin:0;background:#fff;border:1px solid #ddd;border-radius:6px;
 padding:6px;overflow-x:auto} figcaption{color:#555;font-size:12px;padding:4px 6px}
table{border-collapse:collapse;background:#fff;margin:6px 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right} th{background:#f0f0f0}
td.l,th.l{text-align:left}
#fig-placement[data-focus] .d{opacity:.12}
.legend-stage{cursor:pointer}
"""

# Highlighting: hovering a stage row in the stage table shows where its devices sit. A failing
# script must not pass unnoticed, so errors are recorded on the page (the tests read them).
SCRIPT = """
(function(){
  var root=document.documentElement, errors=[];
  window.addEventListener('error',function(e){errors.push(String(e.message));
    root.setAttribute('data-errors',errors.join(' | '));});
  var fig=document.getElementById('fig-placement'), style=document.createElement('style');
  document.head.appendChild(style);
  document.querySelectorAll('[data-stage]').forEach(function(el){
    el.addEventListener('mouseenter',function(){var s=el.getAttribute('data-stage');
      fig.setAttribute('data-focus',s);
      style.textContent='#fig-placement[data-focus] .s'+s+'{opacity:1}';});
    el.addEventListener('mouseleave',function(){fig.removeAttribute('data-focus');
      style.textContent='';});
  });
  var figs=document.querySelectorAll('figure svg'), drawn=0;
  figs.forEach(function(s){var b=s.getBBox(); if(b.width>0&&b.height>0&&
    s.querySelectorAll('rect,polyline,circle').length>0){drawn++;}});
  root.setAttribute('data-figures',figs.length+'/'+drawn);
})();
"""


def _card(value: str, label: str, bad: bool = False) -> str:
    return (f'<div class="card"><b{" class=bad" if bad else ""}>{escape(value)}</b>'
            f"<span>{escape(label)}</span></div>")


def _table(header: list[str], rows: list[list], left: int = 1, attrs=None) -> str:
    head = "".join(f'<th{" class=l" if i < left else ""}>{escape(h)}</th>'
                   for i, h in enumerate(header))
    body = []
    for k, r in enumerate(rows):
        extra = attrs(k) if attrs else ""
        body.append(f"<tr{extra}>" + "".join(
            f'<td{" class=l" if i < left else ""}>{escape(str(c))}</td>' for i, c in enumerate(r))
            + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _figure(svg, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def _summary(pf: PlanFile, ev: Evaluation) -> str:
    sc, tr, p = ev.scenario, ev.scenario.training, ev.plan
    cards = [
        _card(fmt_time(ev.step_time), "step time"),
        _card(f"{ev.tokens_per_s:,.0f}", f"tokens/s ({ev.tokens_per_s_per_gpu:,.0f} per GPU)"),
        _card(f"{ev.mfu:.1%}", f"MFU ({tr.precision.value} peak)"),
        _card(f"{ev.model_tflops_per_gpu:.0f}", "model TFLOP/s per GPU"),
        _card(f"{ev.peak_memory / GiB:.1f} / {ev.capacity / GiB:.1f} GiB",
              "peak memory / HBM" + ("" if ev.fits else " — does not fit"), bad=not ev.fits),
        _card(f"{ev.margin / GiB:.1f} GiB", f"free at the peak (headroom {ev.headroom / GiB:.1f} "
              "GiB" + (")" if ev.within_headroom else ": not met)"),
              bad=not ev.within_headroom),
    ]
    if pf.predicted.get("step_time_s") and abs(pf.predicted["step_time_s"] - ev.step_time) > \
            1e-6 * ev.step_time:
        cards.append(_card(fmt_time(pf.predicted["step_time_s"]),
                           "step time predicted when saved", bad=True))
    rows = [["tensor (tp)", p.tp], ["pipeline (pp)", p.pp], ["data (dp)", p.dp],
            ["context (cp)", p.cp], ["expert (ep)", p.ep]]
    if sc.model.moe is not None:
        rows.append(["expert tensor (etp)", p.expert_tp])
    rows += [["virtual stages (vp)", p.vp], ["sequence parallel", "on" if p.sp else "off"],
             ["ZeRO stage", p.zero], ["micro-batch size", p.mbs],
             ["micro-batches per replica", ev.micro_batches],
             ["rank order (innermost first)", order_text(p.rank_order)]]
    mtp = sc.model.mtp_layers
    stage_rows = [[s.index, ", ".join(block_range(a, b) for a, b in s.blocks)
                   + (" +emb" if s.has_embedding else "") + (" +head" if s.has_head else "")
                   + (f" +{mtp} MTP" if s.has_head and mtp else ""),
                   s.recompute, fmt_time(s.time_per_microbatch), f"{s.memory.total / GiB:.1f}",
                   id_ranges(s.devices, 48)] for s in ev.stages]
    stages = _table(["stage", "blocks", "recompute", "per micro-batch", "GiB", "devices"],
                    stage_rows, left=3,
                    attrs=lambda k: f' data-stage="{k}" class="legend-stage"')
    why = f'<p class="bad">{escape(ev.why_not)}</p>' if not ev.fits else ""
    return (
        f"<h1>{escape(sc.model.name)} on {sc.gpus:,} × {escape(sc.cluster.accelerator.name)}</h1>"
        f'<p class="sub">cluster {escape(sc.cluster.name)} · sequence {tr.seq_len:,} · global '
        f"batch {tr.global_batch:,} · {tr.precision.value} · stack {escape(sc.stack.name)}"
        + escape("".join(f" · {p}" for p in workload_parts(sc)))
        + (f" · found by {escape(pf.method)}" if pf.method else "")
        + f"</p><div class=cards>{''.join(cards)}</div>{why}"
        + (f"<p class=sub>measured error: {escape(measured)}</p>"
           if (measured := accuracy.text(sc)) else "")
        + f"<p class=sub>{escape(plan_line(ev))}</p>"
        + _table(["degree", "value"], rows)
        + _experts(ev)
        + "<h2>Stages</h2><p class=sub>Hover a row to see its devices in the placement.</p>"
        + stages
    )


def _experts(ev: Evaluation) -> str:
    """An MoE model's experts as the plan lays them out and the stack exchanges tokens with them
    (empty for a dense model)."""
    sc, p = ev.scenario, ev.plan
    moe, tr, stack = sc.model.moe, sc.training, sc.stack
    if moe is None:
        return ""
    shared = (f", {moe.shared_experts} shared" if moe.shared_experts else "")
    rows = [["experts", f"{moe.experts} routed{shared}, top-{moe.top_k}"],
            ["MoE layers", f"{sc.model.num_moe_layers} of {sc.model.layers}"
             + (f" (+{mtp_text(sc.model.mtp_layers)})"
                if sc.model.mtp_layers else "")],
            ["experts per expert-parallel rank", f"{moe.experts // p.ep} (ep = {p.ep}, "
             f"expert TP {p.expert_tp})"],
            ["token dispatcher", stack.moe_dispatcher],
            ["expert exchange hidden by", stack.moe_overlap],
            ["load of the busiest expert rank", _load_text(ev)],
            ["capacity factor", "dropless" if tr.moe_capacity is None else f"{tr.moe_capacity:g}"]]
    return "<h2>Experts</h2>" + _table(["", ""], rows)


def _load_text(ev: Evaluation) -> str:
    """The stated load of the busiest expert rank, or, where the plan's expert ranks cannot have
    that much, the most they can, which the plan is costed at."""
    tr = ev.scenario.training
    most = ev.capped_moe_load
    if most is None:
        return f"{tr.moe_imbalance:g}x the mean"
    return f"{most:g}x the mean (stated {tr.moe_load:g}: the most {ev.plan.ep} expert ranks can have)"


def _crossings(ev: Evaluation) -> str:
    """The highest network level each parallel group crosses, as the text output gives it (the
    report had left it out: a datacenter trial's)."""
    rows = [[axis, f"{n:,}", level] for axis, n, level in group_crossings(ev)]
    if not rows:
        return ""
    return ("<p class=sub>The highest network level each parallel group crosses:</p>"
            + _table(["group", "devices", "highest level"], rows))


def _breakdown_table(ev: Evaluation) -> str:
    rows = [[f.name, fmt_time(getattr(ev.time, f.name)),
             f"{getattr(ev.time, f.name) / ev.step_time:.1%}"]
            for f in fields(ev.time) if abs(getattr(ev.time, f.name)) > 1e-9]
    link = [[k, fmt_time(v)] for k, v in ev.link_time.items() if v > 1e-9]
    out = _table(["part", "seconds", "share"], rows)
    if link:
        out += ("<p class=sub>Time each parallel axis's traffic occupies the links during a step, "
                "hidden behind compute or not:</p>" + _table(["axis", "on the links"], link))
    return out


METHOD_KNOBS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "schedule", "sp", "zero", "recompute",
                "mbs", "rank_order", "stage_layers")
"""What a compared method's plan shows, as its ``compare --json`` entry holds it."""


def _method_plan(row: dict) -> str:
    """A compared method's plan, every knob its entry has (none of an axis it does not use: no
    expert TP for a dense model, no schedule without a pipeline, no split for the even one)."""
    def shown(k):
        v = row[k]
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, list):
            return ",".join(map(str, v))
        return v
    return " ".join(f"{k.replace('_', '-')}={shown(k)}" for k in METHOD_KNOBS
                    if row.get(k) is not None)


def _methods(pf: PlanFile) -> str:
    comp = pf.comparison
    if not comp:
        return ""
    rows = comp["methods"]
    table = _table(["method", "tokens/s", "step", "MFU", "GiB", "plan"], [
        [r["method"], f"{r['tokens_per_s']:,.0f}",
         fmt_time(r["step_time_s"]) if "step_time_s" in r else "",
         f"{r['mfu']:.1%}" if "mfu" in r else "",
         f"{r['peak_memory_gib']:.1f}" if "peak_memory_gib" in r else "",
         _method_plan(r)] for r in rows], left=1)
    errs = "".join(f"<li>{escape(k)}: {escape(str(v))}</li>" for k, v in comp["errors"].items())
    return ("<h2>Methods compared</h2>"
            + _figure(figures.methods(rows, pf.method), "Each method's best plan for the same "
                      "scenario; the plan in this report is the highlighted one.")
            + table + (f"<p class=sub>No plan found by:</p><ul>{errs}</ul>" if errs else ""))


def render(pf: PlanFile, ev: Evaluation, notes: list[str] | None = None) -> str:
    """The report of ``pf`` (``ev`` is its evaluation by this version of nestplan), with the
    ``notes`` the command line gives of it (``notes.plan.evaluated``)."""
    sc = ev.scenario
    tl, nums = figures.timeline(ev)
    elided = (" The steady state in the middle repeats the same pattern and is cut out (…)."
              if nums["elided"] else "")
    shades = " (lighter shades: later virtual chunks)" if ev.plan.vp > 1 else ""
    runs = (f"as the {ev.plan.pipeline.name} schedule runs them{shades}; transfers between "
            "stages delay the receiver" if ev.plan.pp > 1 else "on the one stage (no pipeline)")
    timeline_caption = (
        f"Forward and backward of every micro-batch on every stage, {runs}. Simulated schedule "
        f"{fmt_time(nums['schedule_s'])} with {nums['bubble']:.1%} of all stages' time idle "
        f"(stages faster than the slowest wait too; the breakdown's bubble is the slowest "
        f"stage's, {fmt_time(ev.time.bubble)}); the cost model's closed "
        f"form (dashed red line: the predicted step, including gradient sync, optimizer and host "
        f"overhead) hides steady-state transfers behind compute where the compute lasts longer."
        f"{elided}")
    said = ("<h2>Notes</h2><ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"
            if notes else "")
    body = "".join([
        _summary(pf, ev), said,
        "<h2>Pipeline timeline</h2>", _figure(tl, timeline_caption),
        "<h2>Placement on the topology</h2>",
        _figure(figures.placement(ev),
                f"{sc.cluster.name}: " + "; ".join(
                    f"{lv.name}" + (f" of {lv.size}" if lv.size else "")
                    + f" at {lv.bandwidth / 1e9:.1f} GB/s per device"
                    + (f", {lv.oversubscription:g}:1 oversubscribed"
                       if lv.oversubscription != 1 else "") for lv in sc.cluster.levels)
                + ". Hover a device for its ranks."),
        _crossings(ev),
        "<h2>Memory per stage</h2>",
        _figure(figures.memory(ev), "Each bar is the most loaded device of a stage at its peak "
                "(activations of the micro-batches in flight); the dashed line is the HBM."),
        "<h2>Step-time breakdown</h2>",
        _figure(figures.breakdown(ev), "Exposed time: communication hidden behind compute is "
                "not counted here."),
        _breakdown_table(ev),
        _methods(pf),
        f"<p class=sub>nestplan {escape(__version__)}; the plan file was written by nestplan "
        f"{escape(str(pf.version or 'unknown'))}.</p>",
    ])
    title = f"nestplan: {sc.model.name} on {sc.gpus} x {sc.cluster.accelerator.name}"
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{escape(title)}"
            f"</title><meta name=viewport content='width=device-width,initial-scale=1'>"
            f"<style>{CSS}</style></head><body><main>{body}</main>"
            f"<script>{SCRIPT}</script></body></html>\n")
