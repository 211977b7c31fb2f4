"""Plan files and the launch configurations exported from them.

Tests marked ``frameworks`` parse the exports with the frameworks' own configuration code and
need the ``frameworks`` extra (torch CPU, megatron-core, deepspeed, torchtitan), which CI
installs; without it they are skipped.
"""

import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from nestplan import planfile
from nestplan.axes import Axis
from nestplan.catalog import get_stack
from nestplan.cli import main
from nestplan.errors import SpecError
from nestplan.evaluate import chunk_bounds, evaluate, scenario_from_names
from nestplan.exports import export, uniform_policy
from nestplan.placement import expert_grid, rank_grid
from nestplan.options import Precision
from nestplan.textfmt import memory_verdict
from nestplan.units import GiB, fmt_time
from nestplan.specs import Parallelism, RopeScaling, blocks_per_chunk

from conftest import SHARED, exported

N, S, F = "none", "selective", "full"


def plans():
    """Plans with the features exports must carry: non-uniform and interleaved stages,
    per-stage recomputation, MoE, CP, ZeRO, a non-Megatron rank order."""
    gpt = scenario_from_names("gpt3-175b", "nest-h100-spineleaf", 128, seq_len=2048,
                              global_batch=256)
    llama = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
    mix = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=128)
    return [
        (gpt, Parallelism(tp=4, pp=8, dp=4, sp=True, zero=1, vp=3, mbs=1,
                          stage_layers=(5, 4, 4, 4, 4, 4, 4, 3) * 3,
                          recompute=(S,) + (N,) * 7)),
        (llama, Parallelism(tp=2, pp=4, dp=2, cp=4, sp=True, zero=3, mbs=1,
                            stage_layers=(19, 21, 21, 19), recompute=(F, F, N, N),
                            rank_order=(Axis.TP, Axis.CP, Axis.PP, Axis.DP))),
        (mix, Parallelism(tp=2, pp=2, dp=16, ep=8, etp=1, sp=True, zero=2, mbs=1,
                          recompute=(N,))),
        # MoE parallel folding: EP 8 spans the TP ranks (dp·cp = 4), expert-DP 2
        (mix, Parallelism(tp=4, pp=4, dp=4, ep=8, etp=1, sp=True, zero=1, mbs=1,
                          recompute=(S,))),
    ]


@pytest.fixture(params=range(4), ids=["gpt3-interleaved", "llama3-cp-order", "mixtral-ep",
                                      "mixtral-folded"])
def plan_file(request, tmp_path):
    sc, par = plans()[request.param]
    ev = evaluate(sc, par)
    path = tmp_path / "plan.json"
    planfile.save(ev, path, method="nest")
    return planfile.load(path), ev


def test_plan_file_round_trip(plan_file):
    pf, ev = plan_file
    assert pf.plan.stage_layers is not None
    again = evaluate(pf.scenario, pf.plan)
    assert again.step_time == pytest.approx(ev.step_time, rel=1e-12)
    assert pf.predicted["step_time_s"] == pytest.approx(ev.step_time)
    assert pf.method == "nest" and pf.scenario.cluster == ev.scenario.cluster


def test_plan_file_lists_every_replicas_devices(plan_file):
    pf, ev = plan_file
    data = planfile.to_dict(ev)
    par = pf.plan
    grid = rank_grid(par)  # [pp, dp, cp, tp]
    for st, mine in zip(data["stages"], ev.stages):
        assert len(st["replicas"]) == par.dp
        assert sorted(d for rep in st["replicas"] for d in rep) == list(mine.devices)
        for d, rep in enumerate(st["replicas"]):
            assert rep == sorted(int(x) for x in grid[mine.index, d].ravel())
            assert len(rep) == par.tp * par.cp


def test_plan_file_rejects_other_versions_unknown_keys_and_edits(tmp_path):
    sc, par = plans()[0]
    data = planfile.to_dict(evaluate(sc, par))
    with pytest.raises(SpecError, match="format: got 3; this nestplan .* reads plan files of "
                                        "format 1 and 2"):
        planfile.from_dict({**data, "format": 3})
    with pytest.raises(SpecError, match="unknown key"):
        planfile.from_dict({**data, "colour": "blue"})
    bad_plan = dict(data, plan={**data["plan"], "tp": 3})
    with pytest.raises(SpecError, match="tp"):
        planfile.from_dict(bad_plan)
    stages = [dict(s) for s in data["stages"]]
    stages[0]["replicas"] = stages[1]["replicas"]
    with pytest.raises(SpecError, match=r"stages\[0\].replicas.*rank order gives"):
        planfile.from_dict(dict(data, stages=stages))
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(dict(data, plan={**data["plan"], "stage_layers": [1, 2]})))
    code = main(["evaluate", "--plan", str(p)])
    assert code == 2


def test_a_plan_files_stack_edited_under_a_catalog_name_is_noted(tmp_path):
    """A plan file's stack keeps its catalog name when its values are edited, and every output
    labels it with that name: loading it says so (a plan file saved from the catalog stack, or
    with only its description changed, loads without a word)."""
    from console import cli

    sc, par = plans()[0]
    data = planfile.to_dict(evaluate(sc, par))
    many = {"step_overhead_s": 0.5, "matmul_scale": 0.9, "memory_scale": 0.9,
            "reserved_GiB": 2.0, "overlap_efficiency": 0.5}
    for name, edit, noted in (("same", {}, ""), ("described", {"description": "mine"}, ""),
                              ("edited", {"step_overhead_s": 0.5}, "step_overhead_s"),
                              ("five", many, "matmul_scale, memory_scale, overlap_efficiency "
                               "and 2 more")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(dict(data, stack={**data["stack"], **edit})))
        code, out, err = cli("evaluate", "--plan", path)
        assert code == 0, err
        said = ("the plan file's stack is named megatron-core but is not this nestplan's catalog "
                "megatron-core (it differs in ")
        assert (said + noted + ")" in err) == bool(noted), (name, err)
        assert (said in err) == bool(noted), (name, err)


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed"])
def test_every_format_exports(plan_file, fmt):
    pf, _ = plan_file
    out = export(pf, fmt)
    assert out.text.strip()
    if pf.plan.recompute and len(set(pf.plan.recompute)) > 1:
        if fmt == "megatron":  # each stage's flags from the stage script
            assert ".stages.sh" in out.extras and "--recompute" not in _arguments(out.text)
        else:
            assert any("per-stage recomputation" in n for n in out.notes)


def test_the_connections_note_follows_the_compute_capability():
    """Megatron-LM asks for CUDA_DEVICE_MAX_CONNECTIONS=1 with TP below compute capability 10
    only: a GB200 plan is not told to set it (a user trial's was, "on GPUs before Blackwell"); an
    H100 plan is, by its part; a part of no stated capability as before."""
    par = Parallelism(tp=2, pp=1, dp=4, zero=1, mbs=1)
    for cluster, said in (("dgx-h100-ndr", "on h100-sxm-80gb (compute capability 9, before "
                                           "Blackwell's 10)"),
                          ("gb200-nvl72-ndr", None)):
        sc = scenario_from_names("llama3-8b", cluster, 8, seq_len=4096, global_batch=64)
        notes = " ".join(exported(sc, par, "megatron").notes)
        assert (said is None) == ("CUDA_DEVICE_MAX_CONNECTIONS" not in notes), notes
        assert said is None or said in notes
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    sc = replace(sc, cluster=replace(sc.cluster, accelerator=replace(  # (a catalog name would
        sc.cluster.accelerator, name="my-gpu", compute_capability=None)))  # take the catalog's)
    assert "on GPUs before Blackwell" in " ".join(exported(sc, par, "megatron").notes)


def test_megatron_arguments(plan_file):
    pf, _ = plan_file
    text = export(pf, "megatron").text
    par = pf.plan
    # the environment Megatron-LM's validate_args asserts (a user trial's launch failed on it)
    fsdp = "--use-megatron-fsdp" in text
    assert ("leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1" in text) == fsdp
    # the one checkpoint format Megatron-FSDP takes, and how a torch_dist one is converted (an
    # MoE user's trial continuing a run was not told)
    assert ("convert-torch-dist-to-fsdp-dtensor" in text) == fsdp == (pf.plan.zero >= 2)
    cc = pf.scenario.cluster.accelerator.compute_capability
    assert ("set CUDA_DEVICE_MAX_CONNECTIONS=1" in text) == (
        not fsdp and (par.tp > 1 or par.cp > 1)
        and "--overlap-moe-expert-parallel-comm" not in text and (cc is None or cc < 10))
    assert f"--tensor-model-parallel-size {par.tp}" in text
    assert f"--pipeline-model-parallel-size {par.pp}" in text
    assert f"--context-parallel-size {par.cp}" in text
    assert ("--sequence-parallel" in text) == par.sp
    if pf.scenario.model.moe is not None:
        assert f"--expert-model-parallel-size {par.ep}" in text
        assert f"--expert-tensor-parallel-size {par.expert_tp}" in text
    if par.vp > 1 or len(set(par.stage_layers)) > 1:
        assert ("--pipeline-model-parallel-layout" in text
                or "--decoder-first-pipeline-num-layers" in text
                or "--num-layers-per-virtual-pipeline-stage" in text)


def test_megatron_mla_and_moe_pattern():
    import re

    cfg = Path(__file__).parent / "data" / "deepseek-v3.json"
    sc = scenario_from_names(str(cfg), "dgx-h100-ndr", 1024, seq_len=4096, global_batch=1024)
    par = Parallelism(tp=2, pp=8, dp=64, ep=32, etp=1, sp=True, zero=1, mbs=1,
                      recompute=(F,))
    text = exported(sc, par, "megatron").text
    for flag in ("--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512",
                 "--qk-head-dim 128", "--qk-pos-emb-head-dim 64", "--v-head-dim 128",
                 "--qk-layernorm"):  # (MLA's q_a and kv_a norms)
        assert flag in text
    pattern = text.split("--moe-layer-freq '")[1].split("'")[0]
    # Megatron evaluates the pattern after checking it holds only these characters
    assert re.fullmatch(r"[\d,\[\]()+*]+", pattern), pattern
    assert eval(pattern) == [0] * 3 + [1] * 58  # noqa: S307 - our own export, as Megatron does


@pytest.mark.frameworks  # (its last checks parse the export with Megatron-Core)
def test_megatron_builds_qwen3_with_its_qk_norms():
    """Qwen3's checkpoints hold q_norm and k_norm: the export asks Megatron for them
    (--qk-layernorm, which its TransformerConfig takes), and a model without them gets none."""
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, sp=False, zero=1, mbs=1)
    texts = {}
    for name in ("qwen3-30b-a3b", "mixtral-8x7b"):
        sc = scenario_from_names(name, "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
        texts[name] = exported(sc, par, "megatron").text
    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    l2 = replace(sc, model=replace(sc.model, name="l2", qk_l2_norm=True))  # Llama 4's kind
    texts["l2"] = exported(l2, par, "megatron").text
    assert "--qk-layernorm" in texts["qwen3-30b-a3b"]
    assert "--qk-layernorm" not in texts["mixtral-8x7b"]
    assert "--qk-l2-norm" in texts["l2"] and "--qk-layernorm" not in texts["l2"]
    assert "--qk-l2-norm" not in texts["qwen3-30b-a3b"]
    pytest.importorskip("megatron.core")
    assert megatron_transformer_config(texts["qwen3-30b-a3b"]).qk_layernorm
    config = megatron_transformer_config(texts["l2"])
    assert config.qk_l2_norm and not config.qk_layernorm


@pytest.mark.frameworks  # (its last checks parse the export with Megatron-Core)
def test_megatron_gates_a_gelu_mlp():
    """A GeLU-gated MLP (a Llama-like config with ``hidden_act = "gelu"``) is exported gated, as
    --quick-geglu, GeLU's sigmoid approximation and Megatron-LM's only GeLU gate, with a note;
    Megatron-Core builds a gated MLP from it."""
    from nestplan.options import MLPKind

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    sc = replace(sc, model=replace(sc.model, mlp=MLPKind.GEGLU))
    out = exported(sc, Parallelism(tp=2, pp=1, dp=4, sp=True, zero=1, mbs=1), "megatron")
    flags = _flags(out.text)
    assert "quick-geglu" in flags and "swiglu" not in flags
    assert any("gated by GeLU" in n for n in out.notes)
    pytest.importorskip("megatron.core")
    config = megatron_transformer_config(out.text)
    assert config.gated_linear_unit and config.activation_func.__name__ == "quick_gelu"
    # with biases, Megatron-Core's fused bias-activation kernels refuse quick GeLU at the first
    # forward (megatron/core/transformer/mlp.py @ d98e8a64dd; a reviewer ran it): off
    biased = replace(sc, model=replace(sc.model, bias=True))
    text = exported(biased, Parallelism(tp=2, pp=1, dp=4, sp=True, zero=1, mbs=1), "megatron").text
    assert "--no-bias-gelu-fusion" in text and "--no-bias-gelu-fusion" not in out.text


def test_megatron_builds_the_biases_gates_and_sinks_of_the_model():
    """Where a model's biases sit (every linear layer, or q, k, v only), Qwen2-MoE's shared-expert
    gate and GPT-OSS's attention sinks reach Megatron-Core's TransformerConfig as the model has
    them; a plan that splits biased experts by expert TP is refused, as Megatron-Core refuses
    it."""
    hf = Path(__file__).parent / "data" / "hf"
    plan = Parallelism(tp=2, pp=1, dp=8, ep=8, etp=1, sp=True, zero=1, mbs=1)  # 16 GPUs
    scenarios, texts, flags_of = {}, {}, {}
    for name in ("qwen2-moe.json", "glm4.5.json", "gpt-oss-120b.json"):
        sc = scenarios[name] = scenario_from_names(str(hf / name), "dgx-h100-ndr", 16,
                                                   seq_len=4096, global_batch=64)
        text = exported(sc, plan, "megatron").text
        flags = _flags(text)
        texts[name], flags_of[name] = text, flags
        assert ("add-qkv-bias" in flags) == sc.model.qkv_bias
        assert ("disable-bias-linear" in flags) == (not sc.model.bias)
    assert flags_of["qwen2-moe.json"]["norm-epsilon"] == ["1e-06"]  # its rms_norm_eps
    assert "norm-epsilon" not in flags_of["glm4.5.json"]  # 1e-5: Megatron-Core's default
    assert "moe-shared-expert-gate" in flags_of["qwen2-moe.json"]
    assert "moe-shared-expert-gate" not in flags_of["glm4.5.json"]
    assert flags_of["glm4.5.json"]["rotary-percent"] == ["0.5"]  # a fraction (Megatron-LM's)
    assert "rotary-percent" not in flags_of["qwen2-moe.json"]
    assert flags_of["gpt-oss-120b.json"]["softmax-type"] == ["learnable"]
    # its experts' TP may not follow TP's 2 (nor be given): Megatron-Core refuses biased experts
    oss_sc = scenarios["gpt-oss-120b.json"]
    with pytest.raises(SpecError, match="etp: got 2; stack megatron-core runs experts that carry"):
        evaluate(oss_sc, replace(plan, etp=None))
    # a plan searched for torchtitan, whose experts follow TP without EP, exports with etp 1
    titan = replace(oss_sc, stack=get_stack("torchtitan"))
    out = exported(titan, Parallelism(tp=2, pp=1, dp=8, ep=1, sp=True, zero=2, mbs=1), "megatron")
    assert _flags(out.text)["expert-tensor-parallel-size"] == ["1"]
    assert any("carry biases at etp = 1 only" in n for n in out.notes)
    pytest.importorskip("megatron.core")
    qwen = megatron_transformer_config(texts["qwen2-moe.json"])
    assert qwen.layernorm_epsilon == 1e-6
    assert qwen.add_qkv_bias and not qwen.add_bias_linear and qwen.moe_shared_expert_gate
    oss = megatron_transformer_config(texts["gpt-oss-120b.json"])
    assert oss.add_bias_linear and oss.softmax_type == "learnable"
    # GPT-OSS's clamped GLU as transformers' GptOssExperts computes it: Megatron-Core's own
    # activation on its built config against the formula, on a few values across the clamp
    import torch

    x = torch.tensor([[-9.0, -1.0, 0.5, 8.0, -9.0, 0.3, 2.0, 9.0]])  # (gate | linear halves)
    gate, up = x.chunk(2, dim=-1)
    gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
    want = (up + 1) * gate * torch.sigmoid(1.702 * gate)
    g, u = x.chunk(2, dim=-1)
    got = oss.activation_func(g.clamp(max=oss.activation_func_clamp_value)) * (
        u.clamp(-oss.activation_func_clamp_value, oss.activation_func_clamp_value)
        + oss.glu_linear_offset)
    assert oss.gated_linear_unit and torch.allclose(got, want)


_OSS_PLAN = Parallelism(tp=1, pp=1, dp=16, ep=16, sp=False, zero=1, mbs=1)
_DSV3_PLAN = Parallelism(tp=2, pp=8, dp=64, ep=32, etp=1, sp=True, zero=1, mbs=1)


LLAMA31 = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2048,
           "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "vocab_size": 32000, "rope_theta": 500000.0, "max_position_embeddings": 131072}


@pytest.mark.frameworks  # (Megatron-Core's RoPE and transformers' on CPU)
@pytest.mark.parametrize("scaling, note", [
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, None),
    ({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}, "is not the one pretrain_gpt.py runs"),
    ({"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.5,
      "original_max_position_embeddings": 8192}, "is not the one pretrain_gpt.py runs"),
    ({"rope_type": "linear", "factor": 4.0}, None),
    ({"rope_type": "linear", "factor": 2.5}, "takes an integer")])
