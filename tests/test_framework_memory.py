"""What the frameworks' own layer code keeps for backward, measured on CPU, against the stacks.

``frameworks_saved.py`` (beside this file) runs torchtitan 0.3's Llama and Qwen3 MoE blocks and
Megatron-Core 0.16's ``TransformerBlock`` (local spec, one-rank gloo group) on CPU in a fresh
process and counts the bytes saved for backward with ``saved_tensors_hooks`` (one entry per
storage, parameters excluded; see its docstring). The stack's layer graph must agree within 10 % for each
recompute policy.

Where the CPU path saves what a GPU kernel does not, the measured figure is corrected and the test
says so:

* torchtitan's FlexAttention has no CPU backward; the script calls a stand-in that saves what a
  flash kernel saves. Its RMSNorm runs unfused on CPU (fp32 copies kept), as the torchtitan stack
  models it on GPU too (eager ``nn.RMSNorm``), so nothing is corrected.
* Megatron's local spec runs torch RMSNorm (unfused on CPU: fp32 copies); Megatron-Core on GPU
  uses Transformer Engine's fused norm, which keeps only its input: the script reports both and
  the fused figure is used. Its softmax runs the unfused torch path, which upcasts and keeps an
  fp32 copy of the probabilities; the fused CUDA softmax keeps one bf16 tensor, the one the
  probabilities-times-V matmul keeps anyway: the fp32 copy is dropped. The local spec
  materialises attention (there is no flash kernel on CPU), so it is compared with the
  megatron-core stack with materialised attention; its norms are modules of their own, as the
  stack's are with ``norm_in_linear`` off (Transformer Engine's spec, which the stack follows,
  runs some inside the next linear layer: checked on that spec's own code); everything else is
  the stack as it is. Its MLA block cannot use that attention (q and k are wider than v): its
  core is the flash stand-in.
"""

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.catalog import get_stack
from nestplan.evaluate import layer_graph
from nestplan.options import AttentionImpl, MLPKind, Norm, Position, Precision
from nestplan.recompute import Policy, effect
from nestplan.specs import MLASpec, ModelSpec, MoESpec, Parallelism, TrainingSpec

SCRIPT = Path(__file__).parent / "frameworks_saved.py"
CONFIG = dict(seq=256, batch=1, hidden=512, heads=8, groups=2, ffn=1408)
MOE = dict(experts=4, topk=2, ffn=512)


def _args(framework: str, policy: str, *extra: str) -> list[str]:
    args = [framework, "--policy", policy, *extra]
    for k, v in CONFIG.items():
        args += [f"--{k}", str(v)]
    return args


MOE_ARGS = ("--moe-experts", str(MOE["experts"]), "--topk", str(MOE["topk"]), "--moe-ffn",
            str(MOE["ffn"]))
MLA = dict(q_lora_rank=192, kv_lora_rank=64, qk_nope_head_dim=64, qk_rope_head_dim=32,
           v_head_dim=64)
"""DeepSeek-V3's attention at a small size."""
MLA_ARGS = ("--mla", ",".join(str(v) for v in MLA.values()))
MLA_RUNS = {"none": ("none", ()), "selective": ("selective", ()), "full": ("full", ()),
            "modules:mla_up_proj": ("selective", ("--modules", "mla_up_proj")),
            "modules:mla_up_proj,layernorm": ("selective", ("--modules", "mla_up_proj,layernorm"))}
"""Policy -> the script's policy and flags, for the MLA block."""
SHARED = dict(ffn=1024)
SHARED_ARGS = ("--shared-ffn", str(SHARED["ffn"]), "--shared-gate")
"""A gated shared expert beside the routed ones (Qwen2-MoE's kind)."""
TORCHTITAN_POLICIES = [("none", "none"), ("selective", "selective-op"), ("full", "full")]
"""The torchtitan stack's policies and the script's names for them."""
TORCHTITAN_RUNS = [("torchtitan", p, *extra) for _, p in TORCHTITAN_POLICIES
                   for extra in ((), MOE_ARGS, MLA_ARGS)]
