"""Cost of one pipeline device from what it holds: shared by ``evaluate`` and the search.

Everything that does not depend on the stage split is gathered once per plan configuration in
:class:`ConfigCosts`. A device holds ``vp`` model chunks; each chunk is a count of dense and MoE
blocks, plus the embedding (first chunk of the first device) or the head (last chunk of the last
device). The functions here take those counts as numbers or numpy arrays of any shape, so that
``evaluate`` (one plan) and the search (every split at once) compute the same thing.

Per micro-batch, a chunk takes ``fwd`` forward and ``bwd + recompute`` backward; ZeRO-2/3 adds
per-micro-batch traffic prefetched layer by layer (``overlap.exposed`` of it shows, plus one
layer's worth). Per device::

    X_i = sum over chunks (forward + backward) [+ steady-state send/recv both ways when not
          overlapped; when overlapped, at least one way's sends: the busiest boundary's]
    E_i = exposed gradient reduction after the last backward + optimizer step
          + exposed parameter all-gather (sharded optimizer)

and the step is ``m·max X + (sum X − max X)/v + fill/drain send/recv + max E + host overhead``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..caching import cached
from .. import graph as G
from ..axes import Axis
from ..placement import Layouts, layouts
from ..recompute import NONE, effect
from ..specs import ClusterSpec, Parallelism, Scenario, embedding_copies
from ..stack import StackSpec
from . import memory as M
from .compute import layer_cost
from .network import Coeffs, coeff_time, collective_coeffs, p2p_time
from .hardware import effective
from .overlap import exposed

Num = float | np.ndarray
"""A number, or an array of them (the search evaluates every split at once)."""


def optimizer_traffic(stack) -> float:
    """HBM bytes the Adam step moves per parameter: read the gradient; read and write the fp32
    master (or the stored fp32 parameter itself), m and v; write the bf16 copy when one is kept
    apart from the master."""
    fp32_states = 3
    bf16_copy = 0 if stack.params_are_master else M.COMPUTE_BYTES
    return 2 * G.FP32 * fp32_states + bf16_copy + stack.grad_bytes


MAX_ACTIVE_STAGES = 3
"""Model chunks torch's multi-chunk pipeline schedules keep unsharded at once
(``_add_unshard_reshard(max_active_stages=3)``, torch/distributed/pipelining/schedules.py, torch
2.13.0 wheel)."""


def zero3_forward_gathers(st, pp: int, zero: int, vp: int, micro: int) -> float:
    """ZeRO-3 weight gathers of a chunk's forward per micro-batch (its backward gathers once).
    One; but under a pipeline that defers the reduction (``StackSpec.defers_grad_sync``) a
    backward leaves the weights gathered, so a forward after one gathers nothing: every forward
    reshards and the op after it gathers, m + 1 gathers a step (counted on two gloo ranks under
    Schedule1F1B, tests/frameworks_fsdp_gathers.py), charged as the backward's one and 1/m
    forward's, where the schedule keeps all of a device's chunks unsharded
    (``MAX_ACTIVE_STAGES``). More chunks are charged as outside a pipeline, an upper estimate:
    reviewers' counts at 4 and 5 chunks per device found torch's schedules gathering 15-40 %
    more than m + 1 a chunk and up to 25 % less than two a micro-batch."""
    if st.defers_grad_sync(pp, zero) and vp <= MAX_ACTIVE_STAGES:
        return 1.0 / micro
    return 1.0


def least_zero3_forward_gathers(st, pp: int, zero: int, micro: int) -> float:
    """The fewest forward gathers per micro-batch that any number of chunks per device gives
    (one chunk: more can only add), a lower bound for a search that has not chosen vp yet."""
    return zero3_forward_gathers(st, pp, zero, 1, micro)


@dataclass(frozen=True)
class KindCost:
    """One layer kind under a configuration, per micro-batch on one device.

    Arrays are indexed by recompute policy, in the order of the stack's ``recompute``.
    """

    fwd: float
    bwd: float
    rc: np.ndarray
    again: np.ndarray
    """Share of the layer whose whole forward runs again (its weights gathered again)."""
    compute: float
    eager: float
    """The part of ``compute`` in eager kernels (``StackSpec.eager_ops``)."""
    wgrad: float
    """Weight-gradient part of ``bwd`` (what a split schedule runs as W)."""
    host: float
    params: float
    eparams: float
    block_params: float
    """Parameters of its transformer blocks, experts included: a block's own, a head's depths'
    blocks (``memory.fp8_weight_cache_bytes``), none of an embedding."""
    gather: float
    """Bytes per weight its ZeRO all-gathers move (``memory.gather_bytes``)."""
    saved: np.ndarray
    transient: np.ndarray
    """Working memory while this layer's backward runs (the recomputed activations)."""
    largest_weight: float
    exposed: tuple[tuple[Axis, float], ...]
    link: tuple[tuple[Axis, float], ...]
    again_link: tuple[tuple[tuple[Axis, float], ...], ...]
    """Per recompute policy, (axis, time on the link) of the forward collectives it runs again:
    the whole forward's under full recomputation, the recomputed modules' otherwise."""
    model_flops: float
    hw_flops: np.ndarray


