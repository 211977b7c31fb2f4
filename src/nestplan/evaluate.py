"""Evaluate one plan: step time, throughput, MFU and memory on every pipeline stage.

Overlap assumptions (stated once, here and in the README):

* Tensor parallelism: forward collectives are exposed unless ``tp_overlap = full``; backward
  ones hide behind the weight-gradient GEMMs (``backward``, Megatron's default) or all backward
  GEMMs (``full``).
* Context parallelism: the K/V ring exchange hides behind the attention core.
* Expert parallelism: dispatch/combine all-to-alls are exposed.
* Pipeline: send/recv on the fill and drain path is exposed; in the steady state it overlaps
  compute when ``overlap_p2p`` (else it adds to every micro-batch).
* Data parallelism: the gradient reduction of each stage starts when that stage's last backward
  starts (``overlap_grad_reduce``) or ends; the step ends when the slowest stage's reduction ends.
  Stages that finish their backward early (the last stages of a pipeline) hide it in the drain.
* ZeRO-1 / distributed optimizer: parameters are all-gathered after the optimizer step, hidden
  behind the next step's first forward with ``overlap_param_gather``.
* ZeRO-2 reduce-scatters gradients every micro-batch, ZeRO-3 also all-gathers weights before each
  forward and backward (and recomputed forward): both prefetch layer by layer, so a micro-batch
  takes the longer of its compute and its communication plus one layer's communication.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from . import graph as G
from .axes import Axis
from .cost import memory as M
from .cost.compute import LayerCost, layer_cost
from .cost.network import collective_time, p2p_time
from .cost.overlap import exposed as overlap_exposed
from .cost.pipeline import chunks_in_flight, schedule_time
from .options import Recompute
from .placement import layouts
from .result import Evaluation, StageReport, TimeBreakdown
from .specs import Parallelism, Scenario, check_plan, even_split

ADAM_BYTES_PER_PARAM = 26  # read fp32 master, m, v; write them back; write the bf16 copy


@dataclass
class _Chunk:
    """Accumulated cost of one model chunk (a run of consecutive layers on one device)."""

    fwd: float = 0.0
    bwd: float = 0.0
    recompute: float = 0.0
    compute: float = 0.0
    exposed: dict | None = None
    link: dict | None = None
    params: float = 0.0
    expert_params: float = 0.0
    saved: float = 0.0  # activation bytes per micro-batch under the stage's recompute policy
    full_saved: float = 0.0  # largest single layer's saved bytes without recompute
    largest_weight: float = 0.0  # elements of the largest weight matrix (ZeRO-3 gather unit)
    internal: float = 0.0  # largest single layer's attention-core internals
    layers: int = 0
    model_flops: float = 0.0
    hw_flops: float = 0.0

    def add(self, layer: G.LayerGraph, cost: LayerCost, count: int, policy: Recompute):
        if count == 0:
            return
        rc = {Recompute.NONE: 0.0, Recompute.SELECTIVE: cost.recompute_selective,
              Recompute.FULL: cost.recompute_full}[policy]
        self.fwd += count * cost.fwd
        self.bwd += count * cost.bwd
        self.recompute += count * rc
        self.compute += count * cost.compute
        for ax, link, exp in cost.comm:
            self.link[ax] = self.link.get(ax, 0.0) + count * link * (
                2 if policy is Recompute.FULL else 1)
            self.exposed[ax] = self.exposed.get(ax, 0.0) + count * exp
        self.params += count * layer.params
        self.expert_params += count * layer.expert_params
        saved = {Recompute.NONE: layer.saved_bytes,
                 Recompute.SELECTIVE: layer.saved_bytes - layer.internal_bytes,
                 Recompute.FULL: layer.input_bytes}[policy]
        if layer.kind in (G.LayerKind.EMBEDDING, G.LayerKind.HEAD):
            saved = layer.saved_bytes  # these are never checkpointed
        self.saved += count * saved
        self.full_saved = max(self.full_saved, layer.saved_bytes if policy is Recompute.FULL else 0)
        self.internal = max(self.internal,
                            layer.internal_bytes if policy is Recompute.SELECTIVE else 0)
        self.layers += count
        self.largest_weight = max(self.largest_weight, layer.largest_weight)
        fwd_flops = sum(o.flops for o in layer.ops)
        bwd_flops = sum(o.bwd_flops for o in layer.ops)
        rc_flops = {Recompute.NONE: 0.0, Recompute.FULL: fwd_flops,
                    Recompute.SELECTIVE: sum(o.flops for o in layer.ops if o.name in
                                             ("attn_core", "attn_scores", "attn_pv"))}[policy]
        self.model_flops += count * layer.model_flops
        self.hw_flops += count * (fwd_flops + bwd_flops + rc_flops)


def local_strategy(par: Parallelism, tr) -> G.Local:
    """The layer-graph key of a plan: its intra-layer strategy and micro-batch shape."""
    return G.Local(par.tp, par.sp, par.cp, par.ep, par.expert_tp, par.mbs, tr.seq_len,
                   tr.precision, tr.attention, tr.attention_span or 0)


@lru_cache(maxsize=256)
def _model_flops_per_sequence(sc_model, seq_len, attention, span) -> float:
    g = G.build(sc_model, G.Local(1, False, 1, 1, 1, 1, seq_len, G.Precision.BF16, attention, span))
    head = g.head_shared if sc_model.tied_embeddings else g.head
    total = g.embedding.model_flops + head.model_flops
    total += sum(g.block(i).model_flops for i in range(sc_model.layers))
    return total


def evaluate(sc: Scenario, par: Parallelism) -> Evaluation:
    """Predict what ``par`` does on ``sc``; raises SpecError if the plan is invalid."""
    check_plan(sc, par)
    model, cluster, tr = sc.model, sc.cluster, sc.training
    acc = cluster.accelerator
    mg = G.build(model, local_strategy(par, tr))
    lay = layouts(par, cluster, sc.gpus)
    pp, vp = par.pp, par.vp
    n_chunks = pp * vp
    micro = tr.global_batch // (par.mbs * par.dp)
    split = par.stage_layers or even_split(model.layers, n_chunks)

    def cost(layer):
        return layer_cost(layer, acc, cluster, lay, tr)

    def dp_coll(kind: G.CollKind, dense_bytes: float, expert_bytes: float) -> float:
        """A data-parallel collective over the dense group and the expert group."""
        flat = tr.flat_dp_collectives
        return (collective_time(kind, dense_bytes, lay.dp, cluster, flat)
                + collective_time(kind, expert_bytes, lay.edp, cluster, flat))

    # ---- per chunk
    chunks: list[_Chunk] = []
    bounds: list[tuple[int, int]] = []
    start = 0
    for c in range(n_chunks):
        stage = c % pp
        policy = par.recompute_of(stage)
        ch = _Chunk(exposed={}, link={})
        end = start + split[c]
        n_moe = sum(1 for i in range(start, end) if mg.kinds[i] is G.LayerKind.MOE)
        ch.add(mg.dense, cost(mg.dense), end - start - n_moe, policy)
        if n_moe:
            ch.add(mg.moe, cost(mg.moe), n_moe, policy)
        if c == 0:
            ch.add(mg.embedding, cost(mg.embedding), 1, Recompute.NONE)
        if c == n_chunks - 1:
            head = mg.head_shared if pp == 1 else mg.head
            ch.add(head, cost(head), 1, Recompute.NONE)
        chunks.append(ch)
        bounds.append((start, end))
        start = end

    # ---- ZeRO-2/3 traffic per micro-batch, per chunk
    def zero_comm(ch: _Chunk, policy: Recompute) -> tuple[float, float]:
        if par.zero < 2:
            return 0.0, 0.0
        rs = dp_coll(G.CollKind.REDUCE_SCATTER, ch.params * tr.grad_bytes,
                     ch.expert_params * tr.grad_bytes)
        ag = 0.0
        if par.zero >= 3:
            ag = dp_coll(G.CollKind.ALL_GATHER, ch.params * M.WEIGHT_BYTES,
                         ch.expert_params * M.WEIGHT_BYTES)
        regather = ag if policy is Recompute.FULL else 0.0
        return ag, ag + regather + rs

    # ---- per device (stage) per micro-batch
    x, f_dev, b_dev, zero_exposed, zero_link = [], [], [], [], []
    for s in range(pp):
        f = b = ze = zl = 0.0
        for c in range(s, n_chunks, pp):
            ch = chunks[c]
            policy = par.recompute_of(s)
            ag_f, comm_b = zero_comm(ch, policy)
            per_layer = 1.0 / max(ch.layers, 1)
            cf = ch.fwd + overlap_exposed(ag_f, ch.fwd) + ag_f * per_layer
            cb = ch.bwd + ch.recompute + overlap_exposed(comm_b, ch.bwd + ch.recompute) + comm_b * per_layer
            ze += (cf - ch.fwd) + (cb - ch.bwd - ch.recompute)
            zl += ag_f + comm_b
            f += cf
            b += cb
        x.append(f + b)
        f_dev.append(f)
        b_dev.append(b)
        zero_exposed.append(ze)
        zero_link.append(zl)

    # ---- pipeline send/recv
    p2p_bytes = G.E * par.mbs * (tr.seq_len // par.cp) * model.hidden / (par.tp if par.sp else 1)
    bt = [p2p_time(p2p_bytes, bd.level, lambda j, bd=bd: bd.share[j] if j < len(bd.share) else 1.0,
                   cluster) for bd in lay.pp]
    # the fill (forward) and drain (backward) paths cross every chunk boundary once each
    fill = sum(bt[c % pp] for c in range(n_chunks - 1))
    steady_p2p = 0.0 if tr.overlap_p2p or pp == 1 else 2 * max(bt) * vp
    x = [xi + steady_p2p for xi in x]
    span = schedule_time(x, micro, vp)
    t_pipe = span + 2 * fill

    # ---- data-parallel gradient reduction at the end of the step
    end = t_pipe
    sync_link = 0.0
    slack = 0.0
    for s in range(pp):
        dev_params = sum(chunks[c].params for c in range(s, n_chunks, pp))
        dev_expert = sum(chunks[c].expert_params for c in range(s, n_chunks, pp))
        sync = 0.0
        if par.zero < 2:
            kind = G.CollKind.ALL_REDUCE if par.zero == 0 else G.CollKind.REDUCE_SCATTER
            sync = dp_coll(kind, dev_params * tr.grad_bytes, dev_expert * tr.grad_bytes)
        if model.tied_embeddings and pp > 1 and s in (0, pp - 1):
            emb = mg.embedding.params - (model.max_positions * model.hidden
                                         if model.position.value == "learned" else 0)
            sync += collective_time(G.CollKind.ALL_REDUCE, emb * tr.grad_bytes, lay.embedding,
                                    cluster)
        sync_link += sync
        window = b_dev[s] if tr.overlap_grad_reduce else 0.0
        end = max(end, t_pipe - slack + overlap_exposed(sync, window))
        slack += b_dev[s] / vp
    dp_exposed = end - t_pipe

    # ---- optimizer step and parameter all-gather (sharded optimizer)
    opt = 0.0
    gather_exposed = 0.0
    gather_link = 0.0
    for s in range(pp):
        dev_params = sum(chunks[c].params for c in range(s, n_chunks, pp))
        dev_expert = sum(chunks[c].expert_params for c in range(s, n_chunks, pp))
        shard = dev_params / (lay.dp.size if par.zero >= 1 else 1) + dev_expert / (
            lay.edp.size if par.zero >= 1 else 1)
        t_opt = shard * (ADAM_BYTES_PER_PARAM + tr.grad_bytes) / (
            acc.hbm_bandwidth * acc.memory_efficiency)
        ag = 0.0
        if par.zero in (1, 2):
            ag = dp_coll(G.CollKind.ALL_GATHER, dev_params * M.WEIGHT_BYTES,
                         dev_expert * M.WEIGHT_BYTES)
        gather_link += ag
        hidden = f_dev[s] / micro if tr.overlap_param_gather else 0.0
        opt = max(opt, t_opt)
        gather_exposed = max(gather_exposed, overlap_exposed(ag, hidden))
    step = end + opt + gather_exposed + tr.step_overhead

    # ---- memory per stage
    stages = []
    for s in range(pp):
        policy = par.recompute_of(s)
        held = chunks_in_flight(s, pp, vp, micro)
        dev_chunks = list(range(s, n_chunks, pp))
        params = sum(chunks[c].params for c in dev_chunks)
        eparams = sum(chunks[c].expert_params for c in dev_chunks)
        w, g, o = M.model_states(params, eparams, par.zero, lay.dp.size, lay.edp.size,
                                 tr.grad_bytes)
        acts = sum(n * chunks[c].saved for n, c in zip(held, dev_chunks))
        transient = max(max(chunks[c].full_saved, chunks[c].internal) for c in dev_chunks)
        if par.zero >= 3:  # gathered weights: the operator in use and the one prefetched
            transient += 2 * max(chunks[c].largest_weight for c in dev_chunks) * M.WEIGHT_BYTES
        if (n_chunks - 1) in dev_chunks:  # gradient of the fp32 logits in backward
            transient += G.FP32 * par.mbs * (tr.seq_len // par.cp) * G.padded_vocab(
                model.vocab, par.tp) / par.tp
        mem = M.MemoryBreakdown(weights=w, gradients=g, optimizer=o, activations=acts,
                                transient=transient, reserved=M.reserve(acts, transient))
        stages.append(StageReport(
            index=s,
            blocks=tuple(bounds[c] for c in dev_chunks),
            has_embedding=s == 0, has_head=(n_chunks - 1) % pp == s,
            time_per_microbatch=x[s], memory=mem, recompute=policy.value,
            devices=lay.stage_devices[s]))

    # ---- breakdown on the slowest device
    k = max(range(pp), key=lambda i: x[i])
    dev = [chunks[c] for c in range(k, n_chunks, pp)]
    exposed = {ax: sum(ch.exposed.get(ax, 0.0) for ch in dev) for ax in (Axis.TP, Axis.CP, Axis.EP)}
    compute = sum(ch.compute for ch in dev)
    recompute = sum(ch.recompute for ch in dev)
    time = TimeBreakdown(
        compute=micro * compute, recompute=micro * recompute,
        tp=micro * exposed[Axis.TP], cp=micro * exposed[Axis.CP], ep=micro * exposed[Axis.EP],
        zero=micro * zero_exposed[k], pp=2 * fill + micro * steady_p2p,
        bubble=span - micro * x[k], dp=dp_exposed,
        optimizer=opt + gather_exposed + tr.step_overhead)
    links = {}
    for ax in (Axis.TP, Axis.CP, Axis.EP):
        links[ax.value] = micro * sum(ch.link.get(ax, 0.0) for ch in dev)
    links["pp"] = 2 * fill + micro * 2 * max(bt, default=0.0) * vp
    links["dp"] = sync_link / pp + gather_link / pp + micro * zero_link[k]

    tokens = tr.global_batch * tr.seq_len
    mflops = tr.global_batch * _model_flops_per_sequence(model, tr.seq_len, tr.attention,
                                                           tr.attention_span or 0)
    hflops = sum(ch.hw_flops for ch in chunks) * micro * par.dp * par.tp * par.cp
    return Evaluation(scenario=sc, plan=par, micro_batches=micro, step_time=step,
                      tokens_per_s=tokens / step, model_flops=mflops, hardware_flops=hflops,
                      time=time, link_time=links, stages=tuple(stages))


def scenario_from_names(model: str, cluster: str, gpus: int, **training) -> Scenario:
    """A Scenario from catalog names (or file paths) and TrainingSpec keywords."""
    from .catalog import get_cluster, get_model
    from .specs import TrainingSpec

    return Scenario(model=get_model(model), cluster=get_cluster(cluster), gpus=gpus,
                    training=TrainingSpec(**training))


def evaluate_names(model: str, cluster: str, gpus: int, *, seq_len: int, global_batch: int,
                   precision: str = "bf16", **plan) -> Evaluation:
    """Evaluate from names: ``plan`` holds Parallelism keywords (``dp`` derived when omitted).

    ``recompute`` may be a string; it applies to every stage.
    """
    from .options import Precision

    sc = scenario_from_names(model, cluster, gpus, seq_len=seq_len, global_batch=global_batch,
                             precision=Precision.parse("precision", precision))
    if isinstance(plan.get("recompute"), str):
        plan["recompute"] = (Recompute.parse("recompute", plan["recompute"]),)
    if "dp" not in plan:
        denom = plan.get("tp", 1) * plan.get("pp", 1) * plan.get("cp", 1)
        plan["dp"] = max(1, gpus // denom)
    return evaluate(sc, Parallelism(**plan))


def layer_time(sc: Scenario, par: Parallelism) -> float:
    """Forward + backward (+ recomputation) seconds of one transformer block per micro-batch."""
    tr = sc.training
    block = G.build(sc.model, local_strategy(par, tr)).block(0)
    c = layer_cost(block, sc.cluster.accelerator, sc.cluster, layouts(par, sc.cluster, sc.gpus), tr)
    extra = {Recompute.NONE: 0.0, Recompute.SELECTIVE: c.recompute_selective,
             Recompute.FULL: c.recompute_full}[par.recompute_of(0)]
    return c.fwd + c.bwd + extra