def test_megatron_rope_scaling_flags_give_the_configs_frequencies(scaling, note, tmp_path,
                                                                  monkeypatch):
    """Llama 3.1's RoPE scaling and linear interpolation (dropped from the export until a user
    trial found it) go to Megatron-LM as --use-rope-scaling --rope-scaling-factor and
    --rotary-seq-len-interpolation-factor; fed to Megatron-Core's own ``RotaryEmbedding`` as
    pretrain_gpt.py feeds them (its ``gpt_config_from_args`` passes no --rope-scaling-factor: the
    model keeps 8, megatron/training/argument_utils.py @ d98e8a64dd; a reviewer found it) they
    give the angles transformers computes from the config. What they cannot say gets a note (and
    the angles then differ)."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA31, "rope_scaling": scaling}))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    out = exported(sc, Parallelism(tp=2, pp=1, dp=4, sp=True, zero=1, mbs=1), "megatron")
    flags = _flags(out.text)
    noted = [n for n in out.notes if note and note in n]
    assert bool(noted) == bool(note), out.notes
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # (it moves them to a GPU)
    factor = flags.get("rotary-seq-len-interpolation-factor")
    ours = RotaryEmbedding(sc.model.head_dim, 1.0, rotary_base=int(flags["rotary-base"][0]),
                           seq_len_interpolation_factor=float(factor[0]) if factor else None,
                           rope_scaling="use-rope-scaling" in flags, rope_scaling_factor=8.0,
                           use_cpu_initialization=True)
    angles = ours(64)[:, 0, 0, :sc.model.head_dim // 2].float()  # [positions, frequencies]
    hf = AutoConfig.for_model(**json.loads(path.read_text()))
    inv_freq, _ = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, torch.device("cpu"))
    theirs = torch.arange(64, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
    assert torch.allclose(angles, theirs, rtol=1e-5, atol=1e-5) != bool(note)


@pytest.mark.frameworks  # (Megatron-Core's YaRN and transformers' on CPU)
@pytest.mark.parametrize("config, scaling, plan", [
    ("hf/gpt-oss-120b.json", None, _OSS_PLAN),
    ("hf/gpt-oss-120b.json", {"rope_type": "yarn", "factor": 32.0, "attention_factor": 1.2,
                              "original_max_position_embeddings": 4096}, _OSS_PLAN),
    ("deepseek-v3.json", None, _DSV3_PLAN),
    ("deepseek-v3.json", {"type": "yarn", "factor": 40, "mscale_all_dim": 1.0,
                          "original_max_position_embeddings": 4096}, _DSV3_PLAN),
    ("deepseek-v3.json", {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 0.707,
                          "attention_factor": 1.2, "original_max_position_embeddings": 4096},
     _DSV3_PLAN)])
def test_megatron_yarn_flags_give_the_configs_frequencies(config, scaling, plan, monkeypatch,
                                                          tmp_path):
    """The YaRN flags of an export, fed to Megatron-Core's own ``YarnRotaryEmbedding`` (standard
    attention's, or MLA's over its rotary head dimensions), give the frequencies and the cos/sin
    scale that transformers computes from the model's config.json, and for MLA the softmax scale
    of transformers' DeepseekV3Attention: GPT-OSS's unrounded correction range, DeepSeek-V3's
    mscales, an mscale_all_dim alone (which the cos/sin factor ignores and MLA's softmax reads)
    and an explicit attention_factor (as the --mscale that gives it) included."""
    import torch
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        YarnRotaryEmbedding, _yarn_get_mscale)
    from transformers import AutoConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    path = Path(__file__).parent / "data" / config
    if scaling is not None:
        data = json.loads(path.read_text())
        data["rope_scaling"] = scaling
        path = tmp_path / "config.json"
        path.write_text(json.dumps(data))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", plan.tp * plan.pp * plan.dp,
                             seq_len=4096, global_batch=1024, mtp_layers=0)
    flags = _flags(exported(sc, plan, "megatron").text)
    m = sc.model
    mla = "multi-latent-attention" in flags
    assert mla == (m.mla is not None)
    assert flags["position-embedding-type"] == ["rope" if mla else "yarn"]

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # (it moves them to a GPU)

    def given(name, default):
        return float(flags[name][0]) if name in flags else default
    ours = YarnRotaryEmbedding(
        m.mla.qk_rope_head_dim if mla else m.head_dim, rotary_base=m.rope_theta,
        use_cpu_initialization=True, scaling_factor=given("rotary-scaling-factor", 1.0),
        original_max_position_embeddings=int(given("yarn-original-max-position-embeddings", 4096)),
        beta_fast=given("yarn-beta-fast", 32.0), beta_slow=given("yarn-beta-slow", 1.0),
        mscale=given("mscale", 1.0), mscale_all_dim=given("mscale-all-dim", 0.0),
        correction_range_round_to_int="no-yarn-correction-range-round-to-int" not in flags)
    emb, scale = ours.get_emb(2)
    half = emb.shape[-1] // 2
    hf = AutoConfig.for_model(**json.loads(path.read_text()))
    if mla:  # transformers rotates MLA's rope dimensions only
        hf.head_dim = m.mla.qk_rope_head_dim
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](hf, torch.device("cpu"))
    assert torch.allclose(emb[1].flatten()[:half].float(), inv_freq.float(), rtol=1e-5)
    assert float(scale) == pytest.approx(factor)
    if not mla:  # (MLA scales in its own path: its rope_mscale stays 1)
        assert m.rope_mscale == pytest.approx(factor)
        return
    # MLA's softmax: Megatron-Core's (multi_latent_attention.py) against transformers'
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    q_head = m.mla.qk_nope_head_dim + m.mla.qk_rope_head_dim
    ours = _yarn_get_mscale(given("rotary-scaling-factor", 1.0), given("mscale-all-dim", 0.0))
    assert ours ** 2 / q_head ** 0.5 == pytest.approx(
        yarn_apply_mscale(hf.rope_parameters, q_head ** -0.5))


@pytest.mark.parametrize("config, mtp, why", [
    ("gpt-oss-120b.json", 1, "trains multi-token prediction with rope or no position embedding"),
    ("glm4.5.json", 0, "rotates whole heads (no --rotary-percent 0.5)")])
def test_megatron_exports_no_yarn_it_cannot_run(tmp_path, config, mtp, why):
    """Standard attention's YaRN goes out as plain RoPE with a note where Megatron-LM cannot run
    it: with multi-token prediction (validate_args refuses yarn with MTP) or on a share of each
    head (its YaRN rotates whole heads). A review caught the first, which Megatron-LM refused."""
    data = json.loads((Path(__file__).parent / "data" / "hf" / config).read_text())
    data["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 4096}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", 16, seq_len=4096, global_batch=64,
                             mtp_layers=mtp)
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, sp=False, zero=1, mbs=1)
    out = exported(sc, par, "megatron")
    flags = _flags(out.text)
    assert flags["position-embedding-type"] == ["rope"]
    assert not any(f.startswith(("yarn-", "rotary-scaling", "mscale")) for f in flags)
    assert any(n.startswith("YaRN (x4 context") and why in n for n in out.notes), out.notes


def test_megatron_export_names_the_local_attention_it_leaves_out():
    """Llama 4's chunked attention is costed but not exported (Megatron-LM has no flag for it):
    the export says so where a sequence spans more than one chunk; a model without local
    attention, or sequences of one chunk (8,192 tokens: a user trial's note quoted the plan's own
    step and peak), get no such note."""
    notes, steps = {}, {}
    for name, ep, seq in (("llama4-maverick", 16, 16384), ("mixtral-8x7b", 8, 16384),
                          ("llama4-maverick-one-chunk", 16, 8192)):  # (ep: at most its experts)
        sc = scenario_from_names(name.removesuffix("-one-chunk"), "dgx-h100-ndr", 64,
                                 seq_len=seq, global_batch=64)
        par = Parallelism(tp=4, pp=1, dp=16, ep=ep, etp=1, sp=True, zero=1, mbs=1)
        pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
        notes[name] = " ".join(export(pf, "megatron").notes)
        steps[name] = evaluate(replace(sc, model=sc.model.without_local_attention()),
                                par).step_time
    assert "chunked attention on 75% of the layers" in notes["llama4-maverick"]
    # and what the launched run, attending to whole sequences, is predicted at (a user trial's
    # Mistral at 32K tokens ran 1.9x slower than the header it was given)
    assert (f"with every layer attending to the whole sequence, the step is predicted at "
            f"{fmt_time(steps['llama4-maverick'])}") in notes["llama4-maverick"]
    for name in ("mixtral-8x7b", "llama4-maverick-one-chunk"):
        assert "whole sequence" not in notes[name] and "local attention" not in notes[name]
        assert "chunked attention" not in notes[name]
    # Llama 4 weights its experts' inputs (top-1): the flag, no note
    assert "moe_apply_probs_on_input" not in notes["llama4-maverick"]


MISTRAL = {"model_type": "mistral", "hidden_size": 1024, "intermediate_size": 2048,
           "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2,
           "vocab_size": 32000, "sliding_window": 512}


@pytest.mark.frameworks  # (Megatron-Core's own rule for windowed layers)
@pytest.mark.parametrize("config", [
    "hf/gpt-oss-120b.json", MISTRAL,
    {**MISTRAL, "model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 5},
    {**MISTRAL, "model_type": "qwen2", "use_sliding_window": True,
     "layer_types": ["sliding_attention", "full_attention", "full_attention"] * 2
     + ["sliding_attention"] * 2}])
def test_megatron_sliding_window_flags_give_the_models_windowed_layers(config, tmp_path):
    """A sliding window is exported (a user trial: it had been costed but left out, the launched
    run 1.9x slower than predicted): --window-size's left count plus the token itself is the
    config's sliding_window, and Megatron-Core's own rule (``is_layer_window_attention``) on the
    exported --window-attn-skip-freq windows exactly the layers the config does: GPT-OSS's every
    other one, Mistral's all, Qwen2's from max_window_layers on or as layer_types lists them."""
    from megatron.core.transformer.utils import is_layer_window_attention

    path = Path(__file__).parent / "data" / config if isinstance(config, str) else (
        tmp_path / "config.json")
    if not isinstance(config, str):
        path.write_text(json.dumps(config))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    m = sc.model
    moe = m.moe is not None
    out = exported(sc, Parallelism(
        tp=1, pp=1, dp=8, ep=8 if moe else 1, etp=1 if moe else None, zero=1, mbs=1), "megatron")
    assert not any("whole sequence" in n or "local attention" in n for n in out.notes), out.notes
    config = megatron_transformer_config(out.text)
    assert config.window_size[0] + 1 == m.sliding_window
    windowed = [i for i in range(m.layers)
                if is_layer_window_attention(config.window_size, config.window_attn_skip_freq, i + 1)]
    assert windowed == list(m.local_layers) and windowed


@pytest.mark.frameworks  # (Megatron-Core's own expansion of the flag)
@pytest.mark.parametrize("layers, no_rope_layers", [(8, None), (8, [1, 1, 0, 1, 1, 1, 1, 0]),
                                                    (10, None)])
def test_megatron_skips_rope_on_llama4s_nope_layers(layers, no_rope_layers, tmp_path):
    """Llama 4's NoPE layers (every 4th, or as no_rope_layers lists them, 0 for NoPE) are
    exported as --no-rope-freq (a user trial: the launched model had RoPE everywhere), and
    Megatron-Core's TransformerConfig expands it to exactly those layers (as a pattern where 4
    does not divide the layers, which it refuses as an integer)."""
    config = {"model_type": "llama4_text", "hidden_size": 512, "intermediate_size": 1024,
              "intermediate_size_mlp": 2048, "num_hidden_layers": layers, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000,
              "num_local_experts": 8, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2,
              "attention_chunk_size": 1024,
              **({"no_rope_layers": no_rope_layers} if no_rope_layers else {})}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    out = exported(sc, Parallelism(tp=1, pp=1, dp=8, ep=8, etp=1, zero=1, mbs=1), "megatron")
    nope = [int((i + 1) % 4 == 0) for i in range(layers)] if no_rope_layers is None else [
        1 - r for r in no_rope_layers]
    assert megatron_transformer_config(out.text).no_rope_freq == nope


@pytest.mark.frameworks  # (Megatron-Core's own reading of the pattern)
def test_megatron_puts_experts_on_the_blocks_moe_layers_lists(tmp_path):
    """MoE blocks on no fixed pattern (Llama 4's ``moe_layers``): the export's --moe-layer-freq
    list puts the experts on exactly those blocks in Megatron-Core's TransformerConfig."""
    config = {"model_type": "llama4_text", "hidden_size": 512, "intermediate_size": 1024,
              "intermediate_size_mlp": 2048, "num_hidden_layers": 8, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000,
              "num_local_experts": 8, "num_experts_per_tok": 1, "moe_layers": [0, 1, 5]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", 8, seq_len=4096, global_batch=64)
    assert sc.model.moe.layers == (0, 1, 5)
    out = exported(sc, Parallelism(tp=1, pp=1, dp=8, ep=8, etp=1, zero=1, mbs=1), "megatron")
    assert megatron_transformer_config(out.text).moe_layer_freq == [1, 1, 0, 0, 0, 1, 0, 0]


@pytest.mark.frameworks
def test_llama4_exports_weight_the_experts_inputs_as_megatron_core_reads_it():
    """Llama 4's router score scales each expert's input: Megatron-LM's own parser turns the
    exported --moe-apply-probs-on-input into TransformerConfig.moe_apply_probs_on_input (a user
    trial: the export had said pretrain_gpt.py had no flag for it); Mixtral's does not."""
    pytest.importorskip("megatron.core")
    for name, ep, on in (("llama4-maverick", 16, True), ("mixtral-8x7b", 8, False)):
        sc = scenario_from_names(name, "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
        out = exported(sc, Parallelism(tp=4, pp=1, dp=16, ep=ep, etp=1, sp=True, zero=1,
                                       mbs=1), "megatron")
        assert ("--moe-apply-probs-on-input" in out.text) == on
        assert megatron_transformer_config(out.text).moe_apply_probs_on_input == on


def test_megatron_trains_the_depths_where_the_plan_puts_them():
    """DeepSeek-V3 with its MTP depth: ``--mtp-num-layers``, and a stated layout holds the depth
    in its last chunk, which Megatron-Core's layout parser and validator accept."""
    sc = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 1024, seq_len=4096, global_batch=8192)
    par = Parallelism(tp=2, pp=8, vp=4, dp=64, ep=64, etp=1, sp=True, zero=1, mbs=1,
                      stage_layers=(1,) + (2,) * 30 + (0,))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    text = export(pf, "megatron").text
    assert "--mtp-num-layers 1" in text
    assert "--pipeline-model-parallel-layout 'Et|tt|" in text and text.count("|mL'") == 1
    pytest.importorskip("megatron.core")
    check_megatron(pf, text, ranks=False)
    plain = exported(replace(sc, model=replace(sc.model, mtp_layers=0)), par, "megatron").text
    assert "--mtp-num-layers" not in plain and "|L'" in plain
    for fmt in ("torchtitan", "deepspeed"):
        assert any("multi-token-prediction depth" in n for n in export(pf, fmt).notes), fmt
    titan = export(pf, "torchtitan").text
    assert "deepseek_v3_671b" in titan  # torchtitan 0.3's own DeepSeek-V3 definition
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    check_torchtitan(pf, titan)


def test_the_megatron_header_says_how_to_read_the_arguments_into_bash(tmp_path):
    """The header's bash line (``megatron.LAUNCH_ARGS``) gives pretrain_gpt.py the arguments the
    file's lines hold, the layout's quotes taken off and the continuations joined (a user trial
    pasted the whole file, comments too, after ``pretrain_gpt.py``)."""
    import shlex
    import subprocess

    from nestplan.exports.megatron import LAUNCH_ARGS

    sc = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 1024, seq_len=4096, global_batch=8192)
    par = Parallelism(tp=2, pp=8, vp=4, dp=64, ep=64, etp=1, sp=True, zero=1, mbs=1,
                      stage_layers=(1,) + (2,) * 30 + (0,))
    text = exported(sc, par, "megatron").text
    assert f"in bash, FILE being this file: {LAUNCH_ARGS};" in text
    path = tmp_path / "run.args"
    path.write_text(text)
    script = (LAUNCH_ARGS.replace("FILE", shlex.quote(str(path)))
              + '; python3 -c "import json, sys; print(json.dumps(sys.argv[1:]))" "$@"')
    got = json.loads(subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                                    check=True).stdout)
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    assert got == shlex.split(" ".join(line.rstrip(" \\") for line in lines))
    layout = got[got.index("--pipeline-model-parallel-layout") + 1]
    assert layout.startswith("Et|tt|") and "'" not in layout
    assert got[0] == "--tensor-model-parallel-size" and len(lines) == sum(
        w.startswith("--") for w in got)


def test_exports_say_what_they_change_and_warn_when_nothing_fits():
    sc, par = plans()[1]  # ZeRO-3 under pipelining, per-stage recomputation
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    ds = export(pf, "deepspeed")
    assert json.loads(ds.text)["zero_optimization"]["stage"] == 1
    assert any("ZeRO-3 is incompatible with DeepSpeed's pipeline engine" in n for n in ds.notes)
    assert any(n.startswith("exported plan: predicted step") for n in ds.notes)
    gpt, gpar = plans()[0]  # interleaved
    ds = exported(gpt, gpar, "deepspeed")
    assert any("no interleaved schedule" in n for n in ds.notes)
    huge = scenario_from_names("llama3-70b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=8)
    ev = evaluate(huge, Parallelism(tp=1, pp=1, dp=8, mbs=1))
    assert not ev.fits
    pf = planfile.from_dict(planfile.to_dict(ev))
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        out = export(pf, fmt)
        assert out.notes[0].startswith("the plan does NOT fit"), fmt
    # an unchanged plan gets no "exported plan" note
    ok = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=32)
    pf = planfile.from_dict(planfile.to_dict(evaluate(ok, Parallelism(tp=2, pp=2, dp=4, mbs=1))))
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        assert not any(n.startswith("exported plan") for n in export(pf, fmt).notes), fmt


def test_cli_export_writes_extras(tmp_path, capsys):
    """A rank order the framework does not number in gets a rank map and its wrapper; Megatron-LM
    numbers tp-cp-pp-dp itself under --use-tp-pp-dp-mapping (a user trial: the export had asked
    for the wrapper), torchtitan does not."""
    sc, par = plans()[1]
    path = tmp_path / "plan.json"
    planfile.save(evaluate(sc, par), path)
    out = tmp_path / "torchtitan.args"
    assert main(["export", str(path), "--format", "torchtitan", "-o", str(out)]) == 0
    assert out.exists() and (tmp_path / "torchtitan.args.ranks.csv").exists()
    err = capsys.readouterr().err
    assert "rank order (tp-cp-pp-dp) differs from torchtitan" in err
    out = tmp_path / "megatron.args"
    assert main(["export", str(path), "--format", "megatron", "-o", str(out)]) == 0
    assert "--use-tp-pp-dp-mapping" in out.read_text()
    assert not (tmp_path / "megatron.args.ranks.csv").exists()
    assert "differs from Megatron" not in capsys.readouterr().err
    # a pipelined MoE plan whose experts' data-parallel size is not the attention's keeps the
    # wrapper: Megatron-Core refuses that order for it
    from nestplan.exports.megatron import PP_DP_ORDER, launch_order

    mix = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=128)
    order = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)
    same = Parallelism(tp=2, pp=2, dp=16, ep=2, etp=1, sp=True, zero=1, mbs=1, rank_order=order)
    wider = Parallelism(tp=2, pp=2, dp=16, ep=8, etp=1, sp=True, zero=1, mbs=1, rank_order=order)
    assert launch_order(same, mix.model) == PP_DP_ORDER != launch_order(wider, mix.model)
    assert main(["export", str(path), "--format", "slurm"]) == 2


