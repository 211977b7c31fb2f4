"""What the frameworks' own sharding code sends, measured on CPU, against the stacks' costs.

``frameworks_fsdp_gathers.py`` (beside this file) runs PyTorch's FSDP2 on two gloo ranks and
counts the parameter all-gathers of one step with and without checkpointing each sharded block.
"""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.catalog import get_stack
from nestplan.evaluate import evaluate, scenario_from_names
from nestplan.specs import Parallelism

SCRIPT = Path(__file__).parent / "frameworks_fsdp_gathers.py"


@pytest.mark.frameworks
def test_fsdp_gathers_a_checkpointed_block_once_per_backward():
    """A whole-block checkpoint inside an FSDP unit re-runs its forward within the unit's
    backward, after the backward's own all-gather: no extra gather. The FSDP stacks cost it so;
    a stack that gathers operator by operator (DeepSpeed ZeRO-3) gathers again."""
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    counts = json.loads(p.stdout.strip().splitlines()[-1])
    assert counts["checkpointed"] == counts["plain"] == 2 * counts["blocks"]

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=16,
                             stack="torchtitan")

    def zero_link(stack, policy):
        par = Parallelism(dp=16, zero=3, recompute=(policy,), mbs=1)
        ev = evaluate(replace(sc, stack=stack), par)
        return ev.link_time["dp"]

    fsdp = get_stack("torchtitan")
    assert zero_link(fsdp, "full") == pytest.approx(zero_link(fsdp, "none"), rel=1e-9)
    per_op = replace(fsdp, name="per-op", gather_whole_block=False)
    assert zero_link(per_op, "full") > 1.2 * zero_link(per_op, "none")
