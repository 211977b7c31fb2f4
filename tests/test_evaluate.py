"""Evaluating plans: the JSON contract, breakdowns that add up, memory feasibility."""

import dataclasses
from dataclasses import replace

import pytest

from nestplan.evaluate import evaluate, evaluate_names, scenario_from_names
from nestplan.axes import Axis
from nestplan.specs import Parallelism

CONTRACT = ["step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu",
            "peak_memory_gib", "fits", "tp", "pp", "dp", "cp", "ep", "vp", "sp", "zero",
            "recompute", "mbs"]


def gpt3(**kw):
    plan = dict(tp=8, pp=8, mbs=1, recompute="full")
    plan.update(kw)
    return evaluate_names("gpt3-175b", "selene-a100-hdr", 1024, global_batch=1536, seq_len=2048,
                          **plan)


def test_json_contract():
    js = gpt3().to_json()
    for key in CONTRACT:
        assert key in js, key
    assert js["tp"] * js["pp"] * js["dp"] * js["cp"] == 1024
    assert js["fits"] is True and js["why_not"] is None
    assert js["tokens_per_s"] == pytest.approx(1536 * 2048 / js["step_time_s"])


def test_breakdown_adds_up_to_step_time():
    for ev in (gpt3(), gpt3(vp=2, sp=True, recompute="selective", zero=1),
               evaluate_names("mixtral-8x7b", "dgx-h100-ndr", 64, global_batch=256, seq_len=4096,
                              tp=2, pp=4, ep=4, sp=True, mbs=1, recompute="full")):
        assert ev.time.total == pytest.approx(ev.step_time, rel=1e-9)
        assert all(v >= -1e-12 for v in vars(ev.time).values())


def test_chunk_times_add_up_to_the_stage_time():
    per_stage = ("full",) + ("none",) * 6 + ("selective",)
    for ev in (gpt3(vp=3, zero=3, recompute=per_stage),
               evaluate_names("mixtral-8x7b", "dgx-h100-ndr", 64, global_batch=256, seq_len=4096,
                              tp=2, pp=4, vp=2, ep=4, sp=True, mbs=1, zero=2)):
        assert ev.scenario.stack.overlap_p2p  # no steady-state send/recv in the stage time
        for st in ev.stages:
            assert len(st.chunk_fwd) == len(st.chunk_bwd) == ev.plan.vp
            assert all(f > 0 and b > f for f, b in zip(st.chunk_fwd, st.chunk_bwd))
            assert sum(st.chunk_fwd) + sum(st.chunk_bwd) == pytest.approx(
                st.time_per_microbatch, rel=1e-12)
        # the send to the next stage is the p2p part of the pipeline's fill
        assert all(st.send > 0 for st in ev.stages)


def test_recompute_trades_memory_for_time():
    sc = scenario_from_names("gpt3-175b", "selene-a100-hdr", 1024, seq_len=2048,
                             global_batch=1536, stack="megatron-2022")
    none, sel, full = (evaluate(sc, Parallelism(tp=8, pp=16, dp=8, sp=True, recompute=(r,)))
                       for r in ("none", "selective", "full"))
    assert none.step_time < sel.step_time < full.step_time
    assert none.peak_memory > sel.peak_memory > full.peak_memory


def test_selective_recompute_saves_little_with_flash_attention():
    """A flash core keeps q, k, v (the checkpoint's inputs) and its fp32 log-sum-exp: selective
    recomputation drops only the latter."""
    none = gpt3(tp=8, pp=16, recompute="none", sp=True)
    sel = gpt3(tp=8, pp=16, recompute="selective", sp=True)
    assert sel.peak_memory < none.peak_memory
    assert sel.peak_memory == pytest.approx(none.peak_memory, rel=1e-3)
    assert sel.step_time > none.step_time


def test_zero_shards_model_states():
    states = [gpt3(zero=z).stages[0].memory for z in range(4)]
    assert states[1].optimizer == pytest.approx(states[0].optimizer / 16)
    assert states[2].gradients == pytest.approx(states[0].gradients / 16)
    assert states[3].weights == pytest.approx(states[0].weights / 16)


def test_plan_that_does_not_fit_says_why():
    ev = evaluate_names("llama3-70b", "dgx-h100-ndr", 64, global_batch=64, seq_len=8192, tp=8,
                        pp=1, mbs=1)
    js = ev.to_json()
    assert js["fits"] is False
    assert "short by" in js["why_not"] and "optimizer" in js["why_not"]


