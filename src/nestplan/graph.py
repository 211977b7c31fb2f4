"""Layer graph: the operators of each layer of a model under a local (intra-layer) strategy.

For one device of a TP/SP/CP/EP group, each layer is a list of :class:`Op` (FLOPs, bytes moved,
tensors saved for backward) and :class:`Comm` (the collectives the layer triggers). Layers keep
their kind: embedding, dense block, MoE block, head. Symbols used below:

    b  micro-batch (sequences)      s  local sequence = seq_len / cp     T = b·s tokens
    h  hidden      a, g  query / key-value heads     d  head width        t  TP degree
    Tn tokens in the norm/dropout regions: T / t with sequence parallelism, else T
    e  bytes per activation element (2: bf16)

Saved-tensor accounting follows Korthikanti et al. 2022 (arXiv 2205.05198) §4: for the Megatron
GPT layer without parallelism it totals s·b·h·(34 + 5·a·s/h) bytes. The same per-tensor rules give
GQA (smaller K/V), gated MLPs (both fc1 outputs saved), MoE (top-k routed copies) and flash
attention (no s×s tensor; Q, K, V and the log-sum-exp kept).
"""

from __future__ import annotations

import enum
from functools import cached_property
from dataclasses import KW_ONLY, dataclass, replace
from typing import NamedTuple

from .caching import cached
from .axes import Axis
from .options import AttentionImpl, Position, Precision
from .specs import ModelSpec
from .stack import EAGER_OPS

E = 2  # bytes per bf16 activation element
FP32 = 4
VOCAB_MULTIPLE = 128  # Megatron pads the vocabulary to a multiple of 128·tp (make-vocab-size-divisible-by)
class EagerCode(NamedTuple):
    """A framework's eager kernels (``StackSpec.eager_ops``; ``Local.eager_code`` names it),
    counted op by op on its own code on CPU (every non-view ATen op's inputs and outputs, and what
    autograd keeps: tests/test_framework_traffic.py)."""

    passes: dict
    """Forward and backward passes over a tensor (bytes moved / 2 B per bf16 element) of each
    piece's kernels, where a fused kernel would read and write it once; a piece it runs no
    kernel for is absent (``eager_split``)."""
    clamp_keeps: float
    """Intermediates (tokens x ffn) its clamped GLU keeps for backward beyond the fc1 output (the
    clamp's input) and what the activation keeps (both halves, and silu's output where
    unfused)."""
    fc1_bias: bool
    """Its experts add fc1's bias as eager kernels too (``expert_bias``'s passes over the fc1
    output)."""


EAGER_CODES = {
    "megatron": EagerCode({"scaled_rope": (12.0, 14.0), "glu_clamp": (4.0, 7.5),
                           "expert_bias": (6.0, 5.0)}, clamp_keeps=0.0, fc1_bias=False),
    "torchtitan": EagerCode({"glu_clamp": (5.0, 22.0), "expert_bias": (4.0, 1.0)},
                            clamp_keeps=1.0, fc1_bias=True),
}
"""Megatron-Core 0.16: ``scaled_rope`` over q and k (the unfused RoPE: two products, a negation,
two concatenations and a sum, where the fused kernel reads and writes once); ``glu_clamp`` over
the gated MLP's fc1 output (two clamps and a concatenation forward, their masks and the split
backward); ``expert_bias`` over the experts' fc2 output (a product and a sum per expert and a
concatenation forward) with bf16 router probabilities, the router's dtype unless
``moe_router_dtype`` is set (megatron/core/transformer/moe/router.py), which Megatron-Bridge's
GPT-OSS recipes do not set (@ 067f987df0); fp32 probabilities would make it 14 / 14 passes;
fc1's bias is added inside its fused bias-activation.

torchtitan 0.3 (eager; ``GptOssGroupedExperts`` and ``swiglu``, torchtitan/models/gpt_oss/moe.py,
0.3.0 wheel): no ``scaled_rope``, YaRN's attention scale being folded into the softmax scale
(gpt_oss/model.py; "the rope stays a pure rotation", models/common/rope.py), so a scaled RoPE runs
no kernel an unscaled one does not; ``glu_clamp`` over the fc1 output, all of its clamped GLU
(strided halves, two clamps, the scaled sigmoid, a product and an addcmul forward, 15 passes over
the intermediate; 50 backward, the strided slices' gradients written whole and summed) beyond
the ``UNFUSED_GATED_PASSES`` the graph charges an unfused gated activation, keeping 6
intermediates in all (the fc1 output, both clamped halves, the sigmoid and its product), one more
than those the graph counts otherwise; ``expert_bias`` over the fc2 output and again over the fc1
output: each bias gathered to every routed token (``repeat_interleave``) and added, its gradient
summed back per expert (with TP, ``ScaleBiasForward`` divides fc2's bias over the fc2 output too,
about two passes not counted; ``slice_backward``'s zero fill, about one of the clamp's 22,
neither)."""
EAGER_PASSES = {code: c.passes for code, c in EAGER_CODES.items()}
"""Each framework's ``EagerCode.passes``."""
UNFUSED_GATED_PASSES = (5.0, 6.0)
"""Forward and backward passes over the intermediate (tokens x ffn) of an unfused gated
activation, silu(a) * b as two kernels (a and b read, silu's output written and read, the
product written; backward the same tensors and the two input gradients)."""
assert set(EAGER_PASSES["megatron"]) == set(EAGER_OPS) and all(
    set(table) <= set(EAGER_OPS) for table in EAGER_PASSES.values()), \
    "stack.EAGER_OPS names the pieces costed here"


class OpKind(enum.Enum):
    GEMM = "gemm"  # matmul: compute-bound, size-dependent efficiency, may run in fp8
    ATTENTION = "attention"  # fused flash-attention kernel
    MEMORY = "memory"  # elementwise / normalisation / softmax: HBM-bound


class LayerKind(enum.Enum):
    EMBEDDING = "embedding"
    DENSE = "dense"
    MOE = "moe"
    HEAD = "head"


BLOCK_KINDS = frozenset({LayerKind.DENSE, LayerKind.MOE})
"""The transformer blocks (what pipeline stages split), as opposed to the embedding and head."""
ATTENTION_CORE_OPS = frozenset({"attn_core", "attn_scores", "attn_pv"})
"""The operators of the attention core (fused; unfused, its two batched matmuls)."""


