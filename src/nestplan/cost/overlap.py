"""How much communication hides behind computation that runs at the same time.

Overlapped kernels compete for SMs and HBM bandwidth, so hidden communication is not free: of the
time it overlaps with compute, a fraction ``1 - efficiency`` still shows. The efficiency is a
stack's calibration (``StackSpec.overlap_efficiency``, in its catalog file with the runs it was
fitted on). For scale: NeMo's userbuffers presets give 2-24 SMs of 132 to each overlapped
collective (NVIDIA/NeMo tp_overlap_configs/userbuffers.py).
"""

import numpy as np


def exposed(comm, window, efficiency: float):
    """Seconds of ``comm`` that show when it overlaps ``window`` seconds of compute, of which
    ``efficiency`` is really hidden. Works on numbers and numpy arrays alike."""
    hidden = np.minimum(comm, np.maximum(window, 0.0))
    return comm - efficiency * hidden
