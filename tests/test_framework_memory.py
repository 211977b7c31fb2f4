"""What the frameworks' own layer code keeps for backward, measured on CPU, against the stacks.

``frameworks_saved.py`` (beside this file) runs torchtitan 0.3's Llama block on CPU in a fresh
process and counts the bytes saved for backward with ``saved_tensors_hooks`` (one entry per
storage, parameters excluded; see its docstring for the attention stand-in that saves what a
flash kernel saves, since FlexAttention has no CPU backward). The ``torchtitan`` stack's layer
graph must agree within 10 % for each recompute policy. Its RMSNorm runs unfused on CPU (fp32
copies kept), as the stack models it.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nestplan import graph as G
from nestplan.catalog import get_stack
from nestplan.evaluate import local_strategy
from nestplan.options import MLPKind, Norm, Position, Precision, Recompute
from nestplan.specs import ModelSpec, Parallelism, TrainingSpec

SCRIPT = Path(__file__).parent / "frameworks_saved.py"
CONFIG = dict(seq=256, batch=1, hidden=512, heads=8, groups=2, ffn=1408)


def measured(framework: str, policy: str) -> float:
    args = [sys.executable, str(SCRIPT), framework, "--policy", policy]
    for k, v in CONFIG.items():
        args += [f"--{k}", str(v)]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)["saved_bytes_per_block"]


def predicted(stack_name: str, policy: Recompute) -> float:
    c = CONFIG
    model = ModelSpec(name="small", layers=2, hidden=c["hidden"], heads=c["heads"],
                      kv_heads=c["groups"], head_dim=c["hidden"] // c["heads"],
                      ffn_hidden=c["ffn"], vocab=1024, mlp=MLPKind.SWIGLU, norm=Norm.RMSNORM,
                      bias=False, position=Position.ROPE)
    tr = TrainingSpec(seq_len=c["seq"], global_batch=c["batch"], precision=Precision.BF16)
    layer = G.build(model, local_strategy(Parallelism(mbs=c["batch"]), tr,
                                          get_stack(stack_name))).dense
    return {Recompute.NONE: layer.saved_bytes, Recompute.SELECTIVE: layer.selective_bytes,
            Recompute.FULL: layer.input_bytes}[policy]


@pytest.mark.frameworks
@pytest.mark.parametrize("policy, script_policy", [
    (Recompute.NONE, "none"), (Recompute.SELECTIVE, "selective-op"), (Recompute.FULL, "full")])
def test_torchtitan_block_saves_what_the_stack_says(policy, script_policy):
    pytest.importorskip("torchtitan")
    got = measured("torchtitan", script_policy)
    assert predicted("torchtitan", policy) == pytest.approx(got, rel=0.10)