def test_first_stage_holds_most_activations_in_1f1b():
    ev = gpt3(tp=8, pp=8, recompute="none", sp=True)
    acts = [s.memory.activations for s in ev.stages]
    assert acts[0] > acts[3] > acts[6]


def test_per_stage_recompute():
    sc = scenario_from_names("gpt3-175b", "selene-a100-hdr", 512, seq_len=2048, global_batch=512)
    mixed = ("full",) * 4 + ("none",) * 4
    ev = evaluate(sc, Parallelism(tp=8, pp=8, dp=8, sp=True, recompute=mixed))
    assert [s.recompute for s in ev.stages] == ["full"] * 4 + ["none"] * 4


def test_more_data_parallelism_more_throughput():
    small = evaluate_names("llama3-8b", "dgx-h100-ndr", 64, global_batch=512, seq_len=8192, tp=1,
                           pp=1, mbs=1, zero=1)
    big = evaluate_names("llama3-8b", "dgx-h100-ndr", 128, global_batch=512, seq_len=8192, tp=1,
                         pp=1, mbs=1, zero=1)
    assert 1.7 < big.tokens_per_s / small.tokens_per_s <= 2.0


def test_oversubscription_costs_cross_pod_data_parallelism():
    """Llama 3's order [TP, CP, PP, DP] puts data parallelism outermost, across pods: with 8
    replicas over 4,096 GPUs, 6 in one 3,072-GPU pod and 2 in the next, the 2 carry the ring
    over the 1:7 aggregation layer, which costs about three times a non-blocking one. (With 64
    replicas over 8,192 GPUs at least 16 share each pod's uplinks and the 1:7 layer is not the
    bottleneck: a ring crosses it only twice per pod.)"""
    base = dict(global_batch=2048, seq_len=8192, tp=8, pp=64, mbs=1, zero=1, sp=True,
                rank_order=(Axis.TP, Axis.CP, Axis.PP, Axis.DP))
    clos = evaluate_names("llama3-405b", "meta-h100-roce-7to1", 4096, **base)
    sc = scenario_from_names("llama3-405b", "meta-h100-roce-7to1", 4096, seq_len=8192,
                             global_batch=2048)
    flat_net = dataclasses.replace(sc.cluster, levels=tuple(
        dataclasses.replace(lv, oversubscription=1.0) for lv in sc.cluster.levels))
    full = evaluate(dataclasses.replace(sc, cluster=flat_net), clos.plan)
    assert clos.step_time > full.step_time
    assert clos.link_time["dp"] > 2 * full.link_time["dp"]


def test_mfu_uses_model_flops():
    ev = gpt3()
    # Megatron model FLOPs: 72·B·s·L·h²·(1 + s/6h + V/12Lh) with the padded vocabulary
    B, s, L, h, V = 1536, 2048, 96, 12288, 51200
    f = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    assert ev.model_flops == pytest.approx(f, rel=0.01)
    assert ev.mfu == pytest.approx(f / ev.step_time / 1024 / 312e12, rel=0.01)