class CollKind(enum.Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"  # nbytes = gathered (output) size
    REDUCE_SCATTER = "reduce_scatter"  # nbytes = input (unreduced) size
    ALL_TO_ALL = "all_to_all"  # nbytes = data each device holds before the exchange
    RING_EXCHANGE = "ring_exchange"  # context-parallel K/V passing: nbytes per step, group-1 steps
    SEND_RECV = "send_recv"


class Hide(enum.Enum):
    """Which compute a collective may overlap with (decided by the training spec)."""

    NONE = "none"
    TP_FWD = "tp_fwd"  # forward TP collectives, hidden only with full TP overlap (userbuffers, SP)
    TP_BWD = "tp_bwd"  # backward TP collectives, hidden behind the weight-gradient GEMMs
    ATTENTION = "attention"  # CP K/V exchange, hidden behind the attention core
    ATTENTION_FIRST = "attention_first"  # CP K/V all-gather, hidden behind 1/cp of the core
    OTHER_BATCH = "other_batch"  # EP exchange, hidden behind another micro-batch's layer compute
    SHARED = "shared"  # EP exchange, hidden behind the shared experts' compute


@dataclass(frozen=True, slots=True)
class Op:
    """One operator on one device, per micro-batch."""

    name: str
    kind: OpKind
    flops: float = 0.0
    """Forward FLOP (actually executed: causal flash attention skips masked blocks)."""
    bwd_flops: float = 0.0
    """Backward FLOP."""
    nbytes: float = 0.0
    """Forward HBM traffic, bytes."""
    bwd_nbytes: float = 0.0
    """Backward HBM traffic, bytes."""
    call_flops: float = 0.0
    """FLOP of one GEMM call (sets its efficiency); for grouped GEMMs, one expert's call."""
    saved: float = 0.0
    """Bytes kept for backward."""
    modules: frozenset = frozenset()
    """The recompute modules it belongs to (``recompute.MODULES``: Megatron-Core's names; an op of
    the routed experts' activation is in both ``moe_act`` and ``moe``)."""
    saved_by: str = ""
    """The module that produced the tensor it saves ("" when produced outside every module, e.g.
    the layer input). Checkpointing a module drops what its own ops save of its own tensors;
    output-discarding checkpointing (``recompute.OUTPUT_DISCARDING``) drops its outputs wherever
    they are saved."""
    pinned: float = 0.0
    """Bytes a checkpoint of its module keeps alive beyond what it saves (the base storage of an
    input that is a view)."""
    out_bytes: float = 0.0
    """Bytes of its output (what per-op checkpointing keeps when it saves this op)."""
    matmuls: tuple[float, ...] = (1.0,)
    """The matmuls it runs as in eager model code, as shares of its output (fused QKV is wq, wk
    and wv; a gated fc1 is w1 and w3)."""
    model_flops: float = 0.0
    """Forward FLOP by the usual MFU convention (no recompute; attention over the span the model
    and workload attend: the whole sequence unless local or packed)."""
    shape: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """GEMM (m, k, n) on this device; zeros for other ops."""
    lowp: bool = False
    """GEMM that runs in the plan's matmul precision (fp8 when selected); others stay bf16."""
    eager: bool = False
    """Eager kernels a fused one would replace (``StackSpec.eager_ops``)."""
    unmasked: float = 0.0
    """Share of an attention core's FLOP in blocks no mask touches, which the kernel runs faster
    than the causal ones its efficiency is of (``AcceleratorSpec.unmasked_attention_gain``)."""


@dataclass(frozen=True, slots=True)
class Comm:
    """One collective on one device, per micro-batch."""

    name: str
    axis: Axis
    kind: CollKind
    nbytes: float
    phase: str  # "fwd" or "bwd"
    hide: Hide = Hide.NONE
    expert: bool = False
    """Runs in the expert mesh (a TP collective here uses the expert-TP group)."""
    module: str = ""
    """The recompute module whose forward it belongs to (run again when that module is)."""
    dedup: tuple[int, ...] = (0, 0)
    """(top-k, experts, router groups, groups chosen) of a dispatch that sends a token once per
    remote node, however many of its experts live there (DeepEP; ``network.crossing_share``);
    (0, 0) for a plain all-to-all."""


@dataclass(frozen=True, slots=True, eq=False)
class LayerGraph:
    """One layer on one device under a local strategy, per micro-batch.

    Compared and hashed by identity: ``build`` caches graphs, so equal layers are one object
    (cheap cache keys for the cost functions).
    """

    kind: LayerKind
    ops: tuple[Op, ...]
    comms: tuple[Comm, ...]
    params: float
    """Parameters stored on this device and replicated over data parallelism."""
    expert_params: float
    """Parameters of routed experts on this device (replicated over expert data parallelism)."""
    input_bytes: float
    """Bytes of the layer input (what full recomputation keeps)."""
    total_params: float
    """Parameters of the whole layer (all devices together, without replication)."""
    expert_load: float = 1.0
    """How far the routed experts' ops (``expert_*``) run above the mean device's work: the
    busiest expert rank's load (its time and memory); hardware FLOP counts divide it out."""
    depths: int = 0
    """A head's multi-token-prediction depths (``ModelSpec.mtp_layers``), each running
    ``depth_block``."""
    depth_block: LayerGraph | None = None
    """A head's multi-token-prediction block, else None."""
    depth_params: float = 0.0
    """Parameters on this device of a head's depths (their blocks, projections and norms)."""
    per_op_reruns: tuple[str, ...] = ()
    """Kinds of forward collectives (``CollKind`` values) a per-op selective checkpoint runs
    again beyond its all-gathers and all-reduces (``recompute``'s matmul-outputs rule)."""

    @property
    def moe_blocks(self) -> int:
        """MoE blocks it runs (one for an MoE block; a head's depths with an MoE block)."""
        if self.depth_block is not None:
            return self.depths * self.depth_block.moe_blocks
        return int(self.kind is LayerKind.MOE)

    @property
    def block_weights(self) -> float:
        """Parameters on this device, experts aside, of the transformer blocks it runs: a
        block's own, a head's multi-token-prediction depths' (with their projections); none of
        an embedding's or an output layer's. Transformer Engine's linear layers hold these (its
        fp8 copies and fp8 gathers: ``cost.memory``, the DeepSpeed export)."""
        return self.params if self.kind in BLOCK_KINDS else self.depth_params

    @property
    def largest_weight(self) -> float:
        """Elements of the largest weight matrix on this device (a GEMM's k·n)."""
        return max((o.shape[1] * o.shape[2] for o in self.ops if o.kind is OpKind.GEMM
                    and o.name not in ("attn_scores", "attn_pv")), default=0.0)

    @property
    def saved_bytes(self) -> float:
        return sum(op.saved for op in self.ops)

    @property
    def model_flops(self) -> float:
        """Forward + backward model FLOP of this device (3 × forward)."""
        return 3.0 * sum(op.model_flops for op in self.ops)

    @property
    def attention_model_flops(self) -> float:
        """The attention core's part of ``model_flops`` (QK^T and PV, unmasked)."""
        return 3.0 * sum(op.model_flops for op in self.ops if op.name in ATTENTION_CORE_OPS)


@dataclass(frozen=True)
class Local:
    """The local strategy a layer graph is built for (hashable cache key)."""

    tp: int
    sp: bool
    cp: int
    ep: int
    etp: int
    mbs: int
    seq_len: int
    precision: Precision
    attention: AttentionImpl
    _: KW_ONLY  # the rest, by the name of the stack field each copies where it copies one
    span: int = 0
    """Tokens a query attends to (packed documents); 0 = the whole sequence."""
    fused_norm: bool = True
    """Norms are fused kernels keeping only their input (the stack's ``fused_norm``)."""
    fused_gated_mlp: bool = True
    """The gated activation is one fused kernel (the stack's ``fused_gated_mlp``)."""
    norm_in_linear: bool = False
    """A norm read by one linear layer runs inside it (the stack's ``norm_in_linear``)."""
    cp_allgather: bool = False
    """Context parallelism all-gathers K/V (the stack's ``cp_exchange``) instead of a ring."""
    cp_gather_waits: bool = False
    """That all-gather is Transformer Engine's: waited for, forward and backward, and dK/dV
    reduce-scattered after the backward (``StackSpec.cp_exchange_for``)."""
    cp_gather_kept: bool = False
    """That all-gather is waited for before the attention, which keeps the gathered K/V for its
    backward (no gather there), and dK/dV are reduce-scattered after it (``flex_allgather``)."""
    moe_dispatcher: str = "alltoall"
    """How MoE tokens reach their experts (the stack's ``moe_dispatcher``)."""
    moe_overlap: str = "none"
    """What hides the expert-parallel exchange (the stack's ``moe_overlap``)."""
    moe_load: float = 1.0
    """The busiest expert rank's routed tokens over the mean (``TrainingSpec.moe_load``); with
    every expert's input padded (``moe_padded``), the capacity factor every rank computes."""
    tp_keeps_gathered_input: bool = False
    """Under sequence parallelism, column-parallel linears keep their all-gathered input (the
    stack's ``tp_keeps_gathered_input``)."""
    fp8_tp_gather: bool = False
    """Tensor-parallel all-gathers around fp8 linear layers move fp8 (the stack's
    ``fp8_tp_gather`` in fp8 training)."""
    moe_padded: bool = False
    """Every expert's input is padded to its capacity (``StackSpec.pads_experts``): ``moe_load``
    is the capacity factor, on one expert rank too."""
    eager_ops: frozenset = frozenset()
    """The model's pieces the stack runs as eager kernels of their own (``eager_split`` of
    ``StackSpec.eager_ops``)."""
    eager_code: str = "megatron"
    """Whose eager kernels those are (``EAGER_CODES``): ``StackSpec.eager_code``."""
    loss_saved_bytes: int = FP32
    """Bytes per logit element the loss keeps (the stack's ``loss_saved_bytes``)."""
    loss_chunks: int = 1
    """Chunks of the sequence the loss runs over, each with its backward at once (the stack's
    ``loss_chunks``)."""
    qkv_views: bool = True
    """q, k and v are views of the fused QKV output (the stack's ``qkv_views``)."""
    expert_combine_bytes: int = E
    """Bytes per element of the expert outputs a weighting combine keeps (the stack's
    ``expert_combine_bytes``)."""
    scores_in_activation: bool = True
    """A fused gated activation applies the routing scores (the stack's
    ``scores_in_activation``): the combine keeps nothing."""
    per_op_reruns_all_to_all: bool = False
    """A per-op selective checkpoint runs the expert exchange's all-to-alls again: the stack's
    ``per_op_saves_all_to_all`` off, with the ``alltoall`` dispatcher (DeepEP's and HybridEP's
    ops are on SelectiveAC's save list: a review's)."""


def padded_vocab(vocab: int, tp: int) -> int:
    """Megatron's padded vocabulary: a multiple of 128·tp."""
    m = VOCAB_MULTIPLE * tp
    return -(-vocab // m) * m


def _gemm(name: str, m: float, k: float, n: float, *, saved: float, lowp: bool = True,
          calls: float = 1.0, matmuls: tuple[float, ...] = (1.0,)) -> Op:
    """A matmul [m×k]·[k×n]; backward is two matmuls of the same size (dgrad and wgrad).

    ``lowp``: the GEMM runs in the plan's matmul precision. Transformer Engine runs the linear
    layers of a block in fp8; the router and the output layer stay in bf16.
    """
    flops = 2.0 * m * k * n
    traffic = E * (m * k + k * n + m * n)
    return Op(name, OpKind.GEMM, flops=flops, bwd_flops=2 * flops, nbytes=traffic,
              bwd_nbytes=2 * traffic, call_flops=flops / calls, saved=saved,
              model_flops=flops, shape=(m, k, n), lowp=lowp, out_bytes=E * m * n,
              matmuls=matmuls)


def _mem(name: str, elements: float, *, rw: float = 2.0, bwd_rw: float = 3.0,
         saved: float = 0.0) -> Op:
    """A memory-bound op touching ``elements`` bf16 values ``rw`` times forward, ``bwd_rw`` backward."""
    return Op(name, OpKind.MEMORY, nbytes=E * rw * elements, bwd_nbytes=E * bwd_rw * elements,
              saved=saved)


def eager_pieces(m: ModelSpec) -> tuple[str, ...]:
    """The pieces of ``m`` that a stack may run as eager kernels (``StackSpec.eager_ops``): its
    YaRN-scaled RoPE (not MLA's, which scales in its own path), the clamp of its clamped GLU, its
    experts' output bias."""
    return tuple(op for op, here in (
        ("scaled_rope", m.position is Position.ROPE and m.rope_mscale != 1 and m.mla is None),
        ("glu_clamp", bool(m.glu_clamp) and m.gated),
        ("expert_bias", m.biased_experts)) if here)


@cached(maxsize=256)  # in every layer-graph key (``evaluate.local_strategy``) of the search
def eager_split(m: ModelSpec, eager_ops, code: str = "megatron"
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``m``'s pieces (``eager_pieces``) that a stack with ``eager_ops`` runs as eager kernels in
    framework ``code``'s code, and those it runs fused; a piece the framework has no kernel for
    (``EAGER_PASSES[code]``: torchtitan's scaled RoPE) is in neither."""
    pieces = [p for p in eager_pieces(m) if p in EAGER_PASSES[code]]
    return (tuple(p for p in pieces if p in eager_ops),
            tuple(p for p in pieces if p not in eager_ops))


def _eager(x: "_Dims", name: str, kind: str, elements: float, saved: float = 0.0) -> Op:
    """The eager kernels of ``kind`` the stack's framework runs (``EAGER_PASSES``) over
    ``elements`` bf16 values."""
    rw, bwd_rw = EAGER_PASSES[x.loc.eager_code][kind]
    return replace(_mem(name, elements, rw=rw, bwd_rw=bwd_rw, saved=saved), eager=True)


class _Dims:
    """Local sizes of a layer under ``Local`` (see the module docstring for symbols)."""

    def __init__(self, m: ModelSpec, loc: Local):
        self.m, self.loc = m, loc
        self.eager = loc.eager_ops
        """The model's pieces this stack runs as eager kernels of their own (``Local.eager_ops``
        holds them split already: ``evaluate.local_strategy``)."""
        t = loc.tp
        self.t = t
        self.s = loc.seq_len // loc.cp
        self.S = loc.seq_len
        self.T = loc.mbs * self.s
        self.Tn = self.T / t if loc.sp else self.T
        self.Tg = self.T if loc.tp_keeps_gathered_input else self.Tn
        """Tokens of the input a column-parallel linear keeps for backward: its sequence shard
        under SP, unless the stack keeps the gathered input."""
        self.h = m.hidden
        self.a = m.heads / t
        self.g = float(m.kv_heads_per_rank(t))
        """KV heads a rank attends with: one when tp > kv_heads (its slice of the gathered
        projection: ``kv_gather``)."""
        self.kv_gather = m.kv_heads < t
        """Each rank projects 1/t of every head's queries, keys and values and all-gathers the
        projection over TP (Megatron-Core with tp > kv_heads: ``StackSpec.tp_beyond_kv_heads``)."""
        self.d = m.head_dim
        self.f = m.ffn_hidden / t
        self.V = padded_vocab(m.vocab, t) / t

    def tp_comms(self, name: str, *, column: bool, nbytes: float, lowp: bool = True) -> list[Comm]:
        """Collectives of a column- (input side) or row-parallel (output side) linear layer;
        ``lowp`` as for ``_gemm`` (its all-gathers move fp8 under ``Local.fp8_tp_gather``)."""
        if self.t == 1:
            return []
        if self.loc.sp and lowp and self.loc.fp8_tp_gather:
            return [replace(c, nbytes=c.nbytes / E) if c.kind is CollKind.ALL_GATHER else c
                    for c in self.tp_comms(name, column=column, nbytes=nbytes, lowp=False)]
        if column:  # identity forward; input-gradient all-reduce backward (SP: all-gather / RS)
            if self.loc.sp:  # gathered forward; a kept shard is gathered again backward
                again = [] if self.loc.tp_keeps_gathered_input else [
                    Comm(f"{name}.ag_bwd", Axis.TP, CollKind.ALL_GATHER, nbytes, "bwd", Hide.TP_BWD)]
                return [Comm(f"{name}.ag", Axis.TP, CollKind.ALL_GATHER, nbytes, "fwd", Hide.TP_FWD),
                        *again,
                        Comm(f"{name}.rs_bwd", Axis.TP, CollKind.REDUCE_SCATTER, nbytes, "bwd",
                             Hide.TP_BWD)]
            return [Comm(f"{name}.ar_bwd", Axis.TP, CollKind.ALL_REDUCE, nbytes, "bwd", Hide.TP_BWD)]
        if self.loc.sp:  # row-parallel: reduce forward; identity (SP: all-gather) backward
            return [Comm(f"{name}.rs", Axis.TP, CollKind.REDUCE_SCATTER, nbytes, "fwd", Hide.TP_FWD),
                    Comm(f"{name}.ag_bwd", Axis.TP, CollKind.ALL_GATHER, nbytes, "bwd", Hide.TP_BWD)]
        # without SP the forward all-reduce shows: the forward overlaps (Transformer Engine's
        # userbuffers, Megatron-Core's tp_comm_overlap; torch's async TP) split all-gathers and
        # reduce-scatters, which only sequence parallelism has
        return [Comm(f"{name}.ar", Axis.TP, CollKind.ALL_REDUCE, nbytes, "fwd", Hide.NONE)]


def _norm(name: str, x: "_Dims", elements: float) -> Op:
    """A norm over ``elements`` bf16 values. Fused (Apex, TE, or PyTorch's native LayerNorm
    kernel): reads and writes once, keeps its input. Unfused eager RMSNorm (``x.float()``,
    ``pow``, ``mean``, ``rsqrt``, ``mul``, ``type_as``, ``* weight``): six kernels over the
    tensor, and keeps the fp32 copy and the bf16 normalised values as well (6 bytes per
    element beside the input)."""
    if x.loc.fused_norm or x.m.norm.value == "layernorm":
        return _mem(name, elements, saved=E * elements)
    return _mem(name, elements, rw=9.0, bwd_rw=12.0, saved=(E + FP32 + E) * elements)


def _norm_params(m: ModelSpec, width: int | None = None) -> float:
    """Weights of one of the model's norms over ``width`` values (default: the hidden size):
    a LayerNorm's scale and bias, an RMSNorm's scale."""
    width = m.hidden if width is None else width
    return 2.0 * width if m.norm.value == "layernorm" else float(width)


def _attention(x: _Dims) -> tuple[list[Op], list[Comm], float, float]:
    """Attention sub-block: ops, comms, local params, total params."""
    m, loc = x.m, x.loc
    T, Tn, h = x.T, x.Tn, x.h
    ops: list[Op] = [_norm("ln_attn", x, Tn * h)]
    comms: list[Comm] = []
    block_in = E * T * h
    gemm_in = E * x.Tg * h  # under SP the shard (gathered again in backward) or the gathered input
    if m.mla is None:
        if x.kv_gather:  # a 1/t share of every head's projections, gathered below
            heads = m.heads + 2 * m.kv_heads
            qkv_out = heads * x.d / x.t
            parts = (m.heads / heads, m.kv_heads / heads, m.kv_heads / heads)
        else:
            qkv_out = (x.a + 2 * x.g) * x.d
            parts = (x.a / (x.a + 2 * x.g), x.g / (x.a + 2 * x.g), x.g / (x.a + 2 * x.g))
        ops.append(_gemm("qkv", T, h, qkv_out, saved=gemm_in, matmuls=parts))
        params = h * qkv_out + x.a * x.d * h
        total = h * (m.heads + 2 * m.kv_heads) * m.head_dim + m.heads * m.head_dim * h
        if m.bias or m.qkv_bias:
            params += qkv_out
            total += (m.heads + 2 * m.kv_heads) * m.head_dim
        if m.bias:  # the output projection's, whole on every rank
            params += h
            total += h
        d_qk, d_v = x.d, x.d
        q_el, k_el, v_el = T * x.a * x.d, T * x.g * x.d, T * x.g * x.d
        if m.qk_normed:  # a norm over each head's queries and one over its keys
            norm = _norm("qk_norm", x, q_el + k_el)
            if x.g > 1 and x.a > x.g and loc.qkv_views:
                # a rank's queries of several groups are gathered head by head into a copy
                # before their norm, which keeps the copy while k's view keeps the fused QKV
                # output alive (SelfAttention.get_query_key_value_tensors, query.reshape:
                # megatron/core/transformer/attention.py, megatron-core 0.16.1)
                norm = replace(norm, saved=norm.saved + E * q_el)
            ops.append(norm)
            if m.qk_norm:  # (the L2 norms have no weights)
                params += 2 * _norm_params(m, x.d)
                total += 2 * _norm_params(m, m.head_dim)
    else:
        la = m.mla
        d_qk, d_v = la.qk_nope_head_dim + la.qk_rope_head_dim, la.v_head_dim
        params = total = 0.0
        if la.q_lora_rank:
            ops += [_gemm("q_down", T, h, la.q_lora_rank, saved=gemm_in),
                    _norm("q_norm", x, T * la.q_lora_rank),
                    _gemm("q_up", T, la.q_lora_rank, x.a * d_qk, saved=E * T * la.q_lora_rank)]
            down = h * la.q_lora_rank + _norm_params(m, la.q_lora_rank)  # (not split by TP)
            params += down + la.q_lora_rank * x.a * d_qk
            total += down + la.q_lora_rank * m.heads * d_qk
        else:
            ops.append(_gemm("q", T, h, x.a * d_qk, saved=gemm_in))
            params += h * x.a * d_qk
            total += h * m.heads * d_qk
        kv_c = la.kv_lora_rank + la.qk_rope_head_dim
        up = la.qk_nope_head_dim + d_v
        ops += [_gemm("kv_down", T, h, kv_c, saved=0.0),  # shares its input with the query path
                _norm("kv_norm", x, T * la.kv_lora_rank),
                _gemm("kv_up", T, la.kv_lora_rank, x.a * up, saved=E * T * la.kv_lora_rank)]
        # the down and up projections have no biases; the output projection one under bias
        # (MLASelfAttention: bias=False on each but linear_proj, megatron-core 0.16.1)
        down = h * kv_c + _norm_params(m, la.kv_lora_rank)
        out_bias = h if m.bias else 0  # (whole on every TP rank, as a row-parallel layer's bias)
        params += down + out_bias + la.kv_lora_rank * x.a * up + x.a * d_v * h
        total += down + out_bias + la.kv_lora_rank * m.heads * up + m.heads * d_v * h
        q_el, k_el, v_el = T * x.a * d_qk, T * x.a * d_qk, T * x.a * d_v
    comms += x.tp_comms("qkv", column=True, nbytes=block_in)
    gathered = E * T * (m.heads + 2 * m.kv_heads) * x.d if x.kv_gather else 0.0
    if gathered:  # the attention waits for the gathered projection; its gradient for the RS
        comms += [Comm("qkv_out.ag", Axis.TP, CollKind.ALL_GATHER, gathered, "fwd"),
                  Comm("qkv_out.rs_bwd", Axis.TP, CollKind.REDUCE_SCATTER, gathered, "bwd")]
    if "scaled_rope" in x.eager:
        ops.append(_eager(x, "rope", "scaled_rope", q_el + k_el))
    elif m.position is Position.ROPE:
        ops.append(_mem("rope", q_el + k_el))
    # A checkpoint of the core keeps its inputs q, k, v. With RoPE, q and k are fresh rotated
    # copies while v stays a view of the fused QKV output, whose whole storage it keeps alive
    # (measured on Megatron-Core's layer: tests/frameworks_saved.py); QK norms keep the q and k
    # parts of that storage anyway (their inputs), so it costs nothing more there. Without the
    # checkpoint nothing pins it: Transformer Engine's attention finds fresh q, k beside a strided
    # v "not_supported" and makes all three contiguous before its kernel saves them (get_qkv_layout,
    # transformer_engine/pytorch/attention/dot_product_attention/utils.py @ NVIDIA/TransformerEngine
    # d0067d0da6; under CP, backends.py makes them contiguous too), so selective recomputation of
    # core_attn keeps more than none does (a long-context trial had expected the same or less)
    pinned = (E * (q_el + k_el) if m.position is Position.ROPE and m.mla is None
              and not m.qk_normed and loc.qkv_views else 0.0)
    if gathered and loc.qkv_views:  # v is a view of the whole gathered projection
        fresh = m.position is Position.ROPE and not m.qk_normed  # (q and k: rotated copies)
        pinned = gathered - E * (v_el if fresh else q_el + k_el + v_el)
    # attention core: scores over the full sequence S for the s local queries (CP splits queries)
    b, s, S = loc.mbs, x.s, x.S
    if loc.span:  # block-diagonal attention over packed documents
        S = min(S, loc.span)
    if m.local_span and m.local_share:  # chunked / sliding-window layers, averaged over blocks
        S = m.local_share * min(S, m.local_span) + (1 - m.local_share) * S
    full = 2.0 * b * x.a * s * S * (d_qk + d_v)  # QK^T and PV, no mask
    if loc.attention is AttentionImpl.FLASH:
        done = full * (0.5 if m.causal else 1.0)  # flash skips fully masked blocks
        # a ring over load-balanced causal chunks (two per rank, the i-th and the (2cp-1-i)-th)
        # runs its first step, the rank's own K/V, as one causal kernel, and its other cp - 1
        # steps with no mask: half the queries against whole chunks or whole queries against half
        # (Transformer Engine's AttnFuncWithCPAndKVP2P; torch's context_parallel alike); a
        # gathered K/V runs one masked kernel; windows are masked everywhere; packed documents
        # are costed as masked too (Transformer Engine's later ring steps run a padding mask
        # over them, nearly unmasked: a conservative simplification)
        ring = loc.cp > 1 and not (loc.cp_gather_kept or loc.cp_gather_waits)
        unmasked = (0.0 if loc.span or m.local_span else 1.0 if not m.causal
                    else 1 - 1 / loc.cp if ring else 0.0)
        lse = FP32 * b * x.a * s
        # the K/V it keeps: its own shard, or every CP rank's where it was given them gathered
        kv_kept = (k_el + v_el) * (loc.cp if loc.cp > 1 and loc.cp_gather_kept else 1)
        ops.append(Op("attn_core", OpKind.ATTENTION, flops=done, bwd_flops=2.5 * done,
                      nbytes=E * (q_el + k_el + v_el + T * x.a * d_v), bwd_nbytes=3 * E * (
                          q_el + k_el + v_el + T * x.a * d_v),
                      saved=E * (q_el + kv_kept), model_flops=full,
                      out_bytes=E * T * x.a * d_v + lse, pinned=pinned, unmasked=unmasked))
        # the fp32 log-sum-exp it keeps beside q, k, v: internal to the core
        ops.append(Op("attn_stats", OpKind.MEMORY, saved=lse))
    else:
        probs = b * x.a * s * S
        batch = b * x.a
        # Megatron's unfused DotProductAttention repeats K and V to every query head under GQA
        # (repeat_interleave) and the two batched matmuls keep the repeated copies
        k_rep, v_rep = T * x.a * d_qk, T * x.a * d_v
        if k_rep + v_rep > k_el + v_el:
            ops.append(_mem("kv_repeat", k_el + v_el + k_rep + v_rep, rw=1.0, bwd_rw=1.0,
                            saved=E * (k_rep + v_rep - k_el - v_el)))
        ops.append(Op("attn_scores", OpKind.GEMM, flops=full / 2, bwd_flops=full,
                      nbytes=E * (q_el + k_rep + probs), bwd_nbytes=2 * E * (q_el + k_rep + probs),
                      call_flops=full / 2 / batch, saved=E * (q_el + k_el), model_flops=full / 2,
                      pinned=pinned))
        # softmax keeps its output; dropout keeps a 1-byte mask and its output (Korthikanti §4.1)
        ops.append(_mem("softmax", probs, saved=E * probs))
        if m.dropout:
            ops.append(_mem("attn_dropout", probs, rw=2.5, bwd_rw=2.5, saved=(1 + E) * probs))
        ops.append(Op("attn_pv", OpKind.GEMM, flops=full / 2, bwd_flops=full,
                      nbytes=E * (probs + v_rep + T * x.a * d_v),
                      bwd_nbytes=2 * E * (probs + v_rep + T * x.a * d_v),
                      call_flops=full / 2 / batch, saved=E * v_el, model_flops=full / 2))
    if loc.cp > 1 and not loc.cp_allgather:  # ring: K/V passed on while each block computes
        kv_block = E * (k_el + v_el)
        comms += [Comm("cp_kv", Axis.CP, CollKind.RING_EXCHANGE, kv_block, "fwd", Hide.ATTENTION),
                  Comm("cp_kv_bwd", Axis.CP, CollKind.RING_EXCHANGE, 2 * kv_block, "bwd",
                       Hide.ATTENTION)]
    elif loc.cp > 1 and loc.cp_gather_kept:  # gathered once and kept; dK/dV scattered
        kv_block = E * (k_el + v_el)
        comms += [Comm("cp_kv_ag", Axis.CP, CollKind.ALL_GATHER, loc.cp * kv_block, "fwd",
                       Hide.NONE),
                  Comm("cp_dkv_bwd", Axis.CP, CollKind.REDUCE_SCATTER, loc.cp * kv_block, "bwd",
                       Hide.NONE)]
    elif loc.cp > 1 and loc.cp_gather_waits:  # TE's: gathered, then computed; dK/dV scattered
        kv_block = E * (k_el + v_el)
        comms += [Comm("cp_kv_ag", Axis.CP, CollKind.ALL_GATHER, loc.cp * kv_block, "fwd",
                       Hide.NONE),
                  Comm("cp_kv_ag_bwd", Axis.CP, CollKind.ALL_GATHER, loc.cp * kv_block, "bwd",
                       Hide.NONE),
                  Comm("cp_dkv_bwd", Axis.CP, CollKind.REDUCE_SCATTER, loc.cp * kv_block, "bwd",
                       Hide.NONE)]
    elif loc.cp > 1:  # torch's all-gather rotater: every K/V shard gathered behind the first
        # sub-attention, forward and again in backward; dK/dV still pass round a ring
        kv_block = E * (k_el + v_el)
        comms += [Comm("cp_kv_ag", Axis.CP, CollKind.ALL_GATHER, loc.cp * kv_block, "fwd",
                       Hide.ATTENTION_FIRST),
                  Comm("cp_kv_ag_bwd", Axis.CP, CollKind.ALL_GATHER, loc.cp * kv_block, "bwd",
                       Hide.ATTENTION_FIRST),
                  Comm("cp_dkv_bwd", Axis.CP, CollKind.RING_EXCHANGE, kv_block, "bwd",
                       Hide.ATTENTION)]
    ops.append(_gemm("proj", T, x.a * d_v, h, saved=E * T * x.a * d_v))
    comms += x.tp_comms("proj", column=False, nbytes=block_in)
    drop_mask = Tn * h if m.dropout else 0.0
    ops.append(_mem("resid_attn", Tn * h, rw=3.0 + (0.5 if m.dropout else 0), bwd_rw=3.0,
                    saved=drop_mask))
    params += _norm_params(m)
    total += _norm_params(m)
    if m.attention_sinks:  # one learned logit per head (tensor parallelism splits the heads)
        params += x.a
        total += m.heads
    return ops, comms, params, total


def _fc1_width(m: ModelSpec, ffn: float) -> float:
    """Outputs of an MLP's fc1 of width ``ffn``: both halves of a gated one."""
    return 2 * ffn if m.gated else ffn


def _mlp(x: _Dims, prefix: str, tokens: float, ffn_local: float, *, saved_in: float) -> list[Op]:
    """fc1 -> activation -> fc2 on ``tokens`` tokens with a local intermediate size."""
    m = x.m
    width = _fc1_width(m, ffn_local)
    act_saved = E * tokens * width  # GeLU keeps its input; gated kinds keep both halves
    rw, bwd_rw = (3.0 if m.gated else 2.0), 4.0
    if m.gated and not x.loc.fused_gated_mlp:  # silu(a) * b as two kernels: silu's output kept too
        act_saved += E * tokens * ffn_local
        rw, bwd_rw = UNFUSED_GATED_PASSES
    halves = (0.5, 0.5) if m.gated else (1.0,)  # eager gated MLPs run w1 and w3 apart
    clamp = []
    if "glu_clamp" in x.eager:
        # clamped halves concatenated anew: the activation keeps that copy, the clamps keep
        # their input (the fc1 output the activation would have kept)
        clamp = [_eager(x, f"{prefix}clamp", "glu_clamp", tokens * width, saved=E * tokens * (
            width + EAGER_CODES[x.loc.eager_code].clamp_keeps * ffn_local))]
    return [_gemm(f"{prefix}fc1", tokens, x.h, width, saved=saved_in, matmuls=halves), *clamp,
            _mem(f"{prefix}act", tokens * ffn_local, rw=rw, bwd_rw=bwd_rw, saved=act_saved),
            _gemm(f"{prefix}fc2", tokens, ffn_local, x.h, saved=E * tokens * ffn_local)]


def _mlp_params(m: ModelSpec, ffn: float, bias: bool | None = None) -> float:
    """Weights of an MLP of width ``ffn``, with biases where ``bias`` (default: the model's)."""
    mats = 3 if m.gated else 2
    p = mats * m.hidden * ffn
    if m.bias if bias is None else bias:
        p += _fc1_width(m, ffn) + m.hidden
    return p


def _block(x: _Dims, moe: bool) -> LayerGraph:
    m, loc = x.m, x.loc
    T, Tn, h = x.T, x.Tn, x.h
    ops, comms, params, total = _attention(x)
    ops.append(_norm("ln_mlp", x, Tn * h))
    params += _norm_params(m)
    total += _norm_params(m)
    expert_params = 0.0
    if not moe:
        ops += _mlp(x, "", T, x.f, saved_in=E * x.Tg * h)
        comms += x.tp_comms("fc1", column=True, nbytes=E * T * h)
        comms += x.tp_comms("fc2", column=False, nbytes=E * T * h)
        params += _mlp_params(m, x.f)
        total += _mlp_params(m, m.ffn_hidden)
    else:
        mo = m.moe
        ep, etp = loc.ep, loc.etp
        k = mo.top_k
        # the router keeps its input, the normed hidden states (the shared experts read the same
        # tensor); measured on Megatron-Core's MoE layer (tests/frameworks_saved.py)
        ops.append(_gemm("router", Tn, h, mo.experts, saved=E * Tn * h, lowp=False))
        ops.append(_mem("router_softmax", Tn * mo.experts, saved=FP32 * Tn * mo.experts))
        routed = Tn * k  # token copies leaving this device
        # one EP rank holds every expert: no busiest one, unless every expert is padded
        load = loc.moe_load if ep > 1 or loc.moe_padded else 1.0
        X = routed * etp * load  # copies the busiest device computes
        local_experts = mo.experts / ep
        f_e = mo.ffn_hidden / etp
        ops.append(_mem("permute", routed * h, saved=0.0))
        if mo.scores_on_input:  # Llama 4: the scores scale the permuted tokens, and the product
            # keeps its unscaled input for the scores' gradient (Megatron-Core's
            # moe_apply_probs_on_input, experts.py @ NVIDIA/Megatron-LM d98e8a64dd)
            ops.append(_mem("scale_input", X * h, saved=E * X * h))
        tokens_per_call = X / local_experts
        mlp = _mlp(x, "expert_", X, f_e, saved_in=E * X * h)
        # grouped GEMM: efficiency set by one expert's share of the tokens; it reads every local
        # expert's weight (forward, and dgrad and wgrad backward), not one
        mlp = [replace(o, call_flops=o.call_flops * tokens_per_call / X,
                       nbytes=o.nbytes + (local_experts - 1) * E * o.shape[1] * o.shape[2],
                       bwd_nbytes=o.bwd_nbytes + 2 * (local_experts - 1) * E * o.shape[1]
                       * o.shape[2]) if o.kind is OpKind.GEMM else o for o in mlp]
        ops += mlp
        if "expert_bias" in x.eager:  # fc2's bias, added per expert (and fc1's, where eager)
            ops.append(_eager(x, "expert_bias", "expert_bias", X * h))
            if EAGER_CODES[x.loc.eager_code].fc1_bias:
                ops.append(_eager(x, "expert_fc1_bias", "expert_bias", X * _fc1_width(m, f_e)))
        # Megatron-Core's fused (weighted) SwiGLU applies the routing probabilities inside the
        # expert activation, so the unpermute keeps only indices; unfused code multiplies the
        # expert outputs by the probabilities there and keeps them (measured on Megatron-Core's
        # MoE layer: tests/frameworks_saved.py)
        kept = 0.0 if mo.scores_on_input or (x.loc.fused_gated_mlp and x.loc.scores_in_activation
                                             and m.gated) \
            else x.loc.expert_combine_bytes * routed * h  # (scores on the input: none to weight)
        ops.append(_mem("unpermute", routed * h, saved=kept))
        if ep > 1:
            comms += _dispatch(x, routed, Tn)
        if etp > 1:
            comms += [Comm("etp_ag", Axis.TP, CollKind.ALL_GATHER, E * X * h, "fwd", expert=True),
                      Comm("etp_rs", Axis.TP, CollKind.REDUCE_SCATTER, E * X * h, "fwd", expert=True),
                      Comm("etp_ag_bwd", Axis.TP, CollKind.ALL_GATHER, E * X * h, "bwd", expert=True),
                      Comm("etp_rs_bwd", Axis.TP, CollKind.REDUCE_SCATTER, E * X * h, "bwd", expert=True)]
        expert_params = local_experts * _mlp_params(m, f_e, m.biased_experts)
        router = (h + (1 if m.bias else 0)) * mo.experts  # (add_bias_linear gives it a bias)
        params += router
        total += router + mo.experts * _mlp_params(m, mo.ffn_hidden, m.biased_experts)
        if mo.shared_experts:
            f_sh = mo.shared_experts * (mo.shared_ffn_hidden or mo.ffn_hidden)
            ops += _mlp(x, "shared_", T, f_sh / x.t, saved_in=0.0)
            # a tensor-parallel MLP like the dense one, with its collectives
            comms += x.tp_comms("shared_fc1", column=True, nbytes=E * T * h)
            comms += x.tp_comms("shared_fc2", column=False, nbytes=E * T * h)
            params += _mlp_params(m, f_sh / x.t)
            total += _mlp_params(m, f_sh)
            if mo.shared_expert_gate:
                # sigmoid(x·w) per token scales the shared output; the product keeps that output
                # (sequence-sharded under SP) and the scores; the gate's input is the router's
                ops += [_gemm("shared_gate", Tn, h, 1, saved=0.0, lowp=False),
                        _mem("shared_gate_mul", Tn * h, rw=3.0, saved=E * Tn * (h + 1))]
                params += h
                total += h
    drop_mask = Tn * h if m.dropout else 0.0
    ops.append(_mem("resid_mlp", Tn * h, rw=3.0 + (0.5 if m.dropout else 0), bwd_rw=3.0,
                    saved=drop_mask))
    return LayerGraph(LayerKind.MOE if moe else LayerKind.DENSE,
                      _tagged(ops, m.mla is not None, _fused_norms(loc, m, moe)),
                      tuple(replace(c, module=_COMM_MODULE.get(c.name.split(".")[0], ""))
                            for c in comms), params, expert_params, E * Tn * h, total,
                      # padded to capacity, every device computes its capacity alike
                      expert_load=(loc.moe_load if moe and loc.ep > 1 and not loc.moe_padded
                                   else 1.0),
                      per_op_reruns=((CollKind.ALL_TO_ALL.value,)
                                     if moe and loc.per_op_reruns_all_to_all else ()))


def _dispatch(x: "_Dims", routed: float, tokens: float) -> list[Comm]:
    """The expert-parallel exchange of one MoE layer, as the stack's dispatcher runs it
    (Megatron-Core ``--moe-token-dispatcher-type``, megatron/core/transformer/moe/README.md @
    NVIDIA/Megatron-LM d98e8a64dd): ``alltoall`` sends each routed token copy to its expert's
    rank and back; ``allgather`` gathers every rank's tokens (not their copies) over the EP group
    and reduce-scatters the outputs; ``flex`` (DeepEP) sends a token once per remote node and
    forwards it inside the node over NVLink."""
    m, loc = x.m, x.loc
    hide = {"batch": Hide.OTHER_BATCH, "shared": Hide.SHARED}.get(loc.moe_overlap, Hide.NONE)
    if loc.moe_dispatcher == "allgather":
        gathered = E * tokens * m.hidden * loc.ep
        return [Comm("dispatch", Axis.EP, CollKind.ALL_GATHER, gathered, "fwd", hide),
                Comm("combine", Axis.EP, CollKind.REDUCE_SCATTER, gathered, "fwd", hide),
                Comm("dispatch_bwd", Axis.EP, CollKind.REDUCE_SCATTER, gathered, "bwd", hide),
                Comm("combine_bwd", Axis.EP, CollKind.ALL_GATHER, gathered, "bwd", hide)]
    dedup = (m.moe.top_k, m.moe.experts, m.moe.router_groups, m.moe.router_group_top_k) \
        if loc.moe_dispatcher == "flex" else (0, 0)
    # the busiest rank receives the most (ep > 1); padded, every rank receives its capacity
    nbytes = E * routed * m.hidden * loc.moe_load
    return [Comm(name, Axis.EP, CollKind.ALL_TO_ALL, nbytes, phase, hide, dedup=dedup)
            for name, phase in (("dispatch", "fwd"), ("combine", "fwd"), ("dispatch_bwd", "bwd"),
                                ("combine_bwd", "bwd"))]


def _op_tags(mla: bool) -> dict[str, tuple[frozenset, str]]:
    """Op name -> (recompute modules it is in, module that produced what it saves), after
    Megatron-Core's transformer layer (megatron/core/transformer: the submodules its
    ``--recompute-modules`` name)."""
    up = "mla_up_proj" if mla else ""  # what produces q, k, v for the attention core

    def t(*mods):
        return frozenset(mods)
    return {
        "ln_attn": (t("layernorm"), ""), "ln_mlp": (t("layernorm"), ""),
        "qkv": (t(), "layernorm"), "q": (t(), "layernorm"), "q_down": (t(), "layernorm"),
        "q_up": (t("mla_up_proj"), ""), "kv_up": (t("mla_up_proj"), ""),
        "rope": (t("mla_up_proj") if mla else t(), ""),
        "attn_core": (t("core_attn"), up), "attn_scores": (t("core_attn"), up),
        "attn_pv": (t("core_attn"), up), "attn_stats": (t("core_attn"), "core_attn"),
        "kv_repeat": (t("core_attn"), "core_attn"), "softmax": (t("core_attn"), "core_attn"),
        "attn_dropout": (t("core_attn"), "core_attn"), "proj": (t(), "core_attn"),
        "fc1": (t("mlp"), "layernorm"), "act": (t("mlp"), "mlp"), "fc2": (t("mlp"), "mlp"),
        # a clamp's saved bytes stand for the clamped copy the activation keeps (made inside the
        # recomputed module), the activation's for the fc1 output the clamps keep
        "clamp": (t("mlp"), "mlp"), "expert_clamp": (t("moe", "moe_act"), "moe_act"),
        "shared_clamp": (t("moe", "shared_experts"), "shared_experts"),
        "expert_bias": (t("moe"), "moe"),
        "router": (t("moe"), "layernorm"), "router_softmax": (t("moe"), "moe"),
        "permute": (t("moe"), "moe"), "scale_input": (t("moe"), "moe"),
        "expert_fc1": (t("moe"), "moe"),
        "expert_act": (t("moe", "moe_act"), "moe"), "expert_fc2": (t("moe"), "moe_act"),
        "unpermute": (t("moe"), "moe"),
        "shared_fc1": (t("moe", "shared_experts"), "layernorm"),
        "shared_act": (t("moe", "shared_experts"), "shared_experts"),
        "shared_fc2": (t("moe", "shared_experts"), "shared_experts"),
        "shared_gate": (t("moe", "shared_experts"), "layernorm"),
        "shared_gate_mul": (t("moe", "shared_experts"), "shared_experts"),
    }


def _fused_norms(loc: Local, m: ModelSpec, moe: bool) -> frozenset[str]:
    """The block's norms that run inside the linear layer reading them (``Local.norm_in_linear``):
    the attention's input norm but MLA's, and a dense block's pre-MLP norm."""
    if not loc.norm_in_linear:
        return frozenset()
    return frozenset(([] if m.mla is not None else ["ln_attn"]) + ([] if moe else ["ln_mlp"]))


FUSED_NORM_READERS = {"ln_attn": ("qkv", "q"), "ln_mlp": ("fc1",)}
"""The linear layers a norm fused into them (``_fused_norms``) runs in."""


def _tagged(ops: list[Op], mla: bool, fused: frozenset[str] = frozenset()) -> tuple[Op, ...]:
    tags = dict(_op_tags(mla))
    for norm in fused:  # no module: the layernorm recompute module leaves it and its output
        tags[norm] = (frozenset(), "")
        for reader in FUSED_NORM_READERS[norm]:
            tags[reader] = (tags[reader][0], "")
    return tuple(replace(o, modules=tags[o.name][0], saved_by=tags[o.name][1])
                 if o.name in tags else o for o in ops)


_COMM_MODULE = {"cp_kv": "core_attn", "cp_kv_bwd": "core_attn", "cp_kv_ag": "core_attn",
                "cp_kv_ag_bwd": "core_attn", "cp_dkv_bwd": "core_attn", "fc1": "mlp",
                "fc2": "mlp", "dispatch": "moe", "combine": "moe", "dispatch_bwd": "moe",
                "combine_bwd": "moe", "etp_ag": "moe", "etp_rs": "moe", "etp_ag_bwd": "moe",
                "etp_rs_bwd": "moe", "shared_fc1": "shared_experts",
                "shared_fc2": "shared_experts"}
"""Collective (by name before its first dot) -> the recompute module whose forward it is in."""


def _embedding(x: _Dims) -> LayerGraph:
    m = x.m
    T, Tn, h = x.T, x.Tn, x.h
    ops = [_mem("embed_lookup", T * h, rw=2.0, bwd_rw=2.0)]
    params = x.V * h
    total = padded_vocab(m.vocab, x.t) * h
    if m.position is Position.LEARNED:
        ops.append(_mem("pos_embed", T * h, rw=3.0, bwd_rw=2.0))
        params += m.position_rows(x.S) * h
        total += m.position_rows(x.S) * h
    if m.dropout:  # the embedding dropout mask, one byte per element (Korthikanti §4.2)
        ops.append(_mem("embed_dropout", Tn * h, rw=2.5, bwd_rw=2.0, saved=Tn * h))
    comms: list[Comm] = []
    if x.t > 1:  # vocab-parallel lookup: reduce the partial rows over TP
        kind = CollKind.REDUCE_SCATTER if x.loc.sp else CollKind.ALL_REDUCE
        comms.append(Comm("embed.reduce", Axis.TP, kind, E * T * h, "fwd", Hide.NONE))
    return LayerGraph(LayerKind.EMBEDDING, tuple(ops), tuple(comms), params, 0.0, 0.0, total)


def _output(x: _Dims, prefix: str = "") -> tuple[list[Op], list[Comm]]:
    """The output layer over the (vocab-parallel) vocabulary and the loss."""
    T, h, V = x.T, x.h, x.V
    if x.loc.loss_saved_bytes == FP32:
        # vocab-parallel cross-entropy keeps fp32 logits: 4·s·b·v/t (Korthikanti §4.2); eager
        # cross-entropy keeps log_softmax's fp32 output
        loss = Op(f"{prefix}cross_entropy", OpKind.MEMORY, nbytes=(E + 2 * FP32) * T * V,
                  bwd_nbytes=(FP32 + E) * T * V, saved=FP32 * T * V)
    else:  # one fused kernel: reads the bf16 logits and keeps them; backward writes their gradient
        loss = Op(f"{prefix}cross_entropy", OpKind.MEMORY, nbytes=E * T * V,
                  bwd_nbytes=2 * E * T * V, saved=E * T * V)
    if x.loc.loss_chunks > 1:  # each chunk's head, loss and backward at once: nothing of
        # them kept but the gradient of the hidden states they accumulate, in bf16 until the
        # decoder's backward ([T, h]); the chunk's logits and the loss's bytes are the device's
        # transient (``ConfigCosts.logits_bytes``)
        loss = replace(loss, saved=0.0)
        head_in = E * T * h
    else:
        head_in = E * x.Tg * h
    ops = [_gemm(f"{prefix}lm_head", T, h, V, saved=head_in, lowp=False), loss]
    comms = x.tp_comms(f"{prefix}lm_head", column=True, nbytes=E * T * h, lowp=False)
    if x.t > 1:
        comms.append(Comm(f"{prefix}loss.ar", Axis.TP, CollKind.ALL_REDUCE, 2 * FP32 * T, "fwd"))
    return ops, comms


def _mtp(x: _Dims, block: LayerGraph) -> tuple[list[Op], list[Comm], float, float]:
    """One multi-token-prediction depth as Megatron-Core runs it (``MultiTokenPredictionLayer``,
    megatron/core/transformer/multi_token_prediction.py @ d98e8a64dd): the next tokens'
    embedding (the embedding's own lookup and collectives) and the previous depth's hidden states,
    each normed (enorm, hnorm), concatenated and projected by ``eh_proj`` (column-parallel 2h -> h,
    its output gathered over TP and scattered back to the sequence shards), then ``block`` and the
    final norm, the shared output layer and a loss. Ops, comms, local and total parameters (the
    embedding and output weights are the model's own, counted where they live)."""
    m, T, Tn, h = x.m, x.T, x.Tn, x.h
    emb = _embedding(x)  # the next tokens' lookup, named apart from the embedding layer's
    lookup = [replace(o, name=f"mtp_{o.name}") for o in emb.ops]
    lookup_comms = [replace(c, name=f"mtp_{c.name}") for c in emb.comms]
    # a Transformer Engine linear in the fp8 context keeps its input's fp8 copy (``_fp8_saves``)
    kept = E * Tn * 2 * h / (E if x.loc.precision is Precision.FP8 else 1)
    ops = [*lookup, _norm("mtp_enorm", x, Tn * h), _norm("mtp_hnorm", x, Tn * h),
           _gemm("mtp_eh_proj", T, 2 * h, h / x.t, saved=kept)]
    comms = [*lookup_comms, *x.tp_comms("mtp_eh_proj", column=True, nbytes=E * T * 2 * h)]
    if x.t > 1:  # gather_from_tensor_model_parallel_region (backward: a local split)
        comms.append(Comm("mtp_eh_proj.ag_out", Axis.TP, CollKind.ALL_GATHER, E * T * h, "fwd"))
        if x.loc.sp:  # scatter_to_sequence_parallel_region (forward: a local split)
            comms.append(Comm("mtp_eh_proj.ag_scatter_bwd", Axis.TP, CollKind.ALL_GATHER,
                              E * T * h, "bwd"))
    ops += [*block.ops, _norm("mtp_ln_final", x, Tn * h)]
    comms += block.comms
    out_ops, out_comms = _output(x, "mtp_")
    ops += out_ops
    comms += out_comms
    norms = 3 * _norm_params(m)
    return (ops, comms, norms + 2 * h * h / x.t + block.params,
            norms + 2 * h * h + block.total_params)


def _head(x: _Dims, out_weight: bool, embedding_copy: bool, block: LayerGraph) -> LayerGraph:
    """Final norm, output projection over the (vocab-parallel) vocabulary and the loss, then the
    model's multi-token-prediction depths with ``block`` as theirs. ``out_weight``: it holds the
    output weight (untied, or tied but on another device than the embedding); ``embedding_copy``:
    it holds the embedding weight for the depths' lookups (Megatron-Core builds the embedding on
    the stage running them, gpt_model.py @ d98e8a64dd, and all-reduces its gradient with the
    first stage's). The head keeps its tensors under every recompute policy, so a depth keeps its
    block's activations (Megatron-Core checkpoints MTP layers under full recomputation: not
    modelled)."""
    m = x.m
    T, Tn, h, V = x.T, x.Tn, x.h, x.V
    ops = [_norm("ln_final", x, Tn * h)]
    params = total = _norm_params(m)
    if not m.causal:  # BERT's MLM head transform (dense + norm) before the decoder
        ops += [_gemm("head_transform", T, h, h, saved=E * T * h),
                _mem("head_transform_norm", T * h, saved=E * T * h)]
        params += h * h + _norm_params(m)
        total += h * h + _norm_params(m)
    out_ops, comms = _output(x)
    ops += out_ops
    if out_weight:
        params += V * h
        total += padded_vocab(m.vocab, x.t) * h
    depths = m.mtp_layers
    d_params = 0.0
    if depths:  # every depth runs alike
        d_ops, d_comms, d_params, d_total = _mtp(x, block)
        ops += d_ops * depths
        comms += d_comms * depths
        params += depths * d_params + (V * h if embedding_copy else 0)
        total += depths * d_total
    return LayerGraph(LayerKind.HEAD, tuple(ops), tuple(comms), params,
                      depths * block.expert_params, 0.0, total,
                      expert_load=block.expert_load if depths else 1.0,
                      depths=depths, depth_block=block if depths else None,
                      depth_params=depths * d_params)


@dataclass(frozen=True, eq=False)
class ModelGraph:
    """The layer graphs of a model under one local strategy (shared by identical layers)."""

    embedding: LayerGraph
    dense: LayerGraph
    moe: LayerGraph | None
    head: LayerGraph
    """Head on another device than the embedding: its own output weight (untied, or a tied one's
    copy, which the depths' lookups use too) and, untied with multi-token prediction, a copy of
    the embedding for the depths' lookups."""
    head_shared: LayerGraph
    """Head on the embedding's device: a tied output weight and the depths' lookups use the
    embedding's (the same object as ``head`` when neither applies)."""
    kinds: tuple[LayerKind, ...]
    """Kind of each transformer block, in order."""

    def block(self, index: int) -> LayerGraph:
        return self.moe if self.kinds[index] is LayerKind.MOE else self.dense

    @cached_property
    def modules(self) -> frozenset[str]:
        """The recompute modules some operator of this model is in (``recompute.MODULES``): a
        dense model has no ``moe_act``, a model without MLA no ``mla_up_proj``."""
        used = {self.block(i) for i in range(len(self.kinds))}  # an all-MoE model has no MLP
        layers = (self.embedding, *used, self.head, self.head_shared)
        return frozenset().union(*(o.modules for layer in layers for o in layer.ops))

    @cached_property
    def n_moe(self) -> int:
        return sum(1 for k in self.kinds if k is LayerKind.MOE)

    def counts(self, head_beside_embedding: bool) -> list[tuple[int, LayerGraph]]:
        """Every layer kind of the whole model with how many there are (none left out at 0):
        the blocks, the embedding and the head (sharing a tied embedding's weight when it sits
        on the embedding's device: ``Parallelism.head_beside_embedding``)."""
        head = self.head_shared if head_beside_embedding else self.head
        out = [(len(self.kinds) - self.n_moe, self.dense), (self.n_moe, self.moe),
               (1, self.embedding), (1, head)]
        return [(n, layer) for n, layer in out if n]


def _fp8_saves(layer: LayerGraph) -> LayerGraph:
    """In fp8, Transformer Engine keeps a linear layer's input for backward as its fp8 copy."""
    ops = tuple(replace(o, saved=o.saved / E) if o.kind is OpKind.GEMM and o.lowp else o
                for o in layer.ops)
    return replace(layer, ops=ops)


@cached(maxsize=4096)
def build(model: ModelSpec, loc: Local) -> ModelGraph:
    """Layer graphs of ``model`` on one device under the local strategy ``loc``."""
    x = _Dims(model, loc)
    kinds = tuple(LayerKind.MOE if model.is_moe_layer(i) else LayerKind.DENSE
                  for i in range(model.layers))
    fix = _fp8_saves if loc.precision is Precision.FP8 else (lambda layer: layer)
    dense = fix(_block(x, moe=False))
    moe = fix(_block(x, moe=True)) if model.moe is not None else None
    # Megatron-Core builds the depth's block from the last decoder layer's spec (megatron/core/
    # models/gpt/gpt_layer_specs.py @ d98e8a64dd, get_gpt_mtp_block_spec_for_backend)
    mtp_block = moe if kinds[-1] is LayerKind.MOE else dense
    # apart from the embedding, a tied output weight is the depths' lookup table as well
    head = _head(x, out_weight=True, embedding_copy=not model.tied_embeddings, block=mtp_block)
    # beside the embedding: a tied output weight and the depths' lookups use the embedding's
    beside = (_head(x, out_weight=not model.tied_embeddings, embedding_copy=False, block=mtp_block)
              if model.tied_embeddings or model.mtp_layers else head)
    return ModelGraph(embedding=_embedding(x), dense=dense, moe=moe, head=head,
                      head_shared=beside, kinds=kinds)


def _whole(model: ModelSpec) -> tuple[ModelGraph, LayerGraph]:
    """The model's layer graph on one rank of every kind, and its head as counted once (the
    embedding's copy where tied): what the model-wide counts read."""
    g = build(model, Local(1, False, 1, 1, 1, 1, 2, Precision.BF16, AttentionImpl.FLASH))
    return g, g.head_shared if model.tied_embeddings else g.head


def total_params(model: ModelSpec) -> float:
    """Parameters of the whole model (tied embeddings counted once)."""
    g, head = _whole(model)
    blocks = sum(g.block(i).total_params for i in range(model.layers))
    return g.embedding.total_params + blocks + head.total_params


def routed_expert_params(model: ModelSpec) -> float:
    """Parameters of the routed experts of the whole model (a depth of multi-token prediction
    built as an MoE block holds its own): what expert parallelism splits beside the rest."""
    g, head = _whole(model)
    return sum(g.block(i).expert_params for i in range(model.layers)) + head.expert_params


def active_params(model: ModelSpec) -> float:
    """Parameters one token touches (routed experts counted top_k times of experts)."""
    if model.moe is None:
        return total_params(model)
    mo = model.moe
    return total_params(model) - routed_expert_params(model) * (1 - mo.top_k / mo.experts)