def recompute_time(eff, cost) -> float:
    """Seconds backward spends running forward work again under a policy's ``effect`` (a
    ``recompute.Effect``) for a layer of ``cost`` (a ``compute.LayerCost``): the whole forward's
    share, the operators' shares and the forward collectives of the re-run modules and kinds."""
    return (eff.full * cost.fwd + sum(s * t for s, t in zip(eff.shares, cost.op_fwd))
            + sum(shown for m, k, _, shown, _ in cost.fwd_comms if eff.reruns(m, k)))


def recompute_link(eff, cost) -> tuple[tuple[Axis, float], ...]:
    """(axis, seconds on the links) of the forward collectives that ``recompute_time`` runs
    again: the whole forward's share, and the re-run modules' and kinds'."""
    rerun = {ax: eff.full * t for ax, t in cost.fwd_link}
    for m, k, ax, _, t in cost.fwd_comms:
        if eff.reruns(m, k):
            rerun[ax] = rerun.get(ax, 0.0) + t
    return tuple((ax, t) for ax, t in rerun.items() if t)


def _block_params(layer: G.LayerGraph) -> float:
    """Parameters of the transformer blocks ``layer`` runs, experts included
    (``KindCost.block_params``; ``LayerGraph.block_weights`` and a head's depths' experts)."""
    return layer.block_weights + layer.expert_params  # (a head's are its depths')


def _kind(layer: G.LayerGraph, cost, policies, checkpointable: bool,
          whole_block: bool, gather: float) -> KindCost:
    # hardware FLOP of the mean device: the busiest expert rank's extra load divided out
    mean = [1.0 / layer.expert_load if o.name.startswith("expert_") else 1.0 for o in layer.ops]
    full_fwd = sum(o.flops * w for o, w in zip(layer.ops, mean))
    bwd_flops = sum(o.bwd_flops * w for o, w in zip(layer.ops, mean))
    rc, saved, transient, again, rc_flops, again_link = [], [], [], [], [], []
    for pol in policies:  # the embedding and the head keep their tensors under every policy
        eff = effect(pol if checkpointable else NONE, layer)
        rc.append(recompute_time(eff, cost))
        again_link.append(recompute_link(eff, cost))
        rc_flops.append(eff.full * full_fwd + sum(s * o.flops * w
                                                  for s, o, w in zip(eff.shares, layer.ops, mean)))
        saved.append(eff.saved)
        transient.append(eff.transient)
        again.append(eff.full)
    return KindCost(
        fwd=cost.fwd, bwd=cost.bwd, rc=np.array(rc), again=np.array(again), compute=cost.compute,
        eager=cost.eager,
        wgrad=cost.wgrad, host=cost.host, params=layer.params, eparams=layer.expert_params,
        block_params=_block_params(layer), gather=gather, saved=np.array(saved),
        transient=np.array(transient),
        largest_weight=(layer.params + layer.expert_params) if whole_block
        else layer.largest_weight,
        exposed=tuple((ax, e) for ax, _, e in cost.comm),
        link=tuple((ax, li) for ax, li, _ in cost.comm),
        again_link=tuple(again_link),
        model_flops=layer.model_flops,
        hw_flops=np.array([full_fwd + bwd_flops + r for r in rc_flops]),
    )


