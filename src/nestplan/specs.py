"""Frozen, validated specifications: accelerator, cluster, model, training setup, parallel plan.

Every quantity is in SI units (bytes, seconds, FLOP, bytes/s). Construction validates and raises
:class:`~nestplan.errors.SpecError` naming the field, the value and the rule.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, replace
from functools import cached_property

from .axes import MEGATRON_ORDER, RANK_AXES, Axis, order_text
from .errors import SpecError
from typing import TYPE_CHECKING

from .options import MLPKind, Norm, Position, Precision
from .recompute import names_text, runs_text
from .schedule import MICRO_BATCHES, SCHEDULES, is_default, resolve
from .units import US

if TYPE_CHECKING:  # stack.py builds on this module's helpers
    from .stack import StackSpec

# ----------------------------------------------------------------------------- helpers


MAX_TOKENS = 2**24
"""Largest sequence length (tokens) and global batch (sequences) a scenario may name: 16.8M,
beyond the longest context offered (10M tokens: Llama 4 Scout, Meta AI blog "The Llama 4 herd",
2025-04-05) and any batch in use."""

MAX_MTP_LAYERS = 16
"""Most multi-token-prediction depths a model may train (DeepSeek-V3 trains one; Megatron-Bridge's
MTP guide, docs/training/multi-token-prediction.md, gives 1-2 as the typical range): each depth
adds a block and a loss to the last pipeline stage."""

MAX_KERNEL_OVERHEAD_US = 1000.0
"""Most launch overhead an accelerator or stack may add per kernel, µs (a launch takes a few)."""
MIN_ROPE_MSCALE, MAX_ROPE_MSCALE = 0.1, 10.0
"""Bounds of a RoPE scale (``ModelSpec.rope_mscale``): YaRN's 0.1·ln(factor) + 1 is 10 only at a
context extension of e^90; published factors (4-64) give 1.14-1.42, and a ratio of two mscales
below 1 stays near it."""
DEFAULT_ROPE_THETA = 10000.0
"""RoPE's base period when a model does not give one: the RoPE paper's (Su et al. 2021), the
HuggingFace Llama configs' default and Megatron-LM's ``--rotary-base`` default
(megatron/training/arguments.py @ NVIDIA/Megatron-LM d98e8a64dd)."""
ROUTER_SCORES = ("softmax", "sigmoid")
"""How an MoE router may score its experts (Megatron-Core ``--moe-router-score-function``)."""
MAX_ROPE_THETA = 1e9
"""Largest RoPE base period accepted: published configs range 10,000 (Llama 2) to 10^6 (Qwen3,
Mixtral); 1e9 leaves room without admitting nonsense."""
MAX_YARN_FACTOR = 1e6
"""Bound of YaRN's numbers (``YarnSpec``): the largest context extension (published factors:
4-64), ramp bound (``beta_fast``, ``beta_slow``; published 1-32) and magnitude of ``mscale``
(published 0.707-1; one worked out from an ``attention_factor`` may be negative) a model may
give. Far beyond any published, it only keeps the arithmetic finite."""
CONTEXT_FACTOR_RULE = f"must be a number in [1, {MAX_YARN_FACTOR:g}] (the context extension)"
"""What a RoPE scaling's ``factor`` may be (``RopeScaling``, ``YarnSpec``, a config's)."""

MAX_ROUTER_SCALE = 100.0
"""Largest factor on routed experts' weights accepted (published: 1 to 2.827, Kimi-K2)."""
MAX_GLU_CLAMP = 1e6
"""Largest clamp limit of a gated activation (``ModelSpec.glu_clamp``; GPT-OSS uses 7)."""
DEFAULT_NORM_EPS = 1e-5
"""Megatron-Core's norm epsilon (``TransformerConfig.layernorm_epsilon``, Megatron-LM's
``--norm-epsilon``: megatron/core/transformer/transformer_config.py @ NVIDIA/Megatron-LM
d98e8a64dd)."""
MAX_AUX_LOSS = 10.0
"""Largest load-balancing loss coefficient accepted (published: 1e-4 to 0.9, GPT-OSS's)."""
MAX_NORM_EPS = 0.01
"""Largest norm epsilon accepted: published models use 1e-12 (BERT) to 1e-5."""
NORM_EPS_RULE = f"must be a number in (0, {MAX_NORM_EPS:g}] (the norms' epsilon)"
"""What ``ModelSpec.norm_eps`` may be (a model file's, a config's)."""


def _positive(name: str, value, *, integer: bool = True, allow_zero: bool = False):
    ok_type = isinstance(value, int) and not isinstance(value, bool) if integer else (
        isinstance(value, (int, float)) and not isinstance(value, bool))
    if not ok_type or (value < 0 if allow_zero else value <= 0) or (
            not integer and not math.isfinite(value)):
        kind = "an integer" if integer else "a number"
        bound = ">= 0" if allow_zero else "> 0"
        raise SpecError(name, value, f"must be {kind} {bound}")
    return value


def finite(value) -> bool:
    """``value`` is a number (not a boolean) a float can hold: NaN, infinities and integers too
    large to become a float are not (they are compared, not converted)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and -sys.float_info.max <= value <= sys.float_info.max)


MIN_EFFICIENCY = 1e-3
"""Least fraction of a peak (FLOP/s, HBM or link bandwidth) an efficiency may state: 0.1 %, ten
times below the least the catalog holds (1 % for 0.1-GFLOP fp8 GEMMs on H100); smaller values
describe no hardware and drive step times past what a float holds."""


UNMASKED_ATTENTION_GAIN = 1.10
"""How much faster per FLOP a fused attention kernel runs without a mask than causally, where an
accelerator file does not say (``AcceleratorSpec.unmasked_attention_gain``): cuDNN's forward on
H100 SXM5 at head dim 128 and 16K tokens, 595 TFLOP/s without a mask and 539 causal (Shah et al.,
FlashAttention-3, arXiv:2407.08608, Figure 5; at 8K 600 / 529, at 4K 609 / 518; FlashAttention-3's
own kernel 648 / 616 at 16K, 1.05). Taken for the backward and for other accelerators too,
unmeasured."""
MAX_UNMASKED_ATTENTION_GAIN = 2.0
"""The most ``unmasked_attention_gain`` may be: a causal kernel at half the unmasked one's rate."""


def efficiency_ok(value) -> bool:
    """``value`` is a number in [``MIN_EFFICIENCY``, 1]."""
    return finite(value) and MIN_EFFICIENCY <= value <= 1


def within(value, most: float) -> bool:
    """``value`` is a finite number in [0, most] (the bound with a relative 1e-9 of slack, so
    that a file's value at the bound survives its conversion to SI units and back)."""
    return (isinstance(value, (int, float)) and math.isfinite(value)
            and 0 <= value <= most * (1 + 1e-9))


def _divides(name: str, value: int, whole_name: str, whole: int, example: str = ""):
    if whole % value:
        hint = f", e.g. {example}" if example else ""
        raise SpecError(name, value, f"must divide {whole_name} = {whole}{hint}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (pairs up to its square root)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


class _CachedHash:
    """Frozen specs are cache keys all over the cost model: hash each one once."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs):
        # ``@dataclass(frozen=True)`` writes its own (uncached) __hash__ unless the class body
        # has one: give every subclass this one before the decorator runs.
        super().__init_subclass__(**kwargs)
        cls.__hash__ = _CachedHash.__hash__

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            # (the fields equality compares: a field kept for what is said of a spec, not for
            # what it costs, is neither: ``ModelSpec.trained_context``)
            h = hash(tuple(getattr(self, name) for name, f in self.__dataclass_fields__.items()
                           if f.compare))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self):
        # string hashes differ between processes: a pickled spec hashes afresh where it lands
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


# ----------------------------------------------------------------------------- hardware


@dataclass(frozen=True, kw_only=True)
class AcceleratorSpec(_CachedHash):
    """One accelerator model and its calibrated efficiencies."""

    name: str
    """Catalog name, e.g. ``h100-sxm-80gb``."""
    peak_flops_bf16: float
    """Peak dense bf16 matmul rate, FLOP/s."""
    peak_flops_fp8: float | None = None
    """Peak dense fp8 matmul rate, FLOP/s; None when the accelerator has no fp8 units."""
    hbm_bytes: float
    """Device memory capacity, bytes."""
    hbm_bandwidth: float
    """Peak device memory bandwidth, bytes/s."""
    matmul_efficiency_bf16: tuple[tuple[float, float], ...]
    """(GEMM FLOP, achieved fraction of bf16 peak) points, interpolated in log(FLOP)."""
    matmul_efficiency_fp8: tuple[tuple[float, float], ...] = ()
    """(GEMM FLOP, achieved fraction of fp8 peak) points; empty when fp8 is absent."""
    attention_efficiency: tuple[float, float]
    """Fraction of bf16 peak reached by fused (flash) attention, (forward, backward)."""
    memory_efficiency: float
    """Fraction of peak HBM bandwidth reached by memory-bound kernels."""
    unmasked_attention_gain: float = UNMASKED_ATTENTION_GAIN
    """How much faster per FLOP the fused attention runs without a mask than causally:
    ``attention_efficiency`` is a causal kernel's, and unmasked blocks (a context-parallel ring's
    after its first step, a bidirectional model's) run this much faster (the default's source:
    ``UNMASKED_ATTENTION_GAIN``)."""
    kernel_overhead: float = 0.0
    """Fixed time per kernel launch not hidden by the stream, seconds."""
    sustained_share: float = 1.0
    """Share of the peak rates its clocks sustain where a power limit holds them below the
    datasheet part's (compute-bound kernels run at ``peak · share · efficiency``; the peaks stay
    the datasheet's, the MFU convention)."""
    fitted_on: tuple[str, ...] = ()
    """The measured runs its efficiencies were fitted on or checked against (README "Accuracy");
    empty: none, and a plan on it says so (its figures rest on the file's stated efficiencies)."""
    compute_capability: float | None = None
    """NVIDIA's CUDA compute capability (9.0 Hopper, 10.0 and 10.3 Blackwell), which frameworks
    branch on (Megatron-LM asks for CUDA_DEVICE_MAX_CONNECTIONS=1 below 10); None for another
    vendor's part or where the file does not say."""

    def __post_init__(self):
        _positive("accelerator.peak_flops_bf16", self.peak_flops_bf16, integer=False)
        if self.peak_flops_fp8 is not None:
            _positive("accelerator.peak_flops_fp8", self.peak_flops_fp8, integer=False)
        _positive("accelerator.hbm_bytes", self.hbm_bytes, integer=False)
        _positive("accelerator.hbm_bandwidth", self.hbm_bandwidth, integer=False)
        for label, table, needed in (
                ("bf16", self.matmul_efficiency_bf16, True),
                ("fp8", self.matmul_efficiency_fp8, self.peak_flops_fp8 is not None)):
            key = f"accelerator.matmul_efficiency_{label}_by_GFLOP"
            if needed and not table:
                raise SpecError(key, [], f"needs at least one point (the {label} matmul peak is "
                                "set)")
            sizes = [0.0, *(p[0] for p in table), math.inf]
            if any(not a < b for a, b in zip(sizes, sizes[1:])) or any(
                    not efficiency_ok(e) for _, e in table):
                raise SpecError(key, [[f / 1e9, e] for f, e in table],
                                "points must be [GFLOP, efficiency] with finite GFLOP > 0, "
                                f"increasing, and efficiency in [{MIN_EFFICIENCY:g}, 1]")
            if table and table[0][0] > MAX_FIRST_GEMM_FLOP:
                raise SpecError(key, [[f / 1e9, e] for f, e in table],
                                f"the first point must be at most {MAX_FIRST_GEMM_FLOP / 1e9:g} "
                                "GFLOP (below it efficiency falls with the size, and a table in "
                                "FLOP, not GFLOP, runs every GEMM at a billionth of the peak)")
        if not efficiency_ok(self.sustained_share):
            raise SpecError("accelerator.sustained_share", self.sustained_share,
                            f"must be in [{MIN_EFFICIENCY:g}, 1]: the share of the peak its "
                            "clocks sustain")
        for key, values in (("attention_efficiency", self.attention_efficiency),
                            ("memory_efficiency", (self.memory_efficiency,))):
            if not all(efficiency_ok(e) for e in values):
                raise SpecError(f"accelerator.{key}", values if len(values) > 1 else values[0],
                                f"efficiencies must be in [{MIN_EFFICIENCY:g}, 1]")
        gain = self.unmasked_attention_gain
        if not (finite(gain) and 1 <= gain <= MAX_UNMASKED_ATTENTION_GAIN):
            raise SpecError("accelerator.unmasked_attention_gain", gain, "must be a number in "
                            f"[1, {MAX_UNMASKED_ATTENTION_GAIN:g}]: how much faster per FLOP the "
                            "attention runs without a mask than causally")
        us = self.kernel_overhead / US
        if not within(us, MAX_KERNEL_OVERHEAD_US):
            raise SpecError("accelerator.kernel_overhead_us", us, "must be a number >= 0 and at "
                            f"most {MAX_KERNEL_OVERHEAD_US:g} (a launch takes a few)")

    def sustained_flops(self, precision: Precision) -> float:
        """The matmul rate its clocks sustain in ``precision`` (peak times ``sustained_share``)."""
        return self.peak_flops(precision) * self.sustained_share

    def peak_flops(self, precision: Precision) -> float:
        """Peak matmul FLOP/s in ``precision``."""
        if precision is Precision.FP8:
            if self.peak_flops_fp8 is None:
                raise SpecError("precision", "fp8", f"{self.name} has no fp8 matmul units; use bf16")
            return self.peak_flops_fp8
        return self.peak_flops_bf16


