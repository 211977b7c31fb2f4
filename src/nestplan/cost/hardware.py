"""The hardware as a stack runs it: the accelerator's and network's efficiencies scaled by the
stack's calibrated multipliers (``StackSpec.matmul_scale`` and the others), capped at 1.

Every cost function takes the cluster this returns, so a stack's calibration reaches the
compute and collective times in one place.
"""

from __future__ import annotations

from dataclasses import replace

from ..caching import cached
from ..specs import ClusterSpec
from ..stack import StackSpec, scaled


@cached(maxsize=256)
def effective(cluster: ClusterSpec, stack: StackSpec) -> ClusterSpec:
    """``cluster`` with efficiencies scaled by ``stack`` (the same object when nothing scales)."""
    if (stack.matmul_scale, stack.attention_scale, stack.memory_scale) == (1.0, 1.0, 1.0) \
            and stack.network_scale == (1.0, 1.0) and stack.kernel_overhead == 0.0:
        return cluster
    acc = cluster.accelerator

    def table(points):
        return tuple((f, scaled(e, stack.matmul_scale)) for f, e in points)

    acc = replace(acc, matmul_efficiency_bf16=table(acc.matmul_efficiency_bf16),
                  matmul_efficiency_fp8=table(acc.matmul_efficiency_fp8),
                  attention_efficiency=tuple(scaled(e, stack.attention_scale)
                                             for e in acc.attention_efficiency),
                  memory_efficiency=scaled(acc.memory_efficiency, stack.memory_scale),
                  kernel_overhead=acc.kernel_overhead + stack.kernel_overhead)
    inner, outer = stack.network_scale
    levels = tuple(replace(lv, efficiency=scaled(lv.efficiency, inner if i == 0 else outer))
                   for i, lv in enumerate(cluster.levels))
    return replace(cluster, accelerator=acc, levels=levels)
