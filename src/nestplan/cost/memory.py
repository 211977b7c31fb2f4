"""Memory per device: model states by ZeRO stage, activations by recompute policy, reserves.

Model states with mixed-precision Adam, per parameter (Rajbhandari et al., ZeRO, SC'20 §3.1;
Megatron-LM ``docs/distrib_optimizer.md``):

    weights     2 bytes (bf16)                                      / N with ZeRO-3
    gradients   ``grad_bytes`` (4: Megatron's fp32 main grads; 2: bf16) / N with ZeRO-2 and -3
    optimizer   12 bytes: fp32 master weights, Adam m and v           / N with ZeRO-1, -2, -3

where N is the data-parallel group that shards them (dp·cp for dense weights, the expert
data-parallel group for routed experts). With 2-byte gradients this is the ZeRO paper's 16Ψ,
4Ψ + 12Ψ/N, 2Ψ + 14Ψ/N and 16Ψ/N; with fp32 gradients it is Megatron's 18 bytes per parameter and
6 + 12/d for the distributed optimizer.

Reserve kept on every device for what the model above does not track: the CUDA context, cuBLAS
and NCCL workspaces (``RESERVED_BYTES``), and allocator fragmentation (``FRAGMENTATION`` of the
activation and transient bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..units import GiB

WEIGHT_BYTES = 2
OPTIMIZER_BYTES = 12
RESERVED_BYTES = 1.5 * GiB
FRAGMENTATION = 0.05


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


def bytes_per_param(zero: int, n: int, grad_bytes: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter under ZeRO stage ``zero`` over ``n``."""
    w = WEIGHT_BYTES / (n if zero >= 3 else 1)
    g = grad_bytes / (n if zero >= 2 else 1)
    o = OPTIMIZER_BYTES / (n if zero >= 1 else 1)
    return w, g, o


def model_states(params: float, expert_params: float, zero: int, dp: int, edp: int,
                 grad_bytes: int) -> tuple[float, float, float]:
    """Bytes of (weights, gradients, optimizer) for the parameters held by one device."""
    dw, dg, do = bytes_per_param(zero, dp, grad_bytes)
    ew, eg, eo = bytes_per_param(zero, edp, grad_bytes)
    return (params * dw + expert_params * ew, params * dg + expert_params * eg,
            params * do + expert_params * eo)


def reserve(activations: float, transient: float) -> float:
    return RESERVED_BYTES + FRAGMENTATION * (activations + transient)