# --------------------------------------------------------------- the frameworks' own parsers

frameworks = pytest.mark.frameworks


def _parse_rank_map(text: str) -> dict[int, int]:
    """Framework rank -> device, from a rank map CSV (``rank,device,node,local_device``)."""
    return {int(r): int(d) for r, d, *_ in (line.split(",") for line in text.splitlines()[1:])}


def _rank_devices(par) -> dict[int, int]:
    """Framework rank -> device, from the rank map the exports write."""
    from nestplan.exports import rank_map

    return _parse_rank_map(rank_map(par, 8))


def _groups(arr, axis: int) -> list[list[int]]:
    """Device-id groups along ``axis`` of a device grid, each sorted, sorted."""
    rows = np.moveaxis(arr, axis, -1).reshape(-1, arr.shape[axis])
    return sorted(sorted(int(d) for d in g) for g in rows)


def _flags(text: str) -> dict[str, list[str]]:
    """``--name value ...`` of an argument export, by name."""
    out = {}
    for line in text.splitlines():
        if line.startswith("--"):
            name, *values = line.rstrip(" \\").split()
            out[name[2:]] = values
    return out


def megatron_lm_accepts(text: str) -> None:
    """Every flag of a Megatron export (the arguments, or a stage script's) is one Megatron-LM's
    ``pretrain_gpt.py`` parses, given as many values as it takes, each one of its choices where
    it has them: the options of ``tests/data/megatron_lm_arguments.tsv``, which Megatron-LM's own
    parser builder gave (``tests/megatron_lm_arguments.py``). Megatron's parser takes no
    abbreviations (``allow_abbrev=False``)."""
    import shlex

    table = {}
    with open(Path(__file__).parent / "data" / "megatron_lm_arguments.tsv") as f:
        for line in f:
            if not line.startswith(("#", "option\t")):
                option, takes, choices = line.rstrip("\n").split("\t")
                table[option] = (takes, choices.split(",") if choices else None)
    words = shlex.split(" ".join(line.rstrip(" \\") for line in text.splitlines()
                                 if line.lstrip().startswith("--")))
    i = 0
    while i < len(words):
        option = words[i]
        assert option in table, f"Megatron-LM has no {option}"
        j = i + 1
        while j < len(words) and not words[j].startswith("--"):
            j += 1
        values, (takes, choices) = words[i + 1:j], table[option]
        wanted = {"none": (0, 0), "1": (1, 1), "?": (0, 1), "+": (1, 10**6), "*": (0, 10**6)}.get(
            takes, (int(takes), int(takes)) if takes.isdigit() else (0, 10**6))
        assert wanted[0] <= len(values) <= wanted[1], f"{option} takes {takes} values: {values}"
        for v in values if choices else ():
            assert v in choices, f"{option} {v}: Megatron-LM's choices are {choices}"
        i = j


MEGATRON_NOT_CONFIG = ("pipeline-model-parallel-layout",)
"""Export flags left out of the TransformerConfig check (the layout is checked by its own
class)."""


def _graph_fields(flags: dict, fields) -> dict:
    """The CUDA-graph flags, which the export names as Megatron-LM's main branch does
    (``--cuda-graph-impl local|transformer_engine|full_iteration``, ``--cuda-graph-modules``),
    as the installed release's fields: megatron-core 0.16 calls the modules ``cuda_graph_scope``
    and a full iteration ``local`` with that scope."""
    impl = flags.get("cuda-graph-impl", ["none"])[0]
    modules = flags.get("cuda-graph-modules", [])
    if impl == "none":
        return {}
    if "cuda_graph_modules" in fields:
        return {"cuda_graph_impl": impl, "cuda_graph_modules": modules}
    if impl == "full_iteration":
        return {"cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}
    return {"cuda_graph_impl": impl, **({"cuda_graph_scope": modules} if modules else {})}


def _moe_layer_freq(pattern: str):
    """``--moe-layer-freq`` as Megatron's argument parser reads it: an integer, or a Python list
    expression of digits, brackets, commas, ``+`` and ``*`` (which it evaluates; the export
    quotes it for the shell)."""
    pattern = pattern.strip("'")
    assert re.fullmatch(r"[\d\[\](),+*]+", pattern), pattern
    return eval(pattern, {"__builtins__": {}})  # the charset above holds no names


def megatron_transformer_config(text: str):
    """Megatron-Core's own TransformerConfig (MLATransformerConfig with MLA) built from the
    exported arguments that are its fields, so that its validation of the recompute modules, the
    fp8 recipe and the MoE settings runs on what the export says. The fp8 recompute checks ask
    for Transformer Engine >= 2.6, which a CPU machine does not have: the check takes it as
    installed, as a GPU launch of the export would have it."""
    import dataclasses
    from unittest import mock

    import torch
    from megatron.core.transformer import transformer_config as tc

    megatron_lm_accepts(text)
    flags = _flags(text)
    cls = tc.MLATransformerConfig if "multi-latent-attention" in flags else tc.TransformerConfig
    fields = {f.name: f for f in dataclasses.fields(cls)}
    renamed = {"num-experts": "num_moe_experts", "fp8-format": "fp8",
               "swiglu": "gated_linear_unit", "norm-epsilon": "layernorm_epsilon",
               "microbatch-group-size-per-virtual-pipeline-stage":
                   "microbatch_group_size_per_vp_stage"}
    kw = {"bf16": True}
    if cls is tc.MLATransformerConfig and "q-lora-rank" not in flags:
        # pretrain_gpt.py passes its argparse default, None (no query low-rank), where the
        # dataclass's is 512 (megatron/training/arguments.py @ NVIDIA/Megatron-LM d98e8a64dd)
        kw["q_lora_rank"] = None
    kw.update(_graph_fields(flags, fields))
    if "moe-layer-freq" in flags:
        kw["moe_layer_freq"] = _moe_layer_freq(flags["moe-layer-freq"][0])
    if "window-size" in flags:  # (Megatron-LM's tuple_type)
        kw["window_size"] = tuple(int(v) for v in flags["window-size"][0].strip("()").split(","))
    for name in ("window-attn-skip-freq", "no-rope-freq"):  # (the same pattern syntax)
        if name in flags:
            kw[name.replace("-", "_")] = _moe_layer_freq(flags[name][0])
    for name, values in flags.items():
        if name in MEGATRON_NOT_CONFIG or name.startswith("cuda-graph") or name in (
                "moe-layer-freq", "window-size", "window-attn-skip-freq", "no-rope-freq"):
            continue
        key = renamed.get(name, name.replace("-", "_"))
        if name == "disable-bias-linear":
            kw["add_bias_linear"] = False
        elif key in fields:
            default = fields[key].default
            if not values:
                kw[key] = True
            elif key == "recompute_modules":
                kw[key] = values
            elif isinstance(default, bool):
                kw[key] = values[0] == "true"
            elif isinstance(default, float) or key.endswith("_factor"):
                kw[key] = float(values[0])
            else:
                kw[key] = int(values[0]) if values[0].isdigit() else values[0]
    if kw.get("gated_linear_unit"):
        kw["activation_func"] = torch.nn.functional.silu
    if "quick-geglu" in flags:  # as megatron/training/argument_utils.py @ d98e8a64dd sets it
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kw.update(gated_linear_unit=True, activation_func=quick_gelu)
    if kw.get("pipeline_model_parallel_size", 1) > 1:
        kw["pipeline_dtype"] = torch.bfloat16
    if "pipeline-model-parallel-layout" in flags:  # its chunks per rank, as validate_args reads
        # them from the layout (megatron/training/arguments.py @ d98e8a64dd)
        from megatron.core.transformer.pipeline_parallel_layer_layout import (
            PipelineParallelLayerLayout)

        stages = PipelineParallelLayerLayout.get_num_stages_from_str(
            flags["pipeline-model-parallel-layout"][0].strip("'"))
        vp = stages // kw["pipeline_model_parallel_size"]
        if vp > 1:
            kw["virtual_pipeline_model_parallel_size"] = vp
    elif "num-layers-per-virtual-pipeline-stage" in flags:  # (likewise from the count)
        kw["virtual_pipeline_model_parallel_size"] = int(flags["num-layers"][0]) // (
            kw["pipeline_model_parallel_size"]
            * int(flags["num-layers-per-virtual-pipeline-stage"][0]))
    # (the fused permutation is Transformer Engine's too: the check imports its kernels, which a
    # CPU install lacks)
    from megatron.core.transformer.moe import moe_utils

    fused = {f: object() for f in ("fused_permute", "fused_permute_with_probs",
                                   "fused_sort_chunks_by_index",
                                   "fused_sort_chunks_by_index_with_probs", "fused_unpermute")}
    with mock.patch.object(tc, "is_te_min_version", lambda *a, **k: True), \
            mock.patch.multiple(moe_utils, create=True, **fused):
        return cls(**kw)


def check_megatron(pf, text: str, ranks: bool = True):
    """Megatron-Core parses the layout, builds its TransformerConfig from the arguments
    (``megatron_transformer_config``), and (``ranks``) its rank generators mapped through the
    exported rank map give the plan's TP, CP, DP and PP groups and its expert EP, expert-TP and
    expert-DP groups."""
    from megatron.core import parallel_state as ps
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout)

    par = pf.plan
    megatron_transformer_config(text)
    if "--pipeline-model-parallel-layout" in text:
        layout = text.split("--pipeline-model-parallel-layout '")[1].split("'")[0]
        parsed = PipelineParallelLayerLayout(layout, par.pp)
        assert parsed.virtual_pipeline_model_parallel_size == par.vp
        m = pf.scenario.model  # Megatron's own check of the blocks and depths it holds
        parsed.validate_layer_layout(m.layers, m.mtp_layers or None)
    if not ranks:
        return
    # --use-tp-pp-dp-mapping launches in the plan's own order: rank r runs on device r
    mapped = "--use-tp-pp-dp-mapping" in text
    order = "tp-cp-ep-pp-dp" if mapped else "tp-cp-ep-dp-pp"
    device_of = {r: r for r in range(par.devices)} if mapped else _rank_devices(par)
    grid = rank_grid(par)  # [pp, dp, cp, tp]
    dense = ps.RankGenerator(tp=par.tp, ep=1, dp=par.dp, pp=par.pp, cp=par.cp, order=order)
    for axis, dim in (("tp", 3), ("cp", 2), ("dp", 1), ("pp", 0)):
        theirs = sorted(sorted(device_of[r] for r in g) for g in dense.get_ranks(axis))
        assert theirs == _groups(grid, dim), axis
    if pf.scenario.model.moe is None:
        return
    egrid = expert_grid(grid, par)  # [pp, edp, ep, etp]
    expert = ps.RankGenerator(tp=par.expert_tp, ep=par.ep, dp=egrid.shape[1], pp=par.pp, cp=1,
                              order=order)
    if mapped:  # Megatron-Core's own assertion under that order (initialize_model_parallel)
        assert expert.get_ranks("pp") == dense.get_ranks("pp")
    for axis, dim in (("tp", 3), ("ep", 2), ("dp", 1)):
        theirs = sorted(sorted(device_of[r] for r in g) for g in expert.get_ranks(axis))
        assert theirs == _groups(egrid, dim), f"expert {axis}"


# Stand-in configs for parsing on a CPU: the export leaves MODULE and CONFIG to the user for
# models torchtitan does not define, and torchtitan's 405B config converts its linears to
# float8 while parsing, which needs torchao and an SM89+ GPU.
STAND_IN = {"MODULE": "llama3", "CONFIG": "llama3_8b", "llama3_405b": "llama3_70b"}


def _torchtitan_args(text: str) -> list[str]:
    """The export's arguments as torchtitan receives them (with a stand-in base config where
    needed: ``STAND_IN``)."""
    args = [tok for line in text.splitlines() if not line.startswith("#") for tok in line.split()]
    return [STAND_IN.get(a, a) for a in args]


def check_torchtitan(pf, text: str):
    """torchtitan's own ConfigManager parses and validates the arguments, and its ParallelDims
    accepts the degrees."""
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = ConfigManager().parse_args(_torchtitan_args(text))
    p, par = cfg.parallelism, pf.plan
    assert (p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree) == (
        par.tp, par.pp, par.cp)
    assert p.data_parallel_replicate_degree * p.data_parallel_shard_degree == par.dp
    assert p.enable_sequence_parallel == par.sp
    assert cfg.training.global_batch_size == pf.scenario.training.global_batch
    if par.pp > 1:
        parts = p.module_fqns_per_model_part
        assert len(parts) == par.pp * par.vp
        blocks = [sum(1 for f in part if f.startswith("layers.")) for part in parts]
        assert blocks == [b - a for a, b in chunk_bounds(pf.scenario.model, par)]
        # the modules around the blocks are named as torchtitan's own stage generator names
        # them (an export had named the head's projection "output", which torchtitan 0.3's
        # Decoder calls lm_head: its last stage then had none)
        from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

        (whole,) = _generate_llm_fqn_per_model_part(1, 1)
        ends = [f for f in whole if not f.startswith("layers.")]
        assert [f for f in parts[0] + parts[-1] if not f.startswith("layers.")] == ends
        assert cfg.training.local_batch_size % p.pipeline_parallel_microbatch_size == 0
        # the schedule torchtitan will build: the plan's, or the closest one it runs
        from torch.distributed.pipelining.schedules import (PipelineScheduleMulti,
                                                            get_schedule_class)

        looped = issubclass(get_schedule_class(p.pipeline_parallel_schedule),
                            PipelineScheduleMulti)
        assert looped == (par.vp > 1)
        if par.pipeline.torchtitan is not None:
            assert p.pipeline_parallel_schedule == par.pipeline.torchtitan
    dims = ParallelDims.from_config(p, pf.scenario.gpus)
    if pf.scenario.model.moe is not None:  # the dense and expert regions cover the same ranks
        assert (dims.dp_shard * dims.cp * dims.tp) % dims.ep == 0
    # the one policy the export runs for every stage (the plan's that keeps the least), as
    # torchtitan's mode by its rule (module recomputation such as megatron-core's selective or
    # fine-grained runs as torchtitan's selective, with a note)
    policy = uniform_policy(pf)[0]
    kind = (type(None) if policy.kind == "none" else "SelectiveAC"
            if policy.kind in ("modules", "matmul-outputs") else "FullAC")
    ac = cfg.activation_checkpoint
    assert ac is None if kind is type(None) else type(ac).__qualname__.startswith(kind)


def check_deepspeed(pf, text: str, monkeypatch):
    from deepspeed.runtime import config as ds_config

    # as on rank 0 of an initialised job, so that DeepSpeed asks the MPU for the DP size
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)

    class MPU:  # the data-parallel group size DeepSpeed asks a model-parallel unit for
        def get_data_parallel_world_size(self):
            return pf.plan.dp

        def get_model_parallel_world_size(self):
            return pf.plan.tp

        def get_data_parallel_rank(self):
            return 0

        def get_model_parallel_rank(self):
            return 0

    cfg = ds_config.DeepSpeedConfig(json.loads(text), mpu=MPU())
    assert cfg.train_batch_size == pf.scenario.training.global_batch
    assert cfg.train_micro_batch_size_per_gpu == pf.plan.mbs
    # DeepSpeed's pipeline engine asserts ZeRO < 2
    par = pf.plan
    assert cfg.zero_optimization_stage == (min(par.zero, 1) if par.pp > 1 else par.zero)
    # the buckets each stage takes: ZeRO-3 gathers by its prefetch bucket, the others by
    # allgather_bucket_size, which ZeRO-3 ignores (a DeepSpeed user's trial)
    zc, sent = cfg.zero_config, json.loads(text)["zero_optimization"]
    assert zc.reduce_bucket_size == 40_000_000
    if cfg.zero_optimization_stage == 3:
        assert zc.prefetch_bucket_size == 40_000_000 and "allgather_bucket_size" not in sent
    else:
        assert zc.allgather_bucket_size == 40_000_000 and "stage3_prefetch_bucket_size" not in sent
    if par.pp > 1:
        full = uniform_policy(pf)[0].kind == "full"
        assert cfg.pipeline["activation_checkpoint_interval"] == (1 if full else 0)
    if "expert_parallel" in json.loads(text):  # DeepSpeed's AutoEP folds the plan's expert grid
        from deepspeed.module_inject.auto_ep_config import validate_autoep_config

        ep = cfg.expert_parallel_config
        assert ep.enabled and ep.autoep_size == par.ep and ep.expert_tensor_parallel_size == 1
        validate_autoep_config(ep, world_size=pf.scenario.gpus, pp_size=par.pp, tp_size=par.tp,
                               sp_size=1, zero_stage=cfg.zero_optimization_stage)


@frameworks
@pytest.mark.parametrize("gpus, pp", [(64, 1), (64, 2), (16, 1)])
def test_deepspeed_plans_expert_parallelism_that_its_autoep_takes(gpus, pp, monkeypatch):
    """The deepspeed stack runs expert parallelism as DeepSpeed's AutoEP does (the expert grid
    folded over each pipeline stage's ranks, expert TP 1): Mixtral's search picks EP over its
    data-parallel ranks, and the export's expert_parallel section is what DeepSpeed's own config
    and AutoEP checks take (it had offered no EP at all)."""
    pytest.importorskip("deepspeed.module_inject.auto_ep_config")
    from nestplan.search import methods
    from nestplan.search.constraints import Constraints

    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", gpus, seq_len=4096,
                             global_batch=256, stack="deepspeed")
    best = methods.run_method("nest", sc, Constraints(pp=pp), top=1).best
    assert best.plan.ep > 1 and best.plan.expert_tp == 1, best.plan
    pf = planfile.from_dict(planfile.to_dict(best))
    check_deepspeed(pf, export(pf, "deepspeed").text, monkeypatch)


@frameworks
def test_megatron_core_accepts_layout_and_rank_map(plan_file):
    pytest.importorskip("megatron.core")
    check_megatron(plan_file[0], export(plan_file[0], "megatron").text)


@frameworks
@pytest.mark.parametrize("model", ["deepseek-v3", "kimi-k2", "llama4-maverick", "qwen3-30b-a3b",
                                   "mixtral-8x7b", "gpt-oss-120b"])
