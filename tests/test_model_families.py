"""The MoE model families people train in 2025-26, from their real config.json files
(tests/data/hf/, sources in tests/data/hf/SOURCES.md), and the catalog entries made from them."""

import json
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.catalog import get_model
from nestplan.errors import SpecError
from nestplan.graph import active_params, total_params
from nestplan.hf import model_from_hf_config, model_from_hf_dict
from nestplan.loaders import model_from_table, model_to_table

from conftest import SHARED
from console import cli, one_line_error

SHARED_HF = SHARED / "data" / "hf_configs"

HF = Path(__file__).parent / "data" / "hf"
DATA = Path(__file__).parent / "data"

# total and active parameters as the model cards state them, in billions
PUBLISHED = {
    "kimi-k2.json": (1040, 32),  # MoonshotAI/Kimi-K2 README: 1T total, 32B activated
    "gpt-oss-120b.json": (116.8, 5.1),  # openai gpt-oss model card: 116.8B total, 5.1B active
    "llama4-maverick.json": (400, 17),  # Meta Llama 4 model card: 400B total, 17B active
    "glm4.5.json": (106, 12),  # zai-org GLM-4.5 README: GLM-4.5-Air 106B total, 12B active
    "qwen2-moe.json": (57, 14),  # Qwen2 report: Qwen2-57B-A14B
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_sizes_match_the_model_cards(name):
    # the cards count the main model without its multi-token-prediction depths (DeepSeek-V3's:
    # 671B main model and 14B MTP module; GLM-4.5-Air's 106B is its main model)
    m = replace(model_from_hf_config(HF / name), mtp_layers=0)
    total, active = PUBLISHED[name]
    assert total_params(m) / 1e9 == pytest.approx(total, rel=0.03)
    # nestplan counts the input embedding as active (gpt-oss's card does not: +0.6B)
    assert active_params(m) / 1e9 == pytest.approx(active, rel=0.15)


@pytest.mark.parametrize("name, total, active", [
    ("gpt-oss-120b.json", 116.83, 5.13), ("gpt-oss-20b.json", 20.91, 3.61)])
def test_gpt_oss_sizes_match_their_card(name, total, active):
    """OpenAI's gpt-oss model card (arXiv 2508.10925, Table 1) counts 116.83B / 20.91B parameters
    and 5.13B / 3.61B active per token, the unembedding active and the embedding not."""
    m = model_from_hf_config(HF / name)
    assert total_params(m) / 1e9 == pytest.approx(total, abs=0.005)
    embedding = m.vocab * m.hidden
    assert (active_params(m) - embedding) / 1e9 == pytest.approx(active, abs=0.005)
    # and says so (an HF trial compared its 4.2B with the card's 3.61B)
    code, out, err = cli("list", "models", HF / name)
    assert code == 0, err
    assert f"{active_params(m) / 1e9:.1f}B active with the embedding" in out


def test_families_read_what_makes_them_differ():
    llama4 = model_from_hf_config(HF / "llama4-maverick.json")
    assert [llama4.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert llama4.moe.shared_experts == 1 and llama4.ffn_hidden == 16384
    assert (llama4.local_span, llama4.local_share) == (8192, 0.75)  # NoPE every 4th block
    oss = model_from_hf_config(HF / "gpt-oss-120b.json")
    assert (oss.local_span, oss.local_share) == (256, 0.5) and oss.bias and oss.attention_sinks
    # biases on q, k, v only (each family's modelling code; counted in tests/test_hf_models.py)
    qwen2 = model_from_hf_config(HF / "qwen2-moe.json")
    assert qwen2.moe.shared_ffn_hidden == 20480 and qwen2.moe.shared_expert_gate
    assert qwen2.qkv_bias and not qwen2.bias
    glm = model_from_hf_config(HF / "glm4.5.json")
    assert glm.moe.first_dense_layers == 1 and glm.moe.shared_experts == 1
    assert glm.qkv_bias and not glm.bias and not glm.moe.shared_expert_gate
    assert glm.rope_fraction == 0.5  # partial_rotary_factor: RoPE on half of each head
    kimi = model_from_hf_config(HF / "kimi-k2.json")
    assert kimi.mla is not None and kimi.moe.experts == 384
    # QK norms: Qwen3 always (its modelling code, not its config), GLM-4.5 as use_qk_norm says
    assert model_from_hf_config(DATA / "qwen3-30b-a3b.json").qk_norm
    assert not glm.qk_norm and not llama4.qk_norm and not kimi.qk_norm
    data = json.loads((HF / "glm4.5.json").read_text())
    assert model_from_hf_dict({**data, "use_qk_norm": True}).qk_norm


SMALL = {"num_hidden_layers": 32, "hidden_size": 256, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000}


@pytest.mark.parametrize("extra, span, share", [
    ({"model_type": "mistral", "sliding_window": 4096}, 8192, 1.0),  # Mistral 7B v0.1
    ({"model_type": "mistral", "sliding_window": None}, 0, 0.0),  # v0.2 and later
    ({"model_type": "mistral"}, 8192, 1.0),  # MistralConfig's default window: 4,096
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
      "sliding_window": None}, 0, 0.0),
    ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2,
      "sliding_window": 1024}, 2048, 1.0),
    ({"model_type": "qwen2", "sliding_window": 4096}, 0, 0.0),  # use_sliding_window is false
    ({"model_type": "qwen2", "use_sliding_window": True}, 8192, 4 / 32),  # layers 28-31
    ({"model_type": "qwen3", "use_sliding_window": True, "sliding_window": 1024,
      "max_window_layers": 16}, 2048, 0.5),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 1024,
      "layer_types": ["sliding_attention", "full_attention"] * 16}, 2048, 0.5),
    ({"model_type": "qwen2", "use_sliding_window": True, "sliding_window": None}, 0, 0.0),
    ({"model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 64, "use_sliding_window": True, "max_window_layers": 16},
     8192, 1.0),  # Qwen3-MoE: every layer
    ({"model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 64, "use_sliding_window": True, "max_window_layers": 16},
     8192, 8 / 32),  # Qwen2-MoE: every other layer below max_window_layers (layers 0, 2, ... 14)
    ({"model_type": "mistral", "sliding_window": 1024,  # Mistral: every layer, types aside
      "layer_types": ["full_attention"] * 32}, 2048, 1.0),
    ({"model_type": "llama", "sliding_window": 4096}, 0, 0.0),  # Llama has none
])
def test_sliding_windows_are_read_as_each_family_sets_them(extra, span, share):
    """Sliding-window attention as transformers' configs define it per family (an unread
    ``sliding_window`` had left Mistral 7B v0.1 costed with full attention at 32K tokens)."""
    m = model_from_hf_dict({**SMALL, **extra})
    assert (m.local_span, m.local_share) == (span, pytest.approx(share))


