"""Compute time of operators and layers (roofline with size-dependent efficiency).

A GEMM takes ``max(FLOP / (peak · eff(call size)), bytes / (HBM bandwidth · memory efficiency))``;
in fp8 it also pays for quantising its inputs (3 bytes moved per input element: read bf16, write
fp8; forward for the activation, backward for the output gradient; weights are quantised once per
step and cached across micro-batches, as Transformer Engine does). A fused attention kernel runs at
the accelerator's attention efficiency; every other op is HBM-bound.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

from ..caching import cached
from ..axes import Axis
from ..graph import Comm, Hide, LayerGraph, Op, OpKind
from ..options import Precision, TPOverlap
from ..placement import GroupLayout, Layouts
from ..specs import AcceleratorSpec, ClusterSpec, TrainingSpec
from ..stack import StackSpec
from .network import collective_time
from .overlap import exposed as exposed_time

FP8_CAST_BYTES = 3.0  # read a bf16 element, write its fp8 copy


def interpolate(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear interpolation in log(x), clamped at both ends."""
    if x <= points[0][0]:
        # below the table, efficiency falls in proportion to size (a fixed-latency kernel)
        return points[0][1] * max(x, 1.0) / points[0][0]
    if x >= points[-1][0]:
        return points[-1][1]
    i = bisect.bisect_left([p[0] for p in points], x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)


def matmul_efficiency(acc: AcceleratorSpec, precision: Precision, call_flops: float) -> float:
    table = acc.matmul_efficiency_fp8 if precision is Precision.FP8 else acc.matmul_efficiency_bf16
    return interpolate(table, call_flops)


def op_time(op: Op, acc: AcceleratorSpec, precision: Precision, backward: bool) -> float:
    """Seconds for the forward (or backward) pass of ``op`` on one device."""
    flops = op.bwd_flops if backward else op.flops
    nbytes = op.bwd_nbytes if backward else op.nbytes
    mem_bw = acc.hbm_bandwidth * acc.memory_efficiency
    if op.kind is OpKind.MEMORY:
        return nbytes / mem_bw + (acc.kernel_overhead if nbytes else 0.0)
    if op.kind is OpKind.ATTENTION:
        eff = acc.attention_efficiency[1 if backward else 0]
        # the efficiency is a causal kernel's; blocks without a mask run faster
        flops *= 1 - op.unmasked * (1 - 1 / acc.unmasked_attention_gain)
        return max(flops / (acc.sustained_flops(Precision.BF16) * eff),
                   nbytes / mem_bw) + acc.kernel_overhead
    prec = precision if op.lowp else Precision.BF16
    eff = matmul_efficiency(acc, prec, op.call_flops)
    t = max(flops / (acc.sustained_flops(prec) * eff), nbytes / mem_bw)
    if prec is Precision.FP8:
        m, k, n = op.shape
        t += FP8_CAST_BYTES * (m * n if backward else m * k) / mem_bw
    return t + acc.kernel_overhead * (2 if backward else 1)


def _wgrad_share(op: Op) -> float:
    """Fraction of a GEMM's backward time spent on the weight gradient (half of its FLOP)."""
    return 0.5 if op.kind is OpKind.GEMM else 0.0


@dataclass(frozen=True)
class LayerCost:
    """Time of one layer on one device, per micro-batch, with its communication."""

    fwd: float
    """Forward: compute plus exposed communication, or the host's time when that is longer."""
    bwd: float
    """Backward (without recomputation): compute plus exposed communication."""
    op_fwd: tuple[float, ...]
    """Forward compute of each operator (what a recompute policy runs again, in shares)."""
    compute: float
    """Forward + backward compute alone."""
    eager: float
    """The part of ``compute`` in eager kernels (``graph.Op.eager``)."""
    wgrad: float
    """The weight-gradient part of the backward's compute (what a split schedule defers)."""
    host: float
    """Forward time spent waiting on the host (``StackSpec.moe_host_wait`` per MoE block)."""
    comm: tuple[tuple[Axis, float, float], ...]
    """(axis, time on the link, exposed time) for forward + backward."""
    fwd_link: tuple[tuple[Axis, float], ...]
    """(axis, time on the link) of the forward alone (what a full recomputation runs again)."""
    fwd_comms: tuple[tuple[str, str, Axis, float, float], ...]
    """Each forward collective as (recompute module or "", ``graph.CollKind`` value, axis, exposed
    seconds, seconds on the link): what a recompute policy runs again of them
    (``recompute.Effect.reruns``)."""


def layer_cost(layer: LayerGraph, acc: AcceleratorSpec, cluster: ClusterSpec, lay: Layouts,
               training: TrainingSpec, stack: StackSpec) -> LayerCost:
    """Per-micro-batch cost of ``layer`` under the plan's layouts and the stack's overlaps
    (``acc`` and ``cluster`` as the stack runs them: ``cost.hardware.effective``)."""
    host = stack.moe_host_wait(training, lay.ep.size)
    args = (acc, cluster, (lay.tp, lay.cp, lay.ep, lay.etp), training.precision,
            stack.tp_overlap_for(lay.tp), stack.overlap_efficiency)
    if layer.depth_block is None:
        return _layer_cost(layer, *args, host * layer.moe_blocks)
    # a head's depths: each depth's block waits as a block does, the rest of the head does not
    block = layer.depth_block
    wait = layer.depths * _layer_cost(block, *args, host * block.moe_blocks).host
    cost = _layer_cost(layer, *args, 0.0)
    return replace(cost, fwd=cost.fwd + wait, host=wait)