def test_megatron_core_takes_each_catalog_routers_flags(model):
    """Megatron-Core's TransformerConfig accepts the router the export gives (Llama 4's top-1 had
    been refused: a top-1 softmax router needs --moe-router-pre-softmax; it is a sigmoid one) and
    holds the model's router."""
    pytest.importorskip("megatron.core")
    sc = scenario_from_names(model, "dgx-h100-ndr", 64, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=64, ep=8, etp=1, zero=1, mbs=1, recompute=(F,))
    text = exported(sc, par, "megatron").text
    cfg = megatron_transformer_config(text)
    moe = sc.model.moe
    assert cfg.moe_router_score_function == moe.router_score
    assert cfg.moe_router_enable_expert_bias == moe.router_expert_bias
    assert (cfg.moe_router_num_groups or 1, cfg.moe_router_group_topk or 1) == (
        moe.router_groups, moe.router_group_top_k)
    assert (cfg.moe_router_topk_scaling_factor or 1.0) == pytest.approx(moe.router_scale)
    # the config's balancing loss (a user trial's Qwen3-MoE export had trained without one)
    assert cfg.moe_aux_loss_coeff == pytest.approx(moe.aux_loss)
    assert cfg.moe_router_load_balancing_type == (
        "none" if not moe.aux_loss else "seq_aux_loss" if moe.aux_loss_per_sequence
        else "aux_loss")
    # the fused permutation the cost model charges one memory pass for (a user trial: the
    # export had left Megatron-Core's unfused default)
    assert cfg.moe_permute_fusion
    # fp32 routing from 32 experts, without which TransformerConfig warns (an MoE user's trial)
    assert cfg.moe_router_dtype == ("fp32" if moe.experts >= 32 else None)


@frameworks
def test_megatron_core_builds_deepseek_v2_lite_from_the_export(tmp_path):
    """DeepSeek-V2-Lite's config (values of deepseek-ai/DeepSeek-V2-Lite's config.json: MLA without
    a query low-rank, 64 experts top-6 over a softmax, two shared experts of 1,408, one dense
    first layer) exports arguments from which Megatron-Core's own MLATransformerConfig builds the
    model as DeepseekV2 runs it: the softmax before the top-k, greedy over every expert, the
    shared experts as one MLP of their summed width, the per-sequence balancing loss."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("megatron.core")
    cfg = transformers.DeepseekV2Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
        n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1,
        q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, topk_method="greedy", n_group=1, topk_group=1,
        routed_scaling_factor=1.0, aux_loss_alpha=0.001, seq_aux=True,
        max_position_embeddings=163840, rope_theta=10000.0).to_dict()
    cfg.pop("dtype", None)
    path = tmp_path / "deepseek-v2-lite.json"
    path.write_text(json.dumps(cfg))
    sc = scenario_from_names(str(path), "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=16, ep=8, etp=1, zero=1, mbs=1, recompute=(F,))
    cfg = megatron_transformer_config(exported(sc, par, "megatron").text)
    assert cfg.multi_latent_attention and cfg.q_lora_rank is None and cfg.kv_lora_rank == 512
    assert (cfg.qk_head_dim, cfg.qk_pos_emb_head_dim, cfg.v_head_dim) == (128, 64, 128)
    assert (cfg.num_moe_experts, cfg.moe_router_topk, cfg.moe_ffn_hidden_size) == (64, 6, 1408)
    assert cfg.moe_router_score_function == "softmax" and cfg.moe_router_pre_softmax
    assert (cfg.moe_router_num_groups or 1, cfg.moe_router_group_topk or 1) == (1, 1)
    assert not cfg.moe_router_enable_expert_bias
    assert cfg.moe_shared_expert_intermediate_size == 2 * 1408
    assert cfg.moe_router_load_balancing_type == "seq_aux_loss"
    assert cfg.moe_aux_loss_coeff == pytest.approx(0.001)
    assert cfg.moe_layer_freq == [0] + [1] * 26 and cfg.ffn_hidden_size == 10944


@frameworks
def test_torchtitan_parses_the_arguments(plan_file):
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")  # torchtitan's model registry imports it
    check_torchtitan(plan_file[0], export(plan_file[0], "torchtitan").text)


@frameworks
def test_torchtitan_takes_a_users_flags_where_the_export_says():
    """The header's advice holds for torchtitan's own parser: a flag of the user's before the
    file's arguments is read, one after the trailing subcommand is not (a user trial's)."""
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    from torchtitan.config.manager import ConfigManager

    sc, par = plans()[1]
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    text = export(pf, "torchtitan").text
    args = _torchtitan_args(text)
    assert args[-1].startswith("activation-checkpoint:")
    assert f"# the last line, {args[-1]}, is a subcommand: any flags of your own go before" in text
    assert ConfigManager().parse_args(["--training.steps", "7", *args]).training.steps == 7
    with pytest.raises(SystemExit):
        ConfigManager().parse_args([*args, "--training.steps", "7"])


@frameworks
@pytest.mark.parametrize("pp", [2, 4, 8])
def test_deepspeed_partitions_the_blocks_as_the_export_says(pp):
    """The pipeline note names the partition_method that gives the plan's even split: DeepSpeed's
    own partitioner over the block layers alone ('type:...', the embedding, final norm and head
    weighing nothing) puts 32 // pp blocks on every stage; 'uniform', which the note had named,
    counts all 35 layer specs of Llama 3 8B (17/15 at pp 2: a user trial's)."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.utils import partition_balanced, partition_uniform

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8 * pp, seq_len=4096, global_batch=256,
                             stack="deepspeed")
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
        tp=1, pp=pp, dp=8, zero=1, mbs=1, recompute=("full",)))))
    out = export(pf, "deepspeed")
    [note] = [n for n in out.notes if n.startswith("pipeline: PipelineModule")]
    assert "partition_method='type:<the block class>'" in note and "giving this even split" in note
    layers = [0] + [1] * 32 + [0, 0]  # embedding, the blocks, final norm, head
    parts = partition_balanced(weights=layers, num_parts=pp)
    per_stage = [sum(layers[a:b]) for a, b in zip(parts, parts[1:])]
    assert per_stage == list(blocks_per_chunk(sc.model, out.plan)) == [32 // pp] * pp
    even = partition_uniform(num_items=len(layers), num_parts=pp)
    assert [sum(layers[a:b]) for a, b in zip(even, even[1:])] != per_stage
    assert json.loads(out.text)["zero_optimization"]["reduce_bucket_size"] == 40_000_000


def test_a_deepspeed_fp8_export_counts_the_weights_te_keeps_per_micro_batch():
    """Transformer Engine saves each linear layer's fp8 weight for the backward, made anew every
    forward unless the model passes is_first_microbatch: the fp8 note gives what a micro-batch
    holds of them on the busiest stage (row- and column-wise: two bytes per block weight), which
    the deepspeed stack's memory does not count (a user trial's question)."""

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64,
                             stack="deepspeed", precision=Precision.FP8)
    par = Parallelism(tp=1, pp=2, dp=8, zero=1, mbs=1, recompute=("full",))
    out = export(planfile.from_dict(planfile.to_dict(evaluate(sc, par))), "deepspeed")
    [note] = [n for n in out.notes if n.startswith("fp8 matmuls")]
    # 16 of Llama 3 8B's blocks a stage: their attention and MLP weights, 218 M
    block = 2 * 4096 * (4096 + 1024) + 3 * 4096 * 14336
    assert f"about {2 * 16 * block / GiB:.1f} GiB a micro-batch on the busiest stage, up to 2" \
        in note
    # an MoE model's blocks without their experts (AutoEP's are no Transformer Engine modules),
    # whatever the expert parallelism (a reviewer's: a dense block's width had been taken)
    mix = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256,
                              stack="deepspeed", precision=Precision.FP8)
    figures = set()
    for ep in (1, 8):
        plan = Parallelism(tp=1, pp=2, dp=32, ep=ep, etp=1, zero=1, mbs=1, recompute=("full",))
        mixed = export(planfile.from_dict(planfile.to_dict(evaluate(mix, plan))), "deepspeed")
        [note] = [n for n in mixed.notes if n.startswith("fp8 matmuls")]
        figures.add(note.split("about ")[1].split(" GiB")[0])
    attention = 2 * 4096 * (4096 + 1024) + 4096 * 8  # (and the router)
    assert figures == {f"{2 * 16 * attention / GiB:.1f}"}


@frameworks
def test_torchtitan_export_launches_what_torchtitan_runs_of_a_stack_file(tmp_path):
    """A torchtitan stack file may cost what torchtitan 0.3 does not launch: DeepEP's dispatcher
    (a model-spec setting; the registry's Qwen3 runs the all-to-all), the expert exchange
    overlapped, a CUDA graph of the step with EP. The export had said nothing of them; its
    predictions are now of the run as launched, with a note giving both steps."""
    stack = tmp_path / "tt-flex.toml"
    stack.write_text('base = "torchtitan"\nname = "tt-flex"\nmoe_dispatcher = "flex"\n'
                     'moe_overlap = "batch"\ncuda_graphs = "full_iteration"\n'
                     '[recompute]\nnone = "none"\nselective = "matmul-outputs"\n')
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256,
                             stack=str(stack))
    par = Parallelism(tp=1, pp=1, dp=64, ep=8, etp=1, zero=3, mbs=1, recompute=("selective",))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    out = export(pf, "torchtitan")
    [note] = [n for n in out.notes if n.startswith("stack tt-flex asks for")]
    for words in ("CUDA graph", "flex dispatcher", "moe_overlap = batch"):
        assert words in note, note
    ran = evaluate(replace(sc, stack=replace(sc.stack, moe_dispatcher="alltoall", moe_overlap="none",
                                             cuda_graphs="none")), par)
    assert f"step {ran.step_time:.3f} s," in out.text
    assert f"{evaluate(sc, par).step_time:.3f} s as the stack costs it" in note
    assert ran.step_time != evaluate(sc, par).step_time
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    check_torchtitan(pf, out.text)
    from torchtitan.config.manager import ConfigManager

    assert ConfigManager().parse_args(_torchtitan_args(out.text)).training.disable_cuda_graphs
    # a graphed step alone, which costs nothing where the stack waits on no host: said so, not
    # "as the stack costs it" beside the same figure (a reviewer's)
    stack.write_text('base = "torchtitan"\nname = "tt-graphs"\ncuda_graphs = "full_iteration"\n'
                     'moe_layer_host_ms = 0\n')
    sc = replace(sc, stack=get_stack(str(stack)))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    [note] = [n for n in export(pf, "torchtitan").notes if n.startswith("stack tt-graphs")]
    assert note.endswith("not launched, which changes no prediction here"), note


@frameworks
@pytest.mark.parametrize("graphs", ["none", "full_iteration"])
def test_torchtitan_graphs_the_step_only_where_the_stack_costs_it(graphs, tmp_path):
    """torchtitan 0.3 captures each step's forward and backward in a CUDA graph unless told not
    to (``training.disable_cuda_graphs`` false by default; its llama3_8b keeps it): the export
    had left a plan without PP or EP to that default, a run its stack's costs (eager) do not
    describe. Now said either way, as the stack costs it."""
    stack = tmp_path / "tt-graphs.toml"
    stack.write_text(f'base = "torchtitan"\nname = "tt-{graphs}"\ncuda_graphs = "{graphs}"\n')
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=32,
                             stack=str(stack))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
        tp=1, pp=1, dp=8, zero=3, mbs=1, recompute=("selective",)))))
    out = export(pf, "torchtitan")
    assert not any("CUDA graph" in n for n in out.notes), out.notes
    # the flag is said why where it is set (a torchtitan trial found it with no word)
    said = [n for n in out.notes if n.startswith("--training.disable_cuda_graphs: stack tt-none "
                                                 "costs an eager step")]
    assert len(said) == (graphs == "none") and all(f"# note: {n}" in out.text for n in said)
    if graphs == "none":  # not where torchtitan graphs nothing anyway, a pipeline (a review's)
        piped = export(planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
            tp=1, pp=2, dp=4, zero=2, mbs=1, recompute=("selective",))))), "torchtitan")
        assert not any(n.startswith("--training.disable_cuda_graphs") for n in piped.notes)
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    from torchtitan.config.manager import ConfigManager

    cfg = ConfigManager().parse_args(_torchtitan_args(out.text))
    assert cfg.training.disable_cuda_graphs is (graphs == "none")


@frameworks
def test_torchtitan_runs_gpt_oss_with_its_own_definition():
    """torchtitan 0.3 defines GPT-OSS-120B (``--module gpt_oss --config gpt_oss_120b``): the
    export names it, and its ConfigManager takes the arguments with the plan's degrees."""
    sc = scenario_from_names("gpt-oss-120b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256,
                             stack="torchtitan")
    pf = planfile.from_dict(planfile.to_dict(evaluate(
        sc, Parallelism(tp=1, pp=4, dp=16, ep=8, etp=1, zero=3, mbs=1, recompute=("full",)))))
    text = export(pf, "torchtitan").text
    assert "--module gpt_oss" in text and "--config gpt_oss_120b" in text
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    check_torchtitan(pf, text)


@frameworks
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", str(SHARED / "data" / "hf_configs" /
                                                       "llama3-8b.json")])
def test_torchtitan_names_its_own_definition_of_a_model_however_given(model):
    """torchtitan 0.3 defines Qwen3-30B-A3B (``--module qwen3 --config qwen3_30b_a3b``; the
    export had said it defines none); a model read from a HuggingFace config that equals a
    catalog model torchtitan defines (Llama 3 8B) exports with that definition, not
    placeholders. torchtitan's ConfigManager takes the arguments."""
    sc = scenario_from_names(model, "dgx-h100-ndr", 64, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    moe = sc.model.moe is not None
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
        tp=1, pp=1, dp=64, ep=8 if moe else 1, etp=1 if moe else None, zero=3, mbs=1,
        recompute=("full",)))))
    out = export(pf, "torchtitan")
    assert not any("MODULE and CONFIG" in n for n in out.notes), out.notes
    assert ("--module qwen3" in out.text and "--config qwen3_30b_a3b" in out.text) if moe else (
        "--module llama3" in out.text and "--config llama3_8b" in out.text)
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    check_torchtitan(pf, out.text)


@frameworks
def test_megatrons_pp_dp_mapping_gives_the_plans_groups():
    """Exports launched with --use-tp-pp-dp-mapping: Megatron's own rank generators in that
    order give the plan's attention and expert groups on the devices as numbered, for a dense
    plan and a pipelined MoE plan whose expert TP x EP is TP x CP."""
    pytest.importorskip("megatron.core")
    order = (Axis.TP, Axis.CP, Axis.PP, Axis.DP)
    llama = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
    mix = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=128)
    for sc, par in ((llama, Parallelism(tp=2, pp=4, dp=2, cp=4, sp=True, zero=1, mbs=1,
                                        rank_order=order)),
                    (mix, Parallelism(tp=2, pp=2, dp=16, ep=2, etp=1, sp=True, zero=1, mbs=1,
                                      rank_order=order))):
        pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par), method="manual"))
        text = export(pf, "megatron").text
        assert "--use-tp-pp-dp-mapping" in text
        check_megatron(pf, text)


@frameworks
def test_float8_configs_are_the_registry_functions_that_build_a_float8_converter():
    """``FLOAT8_CONFIGS`` is kept by hand: read torchtitan's own config_registry source (the
    installed wheel's; building the configs needs torchao) and find which of the functions the
    export names, and of their ``_float8`` siblings that fp8 plans export, construct a Float8
    converter (by a name beginning Float8 in its own body: one that delegated to another
    function, or took an MX converter, would pass unseen)."""
    import ast
    import importlib.util

    from nestplan.exports.torchtitan import FLOAT8_CONFIGS, REGISTRY

    pytest.importorskip("torchtitan.models")
    found = set()
    for module, config in set(REGISTRY.values()):
        spec = importlib.util.find_spec(f"torchtitan.models.{module}.config_registry")
        tree = ast.parse(Path(spec.origin).read_text())
        fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for name in (config, f"{config}_float8"):
            names = {n.id for n in ast.walk(fns[name]) if isinstance(n, ast.Name)} \
                if name in fns else set()
            if any(n.startswith("Float8") for n in names):
                found.add(name)
    assert found == FLOAT8_CONFIGS


def test_an_fp8_plan_exports_a_config_that_trains_in_fp8():
    """An fp8 plan exports a registry config with a Float8 converter: DeepSeek-V3's
    ``_float8`` sibling, llama3_405b itself, and for Llama 3 70B a ``llama3_70b_float8`` that a
    note asks the user to write (a user trial's fp8 plan had exported ``llama3_70b``, which
    starts and trains in bf16)."""
    def text(model, gpus, par):
        sc = scenario_from_names(model, "dgx-h100-ndr", gpus, seq_len=4096, global_batch=512,
                                 precision=Precision.FP8, stack="torchtitan-float8",
                                 mtp_layers=0)  # (torchtitan pipelines no MTP depth)
        pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par), method="manual"))
        return export(pf, "torchtitan").text

    out = text("llama3-70b", 64, Parallelism(tp=8, pp=1, dp=8, sp=True, zero=3, mbs=1,
                                             recompute=("full",)))
    assert "--config llama3_70b_float8" in out and "has no llama3_70b_float8; write it" in out
    out = text("llama3-405b", 512, Parallelism(tp=8, pp=8, dp=8, sp=True, zero=2, mbs=1,
                                               recompute=("full",)))
    assert "--config llama3_405b\n" in out and "_float8; write it" not in out
    out = text("deepseek-v3", 512, Parallelism(tp=1, pp=8, dp=64, ep=64, zero=2, mbs=1,
                                               recompute=("full",)))
    assert "--config deepseek_v3_671b_float8" in out and "write it" not in out
    # the converters it asks for are those of what nestplan costs in fp8: an MoE model's grouped
    # experts too, its head and router not (a torchtitan MoE trial's note had named the linear
    # converter alone, which leaves the experts in bf16)
    assert 'Float8LinearConverter.Config(filter_fqns=["lm_head"]) (as llama3_405b has;' in \
        text("llama3-70b", 64, Parallelism(tp=8, pp=1, dp=8, sp=True, zero=3, mbs=1,
                                           recompute=("full",)))
    out = text("qwen3-30b-a3b", 64, Parallelism(tp=1, pp=1, dp=64, ep=8, zero=3, mbs=1,
                                                recompute=("full",)))
    assert ("has no qwen3_30b_a3b_float8; write it, a copy of config_registry.qwen3_30b_a3b with "
            'Float8LinearConverter.Config(filter_fqns=["lm_head", "router.gate"]) and '
            "Float8GroupedExpertsConverter.Config()") in out.replace("\n# ", " "), out


