"""Models from HuggingFace ``config.json`` files (the format people already have).

Only the architecture keys are read; the many other keys of a config (tokens ids, dtype, rope
scaling, ...) do not change the cost and are ignored. A missing architecture key or an unsupported
``model_type`` is a SpecError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from .errors import SpecError
from .options import MLPKind, Norm, Position
from .specs import MLASpec, ModelSpec, MoESpec


class _Config:
    """Typed access to a config dict, with key aliases and clear errors."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def get(self, *keys: str, default: Any = ..., kind: type = int) -> Any:
        for k in keys:
            if k in self.data and self.data[k] is not None:
                v = self.data[k]
                if kind is int and not (isinstance(v, int) and not isinstance(v, bool)):
                    raise SpecError(f"{self.source}: {k}", v, "must be an integer")
                return v
        if default is ...:
            raise SpecError(f"{self.source}: {keys[0]}", None,
                            f"missing key required for model_type {self.data.get('model_type')!r}")
        return default


def _act(cfg: _Config, key: str = "hidden_act") -> MLPKind:
    act = str(cfg.get(key, default="silu", kind=str)).lower()
    return MLPKind.SWIGLU if act in ("silu", "swish", "swiglu") else MLPKind.GELU


def _llama_like(cfg: _Config, *, bias: bool = False) -> dict:
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    return dict(
        layers=cfg.get("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads", default=heads),
        head_dim=cfg.get("head_dim", default=hidden // heads),
        ffn_hidden=cfg.get("intermediate_size"),
        vocab=cfg.get("vocab_size"),
        mlp=_act(cfg),
        norm=Norm.RMSNORM,
        bias=bool(cfg.get("attention_bias", default=bias, kind=bool)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", default=False, kind=bool)),
        position=Position.ROPE,
    )


def _llama(cfg: _Config) -> dict:
    return _llama_like(cfg)


def _qwen2(cfg: _Config) -> dict:
    # Qwen2 has q/k/v biases in the modelling code, not in config.json.
    return _llama_like(cfg, bias=True)


def _mixtral(cfg: _Config) -> dict:
    kw = _llama_like(cfg)
    kw["moe"] = MoESpec(experts=cfg.get("num_local_experts"), top_k=cfg.get("num_experts_per_tok"),
                        ffn_hidden=cfg.get("intermediate_size"))
    return kw


def _qwen3_moe(cfg: _Config) -> dict:
    kw = _llama_like(cfg)
    layers = kw["layers"]
    only_dense = set(cfg.get("mlp_only_layers", default=[], kind=list))
    step = cfg.get("decoder_sparse_step", default=1)
    sparse = [i for i in range(layers) if i not in only_dense and (i + 1) % step == 0]
    # Express the pattern with first_dense_layers / layer_freq when it has that shape.
    first = sparse[0] if sparse else layers
    if sparse != list(range(first, layers, step)):
        raise SpecError(f"{cfg.source}: mlp_only_layers", sorted(only_dense),
                        "only a leading block of dense layers and a fixed sparse step are supported")
    kw["moe"] = MoESpec(experts=cfg.get("num_experts", "num_local_experts"),
                        top_k=cfg.get("num_experts_per_tok"),
                        ffn_hidden=cfg.get("moe_intermediate_size"),
                        first_dense_layers=first, layer_freq=step)
    return kw


def _deepseek_v3(cfg: _Config) -> dict:
    kw = _llama_like(cfg)
    mla = MLASpec(q_lora_rank=cfg.get("q_lora_rank", default=0),
                  kv_lora_rank=cfg.get("kv_lora_rank"),
                  qk_nope_head_dim=cfg.get("qk_nope_head_dim"),
                  qk_rope_head_dim=cfg.get("qk_rope_head_dim"),
                  v_head_dim=cfg.get("v_head_dim"))
    kw.update(mla=mla, kv_heads=kw["heads"], head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim)
    moe_ffn = cfg.get("moe_intermediate_size")
    kw["moe"] = MoESpec(experts=cfg.get("n_routed_experts", "num_local_experts"),
                        top_k=cfg.get("num_experts_per_tok"), ffn_hidden=moe_ffn,
                        shared_experts=cfg.get("n_shared_experts", default=0),
                        shared_ffn_hidden=moe_ffn,
                        first_dense_layers=cfg.get("first_k_dense_replace", default=0),
                        layer_freq=cfg.get("moe_layer_freq", default=1))
    return kw


def _gpt2(cfg: _Config) -> dict:
    hidden = cfg.get("n_embd", "hidden_size")
    return dict(
        layers=cfg.get("n_layer", "num_hidden_layers"), hidden=hidden,
        heads=cfg.get("n_head", "num_attention_heads"),
        ffn_hidden=cfg.get("n_inner", default=4 * hidden), vocab=cfg.get("vocab_size"),
        mlp=MLPKind.GELU, norm=Norm.LAYERNORM, bias=True, dropout=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", default=True, kind=bool)),
        position=Position.LEARNED, max_positions=cfg.get("n_positions", "max_position_embeddings"),
    )


def _gpt_neox(cfg: _Config) -> dict:
    return dict(
        layers=cfg.get("num_hidden_layers"), hidden=cfg.get("hidden_size"),
        heads=cfg.get("num_attention_heads"), ffn_hidden=cfg.get("intermediate_size"),
        vocab=cfg.get("vocab_size"), mlp=MLPKind.GELU, norm=Norm.LAYERNORM, bias=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", default=False, kind=bool)),
        position=Position.ROPE,
    )


def _bloom(cfg: _Config) -> dict:
    hidden = cfg.get("hidden_size", "n_embed")
    return dict(
        layers=cfg.get("n_layer", "num_hidden_layers"), hidden=hidden,
        heads=cfg.get("n_head", "num_attention_heads"), ffn_hidden=4 * hidden,
        vocab=cfg.get("vocab_size"), mlp=MLPKind.GELU, norm=Norm.LAYERNORM, bias=True,
        tied_embeddings=bool(cfg.get("tie_word_embeddings", default=True, kind=bool)),
        position=Position.ALIBI,
    )


FAMILIES: dict[str, Callable[[_Config], dict]] = {
    "llama": _llama, "mistral": _llama, "mixtral": _mixtral, "qwen2": _qwen2, "qwen3": _llama,
    "qwen3_moe": _qwen3_moe, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "bloom": _bloom,
    "deepseek_v3": _deepseek_v3,
}


def model_from_hf_dict(data: dict, source: str = "config.json") -> ModelSpec:
    """A ModelSpec from the dict of a HuggingFace ``config.json``."""
    if not isinstance(data, dict):
        raise SpecError(source, type(data).__name__, "a config.json must hold a JSON object")
    mtype = data.get("model_type")
    if mtype not in FAMILIES:
        raise SpecError(f"{source}: model_type", mtype,
                        f"supported model types: {', '.join(sorted(FAMILIES))}")
    kw = FAMILIES[mtype](_Config(data, source))
    kw.setdefault("head_dim", kw["hidden"] // kw["heads"])
    kw.setdefault("kv_heads", kw["heads"])
    return ModelSpec(name=source, **kw)


def model_from_hf_config(path: Path) -> ModelSpec:
    """A ModelSpec from a HuggingFace ``config.json`` file."""
    from .loaders import read_document

    data = read_document(path, "model", "JSON")
    return model_from_hf_dict(data, Path(path).name if Path(path).name != "config.json" else str(path))