@dataclass(frozen=True, eq=False)  # one per plan configuration (cached): identity is equality
class ConfigCosts:
    """Everything about a plan that does not depend on its stage split."""

    sc: Scenario
    par: Parallelism
    hw: ClusterSpec
    """The cluster as the stack runs it (``cost.hardware.effective``)."""
    lay: Layouts
    graph: G.ModelGraph
    dense: KindCost
    moe: KindCost | None
    embedding: KindCost
    head: KindCost
    micro: int
    boundary: tuple[float, ...]
    """Send/recv seconds of one micro-batch across each pipeline boundary."""
    fill: float
    """Send/recv on the fill (or drain) path: every chunk boundary once."""
    p2p_send: float
    """Seconds one micro-batch's chunks spend on the busiest boundary of the schedule, one way
    (each boundary carries an activation forward and a gradient back per chunk, in opposite
    directions of its full-duplex links)."""
    rs: tuple[Coeffs, Coeffs]
    """Reduce-scatter over the dense and expert data-parallel groups."""
    ag: tuple[Coeffs, Coeffs]
    ar: tuple[Coeffs, Coeffs]
    embedding_copy_ar: Coeffs
    """All-reduce between first and last stage of the embedding's gradient with its copy on the
    head's device (a tied output weight, or multi-token prediction's lookup table)."""
    embedding_copy_params: float
    """Elements of that gradient (0 when nothing is all-reduced)."""
    logits: float
    """Logits of one micro-batch on the head's device: its sequence shard times its share of the
    (padded) vocabulary."""

    @property
    def logits_bytes(self) -> float:
        """What the loss adds on the head's device at its backward's peak
        (``StackSpec.loss_transient_bytes`` per logit); over chunks of the sequence
        (``loss_chunks``), what its loop holds: one chunk's bf16 logits with what the loss keeps
        and works in, the chunk copies of the hidden states and the fp32 buffer their gradients
        go into (GradAccumulator, torchtitan/components/loss.py, 0.3.0 wheel), and where FSDP
        shards the output layer's gradient, that gradient whole: the loop turns its reduction
        off until the last chunk (``set_requires_gradient_sync(False)``, same file), so FSDP2
        accumulates it unsharded in fp32 beside each chunk's bf16 one (a review, measured with
        FSDP2 on one CPU rank; a pipeline that defers the reduction keeps it so anyway)."""
        st = self.sc.stack
        chunks = st.loss_chunks_for(self.sc.model)
        if chunks == 1:
            return st.loss_transient_bytes * self.logits
        par, tr, h = self.par, self.sc.training, self.sc.model.hidden
        tokens = par.mbs * (tr.seq_len // par.cp)
        vocab = self.logits / tokens  # the device's share of the (padded) vocabulary
        loop = (G.E + st.loss_saved_bytes + st.loss_transient_bytes) * self.logits \
            / chunks + (G.E + G.FP32) * tokens * h  # bytes
        if par.zero >= 2 and not st.defers_grad_sync(par.pp, par.zero):
            loop += (G.FP32 + G.E) * vocab * h  # the output layer's weights, whole
        return loop

    @property
    def overlaps_p2p(self) -> bool:
        """Whether the plan's steady-state send/recv overlaps compute: the stack's
        ``overlap_p2p``, on some stacks only with interleaving
        (``p2p_overlap_needs_interleaving``)."""
        st = self.sc.stack
        return st.overlap_p2p and (self.par.vp > 1 or not st.p2p_overlap_needs_interleaving)

    @property
    def steady_p2p(self) -> float:
        """Send/recv added to every micro-batch when it does not overlap compute: both ways,
        waited for one after the other."""
        return 0.0 if self.overlaps_p2p else 2 * self.p2p_send

    @property
    def p2p_floor(self) -> float:
        """A device's least time per micro-batch when send/recv overlaps compute: a slow link
        cannot hide behind less compute than it needs."""
        return self.p2p_send if self.overlaps_p2p else 0.0


def config_costs(sc: Scenario, par: Parallelism) -> ConfigCosts:
    """Build the split-independent costs of ``par`` (the plan must be valid)."""
    return _config_costs(sc, par.with_(stage_layers=None, recompute=("none",)))


@cached(maxsize=4096)
def _config_costs(sc: Scenario, par: Parallelism) -> ConfigCosts:
    from ..evaluate import layer_graph

    model, tr, st = sc.model, sc.training, sc.stack
    cluster = effective(sc.cluster, st)
    acc = cluster.accelerator
    mg = layer_graph(model, par, tr, st)
    lay = layouts(par, cluster, sc.gpus)

    def kind(layer, checkpointable=True):
        return _kind(layer, layer_cost(layer, acc, cluster, lay, tr, st), st.recompute,
                     checkpointable, st.gather_whole_block,
                     M.gather_bytes(layer, st, tr.precision, par.zero))

    pp, vp = par.pp, par.vp
    micro = tr.micro_batches(par.mbs, par.dp)
    nbytes = G.E * par.mbs * (tr.seq_len // par.cp) * model.hidden / (par.tp if par.sp else 1)
    boundary = tuple(p2p_time(nbytes, bd.level, bd.share, cluster) for bd in lay.pp)
    hops = par.hops()
    fill = sum(boundary[h] for h in hops)
    send = max((boundary[h] for h in hops), default=0.0) * vp if pp > 1 else 0.0
    flat = st.flat_dp_collectives

    def coeffs(kind_):
        return (collective_coeffs(kind_, lay.dp, cluster, flat),
                collective_coeffs(kind_, lay.edp, cluster, flat))

    # the embedding's gradient, summed with the head's copy
    embedding_copy_params = 0.0
    if embedding_copies(model, par):
        embedding_copy_params = mg.embedding.params - (
            model.position_rows(sc.training.seq_len) * model.hidden)
    head = mg.head_shared if par.head_beside_embedding else mg.head
    return ConfigCosts(
        sc=sc, par=par, hw=cluster, lay=lay, graph=mg, dense=kind(mg.dense),
        moe=kind(mg.moe) if mg.moe is not None else None,
        embedding=kind(mg.embedding, False), head=kind(head, False), micro=micro,
        boundary=boundary, fill=fill, p2p_send=send,
        rs=coeffs(G.CollKind.REDUCE_SCATTER), ag=coeffs(G.CollKind.ALL_GATHER),
        ar=coeffs(G.CollKind.ALL_REDUCE),
        embedding_copy_ar=collective_coeffs(G.CollKind.ALL_REDUCE, lay.embedding, cluster),
        embedding_copy_params=embedding_copy_params,
        logits=par.mbs * (tr.seq_len // par.cp) * G.padded_vocab(model.vocab, par.tp) / par.tp,
    )


@dataclass(frozen=True)
class Chunk:
    """Per-micro-batch totals of one chunk; ``rc``, ``again``, ``saved`` and ``transient`` have a
    trailing axis over the stack's recompute policies."""

    fwd: Num
    bwd: Num
    wgrad: Num
    rc: Num
    again: Num
    params: Num
    eparams: Num
    block_params: Num
    """Parameters of its transformer blocks, experts included (``KindCost.block_params``)."""
    gathered: Num
    egathered: Num
    """Bytes a ZeRO all-gather of the chunk's dense (expert) weights moves."""
    saved: Num
    transient: Num
    largest: Num
    layers: Num
    block_saved: Num
    """Bytes the chunk's heaviest block keeps per micro-batch (per policy), where the stack
    merges micro-batches (``merges_batches``; else 0, unused)."""


def _sum(*terms):
    out = 0.0
    for t in terms:
        out = out + t
    return out


def chunk(cc: ConfigCosts, dense, moe, emb: bool, head: bool) -> Chunk:
    """Totals of a chunk holding ``dense``/``moe`` blocks (numbers or arrays) and, if flagged,
    the embedding or the head; recompute-dependent fields get a trailing policy axis."""
    parts = [(np.asarray(dense, dtype=float), cc.dense)]
    if cc.moe is not None:
        parts.append((np.asarray(moe, dtype=float), cc.moe))
    block = 0.0  # the heaviest block present, which only a merged step holds beyond the count
    for n, k in parts if merges_batches(cc) else ():
        block = np.maximum(block, np.where((n > 0)[..., None], k.saved, 0.0))
    if emb:
        parts.append((np.asarray(1.0), cc.embedding))
    if head:
        parts.append((np.asarray(1.0), cc.head))
    transient = largest = again = 0.0
    for n, k in parts:
        present = (n > 0)
        transient = np.maximum(transient, np.where(present[..., None], k.transient, 0.0))
        again = np.maximum(again, np.where(present[..., None], k.again, 0.0))
        largest = np.maximum(largest, np.where(present, k.largest_weight, 0.0))
    return Chunk(
        fwd=_sum(*(n * k.fwd for n, k in parts)),
        bwd=_sum(*(n * k.bwd for n, k in parts)),
        wgrad=_sum(*(n * k.wgrad for n, k in parts)),
        rc=_sum(*(n[..., None] * k.rc for n, k in parts)),
        again=again,
        params=_sum(*(n * k.params for n, k in parts)),
        eparams=_sum(*(n * k.eparams for n, k in parts)),
        block_params=_sum(*(n * k.block_params for n, k in parts)),
        gathered=_sum(*(n * k.params * k.gather for n, k in parts)),
        egathered=_sum(*(n * k.eparams for n, k in parts)) * M.expert_gather_bytes(
            cc.sc.stack, cc.sc.training.precision, cc.par.zero),
        saved=_sum(*(n[..., None] * k.saved for n, k in parts)),
        transient=transient, largest=largest,
        layers=_sum(*(n for n, _ in parts)), block_saved=block,
    )


def _dp(coeffs: tuple[Coeffs, Coeffs], dense_bytes, expert_bytes):
    return coeff_time(coeffs[0], dense_bytes) + coeff_time(coeffs[1], expert_bytes)


@dataclass(frozen=True)
class Device:
    """One device's per-micro-batch time, end-of-step time and memory, per recompute policy
    (trailing axis)."""

    F: Num
    B: Num
    W: Num
    """The weight-gradient part of ``B`` (run apart by a split schedule)."""
    X: Num
    Y: Num
    """The device's share of the schedule's span beyond its bottleneck (``Schedule.bubble_share``:
    ``X`` unless the schedule defers weight gradients)."""
    E: Num
    """End of step after the schedule's span: the weight gradients the schedule leaves, the
    exposed gradient reduction and the optimizer."""
    tail: Num
    """Exposed data-parallel traffic at the step's end: the gradient reduction after the last
    backward and the sharded optimizer's parameter all-gather."""
    opt: Num
    """Optimizer step."""
    zero_exposed: Num
    """Exposed per-micro-batch ZeRO-2/3 traffic (in X)."""
    zero_link: Num
    sync_link: Num
    """Gradient reduction over the data-parallel groups on the links (no policy axis)."""
    embedding_link: float
    """The embedding copies' gradient all-reduce between the first and last stage on the links
    (``ConfigCosts.embedding_copy_ar``; 0 on other stages), kept apart from dp's (a datacenter
    trial read its spine traffic as dp's, whose groups stayed under a leaf)."""
    embedding_exposed: Num
    """Its part of the exposed ``tail``: what shows of the two reductions together, shared as
    their times on the links are."""
    gather_link: Num
    """Parameter all-gather on the links (no policy axis)."""
    memory: M.MemoryBreakdown | None
    chunks: list[ChunkTime]
    """Per-micro-batch time of each chunk (the parts of F and B)."""


@dataclass(frozen=True)
class ChunkTime:
    """Per-micro-batch seconds of one chunk on its device, per recompute policy (trailing axis)."""

    F: Num
    """Forward, with the exposed part of ZeRO-3's weight gathers."""
    B: Num
    """Backward and recomputation, with the exposed part of ZeRO-2/3 traffic."""
    W: Num
    """The weight-gradient compute inside ``B``."""
    zero_exposed: Num
    zero_link: Num


def chunk_time(cc: ConfigCosts, ch: Chunk) -> ChunkTime:
    """Forward and backward time of one micro-batch through chunk ``ch``."""
    par, st = cc.par, cc.sc.stack
    eff = st.overlap_efficiency
    rs = _dp(grad_sync_coefficients(cc), ch.params * st.grad_bytes, ch.eparams * st.grad_bytes) \
        if par.zero >= 2 and not st.defers_grad_sync(par.pp, par.zero) else 0.0 * ch.params
    ag = _dp(cc.ag, ch.gathered, ch.egathered) if par.zero >= 3 else 0.0 * ch.params
    rs, ag = np.asarray(rs)[..., None], np.asarray(ag)[..., None]
    # a recomputed forward gathers its weights again, except in an FSDP unit: there it runs
    # inside the unit's backward, after the backward's own gather (tests/test_framework_comm.py)
    again = 0.0 if st.gather_whole_block else ch.again
    ag_b = ag * (1.0 + again)
    comm_b = ag_b + rs
    ag_f = ag * zero3_forward_gathers(st, par.pp, par.zero, par.vp, cc.micro)
    per_layer = 1.0 / np.maximum(ch.layers, 1)[..., None]
    fwd = np.asarray(ch.fwd)[..., None]
    # what a stack does not overlap runs on the compute stream, all of it shown (DeepSpeed's
    # overlap_comm = false: ZeRO's gathers and reductions on the default stream)
    hid_f, hid_b = (ag_f, ag_b) if st.overlap_param_gather else (0.0, 0.0)
    hid_b = hid_b + (rs if st.overlap_grad_reduce else 0.0)
    # (what prefetching cannot hide, the first layer's share, only where it overlaps at all)
    extra_f = exposed(hid_f, fwd, eff) + (ag_f - hid_f) + hid_f * per_layer
    work_b = np.asarray(ch.bwd)[..., None] + ch.rc
    extra_b = exposed(hid_b, work_b, eff) + (comm_b - hid_b) + hid_b * per_layer
    B = work_b + extra_b
    return ChunkTime(F=np.broadcast_to(fwd + extra_f, np.shape(B)), B=B,
                     W=np.broadcast_to(np.asarray(ch.wgrad)[..., None], np.shape(B)),
                     zero_exposed=extra_f + extra_b, zero_link=ag_f + comm_b)


def grad_sync_kind(zero: int, st: StackSpec) -> G.CollKind:
    """The collective that reduces the data-parallel gradients at ZeRO stage ``zero``: an
    all-reduce without ZeRO, and under ZeRO-1/2 where the stack all-reduces each bucket
    (``StackSpec.zero_grad_allreduce``: DeepSpeed's), else a reduce-scatter (the one home of the
    choice: the cost here, the search's bounds in ``search.space``)."""
    allreduce = zero == 0 or (zero <= 2 and st.zero_grad_allreduce)
    return G.CollKind.ALL_REDUCE if allreduce else G.CollKind.REDUCE_SCATTER


def hides_optimizer_gather(st: StackSpec) -> bool:
    """Whether the sharded optimizer's gather of the updated weights may hide behind the next
    step's first forward (``overlap_param_gather``, unless ``optimizer_gather_waits``)."""
    return st.overlap_param_gather and not st.optimizer_gather_waits


def grad_sync_coefficients(cc: ConfigCosts):
    """``grad_sync_kind``'s coefficients over the plan's data-parallel groups."""
    return cc.ar if grad_sync_kind(cc.par.zero, cc.sc.stack) is G.CollKind.ALL_REDUCE else cc.rs


def device(cc: ConfigCosts, chunks: list[Chunk], stage: int, *,
           times: list[ChunkTime] | None = None, memory: bool = True) -> Device:
    """Cost of pipeline device ``stage`` holding ``chunks`` (in model order); ``times``: their
    ``chunk_time``s when already known; without ``memory`` the result's ``memory`` is None (the
    search's tables take memory apart, per device position)."""
    par, st, acc = cc.par, cc.sc.stack, cc.hw.accelerator
    F = B = W = zexp = zlink = 0.0
    times = times if times is not None else [chunk_time(cc, ch) for ch in chunks]
    for t in times:
        F, B, W = F + t.F, B + t.B, W + t.W
        zexp, zlink = zexp + t.zero_exposed, zlink + t.zero_link
    X = np.maximum(F + B, cc.p2p_floor) + cc.steady_p2p
    schedule = par.pipeline
    params = _sum(*(c.params for c in chunks))
    eparams = _sum(*(c.eparams for c in chunks))
    sync = 0.0 * params
    deferred = st.defers_grad_sync(par.pp, par.zero)
    if par.zero < 2 or deferred:
        coeffs = grad_sync_coefficients(cc)
        sync = _dp(coeffs, params * st.grad_bytes, eparams * st.grad_bytes)
    embedding = 0.0
    if cc.embedding_copy_params and stage in (0, par.pp - 1):
        embedding = coeff_time(cc.embedding_copy_ar, cc.embedding_copy_params * st.grad_bytes)
    # (a deferred reduction runs in a step of its own, after every backward: nothing hides it)
    both = np.asarray(sync + embedding)[..., None]
    tail = exposed(both, B if st.overlap_grad_reduce and not deferred else 0.0,
                   st.overlap_efficiency)
    # the embedding's share of what shows, as of the two reductions' time on the links
    # (both > 0 wherever there is an embedding reduction: sync is never negative)
    embedding_exposed = tail * (embedding / both) if embedding else 0.0 * tail
    sharded = st.optimizer_sharded(par.pp, par.zero)
    shard = params / (cc.lay.dp.size if sharded else 1) + eparams / (
        cc.lay.edp.size if sharded else 1)
    opt = np.asarray(shard * optimizer_traffic(st)
                     / (acc.hbm_bandwidth * acc.memory_efficiency))[..., None]
    # the updated weights gathered after the step (ZeRO-3 gathers them as they are used): data-
    # parallel traffic at the step's end, as the gradient reduction is (a user trial: shown as
    # the optimizer's, it moved with the network); hidden behind the next step's first forward
    # only where the step does not wait for it (StackSpec.optimizer_gather_waits)
    gather = _dp(cc.ag, _sum(*(c.gathered for c in chunks)),
                 _sum(*(c.egathered for c in chunks))) if sharded and par.zero < 3 \
        else 0.0 * params
    tail = tail + exposed(np.asarray(gather)[..., None],
                          F / cc.micro if hides_optimizer_gather(st) else 0.0,
                          st.overlap_efficiency)
    mem = memory_breakdown(memory_parts(cc, chunks, stage), held_in_flight(cc, stage)) \
        if memory else None
    shape = np.shape(X)

    def full(v):
        return np.broadcast_to(v, shape)

    return Device(F=full(F), B=full(B), W=full(W), X=X, Y=schedule.bubble_share(X, F, W),
                  E=full(tail + opt + schedule.tail(X, F, W, par.vp)), tail=full(tail), opt=full(opt),
                  zero_exposed=full(zexp), zero_link=full(zlink), sync_link=sync,
                  embedding_link=float(embedding), embedding_exposed=full(embedding_exposed),
                  gather_link=gather, memory=mem, chunks=times)


def held_in_flight(cc: ConfigCosts, stage: int) -> tuple[tuple[int, ...], ...]:
    """The mixes of micro-batches per chunk of pipeline device ``stage`` one of which it holds at
    its peak (``Schedule.held_states``; for the merged forward-backward of ``merges_batches``,
    see ``memory_breakdown``)."""
    par = cc.par
    return par.pipeline.held_states(stage, par.pp, par.vp, cc.micro)


def merges_batches(cc: ConfigCosts) -> bool:
    """The stack hides the expert exchange of one micro-batch behind another's compute:
    Megatron-Core's combined 1F1B runs the forward of one micro-batch and the backward of
    another layer by layer, forward layer i beside backward layer L - 1 - i, each backward layer
    freeing its state as it ends (``TransformerModelChunkSchedulePlan.run``,
    megatron/core/models/common/model_chunk_schedule_plan.py, megatron-core 0.16.1). The
    interleaved schedule runs one more warm-up forward first (``get_pp_rank_microbatches``,
    pipeline_parallel/schedules.py), so a merged step starts with as many micro-batches in flight
    as the interleaved schedule without the overlap holds at its peak; during it, the pair holds
    one more block of the forward's micro-batch than the backward has freed."""
    return cc.sc.stack.moe_overlap == "batch" and cc.moe is not None and cc.par.ep > 1


@dataclass(frozen=True)
class MemoryParts:
    """A device's memory apart from how many micro-batches it holds in flight."""

    weights: Num
    gradients: Num
    optimizer: Num
    transient: Num
    """Working bytes of its heaviest operator."""
    saved: list
    """Activation bytes one micro-batch leaves in each chunk."""
    stack: StackSpec
    """The stack (its memory reserve)."""
    loss: Num = 0.0
    """Bytes the loss adds at its backward's peak (the head's device)."""
    block: Num = 0.0
    """Bytes of a block's activations held beyond the schedule's count in a merged
    forward-backward step (``merges_batches``), which never meets the loss's peak."""
    merge_below: int = 0
    """Merged steps run where the device holds fewer micro-batch chunks than this at its peak
    (not when every micro-batch is in the warm-up: one alone, or few enough to interleave)."""
    gathered: Num = 0.0
    """ZeRO-3's gathered weights: the operator in use and the one prefetched."""


def memory_parts(cc: ConfigCosts, chunks: list[Chunk], stage: int) -> MemoryParts:
    par, st = cc.par, cc.sc.stack
    params = _sum(*(c.params for c in chunks))
    eparams = _sum(*(c.eparams for c in chunks))
    w, g, o = M.model_states(params, eparams, par.zero, cc.lay.dp.size, cc.lay.edp.size, st,
                             par.pp)
    cache = M.fp8_weight_cache_bytes(par.zero, st, cc.sc.training.precision)
    if cache:
        w = w + cache * _sum(*(c.block_params for c in chunks))
    transient = gathered = 0.0
    for c in chunks:
        transient = np.maximum(transient, c.transient)
    if par.zero >= 3:  # gathered weights: the operator in use and the one prefetched
        largest = 0.0
        for c in chunks:
            largest = np.maximum(largest, c.largest)
        gathered = 2 * np.asarray(largest)[..., None] * M.COMPUTE_BYTES
    # the head's device: what the loss adds at its backward's peak (loss_transient_bytes)
    loss = cc.logits_bytes if stage == par.pipeline.device_of(par.pp * par.vp - 1, par.pp) else 0.0
    block = 0.0
    for c in chunks:  # (0 unless the stack merges micro-batches)
        block = np.maximum(block, c.block_saved)

    def pol(v):
        return np.asarray(v)[..., None] * np.ones(len(st.recompute))

    return MemoryParts(pol(w), pol(g), pol(o), transient, [c.saved for c in chunks], st,
                       loss=loss, block=block,
                       merge_below=cc.micro * par.vp if merges_batches(cc) else 0,
                       gathered=gathered)


def memory_breakdown(parts: MemoryParts, held) -> M.MemoryBreakdown:
    """The device's memory at its heaviest of the mixes ``held`` (``held_in_flight``: each
    ``h[c]`` micro-batches of chunk ``c``). The merged step runs the loss's backward before its
    layers and the next forward's loss after them, so the extra block and the loss's bytes never
    coexist. The loss's bytes are added to a block operator's working memory although its
    backward frees them before any block's backward runs: the caching allocator keeps what they
    took, which the measured peaks (reserved bytes) show; taking the larger of the two put two
    of the ten development memory rows beyond 10 % (2026-12-05, a review's proposal)."""
    acts = _sum(*(n * s for n, s in zip(held[0], parts.saved)))
    for mix in held[1:]:  # (each mix's bytes; the heaviest is the peak)
        acts = np.maximum(acts, _sum(*(n * s for n, s in zip(mix, parts.saved))))
    merged = parts.block if max(map(sum, held)) < parts.merge_below else 0.0
    transient = parts.gathered + parts.transient + np.maximum(parts.loss, merged)
    return M.MemoryBreakdown(weights=parts.weights, gradients=parts.gradients,
                             optimizer=parts.optimizer, activations=acts,
                             transient=transient,
                             reserved=M.reserve(acts, transient, parts.stack))


def pick(mem: M.MemoryBreakdown, pol: int) -> M.MemoryBreakdown:
    """The breakdown of one policy as plain floats."""
    return M.MemoryBreakdown(**{f: float(np.asarray(getattr(mem, f))[..., pol]) for f in (
        "weights", "gradients", "optimizer", "activations", "transient", "reserved")})