@frameworks
def test_the_float8_converters_asked_for_are_torchtitans_own():
    """What the export asks an fp8 config to hold (``float8_converters``) is what torchtitan 0.3's
    own configs build: llama3_405b's linear converter without the head, deepseek_v3_671b_float8's
    linear converter without the head and router plus its grouped-experts converter (read from
    the installed wheel's config_registry source)."""
    import ast
    import importlib.util

    from nestplan.exports.torchtitan import float8_converters

    pytest.importorskip("torchtitan.models")

    def built(module, fn):
        spec = importlib.util.find_spec(f"torchtitan.models.{module}.config_registry")
        tree = ast.parse(Path(spec.origin).read_text())
        body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        calls = {}
        for n in ast.walk(body):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id.startswith("Float8"):
                # every literal argument but model_compile_enabled (the config's own compile,
                # which a config function of the user's sets from its compile options)
                calls[n.func.value.id] = {k.arg: ast.literal_eval(k.value) for k in n.keywords
                                          if k.arg != "model_compile_enabled"}
        return calls

    for moe, (module, fn) in ((False, ("llama3", "llama3_405b")),
                              (True, ("deepseek_v3", "deepseek_v3_671b_float8"))):
        said = float8_converters(moe)
        calls = built(module, fn)
        assert calls and f"(as {fn} has; model_compile_enabled as the config" in said
        assert set(re.findall(r"(Float8\w+)\.Config\(", said)) == set(calls), said
        for name, kw in calls.items():
            args = ", ".join(f"{k}={json.dumps(v)}" for k, v in kw.items())
            assert f"{name}.Config({args})" in said, (name, said)


@frameworks
def test_max_seq_len_is_what_torchtitans_definitions_allow():
    """``MAX_SEQ_LEN`` is kept by hand: each REGISTRY config's model_registry flavour (read from
    the config function's source) builds a model whose RoPE allows that many tokens."""
    import ast
    import importlib

    from nestplan.exports.torchtitan import MAX_SEQ_LEN, REGISTRY

    pytest.importorskip("torchtitan.models")
    for module, config in set(REGISTRY.values()):
        spec = importlib.util.find_spec(f"torchtitan.models.{module}.config_registry")
        tree = ast.parse(Path(spec.origin).read_text())
        fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == config)
        (flavour,) = {c.args[0].value for c in ast.walk(fn) if isinstance(c, ast.Call)
                      and getattr(c.func, "id", None) == "model_registry"}
        models = importlib.import_module(f"torchtitan.models.{module}")
        assert models.model_registry(flavour).model.max_seq_len == MAX_SEQ_LEN[config], config


def test_a_sequence_beyond_torchtitans_rope_says_the_run_would_not_start(tmp_path):
    """torchtitan refuses a sequence longer than its definition's RoPE allows (a user trial's
    DeepSeek-V3 at 32K tokens exported without a word; 16K is its definition's most)."""
    sc = scenario_from_names("deepseek-v3", "gb200-nvl72-ndr", 512, seq_len=32768,
                             global_batch=256, stack="torchtitan", mtp_layers=0)
    par = Parallelism(tp=1, pp=4, dp=32, cp=4, ep=64, zero=3, mbs=1, recompute=("full",))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par), method="manual"))
    text = export(pf, "torchtitan").text
    assert "deepseek_v3_671b trains sequences of at most 16,384 tokens" in text
    short = scenario_from_names("deepseek-v3", "gb200-nvl72-ndr", 512, seq_len=16384,
                                global_batch=256, stack="torchtitan", mtp_layers=0)
    pf = planfile.from_dict(planfile.to_dict(evaluate(short, par), method="manual"))
    assert "at most" not in export(pf, "torchtitan").text


def test_exports_say_what_the_framework_will_log_at_long_sequences():
    """Megatron-LM logs model FLOP with the attention core at half (a user trial: at 128K tokens
    0.64 of what MFU counts); its export gives that figure, not where it is the same (a
    bidirectional model), nor torchtitan's, which counts as MFU does."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 512, seq_len=131072, global_batch=64)
    ev = evaluate(sc, Parallelism(tp=8, pp=4, cp=16, sp=True, zero=1, recompute=("full",)))
    pf = planfile.from_dict(planfile.to_dict(ev, method="manual"))
    assert f"Megatron-LM logs about {ev.logged_tflops_per_gpu:.0f} TFLOP/s per GPU" in \
        export(pf, "megatron").text
    # torchtitan counts attention unmasked, as MFU does (a review: the export had said otherwise)
    assert "logs about" not in export(pf, "torchtitan").text
    assert ev.logged_tflops_per_gpu < 0.65 * ev.model_tflops_per_gpu
    bert = scenario_from_names("bert-large", "dgx-h100-ndr", 8, seq_len=512, global_batch=64)
    pf = planfile.from_dict(planfile.to_dict(evaluate(bert, Parallelism(dp=8)), method="manual"))
    assert "logs about" not in export(pf, "megatron").text
    # packed documents: torchtitan still counts attention over all of seq_len (a long-context
    # trial: three times what its masks run at 8K-token documents in 128K)
    span = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=131072, global_batch=64,
                               attention_span=8192, stack="torchtitan-0.3-compile")
    ev = evaluate(span, Parallelism(tp=1, pp=1, dp=8, cp=32, zero=3, recompute=("full",)))
    pf = planfile.from_dict(planfile.to_dict(ev, method="manual"))
    text = export(pf, "torchtitan").text
    assert f"torchtitan logs about {ev.logged_tflops_per_gpu:.0f} TFLOP/s per GPU" in text
    assert "its document masks aside (get_dense_model_nparams_and_flops" in text


def test_the_logged_flop_note_gives_only_the_reasons_that_apply():
    """The note on Megatron-LM's count names what applies to the model: a user trial's GLM-4.5
    (SwiGLU) was told its count takes a GeLU-gated MLP as ungated; GPT-OSS's clamped GLU and its
    sliding windows are named."""
    from nestplan.evaluate import logged_flops_differences

    llama = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
    assert logged_flops_differences(llama.model, None) == [
        "the attention core at half for the causal mask"]
    assert len(logged_flops_differences(llama.model, 2048)) == 2  # packed documents too
    oss = scenario_from_names("gpt-oss-120b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64)
    said = logged_flops_differences(oss.model, None)
    assert len(said) == 3 and "windows" in said[0] and "--quick-geglu" in said[2]
    ev = evaluate(llama, Parallelism(tp=8, pp=2, dp=4, sp=True, zero=1, recompute=("full",)))
    pf = planfile.from_dict(planfile.to_dict(ev, method="manual"))
    text = export(pf, "megatron").text
    assert "its count takes the attention core at half for the causal mask (" in text
    assert "GeLU" not in text


def test_torchtitans_llama3_definitions_scale_rope_as_llama_31():
    """Every torchtitan 0.3 Llama 3 definition scales RoPE as Llama 3.1 does (a reviewer found
    it): a Llama 3.1 model (as its HuggingFace config gives it) exports with the definition and
    no note; a Llama 3.0 one (the catalog's 8B and 70B) with a note that the run trains with
    torchtitan's scaling; a model torchtitan does not define gets the placeholders."""
    from nestplan.catalog import get_model
    from nestplan.exports.torchtitan import LLAMA31_ROPE, PLACEHOLDER, registry_entry

    llama3 = get_model("llama3-8b")
    assert registry_entry(replace(llama3, name="mine", rope_scaling=LLAMA31_ROPE)) == (
        "llama3", "llama3_8b", None)
    module, config, note = registry_entry(llama3)
    assert (module, config) == ("llama3", "llama3_8b") and note == (
        "the model's RoPE scaling (none) is not that of torchtitan's llama3_8b (llama3, factor 8): "
        "the launched run scales RoPE as torchtitan's definition does")
    assert registry_entry(get_model("qwen3-30b-a3b")) == ("qwen3", "qwen3_30b_a3b", None)
    assert registry_entry(get_model("gpt3-175b"))[:2] == PLACEHOLDER
    # a model file that keeps a catalog name but changes the model is not torchtitan's (a fuzzer's
    # 16-layer "llama3-8b" had exported as the 32-layer definition)
    assert registry_entry(replace(llama3, layers=16))[:2] == PLACEHOLDER
    # MTP depths set by --mtp-layers are the definition's still (their note is another): DeepSeek-V3
    # without them had exported with placeholders (a seventh fuzzing round's)
    for depths in (0, 2):
        assert registry_entry(replace(get_model("deepseek-v3"), mtp_layers=depths))[:2] == (
            "deepseek_v3", "deepseek_v3_671b")


def test_torchtitan_export_says_torchs_1f1b_refuses_fewer_micro_batches_than_stages():
    """torch's Schedule1F1B raises on fewer micro-batches than stages (a user trial's 2 for 8
    exported without a word and would have failed at launch). The torchtitan stacks refuse such
    a plan (``StackSpec.schedules_min_pp_micro``); one of Megatron-Core's, which runs it, exports
    to torchtitan as GPipe with a note; with enough micro-batches there is none."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 128, seq_len=4096, global_batch=32,
                             stack="megatron-core")
    par = Parallelism(tp=1, pp=8, dp=16, zero=2, mbs=1, recompute=("full",))
    out = exported(sc, par, "torchtitan")
    assert any("refuses 2 micro-batches per replica for 8 stages (fewer than stages); exported "
               "with GPipe" in n for n in out.notes)
    assert "--parallelism.pipeline_parallel_schedule GPipe" in out.text
    more = replace(sc, training=replace(sc.training, global_batch=128))
    notes = exported(more, par, "torchtitan").notes
    assert not any("refuses" in n for n in notes)


def test_mla_gets_no_rope_scaling_flags_its_rope_ignores():
    """Megatron-Core's MLA builds its own RoPE, scaled by YaRN only: a linear or Llama 3.1
    scaling on an MLA model is not exported as flags the run would ignore; a note says so."""
    sc = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64)
    m = replace(sc.model, yarn=None, rope_scaling=RopeScaling(kind="linear", factor=4.0))
    out = exported(replace(sc, model=m), Parallelism(
        tp=1, pp=1, dp=64, ep=8, etp=1, zero=1, mbs=1, recompute=(F,)), "megatron")
    assert "--rotary-seq-len-interpolation-factor" not in out.text
    assert any("scales its RoPE by YaRN only" in n for n in out.notes)


@frameworks
def test_deepspeed_accepts_config(plan_file, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed.runtime.config")
    check_deepspeed(plan_file[0], export(plan_file[0], "deepspeed").text, monkeypatch)


PAPER_PLANS = Path(__file__).parent.parent / "benchmarks" / "paper_plans.json"


@frameworks
@pytest.mark.parametrize("part", [0, 1])  # two halves: shorter units in the frameworks worker
def test_every_paper_scenario_plan_exports_and_parses(monkeypatch, part):
    """Every method's plan of every NEST-paper scenario (written by
    benchmarks/paper_scenarios.py) exports to all three formats, which the frameworks accept."""
    for mod in ("megatron.core", "torchtitan.config.manager", "triton",
                "deepspeed.runtime.config"):
        pytest.importorskip(mod)
    rows = json.loads(PAPER_PLANS.read_text())
    assert len(rows) >= 40
    shapes = set()  # Megatron's rank generator is slow: check each distinct mesh once
    # torchtitan's parser too (0.2 s a call): each distinct argument list up to its numbers and
    # stage FQNs (a few dozen of the 194 plans), which covers every flag and value kind the exports write
    parsed = set()
    for row in rows[part::2]:
        sc = scenario_from_names(row["model"], row["cluster"], row["gpus"],
                                 seq_len=row["seq_len"], global_batch=row["global_batch"])
        ev = evaluate(sc, planfile.plan_from_dict(row["plan"]))
        pf = planfile.from_dict(planfile.to_dict(ev, method="manual"))
        text = {fmt: export(pf, fmt).text for fmt in ("megatron", "torchtitan", "deepspeed")}
        assert all(t.strip() for t in text.values())
        par = pf.plan
        shape = (par.tp, par.pp, par.dp, par.cp, par.rank_order)
        check_megatron(pf, text["megatron"], ranks=shape not in shapes)
        shapes.add(shape)
        key = tuple(re.sub(r"\d+", "#", line) for line in text["torchtitan"].splitlines()
                    if not line.startswith("#") and "module_fqns" not in line)
        if key not in parsed:
            check_torchtitan(pf, text["torchtitan"])
            parsed.add(key)
        check_deepspeed(pf, text["deepspeed"], monkeypatch)


def _titan_worker(rank, world, store_dir, args, out_dir):
    """One torchtitan rank: parse the exported arguments and build torchtitan's device mesh."""
    import torch.distributed as dist
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed import parallel_dims

    parallel_dims.device_type = "cpu"  # torchtitan assumes CUDA when it finds no accelerator
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=world)
    cfg = ConfigManager().parse_args(args)
    dims = parallel_dims.ParallelDims.from_config(cfg.parallelism, world)
    dims.build_mesh()
    groups = {}
    for name in ("tp", "cp", "pp", "dp_replicate", "dp_shard", "ep", "efsdp"):
        mesh = dims.get_optional_mesh(name)
        if mesh is not None and mesh.size() > 1:
            groups[name] = dist.get_process_group_ranks(mesh.get_group())
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(groups, f)
    dist.barrier()
    dist.destroy_process_group()


GLOO_PLANS = {
    # a rank order torchtitan does not use: launched through the rank map
    "dense-reordered": ("llama3-8b", Parallelism(tp=2, pp=2, dp=2, sp=True, zero=1, mbs=1,
                                                 rank_order=(Axis.TP, Axis.PP, Axis.DP, Axis.CP))),
    # experts: EP over dp_shard·tp, as nestplan's expert mesh
    "moe": ("mixtral-8x7b", Parallelism(tp=2, pp=1, dp=4, ep=4, etp=1, sp=True, zero=2, mbs=1)),
}


@frameworks
@pytest.mark.parametrize("name", list(GLOO_PLANS))
def test_gloo_mesh_puts_every_rank_in_the_plans_groups(tmp_path, name):
    """8 processes build torchtitan's own device mesh from the exported arguments; through the
    rank map, every rank's TP, DP, PP (and EP) group holds the devices the plan says."""
    mp = pytest.importorskip("torch.multiprocessing")
    pytest.importorskip("torchtitan.config.manager")
    pytest.importorskip("triton")
    model, par = GLOO_PLANS[name]
    sc = scenario_from_names(model, "dgx-h100-ndr", 8, seq_len=4096, global_batch=16)
    path = tmp_path / "plan.json"
    planfile.save(evaluate(sc, par), path)
    out = tmp_path / "tt.args"
    assert main(["export", str(path), "--format", "torchtitan", "-o", str(out)]) == 0
    args = _torchtitan_args(out.read_text())
    (tmp_path / "store").mkdir()
    (tmp_path / "out").mkdir()
    mp.start_processes(_titan_worker, args=(8, tmp_path / "store", args, tmp_path / "out"),
                       nprocs=8, join=True, start_method="fork")
    device_of = _rank_devices(par)
    if par.rank_order != (Axis.TP, Axis.CP, Axis.DP, Axis.PP):
        assert _parse_rank_map((tmp_path / "tt.args.ranks.csv").read_text()) == device_of
    grid = rank_grid(par)  # [pp, dp, cp, tp] -> device
    egrid = expert_grid(grid, par)  # [pp, edp, ep, etp]
    dp_name = "dp_replicate" if par.zero == 0 else "dp_shard"
    for rank in range(8):
        got = json.loads((tmp_path / "out" / f"{rank}.json").read_text())
        mine = device_of[rank]
        p, d, c, t = (int(i[0]) for i in (grid == mine).nonzero())
        want = {"tp": grid[p, d, c, :], dp_name: grid[p, :, c, t], "pp": grid[:, d, c, t]}
        if par.ep > 1:
            q, e_dp, e, e_tp = (int(i[0]) for i in (egrid == mine).nonzero())
            want["ep"] = egrid[q, e_dp, :, e_tp]
        want = {k: sorted(int(x) for x in v) for k, v in want.items() if len(v) > 1}
        assert {k: sorted(device_of[r] for r in v) for k, v in got.items()
                if k in want} == want
        assert set(want) <= set(got)


RECOMPUTE_CASES = [
    ("mixtral-8x7b", 64, dict(ep=8, etp=1), False, "layernorm moe_act"),
    # a dense model without MLA has no norm module under Transformer Engine's spec (its norms run
    # inside the next linear: norm_in_linear), so nothing to recompute
    ("llama3-8b", 16, {}, False, ""),
    ("llama3-8b", 16, {}, True, ""),
    ("deepseek-v3", 256, dict(ep=8, etp=1), True, "layernorm mla_up_proj moe_act"),
]
"""(model, gpus, expert degrees, fp8, the modules exported) of a fine-grained plan."""


def _fine_grained_export(model, gpus, moe, fp8) -> str:
    sc = scenario_from_names(model, "dgx-h100-ndr", gpus, seq_len=4096, global_batch=256,
                             precision=Precision.FP8 if fp8 else Precision.BF16)
    pp = 16 if model == "deepseek-v3" else 2
    par = Parallelism(tp=2 if not moe else 1, pp=pp, dp=gpus // pp // (2 if not moe else 1),
                      sp=not moe, zero=1, mbs=1, recompute=("fine-grained",), **moe)
    return exported(sc, par, "megatron").text


@pytest.mark.parametrize("model, gpus, moe, fp8, modules", RECOMPUTE_CASES)
def test_megatron_export_names_the_recompute_modules_the_model_has(model, gpus, moe, fp8,
                                                                   modules):
    """megatron-core's fine-grained policy (layernorm, mla_up_proj, moe_act) exports only the
    modules the model has (Megatron-Core refuses moe_act without grouped experts and mla_up_proj
    without MLA), and fp8 with a per-tensor recipe that runs with them (Megatron's default,
    delayed scaling, refuses layernorm and moe_act recomputation)."""
    text = _fine_grained_export(model, gpus, moe, fp8)
    assert ("--recompute-granularity selective" in text) == bool(modules)
    if modules:
        assert f"--recompute-modules {modules} \\" in text
    else:
        assert "--recompute-" not in text
    assert ("--fp8-recipe tensorwise" in text) == fp8


@frameworks
def test_megatron_accepts_the_recompute_modules_it_is_given():
    """The exports of the test above, in Megatron-Core's own TransformerConfig."""
    pytest.importorskip("megatron.core")
    for model, gpus, moe, fp8, modules in RECOMPUTE_CASES:
        cfg = megatron_transformer_config(_fine_grained_export(model, gpus, moe, fp8))
        if modules:
            assert cfg.recompute_modules == modules.split(), model
        else:
            assert cfg.recompute_granularity is None, model


@pytest.mark.parametrize("model, rule, moe", [
    ("llama3-8b", "modules:moe_act", {}),
    # Mixtral's blocks are all MoE: no dense MLP, though nestplan builds a dense block's graph
    ("mixtral-8x7b", "modules:mlp", dict(ep=8, etp=1)),
])
def test_a_policy_of_modules_the_model_lacks_exports_no_recomputation(model, rule, moe):
    from nestplan.recompute import Policy

    base = get_stack("megatron-core")
    stack = replace(base, name="mine", recompute=base.recompute + (Policy("act", rule),))
    sc = replace(scenario_from_names(model, "dgx-h100-ndr", 8, seq_len=4096,
                                     global_batch=64), stack=stack)
    par = Parallelism(tp=1, pp=1, dp=8, zero=1, mbs=1, recompute=("act",), **moe)
    exp = exported(sc, par, "megatron")
    assert "--recompute" not in exp.text
    assert any("recomputes nothing in this model" in n for n in exp.notes)


