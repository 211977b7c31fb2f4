"""Models from HuggingFace ``config.json`` files (the format people already have).

Only the architecture keys are read, and what an export needs to define the model (RoPE's base
and scaling, the norms' epsilon, the sliding windows' layers, the balancing loss); the many other
keys of a config (token ids, dtype, ...) are ignored. The Llama-like families' MLPs are gated by
``hidden_act``, as transformers' are. A missing architecture key or an unsupported
``model_type`` is a SpecError. A ``model_type`` nestplan does not know whose ``architectures``
names a class of a supported family is read as that family, with a note (``HFNote``) that the CLI
prints.

Multi-token-prediction depths (DeepSeek-V3, Kimi-K2, GLM-4.5: ``num_nextn_predict_layers``) are
read into ``ModelSpec.mtp_layers``, trained by default as Megatron-Bridge does; a run without
them sets ``--mtp-layers 0``. QK norms (Qwen3 always, GLM-4.5 with ``use_qk_norm``) are read into
``ModelSpec.qk_norm``, Llama 4's L2 norms (``use_qk_norm``) into ``ModelSpec.qk_l2_norm``.
Biases are read as each family's modelling code places them: every linear layer (``bias``:
GPT-OSS), or q, k and v only (``qkv_bias``: Qwen2, Qwen2-MoE, GLM-4.5). A config of another
family with ``attention_bias`` set is read as biases on q, k and v, as Megatron-Bridge maps it
(``add_qkv_bias``), with a note that the output projection's are left out (transformers puts
them on q, k, v and o); Llama's ``mlp_bias`` as biases on every linear layer
(``add_bias_linear``), with a note unless ``attention_bias`` is set too. Mistral and Mixtral
(bias=False in transformers' code) and DeepSeek-V3 (none in Megatron-Bridge's) ignore it with a
note. No shipped config sets it. Every shipped config's
parameter count is checked against transformers' own model, built on the meta device, and
each family's FLOPs against that model run at a small size under torch's FLOP counter
(``tests/test_hf_models.py``). RoPE on a share
of each head (GLM-4.5, GPT-NeoX) is read into ``ModelSpec.rope_fraction``. What is not
modelled, by family: the attention kernel's work on GPT-OSS's sinks (their parameters are
counted), and the per-layer alternation of local and global attention, whose cost is averaged
over the blocks (``ModelSpec.local_share``).
"""

from __future__ import annotations

import math
from dataclasses import replace
import warnings
from pathlib import Path
from typing import Any, Callable

from .errors import ABSENT, Note, SpecError
from .options import MLPKind, Norm, Position
from .specs import (CONTEXT_FACTOR_RULE, DEFAULT_ROPE_THETA, MAX_EXPERTS, MAX_FFN, MAX_HEAD_DIM,
                    MAX_HEADS, MAX_LAYERS, MAX_NORM_EPS, MAX_ROPE_MSCALE, MAX_VOCAB, MAX_WIDTH,
                    MAX_YARN_FACTOR, MIN_ROPE_MSCALE, NORM_EPS_RULE, ROPE_SCALINGS, ROUTER_SCORES,
                    MLASpec, ModelSpec, MoESpec, RopeScaling, YarnSpec, finite,
                    layer_indices, moe_layer_fields, sliding_window_cost)


SHARE = "share"
"""``_Config.get``'s kind for a share: a number in (0, 1]."""

MOST = {**dict.fromkeys(("num_hidden_layers", "n_layer"), MAX_LAYERS),
        **dict.fromkeys(("hidden_size", "n_embd", "n_embed"), MAX_WIDTH),
        **dict.fromkeys(("num_attention_heads", "n_head", "num_key_value_heads"), MAX_HEADS),
        "head_dim": MAX_HEAD_DIM, "vocab_size": MAX_VOCAB,
        **dict.fromkeys(("intermediate_size", "moe_intermediate_size", "n_inner"), MAX_FFN),
        **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts"), MAX_EXPERTS)}
"""The model spec's bounds on the integers a config gives, checked as they are read: the
readers build per-layer and per-expert lists from them before the spec sees them (a config with
2^31 layers had run out of memory)."""


class _Config:
    """Typed access to a config dict (or a table in one, named by ``prefix``), with key aliases
    and clear errors."""

    def __init__(self, data: dict, source: str, prefix: str = "", model_type: Any = None):
        self.data, self.source, self.prefix = data, source, prefix
        self.model_type = model_type or data.get("model_type")
        """The config's model type (a table's is its config's)."""
        self.defaulted: dict[str, Any] = {}
        """Keys read as their config class's default that only some models use, by key (noted
        once the model shows whether it uses them: ``_dense_ffn``)."""

    def where(self, key: str) -> str:
        """How errors name ``key`` of this table: ``config.json: text_config.rope_scaling``."""
        return f"{self.source}: {self.prefix}{key}"

    def table(self, key: str, *, null: bool = True) -> "_Config":
        """The table under ``key`` (empty when absent, or null if ``null``)."""
        v = self.data.get(key)
        if not isinstance(v, dict) and (v is not None or not null):
            raise SpecError(self.where(key), v, "must be a table" + (" (or null)" if null else ""))
        child = _Config(v or {}, self.source, f"{self.prefix}{key}.", self.model_type)
        child.defaulted = self.defaulted  # (one record for a config and its tables)
        return child

    def get(self, *keys: str, default: Any = ..., kind: Any = int, minimum: float = 1,
            null: Any = ..., maximum: float = math.inf, open_low: bool = False,
            rule: str | None = None) -> Any:
        """The first of ``keys`` present; an int must be >= ``minimum``, a float a finite number
        >= ``minimum`` (> with ``open_low``) and <= ``maximum`` (returned as float; outside, the
        refusal states ``rule`` where given, the same words whatever side the value is on), a
        ``SHARE`` a number in (0, 1] (returned as float), a list a flat list of numbers or
        strings (else the refusal states ``rule`` where given). A null value reads as absent, or
        as ``null`` where given (transformers keeps an explicit null, which its models read as
        "none", while an absent key takes the config class's default)."""
        for k in keys:
            if null is not ... and k in self.data and self.data[k] is None:
                return null
            if k in self.data and self.data[k] is not None:
                v = self.data[k]
                where = self.where(k)
                if kind is int:
                    if not isinstance(v, int) or isinstance(v, bool):
                        raise SpecError(where, v, "must be an integer")
                    if v < minimum:
                        raise SpecError(where, v, f"must be an integer >= {minimum}")
                    if v > MOST.get(k, v):
                        raise SpecError(where, v, f"at most {MOST[k]:,} is supported")
                elif kind is float:
                    if not (finite(v) and (v > minimum if open_low else v >= minimum)
                            and v <= maximum):
                        raise SpecError(where, v, rule or _range_rule(minimum, maximum, open_low))
                    return float(v)
                elif kind is SHARE:
                    if not (finite(v) and 0 < v <= 1):
                        raise SpecError(where, v, "must be in (0, 1] (a share)")
                    return float(v)
                elif kind is bool and not isinstance(v, bool):
                    raise SpecError(where, v, "must be true or false")
                elif kind is list and not (isinstance(v, list) and all(
                        isinstance(x, (int, str)) and not isinstance(x, bool) for x in v)):
                    raise SpecError(where, v, rule or "must be a list of integers or strings")
                elif kind is str and not isinstance(v, str):
                    raise SpecError(where, v, "must be a string")
                return v
        if default is ...:
            null_key = next((k for k in keys if k in self.data), None)  # (present, but null)
            raise SpecError(self.where(null_key or keys[0]), None if null_key else ABSENT,
                            f"{'' if null_key else 'missing key; '}model_type "
                            f"{self.model_type!r} requires a value")
        return default


GATED_ACTIVATIONS = {"silu": MLPKind.SWIGLU, "swish": MLPKind.SWIGLU,
                     **{name: MLPKind.GEGLU for name in (
                         "gelu", "gelu_new", "gelu_fast", "gelu_accurate", "gelu_python",
                         "gelu_python_tanh", "gelu_pytorch_tanh", "quick_gelu")}}
"""The ``hidden_act`` values of the Llama-like families' gated MLPs that nestplan models
(``act(x W_gate) * x W_up``: transformers' Llama, Mistral, Qwen and DeepSeek MLPs gate whatever
the activation): SiLU, and GeLU in each of transformers' spellings (``ACT2CLS``,
src/transformers/activations.py, transformers 5.23.0 wheel)."""


def _act(cfg: _Config, key: str = "hidden_act") -> MLPKind:
    act = cfg.get(key, default="silu", kind=str)
    if act not in GATED_ACTIVATIONS:  # (as transformers' ACT2FN, case-sensitive)
        raise SpecError(cfg.where(key), act, "allowed: " + ", ".join(GATED_ACTIVATIONS)
                        + " (this family's MLP is gated by it)")
    return GATED_ACTIVATIONS[act]


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "su",
              "mrope")
