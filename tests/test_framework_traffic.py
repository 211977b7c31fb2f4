"""The memory traffic of the eager kernels a stack runs (``StackSpec.eager_ops``), counted on
Megatron-Core's and torchtitan's own code on CPU against ``graph.EAGER_PASSES``.

Every ATen op the code dispatches, forward and backward, reads its tensor inputs and writes its
outputs once; views move nothing. Eager PyTorch on a GPU launches one kernel per such op, so the
sum is the HBM traffic of the unfused code (the fused kernels it replaces read and write once).
The RoPE case has many heads per position, so its cos and sin tables (one row per position) are a
small share, as in training.
"""

import pytest

from nestplan.graph import E, EAGER_PASSES, UNFUSED_GATED_PASSES

pytestmark = pytest.mark.frameworks


def traffic(skip=frozenset()):
    """A dispatch mode that counts the bytes read and written by the non-view ATen ops run under
    it but those in ``skip`` (torch is imported here, by these tests only, not by every worker
    that collects them)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    aten = torch.ops.aten
    SHAPE_ONLY = {aten.new_zeros.default, aten.new_empty.default, aten.zeros_like.default,
                  aten.ones_like.default, aten.empty_like.default}

    class Traffic(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not func.is_view and func is not torch.ops.aten.detach.default \
                    and func not in skip:
                # (an op that takes only a shape and dtype from its input reads none of it)
                read = () if func in SHAPE_ONLY else (args, kwargs)
                tensors = [t for t in tree_leaves((read, out)) if isinstance(t, torch.Tensor)]
                self.bytes += sum(t.numel() * t.element_size() for t in tensors)
            return out

    return Traffic()


def passes(fn, x) -> tuple[float, float]:
    """Forward and backward bytes of ``fn(x)`` in bf16 elements of ``x`` (a fresh leaf: a
    second backward into it would add a gradient accumulation)."""
    import torch

    with traffic() as fwd:
        y = fn(x)
    grad = torch.ones_like(y)
    with traffic() as bwd:
        y.backward(grad)
    return fwd.bytes / (E * x.numel()), bwd.bytes / (E * x.numel())


def bf16(*shape):
    torch = pytest.importorskip("torch")
    return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)


def rand(*shape, dtype=None):
    torch = pytest.importorskip("torch")
    return torch.rand(*shape, dtype=dtype)


def test_unfused_scaled_rope_moves_what_the_graph_says():
    pytest.importorskip("megatron.core")
    from megatron.core.models.common.embeddings import rope_utils

    seq, batch, heads, dim = 64, 4, 32, 64
    freqs = rand(seq, 1, 1, dim)
    # GPT-OSS's YaRN scale, 0.1·ln 32 + 1 = 1.347 (any scale other than 1 takes this path)
    got = passes(lambda t: rope_utils._apply_rotary_pos_emb_bshd(t, freqs, mscale=1.35),
                 bf16(seq, batch, heads, dim))
    assert got == pytest.approx(EAGER_PASSES["megatron"]["scaled_rope"], rel=0.10)


def test_glu_clamp_moves_what_the_graph_says():
    """The clamp's share: the activation with a clamp limit less the same one without."""
    pytest.importorskip("megatron.core")
    from megatron.core.fusions.fused_bias_geglu import weighted_bias_quick_geglu_impl

    tokens, ffn = 512, 256
    probs = rand(tokens, 1)
    with_clamp, without = (
        passes(lambda y: weighted_bias_quick_geglu_impl(y, None, probs, False, 1.0, limit),
               bf16(tokens, 2 * ffn))
        for limit in (7.0, None))
    clamp = tuple(a - b for a, b in zip(with_clamp, without))
    assert clamp == pytest.approx(EAGER_PASSES["megatron"]["glu_clamp"], rel=0.10)


