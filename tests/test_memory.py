"""Memory formulas against their sources: Korthikanti et al. 2022, ZeRO, Megatron's distributed optimizer."""

from dataclasses import replace

import pytest

from nestplan import graph as G
from nestplan.catalog import get_model, get_stack
from nestplan.cost.memory import bytes_per_param, model_states
from nestplan.options import AttentionImpl, Precision
from nestplan.recompute import Policy, effect

SELECTIVE = Policy("selective", "modules:core_attn")


def _layer(model, tp, sp, mbs=1, seq=2048, attention=AttentionImpl.MATERIALIZED):
    return G.build(model, G.Local(tp, sp, 1, 1, tp, mbs, seq, Precision.BF16, attention)).dense


@pytest.mark.parametrize("name", ["gpt-22b", "gpt3-175b", "gpt-530b", "gpt-1t"])
@pytest.mark.parametrize("tp", [1, 2, 8])
def test_korthikanti_activation_formulas(name, tp):
    m = get_model(name)
    s, b, h, a = 2048, 4, m.hidden, m.heads
    plain = _layer(m, tp, sp=False, mbs=b)
    seqpar = _layer(m, tp, sp=True, mbs=b)
    # Table 2 of Korthikanti et al.: bytes per layer
    assert plain.saved_bytes == pytest.approx(s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp)))
    assert seqpar.saved_bytes == pytest.approx(s * b * h / tp * (34 + 5 * a * s / h))
    # selective recomputation drops the 5as/h term
    assert effect(SELECTIVE, seqpar).saved == pytest.approx(34 * s * b * h / tp)
    assert effect(SELECTIVE, plain).saved == pytest.approx(s * b * h * (10 + 24 / tp))
    # full recomputation keeps only the layer input
    assert plain.input_bytes == pytest.approx(2 * s * b * h)
    assert seqpar.input_bytes == pytest.approx(2 * s * b * h / tp)


def test_flash_attention_keeps_no_score_matrix():
    m = get_model("gpt-22b")
    flash = _layer(m, 8, True, mbs=4, attention=AttentionImpl.FLASH)
    s, b, h = 2048, 4, m.hidden
    # 34sbh/t plus the fp32 log-sum-exp per head and position
    lse = 4 * b * (m.heads / 8) * s
    assert flash.saved_bytes == pytest.approx(34 * s * b * h / 8 + lse)


def test_gqa_and_swiglu_generalise_the_count():
    m = get_model("llama3-70b")  # 64 heads, 8 kv heads, SwiGLU ffn 28672, no dropout
    s, b, h, f, t = 4096, 1, m.hidden, m.ffn_hidden, 8
    layer = _layer(m, t, True, mbs=b, seq=s, attention=AttentionImpl.FLASH)
    kv = 2 * h * m.kv_heads / m.heads  # K and V widths
    expected = s * b * (
        2 * h / t  # ln_attn input
        + 2 * h / t  # qkv input (sequence-parallel shard)
        + 2 * (h + kv) / t  # Q, K, V
        + 2 * h / t  # output projection input
        + 2 * h / t  # ln_mlp input
        + 2 * h / t  # fc1 input
        + 2 * 2 * f / t  # gate and up halves kept by SwiGLU
        + 2 * f / t  # fc2 input
    ) + 4 * b * (m.heads / t) * s
    assert layer.saved_bytes == pytest.approx(expected)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_zero_paper_bytes_per_parameter(n):
    # Rajbhandari et al. §3.1 with K = 12 and 2-byte gradients: 16, 4+12/N, 2+14/N, 16/N
    total = {z: sum(bytes_per_param(z, n, get_stack("nemo"))) for z in range(4)}
    assert total[0] == pytest.approx(16)
    assert total[1] == pytest.approx(4 + 12 / n)
    assert total[2] == pytest.approx(2 + 14 / n)
    assert total[3] == pytest.approx(16 / n)


@pytest.mark.parametrize("d", [1, 4, 32])
def test_megatron_distributed_optimizer_formula(d):
    # Megatron-LM docs/distrib_optimizer.md, bf16 params with fp32 grads: 18 vs 6 + 12/d
    assert sum(bytes_per_param(0, d, get_stack("megatron-core"))) == pytest.approx(18)
    assert sum(bytes_per_param(1, d, get_stack("megatron-core"))) == pytest.approx(6 + 12 / d)


