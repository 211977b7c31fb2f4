"""The report's figures as SVG: pipeline timeline, placement on the topology, memory per stage,
step-time breakdown and the methods compared."""

from __future__ import annotations

import math
from dataclasses import fields

import numpy as np

from ..placement import expert_grid, rank_grid
from ..result import Evaluation
from ..schedule import Op, makespan
from ..svg import Svg, colour, fmt_tick, legend, shade, ticks
from ..units import GiB, fmt_time

FORWARD, BACKWARD, WEIGHT, END = "#4C8BD6", "#E08A3C", "#6BB36B", "#8E8E8E"
KIND = {"F": ("forward", FORWARD), "B": ("backward", BACKWARD), "X": ("whole backward", BACKWARD),
        "W": ("weight gradient", WEIGHT)}
IDLE = "#F1F1F1"
WIDTH = 1080.0


# ------------------------------------------------------------------------------------ timeline

def _seconds(t: float, span: float) -> str:
    """A time-axis label in the unit that suits the whole axis."""
    if t == 0:
        return "0"
    if span >= 2.0:
        return f"{t:g} s"
    return f"{t * 1e3:g} ms" if span >= 2e-3 else f"{t * 1e6:g} us"


def _windows(ops: list[Op], ev: Evaluation, span: float) -> list[tuple[float, float]]:
    """Time windows to draw: all of it, or the fill and the drain when the steady state is long
    (the middle repeats the same pattern and would shrink every operation to a hairline)."""
    per_micro = max(s.time_per_microbatch for s in ev.stages)
    w = (len(ev.stages) + 3) * per_micro
    if span <= 2.5 * w or ev.micro_batches * ev.plan.vp <= 24:
        return [(0.0, span)]
    return [(0.0, w), (span - w, span)]


def timeline(ev: Evaluation) -> tuple[Svg, dict]:
    """The pipeline schedule of one step (rows = stages); returns the figure and its numbers."""
    ops = ev.schedule_ops()
    pp, vp = ev.plan.pp, ev.plan.vp
    span = makespan(ops)
    ends = [max(o.end for o in ops if o.stage == s) for s in range(pp)]
    total = max(max(e + s.end for e, s in zip(ends, ev.stages)), ev.step_time)
    wins = _windows(ops, ev, total)
    gap = 28.0
    left, top, row = 74.0, 30.0, max(14.0, min(30.0, 420.0 / pp))
    plot_w = WIDTH - left - 20 - gap * (len(wins) - 1)
    scale = plot_w / sum(b - a for a, b in wins)
    height = top + row * pp + 78
    svg = Svg(WIDTH, height, label="pipeline timeline", id_="fig-timeline")

    def xs(t: float) -> float | None:
        x = left
        for a, b in wins:
            if a <= t <= b:
                return x + (t - a) * scale
            x += (b - a) * scale + gap
        return None

    def spans(a: float, b: float):
        """Pieces of [a, b] inside the drawn windows, as pixel ranges."""
        x = left
        for wa, wb in wins:
            lo, hi = max(a, wa), min(b, wb)
            if hi > lo:
                yield x + (lo - wa) * scale, x + (hi - wa) * scale
            x += (wb - wa) * scale + gap

    svg.text(left, 16, f"{ev.micro_batches} micro-batches per replica, {pp} stages"
             + (f" x {vp} virtual" if vp > 1 else "")
             + "; grey = idle (bubble, and faster stages waiting)", size=12)
    for s in range(pp):
        y = top + s * row
        for x0, x1 in spans(0.0, total):
            svg.rect(x0, y + 1, x1 - x0, row - 2, IDLE)
        svg.text(left - 8, y + row / 2 + 4, f"stage {s}", size=10, anchor="end")
    for o in ops:
        y = top + o.stage * row
        local = o.chunk // pp
        what, base = KIND[o.kind]
        fill = shade(base, 0.45 * local / max(vp - 1, 1)) if vp > 1 else base
        for x0, x1 in spans(o.start, o.end):
            svg.rect(x0, y + 1, x1 - x0, row - 2, fill, cls=f"op {o.kind}",
                     tip=f"stage {o.stage}, {what} of micro-batch {o.micro}"
                         + (f", chunk {o.chunk}" if vp > 1 else "")  # (one chunk: the stage)
                         + f": {fmt_time(o.start)} to {fmt_time(o.end)}")
            if x1 - x0 > 14 and row >= 14:
                svg.text((x0 + x1) / 2, y + row / 2 + 4, o.micro, size=9, anchor="middle",
                         fill="#fff")
    for s, (e, st) in enumerate(zip(ends, ev.stages)):
        for x0, x1 in spans(e, e + st.end):
            svg.rect(x0, top + s * row + 1, x1 - x0, row - 2, END,
                     tip=f"stage {s}: gradient reduction and optimizer step, {fmt_time(st.end)} "
                         f"(the step's fixed host overhead, "
                         f"{fmt_time(ev.scenario.stack.step_overhead)}, follows)")
    axis_y = top + row * pp + 4
    for i, (a, b) in enumerate(wins):
        for t in ticks(a, b, 6 if len(wins) == 1 else 3):
            x = xs(t)
            if x is not None:
                svg.line(x, axis_y, x, axis_y + 4)
                svg.text(x, axis_y + 16, _seconds(t, total), size=9, anchor="middle")
        if i:
            x = xs(a) - gap / 2
            svg.text(x, top + row * pp / 2, "…", size=16, anchor="middle")
            svg.line(x - 4, top, x - 4, axis_y, "#999", dash="3 3")
            svg.line(x + 4, top, x + 4, axis_y, "#999", dash="3 3")
    x = xs(ev.step_time)
    if x is not None:
        svg.line(x, top - 4, x, axis_y, "#C00", width=1.5, dash="5 3",
                 tip=f"predicted step time {fmt_time(ev.step_time)}")
    entries = [("forward", FORWARD), ("backward (+ recompute)", BACKWARD)]
    if ev.plan.pipeline.split_backward:
        entries += [("weight gradient", WEIGHT)]
    entries += [("gradient sync + optimizer", END), ("idle", IDLE)]
    legend(svg, left, axis_y + 40, entries, per_row=len(entries), col_width=180)
    numbers = {"schedule_s": span, "drawn_s": total, "ops": len(ops),
               "elided": len(wins) > 1, "bubble": 1 - sum(o.end - o.start for o in ops)
               / (pp * span) if span else 0.0}
    return svg, numbers