MAX_FIRST_GEMM_FLOP = 100e9
"""Where an accelerator's GEMM efficiency table must begin at the latest: below its first point
efficiency falls in proportion to the call's size (``cost.compute.interpolate``), and a
transformer block's smaller GEMMs are a few to tens of GFLOP (the catalog's tables begin at 0.1)."""
MAX_WIDTH = 2**20
"""Widest hidden size (and MLA rank) a model may have; its MLPs up to four times that: far
beyond any model trained (GPT-3 175B: 12,288), it bounds the work a config can ask for."""
MAX_FFN = 4 * MAX_WIDTH
"""Widest MLP (dense, expert or shared expert) a model may have."""
MAX_EXPERTS = 2**14
"""Most routed (or shared) experts an MoE layer may have (published: up to 384, Kimi-K2)."""
MAX_HEADS = 2**14
"""Most attention heads (published: 128, Llama 3 405B and DeepSeek-V3)."""
MAX_HEAD_DIM = 2**14
"""Largest head size (published: 128, Llama 3; 192 query-key dimensions, DeepSeek-V3's MLA)."""
MAX_VOCAB = 2**24
"""Largest vocabulary (published: 262,144, Gemma 3; Llama 3 128,256)."""
MAX_OVERSUBSCRIPTION = 100.0
"""Largest downlink / uplink ratio a level may have (built fabrics: 1:1 to 7:1, e.g. Meta's
RoCE clusters, catalog meta-h100-roce-7to1)."""


@dataclass(frozen=True, kw_only=True)
class Level(_CachedHash):
    """One level of the network hierarchy (level 0 = inside a node)."""

    name: str
    """Human name, e.g. ``nvlink``, ``leaf``, ``spine``."""
    size: int | None
    """Fan-out: children per group at this level (level 0: devices per node). None = unbounded."""
    bandwidth: float
    """Per-device, per-direction bandwidth for traffic that crosses into this level, bytes/s."""
    latency: float
    """One-hop latency of a message crossing this level, seconds."""
    oversubscription: float = 1.0
    """Downlink / uplink capacity ratio of the links into this level (>= 1)."""
    efficiency: float = 1.0
    """Fraction of ``bandwidth`` that large collectives reach (protocol and kernel overheads)."""
    efficiency_stated: bool = field(default=True, compare=False)
    """Whether the cluster file gave ``efficiency`` (what is said of a level, not what it
    costs: ``notes.scenario.unstated_efficiencies``)."""

    def __post_init__(self):
        if self.size is not None:
            _positive(f"levels[{self.name}].size", self.size)
            if self.size > MAX_GPUS:
                raise SpecError(f"levels[{self.name}].size", self.size,
                                f"at most {MAX_GPUS:,} (the most devices nestplan plans for)")
        _positive(f"levels[{self.name}].bandwidth_GBps", self.bandwidth, integer=False)
        _positive(f"levels[{self.name}].latency_us", self.latency, integer=False, allow_zero=True)
        if not (isinstance(self.oversubscription, (int, float))
                and 1 <= self.oversubscription <= MAX_OVERSUBSCRIPTION):
            raise SpecError(f"levels[{self.name}].oversubscription", self.oversubscription,
                            f"must be a number in [1, {MAX_OVERSUBSCRIPTION:g}] (1 = non-blocking)")
        if not efficiency_ok(self.efficiency):
            raise SpecError(f"levels[{self.name}].efficiency", self.efficiency,
                            f"must be in [{MIN_EFFICIENCY:g}, 1]")


HGX_NVLINK_GPUS = 8
"""GPUs one HGX/DGX board joins by NVLink (DGX H100 and DGX B200: 8 GPUs on NVSwitch, NVIDIA's
DGX user guides; the catalog's dgx-* clusters): a cluster file that gives no host size is read as
NVLink over several hosts when its NVLink domain holds more (``ClusterSpec.nvlink_spans_hosts``)."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec(_CachedHash):
    """Accelerators and the network that joins them, as ordered levels (innermost first)."""

    name: str
    """Catalog name, e.g. ``dgx-h100-ndr``."""
    accelerator: AcceleratorSpec
    """The accelerator in every slot."""
    levels: tuple[Level, ...]
    """Network levels, innermost first; only the outermost may have ``size=None``."""
    devices_per_host: int | None = None
    """Devices of one host (one operating system, whose processes a launcher numbers with
    LOCAL_RANK) where the innermost level's group is not one: fewer (a GB200 NVL72 rack's NVLink
    domain spans 4-GPU compute trays), or several whole groups (a PCIe server of 8 GPUs whose
    NVLink bridges join pairs, an academic user's trial; its hosts tile a level's blocks). None:
    a host is an innermost group (a DGX node)."""

    def __post_init__(self):
        if not self.levels:
            raise SpecError("levels", [], "a cluster needs at least one level")
        for lvl in self.levels[:-1]:
            if lvl.size is None:
                raise SpecError(f"levels[{lvl.name}].size", None,
                                "only the outermost level may omit size")
        if self.devices_per_host is not None:
            _positive("devices_per_host", self.devices_per_host)
            host, inner = self.devices_per_host, self.levels[0]
            blocks = self.block_sizes()  # devices under one block of each level but the last
            # a host within one innermost group, or whole blocks of one level that tile a block
            # of the next (a review: hosts of 4 over PCIe groups of 6 pairs had passed)
            tiles = any(host % below == 0 and above % host == 0
                        for below, above in zip(blocks, blocks[1:]))
            if inner.size is None or not (inner.size % host == 0 or tiles):
                more = (", or be a multiple of one level's block of devices that divides the "
                        "next level's (" + ", ".join(f"{lvl.name}: {b:,}" for lvl, b in
                                                     zip(self.levels, blocks)) + ")"
                        if len(blocks) > 1 else "")
                raise SpecError("devices_per_host", host,
                                f"must divide the innermost level's size "
                                f"({inner.name}: {inner.size}){more}")
        names = [lvl.name for lvl in self.levels]
        for name in names:
            if names.count(name) > 1:  # sweeps and messages name levels: they must differ
                raise SpecError(f"levels[{name}].name", name, "each level needs a name of its "
                                "own")

    @property
    def max_devices(self) -> int | None:
        """Devices the cluster can hold, or None when the outermost level is unbounded."""
        if self.levels[-1].size is None:
            return None
        return math.prod(lvl.size for lvl in self.levels)

    def block_sizes(self) -> tuple[int, ...]:
        """Devices under one group of each level: (node, leaf, ...); the last is unbounded."""
        out, acc = [], 1
        for lvl in self.levels[:-1]:
            acc *= lvl.size
            out.append(acc)
        return tuple(out)

    def top_level(self, gpus: int) -> int:
        """The highest level a job of ``gpus`` devices, its ranks filling devices in order,
        crosses: the last whose block below holds fewer (0: within one innermost domain, or one
        device)."""
        below = (1, *self.block_sizes())
        return max((i for i, inside in enumerate(below) if gpus > inside), default=0)

    @property
    def devices_per_node(self) -> int:
        """Devices under one level-0 group."""
        return self.levels[0].size if self.levels[0].size is not None else 1

    @property
    def nvlink_spans_hosts(self) -> bool:
        """The NVLink domain (the innermost level) joins GPUs of several hosts, as GB200 and GB300
        NVL72 racks join 18 trays: a host (``devices_per_host``) holds fewer GPUs than the domain;
        a file without a host size, more than an HGX board's ``HGX_NVLINK_GPUS``."""
        return self.devices_per_node > (self.devices_per_host or HGX_NVLINK_GPUS)

    @property
    def host_size(self) -> int:
        """Devices of one host, as a launcher numbers its local ranks (``devices_per_host``)."""
        return self.devices_per_host or self.devices_per_node

    def straddled_by(self, gpus: int) -> bool:
        """A job of ``gpus`` devices fills no whole number of innermost domains (NVLink nodes or
        racks) beyond one, so that groups placed in rank order straddle them."""
        size = self.levels[0].size
        return len(self.levels) >= 2 and size < gpus and gpus % size != 0


# ----------------------------------------------------------------------------- model


