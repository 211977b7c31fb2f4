"""Evaluate one plan: step time, throughput, MFU and memory on every pipeline stage.

Overlap assumptions (stated once, here and in the README):

* Tensor parallelism: forward collectives are exposed unless ``tp_overlap = full``; backward
  ones hide behind the weight-gradient GEMMs (``backward``, Megatron's default) or all backward
  GEMMs (``full``).
* Context parallelism: the K/V ring exchange hides behind the attention core.
* Expert parallelism: dispatch/combine all-to-alls are exposed.
* Pipeline: send/recv on the fill and drain path is exposed; in the steady state it overlaps
  compute when ``overlap_p2p`` (a device's micro-batch then lasts at least its sends: a slow
  link shows), else it adds to every micro-batch.
* Data parallelism: each stage's gradient reduction overlaps its last backward
  (``overlap_grad_reduce``) or follows it; the step ends with the slowest stage's reduction,
  optimizer step and (sharded optimizer) parameter all-gather, the latter hidden behind the next
  step's first forward with ``overlap_param_gather``.
* ZeRO-2 reduce-scatters gradients every micro-batch, ZeRO-3 also all-gathers weights before each
  forward and backward (and recomputed forward): both prefetch layer by layer, so a micro-batch
  pays the exposed part of its communication plus one layer's worth.
* Hidden communication still shows for 30 % of the compute it overlaps (``cost/overlap.py``).

The per-device arithmetic lives in ``cost/device.py`` and is shared with the search, so the value
the search optimises for a plan is exactly what ``evaluate`` reports.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, NamedTuple

from .caching import cached
from . import graph as G
from .axes import Axis
from .cost import device as D
from .cost.compute import layer_cost
from .cost.hardware import effective
from .schedule import simulated_ends, span
from .placement import layouts, stage_devices
from .catalog import scenario_from_names  # noqa: F401  (its home is the catalog)
from .options import MLPKind, Precision
from .recompute import effect
from .errors import SpecError
from .result import Evaluation, StageReport, TimeBreakdown, stage_times
from .units import TFLOPS
from .specs import (Parallelism, Scenario, blocks_per_chunk, check_plan, costed_moe_load, fold,
                    uneven_chunks, uneven_split)


def local_strategy(model, par: Parallelism, tr, stack) -> G.Local:
    """The layer-graph key of a plan of ``model``: its intra-layer strategy, micro-batch shape
    and the stack's kernels (of its eager ops, those the model has: stacks that differ in the
    others share one graph)."""
    padded = stack.pads_experts(tr)  # every rank computes the capacity, not the busiest's load
    cp_exchange = stack.cp_exchange_for(model)
    return G.Local(par.tp, par.sp, par.cp, par.ep, par.expert_tp, par.mbs, tr.seq_len,
                   tr.precision, stack.attention, span=tr.attention_span or 0,
                   fused_norm=stack.fused_norm, fused_gated_mlp=stack.fused_gated_mlp,
                   norm_in_linear=stack.norm_in_linear,
                   cp_allgather=cp_exchange in ("allgather", "te_allgather", "flex_allgather"),
                   cp_gather_waits=cp_exchange == "te_allgather",
                   cp_gather_kept=cp_exchange == "flex_allgather",
                   moe_dispatcher=stack.moe_dispatcher, moe_overlap=stack.moe_overlap,
                   moe_load=costed_moe_load(model, par.ep, tr, padded),
                   fp8_tp_gather=stack.fp8_tp_gather and tr.precision is Precision.FP8,
                   tp_keeps_gathered_input=stack.tp_keeps_gathered_input and par.sp,
                   moe_padded=padded,
                   eager_ops=frozenset(G.eager_split(model, stack.eager_ops,
                                                     stack.eager_code)[0]),
                   eager_code=stack.eager_code,
                   loss_saved_bytes=stack.loss_saved_bytes,
                   loss_chunks=stack.loss_chunks_for(model),
                   qkv_views=stack.qkv_views,
                   expert_combine_bytes=stack.expert_combine_bytes,
                   scores_in_activation=stack.scores_in_activation,
                   per_op_reruns_all_to_all=(not stack.per_op_saves_all_to_all
                                             and stack.moe_dispatcher == "alltoall"))


def _no_round_off(part: float, whole: float) -> float:
    """``part`` of a step of ``whole`` seconds, made of differences: 0 where it is only their
    rounding (e.g. -5.6e-17 s of bubble)."""
    return 0.0 if abs(part) <= 1e-12 * abs(whole) else part


def layer_graph(model, par: Parallelism, tr, stack) -> G.ModelGraph:
    """``model``'s layer graph under ``par`` on ``stack`` (``local_strategy``), cached."""
    return G.build(model, local_strategy(model, par, tr, stack))


