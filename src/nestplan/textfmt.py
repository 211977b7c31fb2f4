"""Human-readable text for results (the one place that formats numbers for people)."""

from __future__ import annotations

from dataclasses import fields

from .result import Evaluation
from .units import GiB, fmt_time


def plan_line(ev: Evaluation) -> str:
    p = ev.plan
    parts = [f"tp={p.tp}", f"pp={p.pp}", f"dp={p.dp}", f"cp={p.cp}", f"ep={p.ep}"]
    if ev.scenario.model.moe is not None:
        parts.append(f"etp={p.expert_tp}")
    parts += [f"vp={p.vp}", f"sp={'on' if p.sp else 'off'}", f"zero={p.zero}",
              "recompute=" + ",".join(sorted({r.value for r in p.recompute})), f"mbs={p.mbs}",
              f"order={'-'.join(a.value for a in p.rank_order)}"]
    return " ".join(parts)


def evaluation(ev: Evaluation) -> str:
    """The default output of ``nestplan evaluate``."""
    sc = ev.scenario
    tr = sc.training
    out = [
        f"{sc.model.name} on {sc.gpus} x {sc.cluster.accelerator.name} ({sc.cluster.name}), "
        f"seq {tr.seq_len}, global batch {tr.global_batch}, {tr.precision.value}",
        f"plan: {plan_line(ev)}  ({ev.micro_batches} micro-batches per replica)",
        "",
        f"step time        {fmt_time(ev.step_time)}",
        f"tokens/s         {ev.tokens_per_s:,.0f}  ({ev.tokens_per_s_per_gpu:,.0f} per GPU)",
        f"model TFLOP/s    {ev.model_tflops_per_gpu:.1f} per GPU",
        f"MFU              {ev.mfu * 100:.1f}% of {tr.precision.value} peak",
        f"peak memory      {ev.peak_memory / GiB:.1f} GiB of {ev.capacity / GiB:.1f} GiB "
        f"(stage {ev.worst_stage.index})  {'fits' if ev.fits else 'DOES NOT FIT'}",
    ]
    if not ev.fits:
        out.append(f"  why: {ev.why_not}")
    out += ["", "time per step (exposed; on the slowest pipeline stage):"]
    total = ev.step_time
    for f in fields(ev.time):
        v = getattr(ev.time, f.name)
        if abs(v) > 1e-9:
            out.append(f"  {f.name:10s} {fmt_time(v):>12s}  {v / total * 100:5.1f}%")
    link = {k: v for k, v in ev.link_time.items() if v > 1e-9}
    if link:
        out.append("communication on the links (hidden or not): "
                   + ", ".join(f"{k} {fmt_time(v)}" for k, v in link.items()))
    worst = ev.worst_stage.memory
    out += ["", f"memory on the most loaded device (stage {ev.worst_stage.index}):"]
    for f in fields(worst):
        out.append(f"  {f.name:12s} {getattr(worst, f.name) / GiB:8.2f} GiB")
    out.append(f"  {'total':12s} {worst.total / GiB:8.2f} GiB")
    if len(ev.stages) > 1:
        out += ["", "stages:"]
        for s in ev.stages:
            blocks = ", ".join(f"{a}-{b - 1}" if b > a else "none" for a, b in s.blocks)
            extra = (" +embedding" if s.has_embedding else "") + (" +head" if s.has_head else "")
            out.append(f"  {s.index:3d}  blocks {blocks}{extra}  {fmt_time(s.time_per_microbatch)}"
                       f"/micro-batch  {s.memory.total / GiB:6.1f} GiB  recompute {s.recompute}")
    return "\n".join(out)
