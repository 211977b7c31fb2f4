"""The pipeline schedule operation by operation: 1F1B and interleaved 1F1B, as Megatron runs them.

Each device runs its operations in Megatron's order (warm-up forwards, then one forward and one
backward alternately, then the cool-down backwards); an operation starts when its device is free
and its input has arrived (the previous chunk's forward output, or the next chunk's gradient,
plus the send time between the two devices). ``cost/pipeline.py`` has the closed form the cost
model uses; ``tests/test_pipeline.py`` checks one against the other, and the HTML report draws
these operations as the pipeline timeline.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """One forward or backward of one micro-batch through one model chunk."""

    stage: int
    """Pipeline device position."""
    chunk: int
    """Model chunk in model order (``local chunk · pp + stage``)."""
    kind: str
    """``"F"`` (forward) or ``"B"`` (backward, with any recomputation)."""
    micro: int
    start: float
    """Seconds from the start of the step."""
    end: float


def device_order(rank: int, pp: int, vp: int, micro: int) -> list[tuple[str, int, int]]:
    """(kind, local chunk, micro-batch) in the order device ``rank`` runs them."""
    total = micro * vp
    if vp == 1:
        warm = min(pp - rank - 1, micro)
    else:
        warm = min((pp - rank - 1) * 2 + (vp - 1) * pp, total)

    def nth(k: int, backward: bool) -> tuple[str, int, int]:
        group, pos = divmod(k, pp * vp)
        local = (k // pp) % vp
        return ("B", vp - 1 - local, group * pp + pos % pp) if backward else \
            ("F", local, group * pp + pos % pp)

    ops, f, b = [], 0, 0
    for _ in range(warm):
        ops.append(nth(f, False))
        f += 1
    while f < total:
        ops.append(nth(f, False))
        f += 1
        ops.append(nth(b, True))
        b += 1
    while b < total:
        ops.append(nth(b, True))
        b += 1
    return ops


def simulate(fwd: list[list[float]], bwd: list[list[float]], micro: int,
             send: list[float] | None = None) -> list[Op]:
    """Every operation of one step with its start and end.

    ``fwd[i][c]`` and ``bwd[i][c]`` are the seconds of one micro-batch through local chunk ``c``
    of device ``i`` (each device holds the same number of chunks); ``send[i]`` is the transfer
    time from device ``i`` to the next one (device ``pp - 1`` sends to device 0 between
    interleaved chunks). The schedule assumes the device order above and deadlock-free inputs.
    """
    pp, vp = len(fwd), len(fwd[0])
    send = send or [0.0] * pp
    orders = [device_order(r, pp, vp, micro) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * pp, [0.0] * pp
    last = pp * vp - 1
    out: list[Op] = []
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, local, mb = orders[r][pos[r]]
                g = local * pp + r
                if kind == "F":
                    dep, wire = (("F", g - 1, mb), send[(g - 1) % pp]) if g > 0 else (None, 0.0)
                elif g < last:
                    dep, wire = ("B", g + 1, mb), send[g % pp]
                else:
                    dep, wire = ("F", g, mb), 0.0
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] + wire if dep else 0.0)
                end = start + (fwd[r][local] if kind == "F" else bwd[r][local])
                done[(kind, g, mb)] = end
                out.append(Op(r, g, kind, mb, start, end))
                free[r] = end
                pos[r] += 1
                progress = True
    if any(pos[r] < len(orders[r]) for r in range(pp)):
        raise ValueError("pipeline schedule deadlocked")  # an internal error, not user input
    return out


def makespan(ops: list[Op]) -> float:
    return max((o.end for o in ops), default=0.0)