def test_megatron_lm_counts_causal_attention_at_half():
    """What Megatron-LM logs since 8873b55d6a (a user trial: MFU had been said to count as it
    does): num_floating_point_operations (megatron/training/training.py @ d98e8a64dd) per token
    of a GQA SwiGLU model, 3 passes of 2 FLOP per multiply-add, is
    L·(6h(h + 2h·g/n) + 6h·h + 6h·s + 18h·f) + 6h·V, the core attention (6h·s) at half the
    unmasked 12h·s. Llama 3 70B at 128K tokens: 932.4 GFLOP per token; ours with the
    attention unmasked is 1,448."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 512, seq_len=131072, global_batch=64)
    ev = evaluate(sc, Parallelism(tp=8, pp=4, cp=16, sp=True, zero=1, recompute=("full",)))
    L, h, n, g, f, V, s = 80, 8192, 64, 8, 28672, 128256, 131072
    megatron = L * (6 * h * (h + 2 * h * g / n) + 6 * h * h + 6 * h * s + 18 * h * f) + 6 * h * V
    tokens = 64 * s
    assert ev.logged_model_flops / tokens == pytest.approx(megatron, rel=1e-3)
    assert ev.logged_tflops_per_gpu == pytest.approx(
        megatron * tokens / ev.step_time / 512 / 1e12, rel=1e-3)
    assert ev.model_flops / tokens == pytest.approx(megatron + L * 6 * h * s, rel=1e-3)
    # a bidirectional model's are its model FLOP; a packed document span, which the export masks
    # per document (--dataloader-inter-document-masking), counts each document's attention as
    # Megatron counts THD sub-sequences, by the sum of their squared lengths: B·(s/d)·d² = B·s·d,
    # the core term 6h·s a token becoming 6h·d (a review: it had been counted whole)
    bert = evaluate_names("bert-large", "dgx-h100-ndr", 8, seq_len=512, global_batch=64, tp=1)
    assert bert.logged_model_flops == bert.model_flops
    d = 8192
    docs = evaluate(replace(sc, training=replace(sc.training, attention_span=d)), ev.plan)
    assert docs.logged_model_flops / tokens == pytest.approx(
        megatron - L * 6 * h * s + L * 6 * h * d, rel=1e-3)
    assert docs.logged_model_flops < docs.model_flops  # (the causal half, as above)
    # Megatron counts an MTP depth's attention as a layer's (num_layers + mtp_num_layers), at
    # half too: DeepSeek-V3's 61 layers and one depth halve 62 layers' attention (a review's)
    from nestplan.catalog import get_model
    from nestplan.evaluate import logged_flops_per_sequence, model_flops_per_sequence

    v3 = get_model("deepseek-v3")
    assert v3.mtp_layers == 1

    def halved(m):
        return model_flops_per_sequence(m, 4096, 0) - logged_flops_per_sequence(m, 4096)

    assert halved(v3) / halved(replace(v3, mtp_layers=0)) == pytest.approx(62 / 61, rel=1e-9)
    # Megatron counts a gated MLP as gated under --swiglu only (gated_linear_multiplier); the
    # export gives GeLU-gated ones (GPT-OSS's clamped GLU too) --quick-geglu, counted as two
    # matrices (a user trial: the note was 27 % above Megatron's log for GPT-OSS)
    from nestplan.options import MLPKind

    oss = get_model("gpt-oss-120b")
    two = replace(oss, mlp=MLPKind.GELU, glu_clamp=0.0)
    assert logged_flops_per_sequence(oss, 4096) == logged_flops_per_sequence(two, 4096)
    llama = get_model("llama3-8b")
    assert logged_flops_per_sequence(llama, 4096) > logged_flops_per_sequence(
        replace(llama, mlp=MLPKind.GELU), 4096)


def test_every_cache_has_one_reset():
    """Memo caches are made through ``caching.cached`` (none with functools directly), and
    ``caching.clear`` empties all of them; results are the same afterwards."""
    import re
    from pathlib import Path

    import nestplan
    from nestplan import caching
    from nestplan.evaluate import evaluate_names

    src = Path(nestplan.__file__).parent
    direct = [str(p.relative_to(src)) for p in src.rglob("*.py") if p.name != "caching.py"
              and re.search(r"\blru_cache\b|^@cache\b|functools import .*\bcache\b",
                            p.read_text(), re.M)]
    assert not direct, direct
    kw = dict(seq_len=2048, global_batch=16, tp=2, pp=2, mbs=1)
    before = evaluate_names("llama3-8b", "dgx-h100-ndr", 16, **kw).step_time
    assert sum(c.cache_info().currsize for c in caching._CACHES) > 0  # the run cached
    caching.clear()
    assert all(c.cache_info().currsize == 0 for c in caching._CACHES)
    assert evaluate_names("llama3-8b", "dgx-h100-ndr", 16, **kw).step_time == before


def test_full_recomputation_runs_the_forward_collectives_again_not_the_backward():
    """On the links, full recomputation adds the forward's collectives once more: at most half
    of what forward and backward move (the backward moves at least as much), never all of it."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 512, seq_len=4096, global_batch=512)
    plan = Parallelism(tp=8, pp=8, dp=8, sp=True, zero=1, mbs=1)
    none = evaluate(sc, plan.with_(recompute=("none",))).link_time["tp"]
    full = evaluate(sc, plan.with_(recompute=("full",))).link_time["tp"]
    assert 1.2 * none < full <= 1.5 * none


