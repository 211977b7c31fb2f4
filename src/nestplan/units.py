"""Unit conversions (SI inside nestplan: bytes, seconds, FLOP, bytes/s).

Files carry units in their keys (``bandwidth_GBps``, ``latency_us``, ``hbm_GiB``); this module is
the one place where those are turned into SI values and back into human-readable text.
"""

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
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


def fmt_bytes(n: float) -> str:
    """Bytes as GiB/MiB text, e.g. ``fmt_bytes(3 * 2**30) == '3.00 GiB'``."""
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / KiB:.1f} KiB"


def fmt_time(t: float) -> str:
    """Seconds as s/ms/us text, e.g. ``fmt_time(0.0123) == '12.30 ms'``."""
    if abs(t) >= 1.0:
        return f"{t:.3f} s"
    if abs(t) >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_rate(x: float) -> str:
    """A large rate with an SI prefix, e.g. ``fmt_rate(1.5e6) == '1.50 M'``."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix}"
    return f"{x:.2f} "