@cached(maxsize=256)
def model_flops_per_sequence(model, seq_len: int, span: int) -> float:
    """Forward + backward model FLOP of one sequence (full attention, no recomputation; the
    convention does not depend on the kernels)."""
    g = _flop_graph(model, seq_len, span)
    head = g.head_shared if model.tied_embeddings else g.head
    total = g.embedding.model_flops + head.model_flops
    return total + sum(g.block(i).model_flops for i in range(model.layers))


@cached(maxsize=256)
def logged_flops_per_sequence(model, seq_len: int, document_span: int | None = None) -> float:
    """Model FLOP of one sequence as Megatron-LM logs them since 8873b55d6a (2025-03-06:
    ``num_floating_point_operations``, megatron/training/training.py @ d98e8a64dd): every layer's
    attention over the whole sequence, windows aside, or with ``document_span`` within each
    document, as the export launches such a plan (--dataloader-inter-document-masking: THD
    sub-sequences, whose cu_seqlens feed the count, update_seqlen_stats_from_cu_seqlens in
    pretrain_gpt.py l.324-331, by their squared lengths' sum: a review's), and its
    core at half for the causal mask; a gated MLP counted as gated only under
    --swiglu (its ``gated_linear_multiplier``), which the export writes for SwiGLU alone: a
    GeLU-gated one (--quick-geglu, GPT-OSS's clamped one too) counts as two matrices, not three
    (a user trial: 27 % above the log for GPT-OSS)."""
    plain = model.without_local_attention()
    if model.gated and not (model.mlp is MLPKind.SWIGLU and not model.glu_clamp):
        plain = replace(plain, mlp=MLPKind.GELU, glu_clamp=0.0)
    span = document_span or 0
    g = _flop_graph(plain, seq_len, span)
    head = g.head_shared if model.tied_embeddings else g.head  # (with the MTP depths' attention)
    masked = 0.5 * (head.attention_model_flops
                    + sum(g.block(i).attention_model_flops for i in range(model.layers)))
    return model_flops_per_sequence(plain, seq_len, span) - (masked if model.causal else 0.0)


@cached(maxsize=256)
def torchtitan_flops_per_sequence(model, seq_len: int) -> float:
    """Model FLOP of one sequence as torchtitan 0.3 logs them: 6 per matmul parameter a token and
    every layer's attention unmasked over all ``training.seq_len`` tokens, whatever the document
    masks it runs (its own comment: "we follow the convention and do not account for sparsity in
    causal attention"; get_dense_model_nparams_and_flops, torchtitan/models/utils.py, torchtitan
    0.3.0 wheel), windows too (a long-context trial: a 8K-token span at 128K is logged 3 times
    what it runs)."""
    return model_flops_per_sequence(model.without_local_attention(), seq_len, 0)


def _megatron_differences(model, document_span: int | None) -> list[str]:
    out = []
    if document_span:  # (as the Megatron export launches it: masked per document)
        out.append("each layer's attention within each document (--dataloader-inter-document-"
                   "masking), its windows aside" if model.local_share else
                   "each layer's attention within each document (--dataloader-inter-document-"
                   "masking)")
    elif model.local_share:
        out.append("each layer's attention over all seq_len tokens, its windows aside")
    if model.causal:
        out.append("the attention core at half for the causal mask")
    if model.gated and not (model.mlp is MLPKind.SWIGLU and not model.glu_clamp):
        out.append("its GeLU-gated MLP (--quick-geglu) as ungated")
    return out