@dataclass(frozen=True, kw_only=True)
class MoESpec(_CachedHash):
    """Mixture-of-experts feed-forward layers."""

    experts: int
    """Routed experts per MoE layer."""
    top_k: int
    """Experts each token is routed to."""
    ffn_hidden: int
    """Intermediate size of one routed expert."""
    shared_experts: int = 0
    """Always-on experts per MoE layer (DeepSeek, Qwen2-MoE)."""
    shared_ffn_hidden: int = 0
    """Intermediate size of one shared expert (0 = same as ``ffn_hidden``)."""
    shared_expert_gate: bool = False
    """A sigmoid gate per token scales the shared experts' output (Qwen2-MoE's
    ``shared_expert_gate``; Megatron-Core ``--moe-shared-expert-gate``, a [1, hidden] weight:
    megatron/core/transformer/moe/shared_experts.py @ NVIDIA/Megatron-LM d98e8a64dd)."""
    first_dense_layers: int = 0
    """Leading layers that use a dense MLP instead of experts."""
    layer_freq: int = 1
    """Every ``layer_freq``-th layer (after the dense ones) is an MoE layer."""
    layers: tuple[int, ...] = ()
    """The MoE blocks' 0-based indices where they follow no such pattern (transformers' Llama 4
    ``moe_layers``, Qwen's ``mlp_only_layers``; Megatron-LM's ``--moe-layer-freq`` takes a list
    too); empty: ``first_dense_layers`` and ``layer_freq`` say (``moe_layer_fields``)."""
    expert_bias: bool = False
    """The routed experts' linear layers carry biases (GPT-OSS; not Qwen2-MoE or GLM-4.5, whose
    biases are the attention's q, k, v only), as they do too where every linear layer does
    (``ModelSpec.bias``; ``ModelSpec.biased_experts`` is either). What adding them costs depends
    on the stack (``StackSpec.eager_ops``: ``expert_bias``)."""
    # ---- the router: costs nothing worth modelling, kept so that an export defines the model
    router_score: str = "softmax"
    """How the router scores experts: ``softmax`` or ``sigmoid`` (DeepSeek-V3, Kimi-K2,
    GLM-4.5, Llama 4); Megatron-Core ``--moe-router-score-function``."""
    router_pre_softmax: bool = False
    """Softmax over every expert before the top-k (Qwen2-MoE: ``norm_topk_prob = false``), not
    over the k chosen (Mixtral, Qwen3); ``--moe-router-pre-softmax``."""
    router_expert_bias: bool = False
    """Auxiliary-loss-free balancing: a learned per-expert bias added to the scores for the
    choice only (DeepSeek-V3 ``topk_method = "noaux_tc"``); ``--moe-router-enable-expert-bias``,
    which Megatron-Core allows only with sigmoid scores."""
    router_groups: int = 1
    """Expert groups of group-limited routing (DeepSeek-V3 ``n_group`` = 8); 1 = none."""
    router_group_top_k: int = 1
    """Groups a token's experts may come from (``topk_group`` = 4)."""
    router_scale: float = 1.0
    """Factor on the chosen experts' weights (``routed_scaling_factor``: DeepSeek-V3 2.5)."""
    aux_loss: float = 0.0
    """Coefficient of the router's load-balancing loss (HuggingFace ``router_aux_loss_coef``,
    DeepSeek's ``aux_loss_alpha``; Megatron-LM ``--moe-aux-loss-coeff``); 0: none (a router
    balanced by its expert biases alone; DeepSeek-V3 adds a small per-sequence loss to those,
    ``aux_loss_alpha`` 0.001 with ``seq_aux`` in its config). It costs nothing here; nestplan
    keeps it so that an export trains the model as its config says."""
    aux_loss_per_sequence: bool = False
    """The load-balancing loss is taken per sequence (DeepSeek's ``seq_aux``; Megatron-LM's
    ``seq_aux_loss``), not over the batch."""
    scores_on_input: bool = False
    """The router's score scales each routed expert's input, not its output (Llama 4:
    transformers' ``Llama4TextMoe`` multiplies the tokens by ``router_scores`` before the
    experts; Megatron-Core's ``moe_apply_probs_on_input``, top-1 only): the product is a pass over
    the permuted tokens that keeps them, unscaled, for the scores' gradient, and the experts'
    outputs are summed unweighted (graph.py)."""

    def __post_init__(self):
        for f in ("shared_expert_gate", "expert_bias", "router_pre_softmax", "router_expert_bias",
                  "scores_on_input", "aux_loss_per_sequence"):
            if not isinstance(getattr(self, f), bool):
                raise SpecError(f"moe.{f}", getattr(self, f), "must be true or false")
        _positive("moe.experts", self.experts)
        _positive("moe.top_k", self.top_k)
        _positive("moe.ffn_hidden", self.ffn_hidden)
        _positive("moe.shared_experts", self.shared_experts, allow_zero=True)
        _positive("moe.shared_ffn_hidden", self.shared_ffn_hidden, allow_zero=True)
        _positive("moe.first_dense_layers", self.first_dense_layers, allow_zero=True)
        _positive("moe.layer_freq", self.layer_freq)
        if self.shared_expert_gate and not self.shared_experts:
            raise SpecError("moe.shared_expert_gate", True, "gates the shared experts; "
                            "moe.shared_experts is 0")
        for f, most in (("experts", MAX_EXPERTS), ("ffn_hidden", MAX_FFN),
                        ("shared_experts", MAX_EXPERTS), ("shared_ffn_hidden", MAX_FFN),
                        ("first_dense_layers", MAX_LAYERS), ("layer_freq", MAX_LAYERS)):
            if getattr(self, f) > most:
                raise SpecError(f"moe.{f}", getattr(self, f), f"at most {most:,} is supported")
        if self.top_k > self.experts:
            raise SpecError("moe.top_k", self.top_k, f"must be <= moe.experts = {self.experts}")
        if not isinstance(self.layers, tuple) or list(self.layers) != sorted(set(self.layers)) or \
                not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_LAYERS
                        for i in self.layers):
            raise SpecError("moe.layers", list(self.layers) if isinstance(self.layers, tuple)
                            else self.layers, "must list MoE layers' 0-based indices once each, "
                            "in order")
        if self.layers and (self.first_dense_layers or self.layer_freq != 1):
            raise SpecError("moe.layers", list(self.layers), "lists the MoE layers: give it or "
                            "moe.first_dense_layers and moe.layer_freq, not both")
        if self.router_score not in ROUTER_SCORES:
            raise SpecError("moe.router_score", self.router_score,
                            "allowed: " + ", ".join(ROUTER_SCORES))
        if self.router_expert_bias and self.router_score != "sigmoid":
            raise SpecError("moe.router_expert_bias", True, "balances sigmoid scores only "
                            "(moe.router_score = sigmoid), as Megatron-Core runs it")
        _positive("moe.router_groups", self.router_groups)
        _positive("moe.router_group_top_k", self.router_group_top_k)
        if self.experts % self.router_groups:
            raise SpecError("moe.router_groups", self.router_groups,
                            f"must divide moe.experts = {self.experts}")
        if self.router_group_top_k > self.router_groups:
            raise SpecError("moe.router_group_top_k", self.router_group_top_k,
                            f"must be <= moe.router_groups = {self.router_groups}")
        per_group = self.experts // self.router_groups
        if self.router_groups > 1 and (self.router_group_top_k * per_group < self.top_k
                                       or per_group < self.top_k // self.router_group_top_k):
            # Megatron-Core's group_limited_topk scores each group by its top
            # top_k // group_top_k experts, then takes top_k from the chosen groups' experts
            # (megatron/core/transformer/moe/moe_utils.py, megatron-core 0.16.1)
            raise SpecError("moe.router_groups", self.router_groups,
                            f"{self.router_group_top_k} of them of {per_group} experts each "
                            f"cannot give top_k = {self.top_k} experts")
        if not within(self.aux_loss, MAX_AUX_LOSS):
            raise SpecError("moe.aux_loss", self.aux_loss,
                            f"must be a number in [0, {MAX_AUX_LOSS:g}] (0: no balancing loss)")
        if self.aux_loss_per_sequence and not self.aux_loss:
            raise SpecError("moe.aux_loss_per_sequence", True, "takes the balancing loss per "
                            "sequence; moe.aux_loss is 0")
        if not (within(self.router_scale, MAX_ROUTER_SCALE) and self.router_scale > 0):
            raise SpecError("moe.router_scale", self.router_scale,
                            f"must be a number in (0, {MAX_ROUTER_SCALE:g}]")


ROPE_SCALINGS = ("llama3", "linear")
"""The RoPE frequency scalings other than YaRN that nestplan keeps (``RopeScaling.kind``)."""


@dataclass(frozen=True, kw_only=True)
class RopeScaling(_CachedHash):
    """A scaling of RoPE's frequencies other than YaRN, as a HuggingFace config's ``rope_scaling``
    gives it: Llama 3.1's (``llama3``: the low frequencies divided by ``factor``, the high ones
    kept, a smooth blend between, by wavelength against the pre-trained context) or position
    interpolation (``linear``: every frequency divided by ``factor``). Both only change the
    frequencies, so they cost nothing; nestplan keeps them so that an export defines the model
    (Megatron-LM ``--use-rope-scaling --rope-scaling-factor``, ``--rotary-seq-len-interpolation-
    factor``)."""

    kind: str
    """``llama3`` or ``linear``."""
    factor: float
    """How many times the context is extended (Llama 3.1: 8)."""
    low_freq_factor: float = 1.0
    """``llama3``: wavelengths above the pre-trained context over this are divided by ``factor``
    (Llama 3.1: 1)."""
    high_freq_factor: float = 4.0
    """``llama3``: wavelengths below the pre-trained context over this are kept (Llama 3.1: 4)."""
    original_max_positions: int = 8192
    """``llama3``: the context the model was pre-trained at (Llama 3.1: 8,192)."""

    def __post_init__(self):
        if self.kind not in ROPE_SCALINGS:
            raise SpecError("rope_scaling.kind", self.kind, "allowed: " + ", ".join(ROPE_SCALINGS))
        if not (within(self.factor, MAX_YARN_FACTOR) and self.factor >= 1):
            raise SpecError("rope_scaling.factor", self.factor, CONTEXT_FACTOR_RULE)
        # (checked for both kinds: a linear scaling's are unused, but a file keeps them)
        if not (within(self.low_freq_factor, MAX_YARN_FACTOR) and self.low_freq_factor > 0):
            raise SpecError("rope_scaling.low_freq_factor", self.low_freq_factor,
                            f"must be a number in (0, {MAX_YARN_FACTOR:g}]")
        # (equal factors leave no band between kept and scaled frequencies; transformers warns
        # and runs them: _validate_llama3_parameters, modeling_rope_utils.py, 5.23.0 wheel)
        if not (within(self.high_freq_factor, MAX_YARN_FACTOR)
                and self.high_freq_factor >= self.low_freq_factor):
            raise SpecError("rope_scaling.high_freq_factor", self.high_freq_factor,
                            f"must be a number at least low_freq_factor = "
                            f"{self.low_freq_factor:g} and at most {MAX_YARN_FACTOR:g}")
        _positive("rope_scaling.original_max_positions", self.original_max_positions)
        if self.original_max_positions > MAX_TOKENS:
            raise SpecError("rope_scaling.original_max_positions", self.original_max_positions,
                            f"at most {MAX_TOKENS:,} tokens (the longest sequence)")


LLAMA31_ROPE = RopeScaling(kind="llama3", factor=8.0)
"""Llama 3.1's RoPE scaling (factor 8, frequency factors 1 and 4, pre-trained context 8,192:
``RopeScaling``'s defaults), which every Llama 3.1 config gives, Megatron-Core fixes but for the
factor and torchtitan's Llama 3 definitions run."""


@dataclass(frozen=True, kw_only=True)
class YarnSpec(_CachedHash):
    """YaRN's RoPE context extension (Peng et al. 2023), as Megatron-Core's
    ``YarnRotaryEmbedding`` takes it (megatron/core/models/common/embeddings/
    yarn_rotary_pos_embedding.py @ NVIDIA/Megatron-LM d98e8a64dd) and a HuggingFace config's
    ``rope_scaling`` gives it. It costs nothing apart (its cos and sin scale is
    ``ModelSpec.rope_mscale``); nestplan keeps it so that an export defines the model."""

    factor: float
    """Context extension (HF ``factor``; Megatron-LM ``--rotary-scaling-factor``)."""
    original_max_positions: int = 0
    """Context the model was pre-trained at (HF ``original_max_position_embeddings``; 0 =
    unstated)."""
    beta_fast: float = 32.0
    """Rotations bounding the extrapolated dimensions (HF and Megatron default 32)."""
    beta_slow: float = 1.0
    """Rotations bounding the interpolated dimensions (default 1)."""
    mscale: float = 1.0
    """Numerator's multiplier of ln(factor) in the cos/sin factor (Megatron ``--mscale``)."""
    mscale_all_dim: float = 0.0
    """Denominator's multiplier (``--mscale-all-dim``; 0: the denominator is 1); MLA also scales
    its softmax by its g squared."""
    round_to_int: bool = True
    """The correction range is rounded to whole dimensions (HF ``truncate``, true by default;
    GPT-OSS: false)."""

    def __post_init__(self):
        if not (within(self.factor, MAX_YARN_FACTOR) and self.factor >= 1):
            raise SpecError("yarn.factor", self.factor, CONTEXT_FACTOR_RULE)
        _positive("yarn.original_max_positions", self.original_max_positions, allow_zero=True)
        if self.original_max_positions > MAX_TOKENS:
            raise SpecError("yarn.original_max_positions", self.original_max_positions,
                            f"at most {MAX_TOKENS:,} tokens (the longest sequence)")
        for f in ("beta_fast", "beta_slow"):
            if not (within(getattr(self, f), MAX_YARN_FACTOR) and getattr(self, f) > 0):
                raise SpecError(f"yarn.{f}", getattr(self, f),
                                f"must be a number in (0, {MAX_YARN_FACTOR:g}]")
        if not (finite(self.mscale) and within(abs(self.mscale), MAX_YARN_FACTOR)):
            raise SpecError("yarn.mscale", self.mscale,
                            f"must be a number in [-{MAX_YARN_FACTOR:g}, {MAX_YARN_FACTOR:g}]")
        if not within(self.mscale_all_dim, MAX_ROPE_MSCALE):
            raise SpecError("yarn.mscale_all_dim", self.mscale_all_dim,
                            f"must be a number in [0, {MAX_ROPE_MSCALE:g}]")
        if not MIN_ROPE_MSCALE <= self.attention_factor <= MAX_ROPE_MSCALE:
            raise SpecError("yarn.mscale", self.mscale, "gives a scale of RoPE's cos and sin of "
                            f"{self.attention_factor:.4g}, outside [{MIN_ROPE_MSCALE:g}, "
                            f"{MAX_ROPE_MSCALE:g}]")
        if not isinstance(self.round_to_int, bool):
            raise SpecError("yarn.round_to_int", self.round_to_int, "must be true or false")

    @property
    def attention_factor(self) -> float:
        """The factor it scales RoPE's cos and sin by, as Megatron-Core works it out
        (``_yarn_get_concentration_factor``): g(mscale) / g(mscale_all_dim), g(m) = 0.1·m·ln(factor)
        + 1."""
        def g(m: float) -> float:  # (factor >= 1: g = 1 at factor 1)
            return 0.1 * m * math.log(self.factor) + 1.0
        return g(self.mscale) / g(self.mscale_all_dim)


@dataclass(frozen=True, kw_only=True)
class MLASpec(_CachedHash):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: int
    """Rank of the query down-projection (0 = no query compression)."""
    kv_lora_rank: int
    """Rank of the joint key/value compression."""
    qk_nope_head_dim: int
    """Per-head query/key width without rotary embedding."""
    qk_rope_head_dim: int
    """Per-head query/key width with rotary embedding."""
    v_head_dim: int
    """Per-head value width."""

    def __post_init__(self):
        _positive("mla.q_lora_rank", self.q_lora_rank, allow_zero=True)
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            _positive(f"mla.{f}", getattr(self, f))
        for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim"):
            if getattr(self, f) > MAX_WIDTH:
                raise SpecError(f"mla.{f}", getattr(self, f), f"at most {MAX_WIDTH:,} is supported")


@dataclass(frozen=True, kw_only=True)
class ModelSpec(_CachedHash):
    """A decoder (or encoder) transformer: embedding, ``layers`` blocks, head."""

    name: str
    """Catalog name or the file it came from."""
    layers: int
    """Transformer blocks."""
    hidden: int
    """Model width h."""
    heads: int
    """Query heads a."""
    kv_heads: int
    """Key/value heads (= heads for multi-head attention, fewer for GQA/MQA)."""
    head_dim: int
    """Width of one attention head (usually hidden / heads)."""
    ffn_hidden: int
    """Intermediate size of the dense MLP."""
    vocab: int
    """Vocabulary size before padding."""
    mlp: MLPKind = MLPKind.GELU
    """Feed-forward kind (gated kinds have three weight matrices)."""
    norm: Norm = Norm.LAYERNORM
    """Normalisation layer."""
    bias: bool = True
    """Every linear layer carries a bias (with experts, the router's too: Megatron-Core
    ``add_bias_linear``, megatron/core/transformer/moe/router.py @ NVIDIA/Megatron-LM
    d98e8a64dd)."""
    qkv_bias: bool = False
    """Only the attention's q, k and v projections carry biases (Qwen2, Qwen2-MoE, GLM-4.5 with
    ``attention_bias``; Megatron-Core ``--add-qkv-bias`` with ``--disable-bias-linear``)."""
    dropout: bool = False
    """Dropout after attention and MLP (stores 1-byte masks for backward)."""
    tied_embeddings: bool = False
    """Output head shares the input embedding matrix."""
    position: Position = Position.ROPE
    """Position encoding."""
    max_positions: int = 0
    """Rows of a learned position table (0 when not learned)."""
    trained_context: int = field(default=0, compare=False)
    """The context a RoPE model was built for, where its configuration says
    (``max_position_embeddings``); 0 when not stated. Longer sequences with its RoPE unscaled
    are noted (a file written by ``nestplan list models CONFIG`` keeps it: a new user's trial).
    Not compared: a model is its shapes, which a catalog entry read from the same config holds
    without it."""
    causal: bool = True
    """Decoder (causal) attention; False for encoders such as BERT."""
    qk_norm: bool = False
    """Each head's queries and keys are normed before RoPE (Qwen3, GLM-4.5 with ``use_qk_norm``;
    Megatron-Core ``--qk-layernorm``): two small norms of the model's ``norm`` kind over the
    queries' and keys' elements, each keeping its input for backward."""
    qk_l2_norm: bool = False
    """Each head's queries and keys are L2-normed, without weights (Llama 4 with ``use_qk_norm``;
    Megatron-Core ``--qk-l2-norm``, its ``L2Norm``: one fused kernel that keeps its input, in the
    place of ``--qk-layernorm``'s norms, megatron/core/models/gpt/gpt_layer_specs.py and
    transformer/torch_norm.py @ NVIDIA/Megatron-LM d98e8a64dd): costed as ``qk_norm``'s norms,
    on every layer as Megatron-LM's flag builds them (transformers and NeMo's Llama 4 spec norm
    the RoPE layers only, three in four)."""
    attention_sinks: bool = False
    """Each head adds a learned logit to its softmax's denominator (GPT-OSS's ``sinks``;
    Megatron-Core ``--softmax-type learnable``): one parameter per head and layer. What the
    attention kernel spends on it is not modelled."""
    moe: MoESpec | None = None
    """Mixture-of-experts settings, or None for a dense model."""
    mla: MLASpec | None = None
    """Multi-head latent attention settings, or None for standard attention."""
    local_span: int = 0
    """Tokens a query attends among on the layers with local attention, as a block-diagonal span:
    the chunk size of chunked attention (Llama 4), twice the window of sliding-window attention
    (GPT-OSS; a causal window w costs about what causal chunks of 2w cost); 0 = none."""
    local_share: float = 0.0
    """Share of the blocks with local attention. Their attention cost is averaged over all
    blocks (exact for the model's total; a stage's share of local layers may differ by one)."""
    sliding_window: int = 0
    """Tokens of a sliding window (HuggingFace ``sliding_window``: each token attends to itself
    and the ``sliding_window - 1`` before it), where the local attention is one (``local_span``
    is then twice it); 0 where it is chunked (Llama 4) or absent. Kept for the exports."""
    local_layers: tuple[int, ...] = ()
    """The layers (0-based) that attend locally, where known (``local_share`` of them); empty:
    not stated. Kept for the exports."""
    mtp_layers: int = 0
    """Multi-token-prediction depths trained after the last block (DeepSeek-V3 §2.2; Megatron-Core
    ``--mtp-num-layers``): each embeds the next token, projects it with the previous depth's
    hidden states (2h -> h), runs one more block (of the last block's kind) and its own loss
    through the shared output layer. They run with the output head, on the last pipeline stage."""
    rope_mscale: float = 1.0
    """The factor RoPE's cos and sin are scaled by: YaRN's attention factor (``rope_scaling``
    with ``rope_type = "yarn"``: 0.1·ln(factor) + 1 unless the config gives ``attention_factor``
    or ``mscale``/``mscale_all_dim``; GPT-OSS: 1.3466); 1 = unscaled. What it costs depends on
    the stack (``StackSpec.eager_ops``: ``scaled_rope``)."""
    yarn: YarnSpec | None = None
    """YaRN's context extension of RoPE, where the model has one (DeepSeek-V3, Kimi-K2, GPT-OSS)."""
    rope_scaling: RopeScaling | None = None
    """Another scaling of RoPE's frequencies (Llama 3.1's, or linear interpolation)."""
    rope_theta: float = DEFAULT_ROPE_THETA
    """RoPE's base period (HuggingFace ``rope_theta``, Megatron-LM ``--rotary-base``; Llama 3:
    500,000). It costs nothing; nestplan keeps it so that an export defines the model."""
    rope_fraction: float = 1.0
    """Share of each head's dimensions that RoPE rotates (HuggingFace ``partial_rotary_factor``,
    GPT-NeoX ``rotary_pct``; Megatron-LM ``--rotary-percent``, a fraction): GLM-4.5 0.5, Pythia
    0.25. RoPE still reads and writes whole heads, so it costs nothing apart; nestplan keeps it so
    that an export defines the model."""
    glu_clamp: float = 0.0
    """The limit a clamped gated activation clamps its two halves to before the activation
    (GPT-OSS: ``swiglu_limit = 7``); 0 = no clamp. What it costs depends on the stack
    (``StackSpec.eager_ops``: ``glu_clamp``)."""
    norm_eps: float = DEFAULT_NORM_EPS
    """The epsilon of every norm (HuggingFace ``rms_norm_eps`` or ``layer_norm_eps``; Qwen3 and
    DeepSeek-V3: 1e-6). It costs nothing; nestplan keeps it so that an export defines the
    model (Megatron-LM ``--norm-epsilon``)."""

    def __post_init__(self):
        for f in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab"):
            _positive(f"model.{f}", getattr(self, f))
        # far beyond any model trained; bounds the work (and memory) a config can ask for
        for f, most in (("layers", MAX_LAYERS), ("hidden", MAX_WIDTH), ("heads", MAX_HEADS),
                        ("head_dim", MAX_HEAD_DIM), ("vocab", MAX_VOCAB), ("ffn_hidden", MAX_FFN)):
            if getattr(self, f) > most:
                raise SpecError(f"model.{f}", getattr(self, f), f"at most {most:,} is supported")
        _positive("model.local_span", self.local_span, allow_zero=True)
        if self.local_span > MAX_TOKENS:
            raise SpecError("model.local_span", self.local_span,
                            f"at most {MAX_TOKENS:,} tokens (the longest sequence)")
        for kind in ("qk_norm", "qk_l2_norm"):
            if getattr(self, kind) and self.mla is not None:
                raise SpecError(f"model.{kind}", True, "MLA norms its low-rank queries and keys as "
                                f"part of MLA (costed with it); {kind} is for standard attention")
        if self.qkv_bias and self.bias:
            raise SpecError("model.qkv_bias", True, "bias (true unless set false) gives the q, "
                            "k, v projections their biases already; qkv_bias is for a model whose "
                            "other linear layers have none: set bias = false with it")
        if self.qkv_bias and self.mla is not None:
            raise SpecError("model.qkv_bias", True, "MLA's projections carry no q, k, v biases; "
                            "qkv_bias is for standard attention")
        if self.qk_norm and self.qk_l2_norm:
            raise SpecError("model.qk_l2_norm", True, "a model's QK norms are of one kind: "
                            "qk_norm (the model's norm, with weights) or qk_l2_norm (L2, without)")
        _positive("model.mtp_layers", self.mtp_layers, allow_zero=True)
        _positive("model.trained_context", self.trained_context, allow_zero=True)
        if self.mtp_layers and not self.causal:
            raise SpecError("model.mtp_layers", self.mtp_layers,
                            "multi-token prediction needs a causal (decoder) model")
        if self.mtp_layers > MAX_MTP_LAYERS:
            raise SpecError("model.mtp_layers", self.mtp_layers,
                            f"at most {MAX_MTP_LAYERS} is supported")
        if not (isinstance(self.local_share, (int, float)) and 0 <= self.local_share <= 1):
            raise SpecError("model.local_share", self.local_share, "must be in [0, 1]")
        _positive("model.max_positions", self.max_positions, allow_zero=True)
        if self.max_positions > MAX_TOKENS:
            raise SpecError("model.max_positions", self.max_positions,
                            f"at most {MAX_TOKENS:,} positions (the longest sequence)")
        if self.rope_scaling is not None and (self.position is not Position.ROPE
                                              or self.yarn is not None):
            raise SpecError("model.rope_scaling.kind", self.rope_scaling.kind,
                            "scales RoPE's frequencies: needs position = \"rope\" and no [yarn]")
        if self.yarn is not None and self.position is not Position.ROPE:
            raise SpecError("model.yarn.factor", self.yarn.factor,
                            f"extends RoPE; model.position = {self.position.value} is not rope")
        if not (within(self.rope_mscale, MAX_ROPE_MSCALE) and self.rope_mscale >= MIN_ROPE_MSCALE):
            raise SpecError("model.rope_mscale", self.rope_mscale,
                            f"must be a number in [{MIN_ROPE_MSCALE:g}, {MAX_ROPE_MSCALE:g}] "
                            "(1 = unscaled RoPE)")
        if self.rope_mscale != 1 and self.position is not Position.ROPE:
            raise SpecError("model.rope_mscale", self.rope_mscale,
                            f"scales RoPE; model.position = {self.position.value} is not rope")
        if self.rope_mscale != 1 and self.mla is not None:
            raise SpecError("model.rope_mscale", self.rope_mscale, "scales standard attention's "
                            "RoPE; MLA applies its YaRN scale in its own path (leave it 1)")
        if self.yarn is not None and self.mla is None and not math.isclose(
                self.rope_mscale, self.yarn.attention_factor, rel_tol=1e-9):
            raise SpecError("model.rope_mscale", self.rope_mscale,
                            f"must be {self.yarn.attention_factor:.10g}, the cos/sin factor of "
                            "the [yarn] table (or leave it out)")
        if not (within(self.rope_theta, MAX_ROPE_THETA) and self.rope_theta >= 1):
            raise SpecError("model.rope_theta", self.rope_theta,
                            f"must be a number in [1, {MAX_ROPE_THETA:g}] (RoPE's base period)")
        if self.rope_theta != DEFAULT_ROPE_THETA and self.position is not Position.ROPE:
            raise SpecError("model.rope_theta", self.rope_theta,
                            f"sets RoPE's base; model.position = {self.position.value} is not rope")
        if not (finite(self.rope_fraction) and 0 < self.rope_fraction <= 1):
            raise SpecError("model.rope_fraction", self.rope_fraction,
                            "must be a number in (0, 1] (the share of a head RoPE rotates)")
        if self.rope_fraction != 1 and (self.position is not Position.ROPE or self.mla is not None):
            raise SpecError("model.rope_fraction", self.rope_fraction, "applies only with "
                            "position = \"rope\" and standard attention (no MLA); leave it 1")
        if not (finite(self.norm_eps) and 0 < self.norm_eps <= MAX_NORM_EPS):
            raise SpecError("model.norm_eps", self.norm_eps, NORM_EPS_RULE)
        if not within(self.glu_clamp, MAX_GLU_CLAMP):
            raise SpecError("model.glu_clamp", self.glu_clamp,
                            f"must be a number in [0, {MAX_GLU_CLAMP:g}] (0 = no clamp)")
        if self.glu_clamp and not self.gated:
            raise SpecError("model.glu_clamp", self.glu_clamp,
                            f"clamps a gated activation; model.mlp = {self.mlp.value} is not gated")
        if self.heads % self.kv_heads:
            raise SpecError("model.kv_heads", self.kv_heads,
                            f"must divide model.heads = {self.heads}")
        if self.position is Position.LEARNED and self.max_positions == 0:
            raise SpecError("model.max_positions", 0, "learned positions need max_positions > 0")
        _positive("model.sliding_window", self.sliding_window, allow_zero=True)
        if self.sliding_window and self.local_span != 2 * self.sliding_window:
            raise SpecError("model.sliding_window", self.sliding_window,
                            f"a sliding window costs as local_span = twice it; local_span is "
                            f"{self.local_span}")
        if self.local_layers and (
                list(self.local_layers) != sorted(set(self.local_layers))
                or not all(isinstance(i, int) and 0 <= i < self.layers for i in self.local_layers)
                or not math.isclose(len(self.local_layers) / self.layers, self.local_share)):
            raise SpecError("model.local_layers", list(self.local_layers),
                            f"must list the local layers once each, in order, below "
                            f"model.layers = {self.layers}: local_share ({self.local_share:g}) "
                            "of them")
        if bool(self.local_span) != bool(self.local_share):
            raise SpecError("model.local_share" if self.local_span else "model.local_span",
                            self.local_share if self.local_span else self.local_span,
                            "local attention needs both local_span (its tokens) and local_share "
                            "(the share of blocks that have it) above 0, or neither")
        if self.mla is not None and self.kv_heads != self.heads:
            raise SpecError("model.kv_heads", self.kv_heads, f"MLA keeps keys and values per head "
                            f"(its latent is projected up for every one): must equal model.heads "
                            f"= {self.heads}")
        if self.mla is not None and self.head_dim != (
                self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim):
            raise SpecError("model.head_dim", self.head_dim, "with MLA it is the query/key head "
                            "size, mla.qk_nope_head_dim + mla.qk_rope_head_dim = "
                            f"{self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim}")
        if self.moe is not None and self.moe.layers and self.moe.layers[-1] >= self.layers:
            raise SpecError("moe.layers", list(self.moe.layers),
                            f"indices must be below model.layers = {self.layers}")
        if self.moe is not None and self.moe.first_dense_layers >= self.layers:
            raise SpecError("moe.first_dense_layers", self.moe.first_dense_layers,
                            f"must be below model.layers = {self.layers} (an MoE model has an "
                            "MoE block)")

    def without_local_attention(self) -> "ModelSpec":
        """The model with every layer attending to the whole sequence."""
        return replace(self, local_span=0, local_share=0.0, sliding_window=0, local_layers=())

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads a tensor-parallel rank attends with: its share, or one, replicated, where TP
        exceeds them (Megatron-Core's attention: a valid TP degree divides the KV heads or is a
        multiple of them, ``kv_heads_refusal``)."""
        return self.kv_heads // tp if self.kv_heads >= tp else 1

    def position_rows(self, seq_len: int) -> int:
        """Rows of the learned position table when trained at ``seq_len`` (0 without one): a
        sequence longer than ``max_positions`` needs that many rows, as the Megatron export's
        ``--max-position-embeddings`` gives them."""
        return max(self.max_positions, seq_len) if self.position is Position.LEARNED else 0

    def is_moe_layer(self, index: int) -> bool:
        """True when block ``index`` (0-based) uses routed experts."""
        if self.moe is None or index < self.moe.first_dense_layers:
            return False
        if self.moe.layers:
            return index in self.moe.layers
        return (index - self.moe.first_dense_layers) % self.moe.layer_freq == 0

    @cached_property  # asked for every configuration a search weighs: walk the blocks once
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def biased_experts(self) -> bool:
        """Its routed experts' linear layers carry biases, as every linear layer does (``bias``)
        or as its experts alone do (``MoESpec.expert_bias``); some stacks split such experts by
        no expert TP (``StackSpec.expert_tp_with_bias``)."""
        return self.moe is not None and (self.bias or self.moe.expert_bias)

    @property
    def qk_normed(self) -> bool:
        """Its queries and keys are normed per head, by either kind of QK norm."""
        return self.qk_norm or self.qk_l2_norm

    @property
    def homogeneous(self) -> bool:
        """Every transformer block is of one kind (all dense, or all MoE)."""
        return self.num_moe_layers in (0, self.layers)

    @property
    def gated(self) -> bool:
        return self.mlp in (MLPKind.SWIGLU, MLPKind.GEGLU)


# ----------------------------------------------------------------------------- training


@dataclass(frozen=True, kw_only=True)
class TrainingSpec(_CachedHash):
    """What is trained: the workload. How a framework runs it is the stack (``stack.py``)."""

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: Precision = Precision.BF16
    """Matmul precision (weights and activations are kept in bf16 either way)."""
    attention_span: int | None = None
    """Tokens a query attends to when sequences are packed from shorter documents (block-diagonal
    attention, as in packed fine-tuning); None = the whole sequence."""
    moe_imbalance: float = 1.0
    """Routed tokens of the busiest expert-parallel rank over the mean (1: balanced, as in
    benchmarks that force balanced routing; trained routers run above 1). The busiest rank sets
    the pace: its expert GEMMs and its share of the exchange grow by this factor."""
    moe_capacity: float | None = None
    """Expert capacity factor (Megatron ``--moe-expert-capacity-factor``): tokens beyond it are
    dropped, which caps the imbalance; None = dropless."""

    def __post_init__(self):
        for name in ("seq_len", "global_batch"):
            value = getattr(self, name)
            _positive(name, value)
            if value > MAX_TOKENS:
                raise SpecError(name, value, f"at most {MAX_TOKENS:,} is supported")
        if self.attention_span is not None:  # (one at or beyond seq_len: the whole sequence)
            if _positive("attention_span", self.attention_span) > MAX_TOKENS:
                raise SpecError("attention_span", self.attention_span,
                                f"at most {MAX_TOKENS:,} is supported")
        for f, what in (("moe_imbalance", "the busiest expert rank's routed tokens over the mean"),
                        ("moe_capacity", "the tokens an expert takes over its mean share (a "
                         "factor below 1, dropping tokens of balanced routing, is not modelled)")):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, (int, float)) and 1 <= v <= 64):
                raise SpecError(f, v, f"must be in [1, 64]: {what}")

    def micro_batches(self, mbs: int, dp: int) -> int:
        """Micro-batches each data-parallel replica runs per step, at ``mbs`` sequences each
        (``check_plan`` refuses a global batch that ``mbs·dp`` does not divide)."""
        return self.global_batch // (mbs * dp)

    @property
    def document_span(self) -> int | None:
        """Tokens of the packed documents a query attends within, where they are shorter than a
        sequence (``attention_span`` below ``seq_len``); None: attention over the whole
        sequence."""
        span = self.attention_span
        return span if span is not None and span < self.seq_len else None

    @property
    def moe_load(self) -> float:
        """The busiest expert rank's routed tokens over the mean, after dropping."""
        return min(self.moe_imbalance, self.moe_capacity or math.inf)


def layer_indices(where: str, value, layers: int) -> tuple[int, ...]:
    """0-based block indices as a model file or a HuggingFace config lists them (``[moe]
    layers``, ``local_layers``, ``moe_layers``, ``mlp_only_layers``): whole numbers in
    [0, ``layers``), or in [0, MAX_LAYERS) while ``layers`` is itself not valid (the model's check
    names it). Order and repeats are the fields' own rules (``MoESpec``, ``ModelSpec``)."""
    bound = layers if isinstance(layers, int) and 0 < layers <= MAX_LAYERS else MAX_LAYERS
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < bound for i in value):
        raise SpecError(where, value, f"must list layer indices, whole numbers in [0, {bound})")
    return tuple(value)


