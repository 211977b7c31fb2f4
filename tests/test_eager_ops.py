"""Pieces of a model a stack runs as eager kernels (``StackSpec.eager_ops``): YaRN-scaled RoPE,
the clamp of a clamped GLU and the experts' output bias, as Megatron-Core runs GPT-OSS. Their
per-element traffic is checked on Megatron-Core's own code in ``test_framework_traffic.py``; here,
that the layer graph puts it on the right tensors, for the right models and stacks, and keeps
what the kernels keep."""

import math
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.catalog import get_model, get_stack
from nestplan.errors import SpecError
from nestplan.evaluate import layer_graph
from nestplan.graph import E, EAGER_PASSES
from nestplan.hf import model_from_hf_config, model_from_hf_dict
from nestplan.loaders import model_from_table, model_to_table
from nestplan.recompute import Policy, effect
from nestplan.specs import Parallelism, TrainingSpec

DATA = Path(__file__).parent / "data"
TR = TrainingSpec(seq_len=4096, global_batch=8)
PAR = Parallelism(ep=8, dp=8, mbs=1)


def moe_ops(model, stack):
    layer = layer_graph(model, PAR, TR, stack).moe
    return layer, {o.name: o for o in layer.ops}


def test_the_graph_costs_the_passes_on_the_tensors_they_run_over():
    """Over q and k, the fc1 output and the fc2 output of the busiest expert rank."""
    model = get_model("gpt-oss-120b")
    _, ops = moe_ops(model, get_stack("megatron-core"))
    tokens = TR.seq_len * PAR.mbs
    qk = tokens * (model.heads + model.kv_heads) * model.head_dim
    routed = tokens * model.moe.top_k * TR.moe_load
    for name, kind, elements in (("rope", "scaled_rope", qk),
                                 ("expert_clamp", "glu_clamp", routed * 2 * model.moe.ffn_hidden),
                                 ("expert_bias", "expert_bias", routed * model.hidden)):
        fwd, bwd = EAGER_PASSES["megatron"][kind]
        assert ops[name].nbytes == pytest.approx(E * fwd * elements)
        assert ops[name].bwd_nbytes == pytest.approx(E * bwd * elements)


def test_only_stacks_that_run_them_eagerly_pay():
    gpt_oss = get_model("gpt-oss-120b")
    megatron = get_stack("megatron-core")
    _, fused = moe_ops(gpt_oss, get_stack("torchtitan-0.3-compile"))
    _, eager = moe_ops(gpt_oss, megatron)
    assert "expert_clamp" not in fused and "expert_bias" not in fused
    fused_passes = 2  # the fused RoPE reads q and k once and writes them once
    assert eager["rope"].nbytes == pytest.approx(
        fused["rope"].nbytes * EAGER_PASSES["megatron"]["scaled_rope"][0] / fused_passes)
    # Transformer Engine's op fuser: the clamp and the bias in the fused grouped MLP
    fuser = get_stack(str(DATA / "moe_stacks" / "nemo-flex-a2a-overlap-full-graph-op-fuser.toml"))
    _, ops = moe_ops(gpt_oss, fuser)
    assert "expert_clamp" not in ops and "expert_bias" not in ops
    assert ops["rope"].nbytes == eager["rope"].nbytes
    # unscaled RoPE, no clamp, no bias: nothing changes under Megatron-Core
    qwen = get_model("qwen3-30b-a3b")
    assert qwen.rope_mscale == 1 and not qwen.glu_clamp and not qwen.bias
    assert moe_ops(qwen, megatron)[0].ops == moe_ops(qwen, replace(megatron, eager_ops=()))[0].ops
    # q, k, v biases alone (Qwen2-MoE, GLM-4.5) are not the experts' biases; biases on every
    # linear layer are (Megatron-Core's add_bias_linear gives each expert one)
    assert "expert_bias" not in moe_ops(replace(qwen, qkv_bias=True), megatron)[1]
    assert "expert_bias" in moe_ops(replace(qwen, bias=True), megatron)[1]
    # MLA applies its YaRN scale in its own path, not the unfused one costed here
    with pytest.raises(SpecError, match="rope_mscale"):
        replace(get_model("deepseek-v3"), rope_mscale=1.3)