def _torchtitan_differences(model, document_span: int | None) -> list[str]:
    aside = [w for w, on in (("its document masks", document_span),
                             ("its windows", model.local_share)) if on]
    return ["each layer's attention over all seq_len tokens, unmasked"
            + (f", {' and '.join(aside)} aside" if aside else "")]


class FlopLog(NamedTuple):
    """How a framework logs model FLOP: its name, where in its code, its count of one sequence
    ``(model, seq_len, document_span)`` and how that differs from MFU's, in words."""

    name: str
    source: str
    count: Callable[..., float]
    differences: Callable[..., list[str]]


LOGGING_FRAMEWORKS = {
    "megatron": FlopLog("Megatron-LM", "num_floating_point_operations, megatron/training/"
                        "training.py, since 8873b55d6a", logged_flops_per_sequence,
                        _megatron_differences),
    "torchtitan": FlopLog("torchtitan", "get_dense_model_nparams_and_flops, torchtitan/models/"
                          "utils.py, 0.3.0", lambda m, seq, span: torchtitan_flops_per_sequence(
                              m, seq), _torchtitan_differences),
}
"""Export formats whose framework logs model FLOP/s otherwise than MFU's count can (``Evaluation.
logged_model_flops``), and how."""


def framework_flops_per_sequence(model, seq_len: int, document_span: int | None,
                                 export_format: str | None) -> float:
    """Model FLOP of one sequence as the framework of ``export_format`` logs them
    (``LOGGING_FRAMEWORKS``); MFU's count for the others."""
    log = LOGGING_FRAMEWORKS.get(export_format)
    return (log.count(model, seq_len, document_span) if log else
            model_flops_per_sequence(model, seq_len, document_span or 0))


def logged_flops_differences(model, document_span: int | None,
                             export_format: str = "megatron") -> list[str]:
    """How the framework of ``export_format`` counts this model's FLOP otherwise than MFU's count
    (``framework_flops_per_sequence``), in words, only what applies (a user trial's GLM-4.5
    export was told of a GeLU-gated MLP it does not have)."""
    return LOGGING_FRAMEWORKS[export_format].differences(model, document_span)


def flop_counts_differ(a: float, b: float) -> bool:
    """Two counts of a step's model FLOP differ by more than 0.05 % (more than rounding)."""
    return not math.isclose(a, b, rel_tol=5e-4)


class LoggedFlops(NamedTuple):
    """What a framework logs of a prediction's model FLOP/s (``logged_flops_said``)."""

    log: FlopLog
    differences: str
    """How its count differs from MFU's, in words."""
    tflops_per_gpu: float
    """Model TFLOP/s per GPU as it counts them, at the predicted step."""


def logged_flops_said(ev, export_format: str | None) -> LoggedFlops | None:
    """What the framework of ``export_format`` logs for ``ev``, where its count is another than
    MFU's (``result.flop_counts_differ``); None where it logs none or the counts agree (evaluate's
    and the exports' one test of it). Counted for ``export_format``, which may not be the stack's
    (a plan of one stack exported for another format had been told Megatron-LM would log
    torchtitan's count)."""
    if export_format not in LOGGING_FRAMEWORKS:
        return None
    sc, tr = ev.scenario, ev.scenario.training
    logged = tr.global_batch * framework_flops_per_sequence(sc.model, tr.seq_len,
                                                            tr.document_span, export_format)
    if not flop_counts_differ(logged, ev.model_flops):
        return None
    return LoggedFlops(LOGGING_FRAMEWORKS[export_format], "; ".join(
        logged_flops_differences(sc.model, tr.document_span, export_format)),
        logged / ev.step_time / ev.gpus / TFLOPS)