def test_expert_output_bias_moves_what_the_graph_says():
    """TEGroupedMLP adds fc2's bias per expert, scaled by the router's (bf16) probabilities."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.moe.experts import TEGroupedMLP

    experts, per_expert, hidden = 4, 128, 256
    biases = [bf16(hidden) for _ in range(experts)]
    probs = bf16(experts * per_expert, 1).detach()
    got = passes(lambda out: TEGroupedMLP._apply_bias(out, biases, [per_expert] * experts, probs),
                 bf16(experts * per_expert, hidden))
    assert got == pytest.approx(EAGER_PASSES["megatron"]["expert_bias"], rel=0.10)


def _torchtitan_gpt_oss():
    pytest.importorskip("torchtitan.models")
    from torchtitan.models.gpt_oss import moe

    return moe


def test_torchtitans_clamped_glu_moves_what_the_graph_says():
    """torchtitan's GPT-OSS activation (``swiglu``: strided halves, two clamps, the scaled sigmoid,
    a product, an addcmul) beyond the unfused gated activation the graph charges every eager
    torchtitan MLP, in passes over the fc1 output (twice the intermediate)."""
    moe = _torchtitan_gpt_oss()
    tokens, ffn = 512, 256
    fwd, bwd = passes(lambda h: moe.swiglu(h, limit=7.0), bf16(tokens, 2 * ffn))
    # passes() divides by the fc1 output's elements; the unfused activation's are over half of it
    extra = (fwd - UNFUSED_GATED_PASSES[0] / 2, bwd - UNFUSED_GATED_PASSES[1] / 2)
    assert extra == pytest.approx(EAGER_PASSES["torchtitan"]["glu_clamp"], rel=0.10)


def test_torchtitans_clamped_glu_keeps_what_the_graph_says():
    """What torchtitan's ``swiglu`` keeps for backward (saved_tensors_hooks, one entry per storage)
    is what the graph's clamp and activation keep on the eager torchtitan stack, per routed token
    of GPT-OSS's experts (a review found one intermediate of six missing)."""
    import torch

    from nestplan.catalog import get_model, get_stack
    from nestplan.evaluate import layer_graph
    from nestplan.specs import Parallelism, TrainingSpec

    moe = _torchtitan_gpt_oss()
    tokens, ffn = 512, 256
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        moe.swiglu(bf16(tokens, 2 * ffn), limit=7.0)
    measured = sum(kept.values()) / (E * tokens * ffn)
    model = get_model("gpt-oss-120b")
    tr = TrainingSpec(seq_len=4096, global_batch=8)
    layer = layer_graph(model, Parallelism(ep=8, dp=8, mbs=1), tr, get_stack("torchtitan")).moe
    ops = {o.name: o for o in layer.ops}
    routed = tr.seq_len * model.moe.top_k * tr.moe_load
    graph = (ops["expert_clamp"].saved + ops["expert_act"].saved) / (
        E * routed * model.moe.ffn_hidden)
    assert graph == pytest.approx(measured, rel=0.10)


def test_torchtitans_expert_biases_move_what_the_graph_says():
    """``GptOssGroupedExperts`` gathers fc1's and fc2's biases to every routed token and adds them
    (its own forward, run on CPU): everything it moves but its two grouped GEMMs and its
    activation is the graph's ``expert_bias`` passes over the fc1 and the fc2 outputs."""
    import torch

    moe = _torchtitan_gpt_oss()
    experts, hidden, ffn, tokens = 4, 512, 64, 1024
    module = moe.GptOssGroupedExperts(moe.GptOssGroupedExperts.Config(
        dim=hidden, hidden_dim=ffn, num_experts=experts)).to(torch.bfloat16)
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.02)
    counts = torch.full((experts,), tokens // experts)

    def moved(fn, x):
        """Elements moved forward and backward, the grouped GEMMs' aside."""
        skip = {torch.ops.aten._grouped_mm.default}
        with traffic(skip) as fwd:
            y = fn(x)
        grad = torch.ones_like(y)
        with traffic(skip) as bwd:
            y.backward(grad)
        return fwd.bytes / E, bwd.bytes / E

    total = moved(lambda t: module(t, counts), bf16(tokens, hidden))
    act = moved(lambda h: moe.swiglu(h, limit=7.0), bf16(tokens, 2 * ffn))
    biased = tokens * (2 * ffn + hidden)  # the fc1 and fc2 outputs
    got = tuple((t - a) / biased for t, a in zip(total, act))
    assert got == pytest.approx(EAGER_PASSES["torchtitan"]["expert_bias"], rel=0.10)
