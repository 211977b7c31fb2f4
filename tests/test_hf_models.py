"""What nestplan reads from a HuggingFace config against transformers' own model code.

* Parameters: every config shipped with the tests, and each supported family's default config,
  built on the meta device (no memory, no weights) and counted. The counts must be equal, to the
  parameter. The one difference that is meant: nestplan pads the vocabulary as Megatron does
  (``graph.padded_vocab``); the padded rows are added to transformers' count. Multi-token
  prediction layers, which transformers does not build, are left out of nestplan's.
* FLOPs: each family at a small size runs one forward and backward on CPU under torch's
  ``FlopCounterMode``, with transformers' eager attention and eager experts (whose matmuls the
  counter sees), and must cost what nestplan's model FLOPs say, to the FLOP: attention unmasked,
  routed experts top-k per token. Local attention is set aside (transformers' eager attention
  computes the whole score matrix and masks it)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.graph import padded_vocab, total_params
from nestplan.hf import model_from_hf_dict

from conftest import SHARED

pytestmark = pytest.mark.frameworks

HERE = Path(__file__).parent
SHARED_CONFIGS = SHARED / "data" / "hf_configs"
SHIPPED = sorted([*(HERE / "data" / "hf").glob("*.json"), *(HERE / "data").glob("*.json"),
                  *SHARED_CONFIGS.glob("*.json")])
DEFAULTS = {"LlamaConfig": {}, "MistralConfig": {}, "MixtralConfig": {}, "Qwen2Config": {},
            "Qwen2MoeConfig": {}, "Qwen3Config": {}, "Qwen3MoeConfig": {}, "DeepseekV3Config": {},
            # (its class leaves the experts a token goes to unset, None)
            "DeepseekV2Config": {"num_experts_per_tok": 6},
            "GptOssConfig": {}, "Llama4TextConfig": {}, "GPTNeoXConfig": {},
            # its default 96 heads over 4,096 with no head_dim have no whole head width (refused)
            "Glm4MoeConfig": {"head_dim": 128}}


def transformers_count(data: dict) -> int:
    """Parameters of transformers' causal LM for ``data``, built on the meta device."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if data.get("model_type") == "kimi_k2":  # Kimi-K2 runs DeepSeek-V3's code (its architectures)
        data = {**data, "model_type": "deepseek_v3"}
    config = transformers.AutoConfig.for_model(**data)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def nestplan_count(data: dict) -> tuple[int, int]:
    """nestplan's count of the model ``data`` describes, and its padded vocabulary rows."""
    model = replace(model_from_hf_dict(data), mtp_layers=0)
    tables = 1 if model.tied_embeddings else 2
    return round(total_params(model)), tables * (padded_vocab(model.vocab, 1) - model.vocab) * model.hidden


def test_the_shared_configs_are_among_them():
    """../shared beside the checkout holds five of the configs (a missing folder would leave
    them out of the parameter check without a word)."""
    assert len(list(SHARED_CONFIGS.glob("*.json"))) >= 5, SHARED_CONFIGS


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_count_what_transformers_builds(path):
    data = json.loads(path.read_text())
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding


@pytest.mark.parametrize("name", DEFAULTS)
def test_default_configs_count_what_transformers_builds(name):
    """Each family's config as transformers defaults it (every key written out)."""
    transformers = pytest.importorskip("transformers")
    data = getattr(transformers, name)(**DEFAULTS[name]).to_dict()
    data.pop("dtype", None)
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding


SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, vocab_size=512, max_position_embeddings=256)
FEW_EXPERTS = dict(num_experts_per_tok=2, moe_intermediate_size=64)
FAMILIES = {
    "LlamaConfig": {}, "MistralConfig": {"sliding_window": None}, "Qwen2Config": {},
    "Qwen3Config": {}, "GPTNeoXConfig": {},
    "MixtralConfig": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "Qwen3MoeConfig": {"num_experts": 4, **FEW_EXPERTS},
    "Qwen2MoeConfig": {"num_experts": 4, "shared_expert_intermediate_size": 128, **FEW_EXPERTS},
    "DeepseekV3Config": {"n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
                         "n_group": 1, "topk_group": 1, "q_lora_rank": 64, "kv_lora_rank": 32,
                         "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
                         "num_key_value_heads": 4, "head_dim": 16, **FEW_EXPERTS},
    "DeepseekV2Config": {"n_routed_experts": 4, "n_shared_experts": 2, "first_k_dense_replace": 1,
                         "topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1,
                         "q_lora_rank": None, "kv_lora_rank": 32, "qk_nope_head_dim": 32,
                         "qk_rope_head_dim": 16, "v_head_dim": 32, "num_key_value_heads": 4,
                         **FEW_EXPERTS},
    "GptOssConfig": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32},
    "Glm4MoeConfig": {"n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1,
                      "n_group": 1, "topk_group": 1, **FEW_EXPERTS},
    "Llama4TextConfig": {"num_local_experts": 4, "num_experts_per_tok": 1,
                         "intermediate_size_mlp": 256, "interleave_moe_layer_step": 2},
}
SEQ = 64


@pytest.mark.parametrize("name", FAMILIES)
def test_small_models_cost_the_flops_transformers_runs(name):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from nestplan.evaluate import model_flops_per_sequence

    config = getattr(transformers, name)(**{**SMALL, **FAMILIES[name]}, attn_implementation="eager",
                                         experts_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).train()
    with FlopCounterMode(display=False) as counter:
        model(input_ids=torch.randint(0, SMALL["vocab_size"], (1, SEQ))).logits.sum().backward()
    data = config.to_dict()
    data.pop("dtype", None)
    model = replace(model_from_hf_dict(data).without_local_attention(), mtp_layers=0)
    if name == "Llama4TextConfig":
        # its eager MoE runs every expert on every token, scaled by the router's scores
        # (Llama4TextMoe.forward: hidden_states.repeat(num_experts, 1)): cost as top-k = experts
        model = replace(model, moe=replace(model.moe, top_k=model.moe.experts))
    assert model_flops_per_sequence(model, SEQ, 0) == counter.get_total_flops()


IRREGULAR = {  # MoE blocks that follow no (first dense layers, every N-th) pattern
    "Llama4TextConfig": {"num_local_experts": 4, "num_experts_per_tok": 1, "num_hidden_layers": 6,
                         "intermediate_size_mlp": 256, "moe_layers": [0, 1, 4]},
    "Qwen3MoeConfig": {"num_experts": 4, "num_hidden_layers": 6, "mlp_only_layers": [1, 2, 5],
                       **FEW_EXPERTS},
    "Qwen2MoeConfig": {"num_experts": 4, "num_hidden_layers": 5, "mlp_only_layers": [0, 3],
                       "shared_expert_intermediate_size": 128, **FEW_EXPERTS},
}