@pytest.mark.parametrize("stack", ["torchtitan", "composer", "composer-pure"])
@pytest.mark.parametrize("n", [1, 8, 64])
def test_fsdp_keeps_whole_compute_copies_without_resharding(stack, n):
    """FSDP's parameters are the fp32 master, sharded; without resharding after forward (ZeRO-2:
    SHARD_GRAD_OP, FSDP2's reshard_after_forward false) their bf16 copies stay whole from the
    forward to the backward: 4/n + 2 bytes, not the 4 whole bytes counted until a user trial
    (Llama-3 70B at TP 2 on torchtitan: 131 GiB of weights); ZeRO-3 gathers them a unit at a
    time (the transient), ZeRO-0 keeps fp32 whole."""
    st = get_stack(stack)
    assert st.master_bytes == 0 and st.weight_bytes == 4
    assert bytes_per_param(2, n, st)[0] == pytest.approx(4 / n + 2)
    assert bytes_per_param(3, n, st)[0] == pytest.approx(4 / n)
    assert bytes_per_param(0, n, st)[0] == pytest.approx(4)
    # under a pipeline that defers the reduction, PyTorch's schedules leave ZeRO-3's weights
    # gathered after each backward too (a user trial read torch's stage.py): as ZeRO-2's
    deferring = replace(st, pipeline_defers_grad_sync=True)
    assert bytes_per_param(3, n, deferring, pp=2)[0] == pytest.approx(4 / n + 2)


def test_expert_states_shard_over_expert_data_parallel():
    w, g, o = model_states(0.0, 1e9, zero=1, dp=64, edp=8, stack=get_stack("megatron-core"))
    assert (w, g, o) == (pytest.approx(2e9), pytest.approx(4e9), pytest.approx(12e9 / 8))


@pytest.mark.parametrize("tp", [1, 8])
def test_qk_norms_keep_their_inputs_and_leave_the_checkpoint_nothing_to_pin(tp):
    """Qwen3's QK norms each keep their input (bf16 queries and keys, fused norms), and those
    inputs are the q and k parts of the fused QKV output: a checkpointed attention core then pins
    nothing beyond them, so selective keeps only the log-sum-exp less than none (without the
    norms it keeps the QKV output's q and k parts more). Where a rank holds several query groups
    (tp 1 of Llama 3 8B's 8), Megatron gathers the queries into a copy for their norm, which the
    norm keeps too (SelfAttention.get_query_key_value_tensors); with one group (tp 8) the queries
    stay a view."""
    from dataclasses import replace

    from nestplan.options import AttentionImpl as A

    plain = get_model("llama3-8b")
    normed = replace(plain, qk_norm=True)
    seq = 2048
    layers = {m.qk_norm: _layer(m, tp, False, seq=seq, attention=A.FLASH) for m in (plain, normed)}
    q = 2 * seq * plain.heads // tp * plain.head_dim  # bytes of a rank's queries, bf16
    k = 2 * seq * plain.kv_heads // tp * plain.head_dim
    copy = q if tp == 1 else 0
    none = {n: effect(Policy("none", "none"), g).saved for n, g in layers.items()}
    sel = {n: effect(SELECTIVE, g).saved for n, g in layers.items()}
    assert none[True] - none[False] == pytest.approx(q + k + copy)
    lse = 4 * seq * plain.heads // tp  # fp32 per query and head
    assert sel[True] - none[True] == pytest.approx(-lse)
    assert sel[False] - none[False] == pytest.approx(q + k - lse)
    assert [o.name for o in layers[True].ops].count("qk_norm") == 1


TOKENS = 4096
"""Tokens of the one-sequence micro-batch the graphs below are built for (tp = ep = 1)."""


def _graph(model: str, stack: str):
    """``model``'s layer graph under ``stack``: one micro-batch of ``TOKENS`` on one device."""
    from nestplan.evaluate import layer_graph
    from nestplan.specs import Parallelism, TrainingSpec

    return layer_graph(get_model(model), Parallelism(mbs=1),
                       TrainingSpec(seq_len=TOKENS, global_batch=8), get_stack(stack))