def test_recomputed_modules_run_their_forward_collectives_again_on_the_links():
    """Recomputing the MoE module sends its tokens to their experts and back once more, forward
    only (dispatch and combine: half of what the layer's exchange moves); recomputing the
    attention core alone moves nothing again."""
    from dataclasses import replace

    from nestplan.recompute import Policy

    sc = scenario_from_names("mixtral-8x7b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=256)
    stack = replace(sc.stack, recompute=sc.stack.recompute + (Policy("moe", "modules:moe"),))
    sc = replace(sc, stack=stack)
    plan = Parallelism(tp=1, pp=1, dp=64, ep=8, zero=1, mbs=1)
    ep = {p: evaluate(sc, plan.with_(recompute=(p,))).link_time["ep"]
          for p in ("none", "selective", "moe")}
    assert ep["selective"] == ep["none"]
    assert ep["moe"] == pytest.approx(1.5 * ep["none"])


def test_exposed_dp_time_never_exceeds_the_dp_time_on_the_links():
    """Both are the same device's: the latest to end (the first stage, with the embedding's
    gradients), not an average over the stages; with DP across a 16:1 spine."""
    from nestplan.catalog import get_accelerator
    from nestplan.loaders import cluster_from_table

    spine = cluster_from_table({"name": "os16", "accelerator": "h100-sxm-80gb", "levels": [
        {"name": "nvlink", "size": 8, "bandwidth_GBps": 450, "latency_us": 3},
        {"name": "leaf", "size": 16, "bandwidth_GBps": 50, "latency_us": 5},
        {"name": "spine", "bandwidth_GBps": 50, "latency_us": 10, "oversubscription": 16}]},
        get_accelerator)
    sc = dataclasses.replace(scenario_from_names("llama3-70b", "dgx-h100-ndr", 512,
                                                 seq_len=4096, global_batch=256), cluster=spine)
    for policy in ("none", "full"):
        ev = evaluate(sc, Parallelism(tp=8, pp=16, dp=4, sp=True, zero=1, mbs=1,
                                      recompute=(policy,),
                                      rank_order=(Axis.TP, Axis.CP, Axis.PP, Axis.DP)))
        latest = max(ev.stages, key=lambda st: st.end)
        assert latest.index == 0
        assert 0 < ev.time.dp <= ev.link_time["dp"]


def test_a_learned_position_table_grows_to_the_sequence():
    """A learned-position model trained beyond its table (GPT-3's 2,048 rows at 4,096 tokens)
    is costed with a table of the sequence's length, the model the Megatron export describes
    (--max-position-embeddings): as the same model given that table."""
    from dataclasses import replace

    from nestplan import planfile
    from nestplan.exports import export
    from nestplan.specs import Parallelism

    sc = scenario_from_names("gpt3-175b", "dgx-h100-ndr", 64, seq_len=4096, global_batch=64)
    par = Parallelism(tp=8, pp=8, dp=1, sp=True, zero=1, mbs=1, recompute=("full",))
    grown = replace(sc, model=replace(sc.model, max_positions=4096))
    ev, same = evaluate(sc, par), evaluate(grown, par)
    assert (ev.step_time, ev.peak_memory) == (same.step_time, same.peak_memory)
    from nestplan.evaluate import layer_graph

    def table(seq_len):
        return layer_graph(sc.model, par, replace(sc.training, seq_len=seq_len),
                           sc.stack).embedding.params

    assert table(4096) - table(2048) == 2048 * sc.model.hidden  # (not split over TP)
    text = export(planfile.from_dict(planfile.to_dict(ev)), "megatron").text
    assert "--max-position-embeddings 4096" in text


def test_the_pipelines_link_time_counts_each_send_once():
    """A device's pipeline link time is its micro-batches' sends, an activation and a gradient
    per chunk over the busiest boundary; the fill and drain are among them (a user trial: Llama 3
    70B at pp 4, vp 8 and 8 micro-batches had been counted 190 transfers for 128, 48 % over)."""
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=4096, global_batch=64)
    ev = evaluate(sc, Parallelism(tp=8, pp=4, dp=8, vp=5, sp=True, zero=1, mbs=1,
                                  recompute=("full",)))
    busiest = max(s.send for s in ev.stages)
    assert busiest > 0
    assert ev.link_time["pp"] == pytest.approx(ev.micro_batches * 2 * 5 * busiest)