@pytest.mark.parametrize("extra, span, share", [
    ({"sliding_window": 64}, 128, 1.0),
    ({"sliding_window": 64, "local_layers": [0, 2]}, 128, 0.5),
    ({}, 0, 0.0)])
def test_a_model_files_window_costs_as_its_layers_say(extra, span, share):
    """A model file gives its window and, where not every layer has it, the windowed layers; the
    cost's span and share follow (a file had to restate them as local_span and local_share, which
    the README does not name: a fifth fuzzing round's)."""
    table = {"name": "w", "layers": 4, "hidden": 256, "heads": 4, "ffn_hidden": 512,
             "vocab": 1000, **extra}
    m = model_from_table(table)
    assert (m.local_span, m.local_share, list(m.local_layers)) == (
        span, share, extra.get("local_layers", []))
    assert model_from_table(model_to_table(m)) == m


def test_gpt_oss_without_its_window_and_rope_keys_reads_as_transformers_defaults_them():
    """GptOssConfig's defaults: a 128-token window on every other layer, from the first, and
    YaRN with a context extension of 32; the shipped config spells out the same."""
    data = json.loads((HF / "gpt-oss-120b.json").read_text())
    bare = {k: v for k, v in data.items() if k not in ("sliding_window", "layer_types",
                                                         "rope_scaling")}
    full, default = model_from_hf_dict(data), model_from_hf_dict(bare)
    assert (default.local_span, default.local_share) == (full.local_span, full.local_share)
    assert default.rope_mscale == pytest.approx(full.rope_mscale)
    odd = model_from_hf_dict({**bare, "num_hidden_layers": 35})
    assert odd.local_share == pytest.approx(18 / 35)  # layers 0, 2, ..., 34