@pytest.mark.parametrize("stack, kept_bytes", [("megatron-core", 0), ("torchtitan", 4),
                                               ("torchtitan-compile", 4)])
def test_the_expert_combine_keeps_what_its_stack_weights_there(stack, kept_bytes):
    """Megatron-Core's fused SwiGLU weights the experts' outputs by their scores inside the
    activation, so its combine keeps nothing; torchtitan weights them in its combine in fp32,
    with the activation fused by torch.compile too (``scores_in_activation = false``).
    ``kept_bytes``: per element of the routed token copies' outputs."""
    model = get_model("qwen3-30b-a3b")
    unpermute = next(o for o in _graph("qwen3-30b-a3b", stack).moe.ops if o.name == "unpermute")
    routed = TOKENS * model.moe.top_k  # token copies sent to experts (one device: all of them)
    assert unpermute.saved == kept_bytes * routed * model.hidden


@pytest.mark.parametrize("stack, bytes_per_element", [("megatron-core", 2), ("torchtitan", 8),
                                                      ("deepspeed", 8)])
def test_mla_norms_keep_what_the_stacks_norms_keep(stack, bytes_per_element):
    """MLA's q and kv norms are the stack's norms: a fused kernel keeps its bf16 input (2 bytes
    an element), an eager RMSNorm also its fp32 copy and bf16 output (8; measured on torchtitan's
    DeepSeek-V3 block, tests/test_framework_memory.py)."""
    ops = {o.name: o for o in _graph("deepseek-v3", stack).dense.ops}
    la = get_model("deepseek-v3").mla
    assert ops["q_norm"].saved == bytes_per_element * TOKENS * la.q_lora_rank
    assert ops["kv_norm"].saved == bytes_per_element * TOKENS * la.kv_lora_rank


def test_fp8_weights_are_counted_as_the_stack_keeps_them():
    """fp8 on Megatron-Core: with the distributed optimizer the blocks' weights are fp8 tensors
    (row- and column-wise data, the bf16 weight's 2 bytes; the export asks for
    --fp8-param-gather); without it the bf16 weights stay and Transformer Engine's cached fp8
    copies, 2 bytes per block weight, come on top (a user trial: an fp8 plan's weights had been
    a bf16 one's). torchtitan (torchao) caches no copy; bf16 keeps none."""
    from nestplan import planfile
    from nestplan.cost.device import config_costs
    from nestplan.evaluate import evaluate, scenario_from_names
    from nestplan.exports import export
    from nestplan.specs import Parallelism

    def weights(precision, zero, stack="megatron-core"):
        sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=2048, global_batch=8,
                                 precision=precision, stack=stack)
        par = Parallelism(tp=1, pp=1, dp=8, zero=zero, mbs=1)
        ev = evaluate(sc, par)
        return ev.stages[0].memory.weights, ev

    bf16_0, _ = weights(Precision.BF16, 0)
    fp8_0, ev = weights(Precision.FP8, 0)
    cc = config_costs(ev.scenario, ev.plan)
    block_params = get_model("llama3-8b").layers * cc.dense.params
    assert fp8_0 - bf16_0 == pytest.approx(2 * block_params)
    assert weights(Precision.FP8, 1)[0] == pytest.approx(weights(Precision.BF16, 1)[0])
    titan = weights(Precision.FP8, 3, "torchtitan")[0]
    assert titan == pytest.approx(weights(Precision.BF16, 3, "torchtitan")[0])
    # the export runs what was counted
    for zero, flag in ((1, True), (0, False)):
        _, ev = weights(Precision.FP8, zero)
        text = export(planfile.from_dict(planfile.to_dict(ev)), "megatron").text
        assert ("--fp8-param-gather" in text) is flag, zero
    _, ev = weights(Precision.BF16, 1)
    assert "--fp8-param-gather" not in export(planfile.from_dict(planfile.to_dict(ev)),
                                              "megatron").text
    # a torchtitan plan goes to Megatron as megatron-core runs it, which its headline predicts
    # (a reviewer: the flag had followed the torchtitan stack, which has no fp8 weights)
    _, ev = weights(Precision.FP8, 3, "torchtitan")
    assert "--fp8-param-gather" in export(planfile.from_dict(planfile.to_dict(ev)),
                                          "megatron").text