MEGATRON_RUNS = (
    [("megatron", p, "--swiglu-fusion") for p in ("none", "selective", "full")]
    + [("megatron", "none", "--swiglu-fusion", *MOE_ARGS)]
    + [("megatron", "selective", "--swiglu-fusion", "--modules", m)
       for m in ("layernorm", "mlp", "core_attn,layernorm")]
    + [("megatron", "selective", "--swiglu-fusion", "--modules", m, *MOE_ARGS)
       for m in ("moe", "layernorm", "core_attn,moe")]
    + [("megatron", p, "--swiglu-fusion", *MLA_ARGS, *extra) for p, extra in MLA_RUNS.values()]
    + [("megatron", "none", "--swiglu-fusion", *MOE_ARGS, *SHARED_ARGS),
       ("megatron", "selective", "--swiglu-fusion", "--modules", "shared_experts", *MOE_ARGS,
        *SHARED_ARGS)])
_RESULTS: dict[tuple, dict] = {}


def installed(module: str) -> None:
    """Skip unless ``module`` is installed, without importing it here: the measurements run in a
    subprocess, and an import in this worker would cost seconds for nothing."""
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def measured(framework: str, policy: str, *extra: str) -> dict:
    """The script's result for one run. Every run a test module asks of a framework is measured
    in one process the first time one is asked for (start-up dominates a single run)."""
    key = (framework, policy, *extra)
    if key not in _RESULTS:
        batch = [r for r in (MEGATRON_RUNS if framework == "megatron" else TORCHTITAN_RUNS)
                 if r not in _RESULTS]
        if key not in batch:
            batch.append(key)
        p = subprocess.run([sys.executable, str(SCRIPT), "--batch",
                            json.dumps([_args(*r) for r in batch])],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        _RESULTS.update(zip(batch, json.loads(p.stdout)))
    return _RESULTS[key]


def predicted(stack, policy: str, moe: bool = False, qk_norm: bool = False,
              shared: bool = False, mla: bool = False) -> float:
    """Bytes one block keeps under ``policy`` (a name of ``stack``'s, or a rule); ``qk_norm``:
    the block norms each head's queries and keys (Qwen3's, as torchtitan's MoE blocks);
    ``shared``: the MoE layer has a gated shared expert (``SHARED``); ``mla``: multi-latent
    attention (``MLA``)."""
    if stack.policy_index(policy) is None:
        stack = replace(stack, recompute=stack.recompute + (Policy("rule", policy),))
        policy = "rule"
    c = CONFIG
    latent = MLASpec(**MLA) if mla else None
    model = ModelSpec(name="small", layers=2, hidden=c["hidden"], heads=c["heads"],
                      kv_heads=c["heads"] if mla else c["groups"],
                      head_dim=latent.qk_nope_head_dim + latent.qk_rope_head_dim if mla
                      else c["hidden"] // c["heads"], mla=latent,
                      ffn_hidden=c["ffn"], vocab=1024, mlp=MLPKind.SWIGLU, norm=Norm.RMSNORM,
                      bias=False, position=Position.ROPE, qk_norm=qk_norm,
                      moe=MoESpec(experts=MOE["experts"], top_k=MOE["topk"],
                                  ffn_hidden=MOE["ffn"], shared_experts=int(shared),
                                  shared_ffn_hidden=SHARED["ffn"] if shared else 0,
                                  shared_expert_gate=shared) if moe else None)
    tr = TrainingSpec(seq_len=c["seq"], global_batch=c["batch"], precision=Precision.BF16)
    graph = layer_graph(model, Parallelism(mbs=c["batch"]), tr, stack)
    return effect(stack.policy(policy), graph.moe if moe else graph.dense).saved


@pytest.mark.frameworks
@pytest.mark.parametrize("policy, script_policy", TORCHTITAN_POLICIES)
def test_torchtitan_block_saves_what_the_stack_says(policy, script_policy):
    installed("torchtitan")
    got = measured("torchtitan", script_policy)["saved_bytes_per_block"]
    assert predicted(get_stack("torchtitan"), policy) == pytest.approx(got, rel=0.10)


@pytest.mark.frameworks
@pytest.mark.parametrize("policy, script_policy", TORCHTITAN_POLICIES)
def test_torchtitan_moe_block_saves_what_the_stack_says(policy, script_policy):
    """torchtitan 0.3's Qwen3 MoE block (the registry's builder: QK norms, grouped experts, the
    local dispatcher). It found what the stack had missed: the combine keeps the experts'
    outputs in fp32 (``expert_combine_bytes``), q, k and v are copies rather than views of the
    fused output (``qkv_views``), and per-op checkpointing recomputes the grouped expert GEMMs
    (not on its save list). Without recomputation the graph before these fixes, -3.5 %, passed
    this tolerance too; the selective case (+105 % before) and tests/test_memory.py's exact
    combine bytes hold them."""
    installed("torchtitan")
    got = measured("torchtitan", script_policy, *MOE_ARGS)["saved_bytes_per_block"]
    assert predicted(get_stack("torchtitan"), policy, moe=True, qk_norm=True) == pytest.approx(
        got, rel=0.10)


@pytest.mark.frameworks
@pytest.mark.parametrize("policy, script_policy", TORCHTITAN_POLICIES)
def test_torchtitan_mla_block_saves_what_the_stack_says(policy, script_policy):
    """torchtitan 0.3's DeepSeek-V3 block with MLA (dense): its q and kv norms are eager
    RMSNorms like its others, which keep fp32 copies (the graph had costed them as fused).
    Without recomputation the rest, -3.4 %, is the nope half of the kv up-projection's output,
    which v, a view of it, keeps alive. (The graph before the norm fix, -8.5 %, passed this
    tolerance too: tests/test_memory.py pins the norms' bytes exactly.)"""
    installed("torchtitan")
    got = measured("torchtitan", script_policy, *MLA_ARGS)["saved_bytes_per_block"]
    assert predicted(get_stack("torchtitan"), policy, mla=True) == pytest.approx(got, rel=0.10)


def megatron_gpu_equivalent(result: dict) -> float:
    """The measured bytes per block with the CPU-only tensors replaced (module docstring)."""
    fp32_softmax = sum(t["nbytes"] for t in result["tensors"] if t["per_block"]
                       and t["origin"].startswith("SoftmaxBackward") and "float32" in t["dtype"])
    return (result["saved_bytes_per_block"] - result["rmsnorm_cpu_bytes_per_block"]
            + result["rmsnorm_fused_bytes_per_block"] - fp32_softmax / 2)  # two blocks


LOCAL_SPEC = replace(get_stack("megatron-core"), norm_in_linear=False)
"""megatron-core with the local spec's norms: modules of their own, as the script runs them (on
GPU, Transformer Engine's spec runs some inside the linear after them: ``norm_in_linear``,
checked below against that spec)."""
MATERIALIZED = replace(LOCAL_SPEC, attention=AttentionImpl.MATERIALIZED)


@pytest.mark.frameworks
@pytest.mark.parametrize("policy", ["none", "selective", "full"])
def test_megatron_core_layer_saves_what_the_stack_says(policy):
    installed("megatron.core")
    got = megatron_gpu_equivalent(measured("megatron", policy, "--swiglu-fusion"))
    assert predicted(MATERIALIZED, policy) == pytest.approx(got, rel=0.10)


@pytest.mark.frameworks
def test_megatron_core_moe_layer_saves_what_the_stack_says():
    installed("megatron.core")
    result = measured("megatron", "none", "--swiglu-fusion", *MOE_ARGS)
    # the router keeps its input, the normed hidden states (2 bytes per token and hidden unit)
    router = [t for t in result["tensors"] if "RouterGatingLinear" in t["origin"]]
    assert sum(t["nbytes"] for t in router) / 2 == CONFIG["seq"] * CONFIG["hidden"] * 2
    got = megatron_gpu_equivalent(result)
    assert predicted(MATERIALIZED, "none", moe=True) == pytest.approx(got, rel=0.10)


@pytest.mark.frameworks
@pytest.mark.parametrize("modules, moe", [
    ("layernorm", False), ("mlp", False), ("core_attn,layernorm", False),
    ("moe", True), ("layernorm", True), ("core_attn,moe", True)])
def test_megatron_core_recompute_modules_save_what_the_stack_says(modules, moe):
    """Megatron-Core's --recompute-modules, normal (core_attn, mlp, moe) and output-discarding
    (layernorm) checkpointing. moe_act is not measured: Megatron allows it only with grouped
    GEMM experts, which need Transformer Engine (not on CPU)."""
    installed("megatron.core")
    extra = MOE_ARGS if moe else ()
    got = megatron_gpu_equivalent(measured("megatron", "selective", "--swiglu-fusion",
                                           "--modules", modules, *extra))
    assert predicted(MATERIALIZED, "modules:" + modules, moe) == pytest.approx(got, rel=0.10)


@pytest.mark.frameworks
@pytest.mark.parametrize("policy", MLA_RUNS)
def test_megatron_core_mla_block_saves_what_the_stack_says(policy):
    """DeepSeek-V3's multi-latent attention in Megatron-Core's layer (MLATransformerConfig, the
    local spec's MLA with its q and kv norms), its core attention the flash stand-in (the local
    spec's cannot take MLA's heads; see frameworks_saved.MegatronFlashCore), so the stack is
    compared as it is, flash attention and all: none, Megatron's default selective, full and
    --recompute-modules mla_up_proj (alone and with layernorm)."""
    installed("megatron.core")
    script_policy, extra = MLA_RUNS[policy]
    got = megatron_gpu_equivalent(measured("megatron", script_policy, "--swiglu-fusion",
                                           *MLA_ARGS, *extra))
    assert predicted(LOCAL_SPEC, policy, mla=True) == pytest.approx(got, rel=0.10)


@pytest.mark.frameworks
@pytest.mark.parametrize("policy", ["none", "modules:shared_experts"])
def test_megatron_core_gated_shared_expert_saves_what_the_stack_says(policy):
    """A shared expert behind Megatron-Core's sigmoid gate (``moe_shared_expert_gate``): the
    product keeps the shared output and the gate's scores, the expert its fc1 and fc2 inputs;
    ``--recompute-modules shared_experts`` drops what the expert made."""
    installed("megatron.core")
    run = {"none": ("none", "--swiglu-fusion"),
           "modules:shared_experts": ("selective", "--swiglu-fusion", "--modules",
                                      "shared_experts")}[policy]
    got = megatron_gpu_equivalent(measured("megatron", *run, *MOE_ARGS, *SHARED_ARGS))
    assert predicted(MATERIALIZED, policy, moe=True, shared=True) == pytest.approx(got, rel=0.10)


@pytest.mark.frameworks
def test_deepspeed_pipeline_without_zero_keeps_what_bf16_optimizer_keeps():
    """DeepSpeed's engine runs bf16 weights under its pipeline engine without ZeRO with its
    BF16_Optimizer; run as the pipeline engine runs it on two gloo ranks
    (``frameworks_deepspeed_bf16.py``), it keeps bf16 weights whole, the parameters' gradients
    and an accumulation buffer of their dtype whole, the fp32 master and Adam's states in halves,
    and gathers the whole bf16 weights after the step. The deepspeed stack's bytes per parameter
    at ZeRO-0 with pp > 1 are those (a trial's Llama-2 13B had been charged unsharded states,
    about twice the memory); without a pipeline, ZeRO-0 shards nothing."""
    script = Path(__file__).parent / "frameworks_deepspeed_bf16.py"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["engine_picks"] == "bf16"  # deepspeed.runtime.constants.BFLOAT16
    from nestplan.cost.memory import bytes_per_param

    st = get_stack("deepspeed")
    w, g, o = bytes_per_param(0, 2, st, pp=2)
    assert w == pytest.approx(got["weights"])
    assert g == pytest.approx(got["parameter_gradients"] + got["accumulation_buffer"])
    assert o == pytest.approx(got["master"] + got["adam"])
    assert got["gathered"] == pytest.approx(st.weight_bytes)  # the step's all-gather output
    assert bytes_per_param(0, 2, st, pp=1) == (2, 2, 12)


TP_SCRIPT = Path(__file__).parent / "frameworks_tp_saved.py"
TP_CONFIG = dict(tokens=128, hidden=256, ffn=768, tp=2)


@pytest.mark.frameworks
def test_torchtitan_tensor_parallel_mlp_keeps_and_sends_what_the_stack_says():
    """torch's own TP API, as torchtitan's plan applies it to a Llama feed-forward with sequence
    parallelism, on two CPU ranks: each rank keeps the all-gathered input of w1/w3 (the whole
    sequence) and, in backward, reduce-scatters that input's gradient without gathering the
    input again (``tp_keeps_gathered_input``); Megatron-Core keeps the shard and gathers it
    again. The bf16 tensors of the MLP (w1/w3's input, the unfused SwiGLU's three, w2's input)
    must equal the stack's fc1, act and fc2 (the norm's are the CPU decomposition's and are
    compared by the Llama block tests above). Under torchtitan's own checkpoint wrappers the
    backward runs the forward's collectives again as the stack's policies say: per-op selective
    only the all-gather (reduce-scatters are on its save list), full both."""
    installed("torch.distributed")
    installed("torchtitan")
    c = TP_CONFIG
    p = subprocess.run([sys.executable, str(TP_SCRIPT), *(f"--{k}={v}" for k, v in c.items()),
                        "--ac=none,op,full"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    runs = {r["ac"]: r for r in json.loads(p.stdout.strip().splitlines()[-1])}
    got = runs["none"]
    mm = {tuple(t["shape"]): t["nbytes"] for t in got["saved"] if t["origin"] == "MmBackward0"}
    # w1/w3's input, the whole sequence; w2's, the sequence by this rank's ffn columns
    assert set(mm) == {(c["tokens"], c["hidden"]), (c["tokens"], c["ffn"] // c["tp"])}
    mlp_bf16 = sum(t["nbytes"] for t in got["saved"] if t["dtype"] == "bfloat16")

    model = ModelSpec(name="small", layers=2, hidden=c["hidden"], heads=4, kv_heads=2,
                      head_dim=c["hidden"] // 4, ffn_hidden=c["ffn"], vocab=1024,
                      mlp=MLPKind.SWIGLU, norm=Norm.RMSNORM, bias=False, position=Position.ROPE)
    tr = TrainingSpec(seq_len=c["tokens"], global_batch=1, precision=Precision.BF16)
    plan = Parallelism(tp=c["tp"], sp=True, mbs=1)

    def backward_collectives(stack, policy):
        """The MLP's collectives in backward: its own, and the forward's its policy runs again."""
        layer = layer_graph(model, plan, tr, stack).dense
        eff = effect(stack.policy(policy), layer)
        mlp = [k for k in layer.comms if k.name.startswith(("fc1", "fc2"))]
        again = [k for k in mlp if k.phase == "fwd" and (eff.full or eff.reruns(k.module,
                                                                               k.kind.value))]
        return sorted(k.kind.value for k in [*again, *(k for k in mlp if k.phase == "bwd")])

    def measured(ac):
        return sorted(n.removesuffix("_into_tensor").removesuffix("_tensor")
                      for n in runs[ac]["backward_collectives"]
                      if n.endswith("_tensor") and not n.startswith("wait"))

    tt = get_stack("torchtitan")
    assert tt.tp_keeps_gathered_input
    for ac, policy in (("none", "none"), ("op", "selective"), ("full", "full")):
        assert backward_collectives(tt, policy) == measured(ac), ac
    assert measured("none") == ["all_gather", "reduce_scatter"]
    core = get_stack("megatron-core")  # the shard kept, gathered again
    assert not core.tp_keeps_gathered_input
    assert backward_collectives(core, "none") == ["all_gather", "all_gather", "reduce_scatter"]
    shard = 2 * c["tokens"] // c["tp"] * c["hidden"]
    assert {o.name: o for o in layer_graph(model, plan, tr, core).dense.ops}["fc1"].saved == shard
    ops = {o.name: o for o in layer_graph(model, plan, tr, tt).dense.ops}
    assert ops["fc1"].saved == mm[c["tokens"], c["hidden"]]
    assert ops["fc2"].saved == mm[c["tokens"], c["ffn"] // c["tp"]]
    assert ops["fc1"].saved + ops["act"].saved + ops["fc2"].saved == mlp_bf16
    # in fp8 training the kept input is fp8 (one byte), gathered or not: torchao's
    # Float8ColwiseParallel casts before the gather and its matmul keeps what it is given
    # (matmul_with_hp_or_float8_args, torchao/float8/float8_linear.py @ pytorch/ao 36027d82d1)
    fp8 = replace(tr, precision=Precision.FP8)
    f8 = {o.name: o for o in layer_graph(model, plan, fp8, get_stack("torchtitan-float8")).dense.ops}
    assert f8["fc1"].saved == c["tokens"] * c["hidden"]


@pytest.mark.xdist_group("frameworks")
def test_the_frameworks_tests_share_one_worker(request):
    """conftest puts every frameworks test in one xdist group, so that one worker, not each,
    starts the frameworks (the measurements above run once per worker that asks). pytest-xdist
    tags a grouped test's id with its group; a pytest whose ids it cannot tag spreads the group
    over every worker without a word (pytest-dev/pytest-xdist#1386: pytest 9.2, hence the pin in
    pyproject's test extra)."""
    import os

    if not os.environ.get("PYTEST_XDIST_WORKER") or not request.config.getvalue("loadgroup"):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@frameworks"), request.node.nodeid


def test_materialised_gqa_attention_keeps_k_and_v_for_every_head():
    """The fix the CPU check asked for, without the frameworks: under GQA the unfused attention
    keeps K and V repeated to all heads, and selective recomputation drops the copies."""
    none, sel = (predicted(MATERIALIZED, p) for p in ("none", "selective"))
    c = CONFIG
    s, d = c["seq"], c["hidden"] // c["heads"]
    copies = 2 * 2 * s * d * (c["heads"] - c["groups"])  # bf16 K and V beyond their own heads
    probs = 2 * c["heads"] * s * s
    # RoPE: the checkpointed core keeps q and k rotated, and v pins the fused QKV output
    pinned = 2 * s * (c["heads"] + c["groups"]) * d
    assert none - sel == pytest.approx(copies + probs - pinned)


@pytest.mark.frameworks
def test_the_layernorm_module_reaches_the_norms_transformer_engines_spec_keeps_as_modules():
    """Megatron-Core's Transformer Engine layer spec, built by its own function with a stand-in
    for TE's module classes (TE needs CUDA): a dense block's norms run inside the linear layer
    after them (no module: ``IdentityOp``), an MoE block's pre-MLP norm and MLA's input norm stay
    modules. ``TransformerLayer`` recomputes only norms that are modules, so under the stack's
    ``layernorm`` module a dense block keeps what it keeps without it, and MoE and MLA blocks
    drop their modules' outputs (a user trial: recomputing dense blocks' norms had been credited
    with 2 GiB on Llama 3 8B)."""
    installed("megatron.core")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import megatron.core.models.gpt.gpt_layer_specs as specs
        from megatron.core.models.backends import LocalSpecProvider
        from megatron.core.transformer.identity_op import IdentityOp

    class NormLinear:  # TELayerNormColumnParallelLinear's place
        pass

    class Norm:  # TENorm's
        pass

    class TE(LocalSpecProvider):
        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return NormLinear

        def layer_norm(self, rms_norm=False, for_qk=False, has_residual=False):
            return Norm

        def linear(self):  # TELinear's (MLA's down-projections)
            return self.column_parallel_linear()

    real = getattr(specs, "TESpecProvider", None)
    specs.TESpecProvider = TE
    try:
        layers = {(moe, mla): specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=MOE["experts"] if moe else None, multi_latent_attention=mla).submodules
            for moe in (False, True) for mla in (False, True)}
    finally:
        if real is None:
            del specs.TESpecProvider
        else:
            specs.TESpecProvider = real
    dense = layers[False, False]
    assert dense.input_layernorm is IdentityOp and dense.pre_mlp_layernorm is IdentityOp
    assert dense.self_attention.submodules.linear_qkv is NormLinear
    assert dense.mlp.submodules.linear_fc1 is NormLinear
    assert layers[True, False].input_layernorm is IdentityOp
    assert layers[True, False].pre_mlp_layernorm is Norm
    assert layers[False, True].input_layernorm is Norm
    assert layers[False, True].pre_mlp_layernorm is IdentityOp
    # the stack: what the layernorm module drops follows those modules
    te = get_stack("megatron-core")
    assert te.norm_in_linear

    def drops(moe, mla, stack=te):
        return predicted(stack, "none", moe, mla=mla) - predicted(stack, "modules:layernorm",
                                                                 moe, mla=mla)
    norm_out = 2 * CONFIG["seq"] * CONFIG["hidden"]  # one bf16 norm output
    assert drops(False, False) == 0
    assert drops(True, False) == pytest.approx(norm_out, rel=0.01)  # the pre-MLP norm's
    assert drops(False, True) == pytest.approx(norm_out, rel=0.01)  # MLA's input norm's
    assert drops(False, False, LOCAL_SPEC) == pytest.approx(2 * norm_out, rel=0.01)


LOSS_SCRIPT = r"""
import json, sys
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from frameworks_saved import megatron_on_cpu  # a one-rank gloo group and model-parallel state
megatron_on_cpu()
from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
s, b, V = 64, 2, 1000
hidden = torch.randn(s, b, 32, dtype=torch.bfloat16, requires_grad=True)
weight = torch.randn(V, 32, dtype=torch.bfloat16)
logits = hidden @ weight.t()  # the output layer's product
loss = vocab_parallel_cross_entropy(logits, torch.randint(0, V, (s, b)))
new = {}
class Watch(torch.utils._python_dispatch.TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves(
            (args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in before:
                new[t.untyped_storage().data_ptr()] = (func.name(), str(t.dtype),
                                                       t.untyped_storage().nbytes())
        return out
with Watch():  # the loss's backward, up to the gradient it hands the output layer
    torch.autograd.grad(loss.sum(), logits)
print(json.dumps({"logits": s * b * V,
                  "new": [v for v in new.values() if v[2] >= s * b * V]}))
"""


@pytest.mark.frameworks
def test_megatron_cross_entropy_backward_allocates_what_the_stack_says():
    """Megatron-Core's vocab-parallel cross-entropy (megatron/core/tensor_parallel/
    cross_entropy.py, the installed 0.16.1) writes its gradient in place into the fp32 softmax
    it saved, so its backward's only new logits-sized tensor is the cast back to bf16: 2 bytes a
    logit beside the 4 it keeps (a review: the stack had said 4)."""
    installed("megatron.core")
    p = subprocess.run([sys.executable, "-c", LOSS_SCRIPT, str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    new = sum(n for _, _, n in got["new"])
    st = get_stack("megatron-core")
    assert new == st.loss_transient_bytes * got["logits"], got["new"]
    assert [dtype for _, dtype, _ in got["new"]] == ["torch.bfloat16"]


UPCAST_LOSS_SCRIPT = r"""
import json, weakref
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers.loss.loss_utils import ForCausalLMLoss
s, V, h = 256, 3000, 16
hidden = torch.randn(1, s, h, dtype=torch.bfloat16, requires_grad=True)
weight = torch.randn(V, h, dtype=torch.bfloat16, requires_grad=True)
logits = hidden @ weight.t()  # the output layer's product
loss = ForCausalLMLoss(logits, torch.randint(0, V, (1, s)), vocab_size=V)
del logits  # (as HF's Trainer drops the output object before backward)
kept = {}
fn, seen = loss.grad_fn, set()
todo = [fn]
while todo:  # what autograd keeps of logits-sized tensors, by storage
    fn = todo.pop()
    if fn is None or fn in seen:
        continue
    seen.add(fn)
    for name in dir(fn):
        v = getattr(fn, name) if name.startswith("_saved_") else None
        if isinstance(v, torch.Tensor) and v.numel() >= s * V:
            kept[v.untyped_storage().data_ptr()] = v.untyped_storage().nbytes()
    todo += [f for f, _ in fn.next_functions]
live, peak = {}, [0]
def release(key):
    live[key][1] -= 1
    if not live[key][1]:
        del live[key]
class Watch(TorchDispatchMode):  # logits-sized storages the backward makes, while alive
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= s * V:
                key = t.untyped_storage().data_ptr()
                if key in kept:  # (a saved tensor unpacked: kept already)
                    continue
                live.setdefault(key, [t.untyped_storage().nbytes(), 0])[1] += 1
                weakref.finalize(t, release, key)
                peak[0] = max(peak[0], sum(n for n, _ in live.values()))
        return out
with Watch():
    loss.backward()
print(json.dumps({"logits": s * V, "kept": sum(kept.values()), "peak": peak[0]}))
"""


@pytest.mark.frameworks
def test_an_upcast_cross_entropy_holds_what_the_deepspeed_stack_says():
    """HuggingFace's causal-LM loss (cross-entropy on the logits cast to fp32, as DeepSpeed's HF
    models and torchtitan run it) keeps its fp32 log-softmax, and its backward holds nll_loss's
    fp32 gradient and log-softmax's at once: 8 bytes a logit beside the 4 kept (a DeepSpeed
    trial: the stack had said 6, 2 short of the peak)."""
    installed("transformers")
    p = subprocess.run([sys.executable, "-c", UPCAST_LOSS_SCRIPT], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    st = get_stack("deepspeed")
    assert got["kept"] == st.loss_saved_bytes * got["logits"]
    assert got["peak"] == st.loss_transient_bytes * got["logits"]