"""RoPE scalings transformers knows: ``default`` and the keys of ``ROPE_INIT_FUNCTIONS``
(src/transformers/modeling_rope_utils.py, transformers 5.23.0 wheel), with the older names of
configs still published (``su``, Phi-3's first name for ``longrope``; ``mrope``, Qwen2-VL's,
which its code runs as ``default``). Only YaRN changes a cost here (``_rope``)."""

_YARN_HF_KEYS = {"factor": "factor", "original_max_positions": "original_max_position_embeddings",
              "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale",
              "mscale_all_dim": "mscale_all_dim", "round_to_int": "truncate"}
"""``YarnSpec``'s fields -> the ``rope_scaling`` keys they are read from."""


def _rope_scaling(cfg: _Config) -> tuple[_Config, str | None]:
    """The config's RoPE scaling table and its kind (``rope_type``, or ``type`` in older configs;
    None when absent)."""
    rs = cfg.table("rope_scaling")
    if not rs.data:  # transformers v5 writes the scaling with the base under rope_parameters
        rs = cfg.table("rope_parameters")
    kind = rs.get("rope_type", "type", kind=str, default=None)
    if kind is not None and kind not in ROPE_TYPES:
        key = "rope_type" if "rope_type" in rs.data else "type"  # (the older configs' name)
        raise SpecError(rs.where(key), kind, "allowed: " + ", ".join(ROPE_TYPES))
    return rs, kind


def _range_rule(low: float, high: float, open_low: bool) -> str:
    """What a float outside [low, high] (or (low, high]) is told."""
    if high == math.inf:
        return f"must be a number {'>' if open_low else '>='} {low:g}"
    return f"must be a number in {'(' if open_low else '['}{low:g}, {high:g}]"


def _context_factor(rs: _Config) -> float | None:
    """The scaling table's ``factor`` (None when absent) in what ``RopeScaling`` and ``YarnSpec``
    take."""
    return rs.get("factor", kind=float, minimum=1, maximum=MAX_YARN_FACTOR, rule=CONTEXT_FACTOR_RULE,
                  default=None)


def _yarn_mscale(factor: float, m: float) -> float:
    """YaRN's g(m) = 0.1·m·ln(factor) + 1 (1 at factor <= 1): transformers' ``get_mscale`` and
    Megatron-Core's ``_yarn_get_mscale``."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def _yarn_attention_factor(rs: _Config, factor: float, given, mscale, all_dim) -> float:
    """The factor YaRN scales RoPE's cos and sin by, as transformers' ``_compute_yarn_parameters``
    (5.23.0 wheel) works it out from the table ``rs``'s keys: ``attention_factor`` (``given``)
    when given, else g(mscale) / g(mscale_all_dim) when both are set, else g(1); refused outside
    the accepted scales."""
    if given is not None:
        scale, where, shown = given, rs.where("attention_factor"), given
    elif mscale and all_dim:
        scale = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim)
        where, shown = rs.where("mscale"), mscale
    else:
        scale, where, shown = _yarn_mscale(factor, 1.0), rs.where("factor"), factor
    if not MIN_ROPE_MSCALE <= scale <= MAX_ROPE_MSCALE:
        raise SpecError(where, shown, f"gives a scale of RoPE's cos and sin of {scale:.4g}, "
                        f"outside [{MIN_ROPE_MSCALE:g}, {MAX_ROPE_MSCALE:g}]")
    return scale


def _original_context(cfg: _Config, rs: _Config) -> tuple[int | None, str]:
    """The context a scaled RoPE was pre-trained at, and where the config gives it: a top-level
    ``original_max_position_embeddings``, else the scaling table's, else
    ``max_position_embeddings`` (None where none is given)."""
    for table, key in ((cfg, "original_max_position_embeddings"),
                       (rs, "original_max_position_embeddings"), (cfg, "max_position_embeddings")):
        original = table.get(key, default=None)
        if original is not None:
            return original, table.where(key)
    return None, rs.where("original_max_position_embeddings")


def _rope(cfg: _Config) -> tuple[float, YarnSpec | None]:
    """The factor the config's RoPE scaling scales cos and sin by (``ModelSpec.rope_mscale``: 1
    but for YaRN; GPT-OSS 1.3466, DeepSeek-V3 and Kimi-K2, mscale = mscale_all_dim, 1), and its
    YaRN (None for any other RoPE), read as transformers reads it (``_compute_yarn_parameters``,
    ``standardize_rope_params`` and DeepseekV3Attention, transformers 5.23.0 wheel) and held as
    Megatron-Core takes it: betas 32 and 1 when absent or 0; ``mscale_all_dim`` as given (MLA's
    softmax scale reads it alone, in both), and ``mscale`` whatever gives Megatron-Core's cos/sin
    factor g(mscale) / g(mscale_all_dim) transformers' (``_yarn_attention_factor``: the config's
    mscale where it gives both, 1 where it gives neither); ``truncate`` null as false, as
    transformers tests it; the pre-trained context from a top-level
    ``original_max_position_embeddings``, else the table's, else ``max_position_embeddings``
    (else unstated: the config class's default, which differs from class to class). A scale
    without an extension (factor 1 and an attention factor) is no YaRN Megatron can run: the
    scale with None (standard attention's ``rope_mscale`` keeps it; MLA's says so,
    ``_deepseek_v3``)."""
    rs, kind = _rope_scaling(cfg)
    if kind != "yarn":
        return 1.0, None
    factor = _context_factor(rs)
    if factor is None:
        raise SpecError(rs.where("factor"), ABSENT, "missing: YaRN needs a context extension factor")
    where = {f: rs.where(k) for f, k in _YARN_HF_KEYS.items()}
    given = rs.get("attention_factor", kind=float, minimum=0, default=None)
    mscale = rs.get("mscale", kind=float, minimum=0, default=None)
    all_dim = rs.get("mscale_all_dim", kind=float, minimum=0, default=None) or 0.0
    scale = _yarn_attention_factor(rs, factor, given, mscale, all_dim)
    if factor == 1 and scale != 1:
        return scale, None
    if given is not None or not mscale or not all_dim:  # (else the config's mscale, exactly)
        mscale = 1.0 if factor <= 1 or (given is None and not all_dim) else (
            (scale * _yarn_mscale(factor, all_dim) - 1) / (0.1 * math.log(factor)))
        where["mscale"] = rs.where("attention_factor" if given is not None else "factor")
    original, where["original_max_positions"] = _original_context(cfg, rs)
    fields = dict(factor=factor, original_max_positions=original or 0,
                  beta_fast=rs.get("beta_fast", kind=float, minimum=0, default=None) or 32.0,
                  beta_slow=rs.get("beta_slow", kind=float, minimum=0, default=None) or 1.0,
                  mscale=mscale, mscale_all_dim=all_dim,
                  round_to_int=rs.get("truncate", kind=bool, default=True, null=False))
    try:
        return scale, YarnSpec(**fields)
    except SpecError as e:  # named by the config's key (and value, for the mscale worked out)
        field = e.field.removeprefix("yarn.")
        if field == "mscale" and not rs.data.get("mscale"):
            raise SpecError(where[field], given if given is not None else factor,
                            f"needs Megatron-Core's mscale at {e.value:.4g} to give its scale "
                            f"({e.allowed})") from None
        raise SpecError(where[field], e.value, e.allowed) from None


def _frequency_scaling(cfg: _Config) -> RopeScaling | None:
    """The config's RoPE scaling when it is Llama 3.1's or linear interpolation, read as
    transformers reads it (``_compute_llama3_parameters``, ``_compute_linear_scaling_rope_
    parameters``, transformers 5.23.0 wheel: ``factor``, and for ``llama3`` both frequency factors
    are required; the pre-trained context as ``_original_context`` finds it); None for no
    scaling or YaRN (``_rope``). Any other scaling (dynamic NTK, LongRoPE) is not kept: a note
    says so."""
    rs, kind = _rope_scaling(cfg)
    if kind in (None, "default", "mrope", "yarn"):
        return None
    if kind not in ROPE_SCALINGS:
        warnings.warn(HFNote(f"{rs.where('rope_type')}: {kind!r} RoPE scaling is not kept; the "
                             "exports run RoPE without it"), stacklevel=2)
        return None
    factor = _context_factor(rs)
    if factor is None:
        raise SpecError(rs.where("factor"), ABSENT, f"missing: {kind} RoPE scaling needs its factor")
    fields: dict[str, Any] = {"kind": kind, "factor": factor}
    where = {"factor": rs.where("factor")}
    if kind == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            fields[key] = rs.get(key, kind=float, minimum=0, default=None)
            where[key] = rs.where(key)
            if fields[key] is None:
                raise SpecError(rs.where(key), ABSENT, "missing: llama3 RoPE scaling needs it (transformers "
                                "reads it; Llama 3.1: low 1, high 4)")
        original, where["original_max_positions"] = _original_context(cfg, rs)
        if original is None:
            raise SpecError(rs.where("original_max_position_embeddings"), ABSENT,
                            "missing: llama3 RoPE scaling needs the pre-trained context (here, "
                            "at the top level, or max_position_embeddings)")
        fields["original_max_positions"] = original
    try:
        return RopeScaling(**fields)
    except SpecError as e:  # named by the config's key
        raise SpecError(where.get(e.field.removeprefix("rope_scaling."), e.field), e.value,
                        e.allowed) from None


def _llama_like(cfg: _Config, *, qkv_bias: bool | None = None,
                mlp: MLPKind | None = None) -> dict:
    """The fields every Llama-like family shares, no linear layer biased but as ``qkv_bias``
    says: the family's q, k and v carry biases as it says (a family that biases more sets
    ``bias`` itself); else ``attention_bias`` gives q, k and v biases, as Megatron-Bridge maps it
    (``add_qkv_bias``, conversion/model_bridge.py @ NVIDIA-NeMo/Megatron-Bridge 067f987df0), with
    a note that the output projection's are left out (a user trial: Qwen3-MoE, Mixtral and
    Llama 4 had been given biases on every linear layer, experts included); ``mlp``: the
    family's MLP, whatever ``hidden_act`` says (else read from it)."""
    heads = cfg.get("num_attention_heads")
    hidden = cfg.get("hidden_size")
    scale, yarn = _rope(cfg)
    if qkv_bias is None:
        qkv_bias = cfg.get("attention_bias", default=False, kind=bool)
        if qkv_bias:
            warnings.warn(HFNote(f"{cfg.where('attention_bias')}: read as biases on q, k and v, "
                                 "as Megatron-Bridge maps it (add_qkv_bias): the output "
                                 "projection's (hidden_size a layer) are not counted"),
                          stacklevel=3)
    return dict(
        layers=cfg.get("num_hidden_layers"),
        hidden=hidden,
        heads=heads,
        kv_heads=_kv_heads(cfg, heads),
        head_dim=_head_dim(cfg, hidden, heads),
        ffn_hidden=_dense_ffn(cfg, "intermediate_size"),
        vocab=cfg.get("vocab_size"),
        mlp=mlp or _act(cfg),
        norm=Norm.RMSNORM,
        bias=False,
        qkv_bias=qkv_bias,
        tied_embeddings=cfg.get("tie_word_embeddings", default=False, kind=bool),
        position=Position.ROPE,
        rope_mscale=scale,
        yarn=yarn,
        rope_scaling=_frequency_scaling(cfg),
        rope_theta=_rope_theta(cfg),
    )