def _flop_graph(model, seq_len: int, span: int) -> G.ModelGraph:
    return G.build(model, G.Local(1, False, 1, 1, 1, 1, seq_len, G.Precision.BF16,
                                  G.AttentionImpl.FLASH, span=span))


def chunk_bounds(model, par: Parallelism) -> list[tuple[int, int]]:
    """[first, last) transformer blocks of every model chunk, in model order."""
    out, start = [], 0
    for n in blocks_per_chunk(model, par):
        out.append((start, start + n))
        start += n
    return out


def step_time(cc: D.ConfigCosts, x, y, e) -> float:
    """The step: the schedule with its fill and drain, the latest device's end, host overhead."""
    return span(list(x), list(y), cc.micro, cc.par.vp) + 2 * cc.fill + max(e) \
        + cc.sc.stack.step_overhead


def _contents(cc: D.ConfigCosts, bounds, stage: int):
    """(dense, moe, has embedding, has head) of every chunk of ``stage``."""
    par, kinds = cc.par, cc.graph.kinds
    last = par.pp * par.vp - 1
    out = []
    for c in par.pipeline.chunks_of(stage, par.pp, par.vp):
        a, b = bounds[c]
        n_moe = sum(1 for i in range(a, b) if kinds[i] is G.LayerKind.MOE)
        out.append((b - a - n_moe, n_moe, c == 0, c == last))
    return out


def _kinds(cc: D.ConfigCosts, dense, moe, emb, head):
    return [(n, kc) for n, kc in ((dense, cc.dense), (moe, cc.moe), (int(emb), cc.embedding),
                                  (int(head), cc.head)) if n and kc is not None]


