"""Catalog entries, HuggingFace configs and strict loading."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan import graph as G
from nestplan.catalog import KINDS, get, get_cluster, get_model, list_names
from nestplan.errors import SpecError
from nestplan.hf import FAMILIES, model_from_hf_dict

DATA = Path(__file__).parent / "data"  # tests/data/SOURCES.md

REQUIRED_MODELS = ["gpt3-175b", "bert-large", "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b",
                   "llama3-70b", "llama3-405b", "mixtral-8x7b", "mixtral-8x22b", "gpt-22b",
                   "gpt-530b", "gpt-1t", "gpt-1p7b", "gpt-1008b"]


def test_catalog_has_the_named_entries():
    assert set(REQUIRED_MODELS) <= set(list_names("models"))
    assert {"a100-sxm-80gb", "h100-sxm-80gb", "h200-sxm-141gb", "b200-sxm-180gb", "tpu-v4",
            "mi300x"} <= set(list_names("accelerators"))
    assert {"nest-tpuv4-fattree", "nest-h100-spineleaf", "selene-a100-hdr", "dgx-h100-ndr",
            "meta-h100-roce-7to1", "gb200-nvl72-ndr", "gb300-nvl72-xdr",
            "dgx-b300-xdr"} <= set(list_names("clusters"))


def test_nvl72_racks_keep_a_64_way_expert_group_on_nvlink():
    """On GB200 NVL72 racks (64 GPUs of each as NeMo's launcher places jobs) an expert-parallel
    group of 64 shares one NVLink domain; on 8-GPU DGX B200 nodes it spans 8 of them."""
    from nestplan.placement import layouts
    from nestplan.specs import Parallelism

    par = Parallelism(tp=1, pp=4, dp=64, ep=64, etp=1, mbs=1)
    rack = layouts(par, get_cluster("gb200-nvl72-ndr"), 256).ep
    nodes = layouts(par, get_cluster("dgx-b200-ndr"), 256).ep
    assert rack.k[0] == 64 and nodes.k[0] == 8  # members sharing the innermost (NVLink) block
    assert get_cluster("gb200-nvl72-ndr").accelerator.name == "gb200"
    assert get_cluster("gb300-nvl72-xdr").levels[1].bandwidth == 100e9  # ConnectX-8, 800 Gb/s


@pytest.mark.parametrize("kind", KINDS)
def test_every_entry_loads(kind):
    for name in list_names(kind):
        assert get(kind, name).name


@pytest.mark.parametrize("kind,name", [("stacks", "nemo"), ("stacks", "torchtitan-float8-asynctp"),
                                       ("models", "gpt-oss-120b"), ("models", "deepseek-v3"),
                                       ("clusters", "gb200-nvl72-ndr"),
                                       ("accelerators", "b200-sxm-180gb")])
def test_list_name_prints_a_file_that_loads_as_the_same_entry(kind, name, tmp_path):
    """``nestplan list KIND NAME`` shows every field of an entry (a stack's bases resolved) as a
    file of its kind: loaded back from that file it is the same spec."""
    from console import cli

    code, out, err = cli("list", kind, name)
    assert code == 0 and err == "", err
    assert out.startswith(f"# {kind[:-1]} {name}, every field")
    # a catalog stack's runs_source too: the runs validate puts on it (it had been left out)
    assert ("\nruns_source = [" in out) is (kind == "stacks")
    path = tmp_path / "mine.toml"
    path.write_text(out)
    assert get(kind, str(path)) == get(kind, name)
    # where each figure's source is: the entry's catalog file, and its bases' (a buyer's trial
    # found the listing without them)
    import tomllib

    sources = out.splitlines()[1]
    own = Path(sources.split()[5])
    assert sources.startswith("# sources: the comments of ") and own.is_file()
    assert own.parts[-3:] == ("catalog", kind, f"{name}.toml")
    assert (" and of its bases' " in sources) is ("base" in tomllib.loads(own.read_text()))
    if kind == "models":  # its norms' epsilon, the default one too (an auditor's: it was left out)
        assert f"\nnorm_eps = {get_model(name).norm_eps!r}\n" in out


@pytest.mark.parametrize("name,billions", [("gpt3-175b", 174.6), ("llama2-7b", 6.74),
                                           ("llama2-70b", 68.98), ("llama3-8b", 8.03),
                                           ("llama3-70b", 70.55), ("llama3-405b", 405.85),
                                           ("mixtral-8x7b", 46.70), ("mixtral-8x22b", 140.6),
                                           ("bert-large", 0.335)])
def test_parameter_counts_match_published_sizes(name, billions):
    assert G.total_params(get_model(name)) / 1e9 == pytest.approx(billions, rel=0.01)


def test_paper_setups_use_gib():
    c = get_cluster("nest-h100-spineleaf")
    assert [lv.bandwidth for lv in c.levels] == [900 * 2**30, 12.5 * 2**30, 50 * 2**30]
    assert c.accelerator.hbm_bytes == 90 * 2**30
    assert get_cluster("nest-tpuv4-fattree").accelerator.hbm_bytes == 64 * 2**30
    assert [lv.size for lv in c.levels] == [8, 4, None]


def test_oversubscribed_clos():
    c = get_cluster("meta-h100-roce-7to1")
    assert c.levels[-1].oversubscription == 7.0
    assert c.max_devices == 8 * 2 * 192 * 8


def test_hf_configs_in_shared_data(shared):
    for path in sorted((shared / "data" / "hf_configs").glob("*.json")):
        m = get_model(str(path))
        ref = get_model(path.stem)
        assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.vocab, m.norm_eps) == (
            ref.layers, ref.hidden, ref.heads, ref.kv_heads, ref.ffn_hidden, ref.vocab, ref.norm_eps)
        assert (m.moe is None) == (ref.moe is None)


@pytest.mark.parametrize("name, config", [
    ("deepseek-v3", "deepseek-v3.json"), ("qwen3-30b-a3b", "qwen3-30b-a3b.json"),
    ("qwen3-235b-a22b", "qwen3-235b-a22b.json"), ("kimi-k2", "hf/kimi-k2.json"),
    ("gpt-oss-120b", "hf/gpt-oss-120b.json"), ("llama4-maverick", "hf/llama4-maverick.json")])
def test_catalog_models_read_from_a_config_hold_what_it_says(name, config):
    """A catalog model written from a shipped config.json is the model the HuggingFace loader
    reads from it (but its name and what the loader cannot know: the config's name, and the
    QK norms a modelling code hard-codes, both set in the catalog file)."""
    ours = get_model(name)
    theirs = replace(get_model(str(DATA / config)), name=ours.name, qk_norm=ours.qk_norm)
    assert ours == theirs


def test_deepseek_v3_family():
    cfg = json.loads((DATA / "deepseek-v3.json").read_text())
    m = model_from_hf_dict(cfg)
    assert m.mla is not None and m.moe.shared_experts == 1 and m.num_moe_layers == 58
    assert m.mtp_layers == 1  # its MTP module: tests/test_mtp.py
    m = replace(m, mtp_layers=0)
    # 671B total, 37B active (DeepSeek-V3 report, without the MTP module)
    assert G.total_params(m) / 1e9 == pytest.approx(671, rel=0.01)
    assert G.active_params(m) / 1e9 == pytest.approx(37.6, rel=0.02)


def test_qwen3_moe_and_other_families():
    qwen = model_from_hf_dict({"model_type": "qwen3_moe", "hidden_size": 2048,
                               "num_hidden_layers": 48, "num_attention_heads": 32,
                               "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128,
                               "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                               "decoder_sparse_step": 1, "mlp_only_layers": [],
                               "intermediate_size": 6144, "vocab_size": 151936})
    assert G.total_params(qwen) / 1e9 == pytest.approx(30.5, rel=0.02)
    gpt2 = model_from_hf_dict({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                               "n_inner": None, "n_positions": 1024, "vocab_size": 50257})
    assert gpt2.ffn_hidden == 3072 and gpt2.tied_embeddings
    assert G.total_params(gpt2) / 1e6 == pytest.approx(124.4, rel=0.01)
    bloom = model_from_hf_dict({"model_type": "bloom", "n_layer": 70, "n_embed": 14336,
                                "num_attention_heads": 112, "vocab_size": 250880})
    assert G.total_params(bloom) / 1e9 == pytest.approx(176.2, rel=0.01)
    neox = model_from_hf_dict({"model_type": "gpt_neox", "num_hidden_layers": 44,
                               "hidden_size": 6144, "num_attention_heads": 64,
                               "intermediate_size": 24576, "vocab_size": 50432,
                               "rotary_pct": 0.25})
    assert G.total_params(neox) / 1e9 == pytest.approx(20.55, rel=0.01)
    for family in ("qwen2", "qwen3", "mistral", "mixtral", "llama"):
        assert family in FAMILIES


def test_unsupported_model_type_lists_supported(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(SpecError, match="supported model types: bloom, deepseek_v2, deepseek_v3"):
        get_model(str(p))


def test_missing_hf_key_is_named():
    with pytest.raises(SpecError, match="num_hidden_layers"):
        model_from_hf_dict({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2})


def test_cluster_toml_rejects_unknown_key(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('name = "x"\naccelerator = "h100-sxm-80gb"\nbandwith = 3\n'
                 '[[levels]]\nname = "n"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = 2\n')
    with pytest.raises(SpecError, match="cluster.bandwith: .*unknown key; valid keys"):
        get_cluster(str(p))


def test_cluster_toml_inline_accelerator(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('name = "mine"\n[accelerator]\nname = "chip"\npeak_tflops_bf16 = 100\n'
                 'hbm_GiB = 16\nhbm_GBps = 800\nmatmul_efficiency_bf16_by_GFLOP = [[1, 0.5]]\n'
                 'attention_efficiency = [0.5, 0.4]\nmemory_efficiency = 0.8\n'
                 '[[levels]]\nname = "n"\nsize = 4\nbandwidth_GBps = 100\nlatency_us = 2\n'
                 '[[levels]]\nname = "net"\nbandwidth_GBps = 25\nlatency_us = 10\n'
                 'oversubscription = 2.0\n')
    c = get_cluster(str(p))
    assert c.accelerator.peak_flops_bf16 == 100e12 and c.levels[1].oversubscription == 2.0
    # no efficiency has a default in code: a file without one says which key is missing
    q = tmp_path / "without.toml"
    q.write_text(p.read_text().replace("memory_efficiency = 0.8\n", ""))
    with pytest.raises(SpecError, match="memory_efficiency"):
        get_cluster(str(q))


@pytest.mark.parametrize("body,field", [
    ('size = 0\nbandwidth_GBps = 450\nlatency_us = 2', "size"),
    ('size = 8\nbandwidth_GBps = -1\nlatency_us = 2', "bandwidth_GBps"),
    ('size = 8\nbandwidth_GBps = 1\nlatency_us = 2\noversubscription = 0.5', "oversubscription"),
    ('size = 8\nlatency_us = 2', "bandwidth_GBps"),
    ('size = "8"\nbandwidth_GBps = 1\nlatency_us = 2', "size"),
])
def test_bad_level_values_name_the_field(tmp_path, body, field):
    p = tmp_path / "c.toml"
    p.write_text(f'name = "x"\naccelerator = "h100-sxm-80gb"\n[[levels]]\nname = "n"\n{body}\n')
    with pytest.raises(SpecError, match=field):
        get_cluster(str(p))


def test_malformed_toml_is_a_spec_error(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        get_cluster(str(p))


def test_a_cluster_file_reads_its_accelerator_file_beside_it(tmp_path, monkeypatch):
    """``accelerator = "chip.toml"`` (and an inline accelerator's ``base``) is relative to the
    cluster file, as a stack's or an accelerator's ``base`` is, not to the working directory."""
    (tmp_path / "hw").mkdir()
    (tmp_path / "hw" / "chip.toml").write_text('base = "h100-sxm-80gb"\nname = "chip"\n'
                                               'hbm_GiB = 40\n')
    levels = '[[levels]]\nname = "n"\nsize = 8\nbandwidth_GBps = 450\nlatency_us = 2\n'
    (tmp_path / "hw" / "c.toml").write_text(f'name = "c"\naccelerator = "chip.toml"\n{levels}')
    (tmp_path / "hw" / "d.toml").write_text(f'name = "d"\n{levels}[accelerator]\n'
                                            'base = "chip.toml"\nname = "chip2"\n')
    monkeypatch.chdir(tmp_path)  # chip.toml is not here
    for cluster, chip in (("c", "chip"), ("d", "chip2")):
        acc = get_cluster(f"hw/{cluster}.toml").accelerator
        assert acc.name == chip and acc.hbm_bytes == 40 * 2**30


def test_a_changed_accelerator_is_not_named_as_its_base(tmp_path):
    """A cluster's inline accelerator that changes its base and gives no name of its own is
    named for the change (a user trial's 141 GiB H100 had printed as h100-sxm-80gb); one that
    changes nothing, or names itself, keeps that name."""
    levels = '[[levels]]\nname = "nvlink"\nbandwidth_GBps = 450\nlatency_us = 3\nsize = 8\n'
    path = tmp_path / "c.toml"
    path.write_text('name = "c"\naccelerator = { base = "h100-sxm-80gb", hbm_GiB = 141 }\n'
                    + levels)
    acc = get_cluster(str(path)).accelerator
    assert acc.name == "h100-sxm-80gb with hbm_GiB 141" and acc.hbm_bytes == 141 * 2**30
    path.write_text('name = "c"\naccelerator = { base = "h100-sxm-80gb", hbm_GiB = 141, '
                    'attention_efficiency = [0.5, 0.4] }\n' + levels)
    assert get_cluster(str(path)).accelerator.name == (
        "h100-sxm-80gb with its attention_efficiency, hbm_GiB 141")
    path.write_text('name = "c"\naccelerator = { base = "h100-sxm-80gb" }\n' + levels)
    assert get_cluster(str(path)).accelerator.name == "h100-sxm-80gb"