# ------------------------------------------------------------------------------------ placement

def _device_roles(grid) -> dict[int, tuple[int, int, int, int]]:
    """device id -> (stage, data-parallel replica, context rank, tensor rank), from the plan's
    ``rank_grid``."""
    roles = {}
    for (s, d, c, t), dev in np.ndenumerate(grid):
        roles[int(dev)] = (s, d, c, t)
    return roles


def _expert_roles(grid, plan) -> dict[int, str]:
    """device id -> its place in the folded expert grid (``placement.expert_grid``) of the plan's
    ``rank_grid``."""
    egrid = expert_grid(grid, plan)  # [pp, edp, ep, etp]
    return {int(dev): f", ep rank {e}, expert-tp rank {t}, expert-dp replica {d}"
            for (_, d, e, t), dev in np.ndenumerate(egrid)}


def placement(ev: Evaluation) -> Svg:
    """Every device in its node, nodes in their switch groups, coloured by stage and shaded by
    data-parallel replica."""
    cluster, gpus = ev.scenario.cluster, ev.gpus
    grid = rank_grid(ev.plan)
    roles = _device_roles(grid)
    experts = _expert_roles(grid, ev.plan) if ev.scenario.model.moe is not None else {}
    levels = cluster.levels
    sizes = [lvl.size for lvl in levels[:-1]]  # children per block of each bounded level
    per_node = sizes[0] if sizes else gpus
    cell = max(4.0, min(14.0, math.sqrt(220000.0 / max(gpus, 1))))
    cols0 = min(per_node, 8 if per_node > 8 else per_node)
    big = cell < 7  # thousands of devices: thinner frames, no labels inside
    pad = [1.0, 2.0, 3.0, 4.0] if big else [3.0, 6.0, 10.0, 14.0]
    node_label, block_label, gap = (0.0, 0.0, 2.0) if big else (9.0, 12.0, 4.0)
    tips = gpus <= 4096
    reps = ev.plan.dp
    layout_cache: dict[int, tuple[float, float, int]] = {}
    devices_per = [1]  # devices under one block of level l - 1
    for n in sizes:
        devices_per.append(devices_per[-1] * n)

    def size_of(level: int) -> tuple[float, float, int]:
        """(width, height, children per row) of one block of ``level`` (0 = node)."""
        if level in layout_cache:
            return layout_cache[level]
        if level == 0:
            rows = math.ceil(per_node / cols0)
            out = (cols0 * cell + 2 * pad[0], rows * cell + 2 * pad[0] + node_label, cols0)
        else:
            cw, ch, _ = size_of(level - 1)
            n = sizes[level] if level < len(sizes) else 1
            n = min(n, -(-gpus // devices_per[level]))  # a small plan fills only a few
            target = WIDTH - 40 if level == len(sizes) else 2.4 * max(cw, ch) * math.sqrt(n)
            p = pad[min(level, 3)]
            fit = int((WIDTH - 40 - 2 * p + gap) // (cw + gap))
            per_row = max(1, min(n, int(target // (cw + gap)), fit))
            rows = math.ceil(n / per_row)
            out = (per_row * (cw + gap) - gap + 2 * p,
                   rows * (ch + gap) - gap + 2 * p + block_label, per_row)
        layout_cache[level] = out
        return out

    bounded = len(sizes)  # blocks of level `bounded` (the top) are unbounded
    # the top level: blocks of the last bounded level, flowed into rows across the page
    child_level = bounded - 1
    if child_level < 0:  # a single-level cluster: one node holds everything
        child_level, top_blocks = 0, 1
    else:
        top_blocks = -(-gpus // devices_per[child_level + 1])
    cw, ch, _ = size_of(child_level)
    per_row = max(1, int((WIDTH - 20) // (cw + 6)))
    rows = math.ceil(top_blocks / per_row)
    legend_rows = math.ceil(min(ev.plan.pp, 32) / 8)
    height = 36 + rows * (ch + 6) + 24 + 16 * legend_rows
    svg = Svg(WIDTH, height, label="placement on the topology", id_="fig-placement")
    top_name = levels[-1].name
    svg.text(10, 16, f"{gpus} devices; boxes are {', '.join(lv.name for lv in levels[:-1])} "
             f"blocks under the {top_name}; colour = pipeline stage, shade = data-parallel replica",
             size=12)

    def draw(level: int, index: int, x: float, y: float):
        first = index * devices_per[level + 1] if level < len(devices_per) - 1 else 0
        if first >= gpus:
            return
        w, h, per = size_of(level)
        name = levels[level].name
        frame = "#bbb" if level else (None if big else "#999")
        svg.rect(x, y, w, h, "none" if level else "#fff", stroke=frame,
                 stroke_width=0.8 if frame else None, rx=2, tip=f"{name} {index}")
        if level == 0:
            if node_label:
                svg.text(x + pad[0], y + 9, index, size=7, fill="#777")
            for k in range(per_node):
                dev = first + k
                if dev >= gpus:
                    break
                s, d, c, t = roles[dev]
                fill = shade(colour(s), (0.0, 0.35, -0.25, 0.6)[d % 4]) if reps > 1 else colour(s)
                cx = x + pad[0] + (k % cols0) * cell
                cy = y + pad[0] + node_label + (k // cols0) * cell
                svg.rect(cx + 0.5, cy + 0.5, cell - 1, cell - 1, fill, cls=f"d s{s}",
                         tip=(f"device {dev}: stage {s}, replica {d}, cp rank {c}, tp rank {t}"
                              + experts.get(dev, "") if tips else None))
            return
        p = pad[min(level, 3)]
        if block_label:
            svg.text(x + p, y + p + 7, f"{name} {index}", size=8, fill="#666")
        cw_, ch_, _ = size_of(level - 1)
        n = sizes[level] if level < len(sizes) else 1
        for j in range(n):  # (children past the last device return at once)
            r, q = divmod(j, per)
            draw(level - 1, index * n + j, x + p + q * (cw_ + gap),
                 y + p + block_label + r * (ch_ + gap))

    for b in range(top_blocks):
        r, q = divmod(b, per_row)
        draw(child_level, b, 10 + q * (cw + 6), 28 + r * (ch + 6))
    entries = [(f"stage {s}", colour(s)) for s in range(min(ev.plan.pp, 32))]
    legend(svg, 10, height - 16 * legend_rows + 4, entries, per_row=8, col_width=100)
    return svg


# ------------------------------------------------------------------------------------ memory

MEMORY_PARTS = (("weights", "#4C72B0"), ("gradients", "#55A868"), ("optimizer", "#8172B2"),
                ("activations", "#DD8452"), ("transient", "#C44E52"), ("reserved", "#B0B0B0"))


def memory(ev: Evaluation) -> Svg:
    """Stacked memory per stage against the device's HBM."""
    pp = ev.plan.pp
    cap = ev.capacity / GiB
    top_v = max(cap, ev.peak_memory / GiB) * 1.05
    yt = ticks(0.0, top_v)
    left, top, ph = 56.0, 28.0, 260.0
    pw = WIDTH - left - 20
    slot = pw / pp
    bar = min(60.0, slot * 0.7)
    svg = Svg(WIDTH, top + ph + 64, label="memory per stage", id_="fig-memory")

    def py(v: float) -> float:
        return top + ph - v / yt[-1] * ph

    svg.text(left, 16, "memory of the fullest device of each stage, GiB", size=12)
    for t in yt:
        svg.line(left, py(t), left + pw, py(t), "#e6e6e6")
        svg.text(left - 6, py(t) + 4, fmt_tick(t), size=10, anchor="end")
    for st in ev.stages:
        x = left + st.index * slot + (slot - bar) / 2
        acc = 0.0
        for name, fill in MEMORY_PARTS:
            v = getattr(st.memory, name) / GiB
            if v <= 0:
                continue
            svg.rect(x, py(acc + v), bar, py(acc) - py(acc + v), fill, cls="mem",
                     tip=f"stage {st.index} {name}: {v:.2f} GiB")
            acc += v
        if pp <= 48 or st.index % math.ceil(pp / 48) == 0:
            svg.text(x + bar / 2, top + ph + 14, st.index, size=9, anchor="middle")
    svg.line(left, py(cap), left + pw, py(cap), "#C00", width=1.5, dash="6 3",
             tip=f"HBM {cap:.1f} GiB")
    svg.text(left + pw, py(cap) - 4, f"HBM {cap:.1f} GiB", size=10, anchor="end", fill="#C00")
    svg.line(left, top + ph, left + pw, top + ph)
    svg.text(left + pw / 2, top + ph + 28, "pipeline stage", size=11, anchor="middle")
    legend(svg, left, top + ph + 50, [(n, c) for n, c in MEMORY_PARTS], per_row=6,
           col_width=120)
    return svg


# ------------------------------------------------------------------------------------ breakdown

BREAKDOWN = {"compute": "#4C72B0", "recompute": "#64B5CD", "host": "#B07AA1", "tp": "#DD8452",
             "cp": "#CCB974", "ep": "#DA8BC3", "zero": "#8172B2", "pp": "#937860",
             "bubble": "#C9C9C9", "dp": "#55A868", "embedding": "#2E6B45", "optimizer": "#C44E52",
             "step_host": "#8C8C8C"}


def breakdown(ev: Evaluation) -> Svg:
    """The step as one horizontal bar of its parts."""
    parts = [(f.name, getattr(ev.time, f.name)) for f in fields(ev.time)]
    total = sum(v for _, v in parts) or 1.0
    left, pw = 10.0, WIDTH - 30
    svg = Svg(WIDTH, 96, label="step-time breakdown", id_="fig-breakdown")
    svg.text(left, 16, f"one step: {fmt_time(ev.step_time)} (exposed time, slowest stage)",
             size=12)
    x = left
    for name, v in parts:
        w = v / total * pw
        if w <= 0:
            continue
        svg.rect(x, 26, w, 30, BREAKDOWN[name], cls="part",
                 tip=f"{name}: {fmt_time(v)} ({v / total:.1%})")
        if w > 48:
            svg.text(x + w / 2, 45, name, size=10, anchor="middle", fill="#fff")
        x += w
    shown = [(n, BREAKDOWN[n]) for n, v in parts if v > 0]  # the parts this step has
    legend(svg, left, 78, shown, per_row=10, col_width=104)
    return svg


# ------------------------------------------------------------------------------------ methods

def methods(rows: list[dict], chosen: str | None) -> Svg:
    """Tokens per second of every method's best plan."""
    n = len(rows)
    left, top, bar = 110.0, 26.0, 22.0
    pw = WIDTH - left - 120
    best = max((r["tokens_per_s"] for r in rows), default=1.0) or 1.0
    ref = next((r["tokens_per_s"] for r in rows if r["method"] == "manual"), None)
    svg = Svg(WIDTH, top + n * (bar + 8) + 10, label="methods compared", id_="fig-methods")
    svg.text(left, 16, "tokens/s of each method's best plan"
             + (" (ratio to the manual plan)" if ref else ""), size=12)
    for i, r in enumerate(rows):
        y = top + i * (bar + 8)
        w = r["tokens_per_s"] / best * pw
        fill = colour(0) if r["method"] == chosen else "#9DB5D3"
        svg.text(left - 8, y + bar / 2 + 4, r["method"], size=11, anchor="end",
                 weight="600" if r["method"] == chosen else None)
        svg.rect(left, y, w, bar, fill, cls="method", tip=f"{r['method']}: "
                 f"{r['tokens_per_s']:,.0f} tokens/s")
        label = f"{r['tokens_per_s']:,.0f}" + (f"  ({r['tokens_per_s'] / ref:.2f}x)" if ref else "")
        svg.text(left + w + 6, y + bar / 2 + 4, label, size=10)
    return svg