def test_one_policy_for_every_stage_is_the_one_that_keeps_least():
    """Frameworks take one recompute policy; the export uses the plan's policy that keeps the
    fewest bytes of this model's blocks (not a fixed order of rule kinds)."""
    from nestplan.recompute import Policy

    base = get_stack("megatron-core")
    stack = replace(base, name="mine", recompute=(Policy("none", "none"),
                                                  Policy("every", "every:3"),
                                                  Policy("mlp", "modules:mlp,moe")))
    sc = replace(scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096,
                                     global_batch=384), stack=stack)
    par = Parallelism(tp=2, pp=2, dp=16, ep=8, etp=1, sp=True, zero=1, mbs=3,
                      recompute=("mlp", "every"))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    policy, notes = uniform_policy(pf)
    assert policy.name == "mlp" and "keeps the least" in notes[0]


@pytest.mark.parametrize("model, moe", [("llama3-8b", {}), ("mixtral-8x7b", dict(ep=8, etp=1))])
def test_an_order_that_differs_only_in_axes_of_size_1_needs_no_rank_map(model, moe):
    """tp-dp-cp-pp with cp = 1 places every rank, and every expert group folded over them, as
    Megatron's, torchtitan's and DeepSpeed's own order does: no note, no rank map; a real
    difference still gets both."""
    sc = scenario_from_names(model, "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    same = Parallelism(tp=2, pp=2, dp=4, sp=True, zero=1, mbs=1,
                       rank_order=(Axis.TP, Axis.DP, Axis.CP, Axis.PP), **moe)
    own = same.with_(rank_order=(Axis.TP, Axis.CP, Axis.DP, Axis.PP))
    assert np.array_equal(rank_grid(same), rank_grid(own))
    if moe:
        assert np.array_equal(expert_grid(rank_grid(same), same), expert_grid(rank_grid(own), own))
    assert evaluate(sc, same).step_time == evaluate(sc, own).step_time
    moved = same.with_(rank_order=(Axis.PP, Axis.TP, Axis.CP, Axis.DP))  # (no framework's)
    for fmt in ("megatron", "torchtitan", "deepspeed"):
        exp = exported(sc, same, fmt)
        assert ".ranks.csv" not in exp.extras and not any("rank order" in n for n in exp.notes)
        exp = exported(sc, moved, fmt)
        assert ".ranks.csv" in exp.extras and any("rank order" in n for n in exp.notes)


def test_an_export_without_a_capacity_factor_option_says_it_is_left_out(tmp_path):
    """A plan costed with dropped tokens (``--moe-capacity-factor``) exports to torchtitan with
    a note that the factor is not in the file: the run would otherwise be dropless unannounced."""
    from console import cli

    plan = tmp_path / "q.json"
    code, _, err = cli("evaluate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100-ndr",
                       "--gpus", 8, "--tp", 1, "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch",
                       8, "--seq-len", 4096, "--moe-capacity-factor", 1.25, "--stack",
                       "torchtitan", "--save", plan)
    assert code == 0, err
    code, _, err = cli("export", plan, "--format", "torchtitan", "-o", tmp_path / "q.sh")
    said = "capacity factor 1.25 (tokens over it dropped) is not exported"
    assert code == 0 and said in err
    assert f"# note: the expert {said}" in (tmp_path / "q.sh").read_text()  # in the file too
    code, _, err = cli("export", plan, "--format", "deepspeed", "-o", tmp_path / "ds.json")
    assert code == 0 and said in (tmp_path / "ds.json.notes.txt").read_text()


@frameworks
@pytest.mark.parametrize("split", [(0, 0, 0, 32), (0, 16, 16, 0)])
def test_chunks_without_blocks_export_as_a_layout_megatron_takes(split):
    """Megatron-LM's first/last-stage flags need blocks on both ends; the layout string takes
    empty chunks (as the model zoo's embedding-only first chunk)."""
    pytest.importorskip("megatron.core")
    sc = scenario_from_names("llama3-8b", "nest-h100-spineleaf", 16, seq_len=4096,
                             global_batch=256)
    par = Parallelism(tp=2, pp=4, dp=2, sp=True, zero=1, mbs=1, stage_layers=split)
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    text = export(pf, "megatron").text
    assert "--decoder-first-pipeline-num-layers" not in text
    check_megatron(pf, text, ranks=False)
    if split[1] == 0:  # an empty part in the middle: torchtitan names a part by its modules
        with pytest.raises(SpecError, match="model chunk 1 holds no blocks"):
            export(pf, "torchtitan")


def test_torchtitan_export_keeps_the_expert_tp_it_runs():
    """torchtitan shards experts over EP when there is EP and over TP when there is not: a plan
    with either exports unchanged; expert TP next to EP, or expert TP 1 under TP without EP,
    exports as torchtitan runs it, with a note."""
    from nestplan.exports.torchtitan import arguments

    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)

    def exported(ep, etp):
        par = Parallelism(tp=2, sp=True, dp=8, ep=ep, etp=etp, zero=1, mbs=1)
        _, notes, plan = arguments(planfile.from_dict(planfile.to_dict(evaluate(sc, par))))
        return plan.expert_tp, any("expert tensor parallelism" in n for n in notes)

    assert exported(1, 2) == (2, False)  # experts over TP, as the dense weights
    assert exported(8, 1) == (1, False)
    assert exported(1, 1) == (2, True)
    assert exported(4, 2) == (1, True)


def _arguments(text: str) -> str:
    """An export's arguments, without its comment lines."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("#"))


def _mixed_recompute_export(order: str = "tp-cp-dp-pp"):
    from nestplan.axes import parse_order

    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=128)
    par = Parallelism(tp=4, pp=4, dp=4, sp=True, zero=1, mbs=1, rank_order=parse_order(order),
                      recompute=("full", "fine-grained", "selective", "none"))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    return pf, export(pf, "megatron")


MEGATRON_RECOMPUTE = {
    "full": "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1",
    # Llama 3 has none of fine-grained's modules: no MLA, no grouped experts, and its norms run
    # inside the next linear layer under Transformer Engine (norm_in_linear)
    "fine-grained": "",
    "selective": "--recompute-granularity selective", "none": ""}


def _stage_flags(script: Path, rank: int | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    if rank is not None:
        env["RANK"] = str(rank)
    return subprocess.run(["bash", str(script), "echo"], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("order", ["tp-cp-dp-pp", "dp-tp-cp-pp", "tp-cp-pp-dp"])
def test_megatron_runs_each_stages_recomputation(tmp_path, order):
    """A plan whose stages recompute differently exports unchanged: Megatron-LM's flags are per
    process, and the stage script adds each pipeline stage's (stage = Megatron rank / (tp·cp·dp),
    or under --use-tp-pp-dp-mapping (rank / (tp·cp)) % pp: a user trial's script had given stage
    0's flags to ranks of other stages there; its own rank generator agrees, in the frameworks
    test below). The arguments file says so, and, with a rank map, that RANK must be the map's."""
    pf, out = _mixed_recompute_export(order)
    par = pf.plan
    assert "--recompute" not in _arguments(out.text)
    assert "# note: the stages recompute differently" in out.text
    assert not any(n.startswith("exported plan") for n in out.notes)
    assert ("rank map" in out.extras[".stages.sh"]) and (
        (".ranks.csv" in out.extras) == (order == "dp-tp-cp-pp"))
    mapped = order == "tp-cp-pp-dp"
    assert ("--use-tp-pp-dp-mapping" in out.text) == mapped
    script = tmp_path / "p.stages.sh"
    script.write_text(out.extras[".stages.sh"])
    for rank in range(pf.scenario.gpus):
        run = _stage_flags(script, rank)
        assert run.returncode == 0, run.stderr
        stage = (rank // (par.tp * par.cp)) % par.pp if mapped else rank // (
            par.tp * par.cp * par.dp)
        assert run.stdout.split() == MEGATRON_RECOMPUTE[par.recompute_of(stage)].split(), rank
    unset = _stage_flags(script, None)
    assert unset.returncode == 2 and "RANK" in unset.stderr


@frameworks
def test_megatron_takes_each_stages_recomputation(tmp_path):
    """Megatron's rank generator puts rank r in pipeline stage r / (tp·cp·dp), as the stage
    script assumes, and Megatron-Core's TransformerConfig takes the arguments with the flags the
    script gives each stage."""
    pytest.importorskip("megatron.core")
    from megatron.core import parallel_state as ps

    for order, mapped in (("tp-cp-pp-dp", "tp-cp-ep-pp-dp"),):  # --use-tp-pp-dp-mapping's
        pf, out = _mixed_recompute_export(order)
        script = tmp_path / "m.stages.sh"
        script.write_text(out.extras[".stages.sh"])
        par = pf.plan
        for group in ps.RankGenerator(tp=par.tp, ep=1, dp=par.dp, pp=par.pp, cp=par.cp,
                                      order=mapped).get_ranks("pp"):
            for stage, rank in enumerate(group):
                assert _stage_flags(script, rank).stdout.split() == MEGATRON_RECOMPUTE[
                    par.recompute_of(stage)].split(), (rank, stage)
    pf, out = _mixed_recompute_export()
    par = pf.plan
    gen = ps.RankGenerator(tp=par.tp, ep=1, dp=par.dp, pp=par.pp, cp=par.cp,
                           order="tp-cp-ep-dp-pp")
    groups = gen.get_ranks("pp")
    for group in groups:
        assert [r // (par.tp * par.cp * par.dp) for r in group] == list(range(par.pp))
    script = tmp_path / "p.stages.sh"
    script.write_text(out.extras[".stages.sh"])
    for stage, rank in enumerate(groups[0]):
        words = _stage_flags(script, rank).stdout.split()
        lines = []
        for w in words:  # "--flag value ..." lines, as the export writes them
            if w.startswith("--"):
                lines.append(w)
            else:
                lines[-1] += " " + w
        cfg = megatron_transformer_config(out.text.rstrip("\n") + "".join(
            f" \\\n{line}" for line in lines))
        policy = par.recompute_of(stage)
        assert cfg.recompute_granularity == {"full": "full", "fine-grained": None,
                                             "selective": "selective", "none": None}[policy]


def test_exports_carry_the_stacks_gradient_dtype_and_compilation():
    """What a stack's costs assume its framework does must be in the export: NeMo's bf16
    gradient reductions (Megatron-LM reduces bf16 models' gradients in fp32 unless told), and
    torchtitan's compilation (the compiled stacks' fused norms and MLPs) and async TP."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=32)
    par = Parallelism(tp=2, pp=2, dp=4, sp=True, zero=1, mbs=1)

    def text(stack, fmt, plan=par):

        ev = evaluate(replace(sc, stack=get_stack(stack)), plan)
        return export(planfile.from_dict(planfile.to_dict(ev)), fmt).text

    assert "--grad-reduce-in-bf16" in text("nemo", "megatron")
    assert "--grad-reduce-in-bf16" not in text("megatron-core", "megatron")
    titan = par.with_(zero=2)
    eager = text("torchtitan", "torchtitan", titan)  # (said either way: a config may turn it on)
    assert "--compile.no-enable\n" in eager and "--compile.enable\n" not in eager
    compiled = text("torchtitan-compile", "torchtitan", titan)
    assert "--compile.enable\n" in compiled
    assert "--compile.no-enable_async_tensor_parallel\n" in compiled
    assert "which torchtitan runs under torch.compile: exported with --compile.enable" in compiled
    asynctp = text("torchtitan-float8-asynctp", "torchtitan", titan)
    assert "--compile.enable_async_tensor_parallel\n" in asynctp
    assert "async TP, which torchtitan runs under torch.compile: exported with --compile.enable " \
        "--compile.components model,loss --compile.enable_async_tensor_parallel" in asynctp


@frameworks
def test_torchtitan_parses_the_compile_options():
    pytest.importorskip("torchtitan.config.manager")

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=32,
                             stack="torchtitan-float8-asynctp")
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
        tp=2, pp=2, dp=4, sp=True, zero=2, mbs=1))))
    assert pf.scenario.stack == get_stack("torchtitan-float8-asynctp")
    from torchtitan.config.manager import ConfigManager

    cfg = ConfigManager().parse_args(_torchtitan_args(export(pf, "torchtitan").text))
    assert cfg.compile.enable and cfg.compile.enable_async_tensor_parallel
    assert cfg.compile.components == ["model", "loss"]
    # a registry config that compiles the loss alone (DeepSeek-V3's) runs the model compiled too
    # (a torchtitan MoE user's trial: it had run eagerly), and its Float8 one says what it builds
    ds = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 256, seq_len=4096, global_batch=256,
                             stack="torchtitan-float8", precision=Precision.FP8, mtp_layers=0)
    pf = planfile.from_dict(planfile.to_dict(evaluate(ds, Parallelism(
        dp=256, ep=64, zero=3, mbs=1, recompute=("full",)))))
    exp = export(pf, "torchtitan")
    assert ["--compile.components", "model,loss"] in [
        line.split() for line in exp.text.splitlines() if line.startswith("--compile.")]
    assert any("builds its Float8 converters with model_compile_enabled false" in n
               and "the warning can be ignored" in n for n in exp.notes)


@frameworks
def test_deepspeed_topology_with_the_rank_map_runs_the_plans_groups():
    """DeepSpeed numbers ranks by its own topology (PipeModelDataParallelTopology: pipe, data,
    model, the last fastest); started with RANK from the export's rank map, every DeepSpeed rank
    sits on the device the plan gives its (stage, replica, tensor rank)."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256)
    par = Parallelism(tp=2, pp=4, dp=8, sp=True, zero=1, mbs=1,
                      rank_order=(Axis.TP, Axis.PP, Axis.CP, Axis.DP))
    exp = exported(sc, par, "deepspeed")
    device_of = _parse_rank_map(exp.extras[".ranks.csv"])
    topo = PipeModelDataParallelTopology(num_pp=par.pp, num_mp=par.tp, num_dp=par.dp)
    grid = rank_grid(par)  # [pp, dp, cp, tp] -> device
    for rank in range(par.devices):
        c = topo.get_coord(rank)
        assert device_of[rank] == grid[c.pipe, c.data, 0, c.model]


def test_an_export_for_another_stack_also_predicts_it_as_that_stack_runs_it():
    """A megatron-core plan exported for torchtitan: the prediction with the plan's stack, and
    the exported plan as nestplan's torchtitan stack runs it, its fine-grained recomputation as
    torchtitan's closest policy (per-op selective); DeepSpeed's stack, without tensor
    parallelism, says it would not run a TP plan."""
    from nestplan.recompute import closest

    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256)
    par = Parallelism(tp=4, pp=2, dp=8, sp=True, zero=1, mbs=1, recompute=("fine-grained",))
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, par)))
    titan = get_stack("torchtitan")
    exp = export(pf, "torchtitan")
    mapped = closest(sc.stack.policy("fine-grained"), titan.recompute)
    assert mapped.name == "selective" and mapped.kind == "matmul-outputs"
    own = evaluate(replace(sc, stack=titan), replace(exp.plan, recompute=(mapped.name,)))
    note = next(n for n in exp.notes if "searched for stack megatron-core" in n)
    assert (f"as stack torchtitan runs it (recompute selective, the nearest to megatron-core's "
            f"fine-grained): step {own.step_time:.3f} s") in note
    mine = evaluate(sc, exp.plan, stack_offers=False)
    assert own.step_time != mine.step_time
    # the exported plan (ZeRO-1 exported as FSDP2's ZeRO-2) is told as torchtitan runs it, not
    # costed with megatron-core's behaviour, a run no framework makes (a user trial)
    saved = evaluate(sc, par)
    assert (f"exported plan: t4 p2 d8 sp z2 fine-grained b1 in place of the saved t4 p2 d8 sp "
            f"z1 fine-grained b1, whose {saved.step_time:.3f} s a step assumes megatron-core's "
            "behaviour; the run as exported is predicted as stack torchtitan runs it (the file's "
            "first prediction line)"
            ) in exp.notes[[n.startswith("exported plan") for n in exp.notes].index(True)]
    # its figures once in the notes (a new user's trial read them twice)
    assert sum(f"{own.step_time:.3f} s" in n for n in exp.notes) == 1
    # the file says it too, and heads with torchtitan's prediction, then the plan's stack's
    head = [line for line in exp.text.splitlines() if line.startswith("# predicted")]
    assert head == [
        f"# predicted as stack torchtitan runs it: step {own.step_time:.3f} s, "
        f"{own.tokens_per_s:,.0f} tokens/s, MFU {own.mfu:.1%}, peak memory "
        f"{own.peak_memory / GiB:.1f} GiB ({memory_verdict(own)})",
        # (named as the exported plan: a user trial took it for the saved one)
        f"# predicted with stack megatron-core's behaviour for the plan as exported (t4 p2 d8 sp z2 "
        f"fine-grained b1) (for comparison: torchtitan does not run it so): step "
        f"{mine.step_time:.3f} s, "
        f"{mine.tokens_per_s:,.0f} tokens/s, MFU {mine.mfu:.1%}, peak memory "
        f"{mine.peak_memory / GiB:.1f} GiB ({memory_verdict(mine)})"]
    assert f"# note: {note}" in exp.text
    ds = export(pf, "deepspeed")
    note = next(n for n in ds.notes if "searched for stack" in n)
    assert "stack deepspeed would not run it (tp: stack deepspeed has no tensor parallelism" in note
    assert note in ds.extras[".notes.txt"]
    # its JSON holds no comments: the notes file heads with the prediction, fit included
    first = ds.extras[".notes.txt"].splitlines()[0]
    assert first.startswith("predicted with stack megatron-core's behaviour: step ")
    assert first.endswith(("(fits, leaves the headroom)", "(does NOT fit)",
                           "(fits, less than the headroom: not recommended)"))


def test_an_export_says_whether_its_plan_leaves_the_headroom(tmp_path):
    """An export's prediction says what evaluate says of the plan's memory: a plan that fits
    but not within the headroom is "not recommended" there too (a user trial's torchtitan export
    of a plan at 99.97 % of HBM said only "fits")."""
    sc = replace(scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=8192,
                                     global_batch=64, stack="torchtitan"), memory_headroom=0.49)
    tight = evaluate(sc, Parallelism(tp=1, pp=1, dp=8, zero=3, recompute=("selective",), mbs=1))
    assert tight.fits and not tight.within_headroom  # 40.6 GiB of 79.6, 49 % kept free
    exp = export(planfile.from_dict(planfile.to_dict(tight)), "torchtitan")
    assert ("(fits, less than the headroom: not recommended)" in
            [line for line in exp.text.splitlines() if line.startswith("# predicted")][0])