def evaluate(sc: Scenario, par: Parallelism, *, stack_offers: bool = True) -> Evaluation:
    """Predict what ``par`` does on ``sc``; raises SpecError if the plan is invalid (or, unless
    ``stack_offers`` is False, one the scenario's stack does not offer: exports predict a plan
    of another framework with the plan's stack's behaviour)."""
    check_plan(sc, par, stack=stack_offers)
    if par.pipeline.mirrored:
        return _unfolded(evaluate(sc, fold(par), stack_offers=False), par)
    cc = D.config_costs(sc, par)
    pp, vp, micro, tr = par.pp, par.vp, cc.micro, sc.training
    bounds = chunk_bounds(sc.model, par)
    devices, contents, pols, chunk_times = [], [], [], []
    for s in range(pp):
        pol = sc.stack.policy_index(par.recompute_of(s))
        mine = _contents(cc, bounds, s)
        chunks = [D.chunk(cc, d, m, e, h) for d, m, e, h in mine]
        devices.append(D.device(cc, chunks, s))
        contents.append(mine)
        pols.append(pol)
        chunk_times.append((tuple(float(t.F[pol]) for t in devices[-1].chunks),
                            tuple(float(t.B[pol]) for t in devices[-1].chunks),
                            tuple(float(t.W[pol]) for t in devices[-1].chunks)))
    x = [float(d.X[p]) for d, p in zip(devices, pols)]
    y = [float(d.Y[p]) for d, p in zip(devices, pols)]
    e = [float(d.E[p]) for d, p in zip(devices, pols)]
    scheduled = span(x, y, micro, vp)
    step = step_time(cc, x, y, e)
    ids = stage_devices(par)
    stages = tuple(StageReport(
        index=s, blocks=tuple(bounds[c] for c in par.pipeline.chunks_of(s, pp, vp)),
        has_embedding=s == 0, has_head=par.pipeline.device_of(pp * vp - 1, pp) == s,
        time_per_microbatch=x[s],
        chunk_fwd=chunk_times[s][0], chunk_bwd=chunk_times[s][1], chunk_wgt=chunk_times[s][2],
        send=cc.boundary[s] if s < len(cc.boundary) else 0.0,
        end=float(devices[s].tail[pols[s]] + devices[s].opt[pols[s]]),
        memory=D.pick(devices[s].memory, pols[s]), recompute=sc.stack.recompute[pols[s]].name,
        devices=ids[s]) for s in range(pp))

    # breakdown: per-micro-batch work on the slowest device (``Evaluation.slowest_stage``, the
    # same first maximum), the end on the latest one
    k = max(range(pp), key=lambda i: x[i])
    j = max(range(pp), key=lambda i: e[i])
    compute = recompute = host = eager = 0.0
    exp = {Axis.TP: 0.0, Axis.CP: 0.0, Axis.EP: 0.0}
    link = dict(exp)
    for chunk in contents[k]:
        for n, kc in _kinds(cc, *chunk):
            compute += n * kc.compute
            eager += n * kc.eager
            # a forward run again waits on the host again: that wait is shown as host time
            again = float(kc.again[pols[k]]) * kc.host
            host += n * (kc.host + again)
            recompute += n * (kc.rc[pols[k]] - again)
            for ax, t in kc.exposed:
                exp[ax] += n * t
            for ax, t in kc.link:
                link[ax] += n * t
            for ax, t in kc.again_link[pols[k]]:  # forward collectives recomputation repeats
                link[ax] += n * t
    time = TimeBreakdown(
        compute=micro * compute, recompute=micro * recompute, host=micro * host,
        tp=micro * exp[Axis.TP], cp=micro * exp[Axis.CP], ep=micro * exp[Axis.EP],
        zero=micro * float(devices[k].zero_exposed[pols[k]]),
        # what send/recv adds to the slowest device's micro-batch beyond its compute
        pp=_no_round_off(2 * cc.fill + micro * (
            x[k] - float(devices[k].F[pols[k]] + devices[k].B[pols[k]])), scheduled),
        # the schedule's idle time, and the weight gradients it leaves after its span
        bubble=_no_round_off(scheduled - micro * x[k] + (e[j] - float(devices[j].tail[pols[j]])
                                                         - float(devices[j].opt[pols[j]])),
                             scheduled),
        dp=float(devices[j].tail[pols[j]] - devices[j].embedding_exposed[pols[j]]),
        embedding=float(devices[j].embedding_exposed[pols[j]]),
        optimizer=float(devices[j].opt[pols[j]]), step_host=sc.stack.step_overhead)
    uneven = _uneven_chunks(sc, par, stages, micro, step)
    if uneven:
        step += uneven
        time = replace(time, bubble=time.bubble + uneven)
    links = {ax.value: micro * t for ax, t in link.items()}
    # every micro-batch's activation and gradient over the busiest boundary, each chunk's (the
    # fill and drain are these same sends, not more: a user trial found them counted twice)
    links["pp"] = micro * 2 * cc.p2p_send
    # the gradient reduction and parameter gathers of the device whose step ends last (its
    # exposed part is ``time.dp``), with the per-micro-batch ZeRO traffic of the slowest one
    links["dp"] = (float(devices[j].sync_link + devices[j].gather_link)
                   + micro * float(devices[k].zero_link[pols[k]]))
    # (the same on the last stage, the all-reduce's other end; 0 without copies, as every axis
    # is given, so that a reader of the JSON finds the key)
    links["embedding"] = devices[0].embedding_link

    hw = sum(n * kc.hw_flops[pols[s]] for s in range(pp) for chunk in contents[s]
             for n, kc in _kinds(cc, *chunk))
    mflops = tr.global_batch * model_flops_per_sequence(sc.model, tr.seq_len,
                                                        tr.attention_span or 0)
    logged = tr.global_batch * framework_flops_per_sequence(sc.model, tr.seq_len,
                                                            tr.document_span,
                                                            sc.stack.export_format)
    return Evaluation(scenario=sc, plan=par, micro_batches=micro, step_time=step,
                      tokens_per_s=tr.global_batch * tr.seq_len / step, model_flops=mflops,
                      logged_model_flops=logged,
                      hardware_flops=hw * micro * par.dp * par.tp * par.cp, time=time,
                      link_time=links, stages=stages, eager_kernels=micro * eager,
                      last_stage=j, uneven_chunks=uneven)