def _rope_theta(cfg: _Config) -> float:
    """RoPE's base: ``rope_theta``, or under ``rope_parameters`` where transformers v5 writes it
    (the Llama default of 10,000 when neither has it)."""
    theta = cfg.get("rope_theta", kind=float, default=None)
    params = cfg.table("rope_parameters")
    if any(isinstance(v, dict) for v in params.data.values()):  # one per kind of layer
        raise SpecError(cfg.where("rope_parameters"), sorted(params.data), "one RoPE per kind "
                        "of layer is not modelled; give rope_theta at the top level")
    inner = params.get("rope_theta", kind=float, default=None)
    if theta is not None and inner is not None and theta != inner:
        raise SpecError(cfg.where("rope_parameters.rope_theta"), inner,
                        f"differs from rope_theta = {theta:g}; give one")
    return _noted_default(cfg, theta if theta is not None else inner, "rope_theta")


def _noted_default(cfg: _Config, theta: float | None, key: str) -> float:
    """``theta``, or where the config gives no RoPE base transformers' default, with a note (it
    had been taken silently: a user trial's)."""
    if theta is None:
        warnings.warn(HFNote(f"{cfg.where(key)}: missing, read as {DEFAULT_ROPE_THETA:,g} "
                             "(transformers' default), the RoPE base the exports set"))
        return DEFAULT_ROPE_THETA
    return theta


def _rope_fraction(cfg: _Config, default: float) -> float:
    """The share of a head RoPE rotates: ``partial_rotary_factor`` (GLM) or ``rotary_pct``
    (GPT-NeoX) at the top level, or under ``rope_parameters`` where transformers v5 writes it,
    which wins when both are given (src/transformers/models/glm4_moe/configuration_glm4_moe.py,
    gpt_neox/configuration_gpt_neox.py and modeling_rope_utils.py @ huggingface/transformers
    v5.23.0)."""
    inner = cfg.table("rope_parameters").get("partial_rotary_factor", kind=SHARE, default=None)
    if inner is not None:  # it wins, as standardize_rope_params keeps it (setdefault)
        return inner
    return cfg.get("partial_rotary_factor", "rotary_pct", kind=SHARE, default=default)


LAYER_KINDS = ("sliding_attention", "full_attention")
"""The attention kinds a config's ``layer_types`` may list (those of the families read here)."""


def _span(cfg: _Config, key: str, default: int) -> int:
    """A window's or chunk's tokens, ``key``: ``default`` when absent, 0 (none) when null; a 0
    is refused (transformers masks every key of such a window; it had been read as none without
    a word: a sixth fuzzing round's)."""
    span = cfg.get(key, default=default, minimum=0, null=0)
    if span == 0 and cfg.data.get(key) is not None:
        raise SpecError(cfg.where(key), 0, "must be a number of tokens >= 1, or null for none")
    return span


def _sliding(cfg: _Config, layers: int, window: int, sliding: range, *,
             typed: bool = True) -> dict:
    """The model fields of sliding-window attention over ``window`` tokens (0: none) on the layers
    that ``layer_types`` names ``sliding_attention`` (where the family reads it: ``typed``), else
    on the layers ``sliding`` (0-based). A causal window of w costs about what causal chunks of
    2w cost."""
    types = _layer_types(cfg, layers) if typed else None
    local = tuple(i for i, t in enumerate(types) if t == "sliding_attention") \
        if types is not None else tuple(sliding)
    return sliding_window_cost(window, local, layers) if window and local else {}


def _layer_types(cfg: _Config, layers: int, kinds: tuple[str, ...] = LAYER_KINDS) -> list | None:
    """``layer_types``, checked: one of ``kinds`` per layer (None when absent)."""
    types = cfg.get("layer_types", default=None, kind=list,
                    rule=f"must list one of {', '.join(kinds)} per layer")
    if types is not None and len(types) != layers:
        raise SpecError(cfg.where("layer_types"), f"{len(types)} entries",
                        f"needs one per layer ({layers})")
    odd = [t for t in types or () if t not in kinds]
    if odd:  # (a null entry too)
        raise SpecError(cfg.where("layer_types"), odd[0], "entries allowed: " + ", ".join(kinds))
    return types


LLAMA4_LAYER_KINDS = ("chunked_attention", "full_attention")
"""The attention kinds a Llama 4 config's ``layer_types`` may list (the masks its model builds)."""


def _layer_indices(cfg: _Config, key: str, layers: int) -> list | None:
    """A list of 0-based layer indices, ``key`` (None when absent), each in [0, ``layers``)."""
    listed = cfg.get(key, default=None, kind=list,
                     rule=f"must list layer indices, whole numbers in [0, {layers})")
    return None if listed is None else list(layer_indices(cfg.where(key), listed, layers))


def _unbiased(cfg: _Config, family: str, why: str) -> dict:
    """``_llama_like``'s fields for a family whose attention has no biases whatever
    ``attention_bias`` says (``why``), with a note where a config sets it."""
    if cfg.get("attention_bias", default=False, kind=bool):
        warnings.warn(HFNote(f"{cfg.where('attention_bias')}: ignored: {family} has no attention "
                             f"biases ({why})"), stacklevel=3)
    return _llama_like(cfg, qkv_bias=False)


def _llama(cfg: _Config) -> dict:
    """Llama: ``attention_bias`` biases q, k, v and o, ``mlp_bias`` the MLP's three matrices
    (transformers' LlamaAttention, LlamaMLP). nestplan and Megatron-Core bias every linear layer,
    none, or q, k and v alone; as Megatron-Bridge maps them (``add_qkv_bias``,
    ``add_bias_linear``), ``attention_bias`` alone is q, k and v's (``_llama_like``'s note), and
    ``mlp_bias`` every linear layer's, with a note when ``attention_bias`` is not set."""
    attention = cfg.get("attention_bias", default=False, kind=bool)
    mlp = cfg.get("mlp_bias", default=False, kind=bool)
    kw = _llama_like(cfg, qkv_bias=False if mlp else None)
    if mlp:
        kw["bias"] = True
        if not attention:
            warnings.warn(HFNote(f"{cfg.where('mlp_bias')}: read as biases on every linear layer, "
                                 "as Megatron-Bridge maps it (add_bias_linear): the attention's "
                                 "are counted too"), stacklevel=2)
    return kw


def _mistral(cfg: _Config) -> dict:
    """Mistral: sliding-window attention on every layer (``layer_types`` aside), of 4,096 tokens
    when the config has no ``sliding_window`` key and none when it is null (MistralConfig's
    default: src/transformers/models/mistral/configuration_mistral.py @ huggingface/transformers
    0b07a74c673bdf8fbd472a1c7df139b357495414; Mistral 7B v0.1 sets 4,096, v0.2 and later null)."""
    kw = _unbiased(cfg, "Mistral", "its projections are built with bias=False: "
                   "MistralAttention, transformers 5.23")
    window = _span(cfg, "sliding_window", 4096)
    return {**kw, **_sliding(cfg, kw["layers"], window, range(kw["layers"]), typed=False)}