def test_the_breakdown_names_the_stages_its_parts_are_of():
    """The step's parts are the slowest stage's per micro-batch and, for dp, embedding and the
    optimizer, the stage whose step ends last: text, JSON and the sweep's columns name both (a
    datacenter trial's data-parallel time fell from 1:1 to 4:1 oversubscription because the stage
    had changed, unnamed); the pipeline's link time is its busiest boundary's."""
    from nestplan.textfmt import evaluation as evaluation_text

    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 512, seq_len=4096, global_batch=1024)
    ev = evaluate(sc, Parallelism(tp=8, pp=4, dp=16, vp=5, sp=True, zero=1, mbs=1))
    k, j = ev.slowest_stage, ev.last_stage
    per_mb = [s.time_per_microbatch for s in ev.stages]
    ends = [s.end for s in ev.stages]
    assert (k, j) == (3, 0)
    assert per_mb[3] > max(per_mb[:3])  # the head's stage is slowest per micro-batch
    assert ends[0] > max(ends[1:])  # the embedding's copy ends the step last
    js = ev.to_json()
    assert (js["slowest_stage"], js["last_stage"]) == (3, 0)
    text = evaluation_text(ev)
    assert ("time per step (exposed; stage 3's, the slowest per micro-batch, but dp, embedding "
            "and optimizer: stage 0's, whose step ends last):") in text
    assert "; pp over its busiest boundary" in text
    one = evaluate(sc, Parallelism(tp=8, pp=1, dp=64, sp=True, zero=1, mbs=1))
    assert "time per step (exposed):" in evaluation_text(one)


def test_a_torchtitan_plan_gives_the_tflops_torchtitan_logs():
    """torchtitan 0.3 logs 6 FLOP per matmul parameter a token plus 6·layers·heads·2·head_dim·
    seq_len, attention unmasked over all of seq_len whatever the per-document masks it runs
    (get_dense_model_nparams_and_flops, torchtitan/models/utils.py): a long-context trial's
    8K-token documents at 128K were logged 3 times what MFU's count here gives, unsaid."""
    from console import cli

    from nestplan.evaluate import (logged_flops_per_sequence, logged_flops_said,
                                   torchtitan_flops_per_sequence)
    from nestplan.graph import total_params

    L, h, s = 80, 8192, 131072
    sc = scenario_from_names("llama3-70b", "dgx-h100-ndr", 256, seq_len=s, global_batch=64,
                             attention_span=8192, stack="torchtitan-0.3-compile")
    ev = evaluate(sc, Parallelism(tp=1, pp=1, dp=8, cp=32, zero=3, recompute=("full",)))
    m = sc.model
    matmul = total_params(m) - m.vocab * h  # the input embedding is no matmul (untied)
    tokens = 64 * s
    assert torchtitan_flops_per_sequence(m, s) / s == pytest.approx(6 * matmul + 12 * L * h * s,
                                                                    rel=2e-3)
    assert ev.logged_model_flops / tokens == pytest.approx(6 * matmul + 12 * L * h * s, rel=2e-3)
    assert ev.logged_model_flops > 2.9 * ev.model_flops
    code, out, err = cli("evaluate", "--model", "llama3-70b", "--cluster", "dgx-h100-ndr",
                         "--gpus", 256, "--tp", 1, "--pp", 1, "--cp", 32, "--mbs", 1,
                         "--global-batch", 64, "--seq-len", s, "--attention-span", 8192,
                         "--stack", "torchtitan-0.3-compile", "--recompute", "full")
    assert code == 0, err
    assert (f"({ev.logged_tflops_per_gpu:.1f} as torchtitan counts them: each layer's attention "
            "over all seq_len tokens, unmasked, its document masks aside)") in out
    # what another format's framework would log of it is that framework's count (an export of
    # this plan for Megatron-LM had been told Megatron-LM logs torchtitan's)
    said = logged_flops_said(ev, "megatron")
    per_gpu = 64 * logged_flops_per_sequence(m, s, 8192) / ev.step_time / 256 / 1e12
    assert said.log.name == "Megatron-LM" and said.tflops_per_gpu == pytest.approx(per_gpu)
    assert said.tflops_per_gpu < 0.7 * ev.logged_tflops_per_gpu
    assert logged_flops_said(ev, "torchtitan").tflops_per_gpu == ev.logged_tflops_per_gpu