def test_fp8_weight_copies_follow_each_stages_blocks_and_the_mtp_depths():
    """DeepSeek-V3 in fp8 at ZeRO-0 over a four-stage pipeline with EP 8: each stage's weights
    gain 2 bytes for every weight of its blocks, dense and expert, and the last stage for its
    multi-token-prediction depth's block and projection too (a reviewer: the depths had been
    left out, then their projection); the embedding and the output layer gain none."""
    from nestplan.cost.device import config_costs
    from nestplan.evaluate import evaluate, scenario_from_names
    from nestplan.specs import Parallelism

    par = Parallelism(tp=1, pp=4, dp=16, ep=8, etp=1, zero=0, mbs=1)
    evs = {}
    for precision in (Precision.BF16, Precision.FP8):
        sc = scenario_from_names("deepseek-v3", "dgx-h100-ndr", 64, seq_len=4096,
                                 global_batch=64, precision=precision)
        evs[precision] = evaluate(sc, par)
    cc = config_costs(evs[Precision.FP8].scenario, par)
    dense_layers = evs[Precision.FP8].scenario.model.moe.first_dense_layers
    # one MoE depth, and its eh_proj (2h x h, a Transformer Engine linear too) and three norms
    h = evs[Precision.FP8].scenario.model.hidden
    assert cc.head.block_params == pytest.approx(cc.moe.block_params + 2 * h * h + 3 * h)
    assert cc.embedding.block_params == 0
    for bf16, fp8 in zip(evs[Precision.BF16].stages, evs[Precision.FP8].stages):
        blocks = [i for first, last in fp8.blocks for i in range(first, last)]
        dense = sum(i < dense_layers for i in blocks)
        expected = dense * cc.dense.block_params + (len(blocks) - dense) * cc.moe.block_params
        if fp8.has_head:
            expected += cc.head.block_params
        assert fp8.memory.weights - bf16.memory.weights == pytest.approx(2 * expected)


CHUNKED_LOSS_PROBE = r"""
import gc, json, torch
from torch import nn
from torchtitan.components.loss import ChunkedLossWrapper
B, L, D, V = 1, 256, 64, 1000
torch.manual_seed(0)
head = nn.Linear(D, V, bias=False).to(torch.bfloat16)
pre = nn.Linear(D, D, bias=False).to(torch.bfloat16)
loss_fn = ChunkedLossWrapper.Config(num_chunks=8).build()
loss_fn.set_lm_head(head)
labels = torch.randint(0, V, (B, L))
h = pre(torch.randn(B, L, D, dtype=torch.bfloat16))  # the decoder's output
saved = []
before = {id(o) for o in gc.get_objects() if torch.is_tensor(o)}
with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
    loss = loss_fn(h, labels)[0]
del saved  # (the hooks' own references)
gc.collect()
held = [t for t in gc.get_objects() if torch.is_tensor(t) and id(t) not in before
        and t is not loss]
print(json.dumps([[list(t.shape), str(t.dtype), t.numel() * t.element_size()] for t in held]))
"""