def _qwen_sliding(cfg: _Config, layers: int, *, every_layer: bool = False,
                  alternate: bool = False) -> dict:
    """Qwen2/Qwen3 and Qwen2-MoE: a sliding window only with ``use_sliding_window`` (false by
    default), on the layers from ``max_window_layers`` (28 by default) on unless ``layer_types``
    lists them; ``sliding_window`` defaults to 4,096 and null is none (Qwen2Config:
    src/transformers/models/qwen2/configuration_qwen2.py @ huggingface/transformers
    caa3177646255d2cf73626315c8582722af4749c). Qwen3-MoE (``every_layer``) has neither
    ``max_window_layers`` nor ``layer_types``: the window is on every layer
    (src/transformers/models/qwen3_moe/configuration_qwen3_moe.py @
    26f4b0f69f17118549a693ffe600c18e8505b636). Qwen2-MoE (``alternate``) defaults its
    ``layer_types`` otherwise: the window on every other layer below ``max_window_layers``, the
    first among them (Qwen2MoeConfig.__post_init__, transformers 5.23.0 wheel; a user trial
    found the windows on its last half instead)."""
    if not cfg.get("use_sliding_window", default=False, kind=bool):
        if not every_layer:
            _layer_types(cfg, layers)  # (checked where unused too, as Qwen2Config checks it)
        return {}
    window = _span(cfg, "sliding_window", 4096)
    if every_layer:
        return _sliding(cfg, layers, window, range(layers), typed=False)
    full = cfg.get("max_window_layers", default=28, minimum=0)
    if alternate:
        return _sliding(cfg, layers, window, range(0, min(full, layers), 2))
    return _sliding(cfg, layers, window, range(full, layers))


def _qwen2(cfg: _Config) -> dict:
    # Qwen2 has q/k/v biases in the modelling code, not in config.json, and no other linear
    # layer has one (src/transformers/models/qwen2/modeling_qwen2.py @ huggingface/transformers
    # v5.23.0; the parameter count is checked against that code in tests/test_hf_models.py)
    kw = _llama_like(cfg, qkv_bias=True)
    return {**kw, **_qwen_sliding(cfg, kw["layers"])}


def _mixtral(cfg: _Config) -> dict:
    # Mixtral: a sliding window on every layer only where the config gives one (MixtralConfig
    # defaults it to None: src/transformers/models/mixtral/configuration_mixtral.py @
    # huggingface/transformers ad467bd7633c63ba3ae55da29ff08a30a47cc008)
    kw = _unbiased(cfg, "Mixtral", "its projections are built with bias=False: "
                   "MixtralAttention, transformers 5.23")
    kw["moe"] = MoESpec(experts=cfg.get("num_local_experts"), top_k=cfg.get("num_experts_per_tok"),
                        ffn_hidden=cfg.get("intermediate_size"))
    window = _span(cfg, "sliding_window", 0)
    return {**kw, **_sliding(cfg, kw["layers"], window, range(kw["layers"]),
                             typed=False)}  # (its model reads no layer_types)


def _qwen3(cfg: _Config, *, moe: bool = False) -> dict:
    """Qwen3 norms each head's queries and keys, which its config.json does not say (its modelling
    code has q_norm and k_norm; Megatron-Bridge's Qwen3 and Qwen3-MoE bridges set
    ``qk_layernorm=True``: src/megatron/bridge/models/qwen/qwen3_bridge.py and
    qwen3_moe_bridge.py @ NVIDIA-NeMo/Megatron-Bridge 4d3dd373fd)."""
    kw = _llama_like(cfg)
    return {**kw, **_qwen_sliding(cfg, kw["layers"], every_layer=moe), "qk_norm": True}


def _qwen3_moe(cfg: _Config) -> dict:
    kw = _qwen3(cfg, moe=True)
    placed = _moe_pattern(cfg, kw["layers"])
    if placed is not None:
        kw["moe"] = MoESpec(experts=cfg.get("num_experts", "num_local_experts"),
                            top_k=cfg.get("num_experts_per_tok"),
                            ffn_hidden=cfg.get("moe_intermediate_size"), **placed,
                            router_pre_softmax=_pre_softmax(cfg))
    return kw


def _pre_softmax(cfg: _Config) -> bool:
    """A Qwen-style softmax router's weights are the softmax over every expert unless
    ``norm_topk_prob`` renormalises them over the chosen ones (Megatron-Bridge's Qwen3-MoE
    bridge: ``moe_router_pre_softmax = not norm_topk_prob``, src/megatron/bridge/models/qwen/
    qwen3_moe_bridge.py @ NVIDIA-NeMo/Megatron-Bridge 067f987df0; false by default, as
    transformers' Qwen2-MoE and Qwen3-MoE configs have it)."""
    return not cfg.get("norm_topk_prob", default=False, kind=bool)


TOPK_METHODS = ("noaux_tc", "group_limited_greedy", "greedy")
"""DeepSeek's routing methods (its modelling code): the auxiliary-loss-free bias with groups;
groups without the bias; neither."""
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
"""The methods DeepSeek-V2's router runs (``DeepseekV2TopkRouter.forward``, transformers 5.23.0
wheel: another leaves it without weights), its config class's default first (a review: an absent
method had been read as group-limited)."""


DEEPSEEK_ROUTER = {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
"""DeepseekV3Config's router defaults for keys a config leaves out (transformers 5.23,
models/deepseek_v3/configuration_deepseek_v3.py; Glm4MoeConfig's are 1, 1 and 1.0, as are
DeepseekV2Config's: its n_group and topk_group are None, no groups)."""


def _deepseek_router(cfg: _Config, *, score: str = "sigmoid", absent=None,
                     methods: tuple[str, ...] = TOPK_METHODS) -> dict:
    """The DeepSeek-style router's fields: its scores (``scoring_func``, else ``score``), the
    auxiliary-loss-free expert bias (``topk_method = "noaux_tc"``, sigmoid scores only),
    group-limited routing (``n_group``, ``topk_group``) and the weights' factor
    (``routed_scaling_factor``), as Megatron-Bridge maps them
    (src/megatron/bridge/models/conversion/model_bridge.py and the deepseek_v2, deepseek_v3,
    kimi and glm45 bridges @ 067f987df0: sigmoid and expert bias set by the V3-era bridges);
    ``methods``: the ``topk_method`` values the family's model runs, the first where the key is
    absent or null (its config class's default); ``absent``: the family's
    defaults of the last three (its config class's: a user trial's trimmed DeepSeek-V3 config
    had been read with GLM's, 1, 1 and 1.0)."""
    absent = absent or {}
    method = cfg.get("topk_method", default=methods[0], kind=str)
    if method not in methods:
        raise SpecError(cfg.where("topk_method"), method, "allowed: " + ", ".join(methods))
    cfg.get("norm_topk_prob", default=True, kind=bool)  # read as a bool; the weights are
    grouped = method != "greedy"                         # normalised as the family's model does
    score = cfg.get("scoring_func", default=score, kind=str)
    if score not in ROUTER_SCORES:
        raise SpecError(cfg.where("scoring_func"), score, "allowed: " + ", ".join(ROUTER_SCORES))
    if method == "noaux_tc" and score != "sigmoid":
        raise SpecError(cfg.where("topk_method"), method, f"its expert bias balances sigmoid "
                        f"scores only (Megatron-Core's rule), and scoring_func is {score!r}")
    return dict(router_score=score,
                router_expert_bias=method == "noaux_tc",
                router_groups=cfg.get("n_group", default=absent.get("n_group", 1))
                if grouped else 1,
                router_group_top_k=cfg.get("topk_group", default=absent.get("topk_group", 1))
                if grouped else 1,
                router_scale=cfg.get("routed_scaling_factor", kind=float, minimum=0,
                                     default=absent.get("routed_scaling_factor", 1.0)))


class HFNote(Note):
    """Something the user should know about how a config.json was read (not an error)."""


def _moe_pattern(cfg: _Config, layers: int) -> dict | None:
    """The MoE layers' fields (``moe_layer_fields``) from Qwen-style ``mlp_only_layers`` and
    ``decoder_sparse_step`` (layer i is sparse when (i + 1) % step == 0 and it is not listed);
    None when no layer is."""
    only_dense = set(_layer_indices(cfg, "mlp_only_layers", layers) or ())
    step = cfg.get("decoder_sparse_step", default=1)
    sparse = [i for i in range(layers) if i not in only_dense and (i + 1) % step == 0]
    if not sparse:  # (it had been refused, naming decoder_sparse_step: a user trial's)
        key = "mlp_only_layers" if only_dense else "decoder_sparse_step"
        warnings.warn(HFNote(f"{cfg.where(key)}: leaves no sparse block: every block is dense "
                             "(no experts), as transformers builds it"), stacklevel=2)
        return None
    return moe_layer_fields(sparse, layers)


def _qwen2_moe(cfg: _Config) -> dict:
    # Qwen2-MoE: q/k/v biases only (``qkv_bias``, true when absent), one shared expert of its
    # own size behind a sigmoid gate (shared_expert_gate in the modelling code)
    kw = _llama_like(cfg, qkv_bias=cfg.get("qkv_bias", default=True, kind=bool))
    kw.update(_qwen_sliding(cfg, kw["layers"], alternate=True))
    # (absent: Qwen2MoeConfig's 5,632, transformers 5.23 configuration_qwen2_moe.py)
    shared = cfg.get("shared_expert_intermediate_size", default=5632, minimum=0)
    placed = _moe_pattern(cfg, kw["layers"])
    if placed is not None:
        kw["moe"] = MoESpec(experts=cfg.get("num_experts"), top_k=cfg.get("num_experts_per_tok"),
                            ffn_hidden=cfg.get("moe_intermediate_size"),
                            shared_experts=1 if shared else 0, shared_ffn_hidden=shared,
                            shared_expert_gate=bool(shared), **placed,
                            router_pre_softmax=_pre_softmax(cfg))
    return kw


def _glm4_moe(cfg: _Config) -> dict:
    # GLM-4.5: standard GQA attention whose q, k, v carry biases as attention_bias says (not its
    # output projection), DeepSeek-style routed and shared experts
    kw = _llama_like(cfg, qkv_bias=cfg.get("attention_bias", default=False, kind=bool))
    moe_ffn = cfg.get("moe_intermediate_size")
    # (absent keys: Glm4MoeConfig's one shared expert and one dense first layer, transformers
    # 5.23 configuration_glm4_moe.py)
    kw["moe"] = MoESpec(experts=cfg.get("n_routed_experts"), top_k=cfg.get("num_experts_per_tok"),
                        ffn_hidden=moe_ffn,
                        shared_experts=cfg.get("n_shared_experts", default=1, minimum=0),
                        shared_ffn_hidden=moe_ffn,
                        first_dense_layers=cfg.get("first_k_dense_replace", default=1, minimum=0),
                        **_deepseek_router(cfg))
    kw["mtp_layers"] = _mtp_layers(cfg)
    kw["qk_norm"] = cfg.get("use_qk_norm", default=False, kind=bool)  # GLM-4.5 sets it
    kw["rope_fraction"] = _rope_fraction(cfg, 0.5)  # Glm4MoeConfig's default
    return kw


def _mtp_layers(cfg: _Config) -> int:
    """Multi-token-prediction depths the config ships, which Megatron-Bridge's DeepSeek and GLM
    bridges train by default (``mtp_num_layers = num_nextn_predict_layers``: NVIDIA-NeMo/
    Megatron-Bridge @ 067f987df0, src/megatron/bridge/models/deepseek/deepseek_v3_bridge.py:97,
    src/megatron/bridge/models/glm/glm45_bridge.py:86)."""
    return cfg.get("num_nextn_predict_layers", default=0, minimum=0)


GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}
"""GPT-OSS's RoPE scaling where its config gives none: GptOssConfig's default
(src/transformers/models/gpt_oss/configuration_gpt_oss.py @ huggingface/transformers
828a27fd326e49d4a1c4b08210bfd32c107facc9, unchanged in the 5.23.0 wheel)."""