def _uneven_chunks(sc: Scenario, par: Parallelism, stages, micro: int, step: float) -> float:
    """``Evaluation.uneven_chunks``: where a device's chunks hold different numbers of blocks, how
    much later the step ends with the schedule simulated from each chunk's own time (each stage's
    end after its last operation, the step's host time after that) than ``step``, the closed
    form's, which spreads each device's blocks evenly over its chunks; else 0. Where the chunks
    are even the two agree within 0.01 % on the catalog's stacks (a review, Llama 3 70B at vp 5
    and 10), not where a stack's send/recv does not overlap compute, which the closed form adds
    to every micro-batch and the simulation does not (up to 5 % less simulated), nor on a V (0.5 %
    less): there an excess that small is not seen. Simulating the even spread instead, as a
    baseline, moves the head's time off its chunk (40 ms more on that Llama 3 70B at vp 8)."""
    if not uneven_chunks(sc.model, par):
        return 0.0
    fwd, bwd, send, wgt = stage_times(stages)
    last = simulated_ends(fwd, bwd, micro, send, schedule=par.pipeline, wgt=wgt)
    simulated = max(e + s.end for e, s in zip(last, stages)) + sc.stack.step_overhead
    return max(0.0, simulated - step)


def _unfolded(ev: Evaluation, par: Parallelism) -> Evaluation:
    """A DualPipe plan's evaluation from its fold's (``specs.fold``): rank ``r`` is position
    ``min(r, pp - 1 - r)`` on its own devices, the send after it its real boundary's (the fold's
    boundary of the two it stands for, or the turn); a micro-batch passes one of its two stages,
    a fold's micro-batch (one from each end) both."""
    pp, ids = par.pp, stage_devices(par)
    folded = ev.stages

    def rank(r: int) -> StageReport:
        send = folded[min(r, pp - 2 - r)].send if r < pp - 1 else 0.0
        mine = folded[min(r, pp - 1 - r)]
        return replace(mine, index=r, devices=ids[r], send=send,
                       time_per_microbatch=mine.time_per_microbatch / 2)

    return replace(ev, plan=par, micro_batches=2 * ev.micro_batches,
                   stages=tuple(rank(r) for r in range(pp)))


def with_default_split(sc: Scenario, par: Parallelism) -> Evaluation | None:
    """``par`` evaluated with the default split of the blocks over its chunks
    (``specs.default_split``), or None where its split is that one already (``uneven_split``) or
    a stage cannot hold it (the search's and ``notes.plan.even_split_close``'s one way to
    ask)."""
    if uneven_split(sc.model, par) is None:
        return None
    try:
        return evaluate(sc, par.with_(stage_layers=None))
    except SpecError:
        return None


def evaluate_names(model: str, cluster: str, gpus: int, *, seq_len: int, global_batch: int,
                   precision: str = "bf16", **plan) -> Evaluation:
    """Evaluate from names: ``plan`` holds Parallelism keywords (``dp`` derived when omitted).

    ``recompute`` may be a string; it applies to every stage.
    """
    from .options import Precision

    sc = scenario_from_names(model, cluster, gpus, seq_len=seq_len, global_batch=global_batch,
                             precision=Precision.parse("precision", precision))
    if isinstance(plan.get("recompute"), str):
        plan["recompute"] = (plan["recompute"],)
    if "dp" not in plan:
        denom = plan.get("tp", 1) * plan.get("pp", 1) * plan.get("cp", 1)
        plan["dp"] = max(1, gpus // denom)
    return evaluate(sc, Parallelism(**plan))


def layer_time(sc: Scenario, par: Parallelism) -> float:
    """Forward + backward (+ recomputation) seconds of one transformer block per micro-batch."""
    tr, st = sc.training, sc.stack
    cluster = effective(sc.cluster, st)
    block = layer_graph(sc.model, par, tr, st).block(0)
    c = layer_cost(block, cluster.accelerator, cluster, layouts(par, cluster, sc.gpus), tr, st)
    return c.fwd + c.bwd + D.recompute_time(effect(st.policy(par.recompute_of(0)), block), c)
