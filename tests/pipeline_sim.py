"""A small discrete-event simulation of 1F1B and interleaved-1F1B pipeline schedules.

Each device runs its operations in Megatron's order; an operation starts when its device is free
and its input is ready (the previous model chunk's forward, or the next chunk's backward).
Used by the tests to check the closed forms in ``nestplan.cost.pipeline``.
"""

from __future__ import annotations


def device_order(rank: int, pp: int, vp: int, micro: int) -> list[tuple[str, int, int]]:
    """(kind, local chunk, micro-batch) in the order device ``rank`` runs them."""
    total = micro * vp
    if vp == 1:
        warm = min(pp - rank - 1, micro)
    else:
        warm = min((pp - rank - 1) * 2 + (vp - 1) * pp, total)

    def fwd(k):
        group, pos = divmod(k, pp * vp)
        return ("F", (k // pp) % vp, group * pp + pos % pp)

    def bwd(k):
        group, pos = divmod(k, pp * vp)
        return ("B", vp - 1 - (k // pp) % vp, group * pp + pos % pp)

    ops, f, b = [], 0, 0
    for _ in range(warm):
        ops.append(fwd(f))
        f += 1
    while f < total:
        ops.append(fwd(f))
        f += 1
        ops.append(bwd(b))
        b += 1
    while b < total:
        ops.append(bwd(b))
        b += 1
    return ops


def simulate(fwd: list[float], bwd: list[float], micro: int, vp: int = 1) -> float:
    """Makespan of the schedule; ``fwd[i]``/``bwd[i]`` are one chunk's times on device ``i``."""
    pp = len(fwd)
    orders = [device_order(r, pp, vp, micro) for r in range(pp)]
    done: dict[tuple[str, int, int], float] = {}
    pos = [0] * pp
    free = [0.0] * pp
    last = pp * vp - 1
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, local, mb = orders[r][pos[r]]
                g = local * pp + r  # global chunk index
                if kind == "F":
                    dep = ("F", g - 1, mb) if g > 0 else None
                else:
                    dep = ("B", g + 1, mb) if g < last else ("F", g, mb)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                end = start + (fwd[r] if kind == "F" else bwd[r])
                done[(kind, g, mb)] = end
                free[r] = end
                pos[r] += 1
                progress = True
    assert all(pos[r] == len(orders[r]) for r in range(pp)), "schedule deadlocked"
    return max(free)