def _gpt_oss(cfg: _Config) -> dict:
    # GPT-OSS: every block MoE; sliding-window attention on the layers layer_types names
    # every linear layer carries a bias (attention_bias: q, k, v and o; the experts'
    # gate_up_proj_bias and down_proj_bias and the router's bias in the modelling code), and each
    # head a learned sink logit (self_attn.sinks)
    # the experts' clamped GLU, whatever hidden_act says (the modelling code hard-codes it)
    kw = {**_llama_like(cfg, mlp=MLPKind.SWIGLU, qkv_bias=False), "attention_sinks": True}
    # as transformers builds it (absent: GptOssConfig's true, transformers 5.23); Megatron-Bridge
    # builds every GPT-OSS with them (add_bias_linear, gpt_oss_bridge.py @ 067f987df0)
    kw["bias"] = cfg.get("attention_bias", default=True, kind=bool)
    kw["moe"] = MoESpec(experts=cfg.get("num_local_experts"), top_k=cfg.get("num_experts_per_tok"),
                        ffn_hidden=cfg.get("intermediate_size"), expert_bias=True)
    # absent keys as GptOssConfig defaults them: a 128-token window on layers 0, 2, 4, ..., and
    # YaRN with a context extension of 32 (``GPT_OSS_YARN``)
    window = _span(cfg, "sliding_window", 128)
    kw.update(_sliding(cfg, kw["layers"], window, range(0, kw["layers"], 2)))
    if "rope_scaling" not in cfg.data and "rope_parameters" not in cfg.data:
        default = _Config({"rope_scaling": GPT_OSS_YARN}, cfg.source)
        kw["rope_mscale"], kw["yarn"] = _rope(default)
    # both halves of the GLU clamped to swiglu_limit before the activation (7 unless the config
    # says otherwise, as transformers' GptOssConfig defaults it)
    kw["glu_clamp"] = cfg.get("swiglu_limit", kind=float, minimum=0, default=7.0)
    alpha = cfg.get("swiglu_alpha", kind=float, minimum=0, default=1.702)
    if alpha != 1.702:  # (GptOssConfig's default; Megatron-Core's quick GeLU fixes it)
        warnings.warn(HFNote(f"{cfg.where('swiglu_alpha')}: {alpha:g} is not the 1.702 of "
                             "Megatron-Core's quick GeLU, which the Megatron export runs"),
                      stacklevel=2)
    if not kw["glu_clamp"]:
        raise SpecError(cfg.where("swiglu_limit"), 0, "must be > 0 (the clamp limit)")
    return kw


def _language_config(cfg: _Config) -> _Config:
    """The language model's keys: a multimodal config's ``text_config`` (Llama 4), else the
    config itself."""
    return cfg.table("text_config", null=False) if "text_config" in cfg.data else cfg


def _llama4(cfg: _Config) -> dict:
    # Llama 4: dense and MoE blocks interleaved, one shared expert, chunked attention on the
    # RoPE layers (no_rope_layers: 1 = RoPE and chunked, 0 = global NoPE attention); absent keys
    # as Llama4TextConfig fills them: MoE blocks on `moe_layers`, else every
    # interleave_moe_layer_step-th; a NoPE layer every no_rope_layer_interval-th; the masks as
    # layer_types names them, else chunked where RoPE is (Llama4TextConfig.__post_init__,
    # configuration_llama4.py, transformers 5.23.0 wheel; the model picks each layer's mask by
    # layer_types, its RoPE by no_rope_layers and its MLP by moe_layers: modeling_llama4.py)
    cfg = _language_config(cfg)
    kw = _llama_like(cfg)
    # (absent: Llama4TextConfig's, not the experts' intermediate_size, as it had been read)
    kw["ffn_hidden"] = _dense_ffn(cfg, "intermediate_size_mlp")
    layers = kw["layers"]
    expert_ffn = cfg.get("intermediate_size")
    listed = _layer_indices(cfg, "moe_layers", layers)
    if listed is None:
        step = cfg.get("interleave_moe_layer_step", default=1)
        placed = dict(first_dense_layers=step - 1, layer_freq=step)
    elif listed:
        placed = moe_layer_fields(listed, layers)
    else:  # (an empty list: every block dense, as the model builds it)
        placed = None
        warnings.warn(HFNote(f"{cfg.where('moe_layers')}: empty: every block is dense (no "
                             "experts)"), stacklevel=2)
    # its router scores the chosen expert with a sigmoid (Megatron-LM examples/post_training/
    # modelopt/conf/meta-llama/Llama-4-Maverick-17B-128E-Instruct.sh @ d98e8a64dd), and the score
    # scales the expert's input (Llama4TextMoe.forward, transformers 5.23.0 wheel)
    if placed is not None:
        kw["moe"] = MoESpec(experts=cfg.get("num_local_experts"),
                            top_k=cfg.get("num_experts_per_tok"), ffn_hidden=expert_ffn,
                            shared_experts=1, shared_ffn_hidden=expert_ffn, **placed,
                            router_score="sigmoid", scores_on_input=True)
    # weightless L2 norms of each head's queries and keys (Scout sets use_qk_norm, Maverick does
    # not); absent keys take Llama4TextConfig's defaults, use_qk_norm true and 8,192-token chunks,
    # a null chunk size none (src/transformers/models/llama4/configuration_llama4.py @
    # huggingface/transformers b17cfe48c5a9631dcf9f57f3865a055903800f81)
    kw["qk_l2_norm"] = cfg.get("use_qk_norm", default=True, kind=bool, null=False)
    # (an empty list is the default pattern: Llama4TextConfig takes `no_rope_layers if
    # no_rope_layers else` its default, configuration_llama4.py, transformers 5.23.0 wheel)
    rope = cfg.get("no_rope_layers", default=None, kind=list,
                   rule="must list a 1 (RoPE) or 0 (NoPE) per layer") or None
    if rope is not None and len(rope) != layers:
        raise SpecError(cfg.where("no_rope_layers"), f"{len(rope)} entries",
                        f"needs one per layer ({layers})")
    odd = [r for r in rope or () if r not in (0, 1) or isinstance(r, float)]
    if odd:
        raise SpecError(cfg.where("no_rope_layers"), odd[0],
                        "entries allowed: 1 (RoPE, chunked attention), 0 (NoPE, global attention)")
    interval = cfg.get("no_rope_layer_interval", default=4)
    with_rope = tuple(i for i in range(layers) if (rope[i] if rope else (i + 1) % interval))
    types = _layer_types(cfg, layers, LLAMA4_LAYER_KINDS)
    chunked = with_rope if types is None else tuple(
        i for i, t in enumerate(types) if t == "chunked_attention")
    chunk = _span(cfg, "attention_chunk_size", 8192)
    if chunk and chunked != with_rope:
        warnings.warn(HFNote(f"{cfg.where('layer_types')}: its chunked layers are not the RoPE "
                             "layers no_rope_layers gives: costed as layer_types says; the "
                             "Megatron export's NoPE layers (--no-rope-freq) are the unchunked ones "
                             "(none where none is chunked)"),
                      stacklevel=2)
    if chunk and chunked:
        kw.update(local_span=chunk, local_share=len(chunked) / layers, local_layers=chunked)
    return kw


