"""The parameters nestplan reads from a HuggingFace config against transformers' own model code:
every config shipped with the tests, and each supported family's default config, built on the
meta device (no memory, no weights) and counted. The counts must be equal, to the parameter.

The one difference that is meant: nestplan pads the vocabulary as Megatron does
(``graph.padded_vocab``); the padded rows are added to transformers' count. Multi-token
prediction layers, which transformers does not build, are left out of nestplan's."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from nestplan.graph import padded_vocab, total_params
from nestplan.hf import model_from_hf_dict

pytestmark = pytest.mark.frameworks

HERE = Path(__file__).parent
SHIPPED = sorted([*(HERE / "data" / "hf").glob("*.json"), *(HERE / "data").glob("*.json"),
                  *(HERE.parent.parent / "shared" / "data" / "hf_configs").glob("*.json")])
DEFAULTS = {"LlamaConfig": {}, "MistralConfig": {}, "MixtralConfig": {}, "Qwen2Config": {},
            "Qwen2MoeConfig": {}, "Qwen3Config": {}, "Qwen3MoeConfig": {}, "DeepseekV3Config": {},
            "GptOssConfig": {}, "Llama4TextConfig": {},
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
