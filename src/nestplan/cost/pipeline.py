"""Pipeline schedules in closed form: 1F1B and interleaved 1F1B (Narayanan et al. SC'21 §2.2).

With ``m`` micro-batches, ``p`` devices, ``v`` model chunks per device and ``X_i`` the forward +
backward time of one micro-batch on device ``i`` (all its chunks), the schedule takes::

    T = m · max_i X_i + (sum_i X_i - max_i X_i) / v

For equal stages this is ``(m + (p - 1) / v) · X``: the familiar bubble of ``(p - 1) / v``
micro-batch times. ``tests/test_pipeline.py`` checks these forms against a discrete-event
simulation of the schedules.
"""

from __future__ import annotations


def schedule_time(x: list[float], micro: int, vp: int = 1) -> float:
    """Seconds for ``micro`` micro-batches through devices with per-micro-batch times ``x``."""
    if not x:
        return 0.0
    peak = max(x)
    return micro * peak + (sum(x) - peak) / vp


def warmup_chunks(stage: int, pp: int, vp: int, micro: int) -> int:
    """Micro-batch chunks whose activations device ``stage`` holds at its peak.

    1F1B: stage ``i`` runs ``p - i`` forwards before its first backward. Interleaved (Megatron's
    ``get_num_warmup_microbatches``): ``2·(p - i - 1) + (v - 1)·p`` warm-up forwards, plus the one
    in flight. Never more than the ``m·v`` chunks that exist.
    """
    if vp == 1:
        return min(pp - stage, micro)
    return min(2 * (pp - stage - 1) + (vp - 1) * pp + 1, micro * vp)


def chunks_in_flight(stage: int, pp: int, vp: int, micro: int) -> list[int]:
    """How many micro-batches of each of the device's ``vp`` chunks are held at the peak.

    Megatron's interleaved warm-up runs ``p`` forwards of chunk 0, then ``p`` of chunk 1, ...
    """
    total = warmup_chunks(stage, pp, vp, micro)
    if vp == 1:
        return [total]
    held = []
    for j in range(vp):
        held.append(max(0, min(pp, total - j * pp, micro)))
    # what the warm-up pattern leaves over (more than p·v chunks) returns to chunk 0 and on
    extra = total - sum(held)
    j = 0
    while extra > 0 and j < vp:
        add = min(extra, micro - held[j])
        held[j] += add
        extra -= add
        j += 1
    return held
