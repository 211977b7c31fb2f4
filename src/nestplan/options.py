"""Closed sets of options, as enums (never free strings inside nestplan)."""

import enum


class _Choice(str, enum.Enum):
    @classmethod
    def parse(cls, field: str, value: object):
        """The member named ``value``, or a SpecError listing the allowed names."""
        from .errors import SpecError

        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise SpecError(field, value, f"allowed: {allowed}") from None

    def __str__(self) -> str:
        return self.value


class Precision(_Choice):
    """Numeric format of the matmuls; everything else runs in bf16."""

    BF16 = "bf16"
    FP8 = "fp8"


class AttentionImpl(_Choice):
    """How the attention core is computed."""

    FLASH = "flash"  # fused, tiled (FlashAttention): no s×s tensor in memory
    MATERIALIZED = "materialized"  # Megatron 2021-22: QK^T, softmax, dropout as separate kernels


class MLPKind(_Choice):
    """Feed-forward block."""

    GELU = "gelu"  # fc1 -> GeLU -> fc2
    SQUARED_RELU = "squared_relu"  # same shape as gelu (Nemotron)
    SWIGLU = "swiglu"  # gated: (silu(x W_g) * x W_u) W_d
    GEGLU = "geglu"  # gated with GeLU


class Norm(_Choice):
    LAYERNORM = "layernorm"
    RMSNORM = "rmsnorm"


class Position(_Choice):
    LEARNED = "learned"  # absolute position table (GPT-2/3, BERT)
    ROPE = "rope"
    ALIBI = "alibi"


class TPOverlap(_Choice):
    """How much tensor-parallel communication hides behind GEMMs."""

    NONE = "none"  # every TP collective is exposed
    BACKWARD = "backward"  # input-gradient collectives overlap the weight-gradient GEMM
    FULL = "full"  # also forward (Megatron --tp-comm-overlap / userbuffers)