def test_llama4_reads_its_l2_qk_norms_and_chunks_as_transformers_defaults_them():
    """Llama 4's ``use_qk_norm`` (Scout true, Maverick false, true when absent) is its weightless
    L2 norm of queries and keys, ``qk_l2_norm``; an absent ``attention_chunk_size`` is 8,192
    tokens and a null one none (Llama4TextConfig). The L2 norms cost what the QK RMSNorms do,
    and a model file keeps them."""
    from nestplan.evaluate import layer_graph, scenario_from_names
    from nestplan.specs import Parallelism

    data = json.loads((HF / "llama4-maverick.json").read_text())
    text = data["text_config"]
    assert not model_from_hf_config(HF / "llama4-maverick.json").qk_l2_norm
    scout = model_from_hf_dict({**data, "text_config": {**text, "use_qk_norm": True}})
    assert scout.qk_l2_norm and not scout.qk_norm and scout.qk_normed
    bare = {k: v for k, v in text.items() if k not in ("use_qk_norm", "attention_chunk_size")}
    default = model_from_hf_dict({**data, "text_config": bare})
    assert default.qk_l2_norm and default.local_span == 8192
    unchunked = model_from_hf_dict({**data, "text_config": {**text, "attention_chunk_size": None}})
    assert (unchunked.local_span, unchunked.local_share) == (0, 0.0)
    assert not model_from_hf_dict({**data, "text_config": {**text, "use_qk_norm": None}}).qk_l2_norm
    # an empty no_rope_layers is the default pattern, as Llama4TextConfig takes it (a mirror of
    # Scout ships one; a user trial's config had been refused)
    empty = model_from_hf_dict({**data, "text_config": {**text, "no_rope_layers": []}})
    assert empty.local_layers == model_from_hf_config(HF / "llama4-maverick.json").local_layers
    # weightless: the L2 norms add no parameters, the RMSNorms two per head dimension a layer
    rms = replace(scout, qk_l2_norm=False, qk_norm=True)
    assert total_params(scout) == total_params(replace(scout, qk_l2_norm=False))
    assert total_params(rms) - total_params(scout) == 2 * scout.head_dim * scout.layers
    assert model_from_table(model_to_table(scout)) == scout
    sc = scenario_from_names("llama4-maverick", "dgx-h100-ndr", 64, seq_len=8192, global_batch=64)
    par = Parallelism(tp=4, pp=1, dp=16, ep=16, etp=1, sp=True)
    l2 = layer_graph(scout, par, sc.training, sc.stack)
    rms = layer_graph(replace(scout, qk_l2_norm=False, qk_norm=True), par, sc.training, sc.stack)
    assert l2.moe.ops == rms.moe.ops and l2.moe.saved_bytes == rms.moe.saved_bytes


@pytest.mark.parametrize("keys", [{"no_rope_layer_interval": 3}, {"no_rope_layer_interval": 1},
                                  {"layer_types": ["chunked_attention", "full_attention"] * 24},
                                  {"moe_layers": [1, 2, 30]}, {"moe_layers": list(range(0, 48, 3))}])
