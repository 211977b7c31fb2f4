"""Memory per device: model states by ZeRO stage, activations by recompute policy, reserves.

Model states with mixed-precision Adam, per parameter (Rajbhandari et al., ZeRO, SC'20 §3.1;
Megatron-LM ``docs/distrib_optimizer.md``), with the byte counts of the stack:

    weights     ``weight_bytes`` (2: bf16 beside an fp32 master; 4: FSDP's fp32 parameters) / N with ZeRO-3
    gradients   ``grad_bytes`` (4: fp32 main grads; 2: bf16)              / N with ZeRO-2 and -3
    optimizer   Adam m and v (8) + ``master_bytes`` (4, or 0 under FSDP)  / N with ZeRO-1, -2, -3

where N is the data-parallel group that shards them (dp·cp for dense weights, the expert
data-parallel group for routed experts). With 2-byte gradients this is the ZeRO paper's 16Ψ,
4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N; with fp32 gradients it is Megatron's 18 bytes per parameter and
6 + 12/d for the distributed optimizer; FSDP with fp32 parameters and gradients keeps 16Ψ/N.
FSDP's ZeRO-2 (no resharding after forward: a stack whose stored parameters are the master,
``StackSpec.params_are_master``) also keeps their bf16 copies whole from forward to backward: weights
``weight_bytes`` / N + 2. DeepSpeed's pipeline engine at ZeRO-0 shards the optimizer as ZeRO-1
does and keeps two gradient buffers, 2 · ``grad_bytes`` (``StackSpec.pipeline_bf16_optimizer``).
In fp8 training the blocks' weights add Transformer Engine's cached fp8 copies,
``fp8_weight_cache_bytes`` each, unless the stack keeps fp8 weights in their place under a sharded
optimizer (``StackSpec.fp8_primary_weights``).

Reserve kept on every device for what the model above does not track: the CUDA context, cuBLAS
and NCCL workspaces (the stack's ``reserved_bytes``), and the caching allocator's reserved but
unused memory (the stack's ``allocator_overhead``, a share of activation and transient bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..options import Precision

COMPUTE_BYTES = 2
"""Bytes per weight element as the GEMMs use it and as ZeRO-3/FSDP gathers it in bf16 (fp8
gathers: ``gather_bytes``)."""
FP8_BYTES = 1


def gathers_fp8(stack, precision, zero: int) -> bool:
    """ZeRO-3/FSDP and the sharded optimizer (ZeRO ``zero``) all-gather the transformer blocks'
    weights in fp8: fp8 training on a stack that gathers them so, torchao's
    (``fp8_param_gather``) or Megatron-LM's fp8 primary weights under a sharded optimizer
    (``fp8_primary_weights``: its parameter buffer holds them as bytes, ``torch.uint8`` for
    quantized parameters, ``_param_uses_quantized_storage`` in megatron/core/distributed/
    param_and_grad_buffer.py @ NVIDIA/Megatron-LM d98e8a64dd; they had been costed in bf16)."""
    return (precision is Precision.FP8 and stack.fp8_param_gather) or fp8_primary(
        stack, precision, zero)


def fp8_primary(stack, precision, zero: int) -> bool:
    """fp8 training keeps the weights of Transformer Engine's modules as fp8 tensors under a
    sharded optimizer (ZeRO ``zero`` >= 1: ``StackSpec.fp8_primary_weights``, Megatron-LM's
    ``--fp8-param-gather``): no cached copy beside them, and gathered as bytes."""
    return precision is Precision.FP8 and zero >= 1 and stack.fp8_primary_weights


def gather_bytes(layer, stack, precision, zero: int) -> float:
    """Bytes per dense weight of ``layer`` (a ``graph.LayerGraph``) that ZeRO-3/FSDP and the
    sharded optimizer all-gather: bf16, or fp8 for the weights of transformer blocks where they
    gather so (``gathers_fp8``): ``LayerGraph.block_weights``, a block's own or a head's
    multi-token-prediction depths' (the weights ``fp8_weight_cache_bytes`` counts too); a
    block's norm weights, a few hidden-sized vectors, are counted with its linear layers, and
    the embedding and output layer, no Transformer Engine or ``nn.Linear`` converted modules,
    stay bf16."""
    if not layer.params or not gathers_fp8(stack, precision, zero):
        return COMPUTE_BYTES
    blocks = layer.block_weights
    return (blocks * FP8_BYTES + (layer.params - blocks) * COMPUTE_BYTES) / layer.params


def expert_gather_bytes(stack, precision, zero: int) -> float:
    """Bytes per routed-expert weight that ZeRO-3/FSDP and the sharded optimizer all-gather:
    bf16 under torchao's fp8 gathers (it converts ``nn.Linear`` modules, and grouped expert
    weights are none), fp8 under Megatron-LM's fp8 primary weights (Transformer Engine's grouped
    linear layers hold them quantized too: ``gather_bytes``)."""
    return FP8_BYTES if fp8_primary(stack, precision, zero) else COMPUTE_BYTES


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes on one device at its peak."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    """Saved activations of the micro-batches in flight."""
    transient: float
    """Working memory of the op being run: a recomputed layer, gradients of logits, ZeRO-3
    gathered weights."""
    reserved: float
    """CUDA context, library workspaces, communication buffers and fragmentation."""

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations
                + self.transient + self.reserved)


def bytes_per_param(zero: int, n: int, stack, pp: int = 1) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter under ZeRO stage ``zero`` over ``n``
    with the byte counts of ``stack`` (a StackSpec), in a plan of ``pp`` stages (where the
    gradients accumulate unsharded until a reduction once a step, ``StackSpec.defers_grad_sync``;
    or DeepSpeed's BF16_Optimizer shards the optimizer, ``StackSpec.bf16_optimizer``)."""
    deferred = stack.defers_grad_sync(pp, zero)
    w = stack.weight_bytes / (n if zero >= 3 else 1)
    if (zero == 2 or (zero == 3 and deferred)) and stack.params_are_master:
        # (and under a pipeline that defers the reduction, ZeRO-3's too: PyTorch's schedules turn
        # resharding after backward off with the gradient sync, so the stage's weights stay
        # gathered from one backward to the next forward: set_reshard_after_backward(False) in
        # torch/distributed/pipelining/stage.py, torch 2.13.0 wheel)
        # FSDP without resharding after forward (SHARD_GRAD_OP; FSDP2's reshard_after_forward
        # false): the stored parameters, the master copy, stay sharded, and their compute-dtype
        # copies, gathered by the forward, stay whole until the backward has run
        # (FSDPParam.unsharded_param, torch/distributed/fsdp/_fully_shard/_fsdp_param.py, torch
        # 2.13.0 wheel); bf16 (an fp8 gather's copy would be smaller)
        w = stack.weight_bytes / n + COMPUTE_BYTES
    g = stack.grad_bytes / (n if zero >= 2 and not deferred else 1)
    if stack.bf16_optimizer(pp, zero):  # the parameters' gradients and the buffer they add into
        g = 2 * stack.grad_bytes
    o = stack.optimizer_bytes / (n if stack.optimizer_sharded(pp, zero) else 1)
    return w, g, o


def model_states(params: float, expert_params: float, zero: int, dp: int, edp: int,
                 stack, pp: int = 1) -> tuple[float, float, float]:
    """Bytes of (weights, gradients, optimizer) for the parameters held by one device of a plan
    of ``pp`` stages (as ``bytes_per_param``)."""
    dw, dg, do = bytes_per_param(zero, dp, stack, pp)
    ew, eg, eo = bytes_per_param(zero, edp, stack, pp)
    return (params * dw + expert_params * ew, params * dg + expert_params * eg,
            params * do + expert_params * eo)


def fp8_weight_cache_bytes(zero: int, stack, precision) -> float:
    """Bytes per transformer-block weight of the quantized copies that fp8 training keeps across
    a step's micro-batches (``StackSpec.fp8_weight_cache_bytes``): none where the stack keeps fp8
    weights in their place under a sharded optimizer (``StackSpec.fp8_primary_weights``), or in
    bf16."""
    if precision is not Precision.FP8 or fp8_primary(stack, precision, zero):
        return 0.0
    return stack.fp8_weight_cache_bytes


def reserve(activations: float, transient: float, stack) -> float:
    return stack.reserved_bytes + stack.allocator_overhead * (activations + transient)