def test_the_clamped_copy_is_kept_unless_moe_act_is_recomputed():
    """Without recomputation the activation keeps the clamped copy and the clamps keep the fc1
    output; recomputing moe_act keeps the fc1 output alone (the checkpoint's input)."""
    gpt_oss = get_model("gpt-oss-120b")
    megatron = get_stack("megatron-core")
    act = Policy("act", "modules:moe_act")
    clamped, ops = moe_ops(gpt_oss, megatron)
    plain, _ = moe_ops(gpt_oss, replace(megatron, eager_ops=("scaled_rope", "expert_bias")))
    fc1_out = E * TR.seq_len * gpt_oss.moe.top_k * TR.moe_load * 2 * gpt_oss.moe.ffn_hidden
    assert ops["expert_clamp"].saved == pytest.approx(fc1_out)
    none = Policy("none", "none")
    assert effect(none, clamped).saved - effect(none, plain).saved == pytest.approx(fc1_out)
    assert effect(act, clamped).saved == pytest.approx(effect(act, plain).saved)


def test_huggingface_configs_give_the_scale_and_the_clamp():
    gpt_oss = model_from_hf_config(DATA / "hf" / "gpt-oss-120b.json")
    assert gpt_oss.rope_mscale == pytest.approx(0.1 * math.log(32) + 1)
    assert gpt_oss.glu_clamp == 7.0
    catalog = get_model("gpt-oss-120b")
    assert (catalog.rope_mscale, catalog.glu_clamp) == (gpt_oss.rope_mscale, gpt_oss.glu_clamp)
    # DeepSeek-V3's mscale = mscale_all_dim: YaRN leaves cos and sin unscaled
    assert model_from_hf_config(DATA / "deepseek-v3.json").rope_mscale == 1.0
    # a scale without an extension has no Megatron-Core YaRN: MLA's is said to be dropped
    import json

    from nestplan.errors import Note

    dsv3 = json.loads((DATA / "deepseek-v3.json").read_text())
    with pytest.warns(Note, match="scales MLA's RoPE by 1.2 without extending its context"):
        m = model_from_hf_dict({**dsv3, "rope_scaling": {"type": "yarn", "factor": 1.0,
                                                         "attention_factor": 1.2}})
    assert m.yarn is None and m.rope_mscale == 1.0
    llama = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
             "num_attention_heads": 4, "intermediate_size": 512, "vocab_size": 1000}
    assert model_from_hf_dict(llama).rope_mscale == 1.0
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert model_from_hf_dict({**llama, "rope_scaling": llama3}).rope_mscale == 1.0
    given = {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.2}
    assert model_from_hf_dict({**llama, "rope_scaling": given}).rope_mscale == 1.2
    both = {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.5}
    assert model_from_hf_dict({**llama, "rope_scaling": both}).rope_mscale == pytest.approx(
        (0.1 * math.log(40) + 1) / (0.05 * math.log(40) + 1))


def test_plan_files_keep_the_scale_and_the_clamp():
    model = get_model("gpt-oss-120b")
    assert model_from_table(model_to_table(model)) == model
    # a file with a [yarn] table and no rope_mscale takes the table's scale (a review found it
    # read as 1, and its scaled RoPE left uncosted)
    table = model_to_table(model)
    del table["rope_mscale"]
    assert model_from_table(table).rope_mscale == model.rope_mscale == model.yarn.attention_factor
    assert "rope_mscale" not in model_to_table(get_model("llama3-8b"))


def test_megatron_export_says_what_it_does_not_carry(tmp_path):
    from console import cli

    plan = tmp_path / "p.json"
    code, _, err = cli("evaluate", "--model", "gpt-oss-120b", "--cluster", "dgx-h100-ndr",
                       "--gpus", 8, "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch",
                       8, "--seq-len", 4096, "--recompute", "full", "--save", plan)
    assert code == 0, err
    code, _, err = cli("export", plan, "--format", "megatron", "-o", tmp_path / "run.sh")
    assert code == 0, err
    script = (tmp_path / "run.sh").read_text()
    # its clamped GLU is exported as Megatron-Core runs GPT-OSS's (it had been a note)
    assert "--quick-geglu" in script and "--glu-linear-offset 1" in script \
        and "--activation-func-clamp-value 7" in script and "--swiglu" not in script
    # its sliding windows are exported: 128 tokens with the token itself, every other layer
    assert "--window-size 127,0" in script and "--window-attn-skip-freq 2" in script
    # its YaRN is exported: GptOssConfig's RoPE scaling, unrounded correction range included
    for flag in ("--position-embedding-type yarn", "--rotary-scaling-factor 32", "--mscale 1",
                 "--mscale-all-dim 0", "--yarn-original-max-position-embeddings 4096",
                 "--yarn-beta-fast 32", "--yarn-beta-slow 1",
                 "--no-yarn-correction-range-round-to-int"):
        assert flag + " " in script, flag
    assert "YaRN" not in err
    assert "op fuser" not in err
    # a stack that runs the clamp and the bias fused, as Transformer Engine's op fuser does
    fuser = DATA / "moe_stacks" / "nemo-flex-a2a-overlap-full-graph-op-fuser.toml"
    code, _, err = cli("evaluate", "--model", "gpt-oss-120b", "--cluster", "dgx-h100-ndr",
                       "--gpus", 8, "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch",
                       8, "--seq-len", 4096, "--stack", fuser, "--save", plan)
    assert code == 0, err
    code, _, err = cli("export", plan, "--format", "megatron", "-o", tmp_path / "run.sh")
    assert code == 0, err
    assert ("runs the GLU clamp and the experts' output bias fused, as Transformer Engine's op "
            "fuser does: exported with --use-transformer-engine-op-fuser") in err
    assert "--use-transformer-engine-op-fuser" in (tmp_path / "run.sh").read_text()


