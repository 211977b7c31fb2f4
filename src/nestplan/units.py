"""Unit conversions (SI inside nestplan: bytes, seconds, FLOP, bytes/s).

Files carry units in their keys (``bandwidth_GBps``, ``latency_us``, ``hbm_GiB``); this module is
the one place where those are turned into SI values and back into human-readable text.
"""

import math
import re

GB = 1e9
KiB = 2.0**10
MiB = 2.0**20
GiB = 2.0**30
US = 1e-6
MS = 1e-3
TFLOPS = 1e12


def gbps(value: float) -> float:
    """Decimal GB/s to bytes/s."""
    return value * GB


def gibps(value: float) -> float:
    """GiB/s (2^30 bytes per second) to bytes/s."""
    return value * GiB


def fmt_gib(nbytes: float) -> str:
    """Bytes as GiB with one decimal, two below 0.1 GiB (so a small shortfall does not read 0.0),
    e.g. ``fmt_gib(3 * 2**25) == '0.09'``."""
    return f"{nbytes / GiB:.2f}" if 0 < abs(nbytes) < 0.1 * GiB else f"{nbytes / GiB:.1f}"


def fmt_gib_against(nbytes: float, limit: float) -> tuple[str, str]:
    """Two byte counts as GiB with one decimal, or as many more (up to six) as it takes for a
    value that differs from the limit not to print as equal to it (``79.63 GiB of 79.60``, not
    ``79.6 of 79.6``)."""
    digits = 1
    while (digits < 6 and nbytes != limit
           and f"{nbytes / GiB:.{digits}f}" == f"{limit / GiB:.{digits}f}"):
        digits += 1
    return f"{nbytes / GiB:.{digits}f}", f"{limit / GiB:.{digits}f}"


def counted(count: int, noun: str) -> str:
    """``1 point``, ``2,000 points``: a count with its noun, plural but for one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def fmt_time(t: float) -> str:
    """Seconds as s/ms/us text, e.g. ``fmt_time(0.0123) == '12.30 ms'``."""
    if abs(t) >= 1.0:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"



_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_WHOLE = re.compile(r"-?[0-9]+")


def decimal(text: str) -> float | None:
    """A number as people write one in ASCII (``12``, ``-0.5``, ``1e-3``), or None: not the other
    forms Python's ``float`` takes (``1_5`` read as 15, other scripts' digits, ``inf``, ``nan``,
    a leading ``+``), so that a typo is refused rather than read as some other value."""
    if not _DECIMAL.fullmatch(text.strip()):
        return None
    value = float(text)
    return value if math.isfinite(value) else None  # (1e400)


def whole(text: str) -> int | None:
    """A whole number in ASCII digits (a leading ``-`` allowed, for the range check to name), or
    None."""
    text = text.strip()
    if not _WHOLE.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (4,300)
        return None


def counts(parts) -> tuple[int, ...] | None:
    """Whole numbers >= 0 in ASCII digits (blocks per model chunk, say), or None when any part is
    not one."""
    values = tuple(whole(p) for p in parts)
    return None if any(v is None or v < 0 for v in values) else values