def test_llama4_places_chunks_and_experts_as_its_config_class_does(keys):
    """``no_rope_layer_interval``, ``layer_types`` and ``moe_layers``, which nestplan had not
    read: the chunked layers are those ``layer_types`` names, filled in from the RoPE layers,
    and the MoE blocks those ``moe_layers`` lists (Llama4TextConfig; its model picks each layer's
    mask, RoPE and MLP from them)."""
    transformers = pytest.importorskip("transformers")
    data = json.loads((HF / "llama4-maverick.json").read_text())
    text = {**data["text_config"], **keys}
    config = transformers.Llama4TextConfig(**{k: v for k, v in text.items() if k != "model_type"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = model_from_hf_dict({**data, "text_config": text})
    chunked = [i for i, t in enumerate(config.layer_types) if t == "chunked_attention"]
    assert list(model.local_layers) == chunked
    assert model.local_share == pytest.approx(len(chunked) / 48)
    assert [i for i in range(48) if model.is_moe_layer(i)] == sorted(config.moe_layers)
    # a note where the masks and RoPE part ways (the Megatron export ties them)
    rope = [i for i in range(48) if config.no_rope_layers[i]]
    assert any("layer_types" in str(w.message) for w in caught) == (chunked != rope)
    assert model_from_table(model_to_table(model)) == model


def test_a_model_file_lists_its_moe_blocks(tmp_path):
    """``[moe] layers`` (Llama 4's ``moe_layers``, Qwen's ``mlp_only_layers``): a model file
    names the MoE blocks where they follow no pattern; wrong lists are refused, one line each."""
    from nestplan.tomlfmt import document

    table = {**model_to_table(get_model("llama4-maverick")), "name": "maverick-moe-at-0-7-9"}
    table["moe"] = {**table["moe"], "first_dense_layers": 0, "layer_freq": 1, "layers": [0, 7, 9]}
    model = model_from_table(table)
    assert [i for i in range(model.layers) if model.is_moe_layer(i)] == [0, 7, 9]
    path = tmp_path / "m.toml"
    run = ("evaluate", "--model", path, "--cluster", "dgx-h100-ndr", "--gpus", 64, "--tp", 4,
           "--pp", 1, "--ep", 8, "--mbs", 1, "--global-batch", 64, "--seq-len", 4096)
    path.write_text(document(table))
    code, _, err = cli(*run)
    assert code == 0, err
    for moe, words in (({"layers": [9, 7]}, "once each, in order"),
                       ({"layers": [3, 48]}, "whole numbers in [0, 48)"),
                       ({"layers": [1.5]}, "must list layer indices"),
                       ({"layers": [1, 3], "layer_freq": 2}, "not both"),
                       ({"layers": []}, "lists no MoE block")):
        path.write_text(document({**table, "moe": {**table["moe"], **moe}}))
        assert one_line_error(*cli(*run), "moe.layers"), moe
        assert words in cli(*run)[2], moe


def test_local_attention_costs_less_at_long_sequences():
    oss = model_from_hf_config(HF / "gpt-oss-120b.json")
    full = oss.without_local_attention()
    from nestplan.evaluate import model_flops_per_sequence

    short = model_flops_per_sequence(oss, 256, 0) / model_flops_per_sequence(full, 256, 0)
    long = model_flops_per_sequence(oss, 65536, 0) / model_flops_per_sequence(full, 65536, 0)
    assert short == pytest.approx(1.0) and long < 0.8


@pytest.mark.parametrize("name, config", [
    ("deepseek-v3", DATA / "deepseek-v3.json"), ("qwen3-235b-a22b", DATA / "qwen3-235b-a22b.json"),
    ("qwen3-30b-a3b", DATA / "qwen3-30b-a3b.json"), ("kimi-k2", HF / "kimi-k2.json"),
    ("gpt-oss-120b", HF / "gpt-oss-120b.json"), ("llama4-maverick", HF / "llama4-maverick.json")])
def test_catalog_entries_are_their_configs(name, config):
    table = model_to_table(get_model(name))
    mine = model_to_table(model_from_hf_config(config))
    assert {**table, "name": None} == {**mine, "name": None}


def test_an_unknown_model_type_is_read_by_its_architecture(tmp_path):
    data = json.loads((HF / "kimi-k2.json").read_text())
    data["model_type"] = "kimi_k3"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    code, out, err = cli("evaluate", "--model", path, "--cluster", "dgx-h100-ndr", "--gpus", 256,
                         "--tp", 8, "--pp", 8, "--ep", 32, "--etp", 1, "--sp", "--mbs", 1,
                         "--global-batch", 256, "--seq-len", 4096, "--recompute", "full",
                         "--moe-imbalance", 1, "--json")  # (no balanced-routing note)
    assert code == 0, err
    said = [line for line in err.strip().splitlines() if "host wait (" not in line]  # (its MoE
    assert "note:" in err and "read as deepseek_v3" in err and len(said) == 1  # layers' wait)
    data["architectures"] = ["KimiK3ForCausalLM"]
    path.write_text(json.dumps(data))
    assert one_line_error(*cli("evaluate", "--model", path, "--cluster", "dgx-h100-ndr",
                               "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8,
                               "--seq-len", 2048), "model_type: got 'kimi_k3'; supported")


@pytest.mark.parametrize("name, key", [("gpt-oss-120b.json", "num_local_experts"),
                                       ("qwen2-moe.json", "moe_intermediate_size"),
                                       ("glm4.5.json", "n_routed_experts")])
def test_a_config_missing_a_moe_key_is_one_line(tmp_path, name, key):
    data = json.loads((HF / name).read_text())
    del data[key]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert one_line_error(*cli("evaluate", "--model", path, "--cluster", "dgx-h100-ndr",
                               "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8,
                               "--seq-len", 2048), f"{key}: missing key")


def test_top_k_beyond_the_experts_is_bad_input():
    data = json.loads((HF / "qwen2-moe.json").read_text())
    data["num_experts_per_tok"] = 65
    with pytest.raises(SpecError, match="num_experts_per_tok: got 65; must be <= moe.experts = 64"):
        model_from_hf_dict(data)


@pytest.mark.parametrize("change, needle", [
    ({"num_attention_heads": 0}, "num_attention_heads: got 0; must be an integer >= 1"),
    ({"model_type": ["llama"], "architectures": []}, "model_type: got ['llama']; must be a string"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step: got 0; must be an integer >= 1"),
    ({"mlp_only_layers": "0"}, "mlp_only_layers: got '0'; must list layer indices"),
])
def test_bad_config_values_are_one_line(tmp_path, change, needle):
    data = {**json.loads((HF / "qwen2-moe.json").read_text()), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    assert one_line_error(*cli("evaluate", "--model", path, "--cluster", "dgx-h100-ndr",
                               "--gpus", 8, "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8,
                               "--seq-len", 2048), needle)


def test_a_model_folder_reads_its_config_json(tmp_path):
    """A downloaded HuggingFace model is a folder: --model takes it as its config.json."""
    import shutil
    from dataclasses import replace

    from nestplan.catalog import get_model

    shutil.copy(HF / "gpt-oss-20b.json", tmp_path / "config.json")
    folder, file = get_model(str(tmp_path)), get_model(str(tmp_path / "config.json"))
    assert folder == replace(file, name=folder.name)
    assert folder.layers == 24 and folder.moe.experts == 32
    # an edited config.json is read again (the folder's own time does not change with it)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(num_hidden_layers=12, layer_types=cfg["layer_types"][:12])
    (tmp_path / "config.json").write_text(json.dumps(cfg, indent=4))
    assert get_model(str(tmp_path)).layers == 12


def test_a_runs_csv_may_name_a_model_folder(tmp_path, runs_csv, shared):
    """A runs CSV's model column (with layers blank) takes a model folder too, relative to it."""
    import shutil

    from nestplan.validation import load_cases

    (tmp_path / "llama").mkdir()
    shutil.copy(shared / "data" / "hf_configs" / "llama3-8b.json", tmp_path / "llama" / "config.json")
    path = runs_csv(model="./llama", layers="", hidden="", heads="", kv_heads="", ffn_hidden="",
                    vocab="")
    case, = load_cases(Path(path))
    assert case.scenario.model.layers == 32 and case.scenario.model.hidden == 4096


@pytest.mark.parametrize("path", sorted(HF.glob("*.json")), ids=lambda p: p.name)
def test_every_shipped_config_survives_a_model_table(path):
    """What a plan file writes of a model (biases, gates, sinks, norms ...) reads back the same."""
    model = model_from_hf_config(path)
    assert model_from_table(model_to_table(model)) == model


def test_partial_rotary_embeddings_are_read_and_kept():
    """RoPE on a share of each head: GPT-NeoX's ``rotary_pct`` (0.25 when absent), GLM's
    ``partial_rotary_factor``, or either under transformers v5's ``rope_parameters``; kept for
    the export (``--rotary-percent``), refused outside (0, 1]."""
    neox = {"model_type": "gpt_neox", "num_hidden_layers": 2, "hidden_size": 256,
            "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 1000}
    assert model_from_hf_dict(neox).rope_fraction == 0.25
    assert model_from_hf_dict({**neox, "rotary_pct": 0.5}).rope_fraction == 0.5
    nested = {**neox, "rope_parameters": {"partial_rotary_factor": 1.0}}
    assert model_from_hf_dict(nested).rope_fraction == 1.0
    # both given: rope_parameters' wins, as transformers' standardize_rope_params keeps it
    assert model_from_hf_dict({**nested, "partial_rotary_factor": 0.5}).rope_fraction == 1.0
    with pytest.raises(SpecError, match=r"rotary_pct: got 1.5; must be in \(0, 1\]"):
        model_from_hf_dict({**neox, "rotary_pct": 1.5})
    with pytest.raises(SpecError, match=r"rope_parameters.partial_rotary_factor: got 0; must be in"):
        model_from_hf_dict({**neox, "rope_parameters": {"partial_rotary_factor": 0}})
    model = model_from_hf_dict(neox)
    assert model_from_table(model_to_table(model)) == model


def test_a_rope_scaling_not_kept_is_named():
    """Dynamic NTK and LongRoPE scalings are not kept: a note says the exports run plain RoPE
    (they had been dropped without a word); Llama 3.1's is kept."""
    import warnings

    from nestplan.errors import Note

    llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000,
             "max_position_embeddings": 8192}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = model_from_hf_dict({**llama, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    assert m.rope_scaling is None
    assert any(issubclass(w.category, Note) and "'dynamic' RoPE scaling is not kept" in
               str(w.message) for w in caught)
    m = model_from_hf_dict({**llama, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}})
    assert (m.rope_scaling.kind, m.rope_scaling.original_max_positions) == ("llama3", 8192)
    assert model_from_table(model_to_table(m)) == m


@pytest.mark.parametrize("family, given, qkv, every, said", [
    ("llama", "attention_bias", True, False, "read as biases on q, k and v"),
    ("llama", "mlp_bias", False, True, "read as biases on every linear layer"),
    ("qwen3_moe", "attention_bias", True, False, "read as biases on q, k and v"),
    ("mixtral", "attention_bias", False, False, "ignored: Mixtral has no attention biases"),
    ("mistral", "attention_bias", False, False, "ignored: Mistral has no attention biases")])
def test_biases_are_read_as_megatron_bridge_maps_them_with_a_note(family, given, qkv, every,
                                                                   said):
    """transformers biases q, k, v and o with attention_bias and (Llama) the MLP with mlp_bias;
    Megatron-Bridge maps them to add_qkv_bias and add_bias_linear, which nestplan reads them as,
    with a note (a user trial: Qwen3-MoE, Mixtral and Llama 4's attention_bias had given every
    linear layer, experts included, biases; mlp_bias had once been ignored without a word)."""
    import warnings

    from nestplan.errors import Note

    cfg = {"model_type": family, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
           "vocab_size": 1000, given: True}
    if family not in ("llama", "mistral"):
        cfg.update(num_local_experts=4, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = model_from_hf_dict(cfg)
    assert (m.qkv_bias, m.bias) == (qkv, every)
    assert any(issubclass(w.category, Note) and f"{given}: {said}" in str(w.message)
               for w in caught)


def test_a_multimodal_configs_language_model_gives_its_epsilon_and_balancing_loss():
    """Llama 4's config.json holds its language model under text_config: the norms' epsilon and
    the balancing loss are read there too (a reviewer found a text_config epsilon of 0.5 read as
    the default 1e-5)."""
    data = json.loads((Path(__file__).parent / "data" / "hf" / "llama4-maverick.json").read_text())
    data["text_config"].update(rms_norm_eps=1e-6, router_aux_loss_coef=0.01)
    m = model_from_hf_dict(data)
    assert (m.norm_eps, m.moe.aux_loss) == (1e-6, 0.01)
    data["text_config"]["rms_norm_eps"] = 0.5
    with pytest.raises(SpecError, match="rms_norm_eps: got 0.5"):
        model_from_hf_dict(data)


def test_gpt_oss_reads_no_activation_its_code_ignores():
    """GPT-OSS's experts run their clamped GLU whatever hidden_act says: an activation nestplan
    does not model there is not refused."""
    data = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-oss-120b.json").read_text())
    assert model_from_hf_dict({**data, "hidden_act": "relu2"}) == model_from_hf_dict(data)


def test_gpt_oss_trains_without_the_balancing_loss_its_config_does_not_apply():
    """GPT-OSS's router_aux_loss_coef (0.9) is added by transformers only when output_router_logits
    is on, which its released config turns off, and Megatron-Bridge trains GPT-OSS without one:
    read as none, with a note (a user trial's export had trained with 0.9); a config that turns
    the logits on keeps it, and other families keep theirs."""
    data = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-oss-120b.json").read_text())
    assert data["router_aux_loss_coef"] == 0.9 and data["output_router_logits"] is False
    with pytest.warns(Warning, match="router_aux_loss_coef: 0.9 not read as a balancing loss"):
        assert model_from_hf_dict(data).moe.aux_loss == 0
    assert model_from_hf_dict({**data, "output_router_logits": True}).moe.aux_loss == 0.9
    mixtral = json.loads((SHARED_HF / "mixtral-8x7b.json").read_text())
    assert mixtral.get("output_router_logits") is False
    assert model_from_hf_dict(mixtral).moe.aux_loss == mixtral["router_aux_loss_coef"]


def test_a_deepseek_config_without_seq_aux_reads_its_classes_default():
    """DeepSeek's config class, which DeepSeek-V3's and Kimi-K2's repositories load, defaults
    seq_aux to true: a config that leaves it out trains the per-sequence loss, said in a note (a
    user trial's trimmed Kimi-K2 config had been read, and exported, as the per-token loss)."""
    data = json.loads((Path(__file__).parent / "data" / "hf" / "kimi-k2.json").read_text())
    assert model_from_hf_dict(data).moe.aux_loss_per_sequence
    trimmed = {k: v for k, v in data.items() if k != "seq_aux"}
    with pytest.warns(Warning, match="seq_aux: missing, read as DeepSeek's config class's default"):
        assert model_from_hf_dict(trimmed).moe.aux_loss_per_sequence
    assert not model_from_hf_dict({**data, "seq_aux": False}).moe.aux_loss_per_sequence
    # an explicit null is the class's None, which the model reads as false (a review's)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not model_from_hf_dict({**data, "seq_aux": None}).moe.aux_loss_per_sequence


def test_keys_a_family_does_not_read_are_ignored_as_transformers_ignores_them():
    """Mixtral windows every layer whatever layer_types says; Llama's epsilon is rms_norm_eps
    (layer_norm_eps is not its key); only Llama 4 reads a text_config, and only DeepSeek's
    families seq_aux; activation names are case-sensitive (a fuzzer found each read)."""
    hf = Path(__file__).parent / "data" / "hf"
    mixtral = json.loads((SHARED_HF / "mixtral-8x7b.json").read_text())
    layers = mixtral["num_hidden_layers"]
    windowed = model_from_hf_dict({**mixtral, "sliding_window": 4096,
                                   "layer_types": ["full_attention"] * layers, "seq_aux": True})
    assert windowed.local_layers == tuple(range(layers))
    assert not windowed.moe.aux_loss_per_sequence
    llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
             "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 1000}
    assert model_from_hf_dict({**llama, "layer_norm_eps": 1e-3}).norm_eps == 1e-6
    assert model_from_hf_dict({**llama, "text_config": {"rms_norm_eps": 1e-3}}).norm_eps == 1e-6
    with pytest.raises(SpecError, match="hidden_act: got 'SiLU'"):
        model_from_hf_dict({**llama, "hidden_act": "SiLU"})
    # Llama 4's head_dim in its text_config is its own (48 heads do not divide 5,120)
    data = json.loads((hf / "llama4-maverick.json").read_text())
    data["text_config"]["num_attention_heads"] = 48
    assert model_from_hf_dict(data).head_dim == 128


def test_an_unknown_model_type_is_read_by_the_architecture_that_names_a_family(tmp_path):
    """The note names the class it read the config by, not the list's first (which may be the
    user's own class, or not a name at all; a name with a newline had split the note)."""
    cfg = {"model_type": "my-llama", "architectures": ["My\nLlama", 3, "LlamaForCausalLM"],
           "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
           "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code, out, err = cli("evaluate", "--model", path, "--cluster", "dgx-h100-ndr", "--gpus", 8,
                         "--tp", 2, "--pp", 1, "--mbs", 1, "--global-batch", 16, "--seq-len", 2048)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "my-llama" in line]
    assert notes == [f"nestplan: note: {path}: model_type 'my-llama' is not one nestplan knows; "
                     "read as llama, the family of its architecture LlamaForCausalLM"], err
    assert all(line.startswith("nestplan: ") for line in err.splitlines()), err


def test_a_deepseek_moe_layer_period_counts_from_layer_zero():
    """DeepSeek's rule (its reference code, Kimi's, vLLM's): layer i is an MoE layer when i >=
    first_k_dense_replace and i % moe_layer_freq == 0. After 3 dense layers with a period of 2,
    layers 4, 6, 8 (the dense count had been taken as the period's offset: 3, 5, 7); a period
    of 1, every layer from the dense ones on, as published."""
    data = json.loads((DATA / "deepseek-v3.json").read_text())
    data = {**data, "num_hidden_layers": 9}
    moe = [i for i in range(9) if model_from_hf_dict({**data, "moe_layer_freq": 2}).is_moe_layer(i)]
    assert moe == [4, 6, 8]
    assert [i for i in range(9) if model_from_hf_dict(data).is_moe_layer(i)] == list(range(3, 9))


@pytest.mark.frameworks
def test_qwen2_moe_windows_sit_where_transformers_puts_them():
    """Qwen2-MoE's config class puts its default windows on every other layer below
    max_window_layers, not on the layers from it on as Qwen2's does (a user trial's): the
    windowed layers are those transformers' Qwen2MoeConfig names sliding."""
    pytest.importorskip("transformers")
    from transformers import Qwen2MoeConfig

    data = {**SMALL, "model_type": "qwen2_moe", "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64, "use_sliding_window": True, "max_window_layers": 16}
    hf = Qwen2MoeConfig(**{k: v for k, v in data.items() if k != "model_type"})
    want = [i for i, t in enumerate(hf.layer_types) if t == "sliding_attention"]
    assert want and list(model_from_hf_dict(data).local_layers) == want