def test_the_own_stack_prediction_is_of_the_plan_actually_exported():
    """A torchtitan ZB-V plan goes to Megatron as interleaved 1F1B: megatron-core runs that plan
    (it had been judged on the saved ZB-V one, which it would not run)."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    par = Parallelism(tp=2, pp=2, vp=2, schedule="zbv", dp=4, sp=True, zero=2, mbs=1)
    exp = exported(sc, par, "megatron")
    assert exp.plan.pipeline.name == "interleaved-1f1b"
    core = evaluate(replace(sc, stack=get_stack("megatron-core")), exp.plan)
    note = next(n for n in exp.notes if "searched for stack torchtitan" in n)
    assert f"as stack megatron-core runs it (recompute none): step {core.step_time:.3f} s" in note


def test_rank_maps_number_local_ranks_per_host_on_nvl72_racks():
    """A GB200 NVL72 rack's NVLink domain spans 4-GPU compute trays, each a host: the rank map
    gives each rank its tray and a LOCAL_RANK of 0-3, as torchrun numbers them (it had given the
    64-GPU domain's 0-63); a DGX node is one host."""
    from nestplan.axes import parse_order

    # (an order neither of Megatron's own numbers: --use-tp-pp-dp-mapping gives tp-pp-dp)
    par = Parallelism(tp=4, pp=2, dp=16, sp=True, zero=1, mbs=1,
                      rank_order=parse_order("pp-tp-dp-cp"))
    for cluster, host in (("gb200-nvl72-ndr", 4), ("dgx-b200-ndr", 8)):
        sc = scenario_from_names("llama3-70b", cluster, 128, seq_len=4096, global_batch=128)
        assert sc.cluster.host_size == host
        csv = exported(sc, par, "megatron").extras[".ranks.csv"]
        rows = [tuple(map(int, line.split(","))) for line in csv.splitlines()[1:]]
        assert sorted(d for _, d, _, _ in rows) == list(range(128))
        assert all((node, local) == divmod(dev, host) for _, dev, node, local in rows)


def test_a_host_of_several_scale_up_domains_numbers_its_local_ranks(tmp_path):
    """A PCIe server of 8 GPUs whose NVLink bridges join pairs (an academic user's trial): the
    innermost level is the pair, the host holds four of them (``devices_per_host = 8``, a
    multiple of the pair that tiles the server's level), and the rank map numbers LOCAL_RANK 0-7
    per server (it had to be given as 16 hosts of 2, which torchrun's 8 processes per node could
    not start); a host that tiles no level's block is refused."""
    from nestplan.axes import parse_order
    from nestplan.catalog import get_cluster
    from nestplan.errors import SpecError

    levels = ('[[levels]]\nname = "pair"\nsize = 2\nbandwidth_GBps = 300\nlatency_us = 3\n'
              '[[levels]]\nname = "pcie"\nsize = 4\nbandwidth_GBps = 25\nlatency_us = 5\n'
              '[[levels]]\nname = "eth"\nbandwidth_GBps = 1.5\nlatency_us = 20\n')
    path = tmp_path / "uni.toml"
    path.write_text(f'name = "uni"\naccelerator = "a100-sxm-80gb"\ndevices_per_host = 8\n{levels}')
    assert get_cluster(str(path)).host_size == 8
    sc = scenario_from_names("llama3-8b", str(path), 32, seq_len=4096, global_batch=64)
    par = Parallelism(tp=2, pp=4, dp=4, sp=True, zero=1, mbs=1,
                      rank_order=parse_order("pp-tp-dp-cp"))  # (not Megatron's: a rank map)
    csv = exported(sc, par, "megatron").extras[".ranks.csv"]
    rows = [tuple(map(int, line.split(","))) for line in csv.splitlines()[1:]]
    assert {node for _, _, node, _ in rows} == {0, 1, 2, 3}
    assert all((node, local) == divmod(dev, 8) for _, dev, node, local in rows)
    path.write_text(f'name = "uni"\naccelerator = "a100-sxm-80gb"\ndevices_per_host = 6\n{levels}')
    with pytest.raises(SpecError, match=r"devices_per_host: got 6; must divide the innermost "
                       r"level's size \(pair: 2\), or be a multiple of one level's block of "
                       r"devices that divides the next level's \(pair: 2, pcie: 8\)"):
        get_cluster(str(path))
    # nor hosts of whole pairs that straddle the PCIe groups of 3 pairs (a review's)
    path.write_text('name = "uni"\naccelerator = "a100-sxm-80gb"\ndevices_per_host = 4\n'
                    + levels.replace("size = 4", "size = 3").replace(
                        '[[levels]]\nname = "eth"', '[[levels]]\nname = "rack"\nsize = 4\n'
                        'bandwidth_GBps = 5\nlatency_us = 9\n[[levels]]\nname = "eth"'))
    with pytest.raises(SpecError, match=r"devices_per_host: got 4; .*\(pair: 2, pcie: 6, "
                       r"rack: 24\)"):
        get_cluster(str(path))


def test_the_own_stack_prediction_says_which_policy_stands_for_another(tmp_path):
    """A policy the format's stack does not offer is predicted as its nearest one, and the note
    says so: every second block checkpointed (a stack file of one's own, torchtitan's 2024
    per-layer option) is run by megatron-core's stack as full recomputation."""
    from nestplan.catalog import get_stack as stack_of

    path = tmp_path / "titan-every.toml"
    path.write_text('base = "torchtitan"\nname = "titan-every"\n'
                    'recompute = {none = "none", every2 = "every:2", full = "full"}\n')
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=4096, global_batch=64,
                             stack=str(path))
    par = Parallelism(tp=1, pp=1, dp=8, zero=3, mbs=1, recompute=("every2",))
    note = next(n for n in exported(sc, par, "megatron").notes if "searched for stack titan-every" in n)
    full = evaluate(replace(sc, stack=stack_of("megatron-core")), par.with_(recompute=("full",)))
    assert (f"as stack megatron-core runs it (recompute full, the nearest to titan-every's "
            f"every2): step {full.step_time:.3f} s") in note


def _every2_scenario(tmp_path, base: str, gpus: int):
    """Llama 3 8B on ``gpus`` H100 under a stack file based on ``base`` that offers ``ev2``, full
    recomputation of one block in every two."""
    path = tmp_path / "mystk.toml"
    path.write_text(f'base = "{base}"\nname = "mystk"\n'
                    'recompute = {none = "none", ev2 = "every:2", full = "full"}\n')
    return scenario_from_names("llama3-8b", "dgx-h100-ndr", gpus, seq_len=4096, global_batch=64,
                               stack=str(path))


@pytest.mark.parametrize("vp, layers, counts", [(1, (24, 8), {0: 12, 1: 4}),
                                                (2, (1, 15, 15, 1), {0: 8, 1: 8})])
def test_megatron_every_n_recomputes_each_stages_share(tmp_path, vp, layers, counts):
    """Megatron's block recomputation takes one count per process: an every:2 policy is exported
    per stage, ceil(n/2) of its largest chunk of n (it had taken the smallest chunk anywhere for
    every stage: 4 of stage 0's 24 blocks, a fuzzing helper's)."""
    sc = _every2_scenario(tmp_path, "megatron-core", 16)
    par = Parallelism(tp=2, pp=2, dp=4, vp=vp, sp=True, zero=1, mbs=1, recompute=("ev2",),
                      stage_layers=layers)
    out = exported(sc, par, "megatron")
    if ".stages.sh" in out.extras:  # the stages differ: each its own count in the stage script
        found = {int(s): int(n) for s, n in re.findall(
            r"(\d)\) set -- .*--recompute-num-layers (\d+)", out.extras[".stages.sh"])}
    else:  # one count for every stage, in the arguments
        n = int(re.search(r"--recompute-num-layers (\d+)", out.text).group(1))
        found = {s: n for s in range(par.pp)}
    assert found == counts


def test_deepspeed_export_says_how_to_run_every_n(tmp_path):
    """An every:N policy's note had pointed at Megatron-DeepSpeed's selective recomputation of
    the attention core, which is not that policy (a fuzzing helper's)."""
    sc = _every2_scenario(tmp_path, "deepspeed", 8)
    par = Parallelism(tp=1, pp=1, dp=8, zero=1, mbs=1, recompute=("ev2",))
    notes = exported(sc, par, "deepspeed").notes
    assert any("checkpoint one transformer block in every 2" in n for n in notes), notes
    assert not any("attention core" in n for n in notes), notes


def test_a_torchtitan_export_predicts_the_mode_it_runs(tmp_path):
    """A stack file's every:2 policy runs as torchtitan's full checkpointing: the exported plan
    carries the stack's full policy, so its prediction is of that run (a user trial found the
    note predicting every:2's step and memory for it)."""
    path = tmp_path / "ours.toml"
    path.write_text('base = "torchtitan"\nname = "ours-titan"\n'
                    'recompute = {none = "none", half = "every:2", full = "full"}\n')
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=8192, global_batch=16,
                             stack=str(path))
    par = Parallelism(tp=8, pp=1, dp=8, sp=True, zero=3, mbs=2, recompute=("half",))
    out = exported(sc, par, "torchtitan")
    assert out.plan.recompute == ("full",)
    full = evaluate(sc, par.with_(recompute=("full",)))
    assert any(n.startswith(f"exported plan: predicted step {full.step_time:.3f} s instead of")
               for n in out.notes), out.notes
    assert out.text.rstrip().endswith("activation-checkpoint:full")