def moe_layer_fields(moe_layers, layers: int) -> dict:
    """The ``MoESpec`` fields that put MoE blocks on the 0-based ``moe_layers`` of ``layers``
    (sorted, each once; at least one): ``first_dense_layers`` and ``layer_freq`` where the blocks
    follow such a pattern, else the list (``MoESpec.layers``)."""
    listed = sorted(set(moe_layers))
    first = listed[0]
    step = listed[1] - first if len(listed) > 1 else layers
    if listed == list(range(first, layers, step)):
        return dict(first_dense_layers=first, layer_freq=step)
    return dict(layers=tuple(listed))


def sliding_window_cost(window: int, local_layers, layers: int) -> dict:
    """The model fields of a sliding window of ``window`` tokens (0: none) on ``local_layers``
    (0-based; every layer when empty) of ``layers``: what it costs as local attention (a causal
    window of w costs about what causal chunks of 2w cost) beside the window and its layers."""
    if not window:
        return dict(local_span=0, local_share=0.0, sliding_window=0, local_layers=())
    local = tuple(local_layers)
    return dict(local_span=2 * window, local_share=len(local) / layers if local and layers else 1.0,
                sliding_window=window, local_layers=local)


def most_moe_load(moe: "MoESpec", ep: int) -> float:
    """The most the busiest of ``ep`` expert ranks can receive over the mean: every token sends
    its top-k copies to distinct experts, at most experts / ep of them to one rank, so the rank
    gets at most ``tokens·min(top_k, experts/ep)`` of the ``tokens·top_k/ep`` a rank averages:
    ``min(ep, experts/top_k)`` (2 for 8 experts, top-2, over 2 ranks)."""
    return min(ep, moe.experts / moe.top_k)