def _deepseek_moe_layers(cfg: _Config, layers: int, dense: int) -> tuple[int, int]:
    """(first_dense_layers, layer_freq) of a DeepSeek-style config: layer i is an MoE layer when
    i >= ``first_k_dense_replace`` (absent: ``dense``, its config class's) and
    i % ``moe_layer_freq`` == 0, as DeepSeek's and Kimi's reference code and vLLM build it
    (``DeepseekV2DecoderLayer``, vllm-project/vllm vllm/model_executor/models/deepseek_v2.py @
    002d6073aa; transformers' DeepseekV2 and DeepseekV3 ignore the key, and every published
    config sets it to 1). ``ModelSpec.is_moe_layer`` counts the period from the first MoE layer:
    the first multiple of the period from the dense layers on (the first dense count had been
    taken as that offset: a period of 2 after 3 dense layers had made layers 3, 5, ... MoE, not
    4, 6, ...)."""
    dense = cfg.get("first_k_dense_replace", default=dense, minimum=0)
    freq = cfg.get("moe_layer_freq", default=1)
    first = -(-dense // freq) * freq
    if dense >= layers:  # (ModelSpec says so of the dense layers, as the config counts them)
        return dense, freq
    if first >= layers:
        raise SpecError(cfg.where("moe_layer_freq"), freq,
                        f"leaves no MoE layer among the {layers} (layer i is one when i >= "
                        f"first_k_dense_replace = {dense} and i % moe_layer_freq == 0)")
    return first, freq


def _deepseek_mla(cfg: _Config, family: str, bridge: str) -> dict:
    """DeepSeek's multi-head latent attention and dense blocks: no biases, as Megatron-Bridge
    builds them (``add_bias_linear = False`` in ``bridge`` @ NVIDIA-NeMo/Megatron-Bridge
    067f987df0; transformers' attention_bias would bias q_a, kv_a and o, which MLA cannot carry
    here); a low-rank query of 1,536 where the key is absent (both config classes'), none where it
    is null (V2-Lite's)."""
    kw = _unbiased(cfg, f"{family} as Megatron-Bridge builds it",
                   f"add_bias_linear = False, {bridge}")
    mla = MLASpec(q_lora_rank=cfg.get("q_lora_rank", default=1536, null=0, minimum=0),
                  kv_lora_rank=cfg.get("kv_lora_rank"),
                  qk_nope_head_dim=cfg.get("qk_nope_head_dim"),
                  qk_rope_head_dim=cfg.get("qk_rope_head_dim"),
                  v_head_dim=cfg.get("v_head_dim"))
    # MLA applies its YaRN scale in its own path (Megatron-Core's MLA RoPE), not the one
    # ``rope_mscale`` costs
    if kw["rope_mscale"] != 1 and kw["yarn"] is None:  # (a scale without an extension)
        warnings.warn(f"{cfg.source}: rope_scaling scales MLA's RoPE by "
                      f"{kw['rope_mscale']:.4g} without extending its context (factor 1), which "
                      "Megatron-Core's YaRN cannot: costed and exported unscaled", Note)
    kw.update(mla=mla, kv_heads=kw["heads"], head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
              rope_mscale=1.0)
    return kw


def _deepseek(cfg: _Config, family: str, bridge: str, *, dense: int, shared: int,
              router: Callable[[_Config], dict]) -> dict:
    """A DeepSeek-style model (``_deepseek_mla``'s attention, routed and shared experts of the
    experts' size, ``dense`` leading dense layers and ``shared`` shared experts where the config
    leaves them out, multi-token-prediction depths), its router's fields ``router``
    (``_deepseek_router``, read after the experts as its keys were)."""
    kw = _deepseek_mla(cfg, family, bridge)
    moe_ffn = cfg.get("moe_intermediate_size")
    first, freq = _deepseek_moe_layers(cfg, kw["layers"], dense)
    kw["moe"] = MoESpec(experts=cfg.get("n_routed_experts", "num_local_experts"),
                        top_k=cfg.get("num_experts_per_tok"), ffn_hidden=moe_ffn,
                        shared_experts=cfg.get("n_shared_experts", default=shared, minimum=0),
                        shared_ffn_hidden=moe_ffn, first_dense_layers=first, layer_freq=freq,
                        **router(cfg))
    kw["mtp_layers"] = _mtp_layers(cfg)
    return kw


def _deepseek_v3(cfg: _Config) -> dict:
    # (absent keys as DeepseekV3Config fills them: 3 dense layers, one shared expert)
    return _deepseek(cfg, "DeepSeek-V3", "deepseek_v3_bridge.py", dense=3, shared=1,
                     router=lambda c: _deepseek_router(c, absent=DEEPSEEK_ROUTER))


def _v2_router(cfg: _Config) -> dict:
    """DeepSeek-V2's router fields: a softmax over every expert before the top-k
    (moe_router_pre_softmax, as the V2 bridge sets it), whatever ``scoring_func`` says, as
    ``DeepseekV2TopkRouter`` computes them (transformers 5.23.0 wheel; it reads no such key), with
    a note where a config names another (a review's)."""
    router = _deepseek_router(cfg, score="softmax", methods=V2_TOPK_METHODS)
    if router["router_score"] != "softmax":
        warnings.warn(HFNote(f"{cfg.where('scoring_func')}: {router['router_score']!r} ignored: "
                             "DeepSeek-V2's router scores with a softmax (DeepseekV2TopkRouter "
                             "reads no scoring_func)"), stacklevel=4)
    return {**router, "router_score": "softmax", "router_pre_softmax": True}


def _deepseek_v2(cfg: _Config) -> dict:
    # DeepSeek-V2 (and V2-Lite): V3's attention; the softmax router of ``_v2_router``, greedy or
    # group-limited without V3's expert bias, and its shared experts one MLP of n_shared_experts
    # times the experts' size (DeepseekV2Moe.shared_experts). Absent keys as DeepseekV2Config
    # fills them: no dense first layer, two shared experts, no groups, a scale of 1, greedy top-k
    # (transformers 5.23.0 wheel, models/deepseek_v2/)
    return _deepseek(cfg, "DeepSeek-V2", "deepseek_v2_bridge.py", dense=0, shared=2,
                     router=_v2_router)


def _gpt2(cfg: _Config) -> dict:
    hidden = cfg.get("n_embd", "hidden_size")
    return dict(
        layers=cfg.get("n_layer", "num_hidden_layers"), hidden=hidden,
        heads=cfg.get("n_head", "num_attention_heads"),
        ffn_hidden=cfg.get("n_inner", default=4 * hidden), vocab=cfg.get("vocab_size"),
        mlp=MLPKind.GELU, norm=Norm.LAYERNORM, bias=True, dropout=True,
        tied_embeddings=cfg.get("tie_word_embeddings", default=True, kind=bool),
        position=Position.LEARNED, max_positions=cfg.get("n_positions", "max_position_embeddings"),
    )


def _gpt_neox(cfg: _Config) -> dict:
    return dict(
        layers=cfg.get("num_hidden_layers"), hidden=cfg.get("hidden_size"),
        heads=cfg.get("num_attention_heads"), ffn_hidden=cfg.get("intermediate_size"),
        vocab=cfg.get("vocab_size"), mlp=MLPKind.GELU, norm=Norm.LAYERNORM, bias=True,
        tied_embeddings=cfg.get("tie_word_embeddings", default=False, kind=bool),
        position=Position.ROPE,
        rope_theta=_noted_default(cfg, cfg.get("rotary_emb_base", "rope_theta", kind=float,
                                               default=None), "rotary_emb_base"),
        rope_fraction=_rope_fraction(cfg, 0.25),  # GPTNeoXConfig's default
    )


def _bloom(cfg: _Config) -> dict:
    hidden = cfg.get("hidden_size", "n_embed")
    return dict(
        layers=cfg.get("n_layer", "num_hidden_layers"), hidden=hidden,
        heads=cfg.get("n_head", "num_attention_heads"), ffn_hidden=4 * hidden,
        vocab=cfg.get("vocab_size"), mlp=MLPKind.GELU, norm=Norm.LAYERNORM, bias=True,
        tied_embeddings=cfg.get("tie_word_embeddings", default=True, kind=bool),
        position=Position.ALIBI,
    )


HEAD_DIM_DEFAULTS = {"qwen3": 128, "gpt_oss": 64, "llama4": 128, "llama4_text": 128}
"""Each family's ``head_dim`` where its config leaves it out, where its config class fixes one
(transformers 5.23.0 wheel; tests/test_hf_models.py reads them from the classes); the others'
models take hidden_size / num_attention_heads (a user trial: a trimmed Qwen3 config, whose
class has 128, had been read at hidden_size / num_attention_heads)."""
HEAD_DIM_STATED = {"mistral", "qwen3_moe", "glm4_moe", *HEAD_DIM_DEFAULTS}
"""Families whose released configs state ``head_dim`` (not hidden_size / num_attention_heads in
some of their models: Mistral-Nemo's 128 for 5,120 over 32 heads): one left out is noted (a user
trial's trimmed Qwen3-MoE config halved its heads' width, and a 64K-token step, without a
word)."""
DENSE_FFN_DEFAULTS = {"qwen2_moe": 5632, "qwen3_moe": 6144, "deepseek_v2": 11008,
                      "deepseek_v3": 18432, "kimi_k2": 18432, "glm4_moe": 10944, "llama4": 16384,
                      "llama4_text": 16384}
"""The MoE families' dense MLP size where the config leaves it out (``intermediate_size``;
Llama 4's ``intermediate_size_mlp``): its config class's default (transformers 5.23.0 wheel;
Kimi-K2 as DeepseekV3Config), which sizes the dense blocks only, the experts having sizes of their
own (a user trial's trimmed Qwen3-MoE config, whose blocks are all MoE, had been refused)."""
CONTEXT_DEFAULTS = {"llama": 2048, "gpt_neox": 2048, "mistral": 131072, "mixtral": 131072,
                    "qwen2": 32768, "qwen3": 32768, "qwen2_moe": 32768, "qwen3_moe": 32768,
                    "deepseek_v2": 2048, "deepseek_v3": 4096, "kimi_k2": 4096, "glm4_moe": 131072,
                    "gpt_oss": 131072, "llama4": 131072, "llama4_text": 131072}
"""The RoPE families' ``max_position_embeddings`` where the config leaves it out: its config
class's default (transformers 5.23.0 wheel; Kimi-K2 as DeepseekV3Config), the context the model
was built for (a user trial's trimmed config had lost the note of a sequence beyond it)."""


def _class_default(where: str, value, what: str = "") -> None:
    """Note that key ``where`` is missing and read as its config class's default ``value`` (what it
    is, ``what``): every key a trimmed config leaves out that transformers fills in so."""
    warnings.warn(HFNote(f"{where}: missing, read as its config class's default {value:,} "
                         f"(transformers){what}"), stacklevel=3)


def _head_dim(cfg: _Config, hidden: int, heads: int) -> int:
    """``head_dim``, or where absent its config class's (``HEAD_DIM_DEFAULTS``), else
    hidden_size / num_attention_heads as the family's model reads it (a remainder is refused by
    ``model_from_hf_dict``), noted for a family whose configs state it."""
    given = cfg.get("head_dim", default=None)
    if given is not None:
        return given
    dim = HEAD_DIM_DEFAULTS.get(cfg.model_type) or hidden // heads  # (heads: at least 1)
    if cfg.model_type in HEAD_DIM_STATED:  # (every family of HEAD_DIM_DEFAULTS)
        how = ("its config class's default" if cfg.model_type in HEAD_DIM_DEFAULTS else
               f"hidden_size / num_attention_heads = {hidden} / {heads}, as its model reads it")
        warnings.warn(HFNote(f"{cfg.where('head_dim')}: missing, read as {dim} ({how}; "
                             "transformers)"), stacklevel=3)
    return dim


def _dense_ffn(cfg: _Config, key: str) -> int:
    """The dense MLP's size (``key``), required but in the MoE families, whose config class's
    default (``DENSE_FFN_DEFAULTS``) it takes where absent, noted where a dense block has it
    (``model_from_hf_dict``: ``cfg.defaulted``)."""
    default = DENSE_FFN_DEFAULTS.get(cfg.model_type)
    if default is None:
        return cfg.get(key)
    size = cfg.get(key, default=None)
    if size is None:
        cfg.defaulted[cfg.where(key)] = default
        return default
    return size


KV_HEADS_DEFAULTS = {"mistral": 8, "mixtral": 8, "qwen2": 32, "qwen3": 32, "qwen2_moe": 16,
                     "qwen3_moe": 4, "glm4_moe": 8, "gpt_oss": 8, "llama4": 8, "llama4_text": 8}
"""Each family's ``num_key_value_heads`` where its config leaves it out: its config class's
default (transformers 5.23.0 wheel; tests/test_hf_models.py reads them from the classes); Llama's
class takes the query heads, as does a family not listed (a user trial: a trimmed Qwen3-MoE
config had been read with 64 K/V heads where transformers reads 4)."""


def _kv_heads(cfg: _Config, heads: int) -> int:
    """``num_key_value_heads`` (the query heads where null), or where absent the family's
    default (``KV_HEADS_DEFAULTS``), which must divide the query heads."""
    # null: no grouping, as transformers' Qwen2/Qwen3 classes read it (the others refuse a null)
    kv = cfg.get("num_key_value_heads", default=None, null=heads)
    if kv is not None:
        return kv
    kv = KV_HEADS_DEFAULTS.get(cfg.model_type, heads)
    if heads % kv:
        raise SpecError(cfg.where("num_key_value_heads"), ABSENT,
                        f"missing, read as its config class's default {kv} (transformers), which "
                        f"does not divide num_attention_heads = {heads}; give it")
    _class_default(cfg.where("num_key_value_heads"), kv)  # (silently, before)
    return kv


AUX_LOSS_DEFAULTS = {"mixtral": 0.001, "qwen2_moe": 0.001, "qwen3_moe": 0.001, "gpt_oss": 0.001,
                     "llama4": 0.001, "llama4_text": 0.001}
"""Each MoE family's load-balancing loss coefficient where its config leaves it out: its config
class's ``router_aux_loss_coef`` (transformers 5.23.0 wheel); DeepSeek-V3's and GLM-4.5's classes
have none (balanced by their routers' expert biases)."""


def _balancing(cfg: _Config, moe: MoESpec, default: float, *, per_sequence: bool,
               needs_logits: bool = False) -> MoESpec:
    """``moe`` with the config's load-balancing loss: ``router_aux_loss_coef`` or DeepSeek's
    ``aux_loss_alpha`` (else the family's ``default``), per sequence where ``seq_aux`` says so in
    a family that reads it (``per_sequence``: DeepSeek's); none for a family that
    Megatron-Bridge's provider trains without one (``needs_logits``: GPT-OSS) unless the config
    turns ``output_router_logits`` on, the switch with which transformers adds the loss in
    training. (Every family's released config has it off; the others keep its coefficient.)"""
    coeff = cfg.get("router_aux_loss_coef", "aux_loss_alpha", kind=float, minimum=0,
                    default=default)
    if needs_logits and coeff and not cfg.get("output_router_logits", kind=bool, default=False,
                                              null=False):
        # transformers adds the loss only when the router's logits are output, which GPT-OSS's
        # released config turns off, and Megatron-Bridge trains GPT-OSS without one
        # (moe_router_load_balancing_type = "none": src/megatron/bridge/models/gpt_oss/
        # gpt_oss_provider.py @ NVIDIA-NeMo/Megatron-Bridge 355cef4570)
        warnings.warn(HFNote(f"{cfg.where('router_aux_loss_coef')}: {coeff:g} not read as a "
                             "balancing loss: output_router_logits is off, and Megatron-Bridge "
                             "trains GPT-OSS without one; give [moe] aux_loss in a model file "
                             "to train with it"), stacklevel=2)
        coeff = 0.0
    if per_sequence and coeff and "seq_aux" not in cfg.data:
        # DeepSeek's own config class (configuration_deepseek.py, which DeepSeek-V3's and
        # Kimi-K2's repositories load through auto_map) defaults seq_aux to true: e.g.
        # itounagi0116/DeepSeek-R1 @ 945ea33cfe, configuration_deepseek.py (a user trial's trimmed
        # Kimi-K2 config had been read as the per-token loss, and exported so)
        warnings.warn(HFNote(f"{cfg.where('seq_aux')}: missing, read as DeepSeek's config "
                             "class's default true (the balancing loss per sequence)"))
    # (an explicit null is the class's None, falsy: the per-token loss, as the model reads it)
    per_sequence = per_sequence and bool(coeff) and cfg.get("seq_aux", kind=bool, default=True,
                                                            null=False)
    try:
        return replace(moe, aux_loss=coeff, aux_loss_per_sequence=per_sequence)
    except SpecError as e:
        key = "router_aux_loss_coef" if "router_aux_loss_coef" in cfg.data else "aux_loss_alpha"
        raise SpecError(cfg.where(key), e.value, e.allowed) from None


NORM_EPS_KEYS = {"gpt2": "layer_norm_epsilon", "bloom": "layer_norm_epsilon",
                 "gpt_neox": "layer_norm_eps"}
"""The key that gives each family's norm epsilon (read as its config class reads it):
``rms_norm_eps`` for the RMSNorm families (``NORM_EPS_DEFAULTS``' others)."""
NORM_EPS_DEFAULTS = {"llama": 1e-6, "mistral": 1e-6, "mixtral": 1e-5, "qwen2": 1e-6, "qwen3": 1e-6,
                     "qwen2_moe": 1e-6, "qwen3_moe": 1e-6, "gpt2": 1e-5, "gpt_neox": 1e-5,
                     "bloom": 1e-5, "deepseek_v2": 1e-6, "deepseek_v3": 1e-6, "kimi_k2": 1e-6,
                     "glm4_moe": 1e-5, "gpt_oss": 1e-5, "llama4": 1e-5, "llama4_text": 1e-5}
"""Each family's norm epsilon where its config leaves it out: its config class's default
(transformers 5.23.0 wheel; Kimi-K2 runs DeepSeek-V3's)."""

FAMILIES: dict[str, Callable[[_Config], dict]] = {
    "llama": _llama, "mistral": _mistral, "mixtral": _mixtral, "qwen2": _qwen2, "qwen3": _qwen3,
    "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe, "gpt2": _gpt2, "gpt_neox": _gpt_neox,
    "bloom": _bloom, "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3,
    "kimi_k2": _deepseek_v3, "glm4_moe": _glm4_moe, "gpt_oss": _gpt_oss, "llama4": _llama4,
    "llama4_text": _llama4,
}

ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe",
    "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox", "BloomForCausalLM": "bloom",
    "DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3",
    "Glm4MoeForCausalLM": "glm4_moe",
    "GptOssForCausalLM": "gpt_oss", "Llama4ForConditionalGeneration": "llama4",
    "Llama4ForCausalLM": "llama4_text",
}
"""HuggingFace model classes (``architectures``) and the family each is read as."""


