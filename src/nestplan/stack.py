"""The training stack: how a framework runs the model (one home for it).

A :class:`StackSpec` is the fourth input beside the model, the cluster and the workload. It holds

* **behaviour** — which attention kernel runs and what it saves, whether norms and the gated MLP
  are fused (what they save), the dtypes of weights, gradients and optimizer state, which
  communication overlaps compute, how ZeRO/FSDP shards and gathers, how the loss keeps its
  logits, and what the caching allocator reserves beyond the live tensors;
* **what it offers** — its recompute policies, pipeline schedules, ZeRO stages and parallel axes
  (``unsupported`` says why a plan is not one this stack can run);
* **calibration** — multipliers on the accelerator's efficiencies and on network efficiency, the
  overlap efficiency and the per-step host time, with the runs they were fitted on.

Stacks are TOML files (``catalog/stacks/*.toml``, or a path): ``base = "name"`` plus overrides.
Every value in the catalog's files carries its source there, not here.
"""

from __future__ import annotations

import itertools

import math
from dataclasses import dataclass, replace

from .errors import SpecError
from .options import AttentionImpl, TPOverlap
from .recompute import MODULES, STANDARD, Policy, standard
from .schedule import MICRO_BATCHES, SCHEDULES
from .specs import MAX_KERNEL_OVERHEAD_US, MIN_EFFICIENCY, _CachedHash, list_text, within
from .units import MS, GiB, US

FORMATS = ("megatron", "torchtitan", "deepspeed", "composer")
"""Launch-configuration families a stack's plans export to (``export --format``)."""
FORMAT_STACKS = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
"""The catalog stack that runs each launcher format's framework as it ships (composer has no
launcher export)."""
CUDA_GRAPHS = ("none", "layers", "full_iteration")
"""What a stack may replay as CUDA graphs (``StackSpec.cuda_graphs``)."""
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess")
"""Parts of a layer per-layer graphs may capture (``StackSpec.cuda_graph_modules``):
Megatron-Core's ``CudaGraphModule`` choices for training (transformer_config.py @ d98e8a64dd)."""
MAX_ALLOCATOR_OVERHEAD = 10.0
"""Most ``allocator_overhead`` a stack may hold (a share of activations and transients; fitted
values are below 1, but a run whose allocator caches several times its activations exists)."""
FITTED_KINDS = ("dense", "moe")
"""What ``StackSpec.fitted_kinds`` may name."""


def fitted_kind(model) -> str:
    """The kind of ``FITTED_KINDS`` a model is: with experts or without."""
    return "moe" if model.moe is not None else "dense"
CALIBRATION = ("matmul_scale", "attention_scale", "memory_scale", "network_scale",
               "kernel_overhead", "moe_layer_host", "attention_host_share", "overlap_efficiency",
               "step_overhead", "allocator_overhead", "fitted_on", "fitted_seq_len",
               "fitted_accelerators", "fitted_gpus", "fitted_kinds")
"""The fields ``calibrate`` fits (or may) and the runs they were fitted on: a stack's
calibration, which its variants (``base = ...`` files that set behaviour only) share."""
FITTED_FROM = tuple(f for f in CALIBRATION if f.startswith("fitted_"))
"""The fields of a calibration that say what runs it came from."""
CALIBRATION_VALUES = tuple(f for f in CALIBRATION if f not in FITTED_FROM)
"""The fields of a calibration that hold its values."""
EAGER_OPS = ("scaled_rope", "glu_clamp", "expert_bias")
"""What ``StackSpec.eager_ops`` may name."""
AXES = ("tp", "sp", "cp", "ep", "pp")
"""Parallel axes a stack may offer beside data parallelism (always offered)."""
INTERLEAVED_ROUNDS = ("pp", "floor", "any")
"""What ``StackSpec.interleaved_rounds`` may say."""
CP_EXCHANGES = ("ring", "allgather", "flex_allgather")
"""What ``StackSpec.cp_exchange`` may say."""
MOE_DISPATCHERS = ("alltoall", "allgather", "flex")
"""What ``StackSpec.moe_dispatcher`` may say."""
MOE_OVERLAPS = ("none", "shared", "batch")
"""What ``StackSpec.moe_overlap`` may say."""
CHOICES = {"moe_dispatcher": MOE_DISPATCHERS, "moe_overlap": MOE_OVERLAPS,
           "cuda_graphs": CUDA_GRAPHS, "interleaved_rounds": INTERLEAVED_ROUNDS,
           "cp_exchange": CP_EXCHANGES, "export_format": FORMATS}
"""The stack-file keys whose string is one of a few words, and those words (a file giving another
kind of value is told them too: a MoE trial's moe_overlap = true had been told "a string")."""
MAX_LOSS_CHUNKS = 1024
"""Most ``StackSpec.loss_chunks`` (torchtitan's default is 8)."""
Refusal = tuple[str, object, str] | tuple[str, object, str, str]
"""Why a stack does not run a plan: ``SpecError``'s arguments, (field, value, rule[, advice])."""


def _names(field: str, values, allowed: tuple, differ: str | None = None) -> None:
    """Each of ``values`` is one of ``allowed``; with ``differ`` (the message), none twice."""
    for v in values:
        if v not in allowed:
            raise SpecError(field, v, "allowed: " + ", ".join(map(str, allowed)))
    if differ and len(set(values)) != len(values):
        raise SpecError(field, list(values), differ)


