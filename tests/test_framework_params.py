"""A block's parameters against Megatron-Core's own ``TransformerLayer`` (local spec, built on CPU
in a fresh process with a one-rank gloo group): for each norm kind, with and without linear
biases, QK norms and a gated MLP, the graph's per-block parameter count must be exact."""

import itertools
import json
import subprocess
import sys

import pytest

from nestplan.graph import Local, build
from nestplan.options import AttentionImpl, MLPKind, Norm, Position, Precision
from nestplan.specs import ModelSpec

from test_framework_memory import installed

pytestmark = pytest.mark.frameworks

HIDDEN, HEADS, GROUPS, FFN = 256, 8, 2, 512
CASES = list(itertools.product(("LayerNorm", "RMSNorm"), (False, True), (False, True), (False, True)))

# builds one layer per case and prints its parameter count; only construction, no forward
SCRIPT = f"""
import json, sys, warnings
import torch
import torch.distributed as dist
warnings.simplefilter("ignore")
torch.cuda.current_device = lambda: "cpu"   # asked at construction (as in frameworks_saved.py)
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer
parallel_state.initialize_model_parallel(1, 1)
counts = []
for norm, bias, qk, gated in json.loads(sys.argv[1]):
    cfg = TransformerConfig(num_layers=1, hidden_size={HIDDEN}, num_attention_heads={HEADS},
                            num_query_groups={GROUPS}, ffn_hidden_size={FFN}, normalization=norm,
                            add_bias_linear=bias, add_qkv_bias=bias, qk_layernorm=qk,
                            gated_linear_unit=gated, use_cpu_initialization=True)
    spec = get_gpt_layer_local_spec(qk_layernorm=qk, normalization=norm)
    counts.append(sum(p.numel() for p in TransformerLayer(cfg, spec.submodules).parameters()))
print(json.dumps(counts))
"""


def block_params(norm: str, bias: bool, qk: bool, gated: bool) -> float:
    model = ModelSpec(name="small", layers=1, hidden=HIDDEN, heads=HEADS, kv_heads=GROUPS,
                      head_dim=HIDDEN // HEADS, ffn_hidden=FFN, vocab=1024,
                      mlp=MLPKind.SWIGLU if gated else MLPKind.GELU,
                      norm=Norm.LAYERNORM if norm == "LayerNorm" else Norm.RMSNORM, bias=bias,
                      position=Position.ROPE, qk_norm=qk)
    g = build(model, Local(1, False, 1, 1, 1, 1, 2, Precision.BF16, AttentionImpl.FLASH))
    return g.block(0).total_params


def test_block_parameters_match_megatron_core_layer():
    installed("megatron.core")
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    measured = json.loads(p.stdout.strip().splitlines()[-1])
    assert {case: block_params(*case) for case in CASES} == dict(zip(CASES, measured))