@pytest.mark.frameworks
def test_a_chunked_loss_keeps_the_hidden_states_gradient_not_the_logits():
    """torchtitan 0.3's ChunkedLossWrapper (every Llama 3 config's loss), run on CPU: between the
    loss and the decoder's backward it holds one bf16 tensor of the hidden states' shape (their
    accumulated gradient) and nothing of the logits' (256 x 1000 here). The torchtitan stack
    (``loss_chunks`` 8) keeps that instead of the logits, which torchtitan-2024, whose loss ran
    over the whole logits, keeps in fp32 (a user trial: 8B at 8K on 64 H100, 79.8 GiB predicted,
    about 9 GiB of it logits the run does not hold)."""
    import json
    import subprocess
    import sys

    pytest.importorskip("torchtitan.components.loss")
    p = subprocess.run([sys.executable, "-c", CHUNKED_LOSS_PROBE], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    held = json.loads(p.stdout.strip().splitlines()[-1])
    assert held == [[[1, 256, 64], "torch.bfloat16", 2 * 256 * 64]]
    model = replace(get_model("llama3-8b"), vocab=1000, hidden=64, heads=4, kv_heads=2,
                    head_dim=16, ffn_hidden=128)
    loc = G.Local(1, False, 1, 1, 1, 1, 256, Precision.BF16, AttentionImpl.FLASH)
    kept = {}
    for name in ("torchtitan", "torchtitan-2024"):
        st = get_stack(name)
        head = G.build(model, replace(loc, loss_saved_bytes=st.loss_saved_bytes,
                                      loss_chunks=st.loss_chunks)).head
        # the output layer's and the loss's (the final norm keeps its own either way)
        kept[name] = sum(o.saved for o in head.ops if o.name in ("lm_head", "cross_entropy"))
    assert kept["torchtitan"] == 2 * 256 * 64  # the measured tensor
    assert kept["torchtitan-2024"] == 2 * 256 * 64 + 4 * 256 * G.padded_vocab(1000, 1)  # fp32 logits


def test_flex_attention_under_cp_keeps_the_gathered_kv_and_gathers_once():
    """torchtitan 0.3's FlexAttention under context parallelism gathers K/V before the attention,
    which keeps the gathered ones for its backward, and reduce-scatters dK/dV after it
    (``cp_exchange = "flex_allgather"``: apply_cp_to_forward and torch's flex_cp_allgather); 2024's
    SDPA rotater (torchtitan-2024) keeps the local shard and gathers again in the backward."""
    model = get_model("llama3-8b")
    cp, seq = 4, 8192
    graphs = {}
    for name in ("torchtitan", "torchtitan-2024"):
        st = get_stack(name)
        ex = st.cp_exchange_for(model)
        loc = G.Local(1, False, cp, 1, 1, 1, seq, Precision.BF16, AttentionImpl.FLASH,
                      cp_allgather=True, cp_gather_kept=ex == "flex_allgather")
        graphs[name] = G.build(model, loc).dense
    kv = 2 * (seq // cp) * model.kv_heads * model.head_dim * 2  # a rank's K and V, bf16
    core = {n: next(o for o in g.ops if o.name == "attn_core").saved for n, g in graphs.items()}
    assert core["torchtitan"] - core["torchtitan-2024"] == (cp - 1) * kv
    comms = {n: sorted((c.name, c.phase) for c in g.comms if c.axis.value == "cp")
             for n, g in graphs.items()}
    assert comms["torchtitan"] == [("cp_dkv_bwd", "bwd"), ("cp_kv_ag", "fwd")]
    assert ("cp_kv_ag_bwd", "bwd") in comms["torchtitan-2024"]


def test_a_chunked_loss_under_fsdp_holds_the_output_layers_gradient_whole():
    """The chunked loss turns the output layer's gradient reduction off until its last chunk, so
    FSDP2 holds that gradient unsharded in fp32 beside each chunk's bf16 one through the loop (a
    review, measured with FSDP2 on one CPU rank): the head device's loss bytes grow by 6 bytes a
    weight of the output layer under ZeRO-2/3 without a pipeline, not under DDP (ZeRO-0) nor
    where a pipeline defers the reduction anyway (its gradients are whole already)."""
    from nestplan.cost.device import config_costs
    from nestplan.evaluate import scenario_from_names
    from nestplan.specs import Parallelism

    sc = scenario_from_names("llama3-8b", "dgx-h100-ndr", 8, seq_len=8192, global_batch=16,
                             stack="torchtitan")
    m = sc.model
    weights = G.padded_vocab(m.vocab, 1) * m.hidden

    def loss_bytes(**plan):
        return config_costs(sc, Parallelism(mbs=1, recompute=("none",), **plan)).logits_bytes

    assert loss_bytes(dp=8, zero=2) - loss_bytes(dp=8, zero=0) == pytest.approx(6 * weights)
    assert loss_bytes(dp=4, pp=2, zero=2) == pytest.approx(loss_bytes(dp=4, pp=2, zero=0))