@dataclass(frozen=True, kw_only=True)
class StackSpec(_CachedHash):
    """How one training framework runs a model. Units: bytes, seconds; multipliers unitless."""

    name: str
    """Catalog name (``megatron-core``) or the file it came from."""
    description: str = ""
    """One line: framework, version or era, and what sets it apart."""
    export_format: str | None = None
    """The ``export --format`` that launches this stack's plans (None: no launcher export)."""
    # ---- behaviour: kernels and what they keep for backward
    attention: AttentionImpl = AttentionImpl.FLASH
    """Attention-core implementation (flash keeps q, k, v, output and the log-sum-exp)."""
    fused_norm: bool = True
    """Norms run as one fused kernel that keeps only its input (Apex/TE); unfused eager norms
    also keep their fp32 intermediate products."""
    fused_gated_mlp: bool = True
    """The gated MLP's activation is one fused kernel (keeps its two inputs); unfused eager code
    also keeps the activation's output."""
    norm_in_linear: bool = False
    """A norm whose only reader is one linear layer runs inside that layer (Transformer Engine's
    ``LayerNormLinear``): Megatron-Core's TE layer spec fuses the attention's input norm into
    the QKV projection (not MLA's: its input norm stays a module) and a dense MLP's norm into its
    fc1, and keeps the pre-MLP norm of an MoE layer, which the router and experts read, as a
    module (``get_gpt_layer_with_transformer_engine_spec``, megatron/core/models/gpt/
    gpt_layer_specs.py @ NVIDIA/Megatron-LM d98e8a64dd; megatron-core 0.16.1 alike). A fused norm
    is no module, and ``TransformerLayer`` recomputes only norms that are
    (``recompute_input_layernorm`` / ``recompute_pre_mlp_layernorm`` set for norms that are not
    ``IdentityOp``, megatron/core/transformer/transformer_layer.py, same commit): the
    ``layernorm`` recompute module leaves the fused ones and what their linear keeps (a user
    trial: plans that fitted by recomputing dense layers' norms kept 2-3 GiB more as launched).
    Off: every norm is a module of its own (Megatron-Core's local spec, Apex's norms)."""
    qkv_views: bool = True
    """Queries, keys and values are views of the fused QKV projection's output, so one kept for
    backward keeps the whole output alive (Megatron-Core: ``get_query_key_value_tensors``,
    megatron/core/transformer/attention.py, megatron-core 0.16.1). torchtitan 0.3 copies each out
    contiguously after the split (``torch.split`` then ``.contiguous()``,
    torchtitan/models/common/attention.py, 0.3.0 wheel)."""
    expert_combine_bytes: int = 2
    """Bytes per element of the routed experts' outputs that the combine keeps when it weights
    them by their scores (not where the activation does: ``scores_in_activation``): 2 for
    Megatron-Core's bf16 product; 4 for torchtitan 0.3, which casts the outputs to fp32 before
    the product (``routed_output_RD.to(torch.float32) * scores``, torchtitan/models/common/
    token_dispatcher.py, 0.3.0 wheel; what torch.compile keeps of it is not measured)."""
    scores_in_activation: bool = True
    """A fused gated activation applies the routing scores itself, so the combine keeps nothing
    (Megatron-Core's weighted SwiGLU, measured: tests/frameworks_saved.py). torchtitan weights
    the outputs in its combine, fused activation or not."""
    eager_ops: tuple[str, ...] = ()
    """Pieces of some models this stack runs as separate eager PyTorch kernels where a fused
    kernel would read and write the tensor once; each is costed as the passes over memory its
    kernels make, counted on the framework's own code (``tests/test_framework_traffic.py``; the
    counts: ``graph.EAGER_PASSES``). Named in ``EAGER_OPS``: ``scaled_rope``, RoPE whose cos and
    sin YaRN scales (``ModelSpec.rope_mscale`` != 1, attention without MLA); ``glu_clamp``, the
    clamp of a clamped gated activation (``ModelSpec.glu_clamp``); ``expert_bias``, the routed
    experts' output bias (``MoESpec.expert_bias``). The counts are those of the framework whose
    code runs them (``eager_code``)."""
    weight_bytes: int = 2
    """Bytes per stored parameter: 2 when bf16 model weights sit beside fp32 master copies
    (Megatron, DeepSpeed), 4 when the fp32 parameters themselves are stored and cast to bf16 for
    compute (FSDP mixed precision)."""
    master_bytes: int = 4
    """Bytes per parameter of separate fp32 master weights in the optimizer (0 when the stored
    parameters are the master copy)."""
    grad_bytes: int = 4
    """Bytes per gradient element in the reduction buffers (4: fp32 main grads)."""
    loss_saved_bytes: int = 4
    """Bytes per logit element the loss keeps for backward: 4 when it keeps fp32 values
    (Megatron's vocab-parallel cross-entropy its fp32 logits, eager cross-entropy on upcast logits
    log_softmax's fp32 output); 2 when one fused kernel reads the bf16 logits, computes in fp32
    inside and keeps those bf16 logits (flash-attn's Triton cross-entropy, llm-foundry's default
    loss)."""
    loss_chunks: int = 1
    """The loss runs over this many chunks of each micro-batch's sequence, each chunk's output
    layer, loss and their backward at once (torchtitan 0.3's ``ChunkedLossWrapper``, 8 chunks by
    default: torchtitan/components/loss.py, and every Llama 3 config: models/llama3/
    config_registry.py, 0.3.0 wheel): the head's device keeps no logits for the backward, only
    the gradient of the hidden states it accumulates (in fp32, then bf16 until the decoder's
    backward: what it keeps measured with torchtitan's own wrapper on CPU, tests/test_memory.py),
    and through its loop holds one chunk's logits with what the loss keeps and works in
    (``ConfigCosts.logits_bytes``, from the code: a review measured 14 bytes a logit at TP 1 and
    18 with loss parallelism where these stacks count 12)."""
    loss_transient_bytes: int = 4
    """Bytes per logit element alive at the loss's peak beside what it keeps for backward
    (``loss_saved_bytes``): 2 for Megatron's vocab-parallel cross-entropy, whose backward writes
    its gradient into the fp32 logits it keeps and casts it to bf16 (the megatron-core stack's,
    measured; the default here is the 4 it had been given first); 6 for eager cross-entropy on
    upcast logits (the bf16 logits and their fp32 copy, or the fp32 and bf16 gradients); 2 for a
    fused kernel's bf16 gradient."""
    # ---- behaviour: overlap
    overlap_grad_reduce: bool = True
    """Data-parallel gradient reduction overlaps the backward: after the last micro-batch, and
    under ZeRO-2 and 3 each micro-batch's reduce-scatter; without it they all show in full (the
    DeepSpeed export writes it as ``overlap_comm``, which in DeepSpeed covers ZeRO-3's gathers
    too: the export says so when ``overlap_param_gather`` differs)."""
    overlap_param_gather: bool = True
    """Sharded parameters' all-gathers overlap compute: the sharded optimizer's after the step
    with the next step's first forward (unless ``optimizer_gather_waits``), and ZeRO-3's gathers
    with the layers they precede; without it they all show in full."""
    zero_grad_allreduce: bool = False
    """Under ZeRO-1/2 the data-parallel gradients are all-reduced bucket by bucket, each rank
    keeping its partition, not reduce-scattered: twice the traffic. DeepSpeed's, whose
    ``average_tensor`` sends every bucket through ``allreduce_and_scatter`` (``dist.all_reduce``)
    under its default ``use_multi_rank_bucket_allreduce = true``
    (deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8 wheel; a DeepSpeed user's trial); its 2021-22
    releases, before that option, reduced each partition to its owner."""
    optimizer_gather_waits: bool = False
    """The sharded optimizer (ZeRO-1/2) gathers the updated weights inside its step, which waits
    for the gather, so none of it overlaps the next forward: DeepSpeed's, whose ``step`` ends with
    ``all_gather_dp_groups`` (deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8 wheel; a DeepSpeed
    user's trial). Megatron's distributed optimizer with --overlap-param-gather does not."""
    tp_overlap: TPOverlap = TPOverlap.BACKWARD
    """Tensor-parallel communication overlap."""
    tp_overlap_beyond_domain: TPOverlap = TPOverlap.BACKWARD
    """The overlap a TP group gets when it leaves the innermost network level (one NVLink
    domain) and ``tp_overlap`` is ``full``: Transformer Engine's userbuffer overlap works within
    one NVLink domain only ("comm+GEMM overlap is currently only possible with single-node
    tensor-parallelism", its Userbuffers relying on CUDA multicast over NVLink:
    NVIDIA/TransformerEngine issue #1071, 2024-08-02), and outside it Transformer Engine still
    runs the backward's input all-gather and gradient reduce-scatter beside the GEMMs
    (``backward``); torch's async TP, on symmetric memory between NVLink peers, falls back to
    plain TP (``none``). At most ``backward``."""
    overlap_p2p: bool = True
    """Pipeline send/recv overlaps compute in the steady state."""
    p2p_overlap_needs_interleaving: bool = False
    """``overlap_p2p`` holds only for an interleaved pipeline (vp > 1): Megatron's 1F1B without
    interleaving waits for each send and receive ("Non-interleaved pipeline parallelism does not
    support overlapping p2p communication", forward_backward_pipelining_without_interleaving,
    megatron/core/pipeline_parallel/schedules.py @ d98e8a64dd; a user trial on a slow network
    found 1.6 s of sends costed hidden)."""
    moe_dispatcher: str = "alltoall"
    """How MoE tokens reach their experts: ``alltoall``, ``allgather`` or ``flex`` (DeepEP:
    a token crosses the network once per remote node), as Megatron-Core's
    ``--moe-token-dispatcher-type``."""
    moe_overlap: str = "none"
    """What hides the expert-parallel exchange: ``none``; ``shared`` (the shared experts run
    during it: ``--moe-shared-expert-overlap``); ``batch`` (another micro-batch's compute:
    ``--overlap-moe-expert-parallel-comm``, with ``delay_wgrad``); one more block of
    activations held: ``cost.device.merges_batches``). Megatron-Core runs ``batch`` only with
    the all-to-all or flex dispatcher, without full or block recomputation or a ``moe`` recompute
    module, and, when pipelining with expert parallelism, only with an interleaved schedule
    (transformer_config.py @ d98e8a64dd): a ``batch`` stack offers no such policy, and runs no
    such plan."""
    delay_wgrad: bool = True
    """With ``moe_overlap = "batch"``, the weight-gradient GEMMs are put off to fill the
    exchange's window (``--delay-wgrad-compute``), as Megatron-Bridge's performance scripts set it
    with the overlap (``_set_moe_a2a_overlap_overrides``, scripts/performance/utils/overrides.py @
    NVIDIA-NeMo/Megatron-Bridge 067f987df0), where some recipes run without (its Qwen3-30B-A3B
    H100 bf16 recipe). Exported, not costed apart: the cost model hides the exchange behind the
    other micro-batch's compute either way."""
    cp_exchange: str = "ring"
    """How context parallelism exchanges K/V: ``ring`` (passed on while each block of the
    attention computes: Megatron/TE), ``allgather`` (gathered behind the first block only, and
    again in the backward: torch's context_parallel with SDPA, torchtitan in 2024) or
    ``flex_allgather`` (gathered whole before the attention, which keeps the gathered K/V for its
    backward; dK/dV reduce-scattered after it: torchtitan 0.3 with FlexAttention, the default
    of its Llama 3, DeepSeek-V3 and Qwen3 configs, whose attention takes K/V replicated over CP
    with Partial gradients (the inner attention's ShardingConfig, torchtitan/models/common/
    decoder_sharding.py, on its default spmd backend; ``apply_cp_to_forward``'s
    ``flex_cp_allgather`` on the legacy one, torch/distributed/tensor/experimental/
    _context_parallel/_cp_custom_ops.py, torch 2.13). Under a recompute policy that does not
    save the gather's output (torchtitan's per-op selective and full), the backward gathers again
    (the policy's rule runs the forward's collectives again)."""
    cp_shards_weights: bool = False
    """With context parallelism the weights are sharded over the CP ranks whatever the plan's
    ZeRO stage: torchtitan applies FSDP over dp_shard·cp whenever cp > 1 (``fsdp_enabled``,
    torchtitan/distributed/parallel_dims.py, 0.3.0 wheel), so it runs no ZeRO-0 plan with CP (a
    user trial's search had recommended one, which its export then said runs otherwise)."""
    cp_gathers_windows: bool = False
    """Context parallelism over sliding-window attention, or attention with learnable softmax
    offsets (sinks), does not pass K/V round a ring whatever ``cp_exchange`` says: Transformer
    Engine runs windowed attention under CP only with its ``all_gather`` or ``a2a`` exchange, and
    sinks only with ``a2a`` (``attn_forward_func_with_cp``, transformer_engine/pytorch/attention/
    dot_product_attention/context_parallel.py @ NVIDIA/TransformerEngine d0067d0da); Megatron-Core
    hands its ``--cp-comm-type`` to TE unchanged (extensions/transformer_engine.py @ d98e8a64dd),
    and the Megatron export asks for ``all_gather`` (``a2a`` with sinks). Costed as TE's
    all-gather runs (``AttnFuncWithCPAndKVAllGather``, same file): K/V gathered before the
    attention in the forward and again in the backward, dK/dV reduce-scattered after it, each
    waited for (``gather_along_first_dim`` / ``reduce_scatter_along_first_dim``, not overlapped);
    TE's a2a, which sinks need, is not modelled and is costed alike. A user trial's Mistral export
    had crashed at its first forward."""
    flat_dp_collectives: bool = False
    """Data-parallel collectives run as one flat ring over the group's top level (no node-level
    aggregation)."""
    fp8_param_gather: bool = False
    """In fp8 training, ZeRO-3/FSDP and the sharded optimizer all-gather the transformer blocks'
    dense linear weights as their fp8 copies, one byte each (torchao's
    ``enable_fsdp_float8_all_gather``); the embedding, the output layer and routed experts
    (grouped weights, not ``nn.Linear``) stay in bf16. Off, gathered weights move in bf16 but
    where ``fp8_primary_weights`` makes them fp8 (``memory.gathers_fp8``)."""
    fp8_weight_cache_bytes: float = 0.0
    """Bytes per transformer-block weight that fp8 training keeps as quantized copies from a
    step's first micro-batch to its last: Transformer Engine caches each linear layer's fp8
    weight, row-wise for the forward GEMM and column-wise for the input-gradient GEMM, across
    micro-batches when Megatron-Core passes ``is_first_microbatch``, which it does unless
    ``disable_parameter_transpose_cache`` (``_fp8_workspaces``, transformer_engine/pytorch/module/
    linear.py @ NVIDIA/TransformerEngine d0067d0da; TELinear, TELayerNormColumnParallelLinear,
    TEGroupedLinear in megatron/core/extensions/transformer_engine.py @ d98e8a64dd): 2 bytes
    (1 each; block scales of MXFP8 or blockwise recipes left out). 0: none (torchao casts each
    forward's weight anew). A user trial's question: an fp8 plan's weights had been those of a
    bf16 one."""
    fp8_primary_weights: bool = False
    """Under a sharded optimizer (ZeRO >= 1), fp8 training keeps the blocks' weights as fp8
    tensors, whose row- and column-wise data take the bf16 weight's 2 bytes, with no cached
    copy beside them: Megatron-LM's ``--fp8-param-gather``, which it allows with the
    distributed optimizer or FSDP (``validate_args``, megatron/training/arguments.py @
    d98e8a64dd) and which NeMo's fp8 recipes set (Megatron-Bridge ``mixed_precision.py`` @
    067f987df, all but blockwise scaling); the Megatron export asks for it. Without a sharded
    optimizer the bf16 weights stay and ``fp8_weight_cache_bytes`` come on top. The sharded
    optimizer's all-gathers move them as bytes, the blocks' and the experts' alike
    (``memory.fp8_primary``, ``gather_bytes``, ``expert_gather_bytes``; costed in bf16 before
    2026-12-05)."""
    tp_keeps_gathered_input: bool = False
    """Under sequence parallelism, a column-parallel linear keeps for backward the input it
    all-gathered (the whole sequence), and its backward reduce-scatters the input gradient with
    no second all-gather: torch's ``ColwiseParallel`` behind ``PrepareModuleInput(Shard(1) ->
    Replicate())``, whose matmul saves the replicated local tensor (torchtitan's TP plans;
    measured on CPU, tests/frameworks_tp_saved.py); a checkpoint that runs the forward again
    gathers it again (full recomputation, and torchtitan's per-op rule: ``recompute``). Off: the
    linear keeps its sequence shard and gathers it again in backward (Megatron-Core's
    ``ColumnParallelLinear`` and Transformer Engine's ``Linear`` with ``sequence_parallel``)."""
    tp_beyond_kv_heads: bool = True
    """Runs a TP degree that is a multiple of the model's KV heads: each rank projects its share
    of every head's queries, keys and values, all-gathers the projection over TP (forward; its
    gradient reduce-scattered backward) and keeps its KV head's slice and its queries
    (``SelfAttention.get_query_key_value_tensors``, megatron/core/transformer/attention.py @
    d98e8a64dd, "When tp_size > num_kv_heads"). Off: TP must divide the KV heads (torchtitan's
    Decoder.Config.update_from_config raises otherwise, torchtitan/models/common/decoder.py,
    0.3.0 wheel)."""
    pipeline_tied_embeddings: bool = True
    """Runs a pipeline on a model whose output layer shares the embedding's weights (the first
    and last stages each keep a copy and sum their gradients: Megatron-Core's
    ``share_embeddings_and_output_weights``, DeepSpeed's ``TiedLayerSpec``). Off: such a model
    runs without pipeline parallelism (torchtitan's ``Decoder.Config.update_from_config`` raises
    "Weight tying is not supported with Pipeline Parallel", torchtitan/models/common/decoder.py,
    0.3.0 wheel)."""
    fp8_tp_gather: bool = False
    """In fp8 training with sequence parallelism, the tensor-parallel all-gathers around the
    blocks' linear layers (their inputs forward, the output gradients backward) move fp8 copies;
    reduce-scatters stay bf16 (torchao's ``Float8ColwiseParallel``/``Float8RowwiseParallel``,
    which torchtitan applies with float8 and TP)."""
    cuda_graphs: str = "none"
    """What replays as CUDA graphs, as Megatron-Core's ``--cuda-graph-impl``: ``none``; ``layers``
    (``local`` capturing whole transformer layers, forward and backward); ``full_iteration`` ("1
    CUDA graph for the whole forward-backward path excluding the optimizer step";
    megatron/core/transformer/transformer_config.py @ d98e8a64dd). A graphed layer launches
    nothing from the host, so an MoE layer in one does not wait on it (``moe_layer_host`` does not
    apply). Megatron-Core captures an MoE layer only with static shapes: under ``layers`` when the
    workload sets a capacity factor and the stack pads to it (``moe_pad_to_capacity``; "moe cuda
    graph is only supported with drop-padding MoE", same file), otherwise the MoE layers run
    eagerly and wait as before (the Megatron export then graphs the attention and dense MLPs
    only: ``--cuda-graph-modules attn [mlp]``); the recipes that graph a full iteration give HybridEP a static
    per-rank token budget (``moe_expert_rank_capacity_factor``), under which
    ``_HybridEPManager`` sizes its buffers without the host sync (token_dispatcher.py, same
    commit). Full recomputation runs only under ``full_iteration`` ("full recompute is only
    supported with full iteration CUDA graph", same file), so a ``layers`` stack offers none."""
    cuda_graph_modules: tuple[str, ...] = ()
    """Under ``cuda_graphs = "layers"``, the parts of every layer captured, as Transformer
    Engine's per-module graphs (Megatron-Core ``--cuda-graph-impl transformer_engine
    --cuda-graph-modules``; NeMo's MoE recipes capture ``attn``, ``moe_router`` and
    ``moe_preprocess``); empty: whole layers. The MoE layer's own graph (``moe``) needs the
    padding to capacity that makes its shapes static, and only it spares the layer the host's
    launches: an eager MoE layer around a graphed router still waits on the host (the token
    counts reach the host before the experts run). Megatron-Core's rules, checked here: ``moe``
    and ``moe_router`` exclude each other, ``moe_preprocess`` needs ``moe_router``, and a
    ``moe`` recompute module cannot hold a graphed router (same file). The export leaves out the
    modules a model or a workload does not have (``mlp`` without dense layers, the MoE modules
    without experts, ``moe`` without padding, ``moe_preprocess`` when the all-to-all copies the
    token counts to the host in its preprocessing: a capacity factor without padding)."""
    moe_pad_to_capacity: bool = False
    """With a capacity factor (``TrainingSpec.moe_capacity``), every expert's input is padded to
    its capacity (Megatron-Core ``--moe-pad-expert-input-to-capacity``; Megatron-Bridge's
    token-drop benchmarks set it: ``apply_moe_token_drop``): every expert rank sends, receives
    and computes its capacity whatever the routing, and the dispatch's shapes are static, so a
    per-layer CUDA graph can hold the layer (run eagerly, the layer still waits on the host's
    launches: ``moe_layer_host``). Only the all-to-all dispatcher pads (megatron-core 0.16:
    ``MoEAlltoAllTokenDispatcher``; the all-gather dispatcher ignores the flag and
    ``TransformerConfig`` refuses it with DeepEP)."""
    gather_whole_block: bool = False
    """ZeRO-3 gathers a whole transformer block's weights at once (FSDP units) rather than one
    operator's; memory holds the block in use and the prefetched next one."""
    # ---- behaviour: memory beyond the tensors
    reserved_bytes: float = 1.5 * GiB
    """CUDA context, library workspaces and communication buffers on every device."""
    allocator_overhead: float = 0.05
    """The caching allocator's reserved-but-unused share, as a fraction of activations and
    transient memory."""
    # ---- what it offers
    recompute: tuple[Policy, ...] = standard("recompute", STANDARD)
    """Recompute policies it offers, by name (``recompute.Policy``); plans name them."""
    recompute_per_stage: bool = True
    """Different pipeline stages may use different recompute policies."""
    schedules: tuple[str, ...] = ("1f1b", "interleaved-1f1b")
    """Pipeline schedules it runs."""
    interleaved_rounds: str = "pp"
    """Which micro-batch counts per replica its looped interleaved schedules
    (``Schedule.looped_rounds``) run, in rounds of ``schedule.round_size``: ``pp``, a multiple of
    ``pp`` (rounds of exactly ``pp``: Megatron-LM asserts so, megatron/schedules.py @
    77bff3864f, 2021); ``floor``, a multiple of ``max(1, m // pp)`` (PyTorch's interleaved
    schedules, any count below ``pp`` included); ``any``, from ``pp`` on, the last round shorter
    where the count asks (Megatron-Core since 0.10, with
    ``--microbatch-group-size-per-virtual-pipeline-stage``, which the Megatron export writes;
    zero bubble runs whole rounds only on any stack, ``Schedule.check``)."""
    schedules_min_pp_micro: tuple[str, ...] = ()
    """Of its schedules, those it runs only with at least ``pp`` micro-batches per replica, beyond
    what the schedule itself needs (``Schedule.check``): torch's ``Schedule1F1B`` raises on fewer
    micro-batches than stages (torch/distributed/pipelining/schedules.py, torch 2.13.0 wheel),
    which torchtitan runs; Megatron-Core's 1F1B runs any number (its warm-up is the smaller of
    the two)."""
    zero_stages: tuple[int, ...] = (0, 1)
    """ZeRO stages it runs (1 = distributed optimizer; 2 and 3 as FSDP or DeepSpeed stages)."""
    max_zero_with_pp: int = 3
    """Highest ZeRO stage it runs together with pipeline parallelism."""
    default_zero: int = 0
    """The ZeRO stage its launchers use when a run does not say (runs CSVs, ``evaluate``)."""
    default_zero_with_pp: int | None = None
    """... with pipeline parallelism, where it differs (None: ``default_zero``): torchtitan's
    default reshard policy keeps FSDP2's weights gathered after forward when it pipelines,
    nestplan's ZeRO-2, and reshards them (ZeRO-3) when it does not."""
    pipeline_defers_grad_sync: bool = False
    """Under pipeline parallelism, ZeRO-2/3's gradients are reduce-scattered once a step, after
    the last micro-batch's backward, not every micro-batch, and until then accumulate unsharded
    in the stack's gradient bytes: PyTorch's pipeline schedules turn FSDP2's gradient sync off
    for every backward and reduce in a step of their own (torch/distributed/pipelining/stage.py
    ``backward_maybe_with_nosync``, ``perform_reduce_grad``; FSDP2 keeps the unsharded gradient
    in its reduce dtype, ``FSDPParam.to_accumulated_grad_if_needed``; torch 2.13.0 wheel).
    Measured on two gloo ranks (tests/frameworks_fsdp_gathers.py): one reduce-scatter per unit
    a step under ``Schedule1F1B``, against one per micro-batch outside a pipeline."""
    pipeline_bf16_optimizer: bool = False
    """At ZeRO-0 under pipeline parallelism the optimizer still shards: DeepSpeed's engine picks
    its ``BF16_Optimizer`` for bf16 weights with the pipeline engine and no ZeRO
    (``DeepSpeedEngine._do_optimizer_sanity_check``, deepspeed/runtime/engine.py, deepspeed
    0.19.8), which keeps the fp32 master weights and Adam's states in 1/dp partitions, the
    backward's gradients beside an accumulation buffer of their own dtype, whole
    (``fp32_groups_gradients_flat``; the pipeline engine zeroes the parameters' gradients before
    each micro-batch's backward and adds them into it after), all-reduces that buffer and
    all-gathers the updated weights after the step (deepspeed/runtime/bf16_optimizer.py).
    Measured on two gloo ranks (tests/frameworks_deepspeed_bf16.py)."""
    experts_over_sharded_ranks: bool = False
    """Expert parallelism is formed from the sharded data-parallel ranks only, not from the
    replicas: torchtitan's expert mesh is ``(pp, dp_replicate, efsdp, ep)`` with ``efsdp·ep =
    dp_shard·cp·tp`` (torchtitan/distributed/parallel_dims.py, 0.3.0 wheel), so under ZeRO-0,
    whose data-parallel ranks are DDP replicas (dp_shard = 1), ep must divide cp·tp.
    Megatron-Core takes experts from any data-parallel rank, sharded or not."""
    expert_tp_with_ep: bool = True
    """Experts may be split by a tensor-parallel degree of their own together with expert
    parallelism (Megatron-Core's ``--expert-tensor-parallel-size``). torchtitan has no expert TP:
    with EP its routed experts are sharded over the EP axis only (etp = 1), without EP over the
    dense TP axis like the other weights (etp = tp) (``expert_param_placement_sparse`` and
    ``_dense``, torchtitan/models/common/moe_sharding.py, 0.3.0 wheel)."""
    expert_layer_injected: bool = False
    """The framework puts expert parallelism into model code that has none, swapping the model's
    MoE blocks for its own layer: DeepSpeed's AutoEP (``expert_parallel`` in its config, 0.19.2
    and later; deepspeed/module_inject/auto_ep_config.py @ deepspeedai/DeepSpeed edaa7221), which
    is what the ``deepspeed`` export then writes. Else the model code runs expert parallelism
    itself (Megatron-Core, Megatron-DeepSpeed's MoE layers, torchtitan)."""
    expert_tp_with_bias: bool = True
    """Experts whose linear layers carry biases may be split by expert TP. Megatron-Core refuses
    it ("Bias in Moe is only supported when ETP==1": TransformerConfig.__post_init__,
    megatron/core/transformer/transformer_config.py, megatron-core 0.16.1), so a model built with
    ``add_bias_linear`` (GPT-OSS) runs its experts at etp = 1 there."""
    default_sp: bool = False
    """Its launchers turn sequence parallelism on with tensor parallelism unless told otherwise."""
    default_recompute: str | None = None
    """The recompute policy its launchers use when a run does not say (runs CSVs); None: the
    run was tuned, so validation takes the fastest policy that fits."""
    gpt_tied_embeddings: bool = True
    """Runs of GPT-style models (runs CSVs) tie the output layer to the embedding, Megatron-LM's
    default; False where a source's parameter counts show untied ones."""
    axes: tuple[str, ...] = AXES
    """Parallel axes it offers beside data parallelism."""
    mixture_of_experts: bool = True
    """It trains mixture-of-experts layers, as nestplan models them. Megatron-LM's arrived in
    December 2023 (megatron/core/transformer/moe/moe_layer.py, first in NVIDIA/Megatron-LM
    c79503850b), after the catalog's Megatron-LM 2021 and 2022 stacks. The stacks based on them
    inherit none: DeepSpeed 2021's ZeRO-3 ran Megatron's dense model code, and Megatron-DeepSpeed's
    MoE is DeepSpeed-MoE (its own gating, capacity and exchange), which no stack models."""
    multi_token_prediction: bool = True
    """It trains multi-token-prediction depths (``ModelSpec.mtp_layers``): Megatron-Core's
    ``--mtp-num-layers`` (core_v0.12.0 and later) and torchtitan's DeepSeek-V3 do; the catalog's
    Megatron-LM 2021-22, DeepSpeed and Composer stacks do not."""
    per_op_saves_all_to_all: bool = True
    """Its per-op selective checkpoint keeps the expert exchange's all-to-all outputs. Off for
    eager torchtitan 0.3: its default SPMD backend (``spmd_backend = "spmd_types"``,
    torchtitan/config/configs.py) exchanges tokens with ``spmd.all_to_all``
    (torchtitan/models/common/token_dispatcher.py), c10d's all-to-all inside an autograd
    function, not the functional ``all_to_all_single`` on ``SelectiveAC``'s save list
    (torchtitan/distributed/activation_checkpoint.py; 0.3.0 wheel), so the recomputed forward
    exchanges again: 6 token all-to-alls a layer a micro-batch, not 4 (the token counts' small
    exchange runs again too, not costed; DeepEP's and HybridEP's ops are on the list, so only the
    ``alltoall`` dispatcher is concerned; a torchtitan MoE user's trial,
    run with torchtitan's own SelectiveAC on one gloo rank). Compiled, the dispatcher calls the
    functional op (``torch.compiler.is_compiling()``), which the list keeps."""
    mtp_without: tuple[str, ...] = ()
    """Parallel axes (``pp``, ``cp``) it runs no multi-token-prediction depth with: torchtitan
    0.3 raises "MTP does not support pipeline parallelism yet" and "... context parallelism
    yet" (torchtitan/models/deepseek_v3/mtp.py, 0.3.0 wheel; a torchtitan MoE user's trial, whose
    DeepSeek-V3 plan had pipelined its depth)."""
    # ---- calibration
    matmul_scale: float = 1.0
    """Multiplies the accelerator's GEMM efficiency (capped at 1)."""
    attention_scale: float = 1.0
    """Multiplies the accelerator's attention-kernel efficiency (capped at 1)."""
    memory_scale: float = 1.0
    """Multiplies the accelerator's memory-bound efficiency (capped at 1)."""
    network_scale: tuple[float, float] = (1.0, 1.0)
    """Multiplies the efficiency of the level inside a node and of every level beyond it."""
    kernel_overhead: float = 0.0
    """Seconds each kernel launch adds beyond the accelerator's own (eager frameworks' host-side
    dispatch that the GPU stream does not hide for small kernels)."""
    moe_layer_host: float = 0.0
    """Seconds of host work (Python, kernel launches) in one MoE layer's forward that the device
    cannot run ahead of. Dropless token dispatch copies the per-expert token counts to the host
    and waits for them before the exchange, once per MoE layer forward (Megatron-Core's
    ``_maybe_dtoh_and_synchronize`` in ``megatron/core/transformer/moe/token_dispatcher.py``),
    so the host is never ahead there: such a forward takes at least this long (the wait shows as
    ``host`` in the breakdown). Calibrated, like the multipliers above."""
    moe_syncs_without_ep: bool = True
    """The MoE layer waits on the host (``moe_layer_host``) without expert parallelism too:
    Megatron-Core's all-to-all dispatcher copies the per-expert token counts to the host at EP 1
    as well (``cuda_sync_point`` "before_finish", megatron/core/transformer/moe/token_dispatcher.py
    @ d98e8a64dd). torchtitan's falls back to a local reorder at EP 1 whose counts stay on the
    device (``AllToAllTokenDispatcher.dispatch``, torchtitan/models/common/token_dispatcher.py,
    0.3.0 wheel): no wait there (a review's finding)."""
    attention_host_share: float = 0.0
    """The part of ``moe_layer_host`` that the layer's attention launches: what per-layer graphs
    of the attention spare an MoE layer that itself runs eagerly (``cuda_graphs = "layers"``
    with ``attn`` among ``cuda_graph_modules``, or whole layers around an unpadded MoE layer).
    Calibrated, like the multipliers above."""
    overlap_efficiency: float = 0.7
    """Share of overlapped communication that compute actually hides (kernels share SMs and HBM)."""
    step_overhead: float = 0.05
    """Host-side seconds per optimizer step that no device work hides."""
    fitted_on: tuple[str, ...] = ()
    """The measured runs (or groups of them) its calibration was fitted on."""
    fitted_seq_len: tuple[int, ...] = ()
    """The least and the most sequence length of the runs ``calibrate`` fitted it on (empty for
    the catalog's stacks, whose README sections say what they were fitted on): a plan far outside
    them is noted, as its fitted attention share may not carry."""
    fitted_accelerators: tuple[str, ...] = ()
    """The accelerators of the runs ``calibrate`` fitted it on (empty for the catalog's)."""
    fitted_gpus: tuple[int, ...] = ()
    """The least and the most devices of the runs ``calibrate`` fitted it on (empty for the
    catalog's): a plan on far more or fewer is noted, as the network levels its groups cross and
    their overlap may not be those of the rows (a calibrating user's trial: a fit on one 8-GPU
    node moved a 512-GPU plan by 24 % without a word)."""
    fitted_kinds: tuple[str, ...] = ()
    """Of ``dense`` and ``moe``, the kinds of model the runs ``calibrate`` fitted it on were
    (empty for the catalog's): a model of the other kind is noted, as its pieces (the experts'
    exchange, grouped GEMMs and host waits, or their absence) were not in the rows."""

    def __post_init__(self):
        for key, words in CHOICES.items():  # (export_format may be None: no launcher export)
            value = getattr(self, key)
            if value not in words and not (key == "export_format" and value is None):
                raise SpecError(f"stack.{key}", value, "allowed: " + ", ".join(words))
        for key, what in (("fitted_seq_len", "sequence length of the runs, positive tokens"),
                          ("fitted_gpus", "devices of the runs, positive counts")):
            span = getattr(self, key)  # (empty: not said)
            if span and (len(span) != 2 or not 0 < span[0] <= span[1]):
                raise SpecError(f"stack.{key}", list(span), f"must be [least, most] {what}")
        _names("stack.fitted_kinds", self.fitted_kinds, FITTED_KINDS, "kinds must differ")
        for f in ("weight_bytes", "grad_bytes"):
            if getattr(self, f) not in (2, 4):
                raise SpecError(f"stack.{f}", getattr(self, f), "allowed: 2 (bf16) or 4 (fp32)")
        if self.expert_combine_bytes not in (2, 4):
            raise SpecError("stack.expert_combine_bytes", self.expert_combine_bytes,
                            "allowed: 2 (bf16) or 4 (fp32), bytes per element")
        if self.loss_saved_bytes not in (2, 4):
            raise SpecError("stack.loss_saved_bytes", self.loss_saved_bytes,
                            "allowed: 2 (the bf16 logits) or 4 (fp32), bytes per logit element")
        if self.loss_transient_bytes not in (0, 2, 4, 6, 8):
            raise SpecError("stack.loss_transient_bytes", self.loss_transient_bytes,
                            "allowed: 0, 2, 4, 6, 8 (bytes per logit element)")
        _names("stack.eager_ops", self.eager_ops, EAGER_OPS, "names must differ")
        if self.eager_code == "torchtitan" and "glu_clamp" in self.eager_ops \
                and self.fused_gated_mlp:
            # (torchtitan's count is what its eager clamped GLU moves beyond the unfused gated
            # activation the graph charges: graph.EAGER_PASSES; a review's)
            raise SpecError("stack.eager_ops", list(self.eager_ops), "torchtitan runs its "
                            "clamped GLU eagerly only where the gated MLP is unfused: leave "
                            "glu_clamp out, or set fused_gated_mlp = false")
        _names("stack.mtp_without", self.mtp_without, ("pp", "cp"), "axes must differ")
        mods = self.cuda_graph_modules
        _names("stack.cuda_graph_modules", mods, CUDA_GRAPH_MODULES, "modules must differ")
        if mods and self.cuda_graphs != "layers":
            raise SpecError("stack.cuda_graph_modules", list(mods),
                            f"only with cuda_graphs = layers (got {self.cuda_graphs})")
        if "moe" in mods and "moe_router" in mods:
            raise SpecError("stack.cuda_graph_modules", list(mods),
                            "moe and moe_router exclude each other (moe holds the router)")
        if "moe_preprocess" in mods and "moe_router" not in mods:
            raise SpecError("stack.cuda_graph_modules", list(mods),
                            "moe_preprocess needs moe_router")
        if "moe" in mods and not self.moe_pad_to_capacity:
            raise SpecError("stack.cuda_graph_modules", list(mods), "moe needs "
                            "moe_pad_to_capacity = true (static shapes; Megatron-Core graphs an "
                            "MoE layer only with drop-padding)")
        if self.moe_pad_to_capacity and self.moe_dispatcher != "alltoall":
            raise SpecError("stack.moe_pad_to_capacity", True, "Megatron-Core pads experts' inputs "
                            "only with moe_dispatcher = alltoall (allgather ignores it, DeepEP "
                            "refuses it)")
        if self.expert_layer_injected and self.expert_tp_with_ep:
            raise SpecError("stack.expert_layer_injected", True, "DeepSpeed's AutoEP runs experts "
                            "without expert TP (validate_folding_global): set "
                            "expert_tp_with_ep = false")
        if isinstance(self.loss_chunks, bool) or not isinstance(self.loss_chunks, int) \
                or not 1 <= self.loss_chunks <= MAX_LOSS_CHUNKS:
            raise SpecError("stack.loss_chunks", self.loss_chunks,
                            f"must be an integer in [1, {MAX_LOSS_CHUNKS}]: the chunks of each "
                            "sequence the loss runs over")
        if self.master_bytes not in (0, 4):
            raise SpecError("stack.master_bytes", self.master_bytes,
                            "allowed: 0 (no separate master copy) or 4 (fp32)")
        # upper bounds far beyond any measured value, so that a typo cannot print a step of
        # 1e308 s: the catalog's are 1.5 GiB, 0.05, 0.05 s, 0 us and 6.8 ms (the largest
        # allocator share fitted to torchtitan's peaks: 0.30)
        _nonneg("reserved_GiB", self.reserved_bytes / GiB, 1024)
        _nonneg("allocator_overhead", self.allocator_overhead, MAX_ALLOCATOR_OVERHEAD)
        _nonneg("step_overhead_s", self.step_overhead, 60)
        _nonneg("kernel_overhead_us", self.kernel_overhead / US, MAX_KERNEL_OVERHEAD_US)
        _nonneg("moe_layer_host_ms", self.moe_layer_host / MS, 1000)
        _nonneg("fp8_weight_cache_bytes", self.fp8_weight_cache_bytes, 8)
        _nonneg("attention_host_share", self.attention_host_share, 1)  # a share of the above
        for f in ("matmul_scale", "attention_scale", "memory_scale"):
            _positive_scale(f, getattr(self, f))
        if len(self.network_scale) != 2:
            raise SpecError("stack.network_scale", list(self.network_scale),
                            "give [inside a node, beyond it]")
        for v in self.network_scale:
            _positive_scale("network_scale", v)
        if not 0 <= self.overlap_efficiency <= 1:
            raise SpecError("stack.overlap_efficiency", self.overlap_efficiency, "must be in [0, 1]")
        names = [p.name for p in self.recompute]
        if not self.recompute or self.recompute[0] != Policy("none", "none"):
            raise SpecError("stack.recompute", names,
                            "every stack can run without recomputation: its first policy must "
                            "be none = \"none\" (plans name it when they recompute nothing)")
        if len(set(names)) != len(names):
            raise SpecError("stack.recompute", names, "policy names must differ")
        for name in names:
            if not name or any(c in name for c in ", \t*") or not name.isprintable():
                raise SpecError("stack.recompute", name, "a policy name is one word of "
                                "printable characters without commas or '*' (plans list one "
                                "per stage, comma-separated, name*k for k stages in a row)")
        self._check_megatron_combinations()
        if self.default_recompute is not None and self.default_recompute not in names:
            raise SpecError("stack.default_recompute", self.default_recompute,
                            "must be one of its recompute policies: " + ", ".join(names))
        if self.tp_overlap_beyond_domain is TPOverlap.FULL:
            raise SpecError("stack.tp_overlap_beyond_domain", "full", "allowed: none, backward "
                            "(a full overlap runs within one NVLink domain only)")
        _names("stack.schedules", self.schedules, tuple(SCHEDULES), "schedules must differ")
        _names("stack.schedules_min_pp_micro", self.schedules_min_pp_micro, tuple(SCHEDULES),
               "schedules must differ")
        if not self.schedules:
            raise SpecError("stack.schedules", [], "name at least one pipeline schedule (1f1b "
                            "runs a pipeline on every stack)")
        _names("stack.zero_stages", self.zero_stages, (0, 1, 2, 3), "stages must differ")
        if not self.zero_stages:
            raise SpecError("stack.zero_stages", [], "name at least one ZeRO stage")
        _names("stack.axes", self.axes, AXES, "axes must differ")
        if self.default_zero not in self.zero_stages:
            raise SpecError("stack.default_zero", self.default_zero,
                            "must be one of zero_stages " + str(list(self.zero_stages)))
        if self.default_zero_with_pp is not None and (
                self.default_zero_with_pp not in self.zero_stages
                or self.default_zero_with_pp > self.max_zero_with_pp):
            raise SpecError("stack.default_zero_with_pp", self.default_zero_with_pp,
                            f"must be one of zero_stages {list(self.zero_stages)} and at most "
                            f"max_zero_with_pp ({self.max_zero_with_pp})")
        if self.default_sp and "sp" not in self.axes:
            raise SpecError("stack.default_sp", True, "needs sp in axes (axes: "
                            f"{', '.join(self.axes) or 'none'}); add sp to axes or set "
                            "default_sp = false")
        if self.max_zero_with_pp not in (0, 1, 2, 3):
            raise SpecError("stack.max_zero_with_pp", self.max_zero_with_pp, "allowed: 0-3")

    def _check_megatron_combinations(self) -> None:
        """Combinations of CUDA graphs, expert overlap and recompute policies that Megatron-Core
        refuses (transformer_config.py @ d98e8a64dd; each checked against the installed release
        in the tests)."""
        whole = [p.name for p in self.recompute if p.kind in ("full", "every")]
        if self.cuda_graphs == "layers" and whole:
            raise SpecError("stack.recompute", whole, "with cuda_graphs = layers Megatron-Core "
                            "recomputes whole layers only under full_iteration graphs; offer "
                            "none, selective or modules:... policies")
        if self.moe_overlap == "batch":
            if self.moe_dispatcher == "allgather":
                raise SpecError("stack.moe_overlap", "batch", "Megatron-Core overlaps the expert "
                                "exchange with another micro-batch only with moe_dispatcher = "
                                "alltoall or flex")
            refused = [p.name for p in self.recompute if p.name in whole or "moe" in p.modules]
            if refused:
                raise SpecError("stack.recompute", refused, "with moe_overlap = batch "
                                "Megatron-Core recomputes neither whole blocks nor the moe "
                                "module; offer none, selective or other modules:... policies")
            graphed = [m for m in self.cuda_graph_modules if m in ("moe", "mlp")]
            if self.cuda_graphs == "layers" and graphed:
                raise SpecError("stack.cuda_graph_modules", list(self.cuda_graph_modules),
                                "with moe_overlap = batch Megatron-Core graphs neither moe nor "
                                "mlp (Transformer Engine's per-module graphs); leave "
                                f"{' and '.join(graphed)} out")
        shared_rec = [p.name for p in self.recompute if "shared_experts" in p.modules]
        if self.moe_overlap == "shared" and shared_rec:
            raise SpecError("stack.recompute", shared_rec, "shared_experts recomputation cannot "
                            "run with moe_overlap = shared (Megatron-Core refuses it with "
                            "--moe-shared-expert-overlap); offer other modules")
        moe_rec = [p.name for p in self.recompute if "moe" in p.modules]
        if "moe_router" in self.cuda_graph_modules and moe_rec:
            raise SpecError("stack.recompute", moe_rec, "a moe recompute module cannot hold a "
                            "graphed moe_router (Megatron-Core); offer other modules")

    @property
    def optimizer_bytes(self) -> int:
        """Optimizer bytes per parameter: Adam's fp32 m and v, plus the fp32 master copy."""
        return 8 + self.master_bytes

    def calibrated_as(self, other: "StackSpec") -> "StackSpec":
        """This stack's behaviour with ``other``'s calibration (the fields ``CALIBRATION`` names):
        what a stack file with ``base`` = a calibrated file gets, e.g. a variant of a stack that
        was calibrated on runs of the stack itself."""
        return replace(self, **{f: getattr(other, f) for f in CALIBRATION})

    def loss_chunks_for(self, model) -> int:
        """The chunks this stack computes ``model``'s loss over: ``loss_chunks``, or 1 with
        multi-token-prediction depths, whose loss torchtitan (the one stack that chunks) does not
        chunk ("TODO: Add ChunkedLoss support", ``MTPLoss``; ``MTPDecoder`` raises with the
        chunked wrapper's skipped head: torchtitan/models/deepseek_v3/mtp.py, 0.3.0 wheel; a
        review found the head's device 8 GiB under)."""
        return 1 if model.mtp_layers else self.loss_chunks

    def cp_exchange_for(self, model) -> str:
        """How this stack's context parallelism exchanges K/V for ``model``'s attention:
        ``cp_exchange``, or over sliding windows or sinks (``cp_gathers_windows``)
        ``"te_allgather"``, Transformer Engine's all-gather."""
        return "te_allgather" if self.cp_gathers_windows and (
            model.sliding_window or model.attention_sinks) else self.cp_exchange

    def pads_experts(self, training) -> bool:
        """Every expert's input is padded to the capacity ``training`` (a TrainingSpec) sets."""
        return self.moe_pad_to_capacity and training.moe_capacity is not None

    def graphs_moe_layers(self, training) -> bool:
        """An MoE layer replays inside a CUDA graph: a full iteration's, or its own per-layer
        graph (whole layers or the ``moe`` module) when its experts are padded."""
        mods = self.cuda_graph_modules
        return self.cuda_graphs == "full_iteration" or (
            self.cuda_graphs == "layers" and self.pads_experts(training)
            and (not mods or "moe" in mods))

    def moe_host_wait(self, training, ep: int) -> float:
        """Seconds an MoE layer's forward over ``ep`` expert ranks waits on the host: none inside
        a CUDA graph (see ``cuda_graphs``) or at EP 1 where the dispatcher keeps its counts on
        the device (``moe_syncs_without_ep``), ``moe_layer_host`` when it runs eagerly, less the
        attention's share when graphs hold the attention (``attention_host_share``)."""
        if self.graphs_moe_layers(training) or (ep == 1 and not self.moe_syncs_without_ep):
            return 0.0
        if self.graphs_attention:
            return self.moe_layer_host * (1 - self.attention_host_share)
        return self.moe_layer_host

    @property
    def graphs_attention(self) -> bool:
        """Per-layer CUDA graphs hold the attention (whole layers, or ``attn`` among
        ``cuda_graph_modules``)."""
        mods = self.cuda_graph_modules
        return self.cuda_graphs == "layers" and (not mods or "attn" in mods)

    def policy_index(self, name: str) -> int | None:
        """Position of the recompute policy ``name`` in ``recompute`` (None if not offered)."""
        for i, p in enumerate(self.recompute):
            if p.name == name:
                return i
        return None

    def policy(self, name: str) -> Policy:
        i = self.policy_index(name)
        if i is None:
            raise SpecError("recompute", name, self.policies_offered(name))
        return self.recompute[i]

    def policies_offered(self, name: str) -> str:
        """Why ``name`` is no recompute policy of this stack: the ones it offers, and for a
        recompute module's name how a stack file names a set of them (an MoE user's trial wrote
        Megatron's ``layernorm,moe_act`` in a runs CSV and was told of 'layernorm' alone)."""
        text = f"stack {self.name} offers " + ", ".join(p.name for p in self.recompute)
        if name in MODULES and any(p.modules for p in self.recompute):
            text += (f"; {name} is a recompute module: a set of them is a policy a stack file "
                     f"names (base = \"{self.name}\", then a [recompute] table, which replaces "
                     f"the base's, none first: none = \"none\", mine = \"modules:{name},...\"; "
                     f"modules: {', '.join(MODULES)})")
        return text

    @property
    def most_saving(self) -> str:
        """The name of its full-recomputation policy (else its last one)."""
        full = self.policies_of("full")
        return self.recompute[full[0] if full else -1].name

    def policies_of(self, kind: str) -> tuple[int, ...]:
        """Indices of its policies whose rule is of ``kind`` (``none``, ``full``, ...)."""
        return tuple(i for i, p in enumerate(self.recompute) if p.kind == kind)

    def offers(self, axis: str) -> bool:
        return axis in self.axes

    def sp_for(self, tp: int, moe: bool) -> bool:
        """Sequence parallelism where a run does not say: as its launchers set it with tensor
        parallelism (``default_sp``), and on for MoE layers with TP, which need it
        (``specs.check_plan``)."""
        return tp > 1 and self.offers("sp") and (self.default_sp or moe)

    @property
    def interleaves(self) -> bool:
        """It runs a pipeline schedule over several model chunks per device."""
        return any(SCHEDULES[s].chunks != "one" for s in self.schedules)

    def missing_axis(self, par) -> Refusal | None:
        """The first parallel axis ``par`` uses (a Parallelism, or any object with its degrees)
        that this stack does not offer, as (field, value, rule[, advice]); None when it offers
        them all."""
        n = self.name
        for axis, degree in (("tp", par.tp), ("cp", par.cp), ("ep", par.ep), ("pp", par.pp)):
            if degree > 1 and axis not in self.axes:
                return axis, degree, f"stack {n} has no {_AXIS_NAMES[axis]}", f"use {axis} = 1"
        if par.sp and "sp" not in self.axes:
            return "sp", True, f"stack {n} has no sequence parallelism"
        return None

    def unsupported(self, par, *, biased: bool) -> Refusal | None:
        """Why ``par`` (a :class:`~nestplan.specs.Parallelism`) is not a plan this stack runs, as
        (field, value, rule[, advice]) (``SpecError``'s arguments), or None when it is;
        ``biased``: the model's experts carry biases (``biased_experts``)."""
        n = self.name
        axis = self.missing_axis(par)
        if axis is not None:
            return axis
        if par.zero not in self.zero_stages:
            return "zero", par.zero, f"stack {n} runs ZeRO stages " + ", ".join(
                map(str, self.zero_stages))
        if self.cp_forces_sharding(par.zero, par.cp):
            sharded = [z for z in self.zero_stages if not self.cp_forces_sharding(z, par.cp)]
            return "zero", par.zero, (f"stack {n} shards the weights over the context-parallel "
                                      "ranks whenever cp > 1"), (
                "use zero = " + " or ".join(map(str, sharded)) if sharded else "use cp = 1")
        why = self.expert_tp_refusal(par.tp, par.ep, par.expert_tp, biased=biased) \
            or self.replicas_refusal(par)
        if why is not None:
            return why
        if par.pp > 1 and par.zero > self.max_zero_with_pp:
            return "zero", par.zero, (f"stack {n} runs at most ZeRO-{self.max_zero_with_pp} with "
                                      "pipeline parallelism")
        if par.pp > 1 and par.pipeline.name not in self.schedules:
            if par.schedule is None and par.vp > 1:
                return "vp", par.vp, f"stack {n} has no interleaved pipeline schedule", "use vp = 1"
            # (a stack without 1f1b had said "no interleaved pipeline schedule; use vp = 1" of
            # vp 1: a sixth fuzzing round's)
            return ("schedule", par.schedule or par.pipeline.name,
                    f"stack {n} runs " + ", ".join(self.schedules),
                    "" if par.schedule else "give the plan one of them")
        if par.vp == 1 and self.interleaving_required(par.ep, par.pp):
            return "vp", par.vp, (f"stack {n} overlaps the expert exchange with another "
                                  "micro-batch, which Megatron-Core does with pipelining only "
                                  "under an interleaved schedule"), "use vp > 1"
        layers = par.stage_layers
        if self.export_format == "torchtitan" and layers is not None and 0 in layers[1:-1]:
            # torchtitan names each model part's modules (module_fqns_per_model_part): a part
            # in the middle without a block has none (the export refused it after evaluate ran)
            return "stage_layers", list_text(layers), (
                f"stack {n} names each model chunk by its blocks (torchtitan's "
                f"module_fqns_per_model_part), and chunk {layers.index(0, 1)} holds none; give "
                "it blocks")
        for r in par.recompute:
            if self.policy_index(r) is None:
                return "recompute", r, self.policies_offered(r)
        if len(set(par.recompute)) > 1 and not self.recompute_per_stage:
            return "recompute", par.recompute_text, (
                f"stack {n} applies one policy to every stage")
        return None

    def expert_tps(self, tp: int, ep: int, *, biased: bool) -> tuple[int, ...]:
        """The expert-TP degrees it runs with these tensor- and expert-parallel degrees (none:
        experts that carry biases, ``biased``, where only TP could split them)."""
        allowed = tuple(sorted({1, tp})) if self.expert_tp_with_ep else (1,) if ep > 1 else (tp,)
        return allowed if self.expert_tp_with_bias or not biased else \
            (1,) if 1 in allowed else ()

    def default_etp(self, tp: int, ep: int, *, biased: bool) -> int | None:
        """The expert-TP degree a plan that does not give one has: None (experts follow TP) where
        the stack allows it, else the one it runs (torchtitan with EP: 1; Megatron-Core with
        biased experts: 1). Where it runs none (biased experts, no expert TP of its own, tp > 1)
        it is None too: the plan follows TP, and ``check`` refuses it by ``bias_refusal``."""
        allowed = self.expert_tps(tp, ep, biased=biased)
        return None if tp in allowed or not allowed else allowed[0]

    def bias_refusal(self, etp: int, *, biased: bool) -> tuple[str, object, str] | None:
        """Why experts (``biased``: carrying biases) cannot have this expert-TP degree here,
        whatever the other degrees (``expert_tp_with_bias``), or None."""
        if biased and etp > 1 and not self.expert_tp_with_bias:
            return "etp", etp, (f"stack {self.name} runs experts that carry biases at etp = 1 "
                                "only (expert_tp_with_bias = false; Megatron-Core's rule: 'Bias "
                                "in Moe is only supported when ETP==1')")
        return None

    def expert_tp_refusal(self, tp: int, ep: int, etp: int, *,
                          biased: bool) -> tuple[str, object, str] | None:
        """Why experts (``biased``: carrying biases) cannot have this expert-TP degree here
        (field, value, rule), or None."""
        why = self.bias_refusal(etp, biased=biased)
        if why is not None:
            return why
        if self.expert_tp_with_ep or etp in self.expert_tps(tp, ep, biased=False):
            return None
        return "etp", etp, (f"stack {self.name} has no expert tensor parallelism of its own: "
                            "etp must be " + ("1 with ep > 1" if ep > 1 else
                                              f"tp = {tp} without expert parallelism"))

    def flex_backend(self, cluster) -> str | None:
        """The backend of DeepEP's dispatcher (``moe_dispatcher = flex``) on ``cluster``, or None
        for another dispatcher: ``hybridep`` where the NVLink domain spans hosts ("Currently only
        'hybridep' backend supports the MNNVL case", moe_flex_dispatcher_backend,
        transformer_config.py @ NVIDIA/Megatron-LM d98e8a64dd; GB200/GB300 NVL72 recipes set it),
        else ``deepep``."""
        if self.moe_dispatcher != "flex":
            return None
        return "hybridep" if cluster.nvlink_spans_hosts else "deepep"

    def dispatcher_refusal(self, etp: int, ep: int, cluster) -> Refusal | None:
        """Why an MoE model's experts cannot be laid over ``etp`` x ``ep`` ranks of ``cluster`` by
        this stack's token dispatcher, or None: DeepEP's deepep backend (``flex_backend``)
        exchanges over the expert-TP x EP group, and Megatron-Core refuses one of a single rank
        ("DeepEP dispatcher requires TPxEP > 1", MoEFlexTokenDispatcher, megatron/core/
        transformer/moe/token_dispatcher.py @ NVIDIA/Megatron-LM d98e8a64dd; an MoE user's trial
        had been recommended ep = 1 with it); its hybridep backend has no such rule."""
        if etp * ep == 1 and self.flex_backend(cluster) == "deepep":
            return "ep", ep, (f"stack {self.name} dispatches tokens with DeepEP (moe_dispatcher "
                              "= flex), which Megatron-Core runs over more than one expert-TP x "
                              "EP rank only"), "use ep > 1, or a stack with the alltoall dispatcher"
        return None

    def replicas_refusal(self, par) -> tuple[str, object, str] | None:
        """Why ``par`` (any object with zero, ep, tp and cp) cannot lay its experts over its
        data-parallel ranks here (``replicas_hold_experts``), or None."""
        if not self.replicas_hold_experts(par):
            return None
        return "ep", par.ep, (f"stack {self.name} forms expert parallelism from sharded "
                              f"data-parallel ranks, and ZeRO-0's are replicas: ep must divide "
                              f"cp·tp = {par.cp * par.tp}, or use ZeRO "
                              + ", ".join(str(z) for z in self.zero_stages if z))

    def zeros_for(self, par) -> list[int]:
        """The ZeRO stages it runs ``par`` (a Parallelism) with: with its pipeline depth, without
        experts over data-parallel replicas, and sharded over CP ranks where it always shards
        them (``cp_shards_weights``)."""
        return [z for z in self.zero_stages if (par.pp == 1 or z <= self.max_zero_with_pp)
                and not self.replicas_hold_experts(par.with_(zero=z))
                and not self.cp_forces_sharding(z, par.cp)]

    def cp_forces_sharding(self, zero: int, cp: int) -> bool:
        """Whether a plan at ZeRO stage ``zero`` with ``cp`` context-parallel ranks is sharded
        otherwise than it says (``cp_shards_weights``: FSDP over the CP ranks, ZeRO-2 or 3)."""
        return self.cp_shards_weights and cp > 1 and zero < 2

    @property
    def params_are_master(self) -> bool:
        """The stored parameters are the fp32 master copy (FSDP mixed precision,
        ``master_bytes`` 0), cast to bf16 for compute; else bf16 weights sit beside a master
        copy in the optimizer."""
        return self.master_bytes == 0

    def default_zero_for(self, pp: int) -> int:
        """The ZeRO stage its launchers use for a plan of ``pp`` stages when a run does not say
        (``default_zero``, ``default_zero_with_pp``)."""
        if pp > 1 and self.default_zero_with_pp is not None:
            return self.default_zero_with_pp
        return self.default_zero

    def zero_unsaid(self, par) -> int:
        """The ZeRO stage a plan ``par`` (a Parallelism) that states none gets: the stack's own
        for its pipeline depth, or the most it runs with the plan (``evaluate`` without --zero,
        the NEST benchmark's paper plans)."""
        runs = self.zeros_for(par) or [0]
        zero = self.default_zero_for(par.pp)
        return zero if zero in runs else max(runs)

    def defers_grad_sync(self, pp: int, zero: int) -> bool:
        """A plan of ``pp`` stages at ZeRO stage ``zero`` reduces its sharded gradients once a step
        (``pipeline_defers_grad_sync``)."""
        return self.pipeline_defers_grad_sync and pp > 1 and zero >= 2

    @property
    def eager_code(self) -> str:
        """The framework whose eager kernels ``eager_ops`` are (``graph.EAGER_PASSES``):
        torchtitan's for a stack that exports to it, else Megatron-Core's (the only other one
        counted)."""
        return "torchtitan" if self.export_format == "torchtitan" else "megatron"

    def torch_compiled(self, async_tp: bool) -> bool:
        """torchtitan runs this stack's model under torch.compile: its fused norms and gated MLPs
        come from Inductor (its eager model code runs neither, torchtitan.toml) and async TP is a
        compile option (CompileConfig.enable_async_tensor_parallel, torchtitan/config/configs.py,
        0.3.0 wheel), ``async_tp``: the plan's TP runs it (``async_tp``). A stack that fuses
        nothing runs eagerly where its TP runs without async TP: the torchtitan export's rule and
        the eager Float8 note's (they had disagreed on a plan of one TP rank)."""
        return self.fused_norm or self.fused_gated_mlp or async_tp

    def async_tp(self, tp: int, group) -> bool:
        """A plan's TP of ``tp`` ranks laid out as ``group`` (a ``placement.GroupLayout``) runs
        torch's async TP: more than one rank, and a full overlap there (``tp_overlap_for``)."""
        return tp > 1 and self.tp_overlap_for(group) is TPOverlap.FULL

    def tp_overlap_for(self, group) -> TPOverlap:
        """The TP overlap of a TP group laid out as ``group`` (a ``placement.GroupLayout``):
        ``tp_overlap``, but ``tp_overlap_beyond_domain`` for a full overlap whose group leaves
        the innermost level."""
        if self.tp_overlap is TPOverlap.FULL and group.top > 0:
            return self.tp_overlap_beyond_domain
        return self.tp_overlap

    def bf16_optimizer(self, pp: int, zero: int) -> bool:
        """A plan of ``pp`` stages at ZeRO stage ``zero`` runs DeepSpeed's BF16_Optimizer
        (``pipeline_bf16_optimizer``)."""
        return self.pipeline_bf16_optimizer and pp > 1 and zero == 0

    def optimizer_sharded(self, pp: int, zero: int) -> bool:
        """The optimizer's states (and master weights) of a plan of ``pp`` stages at ZeRO stage
        ``zero`` are sharded over the data-parallel ranks, and the updated weights gathered."""
        return zero >= 1 or self.bf16_optimizer(pp, zero)

    def replicas_hold_experts(self, par) -> bool:
        """``par`` would need expert-parallel ranks among data-parallel replicas, which this
        stack does not form (``experts_over_sharded_ranks``)."""
        return (self.experts_over_sharded_ranks and par.ep > 1 and par.zero == 0
                and (par.cp * par.tp) % par.ep != 0)

    def schedule_refusal(self, schedule: str, pp: int, vp: int,
                         micro: int) -> tuple[str, object, str] | None:
        """Why this stack cannot run ``schedule`` over ``pp`` stages of ``vp`` chunks with
        ``micro`` micro-batches per replica: the schedule's own rule (``Schedule.check``), then
        the stack's (:meth:`micro_refusal`); None when it can."""
        return SCHEDULES[schedule].check(pp, vp, micro) or self.micro_refusal(schedule, pp, micro)

    def micro_refusal(self, schedule: str, pp: int, micro: int) -> tuple[str, object, str] | None:
        """Why ``pp`` stages cannot run ``micro`` micro-batches per replica under ``schedule`` on
        this stack, beyond the schedule's own rule (``schedules_min_pp_micro``, and
        ``interleaved_rounds`` for looped schedules), as (MICRO_BATCHES, micro, rule); None when
        they can."""
        looped = pp > 1 and SCHEDULES[schedule].looped_rounds
        rule = self.interleaved_rounds if looped else None
        if pp > 1 and micro < pp and (schedule in self.schedules_min_pp_micro or rule == "any"):
            other = " (gpipe runs fewer)" if "gpipe" in self.schedules else ""
            return MICRO_BATCHES, micro, (f"stack {self.name} runs {schedule} with at least "
                                          f"pp = {pp} per replica{other}")
        if rule == "pp" and micro % pp:
            return MICRO_BATCHES, micro, (f"stack {self.name} runs {schedule} in rounds of pp = "
                                          f"{pp}: their count must be a multiple of {pp}")
        if rule == "floor" and not _floor_rounds_run(micro, pp):
            r = max(1, micro // pp)
            below = next(m for m in range(micro - 1, 0, -1) if _floor_rounds_run(m, pp))
            above = next(m for m in itertools.count(micro + 1) if _floor_rounds_run(m, pp))
            # (the rounds change with the count: "a multiple of 10" for 32 over pp 3 had not
            # been true of 40, whose 13 rounds 40 is no multiple of: a new user's trial)
            return MICRO_BATCHES, micro, (f"stack {self.name} runs {schedule} in max(1, m // pp) "
                                          f"rounds (pp = {pp}), of which m must be a multiple: "
                                          f"{micro} makes {r}; the nearest counts it runs are "
                                          f"{below} and {above}")
        return None

    def interleaving_required(self, ep: int, pp: int) -> bool:
        """Plans with these degrees run only with virtual stages: the expert exchange overlapped
        with another micro-batch under pipelining (``moe_overlap = "batch"``)."""
        return self.moe_overlap == "batch" and ep > 1 and pp > 1

    def check(self, par, *, biased: bool) -> None:
        """Raise a SpecError when this stack cannot run ``par`` (``biased``: of a model whose
        experts carry biases)."""
        why = self.unsupported(par, biased=biased)
        if why is not None:
            raise SpecError(*why)


_AXIS_NAMES = {"tp": "tensor parallelism", "cp": "context parallelism",
               "ep": "expert parallelism", "pp": "pipeline parallelism"}


def _nonneg(field: str, value: float, most: float) -> None:
    if not within(value, most):
        raise SpecError(f"stack.{field}", value, f"must be a number >= 0 and at most {most:g}")


MIN_SCALE = 0.01
"""Least calibration multiplier: a stack 100 times below its accelerator's efficiencies is no
calibration (``calibrate`` refuses rows predicted 10 times off, ``calibrate.FARTHEST``)."""


def _positive_scale(field: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value)
            and MIN_SCALE <= value <= 10):
        raise SpecError(f"stack.{field}", value,
                        f"must be a multiplier in [{MIN_SCALE:g}, 10]")


def scaled(efficiency: float, scale: float) -> float:
    """An efficiency times a stack multiplier, capped at 1 and floored at the least efficiency a
    file may state (``specs.MIN_EFFICIENCY``): each is valid alone, and a multiplier below 1 on
    an accelerator's least efficiency still describes hardware, at that floor."""
    return min(1.0, max(MIN_EFFICIENCY, efficiency * scale))


def _floor_rounds_run(micro: int, pp: int) -> bool:
    """``micro`` micro-batches run in max(1, micro // pp) equal rounds (torchtitan's looped
    schedules: ``interleaved_rounds = "floor"``)."""
    return micro % max(1, micro // pp) == 0
