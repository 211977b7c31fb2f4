"""How much communication hides behind computation that runs at the same time.

Overlapped kernels compete for SMs and HBM bandwidth, so hidden communication is not free: of the
time it overlaps with compute, a fraction ``1 - OVERLAP_EFFICIENCY`` still shows. The value is
calibrated once, by hand against ``nestplan validate``'s table, on the published runs whose
communication overlaps compute: ZeRO-3 at large batch (Narayanan et al. 2021 Table 2) and the H100
runs with overlapped data-parallel and tensor-parallel traffic. For scale: NeMo's userbuffers
presets give 2-24 SMs of 132 to each overlapped collective (NVIDIA/NeMo
tp_overlap_configs/userbuffers.py).
"""

import numpy as np

OVERLAP_EFFICIENCY = 0.7


def exposed(comm, window):
    """Seconds of ``comm`` that show when it overlaps ``window`` seconds of compute.

    Works on numbers and numpy arrays alike.
    """
    hidden = np.minimum(comm, np.maximum(window, 0.0))
    return comm - OVERLAP_EFFICIENCY * hidden
