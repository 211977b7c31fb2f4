"""A block's parameters against Megatron-Core's own ``TransformerLayer`` (local spec, built on CPU
in a fresh process with a one-rank gloo group): for each norm kind, biases on every linear layer,
on q, k and v only, or none, QK norms, a gated MLP, attention sinks and multi-latent attention,
the graph's per-block parameter count must be exact."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nestplan.graph import Local, build
from nestplan.options import AttentionImpl, MLPKind, Norm, Position, Precision
from nestplan.specs import MLASpec, ModelSpec

from test_framework_memory import installed

pytestmark = pytest.mark.frameworks

HIDDEN, HEADS, GROUPS, FFN = 256, 8, 2, 512
MLA = dict(q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16,
           v_head_dim=32)
# (norm, biases: "none" | "qkv" | "all", QK norms, gated MLP, sinks, MLA)
CASES = [*itertools.product(("LayerNorm", "RMSNorm"), ("none", "qkv", "all"), (False, True),
                            (False, True), (False,), (False,)),
         ("RMSNorm", "all", False, True, True, False),      # GPT-OSS's kind
         ("RMSNorm", "none", False, True, False, True),     # DeepSeek-V3's kind
         ("LayerNorm", "all", False, False, False, True)]

# builds one layer per case and prints its parameter count; only construction, no forward
SCRIPT = f"""
import json, sys, warnings
sys.path.insert(0, {str(Path(__file__).parent)!r})
warnings.simplefilter("ignore")
from frameworks_saved import MegatronFlashCore, megatron_on_cpu
megatron_on_cpu()
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer
counts = []
for norm, biases, qk, gated, sinks, mla in json.loads(sys.argv[1]):
    kw = dict(num_layers=1, hidden_size={HIDDEN}, num_attention_heads={HEADS},
              num_query_groups={HEADS} if mla else {GROUPS}, ffn_hidden_size={FFN},
              normalization=norm, add_bias_linear=biases == "all", add_qkv_bias=biases != "none",
              qk_layernorm=qk or mla, gated_linear_unit=gated, use_cpu_initialization=True,
              softmax_type="learnable" if sinks else "vanilla")
    config_class = TransformerConfig
    if mla:
        config_class = MLATransformerConfig
        kw.update(q_lora_rank={MLA["q_lora_rank"]}, kv_lora_rank={MLA["kv_lora_rank"]},
                  qk_head_dim={MLA["qk_nope_head_dim"]},
                  qk_pos_emb_head_dim={MLA["qk_rope_head_dim"]},
                  v_head_dim={MLA["v_head_dim"]}, rope_type="rope")
    spec = get_gpt_layer_local_spec(qk_layernorm=qk or mla, normalization=norm,
                                    multi_latent_attention=mla)
    if mla:
        # (the local attention cannot take MLA's heads; the stand-in has no weights either)
        spec.submodules.self_attention.submodules.core_attention = MegatronFlashCore
    layer = TransformerLayer(config_class(**kw), spec.submodules)
    counts.append(sum(p.numel() for p in layer.parameters()))
print(json.dumps(counts))
"""


def block_params(norm: str, biases: str, qk: bool, gated: bool, sinks: bool, mla: bool) -> float:
    latent = MLASpec(**MLA) if mla else None
    model = ModelSpec(name="small", layers=1, hidden=HIDDEN, heads=HEADS,
                      kv_heads=HEADS if mla else GROUPS,
                      head_dim=MLA["qk_nope_head_dim"] + MLA["qk_rope_head_dim"] if mla
                      else HIDDEN // HEADS, ffn_hidden=FFN, vocab=1024,
                      mlp=MLPKind.SWIGLU if gated else MLPKind.GELU,
                      norm=Norm.LAYERNORM if norm == "LayerNorm" else Norm.RMSNORM,
                      bias=biases == "all", qkv_bias=biases == "qkv", position=Position.ROPE,
                      qk_norm=qk, attention_sinks=sinks, mla=latent)
    g = build(model, Local(1, False, 1, 1, 1, 1, 2, Precision.BF16, AttentionImpl.FLASH))
    return g.block(0).total_params


def test_block_parameters_match_megatron_core_layer():
    installed("megatron.core")
    p = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(CASES)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    measured = json.loads(p.stdout.strip().splitlines()[-1])
    assert {case: block_params(*case) for case in CASES} == dict(zip(CASES, measured))