def capped_moe_load(model: "ModelSpec", ep: int, tr: TrainingSpec, padded: bool) -> float | None:
    """The most ``ep`` expert ranks can have where the stated load is more (the load the plan is
    then costed at, ``costed_moe_load``), else None: none without experts, one rank or padding."""
    if model.moe is None or ep == 1 or padded:
        return None
    most = most_moe_load(model.moe, ep)
    return most if tr.moe_load > most else None


def costed_moe_load(model: "ModelSpec", ep: int, tr: TrainingSpec, padded: bool) -> float:
    """The busiest expert rank's load over the mean a plan is costed at: the capacity where every
    expert's input is padded to it (``padded``: ``StackSpec.pads_experts``); else the stated load
    after dropping (``TrainingSpec.moe_load``), at most what ``ep`` ranks can have
    (``most_moe_load``); 1 for a model without experts."""
    if model.moe is None:
        return 1.0
    if padded:
        return tr.moe_capacity
    return min(tr.moe_load, most_moe_load(model.moe, ep))


# ----------------------------------------------------------------------------- plan


_RANK_SET = frozenset(RANK_AXES)


@dataclass(frozen=True, kw_only=True)
class Parallelism(_CachedHash):
    """Degrees and knobs of one training plan. ``tp·pp·dp·cp`` = devices."""

    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline stages (physical)."""
    dp: int = 1
    """Data-parallel replicas."""
    cp: int = 1
    """Context-parallel degree (splits the sequence)."""
    ep: int = 1
    """Expert-parallel degree. The expert grid etp × ep × edp folds over the same tp·cp·dp ranks
    as the attention grid (Megatron-Core's MoE parallel folding), so EP may span TP ranks."""
    etp: int | None = None
    """Expert tensor-parallel degree (None = same as tp)."""
    vp: int = 1
    """Virtual stages (model chunks) per pipeline rank; > 1 selects the interleaved schedule."""
    sp: bool = False
    """Sequence parallelism in the TP regions outside the GEMMs."""
    zero: int = 0
    """ZeRO stage: 0 none, 1 optimizer (= distributed optimizer), 2 + gradients, 3 + weights."""
    recompute: tuple[str, ...] = ("none",)
    """Recompute policy per pipeline stage, by the stack's names (one entry applies to every
    stage)."""
    mbs: int = 1
    """Micro-batch size, sequences."""
    rank_order: tuple[Axis, ...] = MEGATRON_ORDER
    """Axes from innermost (consecutive ranks) to outermost; ranks map to device ids in order."""
    stage_layers: tuple[int, ...] | None = None
    """Transformer blocks per model chunk in pipeline order (pp·vp entries); None = even split."""
    schedule: str | None = None
    """Pipeline schedule by name (``schedule.SCHEDULES``); None: 1F1B, interleaved when vp > 1."""
    mirror: bool = False
    """Internal: this is a DualPipe plan's fold (:func:`fold`), whose pipeline devices each stand
    for a rank and its mirror and whose replicas are twice the real ones; plans written, read
    and exported never set it."""

    def __post_init__(self):
        # checks that involve schedule, vp or zero belong in ``_check_staging``: ``with_`` runs
        # only that one when those are all that change (``_DERIVED``)
        for f, cap, what in (("tp", MAX_GPUS, "devices"), ("pp", MAX_GPUS, "devices"),
                             ("dp", MAX_GPUS, "devices"), ("cp", MAX_GPUS, "devices"),
                             ("ep", MAX_GPUS, "devices"), ("etp", MAX_GPUS, "devices"),
                             ("mbs", MAX_TOKENS, "sequences")):
            value = getattr(self, f)
            if value is not None and _positive(f, value) > cap:  # (etp None: follows tp)
                raise SpecError(f, value, f"at most {cap:,} {what}")
        self._check_staging()
        if isinstance(self.recompute, str):
            object.__setattr__(self, "recompute", (self.recompute,))
        if type(self.recompute) is not tuple or not all(type(r) is str for r in self.recompute):
            object.__setattr__(self, "recompute", tuple(str(r) for r in self.recompute))
        if not self.recompute or len(self.recompute) not in (1, self.pp) or not all(
                self.recompute):
            raise SpecError("recompute", runs_text(self.recompute), "give one policy or one per "
                            f"pipeline stage ({self.pp}; {len(self.recompute)} given)")
        if len(self.rank_order) != len(RANK_AXES) or set(self.rank_order) != _RANK_SET:
            raise SpecError("rank_order", order_text(self.rank_order),
                            "must order each of tp, cp, dp, pp once")
        if self.stage_layers is not None:
            for i, n in enumerate(self.stage_layers):
                _positive(f"stage_layers[{i}]", n, allow_zero=True)

    def _check_staging(self) -> None:
        """The checks of the fields the search derives plans by (``_DERIVED``): schedule, vp,
        ZeRO stage, and the blocks per chunk against vp."""
        if _positive("vp", self.vp) > MAX_LAYERS:
            raise SpecError("vp", self.vp, f"at most {MAX_LAYERS:,} model chunks per device: no "
                            "model has more layers")
        if self.schedule is not None:
            if self.schedule not in SCHEDULES:
                raise SpecError("schedule", self.schedule, "allowed: " + ", ".join(SCHEDULES))
            if is_default(self.schedule, self.vp):
                object.__setattr__(self, "schedule", None)  # one form for the default
            elif self.pp == 1:  # (not dropped without a word: the plan runs no pipeline)
                raise no_pipeline_schedule(self.schedule)
        if self.zero not in (0, 1, 2, 3):
            raise SpecError("zero", self.zero, "allowed: 0, 1, 2, 3")
        if self.vp > 1 and self.pp == 1:
            raise SpecError("vp", self.vp, "virtual stages need pp > 1")
        chunks = self.pipeline.model_chunks(self.pp, self.vp)
        if self.stage_layers is not None and len(self.stage_layers) != chunks:
            raise SpecError("stage_layers", list_text(self.stage_layers), f"needs {chunks} entries (pp·vp"
                            + (" / 2: every stage is on two ranks)" if chunks < self.pp * self.vp
                               else ")"))

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def head_beside_embedding(self) -> bool:
        """The output head runs on the embedding's device: without pipelining, or in a V."""
        return self.pp == 1 or self.pipeline.v_shape or self.pipeline.mirrored

    def hops(self) -> tuple[int, ...]:
        """The stage boundaries one micro-batch's forward crosses (``Schedule.hops``); a DualPipe
        fold's V also turns between two ranks (``placement._mirror_layouts``' last boundary)."""
        return self.pipeline.hops(self.pp, self.vp) + ((self.pp - 1,) if self.mirror else ())

    @property
    def pipeline(self):
        """The :class:`~nestplan.schedule.Schedule` this plan runs."""
        return resolve(self.schedule, self.vp)

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert's weights: tp·cp·dp / (etp·ep)."""
        return self.tp * self.cp * self.dp // (self.expert_tp * self.ep)

    @property
    def recompute_text(self) -> str:
        """The policies as ``--recompute`` takes them (``recompute.names_text``)."""
        return names_text(self.recompute)

    def recompute_of(self, stage: int) -> str:
        return self.recompute[0] if len(self.recompute) == 1 else self.recompute[stage]

    def same_plan(self, other: "Parallelism") -> bool:
        """``other`` runs this plan: equal but for how the policies are spelt (one for every
        stage, or each stage's)."""
        def spelt(p):
            return p.with_(recompute=tuple(p.recompute_of(i) for i in range(p.pp)))

        return spelt(self) == spelt(other)

    def to_dict(self) -> dict:
        """The plan as plan files and JSON output write it (the one serialisation; plan files
        read it back with ``planfile``): every degree, the schedule's name, one recompute policy
        per stage, the rank order as ``tp-cp-dp-pp`` and the blocks per chunk (None: even; the
        schedule None without a pipeline)."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep,
                "etp": self.expert_tp, "vp": self.vp,
                "schedule": self.pipeline.name if self.pp > 1 else None,
                "sp": self.sp, "zero": self.zero,
                "recompute": [self.recompute_of(s) for s in range(self.pp)], "mbs": self.mbs,
                "rank_order": order_text(self.rank_order),
                "stage_layers": list(self.stage_layers) if self.stage_layers else None}

    def ranks_ordered_as(self, order: tuple[Axis, ...]) -> bool:
        """The plan's rank order places every rank where ``order`` does: the two agree once
        the axes of size 1, which move nothing, are left out."""
        size = {Axis.TP: self.tp, Axis.CP: self.cp, Axis.DP: self.dp, Axis.PP: self.pp}
        return ([a for a in self.rank_order if size[a] > 1]
                == [a for a in order if size[a] > 1])

    def with_(self, **changes) -> "Parallelism":
        """A copy with ``changes``, checked as the constructor checks. Changes only to the
        fields the search derives plans by (schedule, vp, ZeRO stage) re-run only their checks:
        the rest of the plan was checked when it was made (the search derives ~10^5 plans)."""
        if not changes.keys() <= _DERIVED:
            return replace(self, **changes)
        new = object.__new__(Parallelism)
        state = {k: v for k, v in self.__dict__.items() if k != "_hash"}
        state.update(changes)
        new.__dict__.update(state)
        new._check_staging()
        return new


_DERIVED = frozenset({"schedule", "vp", "zero"})


def fold(par: Parallelism) -> Parallelism:
    """The plan the cost model runs for ``par``: itself, or for a mirrored schedule (DualPipe on
    ``p`` ranks and ``d`` replicas) DualPipeV on ``p/2`` positions and ``2d`` replicas, each
    position standing for rank ``h`` and its mirror ``p - 1 - h`` (the same stages, the same
    order of operations: ``schedule`` module docstring), marked ``mirror`` so that placement
    lays its groups over the real ranks."""
    if not par.pipeline.mirrored:
        return par
    half = par.pp // 2
    return replace(par, pp=half, dp=2 * par.dp, schedule=par.pipeline.folds_to, mirror=True,
                   recompute=tuple(par.recompute_of(h) for h in range(half)))


def unfold(par: Parallelism) -> Parallelism:
    """The DualPipe plan whose fold ``par`` is (``par`` itself when it is no fold)."""
    if not par.mirror:
        return par
    per = par.recompute if len(par.recompute) == 1 else par.recompute + par.recompute[::-1]
    real = next(n for n, s in SCHEDULES.items() if s.folds_to == par.pipeline.name)
    return replace(par, pp=2 * par.pp, dp=par.dp // 2, schedule=real, mirror=False,
                   recompute=per)


MAX_HEADROOM = 0.5
"""A plan may be asked to leave less than this share of HBM free beyond its predicted peak."""


def valid_headroom(share) -> bool:
    """The one rule for a memory headroom (a share of HBM; NaN and booleans are not)."""
    return (isinstance(share, (int, float)) and not isinstance(share, bool)
            and 0 <= share < MAX_HEADROOM)


MAX_GPUS = 2**20
"""Largest device count accepted, well above any training cluster built so far."""
MAX_LAYERS = 512
"""Transformer blocks a model may have: four times the deepest dense model published with its
configuration (Llama 3 405B, 126). The stage DP's split tables grow with the square of the
blocks: measured on two cores with Llama 3 8B's widths on 1,024 H100, 512 blocks plan in 5 s,
1,000 in 82 s and 1.4 GB, 2,000 took 262 s and 24 GB."""


@dataclass(frozen=True, kw_only=True)
class Scenario(_CachedHash):
    """Everything a plan is evaluated against."""

    model: ModelSpec
    cluster: ClusterSpec
    gpus: int
    """Devices used by the run."""
    training: TrainingSpec
    stack: StackSpec = field(default_factory=lambda: _default_stack())
    """The framework that runs it (default: the catalog's ``megatron-core``)."""
    memory_headroom: float = 0.06
    """Share of each device's HBM a recommended plan leaves free beyond its predicted peak. The
    default covers the largest under-prediction measured against frameworks' logged peaks on
    the development rows: predicted 5.5 % below measured (fsdp_runs.csv memory rows, README
    "Accuracy"), i.e. a measured peak up to 1/(1 - 0.055) = 1.058 times the prediction. Held-out
    torchtitan runs at 70B and 405B with TP and PP were under-predicted by up to 21.4 % (README,
    "Held-out runs"); the default was not raised after seeing them."""

    def __post_init__(self):
        _positive("gpus", self.gpus)
        if not valid_headroom(self.memory_headroom):
            raise SpecError("memory_headroom", self.memory_headroom,
                            f"must be a share of HBM in [0, {MAX_HEADROOM})")
        if self.gpus > MAX_GPUS:
            raise SpecError("gpus", self.gpus, f"at most {MAX_GPUS:,} devices are supported")
        cap = self.cluster.max_devices
        if cap is not None and self.gpus > cap:
            raise SpecError("gpus", self.gpus, f"cluster {self.cluster.name} holds at most {cap}")
        if self.model.moe is not None and not self.stack.mixture_of_experts:
            from .catalog import get_stack, list_names

            ones = [n for n in list_names("stacks") if get_stack(n).mixture_of_experts]
            raise SpecError("stack", self.stack.name, f"trains no mixture-of-experts layers, "
                            f"which {self.model.name} has", "use a stack that does ("
                            + ", ".join(ones) + ")")
        if self.model.mtp_layers and not self.stack.multi_token_prediction:
            raise SpecError("model.mtp_layers", self.model.mtp_layers,
                            f"stack {self.stack.name} trains no multi-token-prediction depths",
                            "set 0 (--mtp-layers 0; mtp_layers = [0] in a sweep grid)")
        if self.model.mtp_layers > 1 and self.model.moe is not None \
                and self.stack.moe_overlap == "batch":
            # "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm"
            # (TransformerConfig.__post_init__, megatron/core/transformer/transformer_config.py
            # @ d98e8a64dd): a user trial's export had been refused at start-up
            raise SpecError("model.mtp_layers", self.model.mtp_layers,
                            f"stack {self.stack.name} overlaps the expert exchange with another "
                            "micro-batch (moe_overlap = batch), which Megatron-Core runs with at "
                            "most one multi-token-prediction depth", "set 1 or 0 (--mtp-layers)")

    @property
    def memory_limit(self) -> float:
        """Bytes a recommended plan may use per device: HBM less the headroom."""
        return self.cluster.accelerator.hbm_bytes * (1.0 - self.memory_headroom)


def _default_stack() -> StackSpec:
    from .catalog import get_stack

    return get_stack()


def dense_etp(model: ModelSpec, etp: int) -> SpecError:
    """The refusal of an expert-TP degree (other than tp) for a model without experts."""
    return SpecError("etp", etp, f"{model.name} has no experts; leave etp unset")


def unfoldable(etp: int, ep: int, room: int, how: str = "", *, gpus: bool = False,
               etp_is_tp: bool = False) -> SpecError:
    """The refusal of an expert grid etp·ep that does not divide the ``room`` (tp·cp·dp ranks,
    ``how`` says when it was known otherwise; ``gpus``: the room is the GPUs, which tp·cp·dp
    only divides) it folds over, naming etp where it alone cannot divide the room or ep is 1,
    else ep; ``etp_is_tp``: etp was not given and took tp's value, which the advice says (a MoE
    trial's --tp 2 --ep 8 on 8 GPUs had not been told where the 2 came from)."""
    field, value = ("etp", etp) if ep == 1 or room % etp else ("ep", ep)
    ranks = f"tp·cp·dp, a divisor of gpus = {room}" if gpus else f"tp·cp·dp = {room}{how}"
    advice = (f"etp, not given, is tp's {etp}; etp = 1 folds the experts over the TP ranks"
              if etp_is_tp and etp > 1 and room % ep == 0 else "")
    return SpecError(field, value, f"etp·ep = {etp}·{ep} must divide {ranks}, the ranks the "
                     "expert grid folds over", advice)


def etp_refusal(moe: "MoESpec", etp: int) -> SpecError | None:
    """The refusal of an expert-TP degree that does not split the experts' FFN, or None."""
    if moe.ffn_hidden % etp:
        return SpecError("etp", etp, f"must divide moe.ffn_hidden = {moe.ffn_hidden}")
    return None


def moe_tp_without_sp(stack_name: str, tp: int) -> SpecError:
    """The refusal of tensor parallelism for MoE layers on a stack without sequence parallelism
    (the token dispatch of Megatron-Core's MoE layers needs it under tp > 1)."""
    return SpecError("tp", tp, "MoE layers with tp > 1 need sequence parallelism, which stack "
                     f"{stack_name} does not have", "use tp = 1")


def no_pipeline_schedule(name: str, flag: str = "pp") -> SpecError:
    """The refusal of schedule ``name`` for a plan without a pipeline (``flag``: the knob's
    name as the input spells it)."""
    return SpecError("schedule", name, f"a pipeline schedule needs {flag} > 1")


MIN_CP_CHUNK = 1024
"""Tokens of a rank's share of the sequence below which the search offers no CP degree."""


def cp_splits(seq_len: int, cp: int) -> bool:
    """``cp`` ranks split sequences of ``seq_len`` tokens into load-balanced causal chunks, two a
    rank."""
    return seq_len % (2 * cp) == 0


def cp_offered(seq_len: int, cp: int, fixed: int | None = None) -> bool:
    """The search offers context parallelism of ``cp`` for sequences of ``seq_len``: split as
    ``cp_splits`` says, each rank's share at least ``MIN_CP_CHUNK`` tokens unless the degree is
    ``fixed`` (the command line's, which check_plan alone judges)."""
    return cp == 1 or (cp_splits(seq_len, cp)
                       and (seq_len // cp >= MIN_CP_CHUNK or cp == fixed))


def cp_refusal(seq_len: int, cp: int) -> SpecError | None:
    """Why ``cp`` ranks cannot split sequences of ``seq_len`` into load-balanced causal chunks
    (two per rank), beyond dividing it; None when they can."""
    if cp > 1 and not cp_splits(seq_len, cp):
        return SpecError("cp", cp, "seq_len / cp must be even (load-balanced causal chunks)")
    return None


def batch_refusal(global_batch: int, mbs: int | None, dp: int, how: str = "") -> SpecError | None:
    """Why ``dp`` replicas of micro-batches of ``mbs`` sequences (None: not fixed yet, so only
    the replicas) cannot take a global batch of ``global_batch``; ``how`` says how dp was
    found when it was not given. None when they can."""
    step = dp * (mbs or 1)
    if global_batch % step == 0:
        return None
    rule = (f"must be a multiple of dp = {dp}" if mbs is None
            else f"must be a multiple of mbs·dp = {mbs}·{dp} = {step}")
    # the nearest (a NEST-paper trial's baselines of ceil(B/d) micro-batches, 4,096 over dp 42)
    near = " or ".join(f"{n:,}" for n in multiples_near(global_batch, step))
    return SpecError("global_batch", global_batch, f"{rule}{how} (the nearest: {near})")


def multiples_near(n: int, step: int) -> tuple[int, ...]:
    """The multiples of ``step`` either side of ``n`` (``n`` not one), those above 0: what a
    refused global batch is told it could be."""
    below = n - n % step
    return tuple(m for m in (below, below + step) if m > 0)


def schedule_refusal(sc: Scenario, name: str, pp: int, vp: int, mbs: int, dp: int, *,
                     stack: bool = True) -> SpecError | None:
    """Why schedule ``name`` cannot run ``pp`` stages of ``vp`` chunks with micro-batches of
    ``mbs`` on ``dp`` replicas (under the scenario's stack, unless ``stack`` is False), as the
    error to raise; a micro-batch count is the global batch's, the input the user gave."""
    micro = sc.training.micro_batches(mbs, dp)
    why = (sc.stack.schedule_refusal(name, pp, vp, micro) if stack
           else SCHEDULES[name].check(pp, vp, micro))
    if why is None:
        return None
    field, value, rule = why
    if field == MICRO_BATCHES:
        field, value, rule = "global_batch", sc.training.global_batch, (
            f"{micro} micro-batches per replica (global_batch / (mbs·dp)); {rule}")
    return SpecError(field, value, rule)


def kv_heads_refusal(m: ModelSpec, stack, tp: int) -> str | None:
    """Why ``stack`` (None: any) cannot run TP ``tp`` over ``m``'s KV heads, or None: a TP degree
    divides them or, where the stack runs it (``StackSpec.tp_beyond_kv_heads``), is a multiple
    of them."""
    if m.kv_heads % tp == 0:
        return None
    if stack is not None and not stack.tp_beyond_kv_heads:
        return (f"must divide kv_heads = {m.kv_heads} on stack {stack.name}, which splits each "
                "KV head whole")
    if tp % m.kv_heads:
        return f"must divide kv_heads = {m.kv_heads} or be a multiple of it"
    return None


def tied_pipeline_refusal(m: ModelSpec, stack, pp: int) -> str | None:
    """Why ``stack`` cannot run ``m`` over ``pp`` pipeline stages because its output layer shares
    the embedding's weights (``StackSpec.pipeline_tied_embeddings``), or None."""
    if pp > 1 and m.tied_embeddings and not stack.pipeline_tied_embeddings:
        return (f"stack {stack.name} runs no pipeline for a model whose output layer shares the "
                f"embedding's weights ({m.name}: tied embeddings); use pp = 1")
    return None


MTP_AXIS_WORDS = {"pp": "pipeline", "cp": "context"}
"""The parallelism each axis a stack may run no multi-token-prediction depth with names
(``StackSpec.mtp_without``)."""


def mtp_refusal(m: ModelSpec, stack, axis: str, degree: int) -> str | None:
    """Why ``stack`` cannot run ``m``'s multi-token-prediction depths with ``degree`` on
    parallel ``axis`` (``StackSpec.mtp_without``), or None."""
    if degree > 1 and m.mtp_layers and axis in stack.mtp_without:
        what = MTP_AXIS_WORDS[axis]
        return (f"stack {stack.name} runs no multi-token-prediction depth with {what} "
                f"parallelism ({m.name} has {m.mtp_layers}); use {axis} = 1, or --mtp-layers 0")
    return None


def model_axis_refusal(m: ModelSpec, stack, axis: str, degree: int) -> str | None:
    """Why ``stack`` cannot run ``m`` with ``degree`` on parallel ``axis`` (``pp`` or ``cp``) for
    what the model holds: tied embeddings under a pipeline (``tied_pipeline_refusal``),
    multi-token-prediction depths (``mtp_refusal``); None when it can."""
    if axis == "pp" and (rule := tied_pipeline_refusal(m, stack, degree)) is not None:
        return rule
    return mtp_refusal(m, stack, axis, degree)


def sinks_cp_refusal(m: ModelSpec, stack, tp: int, cp: int) -> str | None:
    """Why ``stack`` cannot run ``m``'s attention with sinks at context parallelism ``cp`` and
    tensor parallelism ``tp``, or None: Transformer Engine runs CP over sinks only with its a2a
    exchange (``StackSpec.cp_gathers_windows``), which splits each TP rank's query and KV heads
    over the CP ranks and asserts both divide by cp (``AttnFuncWithCPAndQKVOA2A``,
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py @
    NVIDIA/TransformerEngine d0067d0da: "a2a requires num_heads % cp_size == 0"); a TP rank
    beyond the KV heads holds one, replicated. (A long-context trial's GPT-OSS plan at tp 8, cp 4,
    one KV head a rank, had been recommended; only its export said it does not run.)"""
    if cp == 1 or not m.attention_sinks or stack is None or not stack.cp_gathers_windows:
        return None
    q, kv = m.heads // tp, m.kv_heads_per_rank(tp)
    if q % cp == 0 and kv % cp == 0:
        return None
    return (f"attention with sinks runs under context parallelism only with Transformer "
            f"Engine's a2a exchange, which splits each TP rank's heads over the CP ranks: its {q} "
            f"query and {kv} KV heads (tp = {tp}) must divide by cp = {cp}")


def check_plan(sc: Scenario, par: Parallelism, *, stack: bool = True) -> None:
    """Validate ``par`` against the scenario and (unless ``stack`` is False) what its stack can
    run; raise SpecError naming the first violated rule."""
    m, t = sc.model, sc.training
    if t.precision is Precision.FP8 and sc.cluster.accelerator.peak_flops_fp8 is None:
        raise SpecError("precision", "fp8", f"{sc.cluster.accelerator.name} has no fp8 matmul "
                        "units; use bf16")
    if par.devices != sc.gpus:
        raise SpecError("dp", par.dp, f"tp·pp·dp·cp = {par.tp}·{par.pp}·{par.dp}·{par.cp} = "
                        f"{par.devices} must equal gpus = {sc.gpus}")
    if par.tp > m.heads:
        raise SpecError("tp", par.tp, f"must be <= heads = {m.heads} ({m.name})")
    _divides("tp", par.tp, "heads", m.heads, f"one of {divisors(m.heads)[:8]}")
    if (rule := kv_heads_refusal(m, sc.stack if stack else None, par.tp)) is not None:
        raise SpecError("tp", par.tp, rule)
    for axis, degree in (("pp", par.pp), ("cp", par.cp)):
        if stack and (rule := model_axis_refusal(m, sc.stack, axis, degree)) is not None:
            raise SpecError(axis, degree, rule)
    if stack and (rule := sinks_cp_refusal(m, sc.stack, par.tp, par.cp)) is not None:
        raise SpecError("cp", par.cp, rule)
    if t.seq_len % par.cp:
        raise SpecError("cp", par.cp, f"must divide seq_len = {t.seq_len}")
    if (why := cp_refusal(t.seq_len, par.cp)) is not None:
        raise why
    if par.sp and par.tp == 1:
        raise SpecError("sp", True, "sequence parallelism needs tp > 1")
    if par.sp and par.tp > 1 and (t.seq_len // par.cp) % par.tp:
        raise SpecError("sp", True, f"sequence parallelism needs tp = {par.tp} to divide "
                        f"seq_len / cp = {t.seq_len // par.cp}")
    if m.moe is None:
        if par.ep > 1:
            raise SpecError("ep", par.ep, f"{m.name} has no experts; use ep = 1")
        if par.etp is not None and par.etp != par.tp:
            raise dense_etp(m, par.etp)
    else:
        if par.ep > m.moe.experts or m.moe.experts % par.ep:
            raise SpecError("ep", par.ep, f"must divide the {m.moe.experts} experts of {m.name}")
        if (par.tp * par.cp * par.dp) % (par.expert_tp * par.ep):
            raise unfoldable(par.expert_tp, par.ep, par.tp * par.cp * par.dp,
                             etp_is_tp=par.etp is None)
        if par.tp > 1 and not par.sp:
            # (what the stack lacks first: asking for --sp would only draw its refusal next)
            if stack and (axis := sc.stack.missing_axis(par)) is not None:
                raise SpecError(*axis)
            if stack and "sp" not in sc.stack.axes:
                raise moe_tp_without_sp(sc.stack.name, par.tp)
            raise SpecError("sp", False, "MoE layers with tp > 1 need sequence parallelism (--sp), "
                            "as in Megatron-Core")
        if (why := etp_refusal(m.moe, par.expert_tp)) is not None:
            raise why
        if stack and (why := sc.stack.dispatcher_refusal(par.expert_tp, par.ep, sc.cluster)) is not None:
            raise SpecError(*why)
    if m.ffn_hidden % par.tp:
        raise SpecError("tp", par.tp, f"must divide ffn_hidden = {m.ffn_hidden}")
    if (why := batch_refusal(t.global_batch, par.mbs, par.dp)) is not None:
        raise why
    why = schedule_refusal(sc, par.pipeline.name, par.pp, par.vp, par.mbs, par.dp, stack=stack)
    if why is not None:
        raise why
    if par.pipeline.mirrored and any(par.recompute_of(r) != par.recompute_of(par.pp - 1 - r)
                                     for r in range(par.pp)):
        raise SpecError("recompute", par.recompute_text, f"under {par.pipeline.name} rank r "
                        "and rank pp-1-r hold the same stages: give them the same policy")
    chunks = par.pipeline.model_chunks(par.pp, par.vp)
    if par.stage_layers is None:
        if m.layers < chunks:
            raise SpecError("pp", par.pp, f"pp·vp = {chunks} exceeds the {m.layers} layers of "
                            f"{m.name}")
    elif sum(par.stage_layers) != m.layers:
        raise SpecError("stage_layers", list_text(par.stage_layers),
                        f"must sum to model.layers = {m.layers}")
    if stack:
        sc.stack.check(par, biased=m.biased_experts)


def even_split(layers: int, chunks: int) -> tuple[int, ...]:
    """Blocks per chunk, as even as possible; extra blocks go to the middle chunks first.

    The first chunk holds the embedding and the last the output head, so they receive extra
    blocks last (Megatron allows uneven first and last stages).

    >>> even_split(10, 4)
    (2, 3, 3, 2)
    """
    base, extra = divmod(layers, chunks)
    counts = [base] * chunks
    order = list(range(1, chunks - 1)) + [chunks - 1, 0] if chunks > 2 else list(range(chunks))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def spread(total: int, vp: int) -> list[int]:
    """Blocks in each of a device's ``vp`` chunks when it holds ``total``: as even as possible,
    the extra blocks in its last chunks (the plan space's rule; ``search.space.chunk_counts``
    is its array form). A schedule holds no more micro-batches of a later chunk than of an
    earlier one at the peak (interleaved 1F1B: 7, 4, 4, ... on the first device), so the extra
    blocks there cost the least memory (they had gone first: a plan-quality audit found even
    splits refused for it that run up to 2.6 % faster).

    >>> spread(5, 2)
    [2, 3]
    """
    return [total // vp + (1 if k >= vp - total % vp else 0) for k in range(vp)]


def chunks_from_totals(totals: tuple[int, ...], vp: int) -> tuple[int, ...]:
    """Chunk sizes in model order (round-major) when device ``i`` holds ``totals[i]`` blocks
    spread over its ``vp`` chunks (:func:`spread`).

    >>> chunks_from_totals((5, 4), 2)
    (2, 2, 3, 2)
    """
    per_device = [spread(t, vp) for t in totals]
    return tuple(chunks[r] for r in range(vp) for chunks in per_device)


def interleaves(model: ModelSpec, vp: int, schedule=None) -> bool:
    """Whether the search's split rule runs ``model`` in ``vp`` chunks per device placed by
    ``schedule`` (looped when not given): a model whose blocks differ (dense and MoE) only in
    rounds of ``layers / vp`` blocks, and never in a V (``search.space.splits``)."""
    if vp == 1 or model.homogeneous:
        return True
    return model.layers % vp == 0 and not (schedule is not None and schedule.v_shape)


def default_split(model: ModelSpec, pp: int, vp: int, schedule=None) -> tuple[int, ...]:
    """Blocks per chunk when a plan does not say: every device as even as possible, each
    device's blocks spread over its chunks (``interleaves`` and ``search.space.split_units``:
    the rule for models whose blocks differ); ``schedule`` places the chunks (looped when not
    given)."""
    if schedule is not None and schedule.mirrored:  # its fold's split (``fold``)
        return default_split(model, pp // 2, vp, SCHEDULES[schedule.folds_to])
    if schedule is not None and schedule.v_shape:
        return schedule.model_order([spread(t, vp) for t in even_split(model.layers, pp)], pp, vp)
    if vp > 1 and not model.homogeneous and interleaves(model, vp):  # one round's split, repeated
        return even_split(model.layers // vp, pp) * vp
    return chunks_from_totals(even_split(model.layers, pp), vp)


def embedding_copies(model: ModelSpec, par: Parallelism) -> bool:
    """The embedding's gradient is all-reduced between the first and the last pipeline stage,
    summed with its copy on the head's device (a tied output weight, or multi-token prediction's
    lookup table); where the head runs beside the embedding (``head_beside_embedding``: one
    stage, a V, DualPipe's fold) nothing is all-reduced."""
    return bool(model.tied_embeddings or model.mtp_layers) and not par.head_beside_embedding


def blocks_per_chunk(model: ModelSpec, par: Parallelism) -> tuple[int, ...]:
    """The plan's blocks per model chunk in model order, as ``--stage-layers`` takes them: its
    own split, else ``default_split``."""
    if par.stage_layers:
        return tuple(par.stage_layers)
    return tuple(default_split(model, par.pp, par.vp, par.pipeline))


def uneven_chunks(model: ModelSpec, par: Parallelism) -> bool:
    """Some device's model chunks hold different numbers of blocks (schedules of several chunks
    a device: the closed form spreads a device's blocks evenly over its chunks,
    ``Evaluation.uneven_chunks`` simulates them; a mirrored schedule as its fold runs it)."""
    if par.pipeline.mirrored:
        par = fold(par)
    if par.vp == 1:
        return False
    per = par.pipeline.per_device(blocks_per_chunk(model, par), par.pp, par.vp)
    return any(len(set(chunks)) > 1 for chunks in per)


def uneven_split(model: ModelSpec, par: Parallelism) -> tuple[int, ...] | None:
    """The plan's own split where it is not the default one (None: the default, or no pipeline):
    what a plan's text must name for ``evaluate`` to give the same plan."""
    if par.pp == 1 or not par.stage_layers:
        return None
    split = tuple(par.stage_layers)
    return None if split == tuple(default_split(model, par.pp, par.vp, par.pipeline)) else split


def split_text(model: ModelSpec, par: Parallelism) -> str:
    """``uneven_split`` as ``--stage-layers`` takes it ("3,4,4,5"); "" for the default split."""
    split = uneven_split(model, par)
    return list_text(split) if split else ""


def list_text(values) -> str:
    """A list as a flag takes it ("8,8,8,9"), as errors echo a list the user gave."""
    return ",".join(map(str, values))


def plan_knobs(model: ModelSpec, par: Parallelism, *, settled: bool = True) -> list[str]:
    """A plan as ``name=value`` words, each one of evaluate's flags (``tp=8`` for ``--tp 8``):
    the degrees, expert TP for an MoE model, chunks, a pipeline's schedule, sequence parallelism,
    ZeRO stage, recomputation, micro-batch, rank order and a split other than the default.
    ``settled=False`` leaves out what the search settles per plan within a configuration (its
    recomputation and split)."""
    knobs = [f"tp={par.tp}", f"pp={par.pp}", f"dp={par.dp}", f"cp={par.cp}", f"ep={par.ep}"]
    if model.moe is not None:
        knobs.append(f"etp={par.expert_tp}")
    knobs.append(f"vp={par.vp}")
    if par.pp > 1:
        knobs.append(f"schedule={par.pipeline.name}")
    knobs += [f"sp={'on' if par.sp else 'off'}", f"zero={par.zero}"]
    if settled:
        knobs.append("recompute=" + par.recompute_text)
    knobs += [f"mbs={par.mbs}", f"rank-order={order_text(par.rank_order)}"]
    split = split_text(model, par) if settled else ""
    if split:
        knobs.append("stage-layers=" + split)
    return knobs