def test_the_step_says_how_much_of_its_compute_is_eager_kernels():
    from nestplan.evaluate import evaluate, scenario_from_names

    sc = scenario_from_names("gpt-oss-120b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256)
    plan = Parallelism(tp=1, pp=1, dp=64, ep=8, zero=1, mbs=1)
    ev = evaluate(sc, plan)
    fused = evaluate(replace(sc, stack=replace(sc.stack, eager_ops=())), plan)
    assert fused.eager_kernels == 0 < ev.eager_kernels < ev.time.compute
    # what the eager kernels add over the fused ones they replace, forward and backward
    assert ev.time.compute - fused.time.compute < ev.eager_kernels
    assert ev.to_json()["eager_kernels_s"] == ev.eager_kernels


def test_a_stack_that_costs_the_pieces_fused_says_so_and_a_mistake_stays_one_line():
    from console import cli, one_line_error

    base = ["evaluate", "--model", "gpt-oss-120b", "--cluster", "dgx-h100-ndr", "--gpus", 64,
            "--tp", 1, "--pp", 1, "--ep", 8, "--global-batch", 256, "--seq-len", 4096]
    code, out, err = cli(*base, "--mbs", 1, "--stack", "torchtitan-0.3-compile")
    assert code == 0 and "stack 'torchtitan-0.3-compile' costs gpt-oss-120b's glu_clamp, " \
        "expert_bias as fused kernels" in err  # (torchtitan runs no scaled-RoPE kernel)
    for eager in ("megatron-core", "torchtitan"):  # (they run them eagerly)
        code, out, err = cli(*base, "--mbs", 1, "--stack", eager)
        assert code == 0 and "fused kernels" not in err, eager
    # the note is not printed when the command then fails: the error stays the one line
    assert one_line_error(*cli(*base, "--mbs", 3, "--stack", "torchtitan-0.3-compile"), "mbs")


def test_eager_torchtitan_pays_its_own_kernels():
    """Eager torchtitan runs GPT-OSS's clamped GLU and both expert biases as kernels of its own,
    costed with its counts (``EAGER_PASSES["torchtitan"]``: fc1's bias over the fc1 output too),
    and its YaRN-scaled RoPE as any RoPE (YaRN's scale goes into its softmax scale): a torchtitan
    MoE user's trial found them costed as fused kernels."""
    gpt_oss = get_model("gpt-oss-120b")
    _, eager = moe_ops(gpt_oss, get_stack("torchtitan"))
    _, compiled = moe_ops(gpt_oss, get_stack("torchtitan-0.3-compile"))
    tokens = TR.seq_len * PAR.mbs
    routed = tokens * gpt_oss.moe.top_k * TR.moe_load
    width = 2 * gpt_oss.moe.ffn_hidden
    for name, kind, elements in (("expert_clamp", "glu_clamp", routed * width),
                                 ("expert_bias", "expert_bias", routed * gpt_oss.hidden),
                                 ("expert_fc1_bias", "expert_bias", routed * width)):
        fwd, bwd = EAGER_PASSES["torchtitan"][kind]
        assert eager[name].nbytes == pytest.approx(E * fwd * elements), name
        assert eager[name].bwd_nbytes == pytest.approx(E * bwd * elements), name
        assert name not in compiled
    assert eager["rope"].nbytes == compiled["rope"].nbytes