@pytest.mark.parametrize("fmt", ["megatron", "torchtitan", "deepspeed"])
def test_the_rank_wrapper_gives_each_process_its_rank_of_the_map(tmp_path, fmt):
    """Run as torchrun runs it (GROUP_RANK, LOCAL_RANK), the wrapper each export writes beside
    its rank map sets RANK to the framework rank the map puts on that device, and runs its
    arguments; outside a launcher it says what is missing (a user trial found a rank map with no
    way to launch by it)."""
    from nestplan.axes import parse_order

    sc = scenario_from_names("llama3-8b", "gb200-nvl72-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=2, pp=2, dp=4, sp=True, zero=1, mbs=1,
                      rank_order=parse_order("pp-tp-dp-cp"))  # (none of the frameworks' orders)
    out = exported(sc, par, fmt)
    (tmp_path / "x.ranks.csv").write_text(out.extras[".ranks.csv"])
    script = tmp_path / "x.ranks.sh"
    script.write_text(out.extras[".ranks.sh"])
    device_of = _parse_rank_map(out.extras[".ranks.csv"])
    host = sc.cluster.host_size
    for rank, dev in device_of.items():
        env = {"PATH": os.environ["PATH"], "GROUP_RANK": str(dev // host),
               "LOCAL_RANK": str(dev % host)}
        got = subprocess.run(["bash", str(script), "printenv", "RANK"], env=env,
                             capture_output=True, text=True, check=True).stdout
        assert int(got) == rank
    done = subprocess.run(["bash", str(script), "true"], env={"PATH": os.environ["PATH"]},
                          capture_output=True, text=True)
    assert done.returncode == 2 and "LOCAL_RANK are not set" in done.stderr
    # DeepSpeed's launcher names the host CROSS_RANK; a link to the script finds the map too
    link = tmp_path / "elsewhere" / "run.sh"
    link.parent.mkdir()
    link.symlink_to(script)
    rank, dev = next(iter(device_of.items()))
    env = {"PATH": os.environ["PATH"], "CROSS_RANK": str(dev // host), "LOCAL_RANK": str(dev % host)}
    got = subprocess.run(["bash", str(link), "printenv", "RANK"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert int(got) == rank
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "give the command" in done.stderr
    assert any("bash PATH.ranks.sh" in n and "--node-rank" in n for n in out.notes)


def test_tp_beyond_one_nvlink_domain_runs_without_userbuffer_overlap():
    """Transformer Engine's userbuffer overlap runs within one NVLink domain only (TE issue
    #1071): a TP group across nodes is costed with the stack's overlap beyond the domain (the
    backward's, for megatron-core) and exported without --tp-comm-overlap, with a note (a user
    trial's TP 16 had been exported with it); a TP group within a node keeps both."""
    from nestplan.catalog import get_stack
    from nestplan.options import TPOverlap

    sc = scenario_from_names("llama3-405b", "dgx-h100-ndr", 1024, seq_len=8192, global_batch=512)
    backward = replace(sc, stack=replace(get_stack("megatron-core"), name="bw",
                                         tp_overlap=TPOverlap.BACKWARD))
    for tp, pp, crosses in ((16, 8, True), (8, 16, False)):
        par = Parallelism(tp=tp, pp=pp, dp=8, sp=True, zero=1, mbs=1, recompute=("none",))
        ev = evaluate(sc, par)
        same = ev.step_time == pytest.approx(evaluate(backward, par).step_time, rel=1e-12)
        assert same == crosses, tp
        out = export(planfile.from_dict(planfile.to_dict(ev)), "megatron")
        assert ("tp-comm-overlap" in _flags(out.text)) != crosses
        assert any("leaves one NVLink domain" in n for n in out.notes) == crosses


def test_torchtitan_export_turns_off_what_a_registry_config_turns_on():
    """torchtitan's llama3_405b config compiles, runs async TP and converts to Float8 (a user
    trial's eager bf16 plan launched with all three): the export says compile and async TP
    either way, and a note says the Float8 converter has to go; another stack's ZeRO-0 plan with
    CP, which torchtitan shards over the CP ranks, says so too."""
    sc = scenario_from_names("llama3-405b", "dgx-h100-ndr", 512, seq_len=8192, global_batch=256,
                             stack="torchtitan")
    par = Parallelism(tp=8, pp=8, dp=8, sp=True, zero=3, mbs=1, recompute=("full",))
    out = exported(sc, par, "torchtitan")
    flags = out.text.split()
    assert "--compile.no-enable" in flags and "--compile.no-enable_async_tensor_parallel" in flags
    assert any("llama3_405b trains with a Float8 converter" in n for n in out.notes)
    # a megatron-core plan: the torchtitan stacks run none (cp_shards_weights)
    sc8 = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=8192, global_batch=8)
    zero0 = Parallelism(tp=1, pp=1, dp=4, cp=2, zero=0, mbs=1, recompute=("full",))
    notes = exported(sc8, zero0, "torchtitan").notes
    assert any("runs sharded over cp = 2" in n for n in notes)
    assert not any("Float8" in n for n in notes)


@pytest.mark.frameworks
def test_deepspeed_pipeline_export_says_its_gradients_accumulate_in_bf16(monkeypatch):
    """The exported pipeline config leaves grad_accum_dtype unset, so DeepSpeed accumulates in
    bf16; its own optimizer choice refuses fp32 accumulation at ZeRO-0 and, at ZeRO-1, runs
    BF16_Optimizer with an fp32 buffer: the export says so (a user trial)."""
    import torch
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.zero import utils

    monkeypatch.setattr(utils.dist, "get_rank", lambda *a, **k: 0)  # (as on rank 0, for a log)

    class Engine:  # the answers _do_optimizer_sanity_check reads
        pipeline_parallelism = True

        def __init__(self, zero):
            self.zero = zero

        def get_data_types(self):
            return torch.bfloat16, torch.float32

        def zero_optimization(self):
            return self.zero > 0

        def zero_optimization_stage(self):
            return self.zero

        def zero_cpu_offload(self):
            return False

        def zero_compute_grad_norm(self):
            return True

        def zero_allow_untested_optimizer(self):
            return True

    with pytest.raises(NotImplementedError):
        DeepSpeedEngine._do_optimizer_sanity_check(Engine(0), torch.optim.AdamW(
            [torch.nn.Parameter(torch.zeros(1))]))
    assert DeepSpeedEngine._do_optimizer_sanity_check(Engine(1), torch.optim.AdamW(
        [torch.nn.Parameter(torch.zeros(1))])) == "bf16"
    sc = scenario_from_names("llama2-13b", "dgx-h100-ndr", 32, seq_len=4096, global_batch=64,
                             stack="deepspeed")
    for zero, words in ((0, "is refused at ZeRO-0"), (1, "switches DeepSpeed to its "
                                                         "BF16_Optimizer, whose fp32 buffer")):
        par = Parallelism(tp=1, pp=4, dp=8, zero=zero, mbs=1, recompute=("full",))
        notes = exported(sc, par, "deepspeed").notes
        assert any("accumulates the micro-batches' gradients in bf16" in n and words in n
                   for n in notes), notes
    # with what the buffer would do to the plan (a DeepSpeed trial's 70B went past its HBM)
    big = scenario_from_names("llama3-70b", "dgx-h100-ndr", 128, seq_len=4096, global_batch=1024,
                              stack="deepspeed")
    par = Parallelism(tp=1, pp=8, dp=16, zero=1, mbs=1, recompute=("full",))
    ev = evaluate(big, par)
    stage = max(ev.stages, key=lambda s: s.memory.total + 2 * s.memory.weights)
    words = (f"({2 * stage.memory.weights / 2**30:.1f} GiB more on stage {stage.index}: "
             f"{(stage.memory.total + 2 * stage.memory.weights) / 2**30:.1f} of "
             f"{ev.capacity / 2**30:.1f} GiB, which does not fit)")
    assert any(words in n for n in exported(big, par, "deepspeed").notes), words


def test_a_plan_with_mtp_depths_exports_to_deepspeed_with_a_note(tmp_path):
    """DeepSpeed's stack trains no MTP depths: exporting such a plan says so in the note on the
    stack it was searched for (it had refused the export with advice for --mtp-layers, which
    export does not take)."""
    from console import cli

    saved, out = tmp_path / "p.json", tmp_path / "ds.json"
    assert cli("evaluate", "--model", "deepseek-v3", "--cluster", "dgx-h100-ndr", "--gpus", 256,
               "--tp", 1, "--pp", 8, "--ep", 32, "--mbs", 1, "--global-batch", 256,
               "--seq-len", 4096, "--recompute", "full", "--save", saved)[0] == 0
    code, _, err = cli("export", saved, "--format", "deepspeed", "-o", out)
    assert code == 0 and out.exists(), err
    assert ("nestplan's stack deepspeed would not run it (model.mtp_layers: stack deepspeed "
            "trains no multi-token-prediction depths)") in err


def test_context_parallel_windows_and_sinks_export_an_exchange_transformer_engine_runs(tmp_path):
    """Transformer Engine refuses its default ring (p2p) exchange under context parallelism over
    sliding windows (all_gather or a2a only) and with attention sinks (a2a only): a user trial's
    Mistral export crashed at its first forward. The export asks for all_gather, which the cost
    model then prices (K/V gathered, not passed round a ring), or a2a with a note; a model
    without windows keeps the ring, said, and one GPU per sequence needs nothing."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL))
    windowed = scenario_from_names(str(path), "dgx-h100-ndr", 16, seq_len=8192, global_batch=16)
    whole = replace(windowed, model=windowed.model.without_local_attention())
    sinks = replace(windowed, model=replace(windowed.model, attention_sinks=True))
    par = Parallelism(tp=1, pp=1, dp=4, cp=4, zero=1, mbs=1)
    two = par.with_(cp=2, dp=8)
    flags = {name: _flags(exported(sc, p, "megatron").text).get("cp-comm-type")
             for name, sc, p in (("windowed", windowed, par), ("whole", whole, par),
                                 ("sinks", sinks, two))}
    # (the ring written out, as predicted: a long-context trial's)
    assert flags == {"windowed": ["all_gather"], "whole": ["p2p"], "sinks": ["a2a"]}
    # a2a splits the heads over the CP ranks: Mistral's 2 KV heads go over CP 2, not over CP 4:
    # refused for the stack's own plans (a long-context trial's had been recommended), and said
    # of another stack's plan exported to Megatron
    with pytest.raises(SpecError, match=r"its 8 query and 2 KV heads \(tp = 1\) must divide by "
                                        r"cp = 4"):
        evaluate(sinks, par)
    other = replace(sinks, stack=replace(sinks.stack, name="other", cp_gathers_windows=False))
    sunk = [n for n in exported(other, par, "megatron").notes if "--cp-comm-type a2a" in n]
    assert sunk and "must divide by cp = 4, which this plan's do not: it does not run" in sunk[0]
    assert not any("does not run as exported" in n
                   for n in exported(sinks, two, "megatron").notes)
    assert exported(windowed, par.with_(cp=1, dp=16), "megatron").text.count("cp-comm-type") == 0
    # costed as the exchange it runs: the windowed model's K/V as torch's all-gather costs it
    from nestplan.evaluate import local_strategy

    for sc, gathers in ((windowed, True), (sinks, True), (whole, False)):
        local = local_strategy(sc.model, par, sc.training, sc.stack)
        assert local.cp_allgather == local.cp_gather_waits == gathers
    # as Transformer Engine runs it: the gathers waited for, dK/dV reduce-scattered after them
    from nestplan.evaluate import layer_graph
    from nestplan.graph import CollKind, Hide

    comms = {c.name: c for c in layer_graph(windowed.model, par, windowed.training,
                                            windowed.stack).dense.comms if c.axis.value == "cp"}
    assert {n: (c.kind, c.hide) for n, c in comms.items()} == {
        "cp_kv_ag": (CollKind.ALL_GATHER, Hide.NONE), "cp_kv_ag_bwd": (CollKind.ALL_GATHER, Hide.NONE),
        "cp_dkv_bwd": (CollKind.REDUCE_SCATTER, Hide.NONE)}


def test_a_torchtitan_export_says_what_torchtitan_0_3_runs_otherwise():
    """Two things torchtitan 0.3 runs otherwise than the stacks cost (a user trial's): its Float8
    converter offers rowwise scaling only, which gathers weights in bf16, so a stack that moves
    fp8 in its all-gathers (torchtitan's 2024 tensorwise Float8) gets the step as launched; and
    its configs chunk the loss, so the peak counts the whole sequence's logits, said with their
    size."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=8192, global_batch=256,
                             precision=Precision.FP8, stack="torchtitan-float8")
    par = Parallelism(tp=8, pp=1, dp=32, sp=True, zero=3, recompute=("full",), mbs=1)
    notes = exported(sc, par, "torchtitan").notes
    st = sc.stack
    launched = evaluate(replace(sc, stack=replace(st, fp8_param_gather=False,
                                                  fp8_tp_gather=False)), par)
    assert launched.step_time > evaluate(sc, par).step_time
    assert any("rowwise scaling only, which gathers in bf16: as launched the step is predicted "
               f"at {launched.step_time:.3f} s" in n for n in notes), notes
    # the logits' bytes as the evaluation counts them: what its head device's memory loses when
    # the loss keeps and works in 2 bytes a logit instead of the stack's 4 and 6
    from nestplan.units import fmt_gib

    head = evaluate(sc, par).stages[-1].memory
    less = evaluate(replace(sc, stack=replace(st, loss_saved_bytes=2, loss_transient_bytes=2)),
                    par).stages[-1].memory
    kept = (head.activations - less.activations) * st.loss_saved_bytes / (st.loss_saved_bytes - 2)
    work = (head.transient - less.transient) * st.loss_transient_bytes / (
        st.loss_transient_bytes - 2)
    assert any("torchtitan's llama3_70b_float8 computes the loss over chunks" in n
               and f"logits, {fmt_gib(kept)} GiB a micro-batch keeps for backward and "
               f"{fmt_gib(work)} GiB more at the loss's backward" in n for n in notes), notes
    bf16 = replace(sc, training=replace(sc.training, precision=Precision.BF16),
                   stack=get_stack("torchtitan"))
    assert not any("rowwise" in n for n in exported(bf16, par, "torchtitan").notes)


@pytest.mark.parametrize("fmt, base, policy, launched", [
    ("megatron", "megatron-core", "matmul-outputs", ("megatron-core", "selective")),
    ("torchtitan", "torchtitan", "modules:core_attn", ("torchtitan", "selective"))])
def test_an_export_predicts_the_policy_it_launches(tmp_path, fmt, base, policy, launched):
    """A stack file's policy the format cannot express is launched as another (Megatron-LM runs
    per-op checkpointing as its selective recomputation; torchtitan runs core-attention
    checkpointing as its per-op selective mode): the export's prediction is of the launched run,
    as the catalog stack that runs it predicts it (a user trial's Megatron export said "fits" of
    a plan whose launched run needs 93 GiB of 80; its torchtitan export said 167 GiB of one that
    holds 82)."""
    path = tmp_path / "mine.toml"
    path.write_text(f'base = "{base}"\nname = "mine"\n'
                    f'recompute = {{none = "none", odd = "{policy}", full = "full"}}\n')
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=8192, global_batch=64,
                             stack=str(path))
    par = Parallelism(tp=2, pp=1, dp=4, sp=True, zero=3 if fmt == "torchtitan" else 1, mbs=2,
                      recompute=("odd",))
    own = evaluate(replace(sc, stack=get_stack(launched[0])), par.with_(recompute=(launched[1],)))
    assert own.step_time != evaluate(sc, par).step_time
    text = exported(sc, par, fmt).text
    head = [line for line in text.splitlines() if line.startswith("# predicted")]
    assert head == [f"# predicted with stack mine: step {own.step_time:.3f} s, "
                    f"{own.tokens_per_s:,.0f} tokens/s, "
                    f"MFU {own.mfu:.1%}, peak memory {own.peak_memory / GiB:.1f} GiB "
                    f"({memory_verdict(own)})"], head
    assert f"# note: exported plan: predicted step {own.step_time:.3f} s instead of" in text


def test_a_stack_that_gathers_context_parallel_kv_exports_the_gather(tmp_path):
    """A Megatron stack file with cp_exchange = "allgather" is costed with the gather and
    exported with it (a user trial's ran Megatron's default ring, unsaid); the catalog stack
    keeps the ring."""
    path = tmp_path / "ag.toml"
    path.write_text('base = "megatron-core"\nname = "ag"\ncp_exchange = "allgather"\n')
    par = Parallelism(tp=8, pp=1, dp=2, cp=4, sp=True, zero=1, mbs=1, recompute=("full",))
    flags = {}
    for stack in (str(path), "megatron-core"):
        sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 64, seq_len=32768,
                                 global_batch=64, stack=stack)
        flags[stack] = _flags(exported(sc, par, "megatron").text).get("cp-comm-type")
    assert flags == {str(path): ["all_gather"], "megatron-core": ["p2p"]}


def test_a_deepspeed_export_of_context_parallelism_says_ulysses_is_not_the_ring():
    """DeepSpeed's sequence parallelism is Ulysses' all-to-alls over heads, not the ring K/V
    exchange a CP plan is costed with (a user trial read the export as asking for the same)."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=32768, global_batch=16)
    for cp, said in ((2, True), (1, False)):
        ev = evaluate(sc, Parallelism(tp=8, cp=cp, dp=2 // cp, sp=True, zero=1, mbs=1))
        pf = planfile.from_dict(planfile.to_dict(ev, method="manual"))
        assert any("DeepSpeed-Ulysses" in n for n in export(pf, "deepspeed").notes) == said


def test_an_export_to_another_stack_names_a_much_faster_zero_stage_there():
    """A torchtitan plan with a pipeline runs FSDP2 at ZeRO-2; exported to Megatron it would run
    Megatron-FSDP with a reduce-scatter per micro-batch, where the distributed optimizer
    (ZeRO-1) is much faster: the note says so and how to get that plan (a user trial's)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=8192, global_batch=256,
                             stack="torchtitan")
    ev = evaluate(sc, Parallelism(tp=8, pp=8, dp=4, sp=True, zero=2, mbs=1, recompute=("full",)))
    pf = planfile.from_dict(planfile.to_dict(ev, method="manual"))
    note = next(n for n in export(pf, "megatron").notes if "searched for stack torchtitan" in n)
    one = evaluate(replace(sc, stack=get_stack("megatron-core")), ev.plan.with_(zero=1))
    assert f"at ZeRO-1 it runs in {one.step_time:.3f} s" in note
    assert "--zero 1 --stack megatron-core" in note
    # (so does a ZeRO-3 plan without a pipeline); one at that stage already says nothing of it
    core = replace(sc, stack=get_stack("megatron-core"))
    for fmt in ("megatron", "torchtitan"):
        pf = planfile.from_dict(planfile.to_dict(one, method="manual"))
        assert not any("it runs in" in n for n in export(pf, fmt).notes), fmt
    assert one.scenario == core


def test_experts_weighted_on_input_beyond_top_1_are_not_asked_of_megatron():
    """Megatron-Core takes --moe-apply-probs-on-input at top-1 only (it asserts so in the
    experts' forward, experts.py): a Llama 4 with two experts a token exports without it and
    says the run weights the outputs instead (a review: the flag had been written, a run that
    fails at its first MoE layer)."""
    sc = scenario_from_names("llama4-maverick", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
    two = replace(sc, model=replace(sc.model, name="maverick-top2",
                                    moe=replace(sc.model.moe, top_k=2)))
    par = Parallelism(tp=4, pp=1, dp=16, ep=16, etp=1, sp=True, zero=1, mbs=1)
    out = exported(two, par, "megatron")
    flags = [line for line in out.text.splitlines() if not line.startswith("#")]
    assert not any("--moe-apply-probs-on-input" in line for line in flags)
    assert any("runs at top-1 only" in n for n in out.notes)
    assert "--moe-apply-probs-on-input" in exported(sc, par, "megatron").text


def test_a_torchtitan_export_says_what_its_registry_config_does_with_cp_and_the_sequence():
    """torchtitan 0.3's registry configs (a review's): GPT-OSS's varlen attention refuses CP; a
    2024 stack's CP plan is launched with FlexAttention, which keeps the gathered K/V that stack
    does not cost (the torchtitan stack costs it: no note); the chunked loss needs each rank's
    sequence divisible by its 8 chunks."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 64, seq_len=32768, global_batch=64,
                             stack="torchtitan")
    par = Parallelism(tp=1, pp=1, dp=8, cp=8, zero=2, mbs=1, recompute=("none",))
    old = replace(sc, stack=get_stack("torchtitan-2024"))
    assert any("keeps the all-gathered K/V; stack torchtitan-2024 costs an all-gather of K/V "
               "gathered again in the backward (torch's SDPA" in n
               for n in exported(old, par, "torchtitan").notes)
    assert not any("SDPA" in n for n in exported(sc, par, "torchtitan").notes)
    # a Megatron stack's note names its own exchange, the ring (a user trial's: it had named
    # 2024's SDPA one)
    mc = replace(sc, stack=get_stack("megatron-core"))
    notes = exported(mc, replace(par, zero=1, recompute=("selective",)), "torchtitan").notes
    assert any("stack megatron-core costs a ring exchange of K/V (Transformer Engine's)" in n
               for n in notes)
    # and its recomputation note names both stacks' 'selective' by rule (the same trial's)
    assert any("policy 'selective' (modules:core_attn) has no torchtitan equivalent; its "
               "activation checkpointing runs its own 'selective' (matmul-outputs)" in n
               for n in notes), notes
    odd = replace(sc, training=replace(sc.training, seq_len=32784))  # 4,098 tokens a rank
    assert any("4,098 tokens (seq_len / cp) do not" in n
               for n in exported(odd, par, "torchtitan").notes)
    oss = scenario_from_names("gpt-oss-120b", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64,
                              stack="torchtitan")
    moe = Parallelism(tp=1, pp=1, dp=32, cp=2, ep=8, zero=2, mbs=1, recompute=("full",))
    assert any("varlen attention, which torchtitan 0.3 refuses under context parallelism" in n
               for n in exported(oss, moe, "torchtitan").notes)


def test_a_model_torchtitan_is_not_matched_to_is_described_for_its_definition(tmp_path):
    """A model nestplan matches to none of torchtitan's definitions (a Qwen2.5-style config: q/k/v
    biases, 29,568-wide FFN) is exported with MODULE and CONFIG for the user to fill, and the note
    gives what that definition must hold; it had said torchtitan "ships no definition" (of
    Qwen3-32B, which it ships) and not what the model was (a user trial's)."""
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 8192,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "intermediate_size": 29568, "vocab_size": 152064, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "max_position_embeddings": 32768}))
    sc = scenario_from_names(str(cfg), "dgx-h100-ndr", 64, seq_len=4096, global_batch=64,
                             stack="torchtitan")
    pf = planfile.from_dict(planfile.to_dict(evaluate(sc, Parallelism(
        tp=8, pp=1, dp=8, zero=3, mbs=1, sp=True, recompute=("full",)))))
    out = export(pf, "torchtitan")
    assert "--module MODULE" in out.text and "--config CONFIG" in out.text
    note = next(n for n in out.notes if "MODULE and CONFIG" in n)
    assert "llama3_70b" in note and "ships no definition" not in note
    assert ("dim 8192, 80 layers, 64 heads (8 KV) of 128, swiglu FFN 29568, vocabulary 152064; "
            "RoPE theta 1e+06; q/k/v biases") in note


def test_an_fp8_export_on_an_accelerator_without_a_compute_capability(tmp_path):
    """The fp8 recipe follows the compute capability (MXFP8 from 10); an accelerator file that
    gives none (the catalog's MI300X, as most users' own) is taken as pre-Blackwell: a review's
    export of such a plan had failed on comparing None with 10."""
    cluster = tmp_path / "mi.toml"
    cluster.write_text('name = "mi"\naccelerator = "mi300x"\n[[levels]]\nname = "xgmi"\nsize = 8\n'
                       'bandwidth_GBps = 448\nlatency_us = 3\nefficiency = 0.8\n[[levels]]\n'
                       'name = "net"\nbandwidth_GBps = 50\nlatency_us = 14\nefficiency = 0.9\n')
    sc = scenario_from_names("llama3-8b", str(cluster), 16, seq_len=4096, global_batch=16,
                             precision=Precision.FP8)
    assert sc.cluster.accelerator.compute_capability is None
    text = exported(sc, Parallelism(dp=16, zero=1, mbs=1), "megatron").text
    assert "--fp8-recipe tensorwise \\" in text and "--fp8-format hybrid \\" in text


@pytest.mark.frameworks  # (Megatron-Core's TransformerConfig checks the overlap)
def test_a_dualpipe_plan_goes_to_megatron_as_a_schedule_it_runs(tmp_path):
    """Megatron-LM has no DualPipe: a DualPipe plan whose stack overlaps the expert exchange with
    another micro-batch exports as interleaved 1F1B over the same two chunks per device, which
    Megatron-Core overlaps under (its TransformerConfig refuses the overlap when it pipelines
    without interleaving), and its header predicts that run (a DeepSeek-V3 trial's export ran
    1F1B with --overlap-moe-expert-parallel-comm, and its header predicted that run)."""
    base = Path(__file__).parent / "data" / "moe_stacks" / "megatron-core-flex-a2a-overlap.toml"
    stack = tmp_path / "dp.toml"
    stack.write_text(f'base = "{base}"\nname = "dp"\n'
                     'schedules = ["1f1b", "interleaved-1f1b", "dualpipe"]\n')
    sc = scenario_from_names("qwen3-30b-a3b", "dgx-h100-ndr", 64, seq_len=4096,
                             global_batch=256, stack=str(stack))
    par = Parallelism(tp=1, pp=4, dp=16, ep=8, etp=1, vp=2, schedule="dualpipe",
                      recompute=("selective",), mbs=1)
    out = exported(sc, par, "megatron")
    assert "exported with interleaved-1f1b over 2 chunks per device on the same 4 ranks" \
        in out.text
    assert "--overlap-moe-expert-parallel-comm" in out.text
    step = evaluate(sc, par.with_(schedule="interleaved-1f1b")).step_time
    assert f"step {step:.3f} s" in out.text.splitlines()[1], out.text.splitlines()[1]
    megatron_transformer_config(out.text)  # (raised on the overlap without interleaving)


def test_gathers_overlapped_without_the_reduction_export_without_the_gather_flag():
    """Megatron-LM's validate_args asserts --overlap-grad-reduce with --overlap-param-gather
    (megatron/training/arguments.py @ NVIDIA/Megatron-LM d98e8a64dd); a stack that overlaps the
    gathers and not the reduction (NeMo's DeepSeek-V3 H100 run, which Megatron-Bridge launches)
    had been exported with the gather flag alone, which pretrain_gpt.py refuses (an MoE user's
    trial). It is left out; the header predicts the step with the gathers waiting, as launched
    (it had quoted them overlapped), and the note the step the plan was searched with."""
    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 16, seq_len=4096, global_batch=64)
    par = Parallelism(tp=1, pp=1, dp=16, zero=1, mbs=1)
    apart = replace(sc.stack, name="apart", overlap_grad_reduce=False)
    out = exported(replace(sc, stack=apart), par, "megatron")
    args = _arguments(out.text).split()
    assert "--overlap-param-gather" not in args and "--overlap-grad-reduce" not in args
    bare = evaluate(replace(sc, stack=replace(apart, overlap_param_gather=False)), par)
    both = evaluate(replace(sc, stack=apart), par)
    assert bare.step_time > both.step_time
    said = [n for n in out.notes if "--overlap-param-gather is left out" in n]
    assert len(said) == 1 and f"as the stack runs them: {fmt_time(both.step_time)}" in said[0], \
        out.notes
    assert f"# predicted with stack apart: step {bare.step_time:.3f} s," in out.text, out.text
    args = _arguments(exported(sc, par, "megatron").text).split()  # (both overlapped: both)
    assert "--overlap-param-gather" in args and "--overlap-grad-reduce" in args