@pytest.mark.parametrize("name", IRREGULAR)
def test_moe_blocks_sit_where_transformers_builds_them(name):
    """Llama 4's ``moe_layers`` and Qwen's ``mlp_only_layers`` may put the experts on any
    blocks; nestplan had read Llama 4's pattern from ``interleave_moe_layer_step`` alone and
    refused Qwen's unless the dense blocks led. The blocks with experts and the parameters are
    transformers' own."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, name)(**{**SMALL, **IRREGULAR[name]})
    with torch.device("meta"):
        built = transformers.AutoModelForCausalLM.from_config(config)
    experts = [i for i, block in enumerate(built.model.layers)
               if any(n.split(".")[-1] == "experts" for n, _ in block.named_modules())]
    data = config.to_dict()
    data.pop("dtype", None)
    model = model_from_hf_dict(data)
    assert [i for i in range(model.layers) if model.is_moe_layer(i)] == experts
    assert 0 < len(experts) < model.layers
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding


@pytest.mark.parametrize("name, keys", [
    ("Qwen3MoeConfig", {"mlp_only_layers": [0, 1], **FEW_EXPERTS, "num_experts": 4}),
    ("Qwen3MoeConfig", {"decoder_sparse_step": 3, **FEW_EXPERTS, "num_experts": 4}),
    ("Llama4TextConfig", {"num_local_experts": 4, "num_experts_per_tok": 1,
                          "intermediate_size_mlp": 256, "moe_layers": []})])
def test_a_moe_config_without_sparse_blocks_is_the_dense_model_transformers_builds(name, keys):
    """Every block listed dense (or a sparse step beyond the blocks, or Llama 4's empty
    ``moe_layers``): transformers builds a dense model; nestplan had refused Qwen's, naming
    ``decoder_sparse_step`` (a user trial's). Read as dense, with a note, and counted alike."""
    transformers = pytest.importorskip("transformers")
    data = getattr(transformers, name)(**{**SMALL, **keys}).to_dict()
    data.pop("dtype", None)
    with pytest.warns(UserWarning, match="dense"):
        assert model_from_hf_dict(data).moe is None
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding


@pytest.mark.parametrize("name", ["LlamaConfig", "MistralConfig", "Qwen2Config", "Qwen3MoeConfig"])
@pytest.mark.parametrize("act", ["gelu", "gelu_pytorch_tanh", "swish"])
def test_every_activation_gates_the_llama_like_mlps(name, act):
    """transformers' Llama-like MLPs gate whatever ``hidden_act`` names (``act(x W_gate) ·
    x W_up``): a GeLU one has the SiLU one's three matrices. nestplan had read GeLU as an ungated
    MLP (a user trial: Llama-3 8B with ``gelu_pytorch_tanh`` counted 6.15 B parameters against
    8.03 B)."""
    transformers = pytest.importorskip("transformers")
    data = getattr(transformers, name)(**SMALL, hidden_act=act).to_dict()
    data.pop("dtype", None)
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding
    assert model_from_hf_dict(data).gated


def test_llama_biases_on_every_linear_layer_count_what_transformers_builds():
    """Llama's attention_bias (q, k, v, o) and mlp_bias (the MLP's three matrices) together are
    biases on every linear layer, nestplan's ``bias``."""
    transformers = pytest.importorskip("transformers")
    data = transformers.LlamaConfig(**SMALL, attention_bias=True, mlp_bias=True).to_dict()
    data.pop("dtype", None)
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding


@pytest.mark.parametrize("family, extra, absent", [
    ("DeepseekV3Config", {"n_routed_experts": 8, "num_hidden_layers": 4, "q_lora_rank": 64,
                          "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                          "v_head_dim": 32, "num_key_value_heads": 4, **FEW_EXPERTS},
     ("first_k_dense_replace", "n_shared_experts", "n_group", "topk_group",
      "routed_scaling_factor")),
    ("DeepseekV2Config", {"n_routed_experts": 8, "num_hidden_layers": 3, "q_lora_rank": 64,
                          "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                          "v_head_dim": 32, "num_key_value_heads": 4, **FEW_EXPERTS},
     ("first_k_dense_replace", "n_shared_experts", "n_group", "topk_group", "topk_method",
      "routed_scaling_factor", "scoring_func")),
    ("Glm4MoeConfig", {"n_routed_experts": 4, "num_hidden_layers": 3, **FEW_EXPERTS},
     ("first_k_dense_replace", "n_shared_experts")),
    ("Qwen2MoeConfig", {"num_experts": 4, **FEW_EXPERTS}, ("shared_expert_intermediate_size",)),
])
def test_absent_keys_are_read_as_the_config_class_defaults_them(family, extra, absent):
    """A trimmed config.json leaves keys out; transformers builds the model with its config
    class's defaults, and nestplan reads them so (a user trial: DeepSeek-V3 without
    first_k_dense_replace had been 32.8 B parameters over, GLM-4.5 and DeepSeek-V3 without
    n_shared_experts had lost their shared expert, Qwen2-MoE its shared expert's size)."""
    transformers = pytest.importorskip("transformers")
    data = getattr(transformers, family)(**{**SMALL, **extra}).to_dict()
    data.pop("dtype", None)
    for key in absent:
        data.pop(key, None)
    ours, padding = nestplan_count(data)
    assert ours == transformers_count(data) + padding
    moe = model_from_hf_dict(data).moe
    if family == "DeepseekV3Config":
        assert (moe.first_dense_layers, moe.shared_experts, moe.router_groups,
                moe.router_group_top_k, moe.router_scale) == (3, 1, 8, 4, 2.5)
    if family == "DeepseekV2Config":  # (greedy softmax top-k over every expert, no groups)
        assert (moe.first_dense_layers, moe.shared_experts, moe.router_groups,
                moe.router_group_top_k, moe.router_scale, moe.router_score,
                moe.router_pre_softmax, moe.router_expert_bias) == (0, 2, 1, 1, 1.0, "softmax",
                                                                     True, False)


@pytest.mark.parametrize("name", [n for n in DEFAULTS if n != "GPTNeoXConfig"])
def test_absent_kv_heads_and_q_rank_are_the_config_class_defaults(name):
    """A config without ``num_key_value_heads`` (or DeepSeek-V3's ``q_lora_rank``) is read as its
    config class reads it: Llama's takes the query heads, the others a default of their own
    (Qwen3-MoE 4, Mixtral 8; DeepSeek-V3's q rank 1536, and none where the key is null). A user
    trial: nestplan had read 64 K/V heads where transformers reads 4, and q_lora_rank 0 where it
    reads 1536."""
    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, name)
    data = cls(**{**DEFAULTS[name], "num_attention_heads": 64, "hidden_size": 8192,
                  "head_dim": 128}).to_dict()
    data.pop("dtype", None)
    data.pop("num_key_value_heads", None)
    data.pop("q_lora_rank", None)
    theirs = cls.from_dict(data)
    ours = model_from_hf_dict(data)
    if ours.mla is None:
        assert ours.kv_heads == theirs.num_key_value_heads
        # a family named by architectures alone takes that family's default (a review's)
        named = {k: v for k, v in data.items() if k != "model_type"}
        assert model_from_hf_dict({**named, "architectures": [
            transformers.AutoModelForCausalLM._model_mapping[cls].__name__]}).kv_heads \
            == ours.kv_heads
        if name in ("Qwen2Config", "Qwen3Config"):  # their classes read a null as the heads
            null = {**data, "num_key_value_heads": None}
            assert model_from_hf_dict(null).kv_heads == cls.from_dict(null).num_key_value_heads \
                == 64
    else:
        assert ours.mla.q_lora_rank == theirs.q_lora_rank == 1536
        assert model_from_hf_dict({**data, "q_lora_rank": None}).mla.q_lora_rank == 0


@pytest.mark.parametrize("name", DEFAULTS)
def test_absent_head_width_dense_size_and_context_are_the_config_class_defaults(name):
    """A config without ``head_dim``, without the dense MLP size of an MoE family
    (``intermediate_size``; Llama 4's ``intermediate_size_mlp``) or without
    ``max_position_embeddings`` is read as its config class reads it (a user trial's trimmed
    Qwen3-MoE config had been refused for an ``intermediate_size`` no block of it uses, read at
    half its heads' width without a word, and given no context; Qwen3's class fixes 128 where
    nestplan had read hidden_size / num_attention_heads). The families are those of the shipped
    tables (``HEAD_DIM_DEFAULTS``, ``DENSE_FFN_DEFAULTS``, ``CONTEXT_DEFAULTS``)."""
    from nestplan.hf import CONTEXT_DEFAULTS, DENSE_FFN_DEFAULTS, HEAD_DIM_DEFAULTS

    transformers = pytest.importorskip("transformers")
    cls = getattr(transformers, name)
    data = cls(**{**DEFAULTS[name], "num_attention_heads": 32, "hidden_size": 3072}).to_dict()
    data.pop("dtype", None)
    mtype = data["model_type"]
    dense_key = "intermediate_size_mlp" if "intermediate_size_mlp" in data else "intermediate_size"
    for key in ("head_dim", "max_position_embeddings") + ((dense_key,) * (
            mtype in DENSE_FFN_DEFAULTS)):
        data.pop(key, None)
    theirs = cls.from_dict(data)
    ours = model_from_hf_dict(data)
    assert ours.trained_context == theirs.max_position_embeddings == CONTEXT_DEFAULTS[mtype]
    if ours.mla is None:
        width = getattr(theirs, "head_dim", None) or 3072 // 32  # (the models' own fallback)
        assert ours.head_dim == width == HEAD_DIM_DEFAULTS.get(mtype, 3072 // 32)
    if mtype in DENSE_FFN_DEFAULTS:
        assert ours.ffn_hidden == getattr(theirs, dense_key) == DENSE_FFN_DEFAULTS[mtype]


def test_gpt_oss_and_deepseek_v3_biases_as_their_builders_make_them():
    """GPT-OSS biases every linear layer when its config leaves attention_bias out (GptOssConfig
    defaults it true: nestplan's count is transformers'); DeepSeek-V3 has none, as
    Megatron-Bridge builds it, and a config's attention_bias is ignored with a note (a review:
    it had put biases on every linear layer, experts included)."""
    import warnings

    transformers = pytest.importorskip("transformers")
    data = transformers.GptOssConfig(**{**SMALL, "num_local_experts": 4,
                                        "num_experts_per_tok": 2}).to_dict()
    data.pop("dtype", None)
    data.pop("attention_bias")
    assert model_from_hf_dict(data).bias
    v3 = transformers.DeepseekV3Config(**{**SMALL, "n_routed_experts": 8, "num_hidden_layers": 4,
                                          "q_lora_rank": 64, "kv_lora_rank": 32,
                                          "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
                                          "v_head_dim": 32, "num_key_value_heads": 4,
                                          "attention_bias": True, **FEW_EXPERTS}).to_dict()
    v3.pop("dtype", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = model_from_hf_dict(v3)
    assert not m.bias and not m.qkv_bias
    assert any("attention_bias: ignored" in str(w.message) for w in caught)


def test_a_default_taken_for_a_missing_key_is_noted(tmp_path):
    """A Qwen2 config without num_key_value_heads or rope_theta is read with transformers'
    defaults (32 KV heads, RoPE base 10,000), which move memory and time and go into the
    exports: each is noted (they had been taken silently: a user trial's)."""
    from console import cli

    cfg = tmp_path / "config.json"

    def notes(config: dict) -> str:
        """evaluate's stderr for ``config``, which must load."""
        cfg.write_text(json.dumps(config))
        code, _, err = cli("evaluate", "--model", cfg, "--cluster", "dgx-h100-ndr", "--gpus", 8,
                           "--tp", 1, "--pp", 1, "--mbs", 1, "--global-batch", 8, "--seq-len",
                           2048)
        assert code == 0, err
        return err

    qwen2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 4096,
             "num_hidden_layers": 32, "num_attention_heads": 32, "intermediate_size": 11008,
             "vocab_size": 151936}
    err = notes(qwen2)
    assert "num_key_value_heads: missing, read as its config class's default 32" in err
    assert "rope_theta: missing, read as 10,000 (transformers' default)" in err
    assert "max_position_embeddings: missing, read as its config class's default 32,768" in err
    err = notes({**qwen2, "num_key_value_heads": 8, "rope_theta": 1e6,
                 "max_position_embeddings": 32768})
    assert "missing" not in err, err
    # a trimmed Qwen3-MoE config: head_dim, whose released configs state it, and the dense size,
    # which no block of it uses (noted where a block has a dense MLP: a user trial's)
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "hidden_size": 2048, "num_hidden_layers": 8, "num_attention_heads": 32,
           "num_key_value_heads": 4, "vocab_size": 151936, "rope_theta": 1e6,
           "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
           "moe_intermediate_size": 768}
    err = notes(moe)
    assert "head_dim: missing, read as 64 (hidden_size / num_attention_heads = 2048 / 32" in err
    assert "intermediate_size" not in err, err
    err = notes({**moe, "head_dim": 128, "mlp_only_layers": [0]})
    assert "intermediate_size: missing, read as its config class's default 6,144" in err
    assert "head_dim" not in err, err
    # GPT-NeoX's base is rotary_emb_base (it had been taken silently there too: a review's)
    err = notes({"architectures": ["GPTNeoXForCausalLM"], "model_type": "gpt_neox",
                 "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 16,
                 "intermediate_size": 8192, "vocab_size": 50304})
    assert "rotary_emb_base: missing, read as 10,000" in err, err


def test_a_sequence_beyond_the_configs_positions_is_noted(tmp_path):
    """A HuggingFace RoPE model without RoPE scaling given a sequence longer than its
    max_position_embeddings says it is costed and exported unscaled (1M tokens on Llama 3 8B's
    8,192 had gone without a word: a long-context trial's); the catalog's Llama 3 8B alike (a
    second long-context trial's: its file had left the context out); within it, not."""
    from console import cli

    cfg = SHARED / "data" / "hf_configs" / "llama3-8b.json"
    base = ["--cluster", "dgx-h100-ndr", "--gpus", 64, "--tp", 8, "--pp", 1, "--mbs", 1,
            "--global-batch", 8]
    code, _, err = cli("evaluate", "--model", cfg, *base, "--cp", 8, "--seq-len", 65536)
    assert code == 0, err
    said = ("llama3-8b.json was built for 8,192 tokens (max_position_embeddings, trained_context "
            "in a model file) and has no RoPE scaling: at --seq-len 65,536 it is costed with its "
            "RoPE base (500000) unscaled, and the Megatron export sets it so")
    assert said in err
    code, _, err = cli("evaluate", "--model", cfg, *base, "--cp", 8, "--seq-len", 8192)
    assert code == 0 and "max_position_embeddings" not in err, err
    code, _, err = cli("evaluate", "--model", "llama3-8b", *base, "--cp", 8, "--seq-len", 65536)
    assert code == 0 and said.replace("llama3-8b.json", "llama3-8b", 1) in err, err
    # the model file list models writes of the config keeps it (a new user's trial: it had not)
    code, out, err = cli("list", "models", cfg)
    assert code == 0 and "trained_context = 8192" in out, err
    written = tmp_path / "m.toml"
    written.write_text(out)
    code, _, err = cli("evaluate", "--model", written, *base, "--cp", 8, "--seq-len", 65536)
    assert code == 0 and said in err, err


def test_a_scaled_rope_beyond_its_context_is_noted_and_the_export_repeats_the_note(tmp_path):
    """A Llama 3.1 config (RoPE scaled 8x to 131,072 tokens) at 1M tokens, 8 times beyond what
    its scaling covers, is noted (it returned early on any scaling: a long-context trial's); the
    Megatron export of a plan beyond a model's context carries the note in its comments (the
    trial's Qwen3 export at 128K had not)."""
    from console import cli

    cfg = json.loads((SHARED / "data" / "hf_configs" / "llama3-8b.json").read_text())
    cfg.update(max_position_embeddings=131072, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    path = tmp_path / "l31.json"
    path.write_text(json.dumps(cfg))
    base = ["--cluster", "dgx-b200-ndr", "--gpus", 256, "--tp", 8, "--pp", 1, "--cp", 32,
            "--mbs", 1, "--global-batch", 1, "--recompute", "full"]
    code, _, err = cli("evaluate", "--model", path, *base, "--seq-len", 1048576,
                       "--save", tmp_path / "p.json")
    assert code == 0, err
    said = ("l31.json was built for 131,072 tokens with its RoPE scaled (max_position_embeddings, "
            "trained_context in a model file): at --seq-len 1,048,576, 8 times beyond")
    assert said in err, err
    code, _, err = cli("evaluate", "--model", path, *base, "--seq-len", 131072)
    assert code == 0 and "was built for" not in err, err
    code, out, err = cli("export", tmp_path / "p.json", "--format", "megatron")
    assert code == 0 and f"# note: {said}" in out, out


def test_deepseek_v2s_router_is_read_as_its_model_runs_it():
    """DeepseekV2TopkRouter scores with a softmax (it reads no scoring_func) and limits the groups
    only under topk_method = "group_limited_greedy"; its config class defaults the method to
    greedy. A config without the method, or with a null one, routes greedily whatever n_group says
    (a review: it had been read as group-limited); a scoring_func it ignores is noted."""
    import warnings

    transformers = pytest.importorskip("transformers")
    data = transformers.DeepseekV2Config(**{**SMALL, "n_routed_experts": 8, "n_group": 4,
                                            "topk_group": 2, "topk_method": "group_limited_greedy",
                                            **FEW_EXPERTS}).to_dict()
    data.pop("dtype", None)
    assert transformers.DeepseekV2Config().topk_method == "greedy"

    def router(**edit) -> tuple:
        moe = model_from_hf_dict({k: v for k, v in {**data, **edit}.items() if v != "drop"}).moe
        return moe.router_groups, moe.router_group_top_k, moe.router_score

    assert router() == (4, 2, "softmax")
    assert router(topk_method="drop") == router(topk_method=None) == (1, 1, "softmax")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert router(scoring_func="sigmoid") == (4, 2, "softmax")
    assert any("'sigmoid' ignored: DeepSeek-V2's router scores with a softmax" in str(w.message)
               for w in caught)