def model_from_hf_dict(data: dict, source: str = "config.json") -> ModelSpec:
    """A ModelSpec from the dict of a HuggingFace ``config.json``."""
    if not isinstance(data, dict):
        raise SpecError(source, type(data).__name__, "a config.json must hold a JSON object")
    mtype = data.get("model_type")
    if mtype is not None and not isinstance(mtype, str):
        raise SpecError(f"{source}: model_type", mtype, "must be a string (a model type)")
    if mtype not in FAMILIES:
        archs = data.get("architectures") or []
        if not isinstance(archs, list):
            raise SpecError(f"{source}: architectures", archs, "must be a list of model class names")
        known = [a for a in archs if isinstance(a, str) and a in ARCHITECTURES]
        if not known:
            raise SpecError(f"{source}: model_type", mtype,
                            f"supported model types: {', '.join(sorted(FAMILIES))} (or "
                            "architectures naming one of their model classes)")
        mtype = ARCHITECTURES[known[0]]  # (the first class it knows: a name without a newline)
        warnings.warn(HFNote(f"{source}: model_type {data.get('model_type')!r} is not one "
                             f"nestplan knows; read as {mtype}, the family of its architecture "
                             f"{known[0]}"), stacklevel=2)
    try:
        # the family read (architectures may name it): its defaults are that family's
        cfg = _Config(data, source, model_type=mtype)
        kw = FAMILIES[mtype](cfg)
        # (a multimodal Llama 4 holds its language model's keys in text_config; no other family)
        lm = _language_config(cfg) if mtype in ("llama4", "llama4_text") else cfg
        # the context a model was built for, checked in every family (a user trial's -1 had been
        # taken without a word), kept for RoPE models (a learned table has its rows already)
        context = lm.get("max_position_embeddings", "n_positions", default=None)
        rope = kw.get("position", Position.ROPE) is Position.ROPE
        if rope and context is None and mtype in CONTEXT_DEFAULTS:
            context = CONTEXT_DEFAULTS[mtype]
            _class_default(lm.where("max_position_embeddings"), context,
                           ", the context the model was built for")
        if rope and type(context) is int:
            kw["trained_context"] = context
        kw["norm_eps"] = lm.get(NORM_EPS_KEYS.get(mtype, "rms_norm_eps"), kind=float, minimum=0,
                                maximum=MAX_NORM_EPS, open_low=True, rule=NORM_EPS_RULE,
                                default=NORM_EPS_DEFAULTS[mtype])
        if kw.get("moe") is not None:
            kw["moe"] = _balancing(lm, kw["moe"], AUX_LOSS_DEFAULTS.get(mtype, 0.0),
                                   per_sequence=FAMILIES[mtype] in (_deepseek_v2, _deepseek_v3),
                                   needs_logits=mtype == "gpt_oss")
        if lm.data.get("head_dim") is None and kw.get("mla") is None \
                and mtype not in HEAD_DIM_DEFAULTS and kw["heads"] > 0 and kw["hidden"] % kw["heads"]:
            raise SpecError("hidden", kw["hidden"], f"must be a multiple of num_attention_heads "
                            f"= {kw['heads']} when the config gives no head_dim")
        kw.setdefault("head_dim", kw["hidden"] // kw["heads"])
        kw.setdefault("kv_heads", kw["heads"])
        model = ModelSpec(name=source, **kw)
        if model.num_moe_layers < model.layers:  # (unsaid where no block has a dense MLP)
            for where, size in cfg.defaulted.items():
                _class_default(where, size, ", the size of the dense blocks' MLP")
        return model
    except SpecError as e:  # name the config's key, not nestplan's field
        if e.field.startswith(f"{source}: "):
            raise
        keys = HF_KEYS.get(e.field.removeprefix("model."), ())
        names = (keys,) if isinstance(keys, str) else keys
        text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
        # (the config's key where it has it, its language model's in a multimodal one)
        key = next((k for k in names if k in data), None) or next(
            (f"text_config.{k}" for k in names if k in text), e.field)
        given = (text if key.startswith("text_config.") else data).get(
            key.removeprefix("text_config."))
        if key != e.field and given is not None and given != e.value:  # (a value read from it)
            raise SpecError(f"{source}: {key}", given, f"gives {e.field.removeprefix('model.')} "
                            f"= {e.value!r}: {e.allowed}") from None
        raise SpecError(f"{source}: {key}", e.value, e.allowed) from None


HF_KEYS = {"layers": ("num_hidden_layers", "n_layer"), "hidden": ("hidden_size", "n_embd", "n_embed"),
           "heads": ("num_attention_heads", "n_head"), "kv_heads": "num_key_value_heads",
           "head_dim": "head_dim", "ffn_hidden": ("intermediate_size", "n_inner"),
           "vocab": "vocab_size",
           "moe.experts": ("num_experts", "num_local_experts", "n_routed_experts"),
           "moe.top_k": "num_experts_per_tok",
           "moe.ffn_hidden": "moe_intermediate_size", "rope_mscale": "rope_scaling",
           "glu_clamp": "swiglu_limit", "rope_theta": ("rope_theta", "rotary_emb_base"),
           "local_span": ("sliding_window", "attention_chunk_size"),
           "moe.first_dense_layers": ("first_k_dense_replace", "interleave_moe_layer_step",
                                      "decoder_sparse_step", "mlp_only_layers"),
           "moe.layer_freq": ("moe_layer_freq", "decoder_sparse_step",
                              "interleave_moe_layer_step"),
           "moe.layers": ("moe_layers", "mlp_only_layers"),
           "moe.shared_experts": "n_shared_experts",
           "moe.shared_ffn_hidden": "shared_expert_intermediate_size",
           **{f"mla.{k}": k for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                      "qk_rope_head_dim", "v_head_dim")},
           "moe.router_score": "scoring_func", "moe.router_groups": "n_group",
           "moe.router_group_top_k": "topk_group", "moe.router_scale": "routed_scaling_factor",
           "moe.router_expert_bias": "topk_method",
           "mtp_layers": "num_nextn_predict_layers",
           "norm_eps": ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"),
           "max_positions": ("n_positions", "max_position_embeddings")}
"""nestplan's model fields and the config.json keys they usually come from (for messages)."""


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a HuggingFace ``config.json`` file."""
    from .loaders import checked_name, read_document

    data = read_document(path, "model", "JSON")
    name = Path(path).name if Path(path).name != "config.json" else str(Path(path))
    return model_from_hf_dict(data, checked_name(name, "model"))  # (the name heads every output)