@dataclass(frozen=True)
class _Compute:
    """A layer's compute seconds on one device, forward and backward, by the parts that hide
    communication (``_layer_cost``)."""

    f: float
    b: float
    gemm_f: float
    gemm_b: float
    wgrad: float
    attn_f: float
    attn_b: float
    shared_f: float
    shared_b: float
    eager: float
    op_fwd: tuple[float, ...]


@cached(maxsize=65536)
def _compute(layer: LayerGraph, acc: AcceleratorSpec, prec: Precision) -> _Compute:
    """The operators' times of ``layer``, which its groups' layouts do not change: computed once
    for all the layouts a search costs the layer under."""
    f = b = gemm_f = gemm_b = wgrad = attn_f = attn_b = shared_f = shared_b = eager = 0.0
    op_fwd = []
    for op in layer.ops:
        tf, tb = op_time(op, acc, prec, False), op_time(op, acc, prec, True)
        f += tf
        b += tb
        op_fwd.append(tf)
        if op.eager:
            eager += tf + tb
        if "shared_experts" in op.modules:
            shared_f += tf
            shared_b += tb
        if "core_attn" in op.modules:
            attn_f += tf
            attn_b += tb
        if op.kind is OpKind.GEMM:
            gemm_f += tf
            gemm_b += tb
            wgrad += _wgrad_share(op) * tb
    return _Compute(f, b, gemm_f, gemm_b, wgrad, attn_f, attn_b, shared_f, shared_b, eager,
                    tuple(op_fwd))


@cached(maxsize=65536)
def _layer_cost(layer: LayerGraph, acc: AcceleratorSpec, cluster: ClusterSpec,
                groups: tuple[GroupLayout, ...], prec: Precision, tp_overlap: TPOverlap,
                overlap: float, host: float) -> LayerCost:
    k = _compute(layer, acc, prec)
    f, b, gemm_f, gemm_b, wgrad = k.f, k.b, k.gemm_f, k.gemm_b, k.wgrad
    attn_f, attn_b, shared_f, shared_b = k.attn_f, k.attn_b, k.shared_f, k.shared_b
    tp_group, cp_group, ep_group, etp_group = groups
    group_of = {Axis.TP: tp_group, Axis.CP: cp_group, Axis.EP: ep_group}
    link = {Axis.TP: 0.0, Axis.CP: 0.0, Axis.EP: 0.0}
    exposed, fwd_link = dict(link), dict(link)
    cp = cp_group.size
    fwd_hidable = {Hide.TP_FWD: gemm_f if tp_overlap is TPOverlap.FULL else 0.0,
                   Hide.ATTENTION: attn_f, Hide.ATTENTION_FIRST: attn_f / cp,
                   # merged forward-backward of adjacent micro-batches: the other one's backward
                   Hide.OTHER_BATCH: b, Hide.SHARED: shared_f}
    bwd_hidable = {Hide.TP_BWD: {TPOverlap.NONE: 0.0, TPOverlap.BACKWARD: wgrad,
                                 TPOverlap.FULL: gemm_b}[tp_overlap],
                   Hide.ATTENTION: attn_b, Hide.ATTENTION_FIRST: attn_b / cp,
                   Hide.OTHER_BATCH: f, Hide.SHARED: shared_b}
    fwd_comm = {h: 0.0 for h in Hide}
    bwd_comm = {h: 0.0 for h in Hide}
    fwd_by_axis = {h: {} for h in Hide}
    bwd_by_axis = {h: {} for h in Hide}
    fwd_items: list[tuple[Comm, float]] = []
    for c in layer.comms:
        grp = etp_group if c.expert and c.axis is Axis.TP else group_of[c.axis]
        t = collective_time(c.kind, c.nbytes, grp, cluster, dedup=c.dedup)
        link[c.axis] += t
        if c.phase == "fwd":
            fwd_link[c.axis] += t
        table, by_axis = (fwd_comm, fwd_by_axis) if c.phase == "fwd" else (bwd_comm, bwd_by_axis)
        table[c.hide] += t
        by_axis[c.hide][c.axis] = by_axis[c.hide].get(c.axis, 0.0) + t
        if c.phase == "fwd":
            fwd_items.append((c, t))
    f_exposed = b_exposed = 0.0
    fwd_share = {}  # per hiding opportunity, the exposed part of its collectives' time
    for hide, total in fwd_comm.items():
        shown = exposed_time(total, fwd_hidable.get(hide, 0.0), overlap)
        f_exposed += shown
        fwd_share[hide] = shown / total if total else 0.0
        for ax, t in fwd_by_axis[hide].items():
            exposed[ax] += shown * t / total if total else 0.0
    for hide, total in bwd_comm.items():
        shown = exposed_time(total, bwd_hidable.get(hide, 0.0), overlap)
        b_exposed += shown
        for ax, t in bwd_by_axis[hide].items():
            exposed[ax] += shown * t / total if total else 0.0
    # a forward the host cannot run ahead of lasts at least the host's part of it
    waiting = max(0.0, host - (f + f_exposed))
    return LayerCost(
        fwd=f + f_exposed + waiting,
        bwd=b + b_exposed,
        op_fwd=k.op_fwd,
        compute=f + b,
        eager=k.eager,
        wgrad=wgrad,
        host=waiting,
        comm=tuple((ax, link[ax], exposed[ax]) for ax in (Axis.TP, Axis.CP, Axis.EP) if link[ax]),
        fwd_link=tuple((ax, fwd_link[ax]) for ax in (Axis.TP, Axis.CP, Axis.EP) if link[ax]),
        fwd_comms=tuple((c.module, c.kind.value, c.axis, t * fwd_share[c.hide], t)
                        for c, t in fwd_items),
    )
